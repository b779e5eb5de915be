/* The OpenAI-compatible API against hostile or unusual input: a reply cut by the
 * daemon's shutdown is never reported as finished, texts holding NUL (which kvpd's own
 * replies can) come back in the history, duplicate keys are refused as on the websocket,
 * completion ids carry nothing of the session id, unknown paths get JSON 404s, a long
 * api_key matches. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_api, .timeout = 90);

static int post(const kvpd_proc *p, const char *headers, const char *body, char **raw,
                const char **resp)
{
    int st = h_request(p->port, "POST", "/v1/chat/completions", headers, body, raw, resp);
    cr_assert(*raw, "cannot connect");
    return st;
}

static int dial(const kvpd_proc *p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static void send_post(int fd, const char *body)
{
    char head[512];
    int n = snprintf(head, sizeof head, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n", strlen(body));
    cr_assert_eq(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    cr_assert_eq(send(fd, body, strlen(body), MSG_NOSIGNAL), (ssize_t)strlen(body));
}

/* The random-weight model never picks EOS: its turns run until stopped. */
static int start_long(kvpd_proc *d)
{
    char extra[1200];
    snprintf(extra, sizeof extra, "--model %s --max-tokens 100000 --budget 0",
             h_shared("models/llama-2-tiny-random.gguf"));
    return kvpd_start(d, extra);
}

static double metric(const kvpd_proc *p, const char *name)
{
    char *text = NULL;
    double v = h_get(p, "/metrics", NULL, &text) == 200 ? h_metric(text, name) : -1;
    free(text);
    return v;
}

Test(security_api, a_stream_cut_by_shutdown_ends_in_an_error_not_stop)
{
    kvpd_proc d;
    cr_assert_eq(start_long(&d), 0);
    int fd = dial(&d);
    send_post(fd, "{\"max_tokens\":100000,\"stream\":true,\"messages\":"
                  "[{\"role\":\"user\",\"content\":\"Once upon a time\"}]}");
    char first[4096] = "";
    size_t got = 0;
    while (!strstr(first, "\"delta\":{\"content\":") && got < sizeof first - 1) {
        ssize_t n = recv(fd, first + got, sizeof first - 1 - got, 0);
        cr_assert_gt(n, 0);
        got += (size_t)n;
        first[got] = '\0';
    }
    cr_assert_eq(kill(d.pid, SIGTERM), 0);
    size_t len = 0;
    char *rest = h_read_all(fd, 10000, &len);
    close(fd);
    cr_expect(!strstr(rest, "\"finish_reason\":\"stop\""), "the cut reply said stop: %s",
              rest + (len > 600 ? len - 600 : 0));
    cr_expect(!strstr(rest, "\"finish_reason\":\"length\""));
    cr_expect(strstr(rest, "data: {\"error\":") && strstr(rest, "server_shutting_down"),
              "no error event: %s", rest + (len > 600 ? len - 600 : 0));
    cr_expect(strstr(rest, "data: [DONE]"));
    free(rest);
    cr_expect_eq(kvpd_wait(&d, 30000), 0);
}

Test(security_api, a_reply_cut_by_shutdown_is_a_503_not_stop)
{
    kvpd_proc d;
    cr_assert_eq(start_long(&d), 0);
    int fd = dial(&d);
    send_post(fd, "{\"max_tokens\":100000,\"messages\":"
                  "[{\"role\":\"user\",\"content\":\"Once upon a time\"}]}");
    double running = 0;
    for (int i = 0; i < 200 && running < 1; i++) {
        usleep(10000);
        running = metric(&d, "kvpd_turns_running");
    }
    cr_assert_eq(running, 1);
    usleep(100000);   /* some tokens are out */
    cr_assert_eq(kill(d.pid, SIGTERM), 0);
    char *raw = h_read_all(fd, 10000, NULL);
    close(fd);
    int status = 0;
    sscanf(raw, "HTTP/1.1 %d", &status);
    cr_expect_eq(status, 503, "%.800s", raw);
    cr_expect(!strstr(raw, "\"finish_reason\""), "%.800s", raw);
    cr_expect(strstr(raw, "server_shutting_down"), "%.800s", raw);
    free(raw);
    cr_expect_eq(kvpd_wait(&d, 30000), 0);
}

Test(security_api, a_reply_holding_nul_is_accepted_back_in_the_history)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char *raw;
    const char *body;
    const char *req = "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Once\"},"
                      "{\"role\":\"assistant\",\"content\":\"a\\u0000b\"},"
                      "{\"role\":\"user\",\"content\":\"upon\\u0000a time\"}]}";
    int st = post(&p, NULL, req, &raw, &body);
    cr_expect_eq(st, 200, "%s", raw);
    json_t *j = json_loads(body, JSON_ALLOW_NUL, NULL);
    cr_expect(json_is_string(json_object_get(json_object_get(json_array_get(
        json_object_get(j, "choices"), 0), "message"), "content")), "%s", body);
    json_decref(j);
    free(raw);
    /* a role with a NUL inside is no role */
    st = post(&p, NULL, "{\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"hi\"}]}", &raw,
              &body);
    cr_expect_eq(st, 400, "%s", raw);
    cr_expect(strstr(body, "messages[0].role"), "%s", body);
    free(raw);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_api, duplicate_keys_are_refused)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char *raw;
    const char *body;
    int st = post(&p, NULL, "{\"max_tokens\":4,\"max_tokens\":8,\"messages\":"
                            "[{\"role\":\"user\",\"content\":\"hi\"}]}", &raw, &body);
    cr_expect_eq(st, 400, "%s", raw);
    cr_expect(strstr(body, "invalid_json"), "%s", body);
    free(raw);
    st = post(&p, NULL, "{\"messages\":[{\"role\":\"user\",\"role\":\"assistant\","
                        "\"content\":\"hi\"}]}", &raw, &body);
    cr_expect_eq(st, 400, "%s", raw);
    free(raw);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_api, completion_ids_carry_nothing_of_the_session_id)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char seen[2][64], first_sid[64] = "";
    for (int i = 0; i < 2; i++) {
        char *raw;
        const char *body;
        cr_assert_eq(post(&p, NULL, "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\","
                                    "\"content\":\"hi\"}]}", &raw, &body), 200, "%s", raw);
        json_t *j = json_loads(body, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "id"));
        /* the second request may continue the first's session (the same history,
         * regenerated), whose id it is not handed: its id is checked against the first's */
        const char *sid = json_string_value(json_object_get(j, "session"));
        if (i == 0) {
            cr_assert(sid && strlen(sid) == 32, "%s", body);
            snprintf(first_sid, sizeof first_sid, "%s", sid);
        } else if (!sid) {
            sid = first_sid;
        }
        cr_assert(id && strlen(sid) == 32, "%s", body);
        cr_expect(!strncmp(id, "chatcmpl-", 9), "%s", id);
        /* no 8 hex digits of the session id appear in it */
        for (int k = 0; k + 8 <= 32; k++) {
            char piece[9];
            memcpy(piece, sid + k, 8);
            piece[8] = '\0';
            cr_expect(!strstr(id, piece), "the id %s holds %s of the session %s", id, piece, sid);
        }
        snprintf(seen[i], sizeof seen[i], "%s", id);
        json_decref(j);
        free(raw);
    }
    cr_expect_str_neq(seen[0], seen[1]);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_api, unknown_paths_get_json_404s)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    const char *paths[] = {"/nope", "/v1/nope", "/admin/nope"};
    for (int i = 0; i < 3; i++) {
        char *body = NULL;
        const char *tok = i == 2 ? h_admin_token(&p) : NULL;
        cr_expect_eq(h_get(&p, paths[i], tok, &body), 404, "%s", paths[i]);
        json_t *j = body ? json_loads(body, 0, NULL) : NULL;
        cr_expect(json_is_string(json_object_get(json_object_get(j, "error"), "message")),
                  "%s: %s", paths[i], body);
        json_decref(j);
        free(body);
    }
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_api, the_longest_api_key_config_takes_matches)
{
    char key[201], extra[260], auth[260];   /* a key of KVPD_API_KEY_MAX (200) characters */
    for (size_t i = 0; i < sizeof key - 1; i++)
        key[i] = (char)('a' + i % 26);
    key[sizeof key - 1] = '\0';
    snprintf(extra, sizeof extra, "--api-key %s", key);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "log %s", p.log);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    char *raw;
    const char *body;
    cr_expect_eq(post(&p, auth, "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\","
                                "\"content\":\"hi\"}]}", &raw, &body), 200, "%s", raw);
    free(raw);
    auth[strlen(auth) - 3] ^= 1;   /* one character off */
    cr_expect_eq(post(&p, auth, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &raw,
                      &body), 401, "%s", raw);
    free(raw);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
    /* one character more is refused at start, saying why */
    char longer[240];
    snprintf(longer, sizeof longer, "--api-key %sx", key);
    cr_expect_neq(kvpd_start(&p, longer), 0);
    cr_expect(kvpd_log_has(&p, "api_key"), "log %s", p.log);
    if (p.pid > 0)
        kvpd_kill(&p);
}

/* A prompt far past what the model can take is refused before its prefill: at once,
 * 400 context_length_exceeded, and the daemon prefilled nothing of it. */
Test(security_api, a_huge_prompt_is_refused_before_any_prefill)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--max-body-bytes 2000000"), 0, "log %s", p.log);
    size_t words = 150000, len = 0;
    char *body = malloc(words * 4 + 128);
    len += (size_t)sprintf(body, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (size_t i = 0; i < words; i++)
        len += (size_t)sprintf(body + len, "%s", i % 2 ? "dog " : "ran ");
    sprintf(body + len, "\"}]}");
    double t0 = ws_now_ms();
    char *raw;
    const char *resp;
    int st = post(&p, NULL, body, &raw, &resp);
    double ms = ws_now_ms() - t0;
    free(body);
    cr_expect_eq(st, 400, "%.500s", raw);
    cr_expect(strstr(resp, "context_length_exceeded") && strstr(resp, "max_prompt_tokens"),
              "%.500s", resp);
    cr_expect_lt(ms, 10000, "the refusal took %.0f ms", ms);
    free(raw);
    cr_expect_eq(metric(&p, "kvpd_prefilled_tokens_total"), 0);
    /* a prompt within the cap is served; the cap is a setting */
    cr_expect_eq(post(&p, NULL, "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\","
                                "\"content\":\"Once upon a time\"}]}", &raw, &resp), 200);
    free(raw);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
    cr_assert_eq(kvpd_start(&p, "--max-prompt-tokens 3"), 0, "log %s", p.log);
    cr_expect_eq(post(&p, NULL, "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\","
                                "\"content\":\"Once upon a time there was\"}]}", &raw, &resp),
                 400, "%s", raw);
    free(raw);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}
