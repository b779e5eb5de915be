/* max_history_tokens bounds the transcript a session
 * stores (memory, snapshot and journal, the history a hello returns) while the KV cache
 * stays whole: a bounded conversation gives the same replies as an unbounded one, also
 * across a restart; the OpenAI API continues a session whose matched history was partly
 * dropped only when the request names it; a version 1 snapshot still loads; bad values
 * of the key are refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "config/config.h"
#include "store/snapshot.h"
#include "tests/daemon/harness.h"

TestSuite(security_history, .timeout = 240);

#define TURNS 24
#define REPLY_TOKENS 16
#define MAX_HISTORY 100

typedef struct convo {
    char id[64];
    char *user[TURNS + 1], *reply[TURNS + 1];
    int transcript_tokens[TURNS + 1], prompt_tokens[TURNS + 1], evicted_total[TURNS + 1];
} convo;

static void convo_free(convo *c)
{
    for (int i = 0; i <= TURNS; i++) {
        free(c->user[i]);
        free(c->reply[i]);
    }
}

static int stat_of(json_t *done, const char *name)
{
    return (int)json_integer_value(json_object_get(json_object_get(done, "stats"), name));
}

/* Turns from..to of the conversation on an open connection. */
static void run_turns(ws_client *ws, convo *c, int from, int to)
{
    for (int i = from; i < to; i++) {
        char text[96];
        snprintf(text, sizeof text, "The cat number %d went to the park and saw a dog.", i);
        json_t *d = h_turn(ws, text, REPLY_TOKENS, NULL);
        cr_assert(d && !strcmp(json_string_value(json_object_get(d, "type")), "done"),
                  "turn %d did not end with done", i);
        c->user[i] = strdup(text);
        c->reply[i] = strdup(json_string_value(json_object_get(d, "reply")));
        c->transcript_tokens[i] = stat_of(d, "transcript_tokens");
        c->prompt_tokens[i] = stat_of(d, "prompt_tokens");
        c->evicted_total[i] = stat_of(d, "evicted_rows_total");
        json_decref(d);
    }
}

/* hello (id NULL: a new session); returns the session frame. */
static json_t *hello(ws_client *ws, const char *id)
{
    json_t *m = id ? json_pack("{s:s, s:s}", "type", "hello", "session", id)
                   : json_pack("{s:s}", "type", "hello");
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    cr_assert_eq(ws_send_text(ws, s), 0);
    free(s);
    json_t *f = h_expect(ws, "session", 30000);
    cr_assert(f, "no session frame");
    return f;
}

/* The snapshot and journal of id as a restart reads them. */
static void read_state(const char *dir, const char *id, kvp_snapshot *snap)
{
    char err[256];
    size_t size;
    cr_assert_eq(kvp_snapshot_read(dir, id, snap, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_journal_replay(dir, id, snap, &size, err, sizeof err), 0, "%s", err);
}

Test(security_history, bounded_history_keeps_the_cache_exact_across_a_restart)
{
    char dir[64];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    char flags[160];
    snprintf(flags, sizeof flags, "--state-dir %s --max-history-tokens %d", dir, MAX_HISTORY);

    /* The reference: the same conversation, history unbounded, no restart. */
    convo ref = {0}, bounded = {0};
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--max-history-tokens 0"), 0, "log %s", p.log);
    ws_client ws;
    cr_assert_eq(h_connect(&p, &ws), 0);
    json_decref(hello(&ws, NULL));
    run_turns(&ws, &ref, 0, TURNS + 1);
    ws_close(&ws);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);

    cr_assert_eq(kvpd_start(&p, flags), 0, "log %s", p.log);
    cr_assert_eq(h_connect(&p, &ws), 0);
    json_t *s = hello(&ws, NULL);
    snprintf(bounded.id, sizeof bounded.id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    run_turns(&ws, &bounded, 0, TURNS);
    ws_close(&ws);

    /* Memory: the history a hello returns is what the session holds. */
    cr_assert_eq(h_connect(&p, &ws), 0);
    s = hello(&ws, bounded.id);
    json_t *hist = json_object_get(s, "history");
    int kept = (int)json_array_size(hist);
    int dropped = (int)json_integer_value(json_object_get(s, "history_dropped"));
    cr_expect_gt(dropped, 0, "nothing was dropped from %d messages", 2 * TURNS);
    cr_expect_eq(kept + dropped, 2 * TURNS, "kept %d + dropped %d", kept, dropped);
    cr_expect_leq(kept, 2 * 4, "kept %d messages of %d-token turns under %d tokens", kept,
                  REPLY_TOKENS, MAX_HISTORY);
    for (int i = 0; i < kept; i++) {   /* the newest messages, in order */
        int turn = (dropped + i) / 2;
        const char *want = (dropped + i) % 2 ? bounded.reply[turn] : bounded.user[turn];
        cr_expect_str_eq(json_string_value(json_object_get(json_array_get(hist, (size_t)i),
                                                           "text")), want);
    }
    json_decref(s);
    ws_close(&ws);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);

    /* Disk: the snapshot and journal hold the same bounded transcript. */
    kvp_snapshot snap;
    read_state(dir, bounded.id, &snap);
    cr_expect_eq(snap.hist_msgs, dropped);
    cr_expect_eq(snap.n_msgs, kept);
    cr_expect_leq(snap.n_tokens, MAX_HISTORY + 64, "%d tokens stored", snap.n_tokens);
    cr_expect_eq(snap.hist_tokens + snap.n_tokens, bounded.transcript_tokens[TURNS - 1]);
    kvp_snapshot_free(&snap);

    /* Every turn saw the same cache as the unbounded run: same replies, the same rows
     * evicted, the same count of tokens (the conversation is longer than the model's
     * context: it shifted, from the true positions). */
    cr_assert_gt(ref.transcript_tokens[TURNS - 1], 512, "too short to shift the context");
    for (int i = 0; i < TURNS; i++) {
        cr_expect_str_eq(bounded.reply[i], ref.reply[i], "turn %d", i);
        cr_expect_eq(bounded.transcript_tokens[i], ref.transcript_tokens[i], "turn %d", i);
        cr_expect_eq(bounded.prompt_tokens[i], ref.prompt_tokens[i], "turn %d", i);
        cr_expect_eq(bounded.evicted_total[i], ref.evicted_total[i], "turn %d", i);
    }

    /* After a restart the session resumes its cache (not a rebuild from the kept
     * messages) and the next turn continues at the true positions. */
    cr_assert_eq(kvpd_start(&p, flags), 0, "log %s", p.log);
    cr_assert_eq(h_connect(&p, &ws), 0);
    s = hello(&ws, bounded.id);
    cr_expect(json_is_true(json_object_get(s, "resumed")));
    cr_expect_eq(json_integer_value(json_object_get(s, "history_dropped")), dropped);
    json_decref(s);
    run_turns(&ws, &bounded, TURNS, TURNS + 1);
    cr_expect_str_eq(bounded.reply[TURNS], ref.reply[TURNS], "the turn after the restart");
    cr_expect_eq(bounded.prompt_tokens[TURNS], ref.prompt_tokens[TURNS],
                 "the turn after the restart prefilled %d tokens", bounded.prompt_tokens[TURNS]);
    cr_expect_eq(bounded.evicted_total[TURNS], ref.evicted_total[TURNS]);
    cr_expect_eq(bounded.transcript_tokens[TURNS], ref.transcript_tokens[TURNS]);
    cr_expect(!kvpd_log_has(&p, "rebuilt"), "the session was rebuilt, log %s", p.log);
    ws_close(&ws);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);

    /* Under another policy the cache cannot be used: it is rebuilt from the kept
     * messages alone (rendered as a conversation of their own), and goes on. */
    char other[200];
    snprintf(other, sizeof other, "%s --policy h2o", flags);
    cr_assert_eq(kvpd_start(&p, other), 0, "log %s", p.log);
    cr_assert_eq(h_connect(&p, &ws), 0);
    s = hello(&ws, bounded.id);
    cr_expect_geq(json_integer_value(json_object_get(s, "history_dropped")), dropped);
    json_decref(s);
    json_t *d = h_turn(&ws, "What happened next?", 8, NULL);
    cr_expect(d && !strcmp(json_string_value(json_object_get(d, "type")), "done"),
              "no done after the rebuild");
    cr_expect(json_is_true(json_object_get(d, "durable")), "the rebuilt turn was not saved");
    cr_expect_leq(stat_of(d, "prompt_tokens"), MAX_HISTORY + 64 + 16,
                  "the rebuild prefilled more than the kept messages");
    json_decref(d);
    cr_expect(kvpd_log_has(&p, "rebuilt"), "log %s", p.log);
    ws_close(&ws);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
    convo_free(&ref);
    convo_free(&bounded);
    h_rmdir(dir);
}

/* ---- the OpenAI API on a session whose matched history was partly dropped ---- */

/* The JSON body of a non-streamed answer. */
static json_t *completion(const kvpd_proc *p, const char *id, const convo *c, int turns)
{
    json_t *msgs = json_array();
    for (int i = 0; i < turns; i++) {
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", c->user[i]));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                              c->reply[i]));
    }
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", "And then?"));
    json_t *req = json_pack("{s:s, s:o, s:i}", "model", "stories260K.bin", "messages", msgs, "max_tokens", 4);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char headers[128] = "";
    if (id)
        snprintf(headers, sizeof headers, "X-Session-Id: %s\r\n", id);
    char *raw;
    const char *b;
    int status = h_request(p->port, "POST", "/v1/chat/completions", headers, body, &raw, &b);
    free(body);
    cr_assert_eq(status, 200, "answer: %.300s", raw ? raw : "(none)");
    json_t *j = json_loads(b, 0, NULL);
    free(raw);
    cr_assert(j);
    return j;
}

Test(security_history, openai_continues_a_bounded_session_only_by_its_id)
{
    char flags[64];
    snprintf(flags, sizeof flags, "--max-history-tokens %d", MAX_HISTORY);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, flags), 0, "log %s", p.log);
    convo c = {0};
    ws_client ws;
    cr_assert_eq(h_connect(&p, &ws), 0);
    json_t *s = hello(&ws, NULL);
    snprintf(c.id, sizeof c.id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    int turns = 10;
    run_turns(&ws, &c, 0, turns);
    s = hello(&ws, c.id);
    cr_assert_gt(json_integer_value(json_object_get(s, "history_dropped")), 0);
    json_decref(s);
    ws_close(&ws);

    /* Without the id the dropped messages cannot be compared: a new session. */
    json_t *j = completion(&p, NULL, &c, turns);
    cr_expect_str_neq(json_string_value(json_object_get(j, "session")), c.id,
                      "an anonymous request continued a session whose history was dropped");
    json_decref(j);
    /* Named, with the whole history: continued from its cache. */
    j = completion(&p, c.id, &c, turns);
    cr_expect_str_eq(json_string_value(json_object_get(j, "session")), c.id);
    json_t *details = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    int cached = (int)json_integer_value(json_object_get(details, "cached_tokens"));
    cr_expect_geq(cached, c.transcript_tokens[turns - 1] - 2, "not continued from the cache: "
                  "%d of %d tokens cached", cached, c.transcript_tokens[turns - 1]);
    json_decref(j);
    /* Named, with a history that differs in a dropped message: not continued. */
    free(c.user[0]);
    c.user[0] = strdup("Another beginning.");
    j = completion(&p, c.id, &c, turns);
    cr_expect_str_neq(json_string_value(json_object_get(j, "session")), c.id,
                      "a different dropped message was taken for the session's");
    json_decref(j);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
    convo_free(&c);
}

/* ---- the format and the key ---- */

static void w_str(kvp_wbuf *w, const char *s)
{
    kvp_w_u32(w, (uint32_t)strlen(s));
    kvp_w_bytes(w, s, strlen(s));
}

static void section(kvp_wbuf *w, const char *tag, const kvp_wbuf *body)
{
    kvp_w_bytes(w, tag, 4);
    kvp_w_u32(w, 0);
    kvp_w_u64(w, body->n);
    kvp_w_bytes(w, body->p, body->n);
}

Test(security_history, a_version_1_snapshot_still_loads)
{
    /* Written field by field as docs/snapshot-format.md gave version 1. */
    char dir[64];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    static unsigned char mem[6][4096];
    kvp_wbuf iden = {mem[0], 0}, cntr = {mem[1], 0}, msgs = {mem[2], 0}, toks = {mem[3], 0},
             cach = {mem[4], 0}, file = {mem[5], 0};
    w_str(&iden, "old1");
    w_str(&iden, "m");
    kvp_w_u64(&iden, 1);
    w_str(&iden, "streaming");
    kvp_w_u64(&iden, 0);
    kvp_w_u32(&iden, 64);
    kvp_w_u32(&cntr, 1);
    kvp_w_u64(&cntr, 0);
    kvp_w_f64(&cntr, 1.5);
    kvp_w_f64(&cntr, 2.5);
    kvp_w_u32(&msgs, 2);
    const char *texts[2] = {"hello", "hi there"};
    for (int i = 0; i < 2; i++) {
        unsigned char role = i == 0;
        kvp_w_bytes(&msgs, &role, 1);
        kvp_w_u32(&msgs, (uint32_t)strlen(texts[i]));
        kvp_w_bytes(&msgs, texts[i], strlen(texts[i]));
    }
    kvp_w_u32(&toks, 3);
    kvp_w_u32(&toks, 2);
    for (int i = 0; i < 3; i++)
        kvp_w_u32(&toks, (uint32_t)(10 + i));
    kvp_w_bytes(&cach, "cache", 5);
    kvp_w_bytes(&file, "KVPSNAP\0", 8);
    kvp_w_u32(&file, 1);
    kvp_w_u32(&file, 5);
    section(&file, "IDEN", &iden);
    section(&file, "CNTR", &cntr);
    section(&file, "MSGS", &msgs);
    section(&file, "TOKS", &toks);
    section(&file, "CACH", &cach);
    kvp_w_u64(&file, kvp_fnv1a(KVP_FNV1A_INIT, file.p, file.n));
    char path[128];
    snprintf(path, sizeof path, "%s/old1.snap", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(file.p, 1, file.n, f) == file.n && fclose(f) == 0);

    kvp_snapshot snap;
    char err[256];
    cr_assert_eq(kvp_snapshot_read(dir, "old1", &snap, err, sizeof err), 0, "%s", err);
    cr_expect_eq(snap.version, 1);
    cr_expect_eq(snap.n_msgs, 2);
    cr_expect_str_eq(snap.msgs[1].text, "hi there");
    cr_expect_eq(snap.msgs[0].first_token, -1, "a version 1 file says nothing of it");
    cr_expect_eq(snap.n_tokens, 3);
    cr_expect_eq(snap.n_cached, 2);
    cr_expect_eq(snap.hist_msgs, 0);
    cr_expect_eq(snap.hist_tokens, 0);
    cr_expect_eq(snap.hist_hash, KVP_FNV1A_INIT);
    kvp_snapshot_free(&snap);
    h_rmdir(dir);
}

Test(security_history, bad_values_of_max_history_tokens_are_refused)
{
    kvpd_config c;
    kvpd_config_defaults(&c);
    cr_expect_gt(c.max_history_tokens, 0, "the default bounds the history");
    char err[256];
    const char *bad[] = {"-1", " 5", "5 ", "+5", "5x", "abc", "", "0x10", "1e3", "1.5",
                         "99999999999999999999", "2147483648", "1073741825"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_lt(kvpd_config_set(&c, "max_history_tokens", bad[i], err, sizeof err), 0,
                     "'%s' was accepted", bad[i]);
    cr_expect_eq(kvpd_config_set(&c, "max_history_tokens", "0", err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.max_history_tokens, 0);
    cr_expect_eq(kvpd_config_set(&c, "max_history_tokens", "4096", err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.max_history_tokens, 4096);
    /* and on the command line, the daemon refuses to start */
    kvpd_proc p;
    cr_expect_neq(kvpd_start(&p, "--max-history-tokens -5"), 0);
    cr_expect_neq(kvpd_start(&p, "--max-history-tokens many"), 0);
}
