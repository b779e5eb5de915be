/* Hints beside the Redis store's snapshots (store/store.h, kvp_store_hint_put): the key
 *   hint:<id>   a small value of the session's, PX snapshot_ttl
 * written after the snapshot, read back by a scan at start; deleted with the snapshot
 * (removal, a tenant's bounds) and its time to live renewed with it while the session is
 * live (store/store_redis.c, store_redis_quota.c). Not part of the write protocol: a
 * hint written by a node whose copy went stale, or one of a snapshot moved aside, may
 * outlive its snapshot for a while (the reader checks). */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_impl.h"

static int is_redis(const kvp_store *st)
{
    return st && !strcmp(st->kind, "redis");
}

static int bad_reply(redisReply *rep, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "redis %s: %s", what,
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    freeReplyObject(rep);
    return -EIO;
}

int kvp_store_hint_put(kvp_store *st, const char *id, const void *val, size_t len,
                       char *err, size_t errlen)
{
    if (!is_redis(st))
        return -ENOTSUP;
    if (!kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "hint: invalid session id");
        return -EINVAL;
    }
    char k[96], ttl[24];
    kvp_redis_key(k, sizeof k, "hint", id);
    snprintf(ttl, sizeof ttl, "%lld", (long long)(st->ttl_s * 1000));
    int argc = st->ttl_s > 0 ? 5 : 3;
    const char *argv[] = {"SET", k, val, "PX", ttl};
    size_t lens[] = {3, strlen(k), len, 2, strlen(ttl)};
    redisReply *rep = kvp_redis_command(st, argc, argv, lens, err, errlen);
    if (!rep) {
        kvp_store_count_error(st);
        return -EIO;
    }
    if (rep->type != REDIS_REPLY_STATUS)
        return bad_reply(rep, "SET hint", err, errlen);
    freeReplyObject(rep);
    return 0;
}

typedef struct hint_scan {
    kvp_store *st;
    size_t max;
    void (*fn)(void *ctx, const char *id, const void *val, size_t len);
    void *ctx;
    int *skipped;
    char *err;
    size_t errlen;
} hint_scan;

/* id's hint, at most max + 1 bytes of it read (GETRANGE): fn's, or counted in skipped
 * when longer or not a string. */
static int one(void *ctx, const char *id)
{
    const hint_scan *h = ctx;
    char k[96], end[24];
    kvp_redis_key(k, sizeof k, "hint", id);
    snprintf(end, sizeof end, "%zu", h->max);   /* bytes 0..max: one more than may be used */
    const char *argv[] = {"GETRANGE", k, "0", end};
    size_t lens[] = {8, strlen(k), 1, strlen(end)};
    redisReply *rep = kvp_redis_command(h->st, 4, argv, lens, h->err, h->errlen);
    if (!rep)
        return -EIO;
    if (rep->type == REDIS_REPLY_STRING && rep->len > 0 && (size_t)rep->len <= h->max)
        h->fn(h->ctx, id, rep->str, (size_t)rep->len);
    else if (!(rep->type == REDIS_REPLY_STRING && rep->len == 0))   /* "": gone meanwhile */
        (*h->skipped)++;
    freeReplyObject(rep);
    return 0;
}

int kvp_store_hint_each(kvp_store *st, size_t max,
                        void (*fn)(void *ctx, const char *id, const void *val, size_t len),
                        void *ctx, int *skipped, char *err, size_t errlen)
{
    *skipped = 0;
    if (!is_redis(st))
        return -ENOTSUP;
    hint_scan h = {st, max, fn, ctx, skipped, err, errlen};
    int rc = kvp_redis_scan(st, "hint", one, &h, err, errlen);
    return rc < 0 ? rc : 0;
}
