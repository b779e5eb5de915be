/* A slow snapshot store must not freeze other clients' streams: while Redis stalls
 * (DEBUG SLEEP), one-shot API conversations wait on their lease and their snapshot
 * write, and a websocket session decoding meanwhile keeps its token rhythm (the batched
 * step waits only on compute; store calls run as jobs on the workers). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/daemon/stall.h"

TestSuite(security_slow_store, .timeout = 120);

static h_stall g_stall;

static void up(void)
{
    h_stall_up(&g_stall);
}

static void down(void)
{
    h_stall_down(&g_stall);
}

#define STALL_S 2.0

Test(security_slow_store, api_requests_waiting_on_a_stalled_store_do_not_freeze_a_stream,
     .init = up, .fini = down)
{
    kvpd_proc d;
    h_stall_kvpd(&g_stall, &d);
    ws_client a;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"hello\"}"), 0);
    json_t *sess = h_expect(&a, "session", 5000);
    cr_assert(sess, "no session");
    json_decref(sess);
    h_stream sa;
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"message\",\"text\":\"a long story\","
                                  "\"max_tokens\":4000,\"temperature\":0}"), 0);
    h_stream_start(&sa, &a);
    double wait = ws_now_ms() + 10000;
    while (h_stream_frames(&sa) < 32 && ws_now_ms() < wait)
        usleep(1000);
    cr_assert_geq(h_stream_frames(&sa), 32, "A streams");

    /* Redis stalls; meanwhile API conversations start (a lease to take) and end (a
     * snapshot to write), each waiting on the store. */
    double t0 = ws_now_ms();
    int from = h_stream_frames(&sa);
    int rfd = h_stall_sleep(&g_stall, STALL_S);
    int answered = 0;
    double first = 0;
    while (ws_now_ms() - t0 < STALL_S * 1e3) {
        char *raw = NULL;
        const char *b;
        int st = h_request(d.port, "POST", "/v1/chat/completions", NULL,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"A frog.\"}],"
                           "\"max_tokens\":8}", &raw, &b);
        cr_assert(st == 200 || st == 503, "%d %s", st, raw ? raw : "(no answer)");
        if (!answered++)
            first = ws_now_ms() - t0;
        free(raw);
    }
    double t1 = ws_now_ms();
    int to = h_stream_frames(&sa);
    close(rfd);
    cr_assert_geq(first, STALL_S * 1e3 * 0.8, "the first API answer came after %.0f ms: it "
                  "did not wait on the store", first);

    int ended;
    double gap = h_stream_gap(&sa, from, to, t0, t1, 0, &ended);
    cr_log_info("%d API answers during a %.1f s stall: %d of A's tokens, longest gap %.0f ms",
                answered, STALL_S, to - from, gap);
    /* A may reach its end of text meanwhile (its done then waits for its own snapshot):
     * an end, not an error */
    cr_assert(!ended || !strncmp(sa.end, "done", 4), "A ended %.0f ms into a %.0f ms stall: %s",
              sa.done_at - t0, first, sa.end);
    h_stream_assert_steady(to - from, gap, STALL_S);
    h_stream_cancel(&sa);
    ws_close(&a);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
