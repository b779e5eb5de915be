/* observe/learnlog.c: transcript files for learning. A file read back is what was
 * written; a damaged one (a flipped byte, cut short, another file's magic, ids outside
 * the vocabulary, a header announcing more than is there) is refused as -EBADMSG with a
 * message; the caps delete the oldest files past the size and those past the age, over
 * every tenant's folder; the sampled share is about the rate and the same for a session
 * every time; each tenant's files are in a folder of its own, deleted alone; a system
 * prompt's tokens are cut out of a transcript only where they are found. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/tokfile.h"
#include "observe/learnlog.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvp-learnlog-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void remove_tree(const char *top)
{
    DIR *d = opendir(top);
    char p[512];
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", top, e->d_name);
            if (unlink(p))
                remove_tree(p);
        }
    if (d)
        closedir(d);
    rmdir(top);
}

static void remove_dir(void)
{
    remove_tree(dir);
}

/* Entries of dir/sub (sub "": dir), the folders' own entries counted instead of them. */
static int count_in(const char *sub)
{
    char top[256];
    snprintf(top, sizeof top, sub[0] ? "%s/%s" : "%s%s", dir, sub);
    DIR *d = opendir(top);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        struct stat st;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", top, e->d_name);
        n += !sub[0] && stat(p, &st) == 0 && S_ISDIR(st.st_mode) ? count_in(e->d_name) : 1;
    }
    if (d)
        closedir(d);
    return n;
}

static int count_files(void)
{
    return count_in("");
}

/* The file of a conversation of tenant ("": the default folder). */
static void file_in(const char *tenant, const char *id, char *out, size_t len)
{
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, id, strlen(id));
    snprintf(out, len, "%s/%s/%016llx%s", dir, tenant[0] ? tenant : "default",
             (unsigned long long)h, KVP_LEARNLOG_EXT);
}

static void file_of(const char *id, char *out, size_t len)
{
    file_in("", id, out, len);
}

static kvp_learnlog_cfg cfg(void)
{
    return (kvp_learnlog_cfg){.dir = dir, .rate = 1.0, .fingerprint = 0x1234abcdULL};
}

Test(learnlog, a_file_reads_back_as_written)
{
    make_dir();
    kvp_learnlog_cfg c = cfg();
    int ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = (i * 37) % 512;
    char err[256], path[512];
    cr_assert_eq(kvp_learnlog_write(&c, "", "session-a", ids, 300, err, sizeof err), 0, "%s", err);
    file_of("session-a", path, sizeof path);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    cr_assert_eq(st.st_size, KVP_TOKFILE_HEADER + 4 * 300);
    int *got = NULL, n = 0;
    uint64_t fp = 0;
    cr_assert_eq(kvp_tokfile_read(path, 512, &got, &n, &fp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, 300);
    cr_assert_eq(fp, 0x1234abcdULL);
    cr_assert_arr_eq(got, ids, sizeof ids);
    free(got);
    /* the next turn replaces it: one file per conversation */
    cr_assert_eq(kvp_learnlog_write(&c, "", "session-a", ids, 200, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count_files(), 1);
    cr_assert_eq(kvp_tokfile_read(path, 512, &got, &n, &fp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, 200);
    free(got);
    /* the file never names the session */
    FILE *f = fopen(path, "rb");
    char buf[4096];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_null(memmem(buf, len, "session-a", 9));
    remove_dir();
}

static void expect_damaged(const char *path, int vocab, const char *what)
{
    int *got = NULL, n = 0;
    uint64_t fp;
    char err[256] = "";
    cr_assert_eq(kvp_tokfile_read(path, vocab, &got, &n, &fp, err, sizeof err), -EBADMSG,
                 "%s was not refused", what);
    cr_assert(strstr(err, path), "the message names the file: %s", err);
    cr_assert_null(got);
}

Test(learnlog, damaged_files_are_refused_with_a_message)
{
    make_dir();
    kvp_learnlog_cfg c = cfg();
    int ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = i;
    char err[256], path[512];
    cr_assert_eq(kvp_learnlog_write(&c, "", "s", ids, 64, err, sizeof err), 0, "%s", err);
    file_of("s", path, sizeof path);
    FILE *f = fopen(path, "rb");
    unsigned char good[KVP_TOKFILE_HEADER + 4 * 64];
    cr_assert_eq(fread(good, 1, sizeof good, f), sizeof good);
    fclose(f);
    unsigned char bad[sizeof good];
    /* a flipped bit in a token */
    memcpy(bad, good, sizeof bad);
    bad[KVP_TOKFILE_HEADER + 4 * 10] ^= 0x01;
    f = fopen(path, "wb");
    fwrite(bad, 1, sizeof bad, f);
    fclose(f);
    expect_damaged(path, 512, "a flipped byte");
    /* cut short */
    f = fopen(path, "wb");
    fwrite(good, 1, sizeof good - 7, f);
    fclose(f);
    expect_damaged(path, 512, "a truncated file");
    /* only part of the header */
    f = fopen(path, "wb");
    fwrite(good, 1, 12, f);
    fclose(f);
    expect_damaged(path, 512, "a truncated header");
    /* another magic */
    memcpy(bad, good, sizeof bad);
    bad[0] = 'X';
    f = fopen(path, "wb");
    fwrite(bad, 1, sizeof bad, f);
    fclose(f);
    expect_damaged(path, 512, "a bad magic");
    /* ids past a smaller vocabulary (the checksum is right) */
    f = fopen(path, "wb");
    fwrite(good, 1, sizeof good, f);
    fclose(f);
    expect_damaged(path, 32, "ids outside the vocabulary");
    /* a count announcing a huge file */
    memcpy(bad, good, sizeof bad);
    bad[16] = 0xff, bad[17] = 0xff, bad[18] = 0xff, bad[19] = 0x7f;
    f = fopen(path, "wb");
    fwrite(bad, 1, sizeof bad, f);
    fclose(f);
    expect_damaged(path, 512, "a hostile count");
    /* the intact file still reads */
    f = fopen(path, "wb");
    fwrite(good, 1, sizeof good, f);
    fclose(f);
    int *got = NULL, n;
    uint64_t fp;
    cr_assert_eq(kvp_tokfile_read(path, 512, &got, &n, &fp, err, sizeof err), 0, "%s", err);
    free(got);
    remove_dir();
}

static void age_file(const char *id, double days)
{
    char path[512];
    file_of(id, path, sizeof path);
    struct timeval tv[2];
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= (time_t)(days * 86400);
    tv[1] = tv[0];
    cr_assert_eq(utimes(path, tv), 0);
}

static int exists(const char *id)
{
    char path[512];
    file_of(id, path, sizeof path);
    return access(path, F_OK) == 0;
}

Test(learnlog, the_caps_drop_old_files_then_the_oldest_past_the_size)
{
    make_dir();
    kvp_learnlog_cfg c = cfg();
    int ids[100] = {0};
    char err[256], id[16];
    size_t one = KVP_TOKFILE_HEADER + 4 * 100;
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof id, "s%d", i);
        cr_assert_eq(kvp_learnlog_write(&c, "", id, ids, 100, err, sizeof err), 0, "%s", err);
        age_file(id, 10 - i);   /* s0 is the oldest */
    }
    cr_assert_eq(count_files(), 5);
    /* the size cap: room for three files, the oldest go */
    c.max_bytes = 3 * one + one / 2;
    cr_assert_eq(kvp_learnlog_write(&c, "", "s5", ids, 100, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count_files(), 3);
    cr_assert(!exists("s0") && !exists("s1") && !exists("s2"));
    cr_assert(exists("s3") && exists("s4") && exists("s5"));
    /* the age cap: s3 is 7 days old, s4 6 */
    c.max_bytes = 0;
    c.max_age_s = 6.5 * 86400;
    cr_assert_eq(kvp_learnlog_write(&c, "", "s6", ids, 100, err, sizeof err), 0, "%s", err);
    cr_assert(!exists("s3"));
    cr_assert(exists("s4") && exists("s5") && exists("s6"));
    remove_dir();
}

Test(learnlog, the_sampled_share_follows_the_rate_and_is_stable)
{
    make_dir();
    kvp_learnlog_cfg c = cfg();
    c.rate = 0.25;
    int kept = 0;
    char id[40];
    for (int i = 0; i < 4000; i++) {
        snprintf(id, sizeof id, "%032x", i * 2654435761u);
        int k = kvp_learnlog_sampled(&c, id);
        cr_assert_eq(k, kvp_learnlog_sampled(&c, id));
        kept += k;
    }
    cr_assert(kept > 850 && kept < 1150, "%d of 4000 kept at rate 0.25", kept);
    c.rate = 0.0;
    cr_assert_eq(kvp_learnlog_sampled(&c, "x"), 0);
    c.rate = 1.0;
    c.dir = "";
    cr_assert_eq(kvp_learnlog_sampled(&c, "x"), 0, "no learn_dir keeps nothing");
    remove_dir();
}

#define TA "00000000000000aa"
#define TB "00000000000000bb"

static int exists_in(const char *tenant, const char *id)
{
    char path[512];
    file_in(tenant, id, path, sizeof path);
    return access(path, F_OK) == 0;
}

Test(learnlog, each_tenant_has_a_folder_of_its_own)
{
    make_dir();
    kvp_learnlog_cfg c = cfg();
    int ids[16] = {0};
    char err[256], path[512];
    cr_assert_eq(kvp_learnlog_write(&c, TA, "a1", ids, 16, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_learnlog_write(&c, TB, "b1", ids, 16, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_learnlog_write(&c, "", "d1", ids, 16, err, sizeof err), 0, "%s", err);
    cr_assert(exists_in(TA, "a1") && exists_in(TB, "b1") && exists_in("", "d1"));
    cr_assert(!exists_in(TB, "a1") && !exists_in(TA, "b1"));
    snprintf(path, sizeof path, "%s/%s", dir, TA);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700, "a tenant's folder is 0700");
    /* a name that is no tenant's never becomes a path */
    static const char *const bad[] = {"../x", "a/b", "AB", ".", "x y"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        cr_assert_eq(kvp_learnlog_write(&c, bad[i], "z", ids, 16, err, sizeof err), -EINVAL,
                     "tenant '%s' was taken", bad[i]);
        cr_assert(strstr(err, "tenant"), "%s", err);
    }
    cr_assert_eq(count_files(), 3);
    remove_dir();
}

Test(learnlog, a_tenants_transcripts_are_deleted_and_no_others)
{
    make_dir();
    kvp_learnlog_cfg c = cfg();
    int ids[16] = {0};
    char err[256], path[512];
    cr_assert_eq(kvp_learnlog_write(&c, TA, "a1", ids, 16, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_learnlog_write(&c, TA, "a2", ids, 16, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_learnlog_write(&c, TB, "b1", ids, 16, err, sizeof err), 0, "%s", err);
    int deleted = -1;
    cr_assert_eq(kvp_learnlog_forget(&c, TA, &deleted, err, sizeof err), 0, "%s", err);
    cr_assert_eq(deleted, 2);
    snprintf(path, sizeof path, "%s/%s", dir, TA);
    cr_assert_neq(access(path, F_OK), 0, "the tenant's folder is left");
    cr_assert(exists_in(TB, "b1"), "another tenant's transcript went");
    /* nothing left to delete: no folder */
    cr_assert_eq(kvp_learnlog_forget(&c, TA, &deleted, err, sizeof err), -ENOENT);
    cr_assert_eq(deleted, 0);
    cr_assert_eq(kvp_learnlog_forget(&c, "../" TB, &deleted, err, sizeof err), -EINVAL);
    cr_assert(exists_in(TB, "b1"));
    /* the folder comes back with the tenant's next transcript */
    cr_assert_eq(kvp_learnlog_write(&c, TA, "a3", ids, 16, err, sizeof err), 0, "%s", err);
    cr_assert(exists_in(TA, "a3"));
    remove_dir();
}

Test(learnlog, the_caps_count_every_tenants_folder_and_old_flat_files)
{
    make_dir();
    kvp_learnlog_cfg c = cfg();
    int ids[100] = {0};
    char err[256], path[512];
    size_t one = KVP_TOKFILE_HEADER + 4 * 100;
    /* a file of the flat layout, the oldest of all */
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, "old", 3);
    snprintf(path, sizeof path, "%s/%016llx%s", dir, (unsigned long long)h, KVP_LEARNLOG_EXT);
    size_t bytes;
    unsigned char *buf = kvp_tokfile_encode(ids, 100, c.fingerprint, &bytes);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(buf, 1, bytes, f) == bytes && fclose(f) == 0);
    free(buf);
    struct timeval tv[2];
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= 20 * 86400;
    tv[1] = tv[0];
    cr_assert_eq(utimes(path, tv), 0);
    cr_assert_eq(kvp_learnlog_write(&c, TA, "a1", ids, 100, err, sizeof err), 0, "%s", err);
    char p2[512];
    file_in(TA, "a1", p2, sizeof p2);
    tv[0].tv_sec += 5 * 86400;
    tv[1] = tv[0];
    cr_assert_eq(utimes(p2, tv), 0);
    /* room for two: the oldest, wherever it is, goes first */
    c.max_bytes = 2 * one + one / 2;
    cr_assert_eq(kvp_learnlog_write(&c, TB, "b1", ids, 100, err, sizeof err), 0, "%s", err);
    cr_assert_neq(access(path, F_OK), 0, "the oldest (flat) file was kept");
    cr_assert(exists_in(TA, "a1") && exists_in(TB, "b1"));
    cr_assert_eq(kvp_learnlog_write(&c, TB, "b2", ids, 100, err, sizeof err), 0, "%s", err);
    cr_assert(!exists_in(TA, "a1") && exists_in(TB, "b1") && exists_in(TB, "b2"));
    remove_dir();
}

Test(learnlog, the_system_prompts_tokens_are_cut_where_they_are_found)
{
    /* BOS, the system prompt (50 51 52), the first message's (7 8 9), then the reply */
    const int with[] = {1, 50, 51, 52, 7, 8, 9}, without[] = {1, 7, 8, 9};
    int t[] = {1, 50, 51, 52, 7, 8, 9, 20, 21};
    int n = kvp_learnlog_strip_system(t, 9, with, 7, without, 4);
    cr_assert_eq(n, 6);
    const int want[] = {1, 7, 8, 9, 20, 21};
    cr_assert_arr_eq(t, want, sizeof want);
    /* a template with a default system prompt of its own (60 61) when none is given */
    const int dflt[] = {1, 60, 61, 7, 8, 9};
    int t2[] = {1, 50, 51, 52, 7, 8, 9, 20};
    n = kvp_learnlog_strip_system(t2, 8, with, 7, dflt, 6);
    cr_assert_eq(n, 5);
    const int want2[] = {1, 7, 8, 9, 20};
    cr_assert_arr_eq(t2, want2, sizeof want2);
    /* the transcript does not begin with the rendering: nothing is cut, it is refused */
    int t3[] = {1, 50, 99, 52, 7, 8, 9, 20};
    cr_assert_eq(kvp_learnlog_strip_system(t3, 8, with, 7, without, 4), -ENOENT);
    /* a template that does not render system prompts: nothing to cut */
    int t4[] = {1, 7, 8, 9, 20};
    cr_assert_eq(kvp_learnlog_strip_system(t4, 5, without, 4, without, 4), 5);
    const int want4[] = {1, 7, 8, 9, 20};
    cr_assert_arr_eq(t4, want4, sizeof want4);
    /* renderings that differ only where the transcript does not match */
    const int other[] = {1, 50, 51, 52, 7, 8, 9, 5};
    int t6[] = {1, 7, 8, 9, 20};
    cr_assert_eq(kvp_learnlog_strip_system(t6, 5, other, 8, without, 4), -ENOENT);
    /* a transcript shorter than the rendering */
    int t5[] = {1, 50, 51};
    cr_assert_eq(kvp_learnlog_strip_system(t5, 3, with, 7, without, 4), -ENOENT);
}
