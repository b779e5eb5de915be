#include "tests/security/seclib.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sec_close_code(ws_client *c, int timeout_ms, char *why, size_t n, char *seen,
                   size_t seen_n)
{
    double end = ws_now_ms() + timeout_ms;
    why[0] = '\0';
    if (seen)
        seen[0] = '\0';
    while (ws_now_ms() < end) {
        char *payload = NULL;
        size_t len = 0;
        int op = ws_read(c, (int)(end - ws_now_ms()) + 1, &payload, &len);
        if (op == WS_CLOSE) {
            int code = len >= 2 ? ((unsigned char)payload[0] << 8 | (unsigned char)payload[1]) : 0;
            snprintf(why, n, "%.*s", len > 2 ? (int)(len - 2) : 0, len > 2 ? payload + 2 : "");
            free(payload);
            return code;
        }
        if (op == WS_TEXT && seen) {
            json_t *j = json_loadb(payload, len, 0, NULL);
            const char *t = json_string_value(json_object_get(j, "type"));
            size_t have = strlen(seen);
            snprintf(seen + have, seen_n - have, "%s ", t ? t : "?");
            json_decref(j);
        }
        free(payload);
        if (op == -ETIMEDOUT)
            return -1;
        if (op < 0)
            return 0;
    }
    return -1;
}

const char *sec_hello_answer(ws_client *c, const char *id, char *buf, size_t n)
{
    char msg[128];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(c, msg), 0);
    json_t *j = h_read_json(c, 5000);
    cr_assert(j, "hello was not answered");
    const char *t = json_string_value(json_object_get(j, "type"));
    const char *code = json_string_value(json_object_get(j, "code"));
    snprintf(buf, n, "%s", !strcmp(t, "error") && code ? code : t);
    json_decref(j);
    return buf;
}

sec_answer sec_post(const kvpd_proc *p, const char *headers, const char *body)
{
    sec_answer a = {0};
    const char *b = NULL;
    a.status = h_request(p->port, "POST", "/v1/chat/completions", headers, body, &a.raw, &b);
    cr_assert(a.raw, "no answer");
    a.j = b ? json_loads(b, 0, NULL) : NULL;
    snprintf(a.session, sizeof a.session, "%s", h_header(a.raw, "x-session-id:"));
    const char *r = json_string_value(json_object_get(json_object_get(
        json_array_get(json_object_get(a.j, "choices"), 0), "message"), "content"));
    snprintf(a.reply, sizeof a.reply, "%s", r ? r : "");
    return a;
}

void sec_answer_free(sec_answer *a)
{
    json_decref(a->j);
    free(a->raw);
}

char *sec_second_turn(const char *reply, const char *id)
{
    return h_second_turn("Once upon a time", reply, "Then?", 4, id);
}

void sec_assert_resumes(const kvpd_proc *d, const char *headers, const sec_answer *first,
                        int named, const char *what)
{
    char *body = sec_second_turn(first->reply, named ? first->session : NULL);
    sec_answer next = sec_post(d, headers, body);
    free(body);
    cr_assert_eq(next.status, 200, "%s", next.raw);
    /* named, the answer carries the id; found by its transcript, it carries none (an id is
     * only answered to the request that made or named the session) */
    if (named)
        cr_assert_str_eq(next.session, first->session, "%s: another session answered", what);
    else
        cr_assert_eq(next.session[0], '\0', "%s: a matched session's id was answered: %s",
                     what, next.raw);
    json_t *cached = json_object_get(json_object_get(json_object_get(next.j, "usage"),
                                                     "prompt_tokens_details"), "cached_tokens");
    cr_assert_gt(json_integer_value(cached), 0, "%s: nothing cached: %s", what, next.raw);
    sec_answer_free(&next);
}

sec_answer sec_flood_post(const kvpd_proc *d, const char *headers, int i)
{
    char body[160];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Story %d: "
             "a frog.\"}],\"max_tokens\":2}", i);
    sec_answer a = sec_post(d, headers, body);
    cr_assert_eq(a.status, 200, "request %d of the flood: %s", i, a.raw);
    return a;
}

void sec_flood(const kvpd_proc *d, const char *headers, int from, int to)
{
    for (int i = from; i < to; i++) {
        sec_answer a = sec_flood_post(d, headers, i);
        sec_answer_free(&a);
    }
}
