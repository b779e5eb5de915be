/* What the step loop's tests against a stalled store share (tests/daemon/test_stepio.c,
 * tests/security/test_slow_store.c): a Redis that DEBUG SLEEP stalls on demand, with a
 * synthetic model beside it, and one client's token stream read and timed on a thread of
 * its own, so that its longest wait for a token frame can be measured across the stall. */
#ifndef KVP_TEST_STALL_H
#define KVP_TEST_STALL_H

#include <pthread.h>

#include "tests/daemon/harness.h"

typedef struct h_stall {
    h_proc redis;       /* with DEBUG enabled, no persistence */
    char dir[64];       /* its directory, which holds the model too */
    char model[128];    /* random weights (kvp synth): a reply runs to max_tokens */
} h_stall;

/* Criterion .init/.fini helpers: up skips the test when redis-server is not installed. */
void h_stall_up(h_stall *s);
void h_stall_down(h_stall *s);
/* Starts kvpd on the stall's model and Redis: streaming policy, 2 workers, replies of up
 * to 4096 tokens. */
void h_stall_kvpd(const h_stall *s, kvpd_proc *d);
/* Redis sleeps `seconds` from now: DEBUG SLEEP on a connection of its own, left open (it
 * answers when the sleep ends). The connection's socket, for the caller to close. */
int h_stall_sleep(const h_stall *s, double seconds);

#define H_STREAM_MAX 65536

typedef struct h_stream {
    ws_client *c;
    double at[H_STREAM_MAX];   /* when each token frame came (ws_now_ms) */
    int n;                     /* token frames */
    int done;                  /* a frame other than a token came, or none for 30 s */
    double done_at;
    char end[160];             /* that frame: its type, the stop and the message */
    pthread_mutex_t mu;
    pthread_t th;
} h_stream;

/* Reads c's frames into s on a new thread until the turn's end. */
void h_stream_start(h_stream *s, ws_client *c);
int h_stream_frames(h_stream *s);
/* The longest wait for a token frame from t0 to t1, over the frames [from, to) counted
 * there: between two of them, from t0 to the first (all of t1 - t0 when none came) and,
 * with tail, from the last frame before t1 to t1. *ended: whether the stream had ended. */
double h_stream_gap(h_stream *s, int from, int to, double t0, double t1, int tail, int *ended);
/* The stream kept its rhythm through a stall of stall_s seconds: more than 50 token
 * frames came during it, and no wait for one (gap, as h_stream_gap) took a quarter of it. */
void h_stream_assert_steady(int frames, double gap, double stall_s);
/* Cancels the stream's turn on its connection and waits for the reader's end. */
void h_stream_cancel(h_stream *s);

#endif
