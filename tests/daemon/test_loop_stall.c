/* Integration: no model work on the loop thread. While one conversation streams tokens
 * over the websocket, another connection sends a prompt of about 1 MB and a third a
 * json_schema with 10,000 properties; rendering, tokenizing, the fork-source search and
 * the schema's compile run on the workers, so neither request delays the stream's token
 * frames nor a /healthz polled every 10 ms by more than 50 ms beyond what the same
 * stream and polls show without them (the machine may be loaded: the comparison is
 * against the same run's quiet window). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/daemon/stall.h"

TestSuite(loop_stall, .timeout = 180);

#define PROMPT_BYTES 1000000
#define SCHEMA_PROPS 10000
#define WIDE_PROPS 1500   /* near the widest object under the grammar's bound (2^18 states) */
#define MARGIN_MS 50.0

/* A hostile request on a connection of its own: its body, and its answer's status and
 * how long it took. */
typedef struct hostile {
    int port;
    const char *path;             /* NULL: /v1/chat/completions */
    char *body;
    int status;
    char err[400];
    double ms;
    int answered;   /* set by the sender's thread once status and ms are */
    pthread_t th;
} hostile;

static void *send_hostile(void *arg)
{
    hostile *h = arg;
    double t0 = ws_now_ms();
    char *raw = NULL;
    const char *resp = NULL;
    h->status = h_request(h->port, "POST", h->path ? h->path : "/v1/chat/completions", NULL,
                          h->body, &raw, &resp);
    h->ms = ws_now_ms() - t0;
    snprintf(h->err, sizeof h->err, "%.399s", resp ? resp : "");
    free(raw);
    __atomic_store_n(&h->answered, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* `bytes` of words (a NUL-terminated malloc'd text). */
static char *words_text(size_t bytes)
{
    static const char *const words[] = {"the ", "little ", "dog ", "ran ", "to ", "a ",
                                        "big ", "tree ", "and ", "sat ", "down. "};
    char *text = malloc(bytes + 16);
    cr_assert(text);
    size_t n = 0;
    for (int i = 0; n < bytes; i++) {
        const char *w = words[(i * 7 + i / 11) % 11];
        size_t l = strlen(w);
        memcpy(text + n, w, l);
        n += l;
    }
    text[n] = '\0';
    return text;
}

/* ~1 MB of words in one user message. */
static char *big_prompt_body(void)
{
    char *text = words_text(PROMPT_BYTES);
    json_t *b = json_pack("{s:[{s:s, s:s}], s:i}", "messages", "role", "user", "content", text,
                          "max_tokens", 4);
    free(text);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    cr_assert(s);
    return s;
}

/* /tokenize at its bound (128 KiB), with each token's piece. */
static char *tokenize_body(void)
{
    char *text = words_text(128 * 1024 - 16);
    json_t *b = json_pack("{s:s, s:b}", "content", text, "with_pieces", 1);
    free(text);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    cr_assert(s);
    return s;
}

/* A json_schema response format whose object has n properties. */
static char *schema_body(int n)
{
    json_t *props = json_object();
    for (int i = 0; i < n; i++) {
        char k[32];
        snprintf(k, sizeof k, "field_%d", i);
        json_object_set_new(props, k, json_pack("{s:s}", "type", i % 2 ? "string" : "integer"));
    }
    json_t *b = json_pack("{s:[{s:s, s:s}], s:i, s:{s:s, s:{s:s, s:{s:s, s:o}}}}", "messages",
                          "role", "user", "content", "Once upon a time", "max_tokens", 4,
                          "response_format", "type", "json_schema", "json_schema", "name",
                          "wide", "schema", "type", "object", "properties", props);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    cr_assert(s);
    return s;
}

/* A thread of the test's own that spins while *on: the reference window's share of the
 * cores matches the hostile one's, where a worker renders the prompt meanwhile. */
static void *burn(void *arg)
{
    volatile unsigned x = 1;
    while (__atomic_load_n((int *)arg, __ATOMIC_RELAXED))
        for (int i = 0; i < 100000; i++)
            x = x * 1664525u + 1013904223u;
    return NULL;
}

/* Polls /healthz every ~10 ms for ms milliseconds (or until *stop): the longest answer. */
static double poll_health(const kvpd_proc *d, double ms, const int *stop, int *polls)
{
    double worst = 0, end = ws_now_ms() + ms;
    *polls = 0;
    while (ws_now_ms() < end && !(stop && *stop)) {
        char *body = NULL;
        double t0 = ws_now_ms();
        int st = h_get(d, "/healthz", NULL, &body);
        double took = ws_now_ms() - t0;
        free(body);
        cr_assert_eq(st, 200, "/healthz answered %d", st);
        if (took > worst)
            worst = took;
        (*polls)++;
        usleep(10000);
    }
    return worst;
}

Test(loop_stall, a_huge_prompt_or_schema_does_not_delay_another_stream_or_healthz)
{
    kvpd_proc d;
    /* the stream runs long (--max-tokens), and both hostile bodies fit the default max_body_bytes (1 MiB) */
    cr_assert_eq(kvpd_start(&d, "--max-tokens 200000"), 0, "log %s",
                 d.log);
    char *prompt = big_prompt_body(), *schema = schema_body(SCHEMA_PROPS),
         *wide = schema_body(WIDE_PROPS), *tok = tokenize_body();
    cr_assert_gt(strlen(prompt), PROMPT_BYTES);

    ws_client a;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"hello\"}"), 0);
    json_t *sj = h_expect(&a, "session", 5000);
    cr_assert(sj);
    json_decref(sj);
    /* end-of-text banned: the reply runs until it is cancelled */
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"message\",\"text\":\"Once upon a time\","
                                  "\"max_tokens\":200000,\"logit_bias\":{\"1\":-100,\"2\":-100}}"), 0);
    static h_stream sa;   /* large: not on the stack */
    h_stream_start(&sa, &a);
    double wait = ws_now_ms() + 10000;
    while (h_stream_frames(&sa) < 32 && ws_now_ms() < wait)
        usleep(1000);
    cr_assert_geq(h_stream_frames(&sa), 32, "A streams");

    /* the reference window: the stream's gaps and /healthz without the hostile requests,
     * with one core's worth of compute taken as the render of the hostile window takes
     * it (the machine may be shared: only what the loop adds is to be measured) */
    int polls, burning = 1;
    pthread_t burner;
    cr_assert_eq(pthread_create(&burner, NULL, burn, &burning), 0);
    double q0 = ws_now_ms();
    int qfrom = h_stream_frames(&sa);
    double quiet_health = poll_health(&d, 2000, NULL, &polls);
    double q1 = ws_now_ms();
    int qto = h_stream_frames(&sa);
    __atomic_store_n(&burning, 0, __ATOMIC_RELAXED);
    pthread_join(burner, NULL);
    int ended;
    double quiet_gap = h_stream_gap(&sa, qfrom, qto, q0, q1, 1, &ended);
    cr_assert_not(ended, "A still streams: %s", sa.end);
    cr_assert_lt(qto, H_STREAM_MAX / 4, "the quiet window left room for the hostile one");

    /* the hostile window: both requests at once, /healthz polled until both answered */
    hostile hp = {.port = d.port, .body = prompt}, hs = {.port = d.port, .body = schema},
            hw = {.port = d.port, .body = wide},
            ht = {.port = d.port, .path = "/tokenize", .body = tok};
    double t0 = ws_now_ms();
    int from = h_stream_frames(&sa);
    cr_assert_eq(pthread_create(&hp.th, NULL, send_hostile, &hp), 0);
    cr_assert_eq(pthread_create(&hs.th, NULL, send_hostile, &hs), 0);
    cr_assert_eq(pthread_create(&hw.th, NULL, send_hostile, &hw), 0);
    cr_assert_eq(pthread_create(&ht.th, NULL, send_hostile, &ht), 0);
    double hostile_health = 0, end = ws_now_ms() + 60000;
    int hpolls = 0;
    while (ws_now_ms() < end) {
        int n;
        double w = poll_health(&d, 200, NULL, &n);
        hpolls += n;
        if (w > hostile_health)
            hostile_health = w;
        if (__atomic_load_n(&hp.answered, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&hs.answered, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&hw.answered, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&ht.answered, __ATOMIC_ACQUIRE))
            break;
    }
    pthread_join(hp.th, NULL);
    pthread_join(hs.th, NULL);
    pthread_join(hw.th, NULL);
    pthread_join(ht.th, NULL);
    double t1 = ws_now_ms();
    int to = h_stream_frames(&sa);
    double gap = h_stream_gap(&sa, from, to, t0, t1, 1, &ended);
    cr_assert_not(ended, "A streamed through the hostile requests: %s", sa.end);
    cr_assert_lt(to, H_STREAM_MAX, "every token frame was timed");
    fprintf(stderr, "reference: longest token gap %.1f ms, /healthz %.1f ms (%d polls); "
            "hostile (prompt %d in %.0f ms, schema %d in %.0f ms, wide schema %d in %.0f ms, "
            "/tokenize %d in %.0f ms): "
            "longest token gap %.1f ms over %d frames, /healthz %.1f ms (%d polls)\n",
            quiet_gap, quiet_health, polls, hp.status, hp.ms, hs.status, hs.ms, hw.status,
            hw.ms, ht.status, ht.ms, gap, to - from, hostile_health, hpolls);
    /* each was answered as it is without the load: the prompt is over the model's context
     * (a 400 naming its length), the 10k-property schema over the schema's size limit (a
     * 400 naming the field), the widest schema under it compiles and its turn runs */
    cr_assert_eq(hp.status, 400, "the prompt answered %d: %s", hp.status, hp.err);
    cr_assert(strstr(hp.err, "context_length_exceeded"), "%s", hp.err);
    cr_assert_eq(hs.status, 400, "the schema answered %d: %s", hs.status, hs.err);
    cr_assert(strstr(hs.err, "response_format.json_schema.schema") &&
              strstr(hs.err, "over the limit"), "%s", hs.err);
    cr_assert_eq(hw.status, 200, "the wide schema answered %d: %s", hw.status, hw.err);
    cr_assert_eq(ht.status, 200, "/tokenize answered %d: %s", ht.status, ht.err);
    cr_assert(strstr(ht.err, "\"piece\""), "%s", ht.err);
    cr_assert_gt(to - from, 10, "A kept streaming during the hostile requests");
    cr_assert_leq(gap, quiet_gap + MARGIN_MS,
                  "A's longest token gap %.1f ms under the hostile requests, %.1f ms without",
                  gap, quiet_gap);
    cr_assert_leq(hostile_health, quiet_health + MARGIN_MS,
                  "/healthz took %.1f ms under the hostile requests, %.1f ms without",
                  hostile_health, quiet_health);
    h_stream_cancel(&sa);
    ws_close(&a);
    free(prompt);
    free(schema);
    free(wide);
    free(tok);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
