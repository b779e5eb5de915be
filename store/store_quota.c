/* The state directory's bytes and snapshots per tenant (store/store.h, tenant_bytes_max
 * and tenant_snaps_max): every
 * snapshot's tenant, bytes (.snap plus .journal) and last use, read from the files'
 * headers at open and kept up to date by each write, read and removal. After a write
 * takes its tenant past the bound, that tenant's least recently used snapshots are
 * deleted until it fits, never one of a live session (in memory or attached: the live
 * set, checked under its mutex as the time to live's sweep does) nor the one just
 * written. So a flood of one-shot conversations under one key costs that key its own
 * oldest parked conversations, never another key's. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/fileio.h"
#include "base/log.h"
#include "store/snapshot_impl.h"
#include "store/store_impl.h"

typedef struct quota_ent {
    kvp_store_id id;
    char tenant[KVP_SNAPSHOT_TENANT_MAX + 1];
    uint64_t bytes;
    double used;                  /* wall clock of the last write or read */
} quota_ent;

typedef struct quota_tenant {
    char name[KVP_SNAPSHOT_TENANT_MAX + 1];
    uint64_t bytes;
    int n;                        /* snapshots */
} quota_tenant;

struct kvp_store_quota {
    quota_ent *v;                 /* sorted by id */
    int n, cap;
    quota_tenant *t;              /* one per tenant seen (as many as API keys, plus "") */
    int nt, capt;
};

static int quota_on(const kvp_store *st)
{
    return st->quota && (st->tenant_bytes_max || st->tenant_snaps_max);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int find(const struct kvp_store_quota *q, const char *id, int *at)
{
    return kvp_store_id_search(q->v, q->n, sizeof *q->v, offsetof(quota_ent, id), id, at);
}

static quota_tenant *tenant_get(struct kvp_store_quota *q, const char *name)
{
    for (int i = 0; i < q->nt; i++)
        if (!strcmp(q->t[i].name, name))
            return &q->t[i];
    if (q->nt == q->capt) {
        int cap = q->capt ? 2 * q->capt : 4;
        quota_tenant *t = realloc(q->t, (size_t)cap * sizeof *t);
        if (!t)
            return NULL;
        q->t = t;
        q->capt = cap;
    }
    quota_tenant *t = &q->t[q->nt++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->bytes = 0;
    t->n = 0;
    return t;
}

static void tenant_sub(struct kvp_store_quota *q, const char *name, uint64_t bytes)
{
    quota_tenant *t = tenant_get(q, name);
    if (t)
        t->bytes = t->bytes > bytes ? t->bytes - bytes : 0;
}

static void tenant_add(struct kvp_store_quota *q, const char *name, uint64_t bytes)
{
    quota_tenant *t = tenant_get(q, name);
    if (t)
        t->bytes += bytes;
}

/* The entry for id, added when missing (tenant, bytes 0); NULL when out of memory. */
static quota_ent *ent_get(struct kvp_store_quota *q, const char *id, const char *tenant)
{
    int at;
    if (find(q, id, &at))
        return &q->v[at];
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 64;
        quota_ent *v = realloc(q->v, (size_t)cap * sizeof *v);
        if (!v)
            return NULL;
        q->v = v;
        q->cap = cap;
    }
    memmove(q->v + at + 1, q->v + at, (size_t)(q->n - at) * sizeof *q->v);
    q->n++;
    quota_ent *e = &q->v[at];
    memset(e, 0, sizeof *e);
    snprintf(e->id, sizeof e->id, "%s", id);
    snprintf(e->tenant, sizeof e->tenant, "%s", tenant);
    quota_tenant *t = tenant_get(q, tenant);
    if (t)
        t->n++;
    return e;
}

static void ent_del(struct kvp_store_quota *q, const char *id)
{
    int at;
    if (!find(q, id, &at))
        return;
    tenant_sub(q, q->v[at].tenant, q->v[at].bytes);
    quota_tenant *t = tenant_get(q, q->v[at].tenant);
    if (t && t->n > 0)
        t->n--;
    memmove(q->v + at, q->v + at + 1, (size_t)(q->n - at - 1) * sizeof *q->v);
    q->n--;
}

/* The tenant a snapshot file names (its identity section, the first few hundred bytes).
 * 0, or -1 when the file cannot be read or is not a snapshot (its load will say why). */
static int read_tenant(const char *dir, const char *id, char *tenant, size_t len)
{
    char path[PATH_MAX];
    struct stat sb;
    int n = snprintf(path, sizeof path, "%s/%s.snap", dir, id);
    if (n < 0 || (size_t)n >= sizeof path)
        return -1;
    int fd = kvp_open_regular(path, O_RDONLY, &sb);
    if (fd < 0)
        return -1;
    unsigned char buf[1024];
    long long got = kvp_read_full(fd, buf, sizeof buf);
    close(fd);
    if (got < 0)
        return -1;
    kvp_rbuf r = {buf, (size_t)got, 0};
    uint32_t version, sections, zero, slen;
    uint64_t u64;
    char magic[8], tag[4], s[KVP_SNAPSHOT_NAME_MAX + 1];
    if (kvp_r_bytes(&r, magic, 8) || kvp_r_u32(&r, &version) || kvp_r_u32(&r, &sections) ||
        kvp_r_bytes(&r, tag, 4) || kvp_r_u32(&r, &zero) || kvp_r_u64(&r, &u64) ||
        memcmp(tag, "IDEN", 4))
        return -1;
    /* id, model name and hash, policy name and hash, budget, then (version 4) tenant */
    if (kvp_snap_r_str(&r, s, KVP_SNAPSHOT_ID_MAX) || kvp_snap_r_str(&r, s, KVP_SNAPSHOT_NAME_MAX) ||
        kvp_r_u64(&r, &u64) || kvp_snap_r_str(&r, s, KVP_SNAPSHOT_NAME_MAX) ||
        kvp_r_u64(&r, &u64) || kvp_r_u32(&r, &slen))
        return -1;
    char t[KVP_SNAPSHOT_TENANT_MAX + 1] = "";
    if (version >= 4 && kvp_snap_r_str(&r, t, KVP_SNAPSHOT_TENANT_MAX))
        return -1;
    snprintf(tenant, len, "%s", t);
    return 0;
}

static uint64_t file_bytes(const char *dir, const char *name, double *mtime)
{
    char path[PATH_MAX];
    struct stat sb;
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path || lstat(path, &sb) < 0 || !S_ISREG(sb.st_mode))
        return 0;
    if (mtime && (double)sb.st_mtime > *mtime)
        *mtime = (double)sb.st_mtime;
    return (uint64_t)sb.st_size;
}

int kvp_store_quota_open(kvp_store *st, char *err, size_t errlen)
{
    pthread_mutex_init(&st->quota_mu, NULL);
    st->quota = calloc(1, sizeof *st->quota);
    if (!st->quota) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if (!quota_on(st))
        return 0;
    DIR *d;
    int rc = kvp_store_opendir(st, &d, err, errlen);
    if (rc < 0)
        return rc;
    struct dirent *e;
    while ((e = readdir(d))) {
        kvp_store_id id;
        char tenant[KVP_SNAPSHOT_TENANT_MAX + 1], journal[KVP_SNAPSHOT_ID_MAX + 16];
        if (!kvp_store_snap_id(e->d_name, id) || read_tenant(st->dir, id, tenant, sizeof tenant) < 0)
            continue;
        double mtime = 0;
        snprintf(journal, sizeof journal, "%s.journal", id);
        uint64_t bytes = file_bytes(st->dir, e->d_name, &mtime) +
                         file_bytes(st->dir, journal, &mtime);
        quota_ent *q = ent_get(st->quota, id, tenant);
        if (!q)
            break;
        q->bytes = bytes;
        q->used = mtime;
        tenant_add(st->quota, tenant, bytes);
    }
    closedir(d);
    return 0;
}

void kvp_store_quota_close(kvp_store *st)
{
    if (!st->quota)
        return;
    free(st->quota->v);
    free(st->quota->t);
    free(st->quota);
    st->quota = NULL;
    pthread_mutex_destroy(&st->quota_mu);
}

void kvp_store_quota_put(kvp_store *st, const char *id, const char *tenant, uint64_t bytes)
{
    if (!quota_on(st))
        return;
    pthread_mutex_lock(&st->quota_mu);
    quota_ent *e = ent_get(st->quota, id, tenant);
    if (e) {
        tenant_sub(st->quota, e->tenant, e->bytes);
        if (strcmp(e->tenant, tenant)) {   /* counted under its new tenant */
            quota_tenant *was = tenant_get(st->quota, e->tenant), *now = tenant_get(st->quota, tenant);
            if (was && was->n > 0)
                was->n--;
            if (now)
                now->n++;
        }
        snprintf(e->tenant, sizeof e->tenant, "%s", tenant);
        e->bytes = bytes;
        e->used = wall_now();
        tenant_add(st->quota, tenant, bytes);
    }
    pthread_mutex_unlock(&st->quota_mu);
}

void kvp_store_quota_grow(kvp_store *st, const char *id, uint64_t bytes)
{
    if (!quota_on(st))
        return;
    pthread_mutex_lock(&st->quota_mu);
    int at;
    int known = find(st->quota, id, &at);
    pthread_mutex_unlock(&st->quota_mu);
    char tenant[KVP_SNAPSHOT_TENANT_MAX + 1] = "";
    if (!known && read_tenant(st->dir, id, tenant, sizeof tenant) < 0)
        return;   /* no snapshot under the journal: nothing a removal could free */
    pthread_mutex_lock(&st->quota_mu);
    quota_ent *e = ent_get(st->quota, id, tenant);
    if (e) {
        e->bytes += bytes;
        e->used = wall_now();
        tenant_add(st->quota, e->tenant, bytes);
    }
    pthread_mutex_unlock(&st->quota_mu);
}

void kvp_store_quota_touch(kvp_store *st, const char *id)
{
    if (!quota_on(st))
        return;
    pthread_mutex_lock(&st->quota_mu);
    int at;
    if (find(st->quota, id, &at))
        st->quota->v[at].used = wall_now();
    pthread_mutex_unlock(&st->quota_mu);
}

void kvp_store_quota_forget(kvp_store *st, const char *id)
{
    if (!quota_on(st))
        return;
    pthread_mutex_lock(&st->quota_mu);
    ent_del(st->quota, id);
    pthread_mutex_unlock(&st->quota_mu);
}

/* With live_mu held: the least recently used snapshot of the tenant that may go (not
 * live, not keep), copied into victim; 0 when its tenant fits or nothing may go. */
static int pick_victim(kvp_store *st, const char *tenant, const char *keep,
                       kvp_store_id victim)
{
    int found = 0;
    pthread_mutex_lock(&st->quota_mu);
    quota_tenant *t = tenant_get(st->quota, tenant);
    if (t && ((st->tenant_bytes_max && t->bytes > st->tenant_bytes_max) ||
              (st->tenant_snaps_max && t->n > st->tenant_snaps_max))) {
        double oldest = 0;
        for (int i = 0; i < st->quota->n; i++) {
            const quota_ent *e = &st->quota->v[i];
            if (strcmp(e->tenant, tenant) || !strcmp(e->id, keep) ||
                kvp_store_live_has_locked(st, e->id) || (found && e->used >= oldest))
                continue;
            oldest = e->used;
            memcpy(victim, e->id, sizeof(kvp_store_id));
            found = 1;
        }
    }
    pthread_mutex_unlock(&st->quota_mu);
    return found;
}

int kvp_store_quota_enforce(kvp_store *st, const char *id)
{
    if (!quota_on(st))
        return 0;
    char tenant[KVP_SNAPSHOT_TENANT_MAX + 1];
    pthread_mutex_lock(&st->quota_mu);
    int at;
    int known = find(st->quota, id, &at);
    if (known)
        memcpy(tenant, st->quota->v[at].tenant, sizeof tenant);
    pthread_mutex_unlock(&st->quota_mu);
    if (!known)
        return 0;
    int removed = 0;
    for (;;) {
        kvp_store_id victim;
        char err[256];
        /* Checked and taken out of reach under the live set's mutex (a rename: a read
         * that begins meanwhile finds the snapshot or nothing, never one deleted under a
         * session in memory); the files go after it, so the loop, which replaces the
         * set, never waits on the unlink and the directory's fsync. The temporary name is
         * the one an interrupted write leaves: never read, cleaned at start. */
        pthread_mutex_lock(&st->live_mu);
        int go = pick_victim(st, tenant, id, victim);
        char from[PATH_MAX], to[PATH_MAX];
        if (go) {
            snprintf(from, sizeof from, "%s/%s.snap", st->dir, victim);
            snprintf(to, sizeof to, "%s/%s.snap.tmp", st->dir, victim);
            if (rename(from, to) < 0 && errno != ENOENT)
                go = -errno;
        }
        pthread_mutex_unlock(&st->live_mu);
        if (!go)
            break;
        int rc = go < 0 ? go : kvp_snapshot_remove(st->dir, victim, err, sizeof err);
        if (go < 0)
            snprintf(err, sizeof err, "rename %.64s.snap: %s", victim, strerror(-go));
        if (rc < 0) {
            kvpd_log("warning", "max_state_bytes_per_tenant: %s", err);
            break;
        }
        kvp_store_quota_forget(st, victim);
        removed++;
        kvpd_log("info", "session %.8s: snapshot deleted, its tenant's snapshots were over "
                 "max_state_bytes_per_tenant (%llu bytes) or max_state_snapshots_per_tenant "
                 "(%d), least recently used first", victim,
                 (unsigned long long)st->tenant_bytes_max, st->tenant_snaps_max);
    }
    return removed;
}

uint64_t kvp_store_quota_tenant_bytes(kvp_store *st, const char *tenant, int *snapshots)
{
    if (snapshots)
        *snapshots = 0;
    if (st && !st->dir[0])
        return kvp_store_redis_quota_usage(st, tenant, snapshots);
    if (!st || !st->quota)
        return 0;
    pthread_mutex_lock(&st->quota_mu);
    uint64_t b = 0;
    for (int i = 0; i < st->quota->nt; i++)
        if (!strcmp(st->quota->t[i].name, tenant)) {
            b = st->quota->t[i].bytes;
            if (snapshots)
                *snapshots = st->quota->t[i].n;
        }
    pthread_mutex_unlock(&st->quota_mu);
    return b;
}
