/* The snapshot store: the calls every store answers, the directory store (the files of
 * sessions/snapshot.c), and the store's thread (lease renewals and releases, expiry). */
#include "sessions/store.h"

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
#include "sessions/store_impl.h"

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

static int dir_put(kvp_store *st, const kvp_snapshot *snap, size_t *bytes, char *err,
                   size_t errlen)
{
    int rc = kvp_snapshot_write(st->dir, snap, err, errlen);
    if (rc == 0 && dir_file_size(st, snap->id, ".snap", bytes) < 0)
        *bytes = 0;
    return rc;
}

static int dir_append(kvp_store *st, const char *id, const kvp_journal_rec *rec,
                      size_t *journal_bytes, size_t *bytes, char *err, size_t errlen)
{
    size_t before = *journal_bytes;
    int rc = kvp_journal_append(st->dir, id, rec, journal_bytes, err, errlen);
    *bytes = rc == 0 && *journal_bytes > before ? *journal_bytes - before : 0;
    return rc;
}

static int dir_get(kvp_store *st, const char *id, kvp_snapshot *out, size_t *journal_bytes,
                   int *journal_clean, char *jerr, size_t jerrlen, char *err, size_t errlen)
{
    int rc = kvp_snapshot_read(st->dir, id, out, err, errlen);
    if (rc < 0)
        return rc;
    *journal_clean = kvp_journal_replay(st->dir, id, out, journal_bytes, jerr, jerrlen) == 0;
    return 0;
}

static int dir_exists(kvp_store *st, const char *id)
{
    return kvp_snapshot_exists(st->dir, id);
}

static int dir_remove(kvp_store *st, const char *id, char *err, size_t errlen)
{
    return kvp_snapshot_remove(st->dir, id, err, errlen);
}

/* Calls fn(id, newest mtime of its .snap and .journal) for every <id>.snap. */
static int dir_walk(kvp_store *st, void (*fn)(kvp_store *st, const char *id, time_t mtime,
                                              void *ctx), void *ctx, char *err, size_t errlen)
{
    DIR *d = opendir(st->dir);
    if (!d) {
        snprintf(err, errlen, "open state directory %s: %s", st->dir, strerror(errno));
        return -errno;
    }
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n <= 5 || n - 5 > KVP_SNAPSHOT_ID_MAX || strcmp(e->d_name + n - 5, ".snap"))
            continue;
        kvp_store_id id;
        memcpy(id, e->d_name, n - 5);
        id[n - 5] = '\0';
        if (!kvp_snapshot_id_valid(id))
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
    if (kvp_snapshot_remove(st->dir, id, err, sizeof err) == 0) {
        x->removed++;
        kvpd_log("info", "session %.8s: snapshot unused for over snapshot_ttl (%.0f s), deleted",
                 id, st->ttl_s);
    } else {
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

static int set_find(const kvp_id_set *s, const char *id)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], id))
            return i;
    return -1;
}

static void set_add(kvp_id_set *s, const char *id)
{
    if (set_find(s, id) >= 0)
        return;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        kvp_store_id *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v)
            return;   /* not renewed: the lease runs out, a snapshot write renews it */
        s->v = v;
        s->cap = cap;
    }
    snprintf(s->v[s->n++], sizeof(kvp_store_id), "%s", id);
}

static void set_del(kvp_id_set *s, const char *id)
{
    int i = set_find(s, id);
    if (i >= 0)
        memcpy(s->v[i], s->v[--s->n], sizeof(kvp_store_id));
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Copies the set under the mutex: the Redis calls run without it. */
static int set_take(kvp_id_set *s, kvp_store_id **out, int clear)
{
    *out = NULL;
    if (!s->n)
        return 0;
    int n = s->n;
    if (!(*out = malloc((size_t)n * sizeof **out)))
        return 0;
    memcpy(*out, s->v, (size_t)n * sizeof **out);
    if (clear)
        s->n = 0;
    return n;
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
            kvp_store_id *ids;
            int n = set_take(&st->releasing, &ids, 1);
            pthread_mutex_unlock(&st->mu);
            st->ops->lease_batch(st, ids, n, 1);
            free(ids);
            pthread_mutex_lock(&st->mu);
            continue;
        }
        if (now >= next_renew) {
            kvp_store_id *ids;
            int n = set_take(&st->renewing, &ids, 0);
            pthread_mutex_unlock(&st->mu);
            if (n)
                st->ops->lease_batch(st, ids, n, 0);
            free(ids);
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
    st->lease_ms = p->lease_ms > 0 ? p->lease_ms : 10000;
    /* A quarter of the time to live, within a second and an hour. */
    st->expire_every_s = p->expire_every_s > 0 ? p->expire_every_s
                         : st->ttl_s / 4 < 1 ? 1 : st->ttl_s / 4 > 3600 ? 3600 : st->ttl_s / 4;
    pthread_mutex_init(&st->mu, NULL);
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
        for (int i = 0; i < st->renewing.n; i++)
            set_add(&st->releasing, st->renewing.v[i]);
        if (st->releasing.n)
            st->ops->lease_batch(st, st->releasing.v, st->releasing.n, 1);
    }
    if (st->ops && st->ops->close)
        st->ops->close(st);
    free(st->renewing.v);
    free(st->releasing.v);
    pthread_cond_destroy(&st->wake);
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

int kvp_store_put(kvp_store *st, const kvp_snapshot *snap, size_t *bytes, char *err,
                  size_t errlen)
{
    *bytes = 0;
    return counted(st, st->ops->put(st, snap, bytes, err, errlen));
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

int kvp_store_get(kvp_store *st, const char *id, kvp_snapshot *out, size_t *journal_bytes,
                  int *journal_clean, char *jerr, size_t jerrlen, char *err, size_t errlen)
{
    *journal_bytes = 0;
    *journal_clean = 1;
    if (jerrlen)
        jerr[0] = '\0';
    return counted(st, st->ops->get(st, id, out, journal_bytes, journal_clean, jerr, jerrlen,
                                    err, errlen));
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

int kvp_store_lease_take(kvp_store *st, const char *id, int *stored_turns, int *left_ms,
                         char *holder, size_t holder_len, char *err, size_t errlen)
{
    *stored_turns = -1;
    *left_ms = 0;
    if (holder_len)
        holder[0] = '\0';
    if (!st->ops->lease_take)
        return KVP_LEASE_HELD;
    int rc = counted(st, st->ops->lease_take(st, id, stored_turns, left_ms, holder, holder_len,
                                             err, errlen));
    pthread_mutex_lock(&st->mu);
    if (rc == KVP_LEASE_OTHER)
        st->stats.lease_conflicts++;
    else if (rc > 0) {
        set_del(&st->releasing, id);
        set_add(&st->renewing, id);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void kvp_store_lease_idle(kvp_store *st, const char *id)
{
    if (!st || !st->ops->lease_take)
        return;
    pthread_mutex_lock(&st->mu);
    set_del(&st->renewing, id);
    pthread_mutex_unlock(&st->mu);
}

void kvp_store_lease_drop(kvp_store *st, const char *id)
{
    if (!st || !st->ops->lease_take)
        return;
    pthread_mutex_lock(&st->mu);
    set_del(&st->renewing, id);
    set_add(&st->releasing, id);
    pthread_cond_signal(&st->wake);
    pthread_mutex_unlock(&st->mu);
}

void kvp_store_stats_get(kvp_store *st, kvp_store_stats *out)
{
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    out->leases_renewing = st->renewing.n;
    pthread_mutex_unlock(&st->mu);
}

void kvp_store_note_takeover(kvp_store *st)
{
    pthread_mutex_lock(&st->mu);
    st->stats.lease_takeovers++;
    pthread_mutex_unlock(&st->mu);
}
