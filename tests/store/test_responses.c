/* Stored responses in the state directory and in memory (store/responses.h): records
 * come back byte for byte to their tenant only, survive a reopen with their bounds, go
 * oldest first past the bounds, and a damaged, truncated or misnamed record, or a hostile
 * id, is refused without a file being touched outside responses/. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/responses.h"
#include "store/store.h"

static char g_dir[64];
static kvp_store *g_st;

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/kvp-resp-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    char err[256];
    kvp_store_params p = {.state_dir = g_dir};
    cr_assert_eq(kvp_store_open(&g_st, &p, err, sizeof err), 0, "%s", err);
}

static void teardown(void)
{
    kvp_store_close(g_st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(store_responses, .init = setup, .fini = teardown, .timeout = 60);

static void id_of(char *id, int k)
{
    snprintf(id, KVP_RESP_ID_LEN + 1, "resp_%024x", k);
}

static kvp_resp_store *open_rs(kvp_store *st)
{
    kvp_resp_store *rs;
    char err[256];
    cr_assert_eq(kvp_resp_open(&rs, st, err, sizeof err), 0, "%s", err);
    return rs;
}

static void put(kvp_resp_store *rs, const char *tenant, const char *id, const char *payload,
                int max_count, uint64_t max_bytes, int *dropped)
{
    char err[256];
    cr_assert_eq(kvp_resp_put(rs, tenant, id, payload, strlen(payload), max_count, max_bytes,
                              dropped, err, sizeof err), 0, "%s", err);
}

/* The record's payload, or NULL with *rc its code. */
static char *get(kvp_resp_store *rs, const char *tenant, const char *id, int *rc)
{
    char *out, err[512];
    size_t len;
    *rc = kvp_resp_get(rs, tenant, id, &out, &len, err, sizeof err);
    if (*rc == 0)
        cr_assert_eq(strlen(out), len);
    return out;
}

static void file_of(char *path, size_t n, const char *id)
{
    snprintf(path, n, "%s/responses/%s.resp", g_dir, id);
}

Test(store_responses, the_framing_refuses_every_truncation_and_a_flipped_byte)
{
    size_t n;
    unsigned char *rec = kvp_resp_encode("ab12", "resp_000000000000000000000001", "{\"x\":1}",
                                         7, &n);
    cr_assert(rec);
    char t[64], id[64];
    const unsigned char *p;
    size_t pl;
    cr_assert_null(kvp_resp_decode(rec, n, t, sizeof t, id, sizeof id, &p, &pl));
    cr_expect_str_eq(t, "ab12");
    cr_expect_eq(pl, 7);
    cr_expect_eq(memcmp(p, "{\"x\":1}", 7), 0);
    for (size_t k = 0; k < n; k++)
        cr_expect_not_null(kvp_resp_decode(rec, k, t, sizeof t, id, sizeof id, &p, &pl),
                           "a record cut to %zu of %zu bytes was accepted", k, n);
    for (size_t k = 0; k < n; k++) {
        rec[k] ^= 0x20;
        cr_expect_not_null(kvp_resp_decode(rec, n, t, sizeof t, id, sizeof id, &p, &pl),
                           "byte %zu flipped was accepted", k);
        rec[k] ^= 0x20;
    }
    free(rec);
}

Test(store_responses, a_record_comes_back_to_its_tenant_only_and_after_a_reopen)
{
    kvp_resp_store *rs = open_rs(g_st);
    cr_expect_str_eq(kvp_resp_kind(rs), "dir");
    char a[40], b[40];
    id_of(a, 1);
    id_of(b, 2);
    put(rs, "aaaa", a, "{\"a\":1}", 10, 0, NULL);
    put(rs, "bbbb", b, "{\"b\":2}", 10, 0, NULL);
    int rc;
    char *got = get(rs, "aaaa", a, &rc);
    cr_assert_eq(rc, 0);
    cr_expect_str_eq(got, "{\"a\":1}");
    free(got);
    cr_expect_null(get(rs, "bbbb", a, &rc));
    cr_expect_eq(rc, -ENOENT, "another tenant's record: %d", rc);
    char err[256];
    cr_expect_eq(kvp_resp_remove(rs, "bbbb", a, err, sizeof err), -ENOENT);
    kvp_resp_close(rs);
    rs = open_rs(g_st);   /* as after a restart */
    got = get(rs, "bbbb", b, &rc);
    cr_assert_eq(rc, 0);
    cr_expect_str_eq(got, "{\"b\":2}");
    free(got);
    cr_expect_eq(kvp_resp_remove(rs, "aaaa", a, err, sizeof err), 0);
    cr_expect_null(get(rs, "aaaa", a, &rc));
    cr_expect_eq(rc, -ENOENT);
    kvp_resp_close(rs);
    rs = open_rs(g_st);
    cr_expect_null(get(rs, "aaaa", a, &rc), "a removed record came back after a reopen");
    kvp_resp_close(rs);
}

Test(store_responses, the_bounds_drop_the_tenants_own_oldest_and_hold_after_a_reopen)
{
    kvp_resp_store *rs = open_rs(g_st);
    char ids[6][40], other[40];
    id_of(other, 99);
    put(rs, "bbbb", other, "{}", 3, 0, NULL);
    for (int i = 0; i < 2; i++) {
        id_of(ids[i], i);
        put(rs, "aaaa", ids[i], "{}", 3, 0, NULL);
    }
    kvp_resp_close(rs);
    rs = open_rs(g_st);
    uint64_t bytes;
    cr_expect_eq(kvp_resp_usage(rs, "aaaa", &bytes), 2, "the count was not read back");
    int dropped = 0, rc;
    for (int i = 2; i < 5; i++) {
        id_of(ids[i], i);
        put(rs, "aaaa", ids[i], "{}", 3, 0, &dropped);
        cr_expect_eq(dropped, i >= 3, "put %d dropped %d", i, dropped);
    }
    for (int i = 0; i < 5; i++) {
        free(get(rs, "aaaa", ids[i], &rc));
        cr_expect_eq(rc, i < 2 ? -ENOENT : 0, "record %d: %d", i, rc);
    }
    free(get(rs, "bbbb", other, &rc));
    cr_expect_eq(rc, 0, "another tenant's record went");
    /* the bytes bound: one large record pushes out the rest, and itself stays */
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    id_of(ids[5], 5);
    put(rs, "aaaa", ids[5], big, 10, 500, &dropped);
    cr_expect_eq(dropped, 3);
    cr_expect_eq(kvp_resp_usage(rs, "aaaa", &bytes), 1);
    free(get(rs, "aaaa", ids[5], &rc));
    cr_expect_eq(rc, 0, "the newest went");
    kvp_resp_close(rs);
}

/* Writes raw bytes over a record's file. */
static void overwrite(const char *id, const void *bytes, size_t n)
{
    char path[256];
    file_of(path, sizeof path, id);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

Test(store_responses, a_damaged_or_truncated_record_is_refused_and_moved_aside)
{
    kvp_resp_store *rs = open_rs(g_st);
    char a[40], b[40], c[40], err[512];
    id_of(a, 1);
    id_of(b, 2);
    id_of(c, 3);
    put(rs, "aaaa", a, "{\"conversation\":\"long enough\"}", 10, 0, NULL);
    put(rs, "aaaa", b, "{\"conversation\":\"long enough\"}", 10, 0, NULL);
    put(rs, "aaaa", c, "{}", 10, 0, NULL);
    char path[256];
    file_of(path, sizeof path, a);
    cr_assert_eq(truncate(path, 40), 0);
    overwrite(b, "KVPRESP1 garbage", 16);
    char *out;
    size_t len;
    int rc = kvp_resp_get(rs, "aaaa", a, &out, &len, err, sizeof err);
    cr_expect_eq(rc, -EBADMSG, "a truncated record: %d", rc);
    cr_expect(strstr(err, "truncated") && strstr(err, "moved aside"), "%s", err);
    struct stat st;
    cr_expect_neq(stat(path, &st), 0, "the damaged file is still in place");
    cr_expect_eq(kvp_resp_get(rs, "aaaa", a, &out, &len, err, sizeof err), -ENOENT);
    uint64_t bytes;
    cr_expect_eq(kvp_resp_usage(rs, "aaaa", &bytes), 2, "the damaged record still counts");
    kvp_resp_close(rs);
    /* at open a record whose header is bad is moved aside; the good one stays */
    rs = open_rs(g_st);
    file_of(path, sizeof path, b);
    cr_expect_neq(stat(path, &st), 0, "a bad header was kept at open");
    cr_expect_eq(kvp_resp_usage(rs, "aaaa", &bytes), 1);
    cr_expect_eq(kvp_resp_get(rs, "aaaa", c, &out, &len, err, sizeof err), 0);
    free(out);
    /* a record renamed to another id's file names its own id: refused */
    char d[40], pc[256], pd[256];
    id_of(d, 4);
    file_of(pc, sizeof pc, c);
    file_of(pd, sizeof pd, d);
    cr_assert_eq(link(pc, pd), 0);
    cr_expect_eq(kvp_resp_get(rs, "aaaa", d, &out, &len, err, sizeof err), -EBADMSG, "%s", err);
    kvp_resp_close(rs);
}

Test(store_responses, hostile_ids_reach_no_file)
{
    kvp_resp_store *rs = open_rs(g_st);
    char err[256], *out;
    size_t len;
    /* a file where ../ would lead, that must not be read or removed */
    char victim[256];
    snprintf(victim, sizeof victim, "%s/x.resp", g_dir);
    FILE *f = fopen(victim, "w");
    cr_assert(f);
    fclose(f);
    static const char *bad[] = {"../x", "resp_../../x", "resp_000000000000000000000001/..",
                                "resp_0000000000000000000000011", "resp_00000000000000000000000",
                                "RESP_000000000000000000000001", "resp_00000000000000000000000G",
                                "", "resp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect(!kvp_resp_id_ok(bad[i]), "'%s' passed as an id", bad[i]);
        cr_expect_eq(kvp_resp_get(rs, "", bad[i], &out, &len, err, sizeof err), -ENOENT);
        cr_expect_eq(kvp_resp_remove(rs, "", bad[i], err, sizeof err), -ENOENT);
        cr_expect_eq(kvp_resp_put(rs, "", bad[i], "{}", 2, 10, 0, NULL, err, sizeof err),
                     -EINVAL, "'%s' was written", bad[i]);
    }
    /* a tenant name that is none of the hub's */
    cr_expect_eq(kvp_resp_put(rs, "../..", "resp_000000000000000000000001", "{}", 2, 10, 0,
                              NULL, err, sizeof err), -EINVAL);
    struct stat st;
    cr_expect_eq(stat(victim, &st), 0, "the file outside responses/ was touched");
    kvp_resp_close(rs);
}

Test(store_responses, an_interrupted_write_is_swept_at_open)
{
    kvp_resp_store *rs = open_rs(g_st);
    char a[40];
    id_of(a, 1);
    put(rs, "", a, "{}", 10, 0, NULL);
    kvp_resp_close(rs);
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s/responses/%s.resp.tmp", g_dir, a);
    FILE *f = fopen(tmp, "w");
    cr_assert(f);
    fputs("half a rec", f);
    fclose(f);
    rs = open_rs(g_st);
    struct stat st;
    cr_expect_neq(stat(tmp, &st), 0, "the temporary file was left");
    int rc;
    free(get(rs, "", a, &rc));
    cr_expect_eq(rc, 0, "the whole record before the interrupted write was lost");
    kvp_resp_close(rs);
}

Test(store_responses, in_memory_the_same_rules_hold)
{
    kvp_resp_store *rs = open_rs(NULL);
    cr_expect_str_eq(kvp_resp_kind(rs), "memory");
    char ids[3][40];
    for (int i = 0; i < 3; i++) {
        id_of(ids[i], i);
        put(rs, "aaaa", ids[i], "{\"m\":1}", 2, 0, NULL);
    }
    int rc;
    free(get(rs, "aaaa", ids[0], &rc));
    cr_expect_eq(rc, -ENOENT, "the oldest stayed past the count");
    char *got = get(rs, "aaaa", ids[2], &rc);
    cr_assert_eq(rc, 0);
    cr_expect_str_eq(got, "{\"m\":1}");
    free(got);
    cr_expect_null(get(rs, "bbbb", ids[2], &rc));
    cr_expect_eq(rc, -ENOENT);
    char err[128];
    cr_expect_eq(kvp_resp_remove(rs, "aaaa", ids[2], err, sizeof err), 0);
    cr_expect_null(get(rs, "aaaa", ids[2], &rc));
    kvp_resp_close(rs);
}
