/* base/tokfile.c: a transcript file's bytes, read back, and every kind of damage refused
 * with -EBADMSG and a message naming the file. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/tokfile.h"
#include "tests/testdir.h"

KVP_TEST_DIR_SUITE(tokfile, g_dir, "tokfile");

static void put(const char *path, const unsigned char *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* Reads path expecting -EBADMSG, and the message to name the file and contain want. */
static void refused(const char *path, int vocab, const char *want)
{
    int *ids = NULL, n = -1;
    uint64_t fp = 0;
    char err[256] = "";
    cr_assert_eq(kvp_tokfile_read(path, vocab, &ids, &n, &fp, err, sizeof err), -EBADMSG,
                 "%s", err);
    cr_assert_null(ids);
    cr_assert(strstr(err, path), "%s", err);
    cr_assert(strstr(err, want), "wanted \"%s\" in \"%s\"", want, err);
}

Test(tokfile, encode_layout_and_round_trip)
{
    const int tok[] = {0, 7, 65535, 1 << 20};
    size_t len = 0;
    unsigned char *b = kvp_tokfile_encode(tok, 4, 0x0102030405060708ull, &len);
    cr_assert(b);
    cr_assert_eq(len, KVP_TOKFILE_HEADER + 16);
    cr_assert_eq(memcmp(b, "KVPTX1\0\0", 8), 0);
    cr_assert_eq(b[8], 0x08);                 /* fingerprint, little endian */
    cr_assert_eq(b[15], 0x01);
    cr_assert_eq(b[16], 4);                   /* count */
    cr_assert_eq(b[KVP_TOKFILE_HEADER + 4], 7);  /* the second id */
    char path[128];
    snprintf(path, sizeof path, "%s/a" KVP_TOKFILE_EXT, g_dir);
    put(path, b, len);
    free(b);

    int *ids = NULL, n = 0;
    uint64_t fp = 0;
    char err[256] = "";
    cr_assert_eq(kvp_tokfile_read(path, 0, &ids, &n, &fp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, 4);
    cr_assert_eq(fp, 0x0102030405060708ull);
    cr_assert_arr_eq(ids, tok, sizeof tok);
    free(ids);
    /* a vocabulary large enough is accepted; one too small refuses the largest id */
    cr_assert_eq(kvp_tokfile_read(path, (1 << 20) + 1, &ids, &n, &fp, err, sizeof err), 0);
    free(ids);
    refused(path, 1 << 20, "outside the vocabulary");
}

Test(tokfile, empty_transcript)
{
    size_t len = 0;
    unsigned char *b = kvp_tokfile_encode(NULL, 0, 9, &len);
    cr_assert(b);
    cr_assert_eq(len, KVP_TOKFILE_HEADER);
    char path[128];
    snprintf(path, sizeof path, "%s/empty", g_dir);
    put(path, b, len);
    free(b);
    int *ids = NULL, n = -1;
    uint64_t fp = 0;
    char err[256];
    cr_assert_eq(kvp_tokfile_read(path, 10, &ids, &n, &fp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, 0);
    cr_assert_eq(fp, 9);
    free(ids);
}

Test(tokfile, damage_is_refused)
{
    const int tok[] = {1, 2, 3};
    size_t len = 0;
    unsigned char *b = kvp_tokfile_encode(tok, 3, 5, &len);
    cr_assert(b);
    char path[128];
    snprintf(path, sizeof path, "%s/d", g_dir);

    put(path, b, 10);                              /* shorter than the header */
    refused(path, 0, "truncated header");

    b[0] ^= 1;                                     /* not the magic */
    put(path, b, len);
    refused(path, 0, "bad magic");
    b[0] ^= 1;

    put(path, b, len - 4);                         /* one id missing */
    refused(path, 0, "3 tokens announced");

    b[KVP_TOKFILE_HEADER + 4] ^= 0x40;             /* an id changed: checksum */
    put(path, b, len);
    refused(path, 0, "checksum");
    b[KVP_TOKFILE_HEADER + 4] ^= 0x40;

    put(path, b, len);                             /* intact again */
    int *ids = NULL, n = 0;
    uint64_t fp = 0;
    char err[256];
    cr_assert_eq(kvp_tokfile_read(path, 4, &ids, &n, &fp, err, sizeof err), 0, "%s", err);
    free(ids);
    refused(path, 3, "token 3 at 2 outside the vocabulary");
    free(b);

    /* a missing file: its errno, not -EBADMSG */
    snprintf(path, sizeof path, "%s/missing", g_dir);
    cr_assert_eq(kvp_tokfile_read(path, 0, &ids, &n, &fp, err, sizeof err), -ENOENT);
    cr_assert(strstr(err, path));
}
