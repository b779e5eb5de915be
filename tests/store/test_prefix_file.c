/* store/prefix_file.c: the prefix index's conversations on disk. Lines formatted and
 * parsed back, hostile lines refused (bad fields, a wrong check, too many blocks, NUL
 * bytes), the file read with the last line of an id winning, lines of no blocks and of
 * conversations without a snapshot dropped, damaged, torn and oversized lines skipped and
 * counted, the file compacted; appends; and a rebuilt index that finds a prefix. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/prefix_file.h"
#include "tests/testdir.h"

KVP_TEST_DIR_SUITE(prefix_file, dir, "pfx");

static void touch(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fclose(f);
}

static void append_raw(const void *bytes, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/" KVP_PREFIX_FILE, dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

static off_t file_size(void)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof path, "%s/" KVP_PREFIX_FILE, dir);
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* tokens 0..n) of a conversation that starts with `start` */
static void tokens_of(int *t, int n, int start)
{
    for (int i = 0; i < n; i++)
        t[i] = start + i % 7;
}

static const kvp_prefix_rec *find(const kvp_prefix_recs *x, const char *id)
{
    for (int i = 0; i < x->n; i++)
        if (!strcmp(x->v[i].id, id))
            return &x->v[i];
    return NULL;
}

Test(prefix_file, a_line_formats_and_parses_back)
{
    uint64_t chain[3] = {1, 0xffffffffffffffffULL, 0x0123456789abcdefULL};
    char line[KVP_PREFIX_FILE_LINE_MAX + 1];
    int n = kvp_prefix_line_format(line, sizeof line, "abc", "00ff00ff00ff00ff", chain, 3);
    cr_assert_gt(n, 0);
    cr_assert_eq(line[n - 1], '\n');
    kvp_prefix_rec r;
    cr_assert_eq(kvp_prefix_line_parse(line, (size_t)n - 1, &r), 0, "%s", line);
    cr_assert_str_eq(r.id, "abc");
    cr_assert_str_eq(r.tenant, "00ff00ff00ff00ff");
    cr_assert_eq(r.n, 3);
    cr_assert_eq(memcmp(r.chain, chain, sizeof chain), 0);
    free(r.chain);
    /* the default tenant and no blocks */
    n = kvp_prefix_line_format(line, sizeof line, "abc", "", NULL, 0);
    cr_assert_gt(n, 0);
    cr_assert_eq(kvp_prefix_line_parse(line, (size_t)n - 1, &r), 0, "%s", line);
    cr_assert_str_eq(r.tenant, "");
    cr_assert_eq(r.n, 0);
    cr_assert_null(r.chain);
    /* what cannot be written */
    cr_assert_eq(kvp_prefix_line_format(line, sizeof line, "a/b", "", chain, 1), -1);
    cr_assert_eq(kvp_prefix_line_format(line, sizeof line, "abc", "-", chain, 1), -1);
    cr_assert_eq(kvp_prefix_line_format(line, sizeof line, "abc", "", chain,
                                        KVP_PREFIX_MAX_PER + 1), -1);
    cr_assert_eq(kvp_prefix_line_format(line, 40, "abc", "", chain, 3), -1);
}

Test(prefix_file, hostile_lines_are_refused)
{
    uint64_t chain[2] = {5, 6};
    char good[256];
    int n = kvp_prefix_line_format(good, sizeof good, "abc", "", chain, 2);
    cr_assert_gt(n, 0);
    good[n - 1] = '\0';
    const char *bad[] = {
        "", " ", "abc", "abc -", "abc - 2", "abc - 2 0000",
        "../x - 0 0000000000000000",                 /* not a snapshot id */
        "abc ZZ 0 0000000000000000",                 /* not a tenant */
        "abc - 99999 0000000000000000",              /* too many blocks */
        "abc - -1 0000000000000000",
        "abc - 1 0000000000000000 0000000000000005", /* a wrong check */
    };
    kvp_prefix_rec r;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(kvp_prefix_line_parse(bad[i], strlen(bad[i]), &r), -1, "%s", bad[i]);
    /* the good line changed by one byte anywhere, cut anywhere, or with a NUL in it */
    size_t len = strlen(good);
    for (size_t i = 0; i < len; i++) {
        char l[256];
        memcpy(l, good, len);
        l[i] = l[i] == '1' ? '2' : '1';
        cr_assert_eq(kvp_prefix_line_parse(l, len, &r), -1, "changed at %zu: %.*s", i, (int)len, l);
        cr_assert_eq(kvp_prefix_line_parse(good, i, &r), -1, "cut at %zu", i);
        l[i] = '\0';
        cr_assert_eq(kvp_prefix_line_parse(l, len, &r), -1, "NUL at %zu", i);
    }
    char more[300];
    snprintf(more, sizeof more, "%s 0000000000000007", good);   /* a block too many */
    cr_assert_eq(kvp_prefix_line_parse(more, strlen(more), &r), -1);
    cr_assert_eq(kvp_prefix_line_parse(good, len, &r), 0);
    free(r.chain);
}

Test(prefix_file, load_keeps_the_last_line_per_id_with_a_snapshot_and_compacts)
{
    int t[64];
    uint64_t c[4];
    char err[256];
    touch("a.snap");
    touch("b.snap");
    touch("d.snap");
    tokens_of(t, 64, 10);
    int n = kvp_prefix_chain("", t, 64, c, 4);
    cr_assert_eq(n, 4);
    cr_assert_eq(kvp_prefix_file_append(dir, "a", "", c, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_prefix_file_append(dir, "a", "", c, 4, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_prefix_file_append(dir, "b", "", c, 3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_prefix_file_append(dir, "b", "", NULL, 0, err, sizeof err), 0);   /* retired */
    cr_assert_eq(kvp_prefix_file_append(dir, "c", "", c, 1, err, sizeof err), 0);   /* no snapshot */
    cr_assert_eq(kvp_prefix_file_append(dir, "d", "0000000000000001", c, 1, err, sizeof err), 0);
    kvp_prefix_recs x = {0};
    cr_assert_eq(kvp_prefix_file_load(&x, dir, err, sizeof err), 2, "%s", err);
    cr_assert_str_eq(err, "");
    const kvp_prefix_rec *a = find(&x, "a"), *d = find(&x, "d");
    cr_assert(a && d);
    cr_assert_eq(a->n, 4);
    cr_assert_eq(memcmp(a->chain, c, sizeof c), 0);
    cr_assert_str_eq(d->tenant, "0000000000000001");
    kvp_prefix_recs_free(&x);
    /* rewritten with those two lines only: read again, the same */
    off_t size = file_size();
    cr_assert_eq(kvp_prefix_file_load(&x, dir, err, sizeof err), 2);
    cr_assert_eq(file_size(), size);
    kvp_prefix_recs_free(&x);
}

Test(prefix_file, damaged_torn_and_oversized_lines_are_skipped_and_counted)
{
    int t[48];
    uint64_t c[3];
    char err[256];
    touch("good.snap");
    tokens_of(t, 48, 3);
    kvp_prefix_chain("", t, 48, c, 3);
    static const char junk[] = "garbage\n\n\0\0\0\n"
                               "good - 3 0123456789abcdef 1 2 3\n";
    append_raw(junk, sizeof junk - 1);   /* 4 lines: garbage, empty, NULs, a bad check */
    size_t huge = KVP_PREFIX_FILE_LINE_MAX + 4096;
    char *big = malloc(huge + 1);
    cr_assert(big);
    memset(big, '7', huge);
    big[huge] = '\n';
    append_raw(big, huge + 1);   /* too long: skipped unread */
    free(big);
    cr_assert_eq(kvp_prefix_file_append(dir, "good", "", c, 3, err, sizeof err), 0, "%s", err);
    append_raw("good - 3 01234", 14);   /* torn: the file's last line, no newline */
    kvp_prefix_recs x = {0};
    cr_assert_eq(kvp_prefix_file_load(&x, dir, err, sizeof err), 1, "%s", err);
    cr_assert(strstr(err, "6 damaged or oversized line(s) skipped"), "%s", err);
    cr_assert_eq(x.v[0].n, 3);
    cr_assert_eq(memcmp(x.v[0].chain, c, sizeof c), 0);
    kvp_prefix_recs_free(&x);
    cr_assert_lt(file_size(), 200);
    /* a directory in the file's place is an error with a message, not a crash */
    char path[256];
    snprintf(path, sizeof path, "%s/" KVP_PREFIX_FILE, dir);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_assert_lt(kvp_prefix_file_load(&x, dir, err, sizeof err), 0);
    cr_assert_neq(err[0], '\0');
    kvp_prefix_recs_free(&x);
    cr_assert_lt(kvp_prefix_file_append(dir, "good", "", c, 3, err, sizeof err), 0);
    rmdir(path);
}

Test(prefix_file, appends_compact_the_file_once_it_has_grown)
{
    int t[KVP_PREFIX_BLOCK * 64];
    uint64_t c[64];
    char err[256];
    touch("s.snap");
    tokens_of(t, KVP_PREFIX_BLOCK * 64, 1);
    kvp_prefix_chain("", t, KVP_PREFIX_BLOCK * 64, c, 64);
    /* one conversation saved over and over: its lines pile up past the threshold */
    for (int i = 0; i < 2 * KVP_PREFIX_FILE_COMPACT_MIN / (64 * 17) + 8; i++)
        cr_assert_eq(kvp_prefix_file_append(dir, "s", "", c, 64, err, sizeof err), 0, "%s", err);
    cr_assert_lt(file_size(), KVP_PREFIX_FILE_COMPACT_MIN + 2 * 64 * 17,
                 "not compacted: %lld bytes", (long long)file_size());
    kvp_prefix_recs x = {0};
    cr_assert_eq(kvp_prefix_file_load(&x, dir, err, sizeof err), 1);
    kvp_prefix_recs_free(&x);
}

Test(prefix_file, a_rebuilt_index_finds_the_prefix_for_its_tenant_only)
{
    int t[100], q[100];
    uint64_t c[6];
    char err[256];
    touch("s.snap");
    tokens_of(t, 100, 40);
    cr_assert_eq(kvp_prefix_chain("00000000000000aa", t, 100, c, 6), 6);
    cr_assert_eq(kvp_prefix_file_append(dir, "s", "00000000000000aa", c, 6, err, sizeof err), 0);
    kvp_prefix_recs x = {0};
    cr_assert_eq(kvp_prefix_file_load(&x, dir, err, sizeof err), 1);
    kvp_prefix_index *ix = kvp_prefix_create(0, 0);
    cr_assert(ix);
    static int owner;
    cr_assert_eq(kvp_prefix_put_chain(ix, &owner, x.v[0].tenant, x.v[0].chain, x.v[0].n), 0);
    kvp_prefix_recs_free(&x);
    /* the same 50 tokens, then another turn */
    memcpy(q, t, 50 * sizeof *q);
    for (int i = 50; i < 100; i++)
        q[i] = 999;
    int len;
    cr_assert_eq(kvp_prefix_lookup(ix, "00000000000000aa", q, 100, NULL, NULL, &len), &owner);
    cr_assert_eq(len, 48);
    cr_assert_null(kvp_prefix_lookup(ix, "00000000000000bb", q, 100, NULL, NULL, &len));
    cr_assert_eq(len, 0);
    cr_assert_null(kvp_prefix_lookup(ix, "", t, 100, NULL, NULL, &len));
    kvp_prefix_free(ix);
}
