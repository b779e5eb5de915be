/* Transcripts kept for learning: the file format, the write and the retention caps
 * (learnlog.h). Runs on a worker as background work (observe/background.h), never
 * inside a step. */
#include "observe/learnlog.h"

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

int kvp_learnlog_tenant_dir(const kvp_learnlog_cfg *c, const char *tenant, char *out, size_t n)
{
    size_t len = strlen(tenant);
    if (len > 64)
        return -EINVAL;
    for (size_t i = 0; i < len; i++)
        if (!((tenant[i] >= '0' && tenant[i] <= '9') || (tenant[i] >= 'a' && tenant[i] <= 'z')))
            return -EINVAL;
    snprintf(out, n, "%s/%s", c->dir, len ? tenant : KVP_LEARNLOG_DEFAULT_TENANT);
    return 0;
}

typedef struct entry {
    char name[160];            /* relative to dir: FILE or TENANT/FILE */
    off_t size;
    time_t mtime;
} entry;

static int by_age(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime ? 1 : strcmp(x->name, y->name);
}

static int is_transcript(const char *name)
{
    size_t len = strlen(name), ext = strlen(KVP_LEARNLOG_EXT);
    return len > ext && !strcmp(name + len - ext, KVP_LEARNLOG_EXT);
}

typedef struct listing {
    entry *e;
    size_t n, cap;
    uint64_t total;
} listing;

/* The transcripts of dir/sub (sub "": dir itself) into l, the ones past the age deleted;
 * with sub "", each tenant folder's too. */
static void list_files(const kvp_learnlog_cfg *c, const char *sub, time_t now, listing *l)
{
    char folder[1024], path[1300];
    snprintf(folder, sizeof folder, sub[0] ? "%s/%s" : "%s%s", c->dir, sub);
    DIR *d = opendir(folder);
    if (!d)
        return;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        struct stat st;
        snprintf(path, sizeof path, "%.1024s/%.160s", folder, de->d_name);
        if (lstat(path, &st))
            continue;
        if (S_ISDIR(st.st_mode)) {
            if (!sub[0] && strlen(de->d_name) < 80)
                list_files(c, de->d_name, now, l);
            continue;
        }
        if (!S_ISREG(st.st_mode) || !is_transcript(de->d_name))
            continue;
        if (c->max_age_s > 0 && difftime(now, st.st_mtime) > c->max_age_s) {
            unlink(path);
            continue;
        }
        if (l->n == l->cap) {
            size_t nc = l->cap ? 2 * l->cap : 64;
            entry *v = realloc(l->e, nc * sizeof *v);
            if (!v)
                break;
            l->e = v;
            l->cap = nc;
        }
        entry *e = &l->e[l->n];
        snprintf(e->name, sizeof e->name, sub[0] ? "%s/%.70s" : "%s%.70s", sub, de->d_name);
        e->size = st.st_size;
        e->mtime = st.st_mtime;
        l->total += (uint64_t)st.st_size;
        l->n++;
    }
    closedir(d);
}

/* The caps, over every tenant's folder: files past the age first, then the oldest while
 * over the size. */
static void apply_caps(const kvp_learnlog_cfg *c)
{
    listing l = {0};
    list_files(c, "", time(NULL), &l);
    if (c->max_bytes && l.total > c->max_bytes) {
        char path[1200];
        qsort(l.e, l.n, sizeof *l.e, by_age);
        for (size_t i = 0; i < l.n && l.total > c->max_bytes; i++) {
            snprintf(path, sizeof path, "%s/%s", c->dir, l.e[i].name);
            if (unlink(path) == 0)
                l.total -= (uint64_t)l.e[i].size;
        }
    }
    free(l.e);
}

int kvp_learnlog_write(const kvp_learnlog_cfg *c, const char *tenant, const char *session_id,
                       const int *tokens, int n, char *err, size_t errlen)
{
    if (n < 0 || n > KVP_TOKFILE_MAX_TOKENS) {
        snprintf(err, errlen, "%d tokens: more than a transcript file holds", n);
        return -E2BIG;
    }
    char folder[1024];
    if (kvp_learnlog_tenant_dir(c, tenant, folder, sizeof folder) < 0) {
        snprintf(err, errlen, "tenant '%.64s': not a tenant name", tenant);
        return -EINVAL;
    }
    if (mkdir(c->dir, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "learn_dir %s: %s", c->dir, strerror(errno));
        return -errno;
    }
    if (mkdir(folder, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "learn_dir %s: %s", folder, strerror(errno));
        return -errno;
    }
    size_t bytes;
    unsigned char *buf = kvp_tokfile_encode(tokens, n, c->fingerprint, &bytes);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, session_id, strlen(session_id));
    char path[1100], tmp[1200];
    snprintf(path, sizeof path, "%s/%016llx%s", folder, (unsigned long long)h, KVP_LEARNLOG_EXT);
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

int kvp_learnlog_forget(const kvp_learnlog_cfg *c, const char *tenant, int *deleted, char *err,
                        size_t errlen)
{
    *deleted = 0;
    char folder[1024], path[1300];
    if (kvp_learnlog_tenant_dir(c, tenant, folder, sizeof folder) < 0) {
        snprintf(err, errlen, "tenant '%.64s': not a tenant name", tenant);
        return -EINVAL;
    }
    DIR *d = opendir(folder);
    if (!d) {
        int rc = -errno;
        snprintf(err, errlen, "%s: %s", folder, strerror(-rc));
        return rc;
    }
    int rc = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%.1024s/%.160s", folder, de->d_name);
        if (unlink(path) == 0) {
            *deleted += is_transcript(de->d_name);
        } else if (errno != ENOENT && rc == 0) {
            rc = -errno;
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
        }
    }
    closedir(d);
    if (rc == 0 && rmdir(folder) && errno != ENOENT) {
        rc = -errno;
        snprintf(err, errlen, "%s: %s", folder, strerror(errno));
    }
    return rc;
}

int kvp_learnlog_strip_system(int *tokens, int n, const int *with, int n_with,
                              const int *without, int n_without)
{
    if (n_with == n_without && !memcmp(with, without, (size_t)n_with * sizeof *with))
        return n;   /* the template does not render the system prompt: nothing to cut */
    int p = 0;
    while (p < n_with && p < n_without && with[p] == without[p])
        p++;
    int q = 0;
    while (p + q < n_with && p + q < n_without &&
           with[n_with - 1 - q] == without[n_without - 1 - q])
        q++;
    int end = n_with - q;   /* the system prompt's tokens are with[p..end) */
    if (end <= p || end > n)
        return -ENOENT;
    for (int i = 0; i < end; i++)
        if (tokens[i] != with[i])
            return -ENOENT;
    memmove(tokens + p, tokens + end, (size_t)(n - end) * sizeof *tokens);
    return n - (end - p);
}
