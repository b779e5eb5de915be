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

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/tokfile.h"

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
    if (n < 0 || n > KVP_TOKFILE_MAX_TOKENS) {
        snprintf(err, errlen, "%d tokens: more than a transcript file holds", n);
        return -E2BIG;
    }
    if (mkdir(c->dir, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "learn_dir %s: %s", c->dir, strerror(errno));
        return -errno;
    }
    size_t bytes;
    unsigned char *buf = kvp_tokfile_encode(tokens, n, c->fingerprint, &bytes);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
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
