/* Against a live kvpd with a state directory:
 * 4. a NUL byte in a reply (the byte token <0x00>) cut the message in the history frame
 *    (jansson "s") and in the next snapshot (strlen): messages travel with their length;
 * 5. a valid snapshot whose message is not UTF-8 left every hello for it unanswered (the
 *    session frame could not be built and was dropped): loading repairs the text to
 *    UTF-8, and a frame that cannot be built is answered with an error anyway. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/snapshot.h"
#include "base/utf8.h"
#include "tests/daemon/harness.h"

static char g_dir[128];

static void setup(void)
{
    cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);
}

static void teardown(void)
{
    h_rmdir(g_dir);
}

TestSuite(security_transcript, .init = setup, .fini = teardown, .timeout = 90);

static void start(kvpd_proc *p)
{
    char args[512];
    snprintf(args, sizeof args, "--state-dir %s", g_dir);
    cr_assert_eq(kvpd_start(p, args), 0, "kvpd did not start (log %s)", p->log);
}

static const char *str_of(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

/* A session with one completed turn; its id into id. Stops the daemon. */
static void one_turn_session(char *id)
{
    kvpd_proc p;
    start(&p);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    cr_assert(s);
    snprintf(id, 64, "%s", str_of(s, "id"));
    json_decref(s);
    json_t *done = h_turn(&c, "Once upon a time", 12, NULL);
    cr_assert(done && !strcmp(str_of(done, "type"), "done"));
    json_decref(done);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

/* Rewrites message i of the session's snapshot (a valid file with a new checksum).
 * other_model: as if made by another model, so kvpd rebuilds from the transcript
 * (re-tokenizing the messages) and its next write is a full snapshot from memory. */
static void set_message(const char *id, int i, const char *text, size_t len, int other_model)
{
    kvp_snapshot snap;
    char err[512];
    cr_assert_eq(kvp_snapshot_read(g_dir, id, &snap, err, sizeof err), 0, "%s", err);
    cr_assert_gt(snap.n_msgs, i);
    free(snap.msgs[i].text);
    snap.msgs[i].text = malloc(len + 1);
    memcpy(snap.msgs[i].text, text, len);
    snap.msgs[i].text[len] = '\0';
    snap.msgs[i].len = len;
    if (other_model)
        snap.ident.model_hash ^= 1;
    cr_assert_eq(kvp_snapshot_write(g_dir, &snap, err, sizeof err), 0, "%s", err);
    kvp_snapshot_free(&snap);
}

/* One frame as JSON; NUL bytes (\u0000) are allowed in strings. */
static json_t *read_json(ws_client *c, int timeout_ms)
{
    char *payload;
    size_t len;
    if (ws_read(c, timeout_ms, &payload, &len) < 0)
        return NULL;
    json_t *j = json_loadb(payload, len, JSON_ALLOW_NUL, NULL);
    cr_assert(j, "a frame that is not JSON: %.*s", (int)len, payload);
    free(payload);
    return j;
}

/* hello for id over a fresh connection: the first session or error frame. */
static json_t *hello(const kvpd_proc *p, ws_client *c, const char *id)
{
    char msg[128];
    cr_assert_eq(h_connect(p, c), 0);
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(c, msg), 0);
    for (;;) {
        json_t *j = read_json(c, 10000);
        cr_assert(j, "no answer to hello (log %s)", p->log);
        const char *t = str_of(j, "type");
        if (!strcmp(t, "session") || !strcmp(t, "error"))
            return j;
        json_decref(j);
    }
}

static json_t *history_text(json_t *session, int i)
{
    json_t *h = json_object_get(session, "history");
    cr_assert(json_is_array(h), "no history");
    cr_assert_gt(json_array_size(h), (size_t)i);
    json_t *t = json_object_get(json_array_get(h, (size_t)i), "text");
    cr_assert(json_is_string(t));
    return t;
}

Test(security_transcript, a_nul_in_a_reply_survives_the_history_and_the_next_snapshot)
{
    char id[64];
    one_turn_session(id);
    static const char reply[] = "Lily saw a cat.\0It was a big cat and it liked to play.";
    size_t len = sizeof reply - 1;
    set_message(id, 1, reply, len, 1);

    kvpd_proc p;
    start(&p);
    ws_client c;
    json_t *s = hello(&p, &c, id);
    cr_assert_str_eq(str_of(s, "type"), "session", "%s", str_of(s, "message"));
    json_t *t = history_text(s, 1);
    cr_expect_eq(json_string_length(t), len, "history has %zu of %zu bytes",
                 json_string_length(t), len);
    cr_expect(!memcmp(json_string_value(t), reply, len));
    json_decref(s);
    /* Another turn writes the whole snapshot from memory (after a rebuild). */
    json_t *done = h_turn(&c, "What did Lily do next?", 8, NULL);
    cr_assert(done && !strcmp(str_of(done, "type"), "done"));
    json_decref(done);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);

    kvp_snapshot snap;   /* what is on disk: the snapshot and the journal's turns */
    char err[512];
    size_t journal_bytes;
    cr_assert_eq(kvp_snapshot_read(g_dir, id, &snap, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_journal_replay(g_dir, id, &snap, &journal_bytes, err, sizeof err), 0,
                 "%s", err);
    cr_assert_geq(snap.n_msgs, 4);
    cr_expect_eq(snap.msgs[1].len, len, "the snapshot kept %zu of %zu bytes",
                 snap.msgs[1].len, len);
    cr_expect(!memcmp(snap.msgs[1].text, reply, len));
    kvp_snapshot_free(&snap);
}

Test(security_transcript, a_snapshot_with_text_that_is_not_utf8_is_loaded_repaired)
{
    char id[64];
    one_turn_session(id);
    static const char bad[] = "caf\xe9 \xff\xfe and \xed\xa0\x80 (a surrogate) and \xc3";
    set_message(id, 0, bad, sizeof bad - 1, 0);

    kvpd_proc p;
    start(&p);
    ws_client c;
    json_t *s = hello(&p, &c, id);
    cr_assert_str_eq(str_of(s, "type"), "session", "%s", str_of(s, "message"));
    json_t *t = history_text(s, 0);
    const char *text = json_string_value(t);
    cr_expect(strstr(text, "caf\xef\xbf\xbd "), "got '%s'", text);   /* U+FFFD */
    cr_expect(strstr(text, " and "), "got '%s'", text);
    cr_expect(kvp_utf8_valid(text, json_string_length(t)));
    json_decref(s);
    /* And the session goes on. */
    json_t *done = h_turn(&c, "Tell me more.", 8, NULL);
    cr_assert(done && !strcmp(str_of(done, "type"), "done"));
    json_decref(done);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

/* A second hello while the first one's snapshot loads is told the load is running, not
 * "a turn is running". Both frames go in one write, so the second is handled before
 * the load (on a worker) can end. */
Test(security_transcript, a_hello_during_a_load_is_told_so)
{
    char id[64];
    one_turn_session(id);
    kvpd_proc p;
    start(&p);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    char msg[128], frames[512];
    int n = snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    size_t len = 0;
    for (int k = 0; k < 2; k++) {   /* masked with the all-zero key: the bytes as they are */
        frames[len++] = (char)0x81;
        frames[len++] = (char)(0x80 | n);
        memset(frames + len, 0, 4);
        len += 4;
        memcpy(frames + len, msg, (size_t)n);
        len += (size_t)n;
    }
    cr_assert_eq(ws_send_raw(&c, frames, len), 0);
    int sessions = 0;
    for (int k = 0; k < 2; k++) {
        json_t *j = read_json(&c, 10000);
        cr_assert(j, "no answer to hello %d", k);
        const char *t = str_of(j, "type");
        if (!strcmp(t, "error")) {
            const char *m = str_of(j, "message");
            cr_expect(!strstr(m, "turn is running"), "misleading: %s", m);
            cr_expect(strstr(m, "loaded"), "%s", m);
        } else {
            cr_expect_str_eq(t, "session");
            sessions++;
        }
        json_decref(j);
    }
    cr_expect_geq(sessions, 1);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}
