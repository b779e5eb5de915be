/* Integration: the batched step waits only on compute. A session whose turn ends while
 * its snapshot store stalls (Redis inside DEBUG SLEEP) does not hold back the token
 * stream of another session decoding meanwhile; and the policy's weights are read once
 * for the daemon, not once per session (memory.policy_file_loads in /admin/stats). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/daemon/stall.h"

TestSuite(stepio, .timeout = 120);

static json_int_t stat_at(const kvpd_proc *d, const char *obj, const char *key)
{
    json_t *st = h_stats(d);
    cr_assert(st, "GET /admin/stats");
    json_int_t v = json_integer_value(json_object_get(json_object_get(st, obj), key));
    json_decref(st);
    return v;
}

static char *hello(ws_client *c)
{
    cr_assert_eq(ws_send_text(c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(c, "session", 5000);
    cr_assert(s);
    char *id = strdup(json_string_value(json_object_get(s, "id")));
    json_decref(s);
    return id;
}

#define N_SESS 8

/* Eight sessions under the kvp policy (stories260K's default, policy/weights/) read the
 * policy file once, when the daemon starts; a SIGHUP reads it once more, for the sessions
 * made after it. Each session reading its own copy made it 1 + 8. */
Test(stepio, the_policy_weights_are_loaded_once_for_n_sessions)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-sessions 32"), 0, "log %s", d.log);
    json_t *st = h_stats(&d);
    cr_assert(st);
    cr_assert_str_eq(json_string_value(json_object_get(st, "policy")), "kvp");
    json_decref(st);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 1, "read once at start");
    ws_client c[N_SESS];
    for (int i = 0; i < N_SESS; i++) {
        cr_assert_eq(h_connect(&d, &c[i]), 0);
        free(hello(&c[i]));
        h_turn_ok(&c[i], "Once upon a time", 24);
    }
    for (int i = 0; i < N_SESS; i++)   /* a second turn each: evictions ran on the weights */
        h_turn_ok(&c[i], "The little dog", 24);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 1,
                 "%d sessions share the one copy", N_SESS);
    /* a reload reads the file again, once, and new sessions get the new copy */
    cr_assert_eq(kill(d.pid, SIGHUP), 0);
    double deadline = ws_now_ms() + 10000;
    while (stat_at(&d, "persistence", "reloads") < 1 && ws_now_ms() < deadline)
        usleep(20000);
    cr_assert_eq(stat_at(&d, "persistence", "reloads"), 1);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 2);
    ws_client n;
    cr_assert_eq(h_connect(&d, &n), 0);
    free(hello(&n));
    h_turn_ok(&n, "A new session", 24);
    for (int i = 0; i < N_SESS; i++)   /* the old sessions keep theirs */
        h_turn_ok(&c[i], "and then", 8);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 2);
    ws_close(&n);
    for (int i = 0; i < N_SESS; i++)
        ws_close(&c[i]);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* ---- a stalled store ---- */

static h_stall g_stall;

static void stall_up(void)
{
    h_stall_up(&g_stall);
}

static void stall_down(void)
{
    h_stall_down(&g_stall);
}

#define STALL_S 2.0
#define B_TOKENS 128

/* Session B's turn ends while Redis sleeps STALL_S seconds: its snapshot write waits
 * for Redis, and its done frame with it. Session A decodes all along: its tokens keep
 * coming (the longest gap between two of A's token frames while B waits stays far below
 * the stall); a step that wrote B's snapshot itself stopped A for the whole stall. */
Test(stepio, a_stalled_snapshot_write_does_not_stop_another_stream, .init = stall_up,
     .fini = stall_down)
{
    kvpd_proc d;
    h_stall_kvpd(&g_stall, &d);
    ws_client a, b;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(h_connect(&d, &b), 0);
    free(hello(&a));
    free(hello(&b));
    h_turn_ok(&b, "one", 4);   /* B's lease and first snapshot, before the stall */

    h_stream sa;
    json_t *m = json_pack("{s:s, s:s, s:i}", "type", "message", "text", "a long story",
                          "max_tokens", 4000);
    char *ms = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    cr_assert_eq(ws_send_text(&a, ms), 0);
    free(ms);
    h_stream_start(&sa, &a);
    double wait = ws_now_ms() + 10000;
    while (h_stream_frames(&sa) < 32 && ws_now_ms() < wait)
        usleep(1000);
    cr_assert_geq(h_stream_frames(&sa), 32, "A streams");

    /* B's turn starts (lease taken: its first token came), then Redis stalls, then B
     * ends (B_TOKENS tokens, well within the stall) and writes its snapshot into it */
    m = json_pack("{s:s, s:s, s:i}", "type", "message", "text", "two", "max_tokens", B_TOKENS);
    ms = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    cr_assert_eq(ws_send_text(&b, ms), 0);
    free(ms);
    json_t *first = h_expect(&b, "token", 10000);
    cr_assert(first, "B's first token");
    json_decref(first);
    double t0 = ws_now_ms();
    int rfd = h_stall_sleep(&g_stall, STALL_S);
    int from = h_stream_frames(&sa);
    json_t *done = h_expect(&b, "done", 30000);
    double t1 = ws_now_ms();
    int to = h_stream_frames(&sa);
    cr_assert(done, "B's done frame");
    json_decref(done);
    close(rfd);
    cr_assert_geq(t1 - t0, STALL_S * 1e3 * 0.8,
                  "B's done waited for its snapshot (%.0f ms): the store did stall", t1 - t0);

    /* the longest gap, the edges included: the stall's start to A's first frame in it,
     * its last frame to B's done */
    int ended;
    double gap = h_stream_gap(&sa, from, to, t0, t1, 1, &ended);
    cr_assert_not(ended, "A was still decoding when B's done came");
    cr_log_info("during a %.1f s stall: %d of A's tokens, longest gap %.0f ms", STALL_S,
                to - from, gap);
    h_stream_assert_steady(to - from, gap, STALL_S);
    h_stream_cancel(&sa);
    ws_close(&a);
    ws_close(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
