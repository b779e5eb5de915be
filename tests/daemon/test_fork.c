/* Integration: hello with fork {session, turn} (docs/protocol.md, "Forking a
 * conversation") against a live kvpd with stories260K: the branch's history and cache,
 * the source left as it was (in memory and on disk), forks of forks, parked and
 * restarted sources, the refusals, tenants. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tests/daemon/harness.h"

#define CHUNK 16

H_STATE_DIR_SUITE(fork, .timeout = 120);

/* kvpd with the state directory (state 1) or without one, and `extra`. */
static void start(kvpd_proc *p, int state, const char *extra)
{
    char args[512];
    snprintf(args, sizeof args, "%s%s %s", state ? "--state-dir " : "", state ? g_dir : "",
             extra ? extra : "");
    cr_assert_eq(kvpd_start(p, args), 0, "kvpd did not start (log %s)", p->log);
}

static void stop(kvpd_proc *p)
{
    cr_assert_eq(kvpd_stop(p, 10000), 0, "kvpd did not exit 0 on SIGTERM (log %s)", p->log);
}

static const char *str_of(json_t *j, const char *key)
{
    const char *v = json_string_value(json_object_get(j, key));
    return v ? v : "";
}

static json_int_t stat_of(json_t *done, const char *key)
{
    json_t *v = json_object_get(json_object_get(done, "stats"), key);
    cr_assert(json_is_integer(v), "stats.%s missing", key);
    return json_integer_value(v);
}

/* The tokens the cache held at the turn's start: the transcript less the turn's new
 * tokens and its reply. */
static json_int_t cached_of(json_t *done)
{
    return stat_of(done, "transcript_tokens") - stat_of(done, "generated_tokens") -
           stat_of(done, "prompt_tokens");
}

/* The conversation a test keeps on its side: what was sent and what came back. */
typedef struct convo {
    char id[64];
    int n;
    char *text[32];
    int user[32];
} convo;

static void convo_add(convo *v, int user, const char *text)
{
    cr_assert_lt(v->n, 32);
    v->user[v->n] = user;
    v->text[v->n++] = strdup(text);
}

/* v's first n messages (a fork's history), under id. */
static void convo_branch(convo *to, const convo *from, int n, const char *id)
{
    memset(to, 0, sizeof *to);
    snprintf(to->id, sizeof to->id, "%s", id);
    for (int i = 0; i < n; i++)
        convo_add(to, from->user[i], from->text[i]);
}

static void convo_free(convo *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->text[i]);
    v->n = 0;
}

/* A turn that must end with done; it joins v (when given). */
static json_t *turn_ok(ws_client *c, convo *v, const char *text, int max_tokens)
{
    char *tokens = NULL;
    json_t *done = h_turn(c, text, max_tokens, &tokens);
    free(tokens);
    cr_assert(done, "no answer to '%s'", text);
    cr_assert_str_eq(str_of(done, "type"), "done", "'%s': %s %s", text, str_of(done, "code"),
                     str_of(done, "message"));
    if (v) {
        convo_add(v, 1, text);
        convo_add(v, 0, str_of(done, "reply"));
    }
    return done;
}

/* The next session or error frame (token frames of nothing else are skipped). */
static json_t *answer(ws_client *c)
{
    for (;;) {
        json_t *j = h_read_json(c, 10000);
        cr_assert(j, "no answer");
        const char *t = str_of(j, "type");
        if (!strcmp(t, "session") || !strcmp(t, "error"))
            return j;
        json_decref(j);
    }
}

static json_t *send_hello(ws_client *c, const char *frame)
{
    cr_assert_eq(ws_send_text(c, frame), 0);
    return answer(c);
}

/* hello forking turn `turn` of session id: its session or error frame. */
static json_t *fork_hello(ws_client *c, const char *id, int turn)
{
    char msg[160];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"fork\":{\"session\":\"%s\",\"turn\":%d}}",
             id, turn);
    return send_hello(c, msg);
}

/* A fork that must succeed: its id into to, its history checked against from's first
 * 2 x turn messages. */
static void fork_ok(ws_client *c, const convo *from, int turn, convo *to)
{
    json_t *s = fork_hello(c, from->id, turn);
    cr_assert_str_eq(str_of(s, "type"), "session", "fork refused: %s %s", str_of(s, "code"),
                     str_of(s, "message"));
    cr_assert(json_is_false(json_object_get(s, "resumed")));
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), turn);
    cr_assert_str_neq(str_of(s, "id"), from->id);
    convo_branch(to, from, 2 * turn, str_of(s, "id"));
    json_t *h = json_object_get(s, "history");
    cr_assert_eq((int)json_array_size(h), 2 * turn);
    for (int i = 0; i < 2 * turn; i++) {
        json_t *m = json_array_get(h, (size_t)i);
        cr_assert_str_eq(str_of(m, "role"), from->user[i] ? "user" : "assistant");
        cr_assert_str_eq(str_of(m, "text"), from->text[i], "history[%d]", i);
    }
    json_decref(s);
}

/* Resumes v's session on a new connection: its history must be v's messages. */
static void expect_history(const kvpd_proc *d, const convo *v)
{
    ws_client c;
    cr_assert_eq(h_connect(d, &c), 0);
    char msg[128];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", v->id);
    json_t *s = send_hello(&c, msg);
    cr_assert_str_eq(str_of(s, "type"), "session", "%s: %s", v->id, str_of(s, "message"));
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), v->n / 2);
    json_t *h = json_object_get(s, "history");
    cr_assert_eq((int)json_array_size(h), v->n, "%s: %zu messages, %d expected", v->id,
                 json_array_size(h), v->n);
    for (int i = 0; i < v->n; i++) {
        json_t *m = json_array_get(h, (size_t)i);
        cr_assert_str_eq(str_of(m, "role"), v->user[i] ? "user" : "assistant");
        cr_assert_str_eq(str_of(m, "text"), v->text[i], "%s: history[%d]", v->id, i);
    }
    json_decref(s);
    ws_close(&c);
}

/* A connection whose session another connection resumed is told so. */
static void kicked(ws_client *c)
{
    json_t *e = answer(c);
    cr_assert_str_eq(str_of(e, "code"), "unknown_session", "%s", str_of(e, "message"));
    json_decref(e);
}

static void new_session(ws_client *c, convo *v)
{
    memset(v, 0, sizeof *v);
    json_t *s = send_hello(c, "{\"type\":\"hello\"}");
    cr_assert_str_eq(str_of(s, "type"), "session");
    snprintf(v->id, sizeof v->id, "%s", str_of(s, "id"));
    json_decref(s);
}

/* A sample of /metrics with its labels, e.g. kvpd_reused_tokens_total{source="other"}. */
static double metric(const kvpd_proc *d, const char *sample)
{
    char *body = NULL;
    cr_assert_eq(h_get(d, "/metrics", NULL, &body), 200);
    double v = -1;
    size_t n = strlen(sample);
    for (const char *p = body; (p = strstr(p, sample)); p += n)
        if ((p == body || p[-1] == '\n') && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
    free(body);
    return v;
}

/* The bytes of a file (NULL: it does not exist), *len their count. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    *len = 0;
    if (!f)
        return NULL;
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    cr_assert(buf);
    *len = fread(buf, 1, (size_t)n, f);
    fclose(f);
    return buf;
}

/* What the state directory holds of session id: its snapshot and journal. */
typedef struct on_disk {
    char *snap, *journal;
    size_t snap_len, journal_len;
} on_disk;

static void read_disk(const char *id, on_disk *o)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.snap", g_dir, id);
    o->snap = slurp(path, &o->snap_len);
    cr_assert(o->snap, "no snapshot of %s", id);
    snprintf(path, sizeof path, "%s/%s.journal", g_dir, id);
    o->journal = slurp(path, &o->journal_len);
}

static void expect_same_disk(const on_disk *a, const on_disk *b)
{
    cr_assert_eq(a->snap_len, b->snap_len, "the source's snapshot changed size");
    cr_assert(!memcmp(a->snap, b->snap, a->snap_len), "the source's snapshot changed");
    cr_assert_eq(!a->journal, !b->journal, "the source's journal came or went");
    cr_assert_eq(a->journal_len, b->journal_len, "the source's journal changed size");
    cr_assert(!a->journal_len || !memcmp(a->journal, b->journal, a->journal_len),
              "the source's journal changed");
}

static void free_disk(on_disk *o)
{
    free(o->snap);
    free(o->journal);
}

static const char *lines[] = {"Once upon a time, there was a little dog.",
                              "The dog liked to play in the park.",
                              "One day, it saw a big red ball.",
                              "Tom said hello to his friend.",
                              "The sun was warm and bright.",
                              "Lily wanted to go home."};

/* kvpd (as start) with a source conversation a on a new connection c: the first `turns`
 * of lines, each answered in at most max_tokens. Returns the transcript's tokens at the
 * end of turn index `at` (a fork's history there), or 0 for at < 0. */
static json_int_t start_with_source(kvpd_proc *d, int state, const char *extra, ws_client *c,
                                    convo *a, int turns, int max_tokens, int at)
{
    json_int_t history = 0;
    start(d, state, extra);
    cr_assert_eq(h_connect(d, c), 0);
    new_session(c, a);
    for (int i = 0; i < turns; i++) {
        json_t *done = turn_ok(c, a, lines[i], max_tokens);
        if (i == at)
            history = stat_of(done, "transcript_tokens");
        json_decref(done);
    }
    return history;
}

/* The first turn of a fork of src at `turn` (src's transcript_tokens at the end of that
 * turn: history): the cache held the history's tokens (less what the new rendering
 * differs in, at most a chunk), so only the new message and its glue are prefilled. */
static void expect_prefix_reused(json_t *done, json_int_t history)
{
    json_int_t prompt = stat_of(done, "prompt_tokens");
    json_int_t prefilled = stat_of(done, "prefilled_tokens");
    json_int_t cached = cached_of(done);
    cr_assert_eq(prefilled, prompt, "prefilled %lld, prompt %lld", (long long)prefilled,
                 (long long)prompt);
    cr_assert_geq(cached, history - CHUNK, "the cache held %lld tokens of a %lld-token history",
                  (long long)cached, (long long)history);
    cr_assert_leq(cached, history);
    cr_assert_lt(prefilled, prompt + cached, "the whole conversation was prefilled");
    cr_assert_lt(prefilled, 30, "%lld tokens prefilled for one line", (long long)prefilled);
}

Test(fork, a_branch_at_turn_one_prefills_only_its_message_and_both_go_on)
{
    kvpd_proc d;
    ws_client ca, cb;
    convo a, b, c2;
    json_int_t history = start_with_source(&d, 1, NULL, &ca, &a, 3, 8, 0);
    on_disk before, after;
    read_disk(a.id, &before);
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), 0);

    /* the branch: turn 1's history, the cache cut back to it */
    cr_assert_eq(h_connect(&d, &cb), 0);
    fork_ok(&cb, &a, 1, &b);
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), 1);
    /* the fork holds the source's rows: copied, or shared with it (share_rows) */
    cr_assert_gt(metric(&d, "kvpd_prefix_bytes_copied_total") +
                 metric(&d, "kvpd_cache_bytes_shared"), 0);
    json_t *done = turn_ok(&cb, &b, lines[3], 8);
    expect_prefix_reused(done, history);
    cr_assert_eq(metric(&d, "kvpd_reused_tokens_total{source=\"other\"}"), cached_of(done));
    json_decref(done);
    for (int i = 4; i < 6; i++)
        json_decref(turn_ok(&cb, &b, lines[i], 8));
    /* nothing of the source was written by the fork or the branch's turns */
    read_disk(a.id, &after);
    expect_same_disk(&before, &after);
    free_disk(&after);

    /* the source goes on as if nothing happened: its own cache, its own history */
    for (int i = 3; i < 6; i++) {
        done = turn_ok(&ca, &a, lines[i], 8);
        cr_assert_lt(stat_of(done, "prompt_tokens"), 20);
        json_decref(done);
    }
    expect_history(&d, &a);
    expect_history(&d, &b);

    /* a fork of the fork, at its second turn (the source's first and its own first) */
    ws_client cc;
    cr_assert_eq(h_connect(&d, &cc), 0);
    fork_ok(&cc, &b, 2, &c2);
    done = turn_ok(&cc, &c2, lines[5], 8);
    cr_assert_eq(stat_of(done, "prefilled_tokens"), stat_of(done, "prompt_tokens"));
    cr_assert_lt(stat_of(done, "prompt_tokens"), 30);
    cr_assert_gt(cached_of(done), history);
    json_decref(done);
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), 2);
    expect_history(&d, &c2);
    expect_history(&d, &b);

    ws_close(&ca);
    ws_close(&cb);
    ws_close(&cc);
    free_disk(&before);
    convo_free(&a);
    convo_free(&b);
    convo_free(&c2);
    stop(&d);
}

Test(fork, turn_zero_keeps_the_system_text_and_the_last_turn_keeps_everything)
{
    kvpd_proc d;
    start(&d, 0, NULL);
    ws_client ca, cb;
    cr_assert_eq(h_connect(&d, &ca), 0);
    cr_assert_eq(h_connect(&d, &cb), 0);
    convo a, b;
    memset(&a, 0, sizeof a);
    json_t *s = send_hello(&ca, "{\"type\":\"hello\",\"system\":\"Be brief.\"}");
    snprintf(a.id, sizeof a.id, "%s", str_of(s, "id"));
    json_decref(s);
    for (int i = 0; i < 2; i++)
        json_decref(turn_ok(&ca, &a, lines[i], 6));
    /* turn 0: the system text only */
    s = fork_hello(&cb, a.id, 0);
    cr_assert_str_eq(str_of(s, "type"), "session", "%s", str_of(s, "message"));
    cr_assert_str_eq(str_of(s, "system"), "Be brief.");
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 0);
    cr_assert_eq(json_array_size(json_object_get(s, "history")), 0);
    convo_branch(&b, &a, 0, str_of(s, "id"));
    json_decref(s);
    json_decref(turn_ok(&cb, &b, lines[2], 6));
    expect_history(&d, &b);
    kicked(&cb);
    convo_free(&b);
    /* the source's turn count: all of it; the first turn adds only its message */
    fork_ok(&cb, &a, 2, &b);
    json_t *done = turn_ok(&cb, &b, lines[2], 6);
    cr_assert_eq(stat_of(done, "prefilled_tokens"), stat_of(done, "prompt_tokens"));
    cr_assert_lt(stat_of(done, "prompt_tokens"), 20);
    json_decref(done);
    expect_history(&d, &b);
    expect_history(&d, &a);
    convo_free(&a);
    convo_free(&b);
    ws_close(&ca);
    ws_close(&cb);
    stop(&d);
}

/* Sends frame, expects an error with code, then a normal turn on the same connection. */
static void refused(ws_client *c, const char *frame, const char *code)
{
    json_t *e = send_hello(c, frame);
    cr_assert_str_eq(str_of(e, "type"), "error", "%s was not refused", frame);
    cr_assert_str_eq(str_of(e, "code"), code, "%s: %s (%s)", frame, str_of(e, "code"),
                     str_of(e, "message"));
    json_decref(e);
    json_decref(turn_ok(c, NULL, "The cat sat.", 2));
}

Test(fork, hostile_forks_are_refused_and_the_connection_goes_on)
{
    kvpd_proc d;
    ws_client ca, c;
    convo a;
    start_with_source(&d, 0, "--max-tokens 100000", &ca, &a, 2, 6, -1);
    cr_assert_eq(h_connect(&d, &c), 0);
    char f[512];
    static const struct {
        const char *fork, *code;
    } bad[] = {
        {"{\"session\":\"0123456789abcdef0123456789abcdef\",\"turn\":1}", "unknown_session"},
        {"{\"session\":\"not-an-id\",\"turn\":1}", "unknown_session"},
        {"{\"session\":\"%s\",\"turn\":3}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":-1}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":1.0}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":1.5}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":\"1\"}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":1e30}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":9223372036854775807}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":2147483648}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":null}", "bad_request"},
        {"{\"session\":\"%s\"}", "bad_request"},
        {"{\"turn\":1}", "bad_request"},
        {"{\"session\":null,\"turn\":1}", "bad_request"},
        {"{\"session\":42,\"turn\":1}", "bad_request"},
        {"{\"session\":\"%s\",\"turn\":1,\"at\":2}", "bad_request"},
        {"\"%s\"", "bad_request"},
        {"[\"%s\",1]", "bad_request"},
        {"1", "bad_request"},
        {"true", "bad_request"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char fork[256];
        snprintf(fork, sizeof fork, bad[i].fork, a.id);
        snprintf(f, sizeof f, "{\"type\":\"hello\",\"fork\":%s}", fork);
        refused(&c, f, bad[i].code);
    }
    /* with session or system */
    snprintf(f, sizeof f, "{\"type\":\"hello\",\"session\":\"%s\",\"fork\":{\"session\":\"%s\","
             "\"turn\":1}}", a.id, a.id);
    refused(&c, f, "bad_request");
    snprintf(f, sizeof f, "{\"type\":\"hello\",\"system\":\"Hi\",\"fork\":{\"session\":\"%s\","
             "\"turn\":1}}", a.id);
    refused(&c, f, "bad_request");
    /* a busy source: its turn runs (a long sampled reply; should the model end one before
     * the fork is read, the fork is made and the next reply is tried) */
    snprintf(f, sizeof f, "{\"type\":\"hello\",\"fork\":{\"session\":\"%s\",\"turn\":1}}", a.id);
    int busy = 0, made = 0;
    for (int attempt = 0; attempt < 5 && !busy; attempt++) {
        cr_assert_eq(ws_send_text(&ca, "{\"type\":\"message\",\"text\":\"Tell me a long "
                                       "story.\",\"max_tokens\":100000,\"temperature\":0.9}"), 0);
        json_t *tok = h_expect(&ca, "token", 10000);
        cr_assert(tok, "the long turn did not start");
        json_decref(tok);
        json_t *e = send_hello(&c, f);
        busy = !strcmp(str_of(e, "type"), "error");
        made += !busy;
        if (busy)
            cr_assert_str_eq(str_of(e, "code"), "busy", "%s", str_of(e, "message"));
        json_decref(e);
        cr_assert_eq(ws_send_text(&ca, "{\"type\":\"cancel\"}"), 0);
        json_t *done = h_expect(&ca, "done", 10000);
        cr_assert(done);
        convo_add(&a, 1, "Tell me a long story.");
        convo_add(&a, 0, str_of(done, "reply"));
        json_decref(done);
    }
    cr_assert(busy, "no reply ran long enough to find the source busy");
    json_decref(turn_ok(&c, NULL, "The cat sat.", 2));
    /* nothing was forked but the forks of replies that ended early, nothing started but
     * the connection's own sessions */
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), made);
    cr_assert_eq(metric(&d, "kvpd_prefix_misses_total"), 0);
    cr_assert_eq(metric(&d, "kvpd_sessions_resident"), 2 + made);
    /* and the source, idle again, forks; the fresh branch is no source before its own
     * turn (its connection's new session would end it), nor is a session that never ran
     * one */
    convo b;
    fork_ok(&c, &a, a.n / 2, &b);
    json_t *e = fork_hello(&c, b.id, 1);
    cr_assert_str_eq(str_of(e, "code"), "bad_request", "%s", str_of(e, "message"));
    json_decref(e);
    json_decref(turn_ok(&c, &b, lines[3], 4));
    ws_client cn;
    cr_assert_eq(h_connect(&d, &cn), 0);
    convo n;
    new_session(&cn, &n);
    snprintf(f, sizeof f, "{\"type\":\"hello\",\"fork\":{\"session\":\"%s\",\"turn\":0}}",
             n.id);
    refused(&cn, f, "bad_request");
    ws_close(&cn);
    expect_history(&d, &b);
    convo_free(&a);
    convo_free(&b);
    ws_close(&ca);
    ws_close(&c);
    stop(&d);
}

Test(fork, a_source_whose_oldest_turns_were_dropped_is_refused)
{
    kvpd_proc d;
    ws_client ca, c;
    convo a;
    start_with_source(&d, 0, "--max-history-tokens 48", &ca, &a, 4, 8, -1);
    char msg[128];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", a.id);
    json_t *s = send_hello(&ca, msg);
    cr_assert_gt(json_integer_value(json_object_get(s, "history_dropped")), 0,
                 "the history was not bounded");
    json_decref(s);
    cr_assert_eq(h_connect(&d, &c), 0);
    for (int turn = 1; turn <= 4; turn++) {
        snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"fork\":{\"session\":\"%s\",\"turn\":%d}}",
                 a.id, turn);
        refused(&c, msg, "bad_request");
    }
    convo_free(&a);
    ws_close(&ca);
    ws_close(&c);
    stop(&d);
}

static void auth(ws_client *c, const char *key)
{
    char msg[128];
    snprintf(msg, sizeof msg, "{\"type\":\"auth\",\"token\":\"%s\"}", key);
    cr_assert_eq(ws_send_text(c, msg), 0);
    json_t *j = h_read_json(c, 5000);
    cr_assert(j && json_is_true(json_object_get(j, "ok")), "the key was not accepted");
    json_decref(j);
}

Test(fork, another_tenants_session_is_unknown)
{
    kvpd_proc d;
    start(&d, 0, "--api-key key-one,key-two");
    ws_client c1, c2;
    cr_assert_eq(h_connect(&d, &c1), 0);
    auth(&c1, "key-one");
    convo a, b;
    new_session(&c1, &a);
    json_decref(turn_ok(&c1, &a, lines[0], 6));
    cr_assert_eq(h_connect(&d, &c2), 0);
    auth(&c2, "key-two");
    /* answered exactly as an id that never existed */
    json_t *other = fork_hello(&c2, a.id, 1);
    json_t *none = fork_hello(&c2, "0123456789abcdef0123456789abcdef", 1);
    cr_assert_str_eq(str_of(other, "type"), "error");
    cr_assert_str_eq(str_of(other, "code"), "unknown_session");
    cr_assert_str_eq(str_of(other, "message"), str_of(none, "message"));
    json_decref(other);
    json_decref(none);
    json_decref(turn_ok(&c2, NULL, "The cat sat.", 2));
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), 0);
    /* the key that made it forks it */
    ws_client c3;
    cr_assert_eq(h_connect(&d, &c3), 0);
    auth(&c3, "key-one");
    fork_ok(&c3, &a, 1, &b);
    json_decref(turn_ok(&c3, &b, lines[1], 4));
    convo_free(&a);
    convo_free(&b);
    ws_close(&c1);
    ws_close(&c2);
    ws_close(&c3);
    stop(&d);
}

/* A source known only on disk has no tenant until it is read: another key's fork or
 * open of it is answered once its load has read the snapshot's, exactly as an id that
 * never existed; its own key forks it. */
Test(fork, after_a_restart_another_tenants_source_is_unknown_once_read)
{
    kvpd_proc d;
    ws_client c1, c2, c3;
    convo a, b;
    start(&d, 1, "--api-key key-one,key-two");
    cr_assert_eq(h_connect(&d, &c1), 0);
    auth(&c1, "key-one");
    new_session(&c1, &a);
    for (int i = 0; i < 2; i++)
        json_decref(turn_ok(&c1, &a, lines[i], 8));
    ws_close(&c1);
    stop(&d);
    start(&d, 1, "--api-key key-one,key-two");
    cr_assert_eq(h_connect(&d, &c2), 0);
    auth(&c2, "key-two");
    json_t *none = fork_hello(&c2, "0123456789abcdef0123456789abcdef", 1);
    for (int i = 0; i < 3; i++) {   /* read from disk the first time, in memory after */
        json_t *other = fork_hello(&c2, a.id, 1);
        cr_assert_str_eq(str_of(other, "code"), "unknown_session", "fork %d: %s", i,
                         str_of(other, "message"));
        cr_assert_str_eq(str_of(other, "message"), str_of(none, "message"));
        json_decref(other);
    }
    char msg[128];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", a.id);
    refused(&c2, msg, "unknown_session");
    json_decref(none);
    cr_assert_eq(h_connect(&d, &c3), 0);
    auth(&c3, "key-one");
    fork_ok(&c3, &a, 1, &b);
    json_decref(turn_ok(&c3, &b, lines[3], 4));
    convo_free(&a);
    convo_free(&b);
    ws_close(&c2);
    ws_close(&c3);
    stop(&d);
}

Test(fork, a_parked_source_is_read_then_forked)
{
    kvpd_proc d;
    ws_client ca, c;
    convo a, b;
    json_int_t history = start_with_source(&d, 1, "--idle-timeout 1", &ca, &a, 2, 8, 0);
    int parked = 0;
    for (int i = 0; i < 100 && !parked; i++) {
        parked = metric(&d, "kvpd_sessions_parked") == 1;
        if (!parked)
            nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    cr_assert(parked, "the idle session was not parked");
    on_disk before, after;
    read_disk(a.id, &before);
    cr_assert_eq(h_connect(&d, &c), 0);
    fork_ok(&c, &a, 1, &b);
    cr_assert(kvpd_log_has(&d, "loaded from its snapshot for a fork"));
    json_t *done = turn_ok(&c, &b, lines[3], 8);
    expect_prefix_reused(done, history);
    json_decref(done);
    read_disk(a.id, &after);
    expect_same_disk(&before, &after);
    free_disk(&before);
    free_disk(&after);
    /* the source's own client goes on, unaware */
    done = turn_ok(&ca, &a, lines[2], 8);
    cr_assert_lt(stat_of(done, "prompt_tokens"), 20);
    json_decref(done);
    expect_history(&d, &a);
    expect_history(&d, &b);
    convo_free(&a);
    convo_free(&b);
    ws_close(&ca);
    ws_close(&c);
    stop(&d);
}

Test(fork, after_a_restart_the_source_is_read_from_disk_a_damaged_one_is_unknown)
{
    kvpd_proc d;
    ws_client c;
    convo a, v, b;
    json_int_t history = start_with_source(&d, 1, NULL, &c, &a, 3, 8, 1);
    new_session(&c, &v);   /* a second one, whose snapshot gets damaged */
    json_decref(turn_ok(&c, &v, lines[4], 8));
    ws_close(&c);
    stop(&d);

    char path[256];
    snprintf(path, sizeof path, "%s/%s.snap", g_dir, v.id);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(fseek(f, st.st_size / 2, SEEK_SET), 0);
    int ch = fgetc(f);
    cr_assert_eq(fseek(f, st.st_size / 2, SEEK_SET), 0);
    fputc(ch ^ 0x55, f);
    fclose(f);

    start(&d, 1, NULL);
    on_disk before, after;
    read_disk(a.id, &before);
    cr_assert_eq(h_connect(&d, &c), 0);
    fork_ok(&c, &a, 2, &b);
    cr_assert(kvpd_log_has(&d, "loaded from its snapshot for a fork"));
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), 1);
    json_t *done = turn_ok(&c, &b, lines[5], 8);
    expect_prefix_reused(done, history);
    json_decref(done);
    read_disk(a.id, &after);
    expect_same_disk(&before, &after);
    free_disk(&before);
    free_disk(&after);
    expect_history(&d, &b);
    kicked(&c);
    expect_history(&d, &a);
    /* the damaged one: unknown, and the connection goes on */
    char msg[160];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"fork\":{\"session\":\"%s\",\"turn\":1}}",
             v.id);
    refused(&c, msg, "unknown_session");
    cr_assert(kvpd_log_has(&d, "lost"), "the damaged snapshot was not reported");
    convo_free(&a);
    convo_free(&b);
    convo_free(&v);
    ws_close(&c);
    stop(&d);
}

Test(fork, a_connection_closed_while_its_source_is_read_leaves_the_daemon_serving)
{
    kvpd_proc d;
    ws_client c;
    convo a, b;
    start_with_source(&d, 1, NULL, &c, &a, 2, 8, -1);
    ws_close(&c);
    stop(&d);
    start(&d, 1, NULL);
    /* the fork's read starts, and its connection goes before (or after) it ends */
    ws_client cx;
    cr_assert_eq(h_connect(&d, &cx), 0);
    char msg[160];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"fork\":{\"session\":\"%s\",\"turn\":1}}",
             a.id);
    cr_assert_eq(ws_send_text(&cx, msg), 0);
    ws_close(&cx);
    /* another connection forks it once the read is over (busy until then) */
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *s = NULL;
    for (int i = 0; i < 5000; i++) {
        s = fork_hello(&c, a.id, 1);
        if (strcmp(str_of(s, "code"), "busy"))
            break;
        json_decref(s);
        s = NULL;
    }
    cr_assert(s, "the source stayed busy");
    cr_assert_str_eq(str_of(s, "type"), "session", "%s", str_of(s, "message"));
    convo_branch(&b, &a, 2, str_of(s, "id"));
    json_decref(s);
    json_decref(turn_ok(&c, &b, lines[2], 8));
    expect_history(&d, &b);
    expect_history(&d, &a);
    convo_free(&a);
    convo_free(&b);
    ws_close(&c);
    stop(&d);
}

/* The policy /admin/stats reports in force. */
static int policy_is(const kvpd_proc *d, const char *name)
{
    json_t *st = h_stats(d);
    cr_assert(st);
    int is = !strcmp(str_of(st, "policy"), name);
    json_decref(st);
    return is;
}

Test(fork, a_source_of_another_policy_is_branched_without_its_cache)
{
    char conf[256], args[320];
    snprintf(conf, sizeof conf, "%s/kvpd.conf", g_dir);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fputs("policy = streaming\n", f);
    cr_assert_eq(fclose(f), 0);
    snprintf(args, sizeof args, "--config %s", conf);
    kvpd_proc d;
    ws_client ca, c;
    convo a, b;
    json_int_t history = start_with_source(&d, 0, args, &ca, &a, 2, 8, 0);
    /* new sessions take h2o from the reload on; the source keeps streaming */
    f = fopen(conf, "w");
    cr_assert(f);
    fputs("policy = h2o\n", f);
    cr_assert_eq(fclose(f), 0);
    kill(d.pid, SIGHUP);
    for (int i = 0; i < 500 && !policy_is(&d, "h2o"); i++)
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    cr_assert(policy_is(&d, "h2o"), "the reload was not applied");
    cr_assert_eq(h_connect(&d, &c), 0);
    fork_ok(&c, &a, 1, &b);
    json_t *done = turn_ok(&c, &b, lines[3], 8);
    /* the whole history is prefilled with the new message */
    cr_assert_eq(cached_of(done), 0);
    cr_assert_eq(stat_of(done, "prefilled_tokens"), stat_of(done, "prompt_tokens"));
    cr_assert_gt(stat_of(done, "prompt_tokens"), history);
    json_decref(done);
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), 0);
    cr_assert_eq(metric(&d, "kvpd_prefix_misses_total"), 1);
    expect_history(&d, &b);
    expect_history(&d, &a);
    convo_free(&a);
    convo_free(&b);
    ws_close(&ca);
    ws_close(&c);
    stop(&d);
}
