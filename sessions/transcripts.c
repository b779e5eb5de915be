/* The transcript index (sessions/transcripts.h): two chained hash tables in memory, an
 * append-only text file on disk. */
#include "sessions/transcripts.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/log.h"

/* ---- in memory ---- */

static size_t id_bucket(const kvp_transcripts *x, const char *id)
{
    return (size_t)kvp_fnv1a(KVP_FNV1A_INIT, id, strlen(id)) & (x->n_buckets - 1);
}

static size_t hash_bucket(const kvp_transcripts *x, uint64_t hash)
{
    return (size_t)(hash ^ hash >> 32) & (x->n_buckets - 1);
}

static int tables_alloc(kvp_transcripts *x, size_t n)
{
    x->by_hash = calloc(n, sizeof *x->by_hash);
    x->by_id = calloc(n, sizeof *x->by_id);
    if (!x->by_hash || !x->by_id) {
        free(x->by_hash);
        free(x->by_id);
        return -ENOMEM;
    }
    x->n_buckets = n;
    return 0;
}

int kvp_transcripts_init(kvp_transcripts *x)
{
    memset(x, 0, sizeof *x);
    return tables_alloc(x, 64);
}

void kvp_transcripts_free(kvp_transcripts *x)
{
    for (size_t i = 0; i < x->n_buckets; i++)
        for (kvp_transcript_entry *e = x->by_id[i], *next; e; e = next) {
            next = e->inext;
            free(e);
        }
    free(x->by_hash);
    free(x->by_id);
    memset(x, 0, sizeof *x);
}

static void link_entry(kvp_transcripts *x, kvp_transcript_entry *e)
{
    size_t h = hash_bucket(x, e->hash), i = id_bucket(x, e->id);
    e->hnext = x->by_hash[h];
    x->by_hash[h] = e;
    e->inext = x->by_id[i];
    x->by_id[i] = e;
}

/* Doubles both tables when there are more entries than buckets. */
static int grow(kvp_transcripts *x)
{
    kvp_transcripts old = *x;
    if (tables_alloc(x, old.n_buckets * 2) < 0) {
        *x = old;
        return -ENOMEM;
    }
    for (size_t i = 0; i < old.n_buckets; i++)
        for (kvp_transcript_entry *e = old.by_id[i], *next; e; e = next) {
            next = e->inext;
            link_entry(x, e);
        }
    free(old.by_hash);
    free(old.by_id);
    return 0;
}

/* Unlinks id's entry from both chains and returns it (NULL: none). */
static kvp_transcript_entry *unlink_id(kvp_transcripts *x, const char *id)
{
    kvp_transcript_entry *e = NULL;
    for (kvp_transcript_entry **p = &x->by_id[id_bucket(x, id)]; *p; p = &(*p)->inext)
        if (!strcmp((*p)->id, id)) {
            e = *p;
            *p = e->inext;
            break;
        }
    if (!e)
        return NULL;
    for (kvp_transcript_entry **p = &x->by_hash[hash_bucket(x, e->hash)]; *p; p = &(*p)->hnext)
        if (*p == e) {
            *p = e->hnext;
            break;
        }
    x->count--;
    return e;
}

int kvp_transcripts_put(kvp_transcripts *x, const char *id, uint64_t hash, int n_msgs)
{
    if (strlen(id) > KVP_SNAPSHOT_ID_MAX)
        return -EINVAL;
    kvp_transcript_entry *e = unlink_id(x, id);
    if (!e && (size_t)x->count >= x->n_buckets && grow(x) < 0)
        return -ENOMEM;
    if (!e && !(e = calloc(1, sizeof *e)))
        return -ENOMEM;
    snprintf(e->id, sizeof e->id, "%s", id);
    e->hash = hash;
    e->n_msgs = n_msgs;
    link_entry(x, e);
    x->count++;
    return 0;
}

void kvp_transcripts_remove(kvp_transcripts *x, const char *id)
{
    free(unlink_id(x, id));
}

const kvp_transcript_entry *kvp_transcripts_get(const kvp_transcripts *x, const char *id)
{
    for (const kvp_transcript_entry *e = x->by_id[id_bucket(x, id)]; e; e = e->inext)
        if (!strcmp(e->id, id))
            return e;
    return NULL;
}

const kvp_transcript_entry *kvp_transcripts_next(const kvp_transcripts *x, uint64_t hash,
                                                 int n_msgs, const kvp_transcript_entry *prev)
{
    const kvp_transcript_entry *e = prev ? prev->hnext : x->by_hash[hash_bucket(x, hash)];
    for (; e; e = e->hnext)
        if (e->hash == hash && e->n_msgs == n_msgs)
            return e;
    return NULL;
}

/* ---- on disk ---- */

static int path_of(char *buf, size_t n, const char *dir, const char *suffix, char *err,
                   size_t errlen)
{
    int w = snprintf(buf, n, "%s/" KVP_TRANSCRIPTS_FILE "%s", dir, suffix);
    if (w < 0 || (size_t)w >= n) {
        snprintf(err, errlen, "transcript index path too long in %s", dir);
        return -ENAMETOOLONG;
    }
    return 0;
}

/* "<id> <16 hex> <n>": 0 and the fields, or -1 for a damaged line. */
static int parse_line(const char *line, size_t len, char *id, uint64_t *hash, int *n)
{
    const char *sp = memchr(line, ' ', len);
    if (!sp || sp == line || (size_t)(sp - line) > KVP_SNAPSHOT_ID_MAX)
        return -1;
    memcpy(id, line, (size_t)(sp - line));
    id[sp - line] = '\0';
    if (!kvp_snapshot_id_valid(id))
        return -1;
    const char *p = sp + 1, *end = line + len;
    uint64_t h = 0;
    int digits = 0;
    for (; p < end && *p != ' '; p++, digits++) {
        int v = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (v < 0 || digits >= 16)
            return -1;
        h = h << 4 | (uint64_t)v;
    }
    if (digits != 16 || p == end)
        return -1;
    long v = 0;
    int any = 0;
    for (p++; p < end; p++, any = 1) {
        if (*p < '0' || *p > '9' || v > INT_MAX / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    if (!any || v > INT_MAX)
        return -1;
    *hash = h;
    *n = (int)v;
    return 0;
}

static int format_line(char *buf, size_t n, const char *id, uint64_t hash, int n_msgs)
{
    return snprintf(buf, n, "%s %016llx %d\n", id, (unsigned long long)hash, n_msgs);
}

/* Opens like the snapshots: no links, no blocking on a FIFO, regular files only. */
static int open_regular(const char *path, int flags, struct stat *st, char *err,
                        size_t errlen)
{
    int fd = kvp_open_regular(path, flags, st);
    if (fd == KVP_E_NOT_REGULAR)
        snprintf(err, errlen, "%s: not a regular file", path);
    else if (fd < 0)
        snprintf(err, errlen, "open %s: %s", path, strerror(-fd));
    return fd;
}

/* The compacted file: one line per entry, written to .tmp and renamed over the index. */
static int rewrite(const kvp_transcripts *x, const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    int rc;
    if ((rc = path_of(path, sizeof path, dir, "", err, errlen)) < 0 ||
        (rc = path_of(tmp, sizeof tmp, dir, ".tmp", err, errlen)) < 0)
        return rc;
    struct stat st;
    int fd = open_regular(tmp, O_WRONLY | O_CREAT | O_TRUNC, &st, err, errlen);
    if (fd < 0)
        return fd;
    char line[KVP_SNAPSHOT_ID_MAX + 48];
    for (size_t i = 0; i < x->n_buckets && rc == 0; i++)
        for (const kvp_transcript_entry *e = x->by_id[i]; e && rc == 0; e = e->inext) {
            int n = format_line(line, sizeof line, e->id, e->hash, e->n_msgs);
            rc = kvp_write_all(fd, line, (size_t)n);
        }
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0) {
        snprintf(err, errlen, "rewriting %s: %s", path, strerror(-rc));
        unlink(tmp);
    }
    return rc;
}

/* Reads the index file at path into x, the last line of an id winning; *damaged counts
 * the lines skipped. A missing file is an empty index (no message). 0 or a negative code
 * with a message. */
static int read_index(kvp_transcripts *x, const char *path, int *damaged, char *err,
                      size_t errlen)
{
    FILE *f = NULL;
    struct stat st;
    int rc = 0, fd = open_regular(path, O_RDONLY, &st, err, errlen);
    if (fd == -ENOENT) {   /* a fresh state directory */
        err[0] = '\0';
        return 0;
    }
    if (fd < 0 || !(f = fdopen(fd, "r"))) {
        if (fd >= 0)
            close(fd);
        return fd < 0 ? fd : -ENOMEM;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        char id[KVP_SNAPSHOT_ID_MAX + 1];
        uint64_t hash;
        int msgs;
        if (n == 0 || line[n - 1] != '\n' || parse_line(line, (size_t)n - 1, id, &hash, &msgs)) {
            (*damaged)++;   /* a torn last line, or bytes that are no line of ours */
            continue;
        }
        if ((rc = kvp_transcripts_put(x, id, hash, msgs)) < 0)
            break;
    }
    free(line);
    fclose(f);
    if (rc < 0)
        snprintf(err, errlen, "reading %s: out of memory", path);
    return rc;
}

/* Sessions whose snapshot is gone (removed, lost, moved aside) leave the index; the file
 * is rewritten with the others. */
static int prune_and_rewrite(kvp_transcripts *x, const char *dir, char *err, size_t errlen)
{
    for (size_t i = 0; i < x->n_buckets; i++)
        for (kvp_transcript_entry *e = x->by_id[i], *next; e; e = next) {
            next = e->inext;
            if (!kvp_snapshot_exists(dir, e->id))
                kvp_transcripts_remove(x, e->id);
        }
    return rewrite(x, dir, err, errlen);
}

int kvp_transcripts_load(kvp_transcripts *x, const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX];
    int damaged = 0, rc = path_of(path, sizeof path, dir, "", err, errlen);
    if (rc < 0 || (rc = read_index(x, path, &damaged, err, errlen)) < 0 ||
        (rc = prune_and_rewrite(x, dir, err, errlen)) < 0)
        return rc;
    if (damaged)
        snprintf(err, errlen, "%s: %d damaged line(s) skipped", path, damaged);
    return x->count;
}

/* Appends and compactions of this process, one at a time: a compaction renames a new
 * file over the one an append would otherwise write to. `compacted` is the file's size
 * after the last compaction (or as first seen) in `dir`. */
static pthread_mutex_t g_index_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_index_dir[PATH_MAX];
static off_t g_index_compacted;

/* The file holds a line per saved turn: once it is both past KVP_TRANSCRIPTS_COMPACT_MIN
 * bytes and twice its compacted size, it is read and rewritten with one line per
 * session (so the cost per append stays constant, and the file within about twice its
 * entries). Called with g_index_lock held. */
static void maybe_compact(const char *dir, const char *path, off_t size)
{
    if (strcmp(g_index_dir, dir)) {
        snprintf(g_index_dir, sizeof g_index_dir, "%s", dir);
        g_index_compacted = size;
    }
    if (size < KVP_TRANSCRIPTS_COMPACT_MIN || size < 2 * g_index_compacted)
        return;
    kvp_transcripts x;
    char err[256] = "";
    int damaged = 0;
    if (kvp_transcripts_init(&x) < 0)
        return;
    if (read_index(&x, path, &damaged, err, sizeof err) == 0 &&
        prune_and_rewrite(&x, dir, err, sizeof err) == 0) {
        struct stat st;
        g_index_compacted = stat(path, &st) == 0 ? st.st_size : 0;
    } else {
        g_index_compacted = size;   /* tried again once it doubled */
        kvpd_log("warning", "transcript index: compaction failed: %s", err);
    }
    kvp_transcripts_free(&x);
}

int kvp_transcripts_append(const char *dir, const char *id, uint64_t hash, int n_msgs,
                           char *err, size_t errlen)
{
    char path[PATH_MAX], line[KVP_SNAPSHOT_ID_MAX + 48];
    int rc = path_of(path, sizeof path, dir, "", err, errlen);
    if (rc < 0)
        return rc;
    if (!kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "transcript index: invalid session id");
        return -EINVAL;
    }
    pthread_mutex_lock(&g_index_lock);
    struct stat st;
    int fd = open_regular(path, O_WRONLY | O_CREAT | O_APPEND, &st, err, errlen);
    if (fd < 0) {
        pthread_mutex_unlock(&g_index_lock);
        return fd;
    }
    int len = format_line(line, sizeof line, id, hash, n_msgs);
    if ((rc = kvp_write_all(fd, line, (size_t)len)) < 0) {
        snprintf(err, errlen, "append to %s: %s", path, strerror(-rc));
    }
    close(fd);
    if (rc == 0)
        maybe_compact(dir, path, st.st_size + len);
    pthread_mutex_unlock(&g_index_lock);
    return rc;
}
