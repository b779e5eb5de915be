/* The prefix index's file (store/prefix_file.h): lines parsed and formatted, what a
 * load keeps; the file itself (bounded reads, rewrite, appends and their compaction) is a
 * hint file (store/hintfile.h). The same lines in a shared store. */
#include "store/prefix_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "store/hintfile.h"
#include "store/store.h"

void kvp_prefix_recs_free(kvp_prefix_recs *x)
{
    for (int i = 0; i < x->n; i++)
        free(x->v[i].chain);
    free(x->v);
    memset(x, 0, sizeof *x);
}

/* ---- one line ---- */

static int tenant_ok(const char *t)
{
    size_t n = strlen(t);
    if (n > KVP_PREFIX_FILE_TENANT_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
            return 0;
    return 1;
}

/* What the check field covers: the id, the tenant (NUL-ended, so fields cannot slide into
 * each other), the count and the hashes. */
static uint64_t line_check(const char *id, const char *tenant, const uint64_t *chain, int n)
{
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, "kvp-prefix-file\0", 16);
    h = kvp_fnv1a(h, id, strlen(id) + 1);
    h = kvp_fnv1a(h, tenant, strlen(tenant) + 1);
    uint32_t n32 = (uint32_t)n;
    h = kvp_fnv1a(h, &n32, sizeof n32);
    return n > 0 ? kvp_fnv1a(h, chain, (size_t)n * sizeof *chain) : h;
}

/* The next space-separated field of [*p, end): its start and length; *p past it and one
 * space. 0 when there is none. */
static int field(const char **p, const char *end, const char **f, size_t *len)
{
    const char *s = *p, *sp = s < end ? memchr(s, ' ', (size_t)(end - s)) : NULL;
    const char *e = sp ? sp : end;
    if (e == s)
        return 0;
    *f = s;
    *len = (size_t)(e - s);
    *p = sp ? sp + 1 : end;
    return 1;
}

static int hex16(const char *f, size_t len, uint64_t *out)
{
    uint64_t h = 0;
    if (len != 16)
        return -1;
    for (size_t i = 0; i < 16; i++) {
        int v = f[i] >= '0' && f[i] <= '9'   ? f[i] - '0'
                : f[i] >= 'a' && f[i] <= 'f' ? f[i] - 'a' + 10
                                             : -1;
        if (v < 0)
            return -1;
        h = h << 4 | (uint64_t)v;
    }
    *out = h;
    return 0;
}

int kvp_prefix_line_parse(const char *line, size_t len, kvp_prefix_rec *r)
{
    memset(r, 0, sizeof *r);
    const char *p = line, *end = line + len, *f;
    size_t fl;
    if (!field(&p, end, &f, &fl) || fl > KVP_SNAPSHOT_ID_MAX)
        return -1;
    memcpy(r->id, f, fl);
    r->id[fl] = '\0';
    if (strlen(r->id) != fl || !kvp_snapshot_id_valid(r->id) || !field(&p, end, &f, &fl) ||
        fl > KVP_PREFIX_FILE_TENANT_MAX)
        return -1;
    if (!(fl == 1 && f[0] == '-')) {
        memcpy(r->tenant, f, fl);
        r->tenant[fl] = '\0';
        if (strlen(r->tenant) != fl || !tenant_ok(r->tenant))
            return -1;
    }
    long n = 0;
    if (!field(&p, end, &f, &fl) || fl > 4)
        return -1;
    for (size_t i = 0; i < fl; i++) {
        if (f[i] < '0' || f[i] > '9')
            return -1;
        n = n * 10 + (f[i] - '0');
    }
    uint64_t check;
    if (n > KVP_PREFIX_MAX_PER || !field(&p, end, &f, &fl) || hex16(f, fl, &check) < 0)
        return -1;
    if (n > 0 && !(r->chain = malloc((size_t)n * sizeof *r->chain)))
        return -1;
    for (long b = 0; b < n; b++)
        if (!field(&p, end, &f, &fl) || hex16(f, fl, &r->chain[b]) < 0)
            goto bad;
    r->n = (int)n;
    if (p != end || check != line_check(r->id, r->tenant, r->chain, r->n))
        goto bad;
    return 0;
bad:
    free(r->chain);
    r->chain = NULL;
    r->n = 0;
    return -1;
}

int kvp_prefix_line_format(char *buf, size_t cap, const char *id, const char *tenant,
                           const uint64_t *chain, int n)
{
    const char *t = tenant && tenant[0] ? tenant : "";
    if (!kvp_snapshot_id_valid(id) || !tenant_ok(t) || n < 0 || n > KVP_PREFIX_MAX_PER ||
        (n > 0 && !chain))
        return -1;
    int w = snprintf(buf, cap, "%s %s %d %016llx", id, t[0] ? t : "-", n,
                     (unsigned long long)line_check(id, t, chain, n));
    if (w < 0 || (size_t)w >= cap)
        return -1;
    size_t at = (size_t)w;
    for (int b = 0; b < n; b++) {
        if (cap - at < 18)
            return -1;
        at += (size_t)snprintf(buf + at, cap - at, " %016llx", (unsigned long long)chain[b]);
    }
    if (cap - at < 2)
        return -1;
    buf[at++] = '\n';
    buf[at] = '\0';
    return (int)at;
}

/* ---- the file ---- */

static int compact(const char *dir, char *err, size_t errlen);

static kvp_hintfile g_file = KVP_HINTFILE_INIT(KVP_PREFIX_FILE, "prefix index",
                                               KVP_PREFIX_FILE_LINE_MAX,
                                               KVP_PREFIX_FILE_COMPACT_MIN, compact);

static int by_id_then_seq(const void *a, const void *b)
{
    const kvp_prefix_rec *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

static int push(kvp_prefix_recs *x, const kvp_prefix_rec *r)
{
    if (x->n == x->cap) {
        int cap = x->cap ? x->cap * 2 : 64;
        kvp_prefix_rec *v = realloc(x->v, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        x->v = v;
        x->cap = cap;
    }
    x->v[x->n++] = *r;
    return 0;
}

typedef struct file_read {
    kvp_prefix_recs *x;
    long seq;
} file_read;

/* A line of the file into the records, in file order. */
static int take_line(void *ctx, const char *line, size_t len)
{
    file_read *r = ctx;
    kvp_prefix_rec rec;
    if (kvp_prefix_line_parse(line, len, &rec) < 0)
        return KVP_HINTFILE_DAMAGED;
    rec.seq = r->seq++;
    if (push(r->x, &rec) < 0) {
        free(rec.chain);
        return -ENOMEM;
    }
    return 0;
}

/* Keeps the last record of each id, when it has blocks and its snapshot exists. */
static void keep_current(kvp_prefix_recs *x, int (*exists)(void *ctx, const char *id),
                         void *ctx)
{
    if (x->n == 0)   /* (qsort of no array: x->v may be NULL) */
        return;
    qsort(x->v, (size_t)x->n, sizeof *x->v, by_id_then_seq);
    int out = 0;
    for (int i = 0; i < x->n; i++) {
        kvp_prefix_rec *r = &x->v[i];
        int last = i + 1 == x->n || strcmp(r->id, x->v[i + 1].id);
        if (last && r->n > 0 && exists(ctx, r->id))
            x->v[out++] = *r;
        else
            free(r->chain);
    }
    x->n = out;
}

static int in_dir(void *dir, const char *id)
{
    return kvp_snapshot_exists(dir, id);
}

static int in_store(void *st, const char *id)
{
    return kvp_store_exists(st, id) == 1;
}

/* The compacted file: a line per record. */
static int put_lines(void *ctx, kvp_hintfile_out *out)
{
    const kvp_prefix_recs *x = ctx;
    char *line = malloc(KVP_PREFIX_FILE_LINE_MAX + 1);
    if (!line)
        return -ENOMEM;
    for (int i = 0; i < x->n && out->rc == 0; i++) {
        const kvp_prefix_rec *r = &x->v[i];
        int n = kvp_prefix_line_format(line, KVP_PREFIX_FILE_LINE_MAX + 1, r->id, r->tenant,
                                       r->chain, r->n);
        if (n > 0)
            kvp_hintfile_put(out, line, (size_t)n);
    }
    free(line);
    return out->rc;
}

int kvp_prefix_file_load(kvp_prefix_recs *x, const char *dir, char *err, size_t errlen)
{
    file_read r = {.x = x};
    int damaged = 0, rc;
    err[0] = '\0';
    if ((rc = kvp_hintfile_read(&g_file, dir, take_line, &r, &damaged, err, errlen)) < 0)
        return rc;
    keep_current(x, in_dir, (void *)dir);
    if ((rc = kvp_hintfile_rewrite(&g_file, dir, put_lines, x, err, errlen)) < 0)
        return rc;
    if (damaged)
        snprintf(err, errlen, "%s/%s: %d damaged or oversized line(s) skipped", dir,
                 KVP_PREFIX_FILE, damaged);
    return x->n;
}

/* An append's compaction: the file read and rewritten with a line per conversation. */
static int compact(const char *dir, char *err, size_t errlen)
{
    kvp_prefix_recs x = {0};
    int rc = kvp_prefix_file_load(&x, dir, err, errlen);
    kvp_prefix_recs_free(&x);
    return rc;
}

/* id's line (with its newline) in a malloc'd buffer, *line: its length, or a negative
 * code with a message (*line then NULL). */
static int line_alloc(char **line, const char *id, const char *tenant, const uint64_t *chain,
                      int n, char *err, size_t errlen)
{
    *line = malloc(KVP_PREFIX_FILE_LINE_MAX + 1);
    int len = *line ? kvp_prefix_line_format(*line, KVP_PREFIX_FILE_LINE_MAX + 1, id, tenant,
                                             chain, n) : -1;
    if (len < 0) {
        snprintf(err, errlen, "prefix index: %s", *line ? "invalid line" : "out of memory");
        len = *line ? -EINVAL : -ENOMEM;
        free(*line);
        *line = NULL;
    }
    return len;
}

int kvp_prefix_file_append(const char *dir, const char *id, const char *tenant,
                           const uint64_t *chain, int n, char *err, size_t errlen)
{
    char *line;
    int len = line_alloc(&line, id, tenant, chain, n, err, errlen);
    if (len < 0)
        return len;
    int rc = kvp_hintfile_append(&g_file, dir, line, (size_t)len, err, errlen);
    free(line);
    return rc;
}

/* ---- in a shared store ---- */

int kvp_prefix_store_put(struct kvp_store *st, const char *id, const char *tenant,
                         const uint64_t *chain, int n, char *err, size_t errlen)
{
    char *line;
    int len = line_alloc(&line, id, tenant, chain, n, err, errlen);
    if (len < 0)
        return len;
    int rc = kvp_store_hint_put(st, id, line, (size_t)len, err, errlen);
    free(line);
    return rc;
}

typedef struct store_read {
    kvp_prefix_recs *x;
    int damaged, oom;
    long seq;
} store_read;

static void store_line(void *ctx, const char *id, const void *val, size_t len)
{
    store_read *r = ctx;
    const char *line = val;
    kvp_prefix_rec rec;
    if (len < 1 || line[len - 1] != '\n' || kvp_prefix_line_parse(line, len - 1, &rec) < 0) {
        r->damaged++;
        return;
    }
    if (strcmp(rec.id, id) || rec.n == 0) {   /* another's line, or retired */
        r->damaged += rec.n > 0;
        free(rec.chain);
        return;
    }
    rec.seq = r->seq++;
    if (push(r->x, &rec) < 0) {
        free(rec.chain);
        r->oom = 1;
    }
}

int kvp_prefix_store_load(kvp_prefix_recs *x, struct kvp_store *st, char *err, size_t errlen)
{
    store_read r = {.x = x};
    int skipped = 0;
    err[0] = '\0';
    int rc = kvp_store_hint_each(st, KVP_PREFIX_FILE_LINE_MAX + 1, store_line, &r, &skipped,
                                 err, errlen);
    if (rc < 0)
        return rc;
    if (r.oom) {
        snprintf(err, errlen, "prefix index: out of memory reading the store's lines");
        return -ENOMEM;
    }
    keep_current(x, in_store, st);   /* (a scan may return a key twice) */
    if (r.damaged + skipped)
        snprintf(err, errlen, "prefix index: %d damaged or oversized hint(s) skipped",
                 r.damaged + skipped);
    return x->n;
}
