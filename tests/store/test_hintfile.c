/* store/hintfile.c: the hint file's machinery with lines of its own ("<key> <value>"):
 * appends read back in order, hostile bytes (a torn last line, an oversized line, NUL
 * bytes, lines the user refuses) skipped and counted, a directory or a link in the file's
 * place and a missing directory refused with a message, the rewrite through a temporary
 * file, and the compaction rule (past compact_min and twice the compacted size). */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/hintfile.h"
#include "tests/testdir.h"

KVP_TEST_DIR_SUITE(hintfile, dir, "hint");

#define LINE_MAX_T 32
#define MIN_T 256

static int g_compactions;
static int g_keep_all;   /* a compaction that keeps every line (the file does not shrink) */
static int compact_t(const char *d, char *err, size_t errlen);
static kvp_hintfile g_file = KVP_HINTFILE_INIT("test.hints", "test hints", LINE_MAX_T, MIN_T,
                                               compact_t);

/* The lines read: "<key> <value>", both at most 15 bytes, no other spaces. */
typedef struct lines {
    char v[64][LINE_MAX_T + 1];
    int n;
} lines;

static int take(void *ctx, const char *line, size_t len)
{
    lines *l = ctx;
    const char *sp = memchr(line, ' ', len);
    if (!sp || sp == line || sp + 1 == line + len || memchr(sp + 1, ' ', len - (size_t)(sp - line) - 1))
        return KVP_HINTFILE_DAMAGED;
    if (l->n == 64)
        return -ENOSPC;
    memcpy(l->v[l->n], line, len);
    l->v[l->n++][len] = '\0';
    return 0;
}

static int put_all(void *ctx, kvp_hintfile_out *out)
{
    const lines *l = ctx;
    char buf[LINE_MAX_T + 2];
    for (int i = 0; i < l->n; i++) {
        int n = snprintf(buf, sizeof buf, "%s\n", l->v[i]);
        if (kvp_hintfile_put(out, buf, (size_t)n) < 0)
            return out->rc;
    }
    return 0;
}

/* Keeps the last line of each key (or every line, with g_keep_all). */
static int compact_t(const char *d, char *err, size_t errlen)
{
    static lines l;
    int damaged = 0, rc;
    g_compactions++;
    memset(&l, 0, sizeof l);
    if ((rc = kvp_hintfile_read(&g_file, d, take, &l, &damaged, err, errlen)) < 0)
        return rc;
    if (!g_keep_all) {
        int out = 0;
        for (int i = 0; i < l.n; i++) {
            size_t k = strcspn(l.v[i], " ") + 1;
            int later = 0;
            for (int j = i + 1; j < l.n && !later; j++)
                later = !strncmp(l.v[i], l.v[j], k);
            if (!later)
                memmove(l.v[out++], l.v[i], sizeof l.v[i]);
        }
        l.n = out;
    }
    return kvp_hintfile_rewrite(&g_file, d, put_all, &l, err, errlen);
}

static char *path_of(const char *suffix)
{
    static char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/test.hints%s", dir, suffix);
    return p;
}

static void append_raw(const void *bytes, size_t n)
{
    FILE *f = fopen(path_of(""), "ab");
    cr_assert(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

static off_t file_size(void)
{
    struct stat st;
    cr_assert_eq(stat(path_of(""), &st), 0);
    return st.st_size;
}

static void append(const char *line)
{
    char err[256] = "";
    cr_assert_eq(kvp_hintfile_append(&g_file, dir, line, strlen(line), err, sizeof err), 0,
                 "%s", err);
}

Test(hintfile, appends_are_read_back_in_order_and_a_missing_file_is_empty)
{
    lines l = {0};
    char err[256] = "";
    int damaged = 0;
    cr_assert_eq(kvp_hintfile_read(&g_file, dir, take, &l, &damaged, err, sizeof err), 0);
    cr_assert_eq(l.n, 0);
    cr_assert_str_eq(err, "", "a missing file is not worth a message");
    append("a 1\n");
    append("b 2\n");
    append("a 3\n");
    cr_assert_eq(kvp_hintfile_read(&g_file, dir, take, &l, &damaged, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(l.n, 3);
    cr_assert_str_eq(l.v[0], "a 1");
    cr_assert_str_eq(l.v[2], "a 3");
    cr_assert_eq(damaged, 0);
}

Test(hintfile, hostile_lines_are_skipped_and_counted)
{
    append("good 1\n");
    static const char junk[] = "no-space\n"        /* refused by the user */
                               "\n"                /* empty: refused by the user */
                               "nul \0byte\n"      /* a NUL byte: skipped by the reader */
                               "\0\0\0\n";
    append_raw(junk, sizeof junk - 1);
    char big[LINE_MAX_T * 4 + 1];
    memset(big, 'x', sizeof big - 1);
    big[LINE_MAX_T] = ' ';
    big[sizeof big - 1] = '\n';
    append_raw(big, sizeof big);   /* oversized: skipped unread */
    append("also 2\n");
    append_raw("exactly", 7);   /* the torn last line */
    lines l = {0};
    char err[256] = "";
    int damaged = 0;
    cr_assert_eq(kvp_hintfile_read(&g_file, dir, take, &l, &damaged, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(damaged, 6);
    cr_assert_eq(l.n, 2);
    cr_assert_str_eq(l.v[0], "good 1");
    cr_assert_str_eq(l.v[1], "also 2", "the line after an oversized one is read");
}

Test(hintfile, a_line_of_exactly_line_max_is_read)
{
    char line[LINE_MAX_T + 2];
    memset(line, 'k', LINE_MAX_T);
    line[3] = ' ';
    line[LINE_MAX_T] = '\n';
    line[LINE_MAX_T + 1] = '\0';
    append(line);
    lines l = {0};
    char err[256] = "";
    int damaged = 0;
    cr_assert_eq(kvp_hintfile_read(&g_file, dir, take, &l, &damaged, err, sizeof err), 0);
    cr_assert_eq(l.n, 1);
    cr_assert_eq(strlen(l.v[0]), LINE_MAX_T);
    cr_assert_eq(damaged, 0);
}

Test(hintfile, a_callback_error_stops_the_read_with_a_message)
{
    for (int i = 0; i < 70; i++)
        append_raw("k v\n", 4);
    lines l = {0};
    char err[256] = "";
    int damaged = 0;
    cr_assert_eq(kvp_hintfile_read(&g_file, dir, take, &l, &damaged, err, sizeof err), -ENOSPC);
    cr_assert(strstr(err, "reading ") && strstr(err, "test.hints"), "%s", err);
}

Test(hintfile, a_rewrite_replaces_the_file_and_leaves_no_temporary)
{
    append("a 1\n");
    append("a 2\n");
    lines l = {.n = 1};
    snprintf(l.v[0], sizeof l.v[0], "z 9");
    char err[256] = "";
    cr_assert_eq(kvp_hintfile_rewrite(&g_file, dir, put_all, &l, err, sizeof err), 0, "%s", err);
    cr_assert_eq(file_size(), 4);
    struct stat st;
    cr_assert_neq(stat(path_of(".tmp"), &st), 0);
    lines back = {0};
    int damaged = 0;
    cr_assert_eq(kvp_hintfile_read(&g_file, dir, take, &back, &damaged, err, sizeof err), 0);
    cr_assert_eq(back.n, 1);
    cr_assert_str_eq(back.v[0], "z 9");
}

Test(hintfile, a_directory_or_a_link_in_the_files_place_is_refused)
{
    char err[256] = "";
    lines l = {0};
    int damaged = 0;
    cr_assert_eq(mkdir(path_of(""), 0700), 0);
    cr_assert_lt(kvp_hintfile_read(&g_file, dir, take, &l, &damaged, err, sizeof err), 0);
    cr_assert(strstr(err, "test.hints"), "%s", err);
    err[0] = '\0';
    cr_assert_lt(kvp_hintfile_append(&g_file, dir, "a 1\n", 4, err, sizeof err), 0);
    cr_assert_neq(err[0], '\0');
    err[0] = '\0';
    cr_assert_lt(kvp_hintfile_rewrite(&g_file, dir, put_all, &l, err, sizeof err), 0);
    cr_assert_neq(err[0], '\0');
    struct stat st;
    cr_assert_neq(stat(path_of(".tmp"), &st), 0, "a failed rewrite left its temporary file");
    cr_assert_eq(rmdir(path_of("")), 0);

    cr_assert_eq(symlink("/etc/passwd", path_of("")), 0);
    cr_assert_lt(kvp_hintfile_read(&g_file, dir, take, &l, &damaged, err, sizeof err), 0);
    cr_assert_lt(kvp_hintfile_append(&g_file, dir, "a 1\n", 4, err, sizeof err), 0);
    cr_assert_eq(l.n, 0);
}

Test(hintfile, a_missing_directory_reads_empty_and_refuses_writes)
{
    char missing[PATH_MAX], err[256] = "";
    snprintf(missing, sizeof missing, "%s/not/there", dir);
    lines l = {0};
    int damaged = 0;
    cr_assert_eq(kvp_hintfile_read(&g_file, missing, take, &l, &damaged, err, sizeof err), 0);
    cr_assert_eq(l.n, 0);
    cr_assert_lt(kvp_hintfile_append(&g_file, missing, "a 1\n", 4, err, sizeof err), 0);
    cr_assert(strstr(err, "not/there"), "%s", err);
    err[0] = '\0';
    cr_assert_lt(kvp_hintfile_rewrite(&g_file, missing, put_all, &l, err, sizeof err), 0);
    cr_assert_neq(err[0], '\0');
}

Test(hintfile, a_path_too_long_is_refused)
{
    char longdir[PATH_MAX + 16], path[PATH_MAX], err[256] = "";
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[sizeof longdir - 1] = '\0';
    cr_assert_eq(kvp_hintfile_path(&g_file, longdir, "", path, sizeof path, err, sizeof err),
                 -ENAMETOOLONG);
    cr_assert(strstr(err, "test hints path too long"), "%s", err);
    cr_assert_eq(kvp_hintfile_path(&g_file, "/s", ".tmp", path, sizeof path, err, sizeof err), 0);
    cr_assert_str_eq(path, "/s/test.hints.tmp");
}

/* Lines of 8 bytes over two keys: no compaction below MIN_T; the first at the append that
 * reaches it, down to a line per key; none again until the file is past MIN_T again. */
Test(hintfile, appends_compact_past_the_minimum_and_twice_the_compacted_size)
{
    g_compactions = 0;
    g_keep_all = 0;
    int appended = 0;
    while (g_compactions == 0) {
        append(appended % 2 ? "key1 42\n" : "key0 42\n");
        appended++;
        cr_assert_leq(appended, MIN_T / 8, "no compaction at %lld bytes", (long long)file_size());
    }
    cr_assert_eq(appended, MIN_T / 8, "compacted at %d lines", appended);
    cr_assert_eq(file_size(), 16, "one line per key after the compaction");
    for (int i = 0; i < MIN_T / 8 - 3; i++)
        append("key2 42\n");
    cr_assert_eq(g_compactions, 1, "compacted again below the minimum");
    append("key2 42\n");
    cr_assert_eq(g_compactions, 2);
    cr_assert_eq(file_size(), 24);
}

/* A compaction that cannot shrink the file: the next one waits until it has doubled. */
Test(hintfile, a_file_that_does_not_shrink_waits_until_it_doubles)
{
    g_compactions = 0;
    g_keep_all = 1;
    for (int i = 0; i < MIN_T / 8; i++)
        append("kkkk 42\n");
    cr_assert_eq(g_compactions, 1);
    cr_assert_eq(file_size(), MIN_T);
    for (int i = 0; i < MIN_T / 8 - 1; i++)
        append("kkkk 42\n");
    cr_assert_eq(g_compactions, 1, "compacted before the file doubled");
    append("kkkk 42\n");
    cr_assert_eq(g_compactions, 2);
    g_keep_all = 0;
}
