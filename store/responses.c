/* Stored responses (store/responses.h): the record framing, the tenants' table the
 * memory and directory kinds count their bounds in, and the three kinds. */
#include "store/responses.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "base/fileio.h"
#include "base/log.h"
#include "store/snapshot_impl.h"
#include "store/store_impl.h"

/* ---- the framing ---- */

/* magic, u32 tenant length, tenant, u32 id length, id, u64 payload length, payload, u64
 * FNV-1a of everything before it. */
static const char MAGIC[8] = {'K', 'V', 'P', 'R', 'E', 'S', 'P', '1'};
#define TENANT_MAX 32
#define SUFFIX ".resp"
#define SUBDIR "responses"

int kvp_resp_id_ok(const char *id)
{
    if (strncmp(id, KVP_RESP_ID_PREFIX, 5) != 0)
        return 0;
    int n = 0;
    for (const char *p = id + 5; *p; p++, n++)
        if (n == KVP_RESP_ID_HEX || !((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return n == KVP_RESP_ID_HEX;
}

static int tenant_ok(const char *t)
{
    size_t n = strlen(t);
    for (size_t i = 0; i < n; i++)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
            return 0;
    return n <= TENANT_MAX;
}

unsigned char *kvp_resp_encode(const char *tenant, const char *id, const void *payload,
                               size_t len, size_t *out_len)
{
    size_t tl = strlen(tenant), il = strlen(id);
    size_t n = sizeof MAGIC + 4 + tl + 4 + il + 8 + len + 8;
    kvp_wbuf w = {malloc(n), 0};
    if (!w.p)
        return NULL;
    kvp_w_bytes(&w, MAGIC, sizeof MAGIC);
    kvp_w_u32(&w, (uint32_t)tl);
    kvp_w_bytes(&w, tenant, tl);
    kvp_w_u32(&w, (uint32_t)il);
    kvp_w_bytes(&w, id, il);
    kvp_w_u64(&w, len);
    kvp_w_bytes(&w, payload, len);
    kvp_w_u64(&w, kvp_fnv1a(KVP_FNV1A_INIT, w.p, w.n));
    *out_len = w.n;
    return w.p;
}

/* A length-prefixed name of at most max bytes into dst[max + 1] at *at. */
static const char *name_at(const unsigned char *buf, size_t len, size_t *at, char *dst,
                           size_t max, const char *what)
{
    if (len - *at < 4)
        return what;
    uint32_t n = kvp_get_u32(buf + *at);
    *at += 4;
    if (n > max || len - *at < n)
        return what;
    memcpy(dst, buf + *at, n);
    dst[n] = 0;
    if (memchr(dst, 0, n))
        return what;
    *at += n;
    return NULL;
}

/* The header only (tenant and id), for the directory's table at open. */
static const char *decode_head(const unsigned char *buf, size_t len, char *tenant, char *id,
                               size_t *at)
{
    *at = sizeof MAGIC;
    if (len < sizeof MAGIC || memcmp(buf, MAGIC, sizeof MAGIC))
        return "not a stored response (bad magic)";
    const char *bad = name_at(buf, len, at, tenant, TENANT_MAX, "truncated or bad tenant");
    if (!bad)
        bad = name_at(buf, len, at, id, KVP_RESP_ID_LEN, "truncated or bad id");
    if (!bad && (!tenant_ok(tenant) || !kvp_resp_id_ok(id)))
        bad = "bad tenant or id";
    return bad;
}

const char *kvp_resp_decode(const unsigned char *buf, size_t len, char *tenant, size_t tlen,
                            char *id, size_t idlen, const unsigned char **payload,
                            size_t *plen)
{
    char t[TENANT_MAX + 1], i[KVP_RESP_ID_LEN + 1];
    size_t at;
    const char *bad = decode_head(buf, len, t, i, &at);
    if (bad)
        return bad;
    if (len - at < 8)
        return "truncated before the payload";
    uint64_t n = kvp_get_u64(buf + at);
    at += 8;
    if (n > KVP_RESP_PAYLOAD_MAX || len - at < n + 8)
        return "truncated payload";
    if (len - at != n + 8)
        return "bytes after the checksum";
    if (kvp_get_u64(buf + at + n) != kvp_fnv1a(KVP_FNV1A_INIT, buf, at + n))
        return "checksum mismatch";
    snprintf(tenant, tlen, "%s", t);
    snprintf(id, idlen, "%s", i);
    *payload = buf + at;
    *plen = (size_t)n;
    return NULL;
}

/* ---- the tenants' table (memory and directory) ---- */

typedef struct ent {
    char id[KVP_RESP_ID_LEN + 1];
    uint64_t bytes;
    char *payload;                /* memory: the payload (NUL-terminated); else NULL */
    size_t len;
} ent;

/* One tenant's records, oldest first. */
typedef struct tab {
    struct tab *next;
    char tenant[TENANT_MAX + 1];
    ent *v;
    int n, cap;
    uint64_t bytes;
} tab;

enum { K_MEMORY, K_DIR, K_REDIS };

struct kvp_resp_store {
    int kind;
    kvp_store *st;
    char dir[PATH_MAX];           /* the directory's responses/ */
    int dir_made;
    tab *tabs;
};

static tab *tab_of(kvp_resp_store *rs, const char *tenant, int create)
{
    for (tab *t = rs->tabs; t; t = t->next)
        if (!strcmp(t->tenant, tenant))
            return t;
    tab *t = create ? calloc(1, sizeof *t) : NULL;
    if (!t)
        return NULL;
    snprintf(t->tenant, sizeof t->tenant, "%s", tenant);
    t->next = rs->tabs;
    rs->tabs = t;
    return t;
}

static int tab_find(const tab *t, const char *id)
{
    for (int i = 0; t && i < t->n; i++)
        if (!strcmp(t->v[i].id, id))
            return i;
    return -1;
}

static void tab_drop(tab *t, int i)
{
    t->bytes -= t->v[i].bytes;
    free(t->v[i].payload);
    memmove(t->v + i, t->v + i + 1, (size_t)(t->n - i - 1) * sizeof *t->v);
    t->n--;
}

/* Appends id as the tenant's newest (replacing an entry of the same id); payload taken. */
static int tab_add(tab *t, const char *id, uint64_t bytes, char *payload, size_t len)
{
    int i = tab_find(t, id);
    if (i >= 0)
        tab_drop(t, i);
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        ent *v = realloc(t->v, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        t->v = v;
        t->cap = cap;
    }
    ent *e = &t->v[t->n++];
    snprintf(e->id, sizeof e->id, "%s", id);
    e->bytes = bytes;
    e->payload = payload;
    e->len = len;
    t->bytes += bytes;
    return 0;
}

static void tabs_free(kvp_resp_store *rs)
{
    for (tab *t = rs->tabs, *n; t; t = n) {
        n = t->next;
        while (t->n)
            tab_drop(t, t->n - 1);
        free(t->v);
        free(t);
    }
    rs->tabs = NULL;
}

/* ---- the directory ---- */

static int file_path(char *buf, size_t n, const kvp_resp_store *rs, const char *id,
                     const char *suffix)
{
    int w = snprintf(buf, n, "%s/%s%s", rs->dir, id, suffix);
    return w > 0 && (size_t)w < n ? 0 : -ENAMETOOLONG;
}

static int dir_sync(const kvp_resp_store *rs, char *err, size_t errlen)
{
    int dfd = kvp_snap_open_dir(rs->dir, err, errlen);
    if (dfd < 0)
        return dfd;
    int rc = fsync(dfd) < 0 ? kvp_snap_sys_err("fsync", rs->dir, err, errlen) : 0;
    close(dfd);
    return rc;
}

typedef struct found {
    char tenant[TENANT_MAX + 1], id[KVP_RESP_ID_LEN + 1];
    uint64_t bytes;
    struct timespec mtime;
} found;

static int older(const void *a, const void *b)
{
    const found *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->id, y->id);
}

/* Reads the header of one <id>.resp into *f; a damaged one is moved aside (warned). */
static int scan_one(kvp_resp_store *rs, const char *name, found *f)
{
    char path[PATH_MAX], err[PATH_MAX + 200] = "";
    if (snprintf(path, sizeof path, "%s/%s", rs->dir, name) >= (int)sizeof path)
        return 0;
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd < 0) {
        kvpd_log("warning", "stored response %s: %s", path, kvp_fileio_strerror(fd));
        return 0;
    }
    unsigned char head[sizeof MAGIC + 8 + TENANT_MAX + KVP_RESP_ID_LEN];
    long long got = kvp_read_full(fd, head, sizeof head);
    close(fd);
    size_t at;
    const char *bad = got < 0 ? "unreadable" : decode_head(head, (size_t)got, f->tenant, f->id, &at);
    size_t nl = strlen(name) - strlen(SUFFIX);
    if (!bad && (strlen(f->id) != nl || memcmp(f->id, name, nl)))
        bad = "its id is not its file's name";
    if (bad) {
        snprintf(err, sizeof err, "stored response %s: %s", path, bad);
        kvp_snap_move_aside(path, err, sizeof err);
        kvpd_log("warning", "%s", err);
        return 0;
    }
    f->bytes = (uint64_t)st.st_size;
    f->mtime = st.st_mtim;
    return 1;
}

static int dir_open(kvp_resp_store *rs, char *err, size_t errlen)
{
    DIR *d = opendir(rs->dir);
    if (!d)
        return errno == ENOENT ? 0 : kvp_snap_sys_err("open", rs->dir, err, errlen);
    rs->dir_made = 1;
    found *v = NULL;
    int n = 0, cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp")) {   /* an interrupted write */
            unlinkat(dirfd(d), e->d_name, 0);
            continue;
        }
        if (len <= strlen(SUFFIX) || strcmp(e->d_name + len - strlen(SUFFIX), SUFFIX))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            found *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
        }
        n += scan_one(rs, e->d_name, &v[n]);
    }
    closedir(d);
    if (n)
        qsort(v, (size_t)n, sizeof *v, older);
    for (int i = 0; rc == 0 && i < n; i++) {
        tab *t = tab_of(rs, v[i].tenant, 1);
        if (!t || tab_add(t, v[i].id, v[i].bytes, NULL, 0) < 0)
            rc = -ENOMEM;
    }
    free(v);
    if (rc < 0)
        snprintf(err, errlen, "stored responses: out of memory");
    else if (n)
        kvpd_log("info", "%s: %d stored response(s)", rs->dir, n);
    return rc;
}

static int dir_unlink(kvp_resp_store *rs, const char *id, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (file_path(path, sizeof path, rs, id, SUFFIX) < 0)
        return -ENAMETOOLONG;
    if (unlink(path) < 0 && errno != ENOENT)
        return kvp_snap_sys_err("remove", path, err, errlen);
    return 0;
}

static int dir_put(kvp_resp_store *rs, const char *id, const unsigned char *rec, size_t n,
                   char *err, size_t errlen)
{
    if (!rs->dir_made) {
        if (mkdir(rs->dir, 0700) < 0 && errno != EEXIST)
            return kvp_snap_sys_err("create", rs->dir, err, errlen);
        rs->dir_made = 1;
    }
    char tmp[PATH_MAX], final[PATH_MAX];
    if (file_path(tmp, sizeof tmp, rs, id, SUFFIX ".tmp") < 0 ||
        file_path(final, sizeof final, rs, id, SUFFIX) < 0) {
        snprintf(err, errlen, "%s: path too long", rs->dir);
        return -ENAMETOOLONG;
    }
    const void *parts[] = {rec};
    int rc = kvp_snap_write_file(tmp, final, parts, &n, 1, err, errlen);
    return rc < 0 ? rc : dir_sync(rs, err, errlen);
}

static int dir_get(kvp_resp_store *rs, const char *id, unsigned char **buf, size_t *len,
                   char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (file_path(path, sizeof path, rs, id, SUFFIX) < 0)
        return -ENOENT;
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd == -ENOENT)
        return -ENOENT;
    if (fd == -ELOOP || fd == KVP_E_NOT_REGULAR) {
        snprintf(err, errlen, "stored response %s: %s", path,
                 fd == -ELOOP ? "a symbolic link" : "not a regular file");
        kvp_snap_move_aside(path, err, errlen);
        return -EBADMSG;
    }
    if (fd < 0)
        return kvp_snap_sys_fail(fd, "open", path, err, errlen);
    size_t n = (size_t)st.st_size;
    if (n > KVP_RESP_PAYLOAD_MAX + 256) {
        close(fd);
        snprintf(err, errlen, "stored response %s: %zu bytes, more than a record holds", path, n);
        kvp_snap_move_aside(path, err, errlen);
        return -EBADMSG;
    }
    *buf = malloc(n ? n : 1);
    long long got = *buf ? kvp_read_full(fd, *buf, n) : -ENOMEM;
    close(fd);
    if (got < 0) {
        free(*buf);
        *buf = NULL;
        return kvp_snap_sys_fail((int)got, "read", path, err, errlen);
    }
    *len = (size_t)got;
    return 0;
}

/* ---- Redis ---- */

/* KEYS: the record, the tenant's ids by age (a sorted set), their bytes (a hash, the
 * total under "*"), the tenant's write counter. ARGV: the record, id, max count, max
 * bytes (0: none), the records' key prefix. Returns how many of the tenant's oldest went. */
static const char PUT_SCRIPT[] =
    KVP_REDIS_UNCOUNT_LUA
    "redis.call('SET', KEYS[1], ARGV[1])\n"
    "uncount(KEYS[2], KEYS[3], ARGV[2])\n"
    "local len = string.len(ARGV[1])\n"
    "redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[2])\n"
    "redis.call('HSET', KEYS[3], ARGV[2], len)\n"
    "redis.call('HINCRBY', KEYS[3], '*', len)\n"
    "local mc, mb, n = tonumber(ARGV[3]), tonumber(ARGV[4]), 0\n"
    "while true do\n"
    "  local total = tonumber(redis.call('HGET', KEYS[3], '*') or '0')\n"
    "  if not (redis.call('ZCARD', KEYS[2]) > mc or (mb > 0 and total > mb)) then break end\n"
    "  local old = redis.call('ZRANGE', KEYS[2], 0, 0)[1]\n"
    "  if not old or old == ARGV[2] then break end\n"
    "  redis.call('DEL', ARGV[5] .. old)\n"
    "  uncount(KEYS[2], KEYS[3], old)\n"
    "  n = n + 1\n"
    "end\n"
    "return n\n";

/* KEYS: the record, the tenant's sorted set and hash. ARGV: id. 1 deleted, 0 none of the
 * tenant's. */
static const char REMOVE_SCRIPT[] =
    KVP_REDIS_UNCOUNT_LUA
    "if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end\n"
    "redis.call('DEL', KEYS[1])\n"
    "uncount(KEYS[2], KEYS[3], ARGV[1])\n"
    "return 1\n";

typedef struct rkeys {
    char rec[64], ids[64], bytes[64], seq[64];
} rkeys;

static void redis_keys(rkeys *k, const char *tenant, const char *id)
{
    kvp_redis_key(k->rec, sizeof k->rec, "resp", id);
    kvp_redis_key(k->ids, sizeof k->ids, "tresp", tenant);
    kvp_redis_key(k->bytes, sizeof k->bytes, "trbytes", tenant);
    kvp_redis_key(k->seq, sizeof k->seq, "trseq", tenant);
}

/* One command; its integer answer, or a negative code with a message. */
static long long redis_int(kvp_resp_store *rs, int argc, const char **argv, const size_t *lens,
                           const char *what, char *err, size_t errlen)
{
    redisReply *rep = kvp_redis_command(rs->st, argc, argv, lens, err, errlen);
    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        if (rep)
            snprintf(err, errlen, "redis %s: %s", what,
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        freeReplyObject(rep);
        kvp_store_count_error(rs->st);
        return -EIO;
    }
    long long v = rep->integer;
    freeReplyObject(rep);
    return v;
}

static int redis_put(kvp_resp_store *rs, const char *tenant, const char *id,
                     const unsigned char *rec, size_t n, int max_count, uint64_t max_bytes,
                     int *dropped, char *err, size_t errlen)
{
    rkeys k;
    redis_keys(&k, tenant, id);
    char mc[16], mb[24];
    snprintf(mc, sizeof mc, "%d", max_count);
    snprintf(mb, sizeof mb, "%llu", (unsigned long long)max_bytes);
    const char *argv[] = {"EVAL", PUT_SCRIPT, "4", k.rec, k.ids, k.bytes, k.seq,
                          (const char *)rec, id, mc, mb, "resp:"};
    enum { ARGC = sizeof argv / sizeof argv[0] };
    size_t lens[ARGC];
    for (int i = 0; i < ARGC; i++)
        lens[i] = i == 7 ? n : strlen(argv[i]);
    long long v = redis_int(rs, ARGC, argv, lens, "stored response write", err, errlen);
    if (v < 0)
        return (int)v;
    *dropped = (int)v;
    return 0;
}

static int redis_get(kvp_resp_store *rs, const char *id, unsigned char **buf, size_t *len,
                     char *err, size_t errlen)
{
    char key[64];
    kvp_redis_key(key, sizeof key, "resp", id);
    const char *argv[] = {"GET", key};
    size_t lens[] = {3, strlen(key)};
    redisReply *rep = kvp_redis_command(rs->st, 2, argv, lens, err, errlen);
    if (!rep || (rep->type != REDIS_REPLY_STRING && rep->type != REDIS_REPLY_NIL)) {
        if (rep)
            snprintf(err, errlen, "redis stored response read: %s",
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        freeReplyObject(rep);
        kvp_store_count_error(rs->st);
        return -EIO;
    }
    int rc = 0;
    if (rep->type == REDIS_REPLY_NIL) {
        rc = -ENOENT;
    } else if (!(*buf = malloc(rep->len ? rep->len : 1))) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
    } else {
        memcpy(*buf, rep->str, rep->len);
        *len = rep->len;
    }
    freeReplyObject(rep);
    return rc;
}

/* ---- the calls ---- */

int kvp_resp_open(kvp_resp_store **out, kvp_store *st, char *err, size_t errlen)
{
    kvp_resp_store *rs = calloc(1, sizeof *rs);
    *out = NULL;
    if (!rs) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    rs->st = st;
    rs->kind = !st ? K_MEMORY : kvp_store_dir(st)[0] ? K_DIR : K_REDIS;
    if (rs->kind == K_DIR) {
        int w = snprintf(rs->dir, sizeof rs->dir, "%s/" SUBDIR, kvp_store_dir(st));
        int rc = w > 0 && (size_t)w < sizeof rs->dir ? dir_open(rs, err, errlen) : -ENAMETOOLONG;
        if (rc == -ENAMETOOLONG)
            snprintf(err, errlen, "%s: path too long", kvp_store_dir(st));
        if (rc < 0) {
            kvp_resp_close(rs);
            return rc;
        }
    }
    *out = rs;
    return 0;
}

void kvp_resp_close(kvp_resp_store *rs)
{
    if (!rs)
        return;
    tabs_free(rs);
    free(rs);
}

const char *kvp_resp_kind(const kvp_resp_store *rs)
{
    return rs->kind == K_MEMORY ? "memory" : rs->kind == K_DIR ? "dir" : "redis";
}

static int check_names(const char *tenant, const char *id, char *err, size_t errlen)
{
    if (!tenant_ok(tenant)) {
        snprintf(err, errlen, "not a tenant's name");
        return -EINVAL;
    }
    if (!kvp_resp_id_ok(id)) {
        snprintf(err, errlen, "not a response id");
        return -ENOENT;
    }
    return 0;
}

int kvp_resp_put(kvp_resp_store *rs, const char *tenant, const char *id, const void *payload,
                 size_t len, int max_count, uint64_t max_bytes, int *dropped, char *err,
                 size_t errlen)
{
    int d = 0, rc = check_names(tenant, id, err, errlen);
    if (dropped)
        *dropped = 0;
    if (rc < 0)
        return rc == -ENOENT ? -EINVAL : rc;
    if (len > KVP_RESP_PAYLOAD_MAX) {
        snprintf(err, errlen, "a stored response holds at most %u bytes", KVP_RESP_PAYLOAD_MAX);
        return -EFBIG;
    }
    if (max_count < 1)
        max_count = 1;
    size_t n;
    unsigned char *rec = kvp_resp_encode(tenant, id, payload, len, &n);
    if (!rec) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if (rs->kind == K_REDIS) {
        rc = redis_put(rs, tenant, id, rec, n, max_count, max_bytes, &d, err, errlen);
        free(rec);
        if (dropped)
            *dropped = d;
        return rc;
    }
    char *copy = NULL;
    if (rs->kind == K_MEMORY && (copy = malloc(len + 1))) {
        memcpy(copy, payload, len);
        copy[len] = 0;
    }
    tab *t = tab_of(rs, tenant, 1);
    if (!t || (rs->kind == K_MEMORY && !copy)) {
        free(rec);
        free(copy);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if (rs->kind == K_DIR)
        rc = dir_put(rs, id, rec, n, err, errlen);
    free(rec);
    if (rc == 0 && (rc = tab_add(t, id, n, copy, len)) < 0)
        snprintf(err, errlen, "out of memory");
    if (rc < 0) {
        free(copy);
        return rc;
    }
    /* the tenant's own oldest go; the one just written is the newest and stays */
    while (t->n > 1 && (t->n > max_count || (max_bytes && t->bytes > max_bytes))) {
        char why[PATH_MAX + 200] = "";
        if (rs->kind == K_DIR && dir_unlink(rs, t->v[0].id, why, sizeof why) < 0) {
            kvpd_log("warning", "max_stored_responses_per_tenant: %s", why);
            break;
        }
        tab_drop(t, 0);
        d++;
    }
    if (d && rs->kind == K_DIR)
        dir_sync(rs, err, errlen);
    if (dropped)
        *dropped = d;
    return 0;
}

int kvp_resp_get(kvp_resp_store *rs, const char *tenant, const char *id, char **out,
                 size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    int rc = check_names(tenant, id, err, errlen);
    if (rc < 0)
        return -ENOENT;
    if (rs->kind == K_MEMORY) {
        tab *t = tab_of(rs, tenant, 0);
        int i = tab_find(t, id);
        if (i < 0)
            return -ENOENT;
        if (!(*out = malloc(t->v[i].len + 1)))
            return -ENOMEM;
        memcpy(*out, t->v[i].payload, t->v[i].len + 1);
        *len = t->v[i].len;
        return 0;
    }
    unsigned char *buf = NULL;
    size_t n = 0;
    rc = rs->kind == K_DIR ? dir_get(rs, id, &buf, &n, err, errlen)
                           : redis_get(rs, id, &buf, &n, err, errlen);
    if (rc < 0) {
        if (rc == -EBADMSG) {   /* moved aside: no longer the tenant's */
            tab *t = tab_of(rs, tenant, 0);
            int i = tab_find(t, id);
            if (i >= 0)
                tab_drop(t, i);
        }
        return rc;
    }
    char rt[TENANT_MAX + 1], rid[KVP_RESP_ID_LEN + 1];
    const unsigned char *p;
    size_t plen;
    const char *bad = kvp_resp_decode(buf, n, rt, sizeof rt, rid, sizeof rid, &p, &plen);
    if (!bad && strcmp(rid, id))
        bad = "it names another id";
    if (bad) {
        free(buf);
        if (rs->kind == K_DIR) {
            char path[PATH_MAX + 16];
            if (file_path(path, sizeof path, rs, id, SUFFIX) < 0)
                path[0] = 0;
            snprintf(err, errlen, "stored response %s: %s", path, bad);
            kvp_snap_move_aside(path, err, errlen);
            tab *t = tab_of(rs, tenant, 0);
            int i = tab_find(t, id);
            if (i >= 0)
                tab_drop(t, i);
        } else {
            snprintf(err, errlen, "stored response resp:%s in redis: %s", id, bad);
        }
        return -EBADMSG;
    }
    if (strcmp(rt, tenant)) {   /* another tenant's: as if there were none */
        free(buf);
        return -ENOENT;
    }
    memmove(buf, p, plen);
    buf[plen] = 0;   /* the checksum's bytes followed it: there is room */
    *out = (char *)buf;
    *len = plen;
    return 0;
}

int kvp_resp_remove(kvp_resp_store *rs, const char *tenant, const char *id, char *err,
                    size_t errlen)
{
    if (check_names(tenant, id, err, errlen) < 0)
        return -ENOENT;
    if (rs->kind == K_REDIS) {
        rkeys k;
        redis_keys(&k, tenant, id);
        const char *argv[] = {"EVAL", REMOVE_SCRIPT, "3", k.rec, k.ids, k.bytes, id};
        enum { ARGC = sizeof argv / sizeof argv[0] };
        size_t lens[ARGC];
        for (int i = 0; i < ARGC; i++)
            lens[i] = strlen(argv[i]);
        long long v = redis_int(rs, ARGC, argv, lens, "stored response delete", err, errlen);
        return v < 0 ? (int)v : v == 1 ? 0 : -ENOENT;
    }
    tab *t = tab_of(rs, tenant, 0);
    int i = tab_find(t, id);
    if (i < 0)
        return -ENOENT;
    if (rs->kind == K_DIR) {
        int rc = dir_unlink(rs, id, err, errlen);
        if (rc == 0)
            rc = dir_sync(rs, err, errlen);   /* gone after a crash too */
        if (rc < 0)
            return rc;
    }
    tab_drop(t, i);
    return 0;
}

int kvp_resp_usage(kvp_resp_store *rs, const char *tenant, uint64_t *bytes)
{
    *bytes = 0;
    if (rs->kind != K_REDIS) {
        tab *t = tab_of(rs, tenant, 0);
        *bytes = t ? t->bytes : 0;
        return t ? t->n : 0;
    }
    rkeys k;
    redis_keys(&k, tenant, "x");
    char err[200];
    const char *zc[] = {"ZCARD", k.ids};
    size_t zl[] = {5, strlen(k.ids)};
    long long n = redis_int(rs, 2, zc, zl, "ZCARD", err, sizeof err);
    const char *hg[] = {"HGET", k.bytes, "*"};
    size_t hl[] = {4, strlen(k.bytes), 1};
    redisReply *rep = kvp_redis_command(rs->st, 3, hg, hl, err, sizeof err);
    if (rep && rep->type == REDIS_REPLY_STRING)
        *bytes = strtoull(rep->str, NULL, 10);
    freeReplyObject(rep);
    return n < 0 ? 0 : (int)n;
}
