/* A turn's write does not grow with the conversation. After the
 * first (full) snapshot, each turn appends one journal record (what it added and the
 * cache, which the budget bounds); the snapshot is rewritten only when the journal has
 * outgrown it. Restarts replay the journal; a torn tail costs only itself. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "turns/persist.h"
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

TestSuite(security_journal, .init = setup, .fini = teardown, .timeout = 120);

static const char *str_of(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

static json_int_t stat_of(json_t *done, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(done, "stats"), key));
}

static void start(kvpd_proc *p)
{
    char args[256];
    /* budget 16: the cache is at its bound after the first turn */
    snprintf(args, sizeof args, "--state-dir %s --budget 16 --max-tokens 16", g_dir);
    cr_assert_eq(kvpd_start(p, args), 0, "log %s", p->log);
}

static void new_session(ws_client *c, char *id)
{
    cr_assert_eq(ws_send_text(c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(c, "session", 5000);
    cr_assert(s);
    snprintf(id, 64, "%s", str_of(s, "id"));
    json_decref(s);
}

static json_t *turn(ws_client *c, const char *text)
{
    json_t *done = h_turn(c, text, 16, NULL);
    cr_assert(done && !strcmp(str_of(done, "type"), "done"), "no done for '%s'", text);
    cr_expect(json_is_true(json_object_get(done, "durable")));
    return done;
}

typedef struct files { ino_t snap_ino; off_t snap_size, journal_size; } files;

static files look(const char *id)
{
    char path[256];
    struct stat st;
    files f = {0, 0, 0};
    snprintf(path, sizeof path, "%s/%s.snap", g_dir, id);
    if (stat(path, &st) == 0) {
        f.snap_ino = st.st_ino;
        f.snap_size = st.st_size;
    }
    snprintf(path, sizeof path, "%s/%s.journal", g_dir, id);
    if (stat(path, &st) == 0)
        f.journal_size = st.st_size;
    return f;
}

static json_t *hello(const kvpd_proc *p, ws_client *c, const char *id)
{
    char msg[128];
    cr_assert_eq(h_connect(p, c), 0);
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(c, msg), 0);
    json_t *s = h_expect(c, "session", 10000);
    cr_assert(s, "no session frame (log %s)", p->log);
    return s;
}

Test(security_journal, a_turn_writes_what_it_added_not_the_conversation)
{
    kvpd_proc p;
    start(&p);
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&p, &c), 0);
    new_session(&c, id);
    json_decref(turn(&c, "Once upon a time, there was a little dog."));
    files before = look(id);
    cr_assert_gt(before.snap_size, 0, "the first turn writes a full snapshot");
    long first = -1, largest = 0;
    int rewrites = 0;
    for (int k = 2; k <= 16; k++) {
        json_decref(turn(&c, "Tell me more about the dog and the park."));
        files now = look(id);
        long written = now.snap_ino != before.snap_ino ? (long)now.snap_size
                                                       : (long)(now.journal_size - before.journal_size);
        rewrites += now.snap_ino != before.snap_ino;
        cr_assert_gt(written, 0, "turn %d wrote nothing", k);
        if (now.snap_ino == before.snap_ino) {
            if (first < 0)
                first = written;
            if (written > largest)
                largest = written;
        }
        before = now;
    }
    cr_expect_eq(rewrites, 0, "the snapshot was rewritten %d times in 15 small turns", rewrites);
    /* Flat: the last turns write no more than the first journaled one (reply lengths
     * differ by a few tokens). */
    cr_expect_leq(largest, first + 1024, "a turn wrote %ld bytes, the first %ld", largest, first);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);

    /* A restart replays the journal: every turn, and the cache (only new tokens run). */
    start(&p);
    json_t *s = hello(&p, &c, id);
    cr_expect_eq(json_integer_value(json_object_get(s, "turns")), 16);
    cr_expect_eq(json_array_size(json_object_get(s, "history")), 32);
    json_decref(s);
    json_t *done = turn(&c, "What happened next?");
    cr_expect_eq(stat_of(done, "prefilled_tokens"), stat_of(done, "prompt_tokens"),
                 "the cache did not come back from the journal");
    cr_expect_eq(stat_of(done, "transcript_tokens") - stat_of(done, "generated_tokens") -
                 stat_of(done, "prompt_tokens") > 100, 1);
    json_decref(done);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_journal, the_journal_is_folded_into_the_snapshot_once_it_outgrows_it)
{
    kvpd_proc p;
    start(&p);
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&p, &c), 0);
    new_session(&c, id);
    files before = look(id);
    int rewrites = 0, turns = 0;
    off_t journal_max = 0;
    for (; turns < 200 && rewrites < 2; turns++) {
        json_decref(turn(&c, "Tell me more."));
        files now = look(id);
        rewrites += turns > 0 && now.snap_ino != before.snap_ino;
        if (now.journal_size > journal_max)
            journal_max = now.journal_size;
        before = now;
    }
    cr_expect_eq(rewrites, 2, "no compaction in %d turns", turns);
    cr_expect_leq(journal_max, (off_t)KVP_JOURNAL_MIN_BYTES + 65536,
                  "the journal reached %lld bytes", (long long)journal_max);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
    start(&p);
    json_t *s = hello(&p, &c, id);
    cr_expect_eq(json_integer_value(json_object_get(s, "turns")), turns);
    cr_expect_eq(json_array_size(json_object_get(s, "history")), (size_t)(2 * turns));
    json_decref(s);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_journal, a_torn_record_costs_only_itself)
{
    kvpd_proc p;
    start(&p);
    ws_client c;
    char id[64], path[256];
    cr_assert_eq(h_connect(&p, &c), 0);
    new_session(&c, id);
    for (int k = 0; k < 4; k++)
        json_decref(turn(&c, "Tell me more."));
    ws_close(&c);
    kvpd_kill(&p);   /* as if killed while appending a fifth record */
    snprintf(path, sizeof path, "%s/%s.journal", g_dir, id);
    FILE *f = fopen(path, "ab");
    cr_assert(f);
    static const unsigned char torn[] = {0x40, 0x01, 0, 0, 5, 0, 0, 0, 'h', 'a', 'l', 'f'};
    fwrite(torn, 1, sizeof torn, f);
    fclose(f);
    start(&p);
    json_t *s = hello(&p, &c, id);
    cr_expect_eq(json_integer_value(json_object_get(s, "turns")), 4);
    cr_expect_eq(json_array_size(json_object_get(s, "history")), 8);
    json_decref(s);
    cr_expect(kvpd_log_has(&p, "ignored"), "the torn tail was not reported (log %s)", p.log);
    /* The next write is a full snapshot: nothing is appended after the torn bytes. */
    json_decref(turn(&c, "And then?"));
    cr_expect_eq(look(id).journal_size, 0, "a journal follows the torn record");
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
    start(&p);
    s = hello(&p, &c, id);
    cr_expect_eq(json_integer_value(json_object_get(s, "turns")), 5);
    json_decref(s);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}
