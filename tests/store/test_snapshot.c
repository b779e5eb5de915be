#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "cache/kvcache.h"
#include "store/snapshot.h"

/* ---- helpers ---- */

static char g_dir[64];

static void make_dir(void)
{
    strcpy(g_dir, "/tmp/kvp_snap_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    DIR *d = opendir(g_dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(g_dir);
}

TestSuite(snapshot, .init = make_dir, .fini = remove_dir);

static const char *path_of(const char *name)
{
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static int file_exists(const char *name)
{
    struct stat st;
    return lstat(path_of(name), &st) == 0;
}

static int dir_entries(void)
{
    DIR *d = opendir(g_dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* Counts the files "<id>.snap.bad-*" and deletes them. */
static int take_bad_files(const char *id)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s.snap.bad-", id);
    DIR *d = opendir(g_dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            n++;
            cr_assert_eq(unlinkat(dirfd(d), e->d_name, 0), 0);
        }
    closedir(d);
    return n;
}

static unsigned char *slurp(const char *name, size_t *len)
{
    FILE *f = fopen(path_of(name), "rb");
    cr_assert_not_null(f, "open %s", name);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void spit(const char *name, const void *buf, size_t len)
{
    FILE *f = fopen(path_of(name), "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* A cache with rows derived from (head, seq), serialized. */
static void make_cache(kvp_cache *c, int layers, int heads, int dim, int rows)
{
    cr_assert_eq(kvp_cache_init(c, layers, heads, dim, &(kvp_rope){.n_rot = dim, .base = 10000.0f}), 0);
    for (int i = 0; i < layers * heads; i++) {
        kvp_head *h = &c->heads[i];
        int n = rows + i % 3;   /* heads differ in length, as after eviction */
        cr_assert_eq(kvp_head_reserve(h, dim, n), 0);
        for (int r = 0; r < n; r++) {
            for (int d = 0; d < dim; d++) {
                ((float *)h->k)[(size_t)r * dim + d] = (float)(i * 1000 + r * 10 + d) * 0.5f;
                ((float *)h->v)[(size_t)r * dim + d] = (float)-(i * 1000 + r * 10 + d);
            }
            h->pos[r] = r;
            h->seq[r] = r * 2;
            h->score[r] = (float)r / 3;
            h->stat[r] = (float)i;
        }
        h->n = n;
    }
    c->next_pos = rows;
    c->n_seen = rows * 2;
    c->evicted_rows = 77;
    c->shifts = 2;
}

static kvp_snapshot_msg g_msgs[4];
static int g_tokens[9] = {1, 42, 7, 0, 31999, 5, 6, 7, 8};

/* A snapshot borrowing static arrays and a freshly serialized cache (free s->cache). */
static void make_snapshot(kvp_snapshot *s, const char *id, int rows)
{
    static char nul_text[] = "with\0nul";
    g_msgs[0] = (kvp_snapshot_msg){1, "Hello there", 11, 0};
    g_msgs[1] = (kvp_snapshot_msg){0, "General Kenobi! \xe2\x9c\x93", 19, 3};
    g_msgs[2] = (kvp_snapshot_msg){1, "", 0, 5};
    g_msgs[3] = (kvp_snapshot_msg){0, nul_text, 8, 6};
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->ident.model_name, sizeof s->ident.model_name, "stories260K");
    s->ident.model_hash = 0x1122334455667788ull;
    snprintf(s->ident.policy_name, sizeof s->ident.policy_name, "h2o");
    s->ident.policy_hash = 0;
    s->budget = 64;
    s->turns = 2;
    s->evicted_rows = 1234567890123ull;
    s->created = 1700000000.25;
    s->last_active = 1700000123.5;
    s->msgs = g_msgs;
    s->n_msgs = 4;
    s->system = "You are terse. \xe2\x9c\x93";
    s->system_len = 18;
    s->tokens = g_tokens;
    s->n_tokens = 9;
    s->n_cached = 8;
    kvp_cache c;
    make_cache(&c, 2, 2, 4, rows);
    cr_assert_eq(kvp_cache_serialize(&c, &s->cache, &s->cache_len), 0);
    kvp_cache_free(&c);
}

static void write_ok(const kvp_snapshot *s)
{
    char err[512];
    int rc = kvp_snapshot_write(g_dir, s, err, sizeof err);
    cr_assert_eq(rc, 0, "write: %s", err);
}

/* Rewrites the trailer so that only the field under test is wrong. */
static void fix_checksum(unsigned char *buf, size_t len)
{
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, buf, len - 8);
    for (int i = 0; i < 8; i++)
        buf[len - 8 + i] = (unsigned char)(h >> (8 * i));
}

/* Reads id, expects -EBADMSG, a message naming `what` and the move aside. */
static void expect_bad(const char *id, const char *what, const char *ctx)
{
    char err[512], name[128];
    kvp_snapshot out;
    int rc = kvp_snapshot_read(g_dir, id, &out, err, sizeof err);
    cr_assert_eq(rc, -EBADMSG, "%s: rc %d (%s)", ctx, rc, err);
    if (what)
        cr_assert_not_null(strstr(err, what), "%s: message '%s' lacks '%s'", ctx, err, what);
    cr_assert_not_null(strstr(err, "moved aside to"), "%s: %s", ctx, err);
    cr_assert_null(out.msgs);
    cr_assert_null(out.tokens);
    cr_assert_null(out.cache);
    snprintf(name, sizeof name, "%s.snap", id);
    cr_assert(!file_exists(name), "%s: the bad file is still in place", ctx);
    cr_assert(!kvp_snapshot_exists(g_dir, id));
    cr_assert_eq(take_bad_files(id), 1, "%s: no .bad- file", ctx);
}

/* ---- tests ---- */

Test(snapshot, round_trip_is_exact)
{
    kvp_snapshot s;
    make_snapshot(&s, "sess-A_01", 17);
    cr_assert(!kvp_snapshot_exists(g_dir, s.id));
    write_ok(&s);
    cr_assert(kvp_snapshot_exists(g_dir, s.id));
    cr_assert(!file_exists("sess-A_01.snap.tmp"));

    char err[512];
    kvp_snapshot r;
    cr_assert_eq(kvp_snapshot_read(g_dir, s.id, &r, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(r.id, s.id);
    cr_expect_str_eq(r.ident.model_name, "stories260K");
    cr_expect_str_eq(r.ident.policy_name, "h2o");
    cr_expect_eq(r.ident.model_hash, s.ident.model_hash);
    cr_expect_eq(r.ident.policy_hash, 0);
    cr_expect(kvp_snapshot_identity_equal(&r.ident, &s.ident));
    cr_expect_eq(r.budget, 64);
    cr_expect_eq(r.turns, 2);
    cr_expect_eq(r.evicted_rows, s.evicted_rows);
    cr_expect_eq(r.created, s.created);
    cr_expect_eq(r.last_active, s.last_active);
    cr_assert_eq(r.system_len, s.system_len);
    cr_expect_eq(memcmp(r.system, s.system, s.system_len), 0);
    cr_expect_eq(r.system[r.system_len], 0);
    cr_assert_eq(r.n_msgs, 4);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(r.msgs[i].user, s.msgs[i].user);
        cr_assert_eq(r.msgs[i].len, s.msgs[i].len, "message %d", i);
        cr_expect_eq(memcmp(r.msgs[i].text, s.msgs[i].text, s.msgs[i].len), 0);
        cr_expect_eq(r.msgs[i].text[r.msgs[i].len], 0);
    }
    cr_assert_eq(r.n_tokens, 9);
    cr_expect_eq(r.n_cached, 8);
    cr_expect_eq(memcmp(r.tokens, g_tokens, sizeof g_tokens), 0);
    cr_assert_eq(r.cache_len, s.cache_len);
    cr_expect_eq(memcmp(r.cache, s.cache, s.cache_len), 0);

    /* The cache blob restores the exact cache. */
    kvp_cache want, got;
    make_cache(&want, 2, 2, 4, 17);
    cr_assert_eq(kvp_cache_deserialize(&got, r.cache, r.cache_len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(got.next_pos, want.next_pos);
    cr_expect_eq(got.n_seen, want.n_seen);
    cr_expect_eq(got.evicted_rows, want.evicted_rows);
    for (int i = 0; i < 4; i++) {
        kvp_head *a = &want.heads[i], *b = &got.heads[i];
        cr_assert_eq(a->n, b->n);
        cr_expect_eq(memcmp(a->k, b->k, (size_t)a->n * 4 * sizeof(float)), 0);
        cr_expect_eq(memcmp(a->v, b->v, (size_t)a->n * 4 * sizeof(float)), 0);
        cr_expect_eq(memcmp(a->seq, b->seq, (size_t)a->n * sizeof *a->seq), 0);
        cr_expect_eq(memcmp(a->score, b->score, (size_t)a->n * sizeof *a->score), 0);
    }
    kvp_cache_free(&want);
    kvp_cache_free(&got);
    kvp_snapshot_free(&r);
    cr_expect_null(r.cache);
    free(s.cache);
}

Test(snapshot, empty_transcript_round_trips)
{
    kvp_snapshot s;
    make_snapshot(&s, "x", 1);
    s.n_msgs = 0;
    s.msgs = NULL;
    s.n_tokens = s.n_cached = 0;
    s.tokens = NULL;
    write_ok(&s);
    char err[512];
    kvp_snapshot r;
    cr_assert_eq(kvp_snapshot_read(g_dir, "x", &r, err, sizeof err), 0, "%s", err);
    cr_expect_eq(r.n_msgs, 0);
    cr_expect_eq(r.n_tokens, 0);
    cr_expect_eq(r.cache_len, s.cache_len);
    kvp_snapshot_free(&r);
    free(s.cache);
}

Test(snapshot, rewrite_replaces_the_previous_snapshot)
{
    kvp_snapshot s;
    make_snapshot(&s, "turns", 3);
    write_ok(&s);
    s.turns = 3;
    s.n_cached = 9;
    write_ok(&s);
    char err[512];
    kvp_snapshot r;
    cr_assert_eq(kvp_snapshot_read(g_dir, "turns", &r, err, sizeof err), 0, "%s", err);
    cr_expect_eq(r.turns, 3);
    cr_expect_eq(r.n_cached, 9);
    cr_expect_eq(dir_entries(), 1);
    kvp_snapshot_free(&r);
    free(s.cache);
}

/* The offset of section `tag`'s header in a snapshot file. */
static size_t section_at(const unsigned char *b, size_t len, const char *tag)
{
    size_t off = 16;
    while (off + 16 <= len && memcmp(b + off, tag, 4)) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = n << 8 | b[off + 8 + i];
        off += 16 + (size_t)n;
    }
    cr_assert_leq(off + 16, len, "no section %s", tag);
    return off;
}

/* Removes n bytes at off from a section (the file's bytes after it move up). */
static void cut(unsigned char *b, size_t *len, size_t sec, size_t off, size_t n)
{
    memmove(b + off, b + off + n, *len - off - n);
    *len -= n;
    kvp_put_u64(b + sec + 8, kvp_get_u64(b + sec + 8) - n);
}

/* Version 1 (before system texts, the bounded history and tenants): MSGS starts with the
 * message count, no first tokens, CNTR has no dropped history, IDEN no tenant. Such a file, made from a current
 * one (nothing dropped) by removing those fields, still loads as it is. */
Test(snapshot, version_1_files_still_load_without_a_system_text)
{
    kvp_snapshot s;
    make_snapshot(&s, "old", 3);
    s.system = NULL;
    s.system_len = 0;
    write_ok(&s);
    size_t len;
    unsigned char *b = slurp("old.snap", &len);
    size_t at = section_at(b, len, "IDEN");
    cr_assert_eq(kvp_get_u32(b + at + 16 + kvp_get_u64(b + at + 8) - 4), 0, "no tenant last");
    cut(b, &len, at, at + 16 + kvp_get_u64(b + at + 8) - 4, 4);   /* the tenant (version 4) */
    at = section_at(b, len, "CNTR");
    cut(b, &len, at, at + 16 + kvp_get_u64(b + at + 8) - 20, 20);   /* the dropped history */
    at = section_at(b, len, "MSGS");
    cr_assert_eq(kvp_get_u32(b + at + 16), 0, "system length 0 first");
    cut(b, &len, at, at + 16, 4);
    size_t p = at + 16 + 4;
    uint32_t n_msgs = kvp_get_u32(b + at + 16);
    for (uint32_t i = 0; i < n_msgs; i++) {
        p += 1 + 4 + kvp_get_u32(b + p + 1);
        cut(b, &len, at, p, 8);   /* its first token */
    }
    b[8] = 1;
    fix_checksum(b, len);
    spit("old.snap", b, len);
    char err[512];
    kvp_snapshot r;
    cr_assert_eq(kvp_snapshot_read(g_dir, "old", &r, err, sizeof err), 0, "%s", err);
    cr_expect_null(r.system);
    cr_expect_eq(r.system_len, 0);
    cr_assert_eq(r.n_msgs, 4);
    for (int i = 0; i < 4; i++)
        cr_expect(r.msgs[i].len == s.msgs[i].len &&
                  !memcmp(r.msgs[i].text, s.msgs[i].text, s.msgs[i].len), "message %d", i);
    cr_expect_eq(r.n_tokens, 9);
    kvp_snapshot_free(&r);
    /* The same bytes marked version 2 are inconsistent (no system length): refused. */
    b[8] = 2;
    fix_checksum(b, len);
    spit("old.snap", b, len);
    expect_bad("old", "message", "version 1 layout under version 2");
    free(b);
    free(s.cache);
}

Test(snapshot, file_starts_with_magic_and_version)
{
    kvp_snapshot s;
    make_snapshot(&s, "hdr", 2);
    write_ok(&s);
    size_t len;
    unsigned char *b = slurp("hdr.snap", &len);
    cr_expect_eq(memcmp(b, "KVPSNAP\0", 8), 0);
    cr_expect_eq(b[8], KVP_SNAPSHOT_VERSION);
    cr_expect_eq(b[9] | b[10] | b[11], 0);
    cr_expect_eq(memcmp(b + 16, "IDEN", 4), 0);
    struct stat st;
    cr_assert_eq(stat(path_of("hdr.snap"), &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600);
    free(b);
    free(s.cache);
}

Test(snapshot, truncated_at_every_offset_is_rejected_and_moved_aside)
{
    kvp_snapshot s;
    make_snapshot(&s, "trunc", 1);
    write_ok(&s);
    size_t len;
    unsigned char *b = slurp("trunc.snap", &len);
    cr_assert_lt(len, 2000);   /* small enough to try every cut */
    for (size_t cut = 0; cut < len; cut++) {
        char ctx[64];
        snprintf(ctx, sizeof ctx, "cut at %zu of %zu", cut, len);
        spit("trunc.snap", b, cut);
        expect_bad("trunc", NULL, ctx);
    }
    cr_expect_eq(dir_entries(), 0);
    free(b);
    free(s.cache);
}

Test(snapshot, one_flipped_byte_anywhere_is_rejected)
{
    kvp_snapshot s;
    make_snapshot(&s, "flip", 1);
    write_ok(&s);
    size_t len;
    unsigned char *b = slurp("flip.snap", &len);
    for (size_t i = 0; i < len; i++) {
        char ctx[64];
        snprintf(ctx, sizeof ctx, "byte %zu of %zu flipped", i, len);
        b[i] ^= (unsigned char)(1u << (i % 8));
        spit("flip.snap", b, len);
        b[i] ^= (unsigned char)(1u << (i % 8));
        expect_bad("flip", NULL, ctx);
    }
    /* The untouched bytes still load. */
    spit("flip.snap", b, len);
    char err[512];
    kvp_snapshot r;
    cr_assert_eq(kvp_snapshot_read(g_dir, "flip", &r, err, sizeof err), 0, "%s", err);
    kvp_snapshot_free(&r);
    free(b);
    free(s.cache);
}

Test(snapshot, corrupted_payload_reports_the_checksum)
{
    kvp_snapshot s;
    make_snapshot(&s, "sum", 4);
    write_ok(&s);
    size_t len;
    unsigned char *b = slurp("sum.snap", &len);
    b[len - 100] ^= 0x40;   /* inside the cache blob */
    spit("sum.snap", b, len);
    expect_bad("sum", "checksum", "payload");
    free(b);
    free(s.cache);
}

Test(snapshot, wrong_magic_and_version_are_rejected)
{
    kvp_snapshot s;
    make_snapshot(&s, "mv", 2);
    write_ok(&s);
    size_t len;
    unsigned char *b = slurp("mv.snap", &len);

    b[3] = 'X';
    fix_checksum(b, len);
    spit("mv.snap", b, len);
    expect_bad("mv", "magic", "magic");
    b[3] = 'S';

    b[8] = KVP_SNAPSHOT_VERSION + 1;
    fix_checksum(b, len);
    spit("mv.snap", b, len);
    char want[64];
    snprintf(want, sizeof want, "unsupported version %d", KVP_SNAPSHOT_VERSION + 1);
    expect_bad("mv", want, "version");
    b[8] = 0;
    fix_checksum(b, len);
    spit("mv.snap", b, len);
    expect_bad("mv", "unsupported version 0", "version 0");
    b[8] = KVP_SNAPSHOT_VERSION;

    memcpy(b + 16, "XXXX", 4);
    fix_checksum(b, len);
    spit("mv.snap", b, len);
    expect_bad("mv", "IDEN", "section tag");

    spit("mv.snap", "not a snapshot at all", 21);
    expect_bad("mv", "magic", "text file");
    free(b);
    free(s.cache);
}

Test(snapshot, session_id_inside_must_match_the_file_name)
{
    kvp_snapshot s;
    make_snapshot(&s, "alice", 2);
    write_ok(&s);
    cr_assert_eq(rename(path_of("alice.snap"), path_of("bob.snap")), 0);
    expect_bad("bob", "does not match", "renamed");
    free(s.cache);
}

Test(snapshot, two_bad_files_in_one_second_both_kept)
{
    kvp_snapshot s;
    make_snapshot(&s, "twice", 2);
    char err[512];
    kvp_snapshot r;
    for (int i = 0; i < 2; i++) {
        spit("twice.snap", "garbage garbage garbage garbage", 31);
        cr_assert_eq(kvp_snapshot_read(g_dir, "twice", &r, err, sizeof err), -EBADMSG);
    }
    cr_expect_eq(take_bad_files("twice"), 2);
    free(s.cache);
}

Test(snapshot, bad_ids_are_rejected_before_touching_the_filesystem)
{
    char long_id[80];
    memset(long_id, 'a', 65);
    long_id[65] = 0;
    const char *bad[] = {"../x", "", long_id, "a/b", "a.b", ".", "..", "a b", "x\n", "é"};
    kvp_snapshot s;
    make_snapshot(&s, "ok", 2);
    char err[512];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect(!kvp_snapshot_id_valid(bad[i]), "'%s' accepted", bad[i]);
        kvp_snapshot r;
        err[0] = 0;
        cr_expect_eq(kvp_snapshot_read(g_dir, bad[i], &r, err, sizeof err), -EINVAL, "'%s'", bad[i]);
        cr_expect_not_null(strstr(err, "invalid session id"), "'%s': %s", bad[i], err);
        cr_expect(!kvp_snapshot_exists(g_dir, bad[i]));
        err[0] = 0;
        cr_expect_eq(kvp_snapshot_remove(g_dir, bad[i], err, sizeof err), -EINVAL);
        cr_expect_neq(err[0], 0);
        /* write validates snap->id the same way (strings that fit the field) */
        if (strlen(bad[i]) <= KVP_SNAPSHOT_ID_MAX) {
            strcpy(s.id, bad[i]);
            err[0] = 0;
            cr_expect_eq(kvp_snapshot_write(g_dir, &s, err, sizeof err), -EINVAL, "'%s'", bad[i]);
            cr_expect_not_null(strstr(err, "invalid session id"), "%s", err);
        }
    }
    /* nothing was created here or next to the state directory */
    cr_expect_eq(dir_entries(), 0);
    struct stat st;
    cr_expect_neq(stat("/tmp/x.snap", &st), 0);
    memset(long_id, 'b', 64);
    long_id[64] = 0;
    cr_expect(kvp_snapshot_id_valid(long_id));
    cr_expect(kvp_snapshot_id_valid("Az09_-"));
    free(s.cache);
}

Test(snapshot, missing_snapshot_is_enoent_and_nothing_moves)
{
    char err[512];
    kvp_snapshot r;
    cr_expect_eq(kvp_snapshot_read(g_dir, "nobody", &r, err, sizeof err), -ENOENT);
    cr_expect_not_null(strstr(err, "no snapshot"), "%s", err);
    cr_expect_eq(dir_entries(), 0);
}

Test(snapshot, leftover_tmp_is_ignored_and_cleaned)
{
    /* A crash between create and rename leaves only a .tmp: no snapshot. */
    spit("crash.snap.tmp", "KVPSNAP\0half-written", 20);
    char err[512];
    kvp_snapshot r;
    cr_expect(!kvp_snapshot_exists(g_dir, "crash"));
    cr_expect_eq(kvp_snapshot_read(g_dir, "crash", &r, err, sizeof err), -ENOENT);
    cr_expect(file_exists("crash.snap.tmp"));   /* not moved aside: never read */

    /* Next to a good snapshot, the .tmp does not hide it, and the next write replaces it. */
    kvp_snapshot s;
    make_snapshot(&s, "good", 2);
    write_ok(&s);
    spit("good.snap.tmp", "junk", 4);
    cr_assert_eq(kvp_snapshot_read(g_dir, "good", &r, err, sizeof err), 0, "%s", err);
    kvp_snapshot_free(&r);
    write_ok(&s);
    cr_expect(!file_exists("good.snap.tmp"));

    /* At start, clean removes every stale .tmp and nothing else. */
    spit("other.snap.tmp", "", 0);
    spit("notes.txt", "keep", 4);
    int n = kvp_snapshot_clean(g_dir, err, sizeof err);
    cr_expect_eq(n, 2, "%d: %s", n, err);
    cr_expect(!file_exists("crash.snap.tmp"));
    cr_expect(!file_exists("other.snap.tmp"));
    cr_expect(file_exists("good.snap"));
    cr_expect(file_exists("notes.txt"));
    cr_expect_eq(kvp_snapshot_clean(g_dir, err, sizeof err), 0);
    free(s.cache);
}

Test(snapshot, remove_deletes_snapshot_and_tmp)
{
    kvp_snapshot s;
    make_snapshot(&s, "gone", 2);
    write_ok(&s);
    spit("gone.snap.tmp", "x", 1);
    char err[512];
    cr_assert_eq(kvp_snapshot_remove(g_dir, "gone", err, sizeof err), 0, "%s", err);
    cr_expect(!kvp_snapshot_exists(g_dir, "gone"));
    cr_expect_eq(dir_entries(), 0);
    cr_expect_eq(kvp_snapshot_remove(g_dir, "gone", err, sizeof err), 0, "%s", err);
    free(s.cache);
}

Test(snapshot, write_rejects_inconsistent_snapshots)
{
    kvp_snapshot s;
    make_snapshot(&s, "inc", 2);
    char err[512];
    s.n_cached = 10;   /* more than n_tokens */
    cr_expect_eq(kvp_snapshot_write(g_dir, &s, err, sizeof err), -EINVAL);
    cr_expect_not_null(strstr(err, "n_cached"), "%s", err);
    s.n_cached = 1;
    size_t len = s.cache_len;
    s.cache_len = 0;
    cr_expect_eq(kvp_snapshot_write(g_dir, &s, err, sizeof err), -EINVAL);
    s.cache_len = len;
    s.budget = -1;
    cr_expect_eq(kvp_snapshot_write(g_dir, &s, err, sizeof err), -EINVAL);
    cr_expect_eq(dir_entries(), 0);
    free(s.cache);
}

Test(snapshot, write_to_a_missing_directory_fails_cleanly)
{
    kvp_snapshot s;
    make_snapshot(&s, "nodir", 2);
    char err[512], dir[128];
    snprintf(dir, sizeof dir, "%s/missing", g_dir);
    int rc = kvp_snapshot_write(dir, &s, err, sizeof err);
    cr_expect_eq(rc, -ENOENT, "%d %s", rc, err);
    cr_expect_not_null(strstr(err, "missing"), "%s", err);
    cr_expect_lt(kvp_snapshot_clean(dir, err, sizeof err), 0);
    free(s.cache);
}

/* kill -9 at any moment of a rewrite loop: what is on disk afterwards is always a whole
 * snapshot of some completed turn. */
Test(snapshot, kill_during_writes_leaves_a_whole_snapshot, .timeout = 60)
{
    kvp_snapshot s;
    make_snapshot(&s, "crashy", 300);   /* ~100 KB: the kill often lands mid-write */
    srand(12345);
    int outcomes[2] = {0, 0};
    for (int round = 0; round < 30; round++) {
        int ready[2];
        cr_assert_eq(pipe(ready), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            char err[512];
            for (int turn = 1;; turn++) {
                s.turns = turn;
                s.n_cached = turn % 10;
                if (kvp_snapshot_write(g_dir, &s, err, sizeof err) < 0)
                    _exit(1);
                if (turn == 1 && write(ready[1], "1", 1) != 1)   /* a first turn is on disk */
                    _exit(1);
            }
        }
        char one;
        cr_assert_eq(read(ready[0], &one, 1), 1);
        close(ready[0]);
        close(ready[1]);
        struct timespec ts = {0, (long)(rand() % 20000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFSIGNALED(status), "the writer failed on its own");

        char err[512];
        kvp_snapshot r;
        int rc = kvp_snapshot_read(g_dir, "crashy", &r, err, sizeof err);
        cr_assert_eq(rc, 0, "round %d: %d %s", round, rc, err);
        cr_expect_eq(r.n_cached, r.turns % 10);
        cr_expect_eq(r.cache_len, s.cache_len);
        kvp_snapshot_free(&r);
        cr_expect_eq(take_bad_files("crashy"), 0);
        outcomes[file_exists("crashy.snap.tmp")]++;
        cr_assert_geq(kvp_snapshot_clean(g_dir, err, sizeof err), 0);
    }
    cr_log_info("kills mid-write (a .tmp left): %d of 30", outcomes[1]);
    free(s.cache);
}

/* ---- identity ---- */

Test(snapshot, file_hash_covers_size_and_first_megabyte)
{
    size_t n = (1u << 20) + 4096;
    unsigned char *b = calloc(n, 1);
    spit("model.bin", b, n);
    char err[512];
    uint64_t h0, h1, h2, h3;
    cr_assert_eq(kvp_snapshot_hash_file(path_of("model.bin"), KVP_SNAPSHOT_MODEL_HASH_BYTES,
                                        &h0, err, sizeof err), 0, "%s", err);
    b[1000] = 1;   /* inside the first MiB */
    spit("model.bin", b, n);
    kvp_snapshot_hash_file(path_of("model.bin"), KVP_SNAPSHOT_MODEL_HASH_BYTES, &h1, err, sizeof err);
    cr_expect_neq(h0, h1);
    b[n - 1] = 1;  /* past it, same size: not covered (documented) */
    spit("model.bin", b, n);
    kvp_snapshot_hash_file(path_of("model.bin"), KVP_SNAPSHOT_MODEL_HASH_BYTES, &h2, err, sizeof err);
    cr_expect_eq(h1, h2);
    spit("model.bin", b, n - 1);   /* a different size is */
    kvp_snapshot_hash_file(path_of("model.bin"), KVP_SNAPSHOT_MODEL_HASH_BYTES, &h3, err, sizeof err);
    cr_expect_neq(h2, h3);
    /* whole-file hash (policies) sees the last byte */
    spit("model.bin", b, n);
    kvp_snapshot_hash_file(path_of("model.bin"), UINT64_MAX, &h2, err, sizeof err);
    b[n - 1] = 2;
    spit("model.bin", b, n);
    kvp_snapshot_hash_file(path_of("model.bin"), UINT64_MAX, &h3, err, sizeof err);
    cr_expect_neq(h2, h3);
    cr_expect_eq(kvp_snapshot_hash_file(path_of("nope"), 10, &h0, err, sizeof err), -ENOENT);
    cr_expect_not_null(strstr(err, "nope"), "%s", err);
    free(b);
}

Test(snapshot, identity_distinguishes_model_and_policy)
{
    spit("m.gguf", "GGUF model bytes", 16);
    spit("p.kvpp", "policy weights", 14);
    char err[512];
    kvp_snapshot_identity a, b;
    cr_assert_eq(kvp_snapshot_identity_init(&a, "tiny", path_of("m.gguf"), "kvp",
                                            path_of("p.kvpp"), err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_snapshot_identity_init(&b, "tiny", path_of("m.gguf"), "kvp",
                                            path_of("p.kvpp"), err, sizeof err), 0, "%s", err);
    cr_expect(kvp_snapshot_identity_equal(&a, &b));
    cr_expect_neq(a.policy_hash, 0);

    spit("p.kvpp", "policy weightz", 14);   /* retrained policy */
    kvp_snapshot_identity_init(&b, "tiny", path_of("m.gguf"), "kvp", path_of("p.kvpp"), err, sizeof err);
    cr_expect(!kvp_snapshot_identity_equal(&a, &b));

    cr_assert_eq(kvp_snapshot_identity_init(&a, "tiny", path_of("m.gguf"), "h2o", NULL, err,
                                            sizeof err), 0, "%s", err);
    cr_expect_eq(a.policy_hash, 0);
    kvp_snapshot_identity_init(&b, "tiny", path_of("m.gguf"), "tova", "", err, sizeof err);
    cr_expect(!kvp_snapshot_identity_equal(&a, &b));   /* another policy */

    spit("m.gguf", "GGUF model bytez", 16);   /* same name, other weights */
    kvp_snapshot_identity_init(&b, "tiny", path_of("m.gguf"), "h2o", NULL, err, sizeof err);
    cr_expect(!kvp_snapshot_identity_equal(&a, &b));

    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    cr_expect_eq(kvp_snapshot_identity_init(&b, longname, path_of("m.gguf"), "h2o", NULL, err,
                                            sizeof err), -EINVAL);
    cr_expect_eq(kvp_snapshot_identity_init(&b, "tiny", path_of("none"), "h2o", NULL, err,
                                            sizeof err), -ENOENT);
}

/* A session's tenant is kept (version 4); the same file without it reads as version 3
 * with no tenant. */
Test(snapshot, the_tenant_is_kept)
{
    kvp_snapshot s;
    make_snapshot(&s, "ten", 3);
    snprintf(s.tenant, sizeof s.tenant, "0123456789abcdef");
    write_ok(&s);
    char err[512];
    kvp_snapshot r;
    cr_assert_eq(kvp_snapshot_read(g_dir, "ten", &r, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(r.tenant, "0123456789abcdef");
    kvp_snapshot_free(&r);
    size_t len;
    unsigned char *b = slurp("ten.snap", &len);
    size_t at = section_at(b, len, "IDEN");
    cut(b, &len, at, at + 16 + kvp_get_u64(b + at + 8) - 20, 20);
    b[8] = 3;
    fix_checksum(b, len);
    spit("ten.snap", b, len);
    cr_assert_eq(kvp_snapshot_read(g_dir, "ten", &r, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(r.tenant, "");
    kvp_snapshot_free(&r);
    free(b);
    free(s.cache);
}
