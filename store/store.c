/* The snapshot store: the calls every store answers, the directory store (the files of
 * sessions/snapshot.c), and the store's thread (lease renewals and releases, expiry). */
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "store/store_impl.h"

/* ---- redis:// URLs ---- */

int kvp_redis_url_parse(const char *url, kvp_redis_url *out, char *err, size_t errlen)
{
    static const char scheme[] = "redis://";
    memset(out, 0, sizeof *out);
    out->port = 6379;
    if (strncmp(url, scheme, sizeof scheme - 1) != 0) {
        snprintf(err, errlen, "state_url '%.64s': expected redis://HOST[:PORT][/DB]", url);
        return -EINVAL;
    }
    const char *h = url + sizeof scheme - 1, *end;
    if (*h == '[') {   /* [IPv6] */
        end = strchr(h, ']');
        if (!end || end == h + 1) {
            snprintf(err, errlen, "state_url: unterminated [address]");
            return -EINVAL;
        }
        h++;
    } else {
        end = h + strcspn(h, ":/");
    }
    size_t hl = (size_t)(end - h);
    if (hl == 0 || hl >= sizeof out->host) {
        snprintf(err, errlen, "state_url: %s host", hl ? "too long a" : "no");
        return -EINVAL;
    }
    for (size_t i = 0; i < hl; i++) {
        char c = h[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == ':' || c == '_')) {
            snprintf(err, errlen, "state_url: bad character in the host");
            return -EINVAL;
        }
    }
    memcpy(out->host, h, hl);
    const char *p = end + (*end == ']');
    /* a number: 1 to 7 digits, nothing else */
    long v;
    if (*p == ':') {
        char *e;
        p++;
        errno = 0;
        v = strtol(p, &e, 10);
        if (!(*p >= '0' && *p <= '9') || errno || e - p > 5 || v < 1 || v > 65535 ||
            (*e && *e != '/')) {
            snprintf(err, errlen, "state_url: the port must be 1..65535");
            return -EINVAL;
        }
        out->port = (int)v;
        p = e;
    }
    if (*p == '/' && p[1]) {
        char *e;
        p++;
        errno = 0;
        v = strtol(p, &e, 10);
        if (!(*p >= '0' && *p <= '9') || errno || *e || v < 0 || v > (1 << 20)) {
            snprintf(err, errlen, "state_url: the database must be a number (0..%d)", 1 << 20);
            return -EINVAL;
        }
        out->db = (int)v;
    } else if (*p && strcmp(p, "/") != 0) {
        snprintf(err, errlen, "state_url: unexpected '%.16s' after the host", p);
        return -EINVAL;
    }
    return 0;
}

/* ---- the directory store ---- */

static int dir_file_size(kvp_store *st, const char *id, const char *suffix, size_t *size)
{
    char path[PATH_MAX];
    struct stat sb;
    int n = snprintf(path, sizeof path, "%s/%s%s", st->dir, id, suffix);
    if (n < 0 || (size_t)n >= sizeof path || stat(path, &sb) < 0)
        return -1;
    *size = (size_t)sb.st_size;
    return 0;
}

void kvp_store_count_over_quota(kvp_store *st, int n)
{
    if (n > 0) {
        pthread_mutex_lock(&st->mu);
        st->stats.over_quota += (uint64_t)n;
        pthread_mutex_unlock(&st->mu);
    }
}

/* After a write of id: its tenant's oldest snapshots go while it is over the bound. */
static void dir_over_quota(kvp_store *st, const char *id)
{
    kvp_store_count_over_quota(st, kvp_store_quota_enforce(st, id));
}

static int dir_put(kvp_store *st, const kvp_snapshot *snap, kvp_store_fence *f,
                   size_t *bytes, char *err, size_t errlen)
{
    (void)f;   /* one node: always its own, never fenced */
    int rc = kvp_snapshot_write(st->dir, snap, err, errlen);
    if (rc == 0 && dir_file_size(st, snap->id, ".snap", bytes) < 0)
        *bytes = 0;
    if (rc == 0) {
        kvp_store_quota_put(st, snap->id, snap->tenant, *bytes);
        dir_over_quota(st, snap->id);
    }
    return rc;
}

static int dir_append(kvp_store *st, const char *id, const kvp_journal_rec *rec,
                      size_t *journal_bytes, size_t *bytes, char *err, size_t errlen)
{
    size_t before = *journal_bytes;
    int rc = kvp_journal_append(st->dir, id, rec, journal_bytes, err, errlen);
    *bytes = rc == 0 && *journal_bytes > before ? *journal_bytes - before : 0;
    if (rc == 0) {
        kvp_store_quota_grow(st, id, *bytes);
        dir_over_quota(st, id);
    }
    return rc;
}

static int dir_get(kvp_store *st, const char *id, kvp_snapshot *out, uint64_t *version,
                   size_t *journal_bytes, int *journal_clean, char *jerr, size_t jerrlen,
                   char *err, size_t errlen)
{
    (void)version;
    int rc = kvp_snapshot_read(st->dir, id, out, err, errlen);
    if (rc < 0)
        return rc;
    kvp_store_quota_touch(st, id);
    *journal_clean = kvp_journal_replay(st->dir, id, out, journal_bytes, jerr, jerrlen) == 0;
    return 0;
}

static int dir_exists(kvp_store *st, const char *id)
{
    return kvp_snapshot_exists(st->dir, id);
}

static int dir_remove(kvp_store *st, const char *id, char *err, size_t errlen)
{
    int rc = kvp_snapshot_remove(st->dir, id, err, errlen);
    if (rc == 0)
        kvp_store_quota_forget(st, id);
    return rc;
}

int kvp_store_opendir(const kvp_store *st, DIR **d, char *err, size_t errlen)
{
    if ((*d = opendir(st->dir)))
        return 0;
    int rc = -errno;
    snprintf(err, errlen, "open state directory %s: %s", st->dir, strerror(-rc));
    return rc;
}

int kvp_store_id_search(const void *base, int n, size_t stride, size_t off, const char *id,
                        int *at)
{
    const char *b = base;
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(b + (size_t)mid * stride + off, id);
        if (c == 0) {
            *at = mid;
            return 1;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *at = lo;
    return 0;
}

int kvp_store_snap_id(const char *name, kvp_store_id id)
{
    size_t n = strlen(name);
    if (n <= 5 || n - 5 > KVP_SNAPSHOT_ID_MAX || strcmp(name + n - 5, ".snap"))
        return 0;
    memcpy(id, name, n - 5);
    id[n - 5] = '\0';
    return kvp_snapshot_id_valid(id);
}

/* Calls fn(id, newest mtime of its .snap and .journal) for every <id>.snap. */
static int dir_walk(kvp_store *st, void (*fn)(kvp_store *st, const char *id, time_t mtime,
                                              void *ctx), void *ctx, char *err, size_t errlen)
{
    DIR *d;
    int rc = kvp_store_opendir(st, &d, err, errlen);
    if (rc < 0)
        return rc;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        kvp_store_id id;
        if (!kvp_store_snap_id(e->d_name, id))
            continue;
        struct stat sb;
        time_t mtime = 0;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            mtime = sb.st_mtime;
        char journal[KVP_SNAPSHOT_ID_MAX + 16];
        snprintf(journal, sizeof journal, "%s.journal", id);
        if (fstatat(dirfd(d), journal, &sb, AT_SYMLINK_NOFOLLOW) == 0 && sb.st_mtime > mtime)
            mtime = sb.st_mtime;
        fn(st, id, mtime, ctx);
        count++;
    }
    closedir(d);
    return count;
}

typedef struct list_ctx {
    void (*fn)(void *ctx, const char *id);
    void *ctx;
} list_ctx;

static void list_one(kvp_store *st, const char *id, time_t mtime, void *ctx)
{
    (void)st;
    (void)mtime;
    list_ctx *l = ctx;
    l->fn(l->ctx, id);
}

static int dir_list(kvp_store *st, void (*fn)(void *ctx, const char *id), void *ctx,
                    char *err, size_t errlen)
{
    list_ctx l = {fn, ctx};
    return dir_walk(st, list_one, &l, err, errlen);
}

typedef struct expire_ctx {
    time_t before;
    int removed;
} expire_ctx;

static void expire_one(kvp_store *st, const char *id, time_t mtime, void *ctx)
{
    expire_ctx *x = ctx;
    char err[256];
    if (mtime >= x->before)
        return;
    /* checked and deleted under the live set's mutex: a session read meanwhile is live */
    pthread_mutex_lock(&st->live_mu);
    int live = kvp_store_live_has_locked(st, id);
    int rc = live ? 1 : kvp_snapshot_remove(st->dir, id, err, sizeof err);
    pthread_mutex_unlock(&st->live_mu);
    if (rc == 0) {
        kvp_store_quota_forget(st, id);
        x->removed++;
        kvpd_log("info", "session %.8s: snapshot unused for over snapshot_ttl (%.0f s), deleted",
                 id, st->ttl_s);
    } else if (rc < 0) {
        kvpd_log("warning", "snapshot_ttl: %s", err);
    }
}

static int dir_expire(kvp_store *st, char *err, size_t errlen)
{
    if (st->ttl_s <= 0)
        return 0;
    expire_ctx x = {time(NULL) - (time_t)st->ttl_s, 0};
    int rc = dir_walk(st, expire_one, &x, err, errlen);
    return rc < 0 ? rc : x.removed;
}

static const kvp_store_ops dir_ops = {
    .put = dir_put, .append = dir_append, .get = dir_get, .exists = dir_exists,
    .remove = dir_remove, .list = dir_list, .expire = dir_expire,
};

/* ---- the store's thread ---- */

static int set_find(const kvp_lease_set *s, const char *id)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].id, id))
            return i;
    return -1;
}

/* The entry for id, added (zeroed) when missing; NULL when out of memory. */
static kvp_lease_ent *set_get(kvp_lease_set *s, const char *id)
{
    int i = set_find(s, id);
    if (i >= 0)
        return &s->v[i];
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        kvp_lease_ent *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v)
            return NULL;   /* not tracked: its writes take the lease again (a new token) */
        s->v = v;
        s->cap = cap;
    }
    kvp_lease_ent *e = &s->v[s->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->id, sizeof e->id, "%s", id);
    return e;
}

static void set_del(kvp_lease_set *s, const char *id)
{
    int i = set_find(s, id);
    if (i >= 0)
        s->v[i] = s->v[--s->n];
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Copies the entries (all, or those being renewed) under the mutex: the Redis calls run
 * without it. */
static int set_take(kvp_lease_set *s, kvp_lease_ent **out, int renewing_only, int clear)
{
    *out = NULL;
    if (!s->n || !(*out = malloc((size_t)s->n * sizeof **out)))
        return 0;
    int n = 0;
    for (int i = 0; i < s->n; i++)
        if (!renewing_only || s->v[i].renew)
            (*out)[n++] = s->v[i];
    if (clear)
        s->n = 0;
    return n;
}

/* Renewals answered: a lease renewed lasts lease_ms from before the call; one that is
 * no longer this node's is forgotten (its session's next job takes the lease again and
 * compares versions). */
static void note_renewals(kvp_store *st, const kvp_lease_ent *ents, int n,
                          const signed char *res, double t0)
{
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < n; i++) {
        int k = set_find(&st->held, ents[i].id);
        if (k < 0 || st->held.v[k].token != ents[i].token || res[i] < 0)
            continue;
        if (res[i] == 1) {
            st->held.v[k].until = t0 + st->lease_ms / 1000.0;
        } else {
            /* Kept with its token, run out: a write still under way carries that token
             * and is refused by the store, where a write with no token could take a
             * free lease anew. */
            kvpd_log("warning", "session %.8s: this node's lease was taken over or lost; "
                     "it is not renewed", ents[i].id);
            st->held.v[k].until = 0;
            st->held.v[k].renew = 0;
        }
    }
    pthread_mutex_unlock(&st->mu);
}

static void *store_thread(void *arg)
{
    kvp_store *st = arg;
    /* Renew at a third of the lease: two renewals may fail before it runs out. */
    double renew_every = st->ops->lease_batch ? st->lease_ms / 3000.0 : 1e9;
    double next_renew = mono_now() + renew_every, next_expire = mono_now() + st->expire_every_s;
    pthread_mutex_lock(&st->mu);
    while (!st->stopping) {
        double now = mono_now();
        if (st->ops->lease_batch && st->releasing.n) {
            kvp_lease_ent *ents;
            int n = set_take(&st->releasing, &ents, 0, 1);
            pthread_mutex_unlock(&st->mu);
            signed char *res = n ? malloc((size_t)n) : NULL;
            if (res)
                st->ops->lease_batch(st, ents, n, 1, res);
            free(res);
            free(ents);
            pthread_mutex_lock(&st->mu);
            continue;
        }
        if (now >= next_renew) {
            kvp_lease_ent *ents;
            int n = set_take(&st->held, &ents, 1, 0);
            pthread_mutex_unlock(&st->mu);
            signed char *res = n ? malloc((size_t)n) : NULL;
            if (res) {
                double t0 = mono_now();
                st->ops->lease_batch(st, ents, n, 0, res);
                note_renewals(st, ents, n, res, t0);
            }
            free(res);
            free(ents);
            pthread_mutex_lock(&st->mu);
            next_renew = mono_now() + renew_every;
            continue;
        }
        if (now >= next_expire) {
            pthread_mutex_unlock(&st->mu);
            char err[256];
            int rc = st->ops->expire(st, err, sizeof err);
            if (rc < 0)
                kvpd_log("warning", "snapshot_ttl: %s", err);
            pthread_mutex_lock(&st->mu);
            if (rc > 0)
                st->stats.expired += (uint64_t)rc;
            next_expire = mono_now() + st->expire_every_s;
            continue;
        }
        double wait = (next_renew < next_expire ? next_renew : next_expire) - now;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + wait;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        pthread_cond_timedwait(&st->wake, &st->mu, &until);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* ---- open, close ---- */

int kvp_store_open(kvp_store **out, const kvp_store_params *p, char *err, size_t errlen)
{
    *out = NULL;
    int redis = p->state_url && p->state_url[0];
    if (!redis && !(p->state_dir && p->state_dir[0]))
        return 0;
    kvp_store *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    st->ttl_s = p->ttl_s;
    st->tenant_bytes_max = p->tenant_bytes_max;
    st->tenant_snaps_max = p->tenant_snaps_max;
    st->lease_ms = p->lease_ms > 0 ? p->lease_ms : KVP_STORE_DEFAULT_LEASE_MS;
    /* A quarter of the time to live, within a second and an hour. */
    st->expire_every_s = p->expire_every_s > 0 ? p->expire_every_s
                         : st->ttl_s / 4 < 1 ? 1 : st->ttl_s / 4 > 3600 ? 3600 : st->ttl_s / 4;
    pthread_mutex_init(&st->mu, NULL);
    pthread_mutex_init(&st->live_mu, NULL);
    pthread_cond_init(&st->wake, NULL);
    if (p->node_id && p->node_id[0]) {
        snprintf(st->node, sizeof st->node, "%s", p->node_id);
    } else {
        char host[64] = "node";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        snprintf(st->node, sizeof st->node, "%.40s-%ld", host, (long)getpid());
    }
    int rc;
    if (redis) {
        st->kind = "redis";
        rc = kvp_store_redis_open(st, p->state_url, err, errlen);
    } else {
        st->kind = "dir";
        st->ops = &dir_ops;
        snprintf(st->dir, sizeof st->dir, "%s", p->state_dir);
        snprintf(st->where, sizeof st->where, "%s", p->state_dir);
        rc = kvp_snapshot_clean(st->dir, err, errlen);
        if (rc > 0)
            kvpd_log("info", "removed %d unfinished snapshot write(s) from %s", rc, st->dir);
        if (rc >= 0)
            rc = kvp_store_quota_open(st, err, errlen);
        if (rc >= 0 && (rc = dir_expire(st, err, errlen)) > 0)
            st->stats.expired += (uint64_t)rc;
    }
    if (rc >= 0 && (st->ttl_s > 0 || st->ops->lease_batch)) {
        rc = -pthread_create(&st->thread, NULL, store_thread, st);
        st->thread_on = rc == 0;
        if (rc < 0)
            snprintf(err, errlen, "store thread: %s", strerror(-rc));
    }
    if (rc < 0) {
        kvp_store_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

void kvp_store_close(kvp_store *st)
{
    if (!st)
        return;
    if (st->thread_on) {
        pthread_mutex_lock(&st->mu);
        st->stopping = 1;
        pthread_cond_signal(&st->wake);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->thread, NULL);
    }
    /* Every lease still held goes now, so another node can take the sessions at once. */
    if (st->ops && st->ops->lease_batch) {
        for (int i = 0; i < st->held.n; i++) {
            kvp_lease_ent *e = set_get(&st->releasing, st->held.v[i].id);
            if (e)
                e->token = st->held.v[i].token;
        }
        signed char *res = st->releasing.n ? malloc((size_t)st->releasing.n) : NULL;
        if (res)
            st->ops->lease_batch(st, st->releasing.v, st->releasing.n, 1, res);
        free(res);
    }
    if (st->ops && st->ops->close)
        st->ops->close(st);
    free(st->held.v);
    free(st->releasing.v);
    free(st->live);
    kvp_store_quota_close(st);
    pthread_cond_destroy(&st->wake);
    pthread_mutex_destroy(&st->live_mu);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* ---- the calls ---- */

const char *kvp_store_kind(const kvp_store *st) { return st->kind; }
const char *kvp_store_where(const kvp_store *st) { return st->where; }
const char *kvp_store_dir(const kvp_store *st) { return st->dir; }
const char *kvp_store_node(const kvp_store *st) { return st->node; }

void kvp_store_count_error(kvp_store *st)
{
    pthread_mutex_lock(&st->mu);
    st->stats.errors++;
    pthread_mutex_unlock(&st->mu);
}

static int counted(kvp_store *st, int rc)
{
    if (rc < 0 && rc != -ENOENT && rc != -ESTALE && rc != -EBADMSG)
        kvp_store_count_error(st);
    return rc;
}

/* The token of the lease held for id (0: none known). */
static uint64_t held_token(kvp_store *st, const char *id)
{
    pthread_mutex_lock(&st->mu);
    int i = set_find(&st->held, id);
    uint64_t t = i >= 0 ? st->held.v[i].token : 0;
    pthread_mutex_unlock(&st->mu);
    return t;
}

/* A call that took or renewed the lease with this token (sent at t0). */
static void note_held(kvp_store *st, const char *id, uint64_t token, double t0)
{
    kvp_lease_ent *e = set_get(&st->held, id);
    if (!e)
        return;
    e->token = token;
    e->until = t0 + st->lease_ms / 1000.0;
}

static int put_fenced(kvp_store *st, const kvp_snapshot *snap, uint64_t *version,
                      size_t *bytes, int live, char *err, size_t errlen)
{
    *bytes = 0;
    int leases = st->ops->lease_take != NULL;
    kvp_store_fence f = {leases ? held_token(st, snap->id) : 0, *version, live};
    kvp_store_live_add(st, snap->id);
    double t0 = mono_now();
    int rc = counted(st, st->ops->put(st, snap, &f, bytes, err, errlen));
    if (leases) {
        pthread_mutex_lock(&st->mu);
        if (rc == 0) {
            note_held(st, snap->id, f.token, t0);
            set_del(&st->releasing, snap->id);
        } else if (rc == -ESTALE) {
            set_del(&st->held, snap->id);   /* not ours: the next job takes it again */
        }
        pthread_mutex_unlock(&st->mu);
    }
    if (rc == 0)
        *version = f.version;
    return rc;
}

int kvp_store_put(kvp_store *st, const kvp_snapshot *snap, uint64_t *version, size_t *bytes,
                  char *err, size_t errlen)
{
    return put_fenced(st, snap, version, bytes, 0, err, errlen);
}

int kvp_store_put_leased(kvp_store *st, const kvp_snapshot *snap, uint64_t *version,
                         size_t *bytes, char *err, size_t errlen)
{
    return put_fenced(st, snap, version, bytes, 1, err, errlen);
}

int kvp_store_has_journal(const kvp_store *st)
{
    return st->ops->append != NULL;
}

int kvp_store_append(kvp_store *st, const char *id, const kvp_journal_rec *rec,
                     size_t *journal_bytes, size_t *bytes, char *err, size_t errlen)
{
    *bytes = 0;
    if (!st->ops->append) {
        snprintf(err, errlen, "this store keeps no journal");
        return -ENOTSUP;
    }
    return counted(st, st->ops->append(st, id, rec, journal_bytes, bytes, err, errlen));
}

int kvp_store_get(kvp_store *st, const char *id, kvp_snapshot *out, uint64_t *version,
                  size_t *journal_bytes, int *journal_clean, char *jerr, size_t jerrlen,
                  char *err, size_t errlen)
{
    *version = 0;
    *journal_bytes = 0;
    *journal_clean = 1;
    if (jerrlen)
        jerr[0] = '\0';
    kvp_store_live_add(st, id);   /* before the read: the sweep now leaves it */
    return counted(st, st->ops->get(st, id, out, version, journal_bytes, journal_clean, jerr,
                                    jerrlen, err, errlen));
}

int kvp_store_exists(kvp_store *st, const char *id)
{
    return st->ops->exists(st, id);
}

int kvp_store_remove(kvp_store *st, const char *id, char *err, size_t errlen)
{
    return counted(st, st->ops->remove(st, id, err, errlen));
}

int kvp_store_list(kvp_store *st, void (*fn)(void *ctx, const char *id), void *ctx,
                   char *err, size_t errlen)
{
    return counted(st, st->ops->list(st, fn, ctx, err, errlen));
}

int kvp_store_expire(kvp_store *st, char *err, size_t errlen)
{
    int rc = counted(st, st->ops->expire(st, err, errlen));
    if (rc > 0) {
        pthread_mutex_lock(&st->mu);
        st->stats.expired += (uint64_t)rc;
        pthread_mutex_unlock(&st->mu);
    }
    return rc;
}

int kvp_store_has_leases(const kvp_store *st)
{
    return st && st->ops->lease_take != NULL;
}

int kvp_store_lease_take(kvp_store *st, const char *id, int *stored_turns,
                         uint64_t *stored_version, int *left_ms, char *holder,
                         size_t holder_len, char *err, size_t errlen)
{
    *stored_turns = -1;
    *stored_version = 0;
    *left_ms = 0;
    if (holder_len)
        holder[0] = '\0';
    if (!st->ops->lease_take)
        return KVP_LEASE_HELD;
    uint64_t token = held_token(st, id);
    double t0 = mono_now();
    int rc = counted(st, st->ops->lease_take(st, id, &token, stored_turns, stored_version,
                                             left_ms, holder, holder_len, err, errlen));
    pthread_mutex_lock(&st->mu);
    if (rc == KVP_LEASE_OTHER) {
        st->stats.lease_conflicts++;
        set_del(&st->held, id);
    } else if (rc > 0) {
        /* A release queued before this take must not remove it: the release carries
         * the older token, and the take issued a new one. */
        set_del(&st->releasing, id);
        note_held(st, id, token, t0);
        int i = set_find(&st->held, id);
        if (i >= 0)
            st->held.v[i].renew = 1;
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int kvp_store_lease_left_ms(kvp_store *st, const char *id)
{
    if (!st || !st->ops->lease_take)
        return INT_MAX;
    pthread_mutex_lock(&st->mu);
    int i = set_find(&st->held, id);
    double left = i >= 0 ? st->held.v[i].until - mono_now() : 0;
    pthread_mutex_unlock(&st->mu);
    return left <= 0 ? 0 : left * 1000 >= INT_MAX ? INT_MAX : (int)(left * 1000);
}

int kvp_store_lease_margin_ms(const kvp_store *st)
{
    if (!st || !st->ops->lease_take)
        return 0;
    int m = st->lease_ms / 5;
    return m > 0 ? m : 1;
}

void kvp_store_lease_idle(kvp_store *st, const char *id)
{
    if (!st || !st->ops->lease_take)
        return;
    pthread_mutex_lock(&st->mu);
    int i = set_find(&st->held, id);
    if (i >= 0)
        st->held.v[i].renew = 0;
    pthread_mutex_unlock(&st->mu);
}

void kvp_store_lease_drop(kvp_store *st, const char *id)
{
    if (!st || !st->ops->lease_take)
        return;
    pthread_mutex_lock(&st->mu);
    int i = set_find(&st->held, id);
    if (i >= 0) {
        /* released with the token held now: a later take's lease is never removed */
        kvp_lease_ent *e = set_get(&st->releasing, id);
        if (e)
            e->token = st->held.v[i].token;
        set_del(&st->held, id);
        pthread_cond_signal(&st->wake);
    }
    pthread_mutex_unlock(&st->mu);
}

void kvp_store_stats_get(kvp_store *st, kvp_store_stats *out)
{
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    out->leases_renewing = 0;
    for (int i = 0; i < st->held.n; i++)
        out->leases_renewing += st->held.v[i].renew;
    pthread_mutex_unlock(&st->mu);
}

void kvp_store_note_takeover(kvp_store *st)
{
    pthread_mutex_lock(&st->mu);
    st->stats.lease_takeovers++;
    pthread_mutex_unlock(&st->mu);
}
