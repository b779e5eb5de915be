/* The transcript index (store/transcripts.h): two chained hash tables in memory, and
 * on disk a hint file (store/hintfile.h) whose lines this room parses and formats. */
#include "store/transcripts.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "store/hintfile.h"

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

static int compact(const char *dir, char *err, size_t errlen);

/* The longest line of ours is about KVP_SNAPSHOT_ID_MAX + 30 bytes. */
#define LINE_MAX_BYTES (KVP_SNAPSHOT_ID_MAX + 48)

static kvp_hintfile g_file = KVP_HINTFILE_INIT(KVP_TRANSCRIPTS_FILE, "transcript index",
                                               LINE_MAX_BYTES, KVP_TRANSCRIPTS_COMPACT_MIN,
                                               compact);

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

/* A line of the file into x, the last line of an id replacing the ones before it. */
static int take_line(void *ctx, const char *line, size_t len)
{
    char id[KVP_SNAPSHOT_ID_MAX + 1];
    uint64_t hash;
    int msgs;
    if (parse_line(line, len, id, &hash, &msgs))
        return KVP_HINTFILE_DAMAGED;
    return kvp_transcripts_put(ctx, id, hash, msgs);
}

/* The compacted file: one line per entry. */
static int put_lines(void *ctx, kvp_hintfile_out *out)
{
    const kvp_transcripts *x = ctx;
    char line[LINE_MAX_BYTES + 1];
    for (size_t i = 0; i < x->n_buckets; i++)
        for (const kvp_transcript_entry *e = x->by_id[i]; e; e = e->inext) {
            int n = format_line(line, sizeof line, e->id, e->hash, e->n_msgs);
            if (kvp_hintfile_put(out, line, (size_t)n) < 0)
                return out->rc;
        }
    return 0;
}

/* Reads the file into x; sessions whose snapshot is gone (removed, lost, moved aside)
 * leave the index; the file is rewritten with the others. *damaged counts the lines
 * skipped. */
static int read_and_rewrite(kvp_transcripts *x, const char *dir, int *damaged, char *err,
                            size_t errlen)
{
    int rc = kvp_hintfile_read(&g_file, dir, take_line, x, damaged, err, errlen);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < x->n_buckets; i++)
        for (kvp_transcript_entry *e = x->by_id[i], *next; e; e = next) {
            next = e->inext;
            if (!kvp_snapshot_exists(dir, e->id))
                kvp_transcripts_remove(x, e->id);
        }
    return kvp_hintfile_rewrite(&g_file, dir, put_lines, x, err, errlen);
}

int kvp_transcripts_load(kvp_transcripts *x, const char *dir, char *err, size_t errlen)
{
    int damaged = 0, rc = read_and_rewrite(x, dir, &damaged, err, errlen);
    if (rc < 0)
        return rc;
    if (damaged)
        snprintf(err, errlen, "%s/%s: %d damaged line(s) skipped", dir, KVP_TRANSCRIPTS_FILE,
                 damaged);
    return x->count;
}

/* An append's compaction: the file read and rewritten with one line per session. */
static int compact(const char *dir, char *err, size_t errlen)
{
    kvp_transcripts x;
    int damaged = 0, rc = kvp_transcripts_init(&x);
    if (rc < 0) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    rc = read_and_rewrite(&x, dir, &damaged, err, errlen);
    kvp_transcripts_free(&x);
    return rc;
}

int kvp_transcripts_append(const char *dir, const char *id, uint64_t hash, int n_msgs,
                           char *err, size_t errlen)
{
    char line[LINE_MAX_BYTES + 1];
    if (!kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "transcript index: invalid session id");
        return -EINVAL;
    }
    int len = format_line(line, sizeof line, id, hash, n_msgs);
    return kvp_hintfile_append(&g_file, dir, line, (size_t)len, err, errlen);
}
