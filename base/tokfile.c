/* Token transcript files (tokfile.h). */
#include "base/tokfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "base/fileio.h"

static const char MAGIC[8] = {'K', 'V', 'P', 'T', 'X', '1', 0, 0};

static uint64_t ids_hash(const unsigned char *p, size_t n)
{
    return kvp_fnv1a(KVP_FNV1A_INIT, p, n);
}

unsigned char *kvp_tokfile_encode(const int *tokens, int n, uint64_t fingerprint, size_t *len)
{
    size_t bytes = KVP_TOKFILE_HEADER + 4 * (size_t)n;
    unsigned char *buf = malloc(bytes);
    if (!buf)
        return NULL;
    for (int i = 0; i < n; i++)
        kvp_put_u32(buf + KVP_TOKFILE_HEADER + 4 * (size_t)i, (uint32_t)tokens[i]);
    memcpy(buf, MAGIC, 8);
    kvp_put_u64(buf + 8, fingerprint);
    kvp_put_u32(buf + 16, (uint32_t)n);
    kvp_put_u32(buf + 20, 0);
    kvp_put_u64(buf + 24, ids_hash(buf + KVP_TOKFILE_HEADER, 4 * (size_t)n));
    *len = bytes;
    return buf;
}

int kvp_tokfile_read(const char *path, int vocab, int **tokens, int *n, uint64_t *fingerprint,
                     char *err, size_t errlen)
{
    struct stat st;
    int fd = kvp_open_input(path, &st);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, kvp_fileio_strerror(fd));
        return fd;
    }
    unsigned char head[KVP_TOKFILE_HEADER];
    long long got = kvp_read_full(fd, head, sizeof head);
    if (got != (long long)sizeof head || memcmp(head, MAGIC, 8)) {
        close(fd);
        snprintf(err, errlen, "%s: not a transcript file (%s)", path,
                 got == (long long)sizeof head ? "bad magic" : "truncated header");
        return -EBADMSG;
    }
    uint32_t count = kvp_get_u32(head + 16);
    if (count > KVP_TOKFILE_MAX_TOKENS ||
        (off_t)(KVP_TOKFILE_HEADER + 4 * (uint64_t)count) != st.st_size) {
        close(fd);
        snprintf(err, errlen, "%s: damaged (%u tokens announced, %lld bytes on disk)", path,
                 count, (long long)st.st_size);
        return -EBADMSG;
    }
    unsigned char *raw = malloc(4 * (size_t)count + 1);
    int *ids = malloc(sizeof *ids * ((size_t)count + 1));
    if (!raw || !ids) {
        close(fd);
        free(raw);
        free(ids);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    got = kvp_read_full(fd, raw, 4 * (size_t)count);
    close(fd);
    int rc = 0;
    if (got != (long long)(4 * (size_t)count)) {
        snprintf(err, errlen, "%s: truncated", path);
        rc = -EBADMSG;
    } else if (ids_hash(raw, 4 * (size_t)count) != kvp_get_u64(head + 24)) {
        snprintf(err, errlen, "%s: damaged (checksum mismatch)", path);
        rc = -EBADMSG;
    }
    for (uint32_t i = 0; rc == 0 && i < count; i++) {
        uint32_t v = kvp_get_u32(raw + 4 * (size_t)i);
        if (v > 0x7fffffffu || (vocab > 0 && (int)v >= vocab)) {
            snprintf(err, errlen, "%s: token %u at %u outside the vocabulary", path, v, i);
            rc = -EBADMSG;
        }
        ids[i] = (int)v;
    }
    free(raw);
    if (rc < 0) {
        free(ids);
        return rc;
    }
    *tokens = ids;
    *n = (int)count;
    *fingerprint = kvp_get_u64(head + 8);
    return 0;
}
