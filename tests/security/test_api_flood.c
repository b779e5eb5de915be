/* Many tiny one-turn API conversations must not lock new conversations out: the
 * finished sessions they leave are parked (state_dir) or dropped (none) least recently
 * used first, while a websocket client's idle session stays. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_api_flood, .timeout = 240);

static int one_conversation(const kvpd_proc *p, int i, char **raw_out)
{
    char body[256], *raw = NULL;
    const char *b;
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Story %d: a "
             "frog.\"}],\"max_tokens\":2}", i);
    int st = h_request(p->port, "POST", "/v1/chat/completions", NULL, body, &raw, &b);
    if (raw_out)
        *raw_out = raw;
    else
        free(raw);
    return st;
}

static void flood(const char *extra)
{
    kvpd_proc d;
    char args[256];
    snprintf(args, sizeof args, "--max-sessions 8 %s", extra);
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    /* A websocket user with a conversation, idle during the flood. */
    ws_client ws;
    cr_assert_eq(h_connect(&d, &ws), 0);
    json_t *done = h_turn(&ws, "A frog sat on a log.", 2, NULL);
    cr_assert(done);
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
    for (int i = 0; i < 100; i++) {
        char *raw = NULL;
        int st = one_conversation(&d, i, &raw);
        cr_assert_eq(st, 200, "conversation %d: %s", i, raw ? raw : "(no answer)");
        free(raw);
    }
    /* The websocket's session was not the one to go: it takes another turn. */
    h_turn_ok(&ws, "Then it jumped.", 2);
    ws_close(&ws);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_api_flood, a_hundred_one_turn_conversations_without_a_state_dir)
{
    flood("");
}

Test(security_api_flood, a_hundred_one_turn_conversations_with_a_state_dir)
{
    char dir[64], args[128];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s", dir);
    flood(args);
    h_rmdir(dir);
}

/* Without a state dir, every resident session attached to a client with nothing left to
 * drop: the refusal's Retry-After is when an idle session times out, not "1 s". */
Test(security_api_flood, a_refusal_with_nothing_running_does_not_promise_a_retry_in_a_second)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-sessions 2 --idle-timeout 600"), 0, "log %s", d.log);
    ws_client a, b;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(h_connect(&d, &b), 0);
    json_t *t = h_turn(&a, "A frog.", 2, NULL);
    json_decref(t);
    t = h_turn(&b, "A cat.", 2, NULL);
    json_decref(t);
    char *raw = NULL;
    int st = one_conversation(&d, 0, &raw);
    cr_assert_eq(st, 429, "%s", raw);
    int retry = atoi(h_header(raw, "retry-after:"));
    cr_assert_gt(retry, 60, "Retry-After %d s while nothing frees a slot sooner: %s", retry, raw);
    free(raw);
    ws_close(&a);
    ws_close(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* The default state_dir (auto) keeps state under $XDG_STATE_HOME/kvpd: the flood is
 * parked there too. */
Test(security_api_flood, the_default_state_dir_is_made_and_used)
{
    char base[64], args[128], snap[256];
    cr_assert_eq(h_mkdtemp(base, sizeof base), 0);
    setenv("XDG_STATE_HOME", base, 1);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-sessions 4 --state-dir auto"), 0, "log %s", d.log);
    snprintf(args, sizeof args, "state %s/kvpd", base);
    cr_assert(kvpd_log_has(&d, args), "log %s", d.log);
    char *raw = NULL;
    for (int i = 0; i < 12; i++) {
        int st = one_conversation(&d, i, &raw);
        cr_assert_eq(st, 200, "conversation %d: %s", i, raw);
        if (i < 11)
            free(raw);
    }
    snprintf(snap, sizeof snap, "%s/kvpd/%s.snap", base, h_header(raw, "x-session-id:"));
    free(raw);
    cr_assert_eq(access(snap, F_OK), 0, "%s is missing", snap);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    unsetenv("XDG_STATE_HOME");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    cr_assert_eq(system(cmd), 0);
}
