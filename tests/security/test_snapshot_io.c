/* At the snapshot module: a FIFO, a symbolic link or a directory
 * in place of a snapshot must neither block a worker in open() nor be followed; they are
 * refused (-EBADMSG, moved aside). Messages read back are valid UTF-8. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/kvcache.h"
#include "store/snapshot.h"
#include "base/utf8.h"

static char g_dir[64];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/kvp-snapio-XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            unlinkat(dirfd(d), e->d_name, 0) < 0)
            unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
    if (d)
        closedir(d);
    rmdir(g_dir);
}

/* A FIFO nobody writes would block open() forever: the timeout is the failure. */
TestSuite(security_snapshot_io, .init = make_dir, .fini = remove_dir, .timeout = 20);

static const char *path_of(const char *name)
{
    static char buf[2][256];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static int count_prefix(const char *prefix)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

static void write_snapshot(const char *id, kvp_snapshot_msg *msgs, int n_msgs)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 1, 4, &(kvp_rope){.n_rot = 4, .base = 10000.0f}), 0);
    kvp_snapshot s;
    memset(&s, 0, sizeof s);
    snprintf(s.id, sizeof s.id, "%s", id);
    snprintf(s.ident.model_name, sizeof s.ident.model_name, "m");
    snprintf(s.ident.policy_name, sizeof s.ident.policy_name, "streaming");
    s.msgs = msgs;
    s.n_msgs = n_msgs;
    cr_assert_eq(kvp_cache_serialize(&c, &s.cache, &s.cache_len), 0);
    char err[256];
    cr_assert_eq(kvp_snapshot_write(g_dir, &s, err, sizeof err), 0, "%s", err);
    free(s.cache);
    kvp_cache_free(&c);
}

static void expect_refused(const char *id, const char *what)
{
    kvp_snapshot snap;
    char err[512] = "";
    int rc = kvp_snapshot_read(g_dir, id, &snap, err, sizeof err);
    cr_expect_eq(rc, -EBADMSG, "%s: rc %d (%s)", what, rc, err);
    cr_expect(strstr(err, "moved aside"), "%s: %s", what, err);
    char name[128];
    snprintf(name, sizeof name, "%s.snap.bad-", id);
    cr_expect_eq(count_prefix(name), 1, "%s was not moved aside", what);
}

Test(security_snapshot_io, a_fifo_is_refused_without_blocking)
{
    cr_assert_eq(mkfifo(path_of("fifo1.snap"), 0600), 0);
    expect_refused("fifo1", "a FIFO");
}

Test(security_snapshot_io, a_symlink_is_not_followed)
{
    kvp_snapshot_msg m = {1, "hello", 5, 0};
    write_snapshot("real", &m, 1);
    cr_assert_eq(symlink(path_of("real.snap"), path_of("link.snap")), 0);
    expect_refused("link", "a symbolic link");
    kvp_snapshot snap;
    char err[256];
    cr_expect_eq(kvp_snapshot_read(g_dir, "real", &snap, err, sizeof err), 0, "%s", err);
    kvp_snapshot_free(&snap);
}

Test(security_snapshot_io, a_directory_is_refused)
{
    cr_assert_eq(mkdir(path_of("dir1.snap"), 0700), 0);
    expect_refused("dir1", "a directory");
}

Test(security_snapshot_io, a_fifo_in_place_of_the_temporary_file_fails_the_write)
{
    cr_assert_eq(mkfifo(path_of("w1.snap.tmp"), 0600), 0);
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 1, 4, &(kvp_rope){.n_rot = 4, .base = 10000.0f}), 0);
    kvp_snapshot s;
    memset(&s, 0, sizeof s);
    snprintf(s.id, sizeof s.id, "w1");
    cr_assert_eq(kvp_cache_serialize(&c, &s.cache, &s.cache_len), 0);
    char err[256] = "";
    cr_expect_lt(kvp_snapshot_write(g_dir, &s, err, sizeof err), 0);
    cr_expect(err[0]);
    struct stat st;
    cr_expect_neq(stat(path_of("w1.snap"), &st), 0, "a snapshot appeared");
    free(s.cache);
    kvp_cache_free(&c);
}

Test(security_snapshot_io, messages_read_back_are_utf8)
{
    kvp_snapshot_msg m[3] = {{1, "plain \xc3\xa9t\xc3\xa9!", 12, 0},
                             {0, "bad \xff\x80 \xe2\x82", 10, 0},
                             {1, "nul\0inside", 10, 0}};
    write_snapshot("u1", m, 3);
    kvp_snapshot snap;
    char err[256];
    cr_assert_eq(kvp_snapshot_read(g_dir, "u1", &snap, err, sizeof err), 0, "%s", err);
    cr_assert_eq(snap.n_msgs, 3);
    cr_expect_eq(snap.msgs[0].len, 12);   /* valid text is kept as it is */
    cr_expect(!memcmp(snap.msgs[0].text, m[0].text, 12));
    cr_expect(kvp_utf8_valid(snap.msgs[1].text, snap.msgs[1].len));
    cr_expect(!strncmp(snap.msgs[1].text, "bad \xef\xbf\xbd", 7), "%s", snap.msgs[1].text);
    cr_expect_eq(snap.msgs[2].len, 10);   /* NULs are valid UTF-8 */
    cr_expect(!memcmp(snap.msgs[2].text, "nul\0inside", 10));
    kvp_snapshot_free(&snap);
}

/* The journal's file rules: records that a newer full snapshot already
 * holds (a crash between its rename and the journal's removal) are skipped, records that
 * do not follow are not applied, and a FIFO in the journal's place blocks nothing. */
static kvp_journal_rec record(int msgs_before, int tokens_before, const kvp_snapshot_msg *m,
                              const int *tokens, const void *cache, size_t cache_len)
{
    kvp_journal_rec r = {.turns = msgs_before / 2 + 1, .last_active = 1.0,
                         .msgs_before = msgs_before, .msgs = m, .n_msgs = 2,
                         .tokens_before = tokens_before, .tokens = tokens, .n_tokens = 3,
                         .n_cached = tokens_before + 3, .cache = cache, .cache_len = cache_len};
    return r;
}

Test(security_snapshot_io, journal_records_apply_once_and_in_order)
{
    kvp_snapshot_msg base[2] = {{1, "hi", 2, 0}, {0, "hello", 5, 0}};
    write_snapshot("j1", base, 2);
    kvp_snapshot_msg more[2] = {{1, "and\0then", 8, 0}, {0, "more", 4, 1}};
    int tokens[3] = {7, 8, 9};
    static const char cache[] = "not a real cache";
    kvp_journal_rec r = record(2, 0, more, tokens, cache, sizeof cache);
    size_t size = 0;
    char err[256];
    cr_assert_eq(kvp_journal_append(g_dir, "j1", &r, &size, err, sizeof err), 0, "%s", err);
    cr_expect_gt(size, 0);
    kvp_snapshot snap;
    cr_assert_eq(kvp_snapshot_read(g_dir, "j1", &snap, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_journal_replay(g_dir, "j1", &snap, &size, err, sizeof err), 0, "%s", err);
    cr_expect_eq(snap.n_msgs, 4);
    cr_expect_eq(snap.msgs[2].len, 8);
    cr_expect(!memcmp(snap.msgs[2].text, "and\0then", 8));
    cr_expect_eq(snap.n_tokens, 3);
    cr_expect_eq(snap.n_cached, 3);
    cr_expect_eq(snap.cache_len, sizeof cache);

    /* A full snapshot of that state, then the old journal put back (the crash window):
     * its record is skipped, not applied twice. */
    char jpath[256], saved[256];
    snprintf(jpath, sizeof jpath, "%s", path_of("j1.journal"));
    snprintf(saved, sizeof saved, "%s", path_of("j1.saved"));
    cr_assert_eq(rename(jpath, saved), 0);
    cr_assert_eq(kvp_snapshot_write(g_dir, &snap, err, sizeof err), 0, "%s", err);
    kvp_snapshot_free(&snap);
    cr_assert_eq(rename(saved, jpath), 0);
    cr_assert_eq(kvp_snapshot_read(g_dir, "j1", &snap, err, sizeof err), 0, "%s", err);
    cr_expect_eq(kvp_journal_replay(g_dir, "j1", &snap, &size, err, sizeof err), 0, "%s", err);
    cr_expect_eq(snap.n_msgs, 4, "a record was applied twice");
    kvp_snapshot_free(&snap);

    /* A record that does not follow (it extends 7 messages) is not applied. */
    kvp_journal_rec gap = record(7, 3, more, tokens, cache, sizeof cache);
    cr_assert_eq(kvp_journal_append(g_dir, "j1", &gap, &size, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_snapshot_read(g_dir, "j1", &snap, err, sizeof err), 0, "%s", err);
    cr_expect_eq(kvp_journal_replay(g_dir, "j1", &snap, &size, err, sizeof err), 1);
    cr_expect_eq(snap.n_msgs, 4);
    kvp_snapshot_free(&snap);
}

Test(security_snapshot_io, a_fifo_in_place_of_the_journal_blocks_nothing)
{
    kvp_snapshot_msg base[1] = {{1, "hi", 2, 0}};
    write_snapshot("j2", base, 1);
    cr_assert_eq(mkfifo(path_of("j2.journal"), 0600), 0);
    kvp_snapshot snap;
    char err[256];
    size_t size;
    cr_assert_eq(kvp_snapshot_read(g_dir, "j2", &snap, err, sizeof err), 0, "%s", err);
    cr_expect_eq(kvp_journal_replay(g_dir, "j2", &snap, &size, err, sizeof err), 1);
    cr_expect_eq(snap.n_msgs, 1);
    kvp_snapshot_free(&snap);
    int tokens[3] = {1, 2, 3};
    kvp_snapshot_msg two[2] = {{1, "a", 1, 0}, {0, "b", 1, 1}};
    kvp_journal_rec r = record(1, 0, two, tokens, "c", 1);
    cr_expect_lt(kvp_journal_append(g_dir, "j2", &r, &size, err, sizeof err), 0);
}
