/* store/transcripts.c: the index of conversations by transcript hash, in memory (put,
 * replace, remove, candidates by hash, growth) and on disk (appended lines, read back with
 * the last line of an id winning, damaged lines and sessions without a snapshot dropped,
 * the file compacted). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/transcripts.h"
#include "tests/testdir.h"

KVP_TEST_DIR_SUITE(transcripts, dir, "tix");

static int candidates(const kvp_transcripts *x, uint64_t hash, int n, const char **ids, int max)
{
    int k = 0;
    for (const kvp_transcript_entry *e = kvp_transcripts_next(x, hash, n, NULL); e;
         e = kvp_transcripts_next(x, hash, n, e))
        if (k < max)
            ids[k++] = e->id;
        else
            k++;
    return k;
}

Test(transcripts, put_replaces_and_candidates_match_hash_and_count)
{
    kvp_transcripts x;
    cr_assert_eq(kvp_transcripts_init(&x), 0);
    cr_assert_eq(kvp_transcripts_put(&x, "a", 7, 2), 0);
    cr_assert_eq(kvp_transcripts_put(&x, "b", 7, 2), 0);
    cr_assert_eq(kvp_transcripts_put(&x, "c", 7, 4), 0);   /* same hash, another count */
    const char *ids[4];
    cr_assert_eq(candidates(&x, 7, 2, ids, 4), 2);
    cr_assert_eq(candidates(&x, 7, 4, ids, 4), 1);
    cr_assert_str_eq(ids[0], "c");
    /* a moves on: its old hash no longer finds it */
    cr_assert_eq(kvp_transcripts_put(&x, "a", 9, 4), 0);
    cr_assert_eq(x.count, 3);
    cr_assert_eq(candidates(&x, 7, 2, ids, 4), 1);
    cr_assert_str_eq(ids[0], "b");
    cr_assert_eq(kvp_transcripts_get(&x, "a")->hash, 9);
    kvp_transcripts_remove(&x, "b");
    kvp_transcripts_remove(&x, "nobody");
    cr_assert_eq(candidates(&x, 7, 2, ids, 4), 0);
    cr_assert_null(kvp_transcripts_get(&x, "b"));
    cr_assert_eq(x.count, 2);
    kvp_transcripts_free(&x);
}

Test(transcripts, many_sessions_each_found_after_growth)
{
    kvp_transcripts x;
    cr_assert_eq(kvp_transcripts_init(&x), 0);
    char id[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "s%d", i);
        cr_assert_eq(kvp_transcripts_put(&x, id, (uint64_t)i * 0x9E3779B97F4A7C15ull, i % 7), 0);
    }
    cr_assert_geq(x.n_buckets, 4096);
    for (int i = 0; i < 5000; i++) {
        const kvp_transcript_entry *e =
            kvp_transcripts_next(&x, (uint64_t)i * 0x9E3779B97F4A7C15ull, i % 7, NULL);
        snprintf(id, sizeof id, "s%d", i);
        cr_assert(e && !strcmp(e->id, id), "%s", id);
    }
    kvp_transcripts_free(&x);
}

static void touch(const char *name)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fclose(f);
}

static char *slurp_index(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/" KVP_TRANSCRIPTS_FILE, dir);
    FILE *f = fopen(p, "r");
    cr_assert(f);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(transcripts, the_file_is_read_back_last_line_wins_and_compacted)
{
    char err[256] = "";
    kvp_transcripts x;
    cr_assert_eq(kvp_transcripts_init(&x), 0);
    cr_assert_eq(kvp_transcripts_load(&x, dir, err, sizeof err), 0, "no file: nothing");
    kvp_transcripts_free(&x);

    touch("alive.snap");
    touch("other.snap");
    cr_assert_eq(kvp_transcripts_append(dir, "alive", 0x1111, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_transcripts_append(dir, "gone", 0x2222, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_transcripts_append(dir, "alive", 0xabcdef0123456789ull, 4, err, sizeof err), 0);
    cr_assert_eq(kvp_transcripts_append(dir, "../evil", 1, 1, err, sizeof err), -EINVAL);
    /* hostile and torn lines among good ones */
    char p[128];
    snprintf(p, sizeof p, "%s/" KVP_TRANSCRIPTS_FILE, dir);
    FILE *f = fopen(p, "a");
    fputs("other 00000000000000zz 2\n", f);         /* not hex */
    fputs("other 0000000000000003\n", f);           /* no count */
    fputs("../etc/passwd 0000000000000003 2\n", f); /* not an id */
    fputs("other 0000000000000003 99999999999\n", f); /* count out of range */
    fputs("other 00000000000000003 2\n", f);        /* 17 digits */
    fputs("other 0000000000000003 2\n", f);         /* good */
    fputs("other 0000000000000004 2", f);           /* torn: no newline */
    fclose(f);

    cr_assert_eq(kvp_transcripts_init(&x), 0);
    err[0] = '\0';
    cr_assert_eq(kvp_transcripts_load(&x, dir, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "6 damaged"), "%s", err);
    const kvp_transcript_entry *e = kvp_transcripts_get(&x, "alive");
    cr_assert(e && e->hash == 0xabcdef0123456789ull && e->n_msgs == 4, "the last line wins");
    e = kvp_transcripts_get(&x, "other");
    cr_assert(e && e->hash == 3 && e->n_msgs == 2);
    cr_assert_null(kvp_transcripts_get(&x, "gone"), "a session without a snapshot was kept");
    kvp_transcripts_free(&x);

    /* Compacted: one line per live session, and it reads back the same. */
    char *text = slurp_index();
    int lines = 0;
    for (char *q = text; (q = strchr(q, '\n')); q++)
        lines++;
    cr_assert_eq(lines, 2, "%s", text);
    cr_assert(strstr(text, "alive abcdef0123456789 4\n"), "%s", text);
    cr_assert_eq(kvp_transcripts_init(&x), 0);
    err[0] = '\0';
    cr_assert_eq(kvp_transcripts_load(&x, dir, err, sizeof err), 2);
    cr_assert_str_eq(err, "");
    kvp_transcripts_free(&x);
}

Test(transcripts, a_link_in_place_of_the_file_is_refused)
{
    char p[128], err[256];
    snprintf(p, sizeof p, "%s/" KVP_TRANSCRIPTS_FILE, dir);
    cr_assert_eq(symlink("/etc/passwd", p), 0);
    kvp_transcripts x;
    cr_assert_eq(kvp_transcripts_init(&x), 0);
    cr_assert_lt(kvp_transcripts_load(&x, dir, err, sizeof err), 0);
    cr_assert_eq(x.count, 0);
    cr_assert_lt(kvp_transcripts_append(dir, "a", 1, 1, err, sizeof err), 0);
    kvp_transcripts_free(&x);
    struct stat st;
    cr_assert_eq(lstat("/etc/passwd", &st), 0);
}

Test(transcripts, a_fresh_directory_loads_without_a_message)
{
    char err[256] = "";
    kvp_transcripts x;
    cr_assert_eq(kvp_transcripts_init(&x), 0);
    cr_assert_eq(kvp_transcripts_load(&x, dir, err, sizeof err), 0);
    cr_assert_str_eq(err, "", "a missing index is not worth a warning");
    kvp_transcripts_free(&x);
}

/* A line per saved turn: the file is compacted as it grows, not only at start. */
Test(transcripts, appends_keep_the_file_bounded_and_the_last_line_wins)
{
    char err[256] = "", p[128];
    touch("s0.snap");
    touch("s1.snap");
    touch("s2.snap");
    snprintf(p, sizeof p, "%s/" KVP_TRANSCRIPTS_FILE, dir);
    struct stat st;
    off_t largest = 0;
    for (int i = 0; i < 12000; i++) {
        char id[8];
        snprintf(id, sizeof id, "s%d", i % 3);
        cr_assert_eq(kvp_transcripts_append(dir, id, (uint64_t)i, i + 1, err, sizeof err), 0,
                     "%s", err);
        cr_assert_eq(stat(p, &st), 0);
        if (st.st_size > largest)
            largest = st.st_size;
    }
    /* 12000 lines of about 25 bytes would be 300 kB */
    cr_assert_leq(largest, KVP_TRANSCRIPTS_COMPACT_MIN + 64, "the index grew to %lld bytes",
                  (long long)largest);
    cr_assert_lt(st.st_size, KVP_TRANSCRIPTS_COMPACT_MIN);
    kvp_transcripts x;
    cr_assert_eq(kvp_transcripts_init(&x), 0);
    cr_assert_eq(kvp_transcripts_load(&x, dir, err, sizeof err), 3, "%s", err);
    for (int k = 0; k < 3; k++) {
        char id[8];
        snprintf(id, sizeof id, "s%d", k);
        const kvp_transcript_entry *e = kvp_transcripts_get(&x, id);
        int last = 12000 - 3 + k;
        cr_assert(e && e->hash == (uint64_t)last && e->n_msgs == last + 1, "%s", id);
    }
    kvp_transcripts_free(&x);
}
