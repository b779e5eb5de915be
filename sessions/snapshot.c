/* Session snapshots (docs/snapshot-format.md). Everything is validated before anything
 * is allocated from it, and a file that fails validation is moved aside so that it is
 * reported once and never retried. */
#include "sessions/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "base/fileio.h"
#include "sessions/utf8.h"

static const char SNAP_MAGIC[8] = {'K', 'V', 'P', 'S', 'N', 'A', 'P', '\0'};

enum { HEADER_BYTES = 16, SECTION_HEADER_BYTES = 16, TRAILER_BYTES = 8, N_SECTIONS = 5 };

/* Section tags in file order; every file (versions 1 and 2) has all of them. */
static const char SECTION_TAGS[N_SECTIONS][5] = {"IDEN", "CNTR", "MSGS", "TOKS", "CACH"};

/* The one parse failure that says nothing about the file. */
static const char OOM[] = "out of memory";

int kvp_snapshot_id_valid(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++) {
        char c = id[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-';
        if (!ok || n >= KVP_SNAPSHOT_ID_MAX)
            return 0;
    }
    return n > 0;
}

static int check_id(const char *id, char *err, size_t errlen)
{
    if (!id || !kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "invalid session id (1..%d characters of A-Z a-z 0-9 _ -)",
                 KVP_SNAPSHOT_ID_MAX);
        return -EINVAL;
    }
    return 0;
}

/* <dir>/<id><suffix> */
static int snap_path(char *buf, size_t n, const char *dir, const char *id, const char *suffix,
                     char *err, size_t errlen)
{
    int w = snprintf(buf, n, "%s/%s%s", dir, id, suffix);
    if (w < 0 || (size_t)w >= n) {
        snprintf(err, errlen, "snapshot path too long in %s", dir);
        return -ENAMETOOLONG;
    }
    return 0;
}

/* "what path: reason" for the negative errno rc (EIO when there is none); returns it. */
static int sys_fail(int rc, const char *what, const char *path, char *err, size_t errlen)
{
    int e = rc < 0 ? -rc : EIO;
    snprintf(err, errlen, "%s %s: %s", what, path, strerror(e));
    return -e;
}

static int sys_err(const char *what, const char *path, char *err, size_t errlen)
{
    return sys_fail(-errno, what, path, err, errlen);
}

/* ---- file hashing and identity ---- */

int kvp_snapshot_hash_file(const char *path, uint64_t max_bytes, uint64_t *hash,
                           char *err, size_t errlen)
{
    struct stat st;
    int fd = kvp_open_input(path, &st);   /* a FIFO in its place must not block */
    if (fd < 0)
        return sys_fail(fd, "open", path, err, errlen);
    unsigned char size_le[8];
    kvp_put_u64(size_le, (uint64_t)st.st_size);
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, size_le, 8);
    unsigned char chunk[65536];
    uint64_t left = max_bytes;
    while (left > 0) {
        ssize_t n = read(fd, chunk, left < sizeof chunk ? (size_t)left : sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int rc = sys_err("read", path, err, errlen);
            close(fd);
            return rc;
        }
        if (n == 0)
            break;
        h = kvp_fnv1a(h, chunk, (size_t)n);
        left -= (uint64_t)n;
    }
    close(fd);
    *hash = h;
    return 0;
}

static int copy_name(char *dst, const char *src, const char *what, char *err, size_t errlen)
{
    size_t n = strlen(src);
    if (n > KVP_SNAPSHOT_NAME_MAX) {
        snprintf(err, errlen, "%s name longer than %d bytes", what, KVP_SNAPSHOT_NAME_MAX);
        return -EINVAL;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

int kvp_snapshot_identity_init(kvp_snapshot_identity *ident, const char *model_name,
                               const char *model_path, const char *policy_name,
                               const char *policy_path, char *err, size_t errlen)
{
    memset(ident, 0, sizeof *ident);
    int rc;
    if ((rc = copy_name(ident->model_name, model_name, "model", err, errlen)) < 0 ||
        (rc = copy_name(ident->policy_name, policy_name, "policy", err, errlen)) < 0)
        return rc;
    if ((rc = kvp_snapshot_hash_file(model_path, KVP_SNAPSHOT_MODEL_HASH_BYTES,
                                     &ident->model_hash, err, errlen)) < 0)
        return rc;
    if (policy_path && policy_path[0])
        return kvp_snapshot_hash_file(policy_path, UINT64_MAX, &ident->policy_hash, err, errlen);
    return 0;
}

int kvp_snapshot_identity_equal(const kvp_snapshot_identity *a, const kvp_snapshot_identity *b)
{
    return a->model_hash == b->model_hash && a->policy_hash == b->policy_hash &&
           strcmp(a->model_name, b->model_name) == 0 &&
           strcmp(a->policy_name, b->policy_name) == 0;
}

/* ---- encoding ---- */

static void w_str(kvp_wbuf *w, const char *s)
{
    size_t n = strlen(s);
    kvp_w_u32(w, (uint32_t)n);
    kvp_w_bytes(w, s, n);
}

static void w_section(kvp_wbuf *w, int i, uint64_t len)
{
    kvp_w_bytes(w, SECTION_TAGS[i], 4);
    kvp_w_u32(w, 0);
    kvp_w_u64(w, len);
}

static int check_snapshot(const kvp_snapshot *s, char *err, size_t errlen)
{
    int rc = check_id(s->id, err, errlen);
    if (rc < 0)
        return rc;
    const char *why = NULL;
    if (strnlen(s->tenant, sizeof s->tenant) > KVP_SNAPSHOT_TENANT_MAX)
        why = "tenant not NUL-terminated";
    else if (strnlen(s->ident.model_name, sizeof s->ident.model_name) > KVP_SNAPSHOT_NAME_MAX ||
        strnlen(s->ident.policy_name, sizeof s->ident.policy_name) > KVP_SNAPSHOT_NAME_MAX)
        why = "model or policy name not NUL-terminated";
    else if (s->budget < 0 || s->turns < 0)
        why = "negative budget or turn count";
    else if (s->n_msgs < 0 || (s->n_msgs && !s->msgs))
        why = "bad message list";
    else if ((s->system_len && !s->system) || s->system_len > UINT32_MAX)
        why = "bad system text";
    else if (s->n_tokens < 0 || s->n_cached < 0 || s->n_cached > s->n_tokens ||
             (s->n_tokens && !s->tokens))
        why = "bad token list (n_cached must be within 0..n_tokens)";
    else if (!s->cache || s->cache_len == 0)
        why = "no serialized cache";
    else if (s->hist_msgs < 0 || s->hist_tokens < 0)
        why = "negative dropped history";
    for (int i = 0; !why && i < s->n_msgs; i++)
        if ((s->msgs[i].len && !s->msgs[i].text) || s->msgs[i].len > UINT32_MAX)
            why = "bad message text";
        else if (s->msgs[i].first_token < s->hist_tokens ||
                 s->msgs[i].first_token > s->hist_tokens + s->n_tokens ||
                 (i && s->msgs[i].first_token < s->msgs[i - 1].first_token))
            why = "a message's first token is outside the tokens or out of order";
    if (why) {
        snprintf(err, errlen, "snapshot %s: %s", s->id, why);
        return -EINVAL;
    }
    return 0;
}

/* Everything before the cache payload, including the cache section's header. */
static int encode_prefix(const kvp_snapshot *s, kvp_wbuf *w)
{
    size_t iden = 4 + strlen(s->id) + 4 + strlen(s->ident.model_name) + 8 +
                  4 + strlen(s->ident.policy_name) + 8 + 4 + 4 + strlen(s->tenant);
    size_t cntr = 4 + 8 + 8 + 8 + 4 + 8 + 8;
    size_t msgs = 4 + s->system_len + 4;
    for (int i = 0; i < s->n_msgs; i++)
        msgs += 1 + 4 + s->msgs[i].len + 8;
    size_t toks = 4 + 4 + 4 * (size_t)s->n_tokens;
    size_t total = HEADER_BYTES + N_SECTIONS * SECTION_HEADER_BYTES + iden + cntr + msgs + toks;
    w->p = malloc(total);
    w->n = 0;
    if (!w->p)
        return -ENOMEM;
    kvp_w_bytes(w, SNAP_MAGIC, 8);
    kvp_w_u32(w, KVP_SNAPSHOT_VERSION);
    kvp_w_u32(w, N_SECTIONS);

    w_section(w, 0, iden);
    w_str(w, s->id);
    w_str(w, s->ident.model_name);
    kvp_w_u64(w, s->ident.model_hash);
    w_str(w, s->ident.policy_name);
    kvp_w_u64(w, s->ident.policy_hash);
    kvp_w_u32(w, (uint32_t)s->budget);
    w_str(w, s->tenant);

    w_section(w, 1, cntr);
    kvp_w_u32(w, (uint32_t)s->turns);
    kvp_w_u64(w, s->evicted_rows);
    kvp_w_f64(w, s->created);
    kvp_w_f64(w, s->last_active);
    kvp_w_u32(w, (uint32_t)s->hist_msgs);
    kvp_w_u64(w, (uint64_t)s->hist_tokens);
    kvp_w_u64(w, s->hist_msgs ? s->hist_hash : KVP_FNV1A_INIT);

    w_section(w, 2, msgs);
    kvp_w_u32(w, (uint32_t)s->system_len);
    kvp_w_bytes(w, s->system, s->system_len);
    kvp_w_u32(w, (uint32_t)s->n_msgs);
    for (int i = 0; i < s->n_msgs; i++) {
        unsigned char role = s->msgs[i].user == 2 ? 2 : s->msgs[i].user ? 1 : 0;
        kvp_w_bytes(w, &role, 1);
        kvp_w_u32(w, (uint32_t)s->msgs[i].len);
        kvp_w_bytes(w, s->msgs[i].text, s->msgs[i].len);
        kvp_w_u64(w, (uint64_t)s->msgs[i].first_token);
    }

    w_section(w, 3, toks);
    kvp_w_u32(w, (uint32_t)s->n_tokens);
    kvp_w_u32(w, (uint32_t)s->n_cached);
    for (int i = 0; i < s->n_tokens; i++)
        kvp_w_u32(w, (uint32_t)s->tokens[i]);

    w_section(w, 4, s->cache_len);
    return 0;
}

static int open_dir(const char *dir, char *err, size_t errlen)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return sys_err("open state directory", dir, err, errlen);
    return fd;
}

int kvp_snapshot_write(const char *dir, const kvp_snapshot *snap, char *err, size_t errlen)
{
    int rc = check_snapshot(snap, err, errlen);
    if (rc < 0)
        return rc;
    char tmp[PATH_MAX], final[PATH_MAX];
    if ((rc = snap_path(tmp, sizeof tmp, dir, snap->id, ".snap.tmp", err, errlen)) < 0 ||
        (rc = snap_path(final, sizeof final, dir, snap->id, ".snap", err, errlen)) < 0)
        return rc;
    kvp_wbuf w;
    if (encode_prefix(snap, &w) < 0) {
        snprintf(err, errlen, "snapshot %s: out of memory", snap->id);
        return -ENOMEM;
    }
    uint64_t sum = kvp_fnv1a(kvp_fnv1a(KVP_FNV1A_INIT, w.p, w.n), snap->cache, snap->cache_len);
    unsigned char trailer[TRAILER_BYTES];
    kvp_put_u64(trailer, sum);

    int dfd = open_dir(dir, err, errlen);
    if (dfd < 0) {
        free(w.p);
        return dfd;
    }
    /* O_TRUNC: a .tmp left by a crash is simply overwritten. A FIFO in its place fails
     * (ENXIO: the open does not block) instead of blocking; it is no regular file anyway. */
    struct stat st;
    int fd = kvp_open_regular(tmp, O_WRONLY | O_CREAT | O_TRUNC, &st);
    if (fd == KVP_E_NOT_REGULAR) {
        snprintf(err, errlen, "snapshot %s: not a regular file", tmp);
        rc = -EINVAL;
        goto out;
    }
    if (fd < 0) {
        rc = sys_fail(fd, "create", tmp, err, errlen);
        goto out;
    }
    if ((rc = kvp_write_all(fd, w.p, w.n)) < 0 ||
        (rc = kvp_write_all(fd, snap->cache, snap->cache_len)) < 0 ||
        (rc = kvp_write_all(fd, trailer, sizeof trailer)) < 0) {
        rc = sys_fail(rc, "write", tmp, err, errlen);
    } else if (fsync(fd) < 0) {
        rc = sys_err("fsync", tmp, err, errlen);
    }
    if (close(fd) < 0 && rc == 0)
        rc = sys_err("close", tmp, err, errlen);
    if (rc == 0 && rename(tmp, final) < 0)
        rc = sys_err("rename to", final, err, errlen);
    if (rc < 0) {
        unlink(tmp);
        goto out;
    }
    /* The journal's records are all in the new snapshot now (a crash before this unlink
     * leaves them for replay to skip). The rename is durable once the directory is. */
    char journal[PATH_MAX];
    if (snap_path(journal, sizeof journal, dir, snap->id, ".journal", err, errlen) == 0 &&
        unlink(journal) < 0 && errno != ENOENT)
        rc = sys_err("remove", journal, err, errlen);
    if (rc == 0 && fsync(dfd) < 0)
        rc = sys_err("fsync state directory", dir, err, errlen);
out:
    close(dfd);
    free(w.p);
    return rc;
}

int kvp_snapshot_encode(const kvp_snapshot *snap, unsigned char **out, size_t *len,
                        char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    int rc = check_snapshot(snap, err, errlen);
    if (rc < 0)
        return rc;
    kvp_wbuf w;
    unsigned char *whole = NULL;
    if (encode_prefix(snap, &w) < 0 ||
        !(whole = realloc(w.p, w.n + snap->cache_len + TRAILER_BYTES))) {
        free(w.p);
        snprintf(err, errlen, "snapshot %s: out of memory", snap->id);
        return -ENOMEM;
    }
    w.p = whole;
    kvp_w_bytes(&w, snap->cache, snap->cache_len);
    kvp_w_u64(&w, kvp_fnv1a(KVP_FNV1A_INIT, w.p, w.n));
    *out = w.p;
    *len = w.n;
    return 0;
}

/* ---- decoding ---- */

/* A length-prefixed string into a fixed buffer of max+1 bytes; no embedded NULs. */
static int r_str(kvp_rbuf *r, char *dst, size_t max)
{
    uint32_t n;
    if (kvp_r_u32(r, &n) || n > max || kvp_r_bytes(r, dst, n) || memchr(dst, 0, n))
        return -1;
    dst[n] = 0;
    return 0;
}

static const char *parse_iden(kvp_rbuf *r, kvp_snapshot *s, const char *id)
{
    uint32_t budget;
    if (r_str(r, s->id, KVP_SNAPSHOT_ID_MAX) || r_str(r, s->ident.model_name, KVP_SNAPSHOT_NAME_MAX) ||
        kvp_r_u64(r, &s->ident.model_hash) || r_str(r, s->ident.policy_name, KVP_SNAPSHOT_NAME_MAX) ||
        kvp_r_u64(r, &s->ident.policy_hash) || kvp_r_u32(r, &budget))
        return "identity section inconsistent";
    if (strcmp(s->id, id) != 0)
        return "session id inside does not match the file name";
    if (budget > INT_MAX)
        return "budget out of range";
    s->budget = (int)budget;
    s->tenant[0] = '\0';
    if (s->version >= 4 && r_str(r, s->tenant, KVP_SNAPSHOT_TENANT_MAX))
        return "identity section inconsistent (tenant)";
    return NULL;
}

/* The history dropped before the stored transcript (version 2). */
static const char *parse_hist(kvp_rbuf *r, int *msgs, int64_t *tokens, uint64_t *hash)
{
    uint32_t m;
    uint64_t t;
    if (kvp_r_u32(r, &m) || kvp_r_u64(r, &t) || kvp_r_u64(r, hash))
        return "dropped history inconsistent";
    if (m > INT_MAX || t > INT64_MAX / 2)
        return "dropped history out of range";
    *msgs = (int)m;
    *tokens = (int64_t)t;
    if (!m)
        *hash = KVP_FNV1A_INIT;
    return NULL;
}

static const char *parse_cntr(kvp_rbuf *r, kvp_snapshot *s)
{
    uint32_t turns;
    if (kvp_r_u32(r, &turns) || kvp_r_u64(r, &s->evicted_rows) || kvp_r_f64(r, &s->created) ||
        kvp_r_f64(r, &s->last_active))
        return "counters section inconsistent";
    if (turns > INT_MAX || !isfinite(s->created) || !isfinite(s->last_active))
        return "counters out of range";
    s->turns = (int)turns;
    s->hist_hash = KVP_FNV1A_INIT;
    return s->version >= 3 ? parse_hist(r, &s->hist_msgs, &s->hist_tokens, &s->hist_hash) : NULL;
}

/* Messages are UTF-8 (they travel in JSON frames); a file from before that rule may hold
 * other bytes: each invalid sequence becomes U+FFFD. */
static const char *repair_utf8(kvp_snapshot_msg *m)
{
    if (kvp_utf8_valid(m->text, m->len))
        return NULL;
    kvp_utf8 u = {0};
    char *out = malloc(3 * m->len + 5);
    if (!out)
        return OOM;
    size_t n = kvp_utf8_feed(&u, m->text, m->len, out);
    n += kvp_utf8_flush(&u, out + n);
    out[n] = '\0';
    free(m->text);
    m->text = out;
    m->len = n;
    return NULL;
}

/* A message's or the system's text: len bytes, NUL-terminated, repaired to UTF-8. */
static const char *read_text(kvp_rbuf *r, uint32_t len, char **text, size_t *out_len)
{
    if (!(*text = malloc((size_t)len + 1)))
        return OOM;
    kvp_r_bytes(r, *text, len);
    (*text)[len] = 0;
    kvp_snapshot_msg m = {0, *text, len, -1};
    if (repair_utf8(&m))
        return OOM;
    *text = m.text;
    *out_len = m.len;
    return NULL;
}

static const char *parse_msgs(kvp_rbuf *r, kvp_snapshot *s, uint32_t version)
{
    uint32_t n;
    if (version >= 2) {   /* the system text first */
        uint32_t len;
        if (kvp_r_u32(r, &len) || len > r->n - r->off)
            return "system text inconsistent with the section length";
        if (len && read_text(r, len, &s->system, &s->system_len))
            return OOM;
    }
    /* Each message takes at least 5 bytes: bounds the allocation by the section. */
    if (kvp_r_u32(r, &n) || n > INT_MAX || n > (r->n - r->off) / 5)
        return "message count inconsistent with the section length";
    if (n && !(s->msgs = calloc(n, sizeof *s->msgs)))
        return OOM;
    for (uint32_t i = 0; i < n; i++) {
        unsigned char role;
        uint32_t len;
        if (kvp_r_bytes(r, &role, 1) || role > 2 || kvp_r_u32(r, &len) || len > r->n - r->off)
            return "message inconsistent with the section length";
        kvp_snapshot_msg *m = &s->msgs[i];
        s->n_msgs = (int)i + 1;
        m->user = role;
        m->first_token = -1;
        if (read_text(r, len, &m->text, &m->len))
            return OOM;
        uint64_t first;
        if (s->version >= 3) {
            if (kvp_r_u64(r, &first) || first > INT64_MAX / 2)
                return "message inconsistent with the section length";
            m->first_token = (int64_t)first;
        }
    }
    return NULL;
}

/* Version 3: each message's first token lies within the stored tokens, in order. */
static const char *check_first_tokens(const kvp_snapshot *s)
{
    for (int i = 0; s->version >= 3 && i < s->n_msgs; i++)
        if (s->msgs[i].first_token < s->hist_tokens ||
            s->msgs[i].first_token > s->hist_tokens + s->n_tokens ||
            (i && s->msgs[i].first_token < s->msgs[i - 1].first_token))
            return "a message's first token is outside the tokens or out of order";
    return NULL;
}

static const char *parse_toks(kvp_rbuf *r, kvp_snapshot *s)
{
    uint32_t n, cached;
    if (kvp_r_u32(r, &n) || kvp_r_u32(r, &cached) || n > INT_MAX || (size_t)n * 4 != r->n - r->off)
        return "token count inconsistent with the section length";
    if (cached > n)
        return "more cached tokens than tokens";
    if (n && !(s->tokens = malloc((size_t)n * sizeof *s->tokens)))
        return OOM;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = 0;
        kvp_r_u32(r, &t);   /* in bounds: the section length was checked */
        if (t > INT32_MAX)
            return "negative token id";
        s->tokens[i] = (int)t;
    }
    s->n_tokens = (int)n;
    s->n_cached = (int)cached;
    return NULL;
}

/* Validates buf[0..len) (the whole file) into *s. Returns NULL or why it is bad. On
 * success the cache blob is moved to the front of buf and buf is handed to s->cache. */
static const char *parse(unsigned char *buf, size_t len, const char *id, kvp_snapshot *s,
                         char *why, size_t whylen)
{
    kvp_rbuf r = {buf, len, 0};
    uint32_t version = 0, n_sections = 0;   /* read just below: the length was checked */
    if (len >= 8 && memcmp(buf, SNAP_MAGIC, 8) != 0)
        return "not a kvpd snapshot (bad magic)";
    if (len < HEADER_BYTES + TRAILER_BYTES) {
        snprintf(why, whylen, "truncated (%zu bytes)", len);
        return why;
    }
    r.off = 8;
    kvp_r_u32(&r, &version);
    kvp_r_u32(&r, &n_sections);
    if (version < 1 || version > KVP_SNAPSHOT_VERSION) {
        snprintf(why, whylen, "unsupported version %u (this kvpd reads 1 to %d)", version,
                 KVP_SNAPSHOT_VERSION);
        return why;
    }
    s->version = (int)version;
    if (n_sections != N_SECTIONS) {
        snprintf(why, whylen, "%u sections, version %u has %d", n_sections, version,
                 N_SECTIONS);
        return why;
    }
    /* Walk the section table against the file size before trusting the checksum, to
     * name what is missing. */
    r.n = len - TRAILER_BYTES;
    size_t start[N_SECTIONS], size[N_SECTIONS];
    for (int i = 0; i < N_SECTIONS; i++) {
        char tag[4];
        uint32_t reserved;
        uint64_t slen;
        if (kvp_r_bytes(&r, tag, 4) || kvp_r_u32(&r, &reserved) || kvp_r_u64(&r, &slen)) {
            snprintf(why, whylen, "truncated in the header of section %d (%s)", i,
                     SECTION_TAGS[i]);
            return why;
        }
        if (memcmp(tag, SECTION_TAGS[i], 4) != 0 || reserved != 0) {
            snprintf(why, whylen, "section %d is not %s", i, SECTION_TAGS[i]);
            return why;
        }
        if (slen > r.n - r.off) {
            snprintf(why, whylen, "truncated: section %s needs %llu bytes, %zu left",
                     SECTION_TAGS[i], (unsigned long long)slen, r.n - r.off);
            return why;
        }
        start[i] = r.off;
        size[i] = (size_t)slen;
        r.off += size[i];
    }
    if (r.off != r.n) {
        snprintf(why, whylen, "%zu bytes after the last section", r.n - r.off);
        return why;
    }
    kvp_rbuf t = {buf + len - TRAILER_BYTES, TRAILER_BYTES, 0};
    uint64_t want = 0;
    if (kvp_r_u64(&t, &want) || kvp_fnv1a(KVP_FNV1A_INIT, buf, len - TRAILER_BYTES) != want)
        return "checksum mismatch (corrupted)";

    const char *bad = NULL;
    for (int i = 0; i < N_SECTIONS - 1 && !bad; i++) {
        kvp_rbuf sec = {buf + start[i], size[i], 0};
        switch (i) {
        case 0: bad = parse_iden(&sec, s, id); break;
        case 1: bad = parse_cntr(&sec, s); break;
        case 2: bad = parse_msgs(&sec, s, version); break;
        default: bad = parse_toks(&sec, s); break;
        }
        if (!bad && sec.off != sec.n) {
            snprintf(why, whylen, "section %s has %zu unused bytes", SECTION_TAGS[i],
                     sec.n - sec.off);
            bad = why;
        }
    }
    if (!bad)
        bad = check_first_tokens(s);
    if (bad)
        return bad;
    if (size[N_SECTIONS - 1] == 0)
        return "empty cache section";
    s->cache_len = size[N_SECTIONS - 1];
    memmove(buf, buf + start[N_SECTIONS - 1], s->cache_len);
    unsigned char *shrunk = realloc(buf, s->cache_len);
    s->cache = shrunk ? shrunk : buf;
    return NULL;
}

int kvp_snapshot_decode(unsigned char *buf, size_t len, const char *id, kvp_snapshot *out,
                        char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int rc = check_id(id, err, errlen);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    char why[160];
    const char *bad = parse(buf, len, id, out, why, sizeof why);
    if (!bad)
        return 0;
    free(buf);
    kvp_snapshot_free(out);
    snprintf(err, errlen, "snapshot %s: %s", id, bad);
    return bad == OOM ? -ENOMEM : -EBADMSG;
}

/* Renames <id>.snap to <id>.snap.bad-<unix time>[-N] and appends the outcome to err. */
static void move_aside(const char *path, char *err, size_t errlen)
{
    char bad[PATH_MAX + 64];
    long long now = (long long)time(NULL);
    int w = snprintf(bad, sizeof bad, "%s.bad-%lld", path, now);
    struct stat st;
    for (int k = 1; k < 1000 && lstat(bad, &st) == 0; k++)
        w = snprintf(bad, sizeof bad, "%s.bad-%lld-%d", path, now, k);
    size_t used = strlen(err);
    if (w > 0 && (size_t)w < sizeof bad && rename(path, bad) == 0)
        snprintf(err + used, errlen - used, "; moved aside to %s", bad);
    else
        snprintf(err + used, errlen - used, "; could not move it aside: %s",
                 w > 0 && (size_t)w < sizeof bad ? strerror(errno) : "path too long");
}

int kvp_snapshot_read(const char *dir, const char *id, kvp_snapshot *out,
                      char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int rc = check_id(id, err, errlen);
    char path[PATH_MAX];
    if (rc < 0 || (rc = snap_path(path, sizeof path, dir, id, ".snap", err, errlen)) < 0)
        return rc;
    /* Non-blocking: a FIFO in its place must not hold the worker in open(). */
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd == -ENOENT) {
        snprintf(err, errlen, "no snapshot for session %s in %s", id, dir);
        return -ENOENT;
    }
    if (fd == -ELOOP || fd == KVP_E_NOT_REGULAR) {
        snprintf(err, errlen, "snapshot %s: %s", path,
                 fd == -ELOOP ? "a symbolic link, not a snapshot" : "not a regular file");
        move_aside(path, err, errlen);
        return -EBADMSG;
    }
    if (fd < 0)
        return sys_fail(fd, "open", path, err, errlen);
    size_t len = (size_t)st.st_size;
    unsigned char *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "snapshot %s: out of memory (%zu bytes)", path, len);
        return -ENOMEM;
    }
    /* A file that shrank under us reads short: validation reports it as truncated. */
    long long got = kvp_read_full(fd, buf, len);
    close(fd);
    if (got < 0) {
        free(buf);
        return sys_fail((int)got, "read", path, err, errlen);
    }
    char why[160];
    const char *bad = parse(buf, (size_t)got, id, out, why, sizeof why);
    if (!bad)
        return 0;
    free(buf);
    kvp_snapshot_free(out);
    if (bad == OOM) {
        snprintf(err, errlen, "snapshot %s: out of memory", path);
        return -ENOMEM;
    }
    snprintf(err, errlen, "snapshot %s: %s", path, bad);
    move_aside(path, err, errlen);
    return -EBADMSG;
}

void kvp_snapshot_free(kvp_snapshot *s)
{
    for (int i = 0; i < s->n_msgs; i++)
        free(s->msgs[i].text);
    free(s->msgs);
    free(s->system);
    free(s->tokens);
    free(s->cache);
    memset(s, 0, sizeof *s);
}

int kvp_snapshot_exists(const char *dir, const char *id)
{
    char path[PATH_MAX], err[256];
    struct stat st;
    return kvp_snapshot_id_valid(id) &&
           snap_path(path, sizeof path, dir, id, ".snap", err, sizeof err) == 0 &&
           stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int kvp_snapshot_remove(const char *dir, const char *id, char *err, size_t errlen)
{
    int rc = check_id(id, err, errlen);
    char path[PATH_MAX], tmp[PATH_MAX];
    if (rc < 0 || (rc = snap_path(path, sizeof path, dir, id, ".snap", err, errlen)) < 0 ||
        (rc = snap_path(tmp, sizeof tmp, dir, id, ".snap.tmp", err, errlen)) < 0)
        return rc;
    if (unlink(path) < 0 && errno != ENOENT)
        return sys_err("remove", path, err, errlen);
    if (unlink(tmp) < 0 && errno != ENOENT)
        return sys_err("remove", tmp, err, errlen);
    char journal[PATH_MAX];
    if ((rc = snap_path(journal, sizeof journal, dir, id, ".journal", err, errlen)) < 0)
        return rc;
    if (unlink(journal) < 0 && errno != ENOENT)
        return sys_err("remove", journal, err, errlen);
    /* Durable, so that a removed session does not come back after a crash. */
    int dfd = open_dir(dir, err, errlen);
    if (dfd < 0)
        return dfd;
    if (fsync(dfd) < 0)
        rc = sys_err("fsync state directory", dir, err, errlen);
    close(dfd);
    return rc;
}

int kvp_snapshot_clean(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return sys_err("open state directory", dir, err, errlen);
    static const char suffix[] = ".snap.tmp";
    const size_t sl = sizeof suffix - 1;
    int removed = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n <= sl || memcmp(e->d_name + n - sl, suffix, sl) != 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
            removed++;
        } else if (errno != ENOENT) {
            rc = sys_err("remove", e->d_name, err, errlen);
            break;
        }
    }
    closedir(d);
    return rc < 0 ? rc : removed;
}

/* ---- the journal: one record per turn between full snapshots ---- */

static const char JOURNAL_MAGIC[8] = {'K', 'V', 'P', 'J', 'R', 'N', 'L', '\0'};
/* 2: absolute "before" counts, each message's first token, the dropped history. */
enum { JOURNAL_VERSION = 2 };

/* Payload bytes of a record (docs/snapshot-format.md, "Journal"). */
static size_t record_size(const kvp_journal_rec *rec)
{
    size_t n = 4 + 8 + 8 + 4 + 4;
    for (int i = 0; i < rec->n_msgs; i++)
        n += 1 + 4 + rec->msgs[i].len + 8;
    return n + 8 + 4 + 4 * (size_t)rec->n_tokens + 4 + (4 + 8 + 8) + 8 + rec->cache_len;
}

int kvp_journal_append(const char *dir, const char *id, const kvp_journal_rec *rec,
                       size_t *size, char *err, size_t errlen)
{
    int rc = check_id(id, err, errlen);
    char path[PATH_MAX];
    if (rc < 0 || (rc = snap_path(path, sizeof path, dir, id, ".journal", err, errlen)) < 0)
        return rc;
    for (int i = 0; i < rec->n_msgs; i++)
        if (rec->msgs[i].len > UINT32_MAX) {
            snprintf(err, errlen, "journal %s: a message of %zu bytes", id, rec->msgs[i].len);
            return -E2BIG;
        }
    size_t payload = record_size(rec), id_len = strlen(id);
    kvp_wbuf w = {malloc(8 + 4 + 4 + id_len + 4 + payload + 8), 0};
    if (!w.p) {
        snprintf(err, errlen, "journal %s: out of memory", id);
        return -ENOMEM;
    }
    /* Non-blocking, no links, regular files only: as for snapshots. */
    struct stat st;
    int fd = kvp_open_regular(path, O_WRONLY | O_CREAT | O_APPEND, &st);
    if (fd == KVP_E_NOT_REGULAR) {
        snprintf(err, errlen, "journal %s: not a regular file", path);
        rc = -EINVAL;
    } else if (fd < 0) {
        rc = sys_fail(fd, "open", path, err, errlen);
    }
    if (rc < 0)
        goto out;
    if (st.st_size == 0) {   /* a new journal starts with its header */
        kvp_w_bytes(&w, JOURNAL_MAGIC, 8);
        kvp_w_u32(&w, JOURNAL_VERSION);
        kvp_w_u32(&w, (uint32_t)id_len);
        kvp_w_bytes(&w, id, id_len);
    }
    size_t rec_start = w.n;
    kvp_w_u32(&w, (uint32_t)payload);
    kvp_w_u32(&w, (uint32_t)rec->turns);
    kvp_w_u64(&w, rec->evicted_rows);
    kvp_w_f64(&w, rec->last_active);
    kvp_w_u32(&w, (uint32_t)rec->msgs_before);
    kvp_w_u32(&w, (uint32_t)rec->n_msgs);
    for (int i = 0; i < rec->n_msgs; i++) {
        unsigned char role = rec->msgs[i].user == 2 ? 2 : rec->msgs[i].user ? 1 : 0;
        kvp_w_bytes(&w, &role, 1);
        kvp_w_u32(&w, (uint32_t)rec->msgs[i].len);
        kvp_w_bytes(&w, rec->msgs[i].text, rec->msgs[i].len);
        kvp_w_u64(&w, (uint64_t)rec->msgs[i].first_token);
    }
    kvp_w_u64(&w, (uint64_t)rec->tokens_before);
    kvp_w_u32(&w, (uint32_t)rec->n_tokens);
    for (int i = 0; i < rec->n_tokens; i++)
        kvp_w_u32(&w, (uint32_t)rec->tokens[i]);
    kvp_w_u32(&w, (uint32_t)rec->n_cached);
    kvp_w_u32(&w, (uint32_t)rec->hist_msgs);
    kvp_w_u64(&w, (uint64_t)rec->hist_tokens);
    kvp_w_u64(&w, rec->hist_msgs ? rec->hist_hash : KVP_FNV1A_INIT);
    kvp_w_u64(&w, (uint64_t)rec->cache_len);
    kvp_w_bytes(&w, rec->cache, rec->cache_len);
    kvp_w_u64(&w, kvp_fnv1a(KVP_FNV1A_INIT, w.p + rec_start + 4, payload));
    if ((rc = kvp_write_all(fd, w.p, w.n)) < 0)
        rc = sys_fail(rc, "append to", path, err, errlen);
    else if (fsync(fd) < 0)
        rc = sys_err("fsync", path, err, errlen);
    if (!rc && st.st_size == 0) {   /* a new file: its directory entry must last too */
        int dfd = open_dir(dir, err, errlen);
        rc = dfd < 0 ? dfd : fsync(dfd) < 0 ? sys_err("fsync state directory", dir, err, errlen) : 0;
        if (dfd >= 0)
            close(dfd);
    }
    if (!rc)
        *size = (size_t)st.st_size + w.n;
out:
    if (fd >= 0)
        close(fd);
    free(w.p);
    return rc;
}

/* Drops the oldest messages and tokens of a replayed transcript up to the record's
 * dropped history. 0, or -1 when it does not fit the transcript. */
static int drop_front(kvp_snapshot *s, int hist_msgs, int64_t hist_tokens, uint64_t hash)
{
    int m = hist_msgs - s->hist_msgs;
    int64_t t = hist_tokens - s->hist_tokens;
    if (m < 0 || m > s->n_msgs || t < 0 || t > s->n_tokens)
        return -1;
    for (int i = 0; i < m; i++)
        free(s->msgs[i].text);
    s->n_msgs -= m;
    memmove(s->msgs, s->msgs + m, (size_t)s->n_msgs * sizeof *s->msgs);
    s->n_tokens -= (int)t;
    memmove(s->tokens, s->tokens + t, (size_t)s->n_tokens * sizeof *s->tokens);
    s->hist_msgs = hist_msgs;
    s->hist_tokens = hist_tokens;
    s->hist_hash = hist_msgs ? hash : KVP_FNV1A_INIT;
    return 0;
}

/* Applies one record's payload (journal `version`) to snap, or says why it does not
 * follow it. 1 applied, 0 skipped (the snapshot already holds it), -1 does not follow or
 * is malformed. Counts are of the whole conversation (version 1 had no dropped history,
 * so its counts are the same either way). */
static int apply_record(kvp_rbuf *r, kvp_snapshot *s, uint32_t version)
{
    uint32_t turns, msgs_before, n_msgs, n_tokens, cached, tb32, hist_m = 0;
    uint64_t evicted, cache_len, tokens_before, hist_t = 0, hist_h = KVP_FNV1A_INIT;
    double last;
    int v2 = version >= 2;
    if (kvp_r_u32(r, &turns) || kvp_r_u64(r, &evicted) || kvp_r_f64(r, &last) || kvp_r_u32(r, &msgs_before) ||
        kvp_r_u32(r, &n_msgs) || turns > INT_MAX || !isfinite(last))
        return -1;
    size_t msgs_at = r->off;
    for (uint32_t i = 0; i < n_msgs; i++) {   /* a first pass checks the lengths */
        unsigned char role;
        uint32_t len;
        if (kvp_r_bytes(r, &role, 1) || role > 2 || kvp_r_u32(r, &len) ||
            (uint64_t)len + (v2 ? 8 : 0) > r->n - r->off)
            return -1;
        r->off += len + (v2 ? 8 : 0);
    }
    if (v2 ? kvp_r_u64(r, &tokens_before) : (kvp_r_u32(r, &tb32) || (tokens_before = tb32, 0)))
        return -1;
    if (kvp_r_u32(r, &n_tokens) || (size_t)n_tokens * 4 > r->n - r->off)
        return -1;
    size_t tokens_at = r->off;
    r->off += (size_t)n_tokens * 4;
    if (kvp_r_u32(r, &cached) ||
        (v2 && (kvp_r_u32(r, &hist_m) || kvp_r_u64(r, &hist_t) || kvp_r_u64(r, &hist_h))) ||
        kvp_r_u64(r, &cache_len) || cache_len != r->n - r->off || !cache_len)
        return -1;
    uint64_t have_msgs = (uint64_t)s->hist_msgs + (uint64_t)s->n_msgs;
    uint64_t have_tokens = (uint64_t)s->hist_tokens + (uint64_t)s->n_tokens;
    uint64_t msgs_after = (uint64_t)msgs_before + n_msgs, tokens_after = tokens_before + n_tokens;
    if (msgs_after <= have_msgs && tokens_after <= have_tokens &&
        (msgs_before != have_msgs || tokens_before != have_tokens))
        return 0;   /* a crash between a full snapshot's rename and the journal's removal */
    if (msgs_before != have_msgs || tokens_before != have_tokens ||
        (uint64_t)s->n_msgs + n_msgs > INT_MAX || (uint64_t)s->n_tokens + n_tokens > INT_MAX ||
        hist_m > INT_MAX || hist_t > INT64_MAX / 2 || (v2 && hist_m == 0 && hist_t > 0))
        return -1;
    size_t new_msgs = (size_t)s->n_msgs + n_msgs, new_tokens = (size_t)s->n_tokens + n_tokens;
    kvp_snapshot_msg *m = realloc(s->msgs, new_msgs * sizeof *m + 1);
    int *t = realloc(s->tokens, new_tokens * sizeof *t + 1);
    void *cache = malloc((size_t)cache_len);
    if (m)
        s->msgs = m;
    if (t)
        s->tokens = t;
    if (!m || !t || !cache) {
        free(cache);
        return -1;
    }
    r->off = msgs_at;
    for (uint32_t i = 0; i < n_msgs; i++) {
        unsigned char role = 0;
        uint32_t len = 0;
        uint64_t first = 0;
        kvp_r_bytes(r, &role, 1);
        kvp_r_u32(r, &len);
        kvp_snapshot_msg *dst = &s->msgs[s->n_msgs];
        if (!(dst->text = malloc((size_t)len + 1))) {
            free(cache);
            return -1;
        }
        kvp_r_bytes(r, dst->text, len);
        dst->text[len] = '\0';
        dst->len = len;
        dst->user = role;
        dst->first_token = -1;
        s->n_msgs++;
        if (v2) {
            kvp_r_u64(r, &first);
            dst->first_token = first > INT64_MAX / 2 ? -1 : (int64_t)first;
        }
        if (repair_utf8(dst)) {
            free(cache);
            return -1;
        }
    }
    r->off = tokens_at;
    for (uint32_t i = 0; i < n_tokens; i++) {
        uint32_t id = 0;
        kvp_r_u32(r, &id);
        if (id > INT32_MAX) {
            free(cache);
            return -1;
        }
        s->tokens[s->n_tokens++] = (int)id;
    }
    r->off += 4 + (v2 ? 4 + 8 + 8 : 0) + 8;
    kvp_r_bytes(r, cache, (size_t)cache_len);
    if ((v2 && drop_front(s, (int)hist_m, (int64_t)hist_t, hist_h) < 0) ||
        cached > (uint32_t)s->n_tokens || check_first_tokens(s)) {
        free(cache);
        return -1;
    }
    free(s->cache);
    s->cache = cache;
    s->cache_len = (size_t)cache_len;
    s->n_cached = (int)cached;
    s->turns = (int)turns;
    s->evicted_rows = evicted;
    s->last_active = last;
    return 1;
}

int kvp_journal_replay(const char *dir, const char *id, kvp_snapshot *snap, size_t *size,
                       char *err, size_t errlen)
{
    *size = 0;
    int rc = check_id(id, err, errlen);
    char path[PATH_MAX];
    if (rc < 0 || (rc = snap_path(path, sizeof path, dir, id, ".journal", err, errlen)) < 0)
        return rc;
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd == -ENOENT)
        return 0;
    if (fd < 0) {   /* unreadable: the next write replaces it */
        snprintf(err, errlen, "journal %s: %s", path,
                 fd == KVP_E_NOT_REGULAR ? "not a regular file" : strerror(-fd));
        return 1;
    }
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    unsigned char *buf = malloc((size_t)st.st_size);
    long long n = buf ? kvp_read_full(fd, buf, (size_t)st.st_size) : -ENOMEM;
    close(fd);
    if (n < 0) {
        free(buf);
        snprintf(err, errlen, "journal %s: %s", path, strerror((int)-n));
        return 1;
    }
    size_t got = (size_t)n;
    kvp_rbuf r = {buf, got, 0};
    char jid[KVP_SNAPSHOT_ID_MAX + 1];
    uint32_t version;
    int clean = 0;
    if (got >= 8 && !memcmp(buf, JOURNAL_MAGIC, 8) && (r.off = 8, !kvp_r_u32(&r, &version)) &&
        version >= 1 && version <= JOURNAL_VERSION && !r_str(&r, jid, KVP_SNAPSHOT_ID_MAX) && !strcmp(jid, id)) {
        for (;;) {
            uint32_t len;
            uint64_t sum = 0;
            if (r.off == r.n) {
                clean = 1;
                break;
            }
            if (kvp_r_u32(&r, &len) || (size_t)len + 8 > r.n - r.off)
                break;   /* a torn last record */
            kvp_rbuf rec = {buf + r.off, len, 0};
            r.off += len;
            kvp_r_u64(&r, &sum);
            if (kvp_fnv1a(KVP_FNV1A_INIT, rec.p, len) != sum || apply_record(&rec, snap, version) < 0)
                break;
        }
    }
    free(buf);
    *size = got;
    if (!clean) {
        snprintf(err, errlen, "journal %s: a damaged or unrelated tail was ignored", path);
        return 1;
    }
    if (version != JOURNAL_VERSION) {   /* records of this version go to a new journal */
        snprintf(err, errlen, "journal %s: version %u, replaced by the next write", path, version);
        return 1;
    }
    return 0;
}
