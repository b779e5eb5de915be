/* Transcripts kept for learning: the file format, the write and the retention caps
 * (learnlog.h). Runs on a worker as background work (sessions/background.h), never
 * inside a step. */
#include "sessions/learnlog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "base/fileio.h"

static const char MAGIC[8] = {'K', 'V', 'P', 'T', 'X', '1', 0, 0};

int kvp_learnlog_sampled(const kvp_learnlog_cfg *c, const char *session_id)
{
    if (!c->dir || !c->dir[0] || c->rate <= 0.0)
        return 0;
    if (c->rate >= 1.0)
        return 1;
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, session_id, strlen(session_id));
    h ^= h >> 29;   /* FNV's low bits mix best after a fold */
    return (double)(h >> 11) * (1.0 / 9007199254740992.0) < c->rate;
}

static uint64_t ids_hash(const unsigned char *p, size_t n)
{
    return kvp_fnv1a(KVP_FNV1A_INIT, p, n);
}

typedef struct entry {
    char name[64];
    off_t size;
    time_t mtime;
} entry;

static int by_age(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime ? 1 : strcmp(x->name, y->name);
}

/* The caps: files past the age first, then the oldest while over the size. */
static void apply_caps(const kvp_learnlog_cfg *c)
{
    DIR *d = opendir(c->dir);
    if (!d)
        return;
    entry *e = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    time_t now = time(NULL);
    char path[1024];
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        size_t ext = strlen(KVP_LEARNLOG_EXT);
        if (len <= ext || len >= sizeof e->name || strcmp(de->d_name + len - ext, KVP_LEARNLOG_EXT))
            continue;
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
        if (lstat(path, &st) || !S_ISREG(st.st_mode))
            continue;
        if (c->max_age_s > 0 && difftime(now, st.st_mtime) > c->max_age_s) {
            unlink(path);
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            entry *v = realloc(e, nc * sizeof *v);
            if (!v)
                break;
            e = v;
            cap = nc;
        }
        snprintf(e[n].name, sizeof e[n].name, "%s", de->d_name);
        e[n].size = st.st_size;
        e[n].mtime = st.st_mtime;
        total += (uint64_t)st.st_size;
        n++;
    }
    closedir(d);
    if (c->max_bytes && total > c->max_bytes) {
        qsort(e, n, sizeof *e, by_age);
        for (size_t i = 0; i < n && total > c->max_bytes; i++) {
            snprintf(path, sizeof path, "%s/%s", c->dir, e[i].name);
            if (unlink(path) == 0)
                total -= (uint64_t)e[i].size;
        }
    }
    free(e);
}

int kvp_learnlog_write(const kvp_learnlog_cfg *c, const char *session_id, const int *tokens,
                       int n, char *err, size_t errlen)
{
    if (n < 0 || n > KVP_LEARNLOG_MAX_TOKENS) {
        snprintf(err, errlen, "%d tokens: more than a transcript file holds", n);
        return -E2BIG;
    }
    if (mkdir(c->dir, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "learn_dir %s: %s", c->dir, strerror(errno));
        return -errno;
    }
    size_t bytes = KVP_LEARNLOG_HEADER + 4 * (size_t)n;
    unsigned char *buf = malloc(bytes);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++)
        kvp_put_u32(buf + KVP_LEARNLOG_HEADER + 4 * (size_t)i, (uint32_t)tokens[i]);
    memcpy(buf, MAGIC, 8);
    kvp_put_u64(buf + 8, c->fingerprint);
    kvp_put_u32(buf + 16, (uint32_t)n);
    kvp_put_u32(buf + 20, 0);
    kvp_put_u64(buf + 24, ids_hash(buf + KVP_LEARNLOG_HEADER, 4 * (size_t)n));
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, session_id, strlen(session_id));
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/%016llx%s", c->dir, (unsigned long long)h, KVP_LEARNLOG_EXT);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        rc = -errno;
    else if ((rc = kvp_write_all(fd, buf, bytes)) == 0 && fsync(fd))
        rc = -errno;
    if (fd >= 0 && close(fd) && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path))
        rc = -errno;
    free(buf);
    if (rc < 0) {
        if (fd >= 0)
            unlink(tmp);
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    apply_caps(c);
    return 0;
}

int kvp_learnlog_read(const char *path, int vocab, int **tokens, int *n,
                      uint64_t *fingerprint, char *err, size_t errlen)
{
    struct stat st;
    int fd = kvp_open_input(path, &st);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, kvp_fileio_strerror(fd));
        return fd;
    }
    unsigned char head[KVP_LEARNLOG_HEADER];
    long long got = kvp_read_full(fd, head, sizeof head);
    if (got != (long long)sizeof head || memcmp(head, MAGIC, 8)) {
        close(fd);
        snprintf(err, errlen, "%s: not a transcript file (%s)", path,
                 got == (long long)sizeof head ? "bad magic" : "truncated header");
        return -EBADMSG;
    }
    uint32_t count = kvp_get_u32(head + 16);
    if (count > KVP_LEARNLOG_MAX_TOKENS ||
        (off_t)(KVP_LEARNLOG_HEADER + 4 * (uint64_t)count) != st.st_size) {
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
