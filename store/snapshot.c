/* The snapshot codec (docs/snapshot-format.md): session ids, the model identity, encoding
 * and decoding. Everything is validated before anything is allocated from it. The
 * state directory's files are in snapshot_dir.c, the journal in journal.c. */
#include "store/snapshot.h"
#include "store/snapshot_impl.h"

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
#include "base/utf8.h"

static const char SNAP_MAGIC[8] = {'K', 'V', 'P', 'S', 'N', 'A', 'P', '\0'};


/* Section tags in file order; every file (versions 1 and 2) has all of them. */
static const char SECTION_TAGS[N_SECTIONS][5] = {"IDEN", "CNTR", "MSGS", "TOKS", "CACH"};

/* The one parse failure that says nothing about the file. */
const char kvp_snap_oom[] = "out of memory";

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

int kvp_snap_check_id(const char *id, char *err, size_t errlen)
{
    if (!id || !kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "invalid session id (1..%d characters of A-Z a-z 0-9 _ -)",
                 KVP_SNAPSHOT_ID_MAX);
        return -EINVAL;
    }
    return 0;
}

/* <dir>/<id><suffix> */
int kvp_snap_path(char *buf, size_t n, const char *dir, const char *id, const char *suffix,
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
int kvp_snap_sys_fail(int rc, const char *what, const char *path, char *err, size_t errlen)
{
    int e = rc < 0 ? -rc : EIO;
    snprintf(err, errlen, "%s %s: %s", what, path, strerror(e));
    return -e;
}

int kvp_snap_sys_err(const char *what, const char *path, char *err, size_t errlen)
{
    return kvp_snap_sys_fail(-errno, what, path, err, errlen);
}

/* ---- file hashing and identity ---- */

int kvp_snapshot_hash_file(const char *path, uint64_t max_bytes, uint64_t *hash,
                           char *err, size_t errlen)
{
    struct stat st;
    int fd = kvp_open_input(path, &st);   /* a FIFO in its place must not block */
    if (fd < 0)
        return kvp_snap_sys_fail(fd, "open", path, err, errlen);
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
            int rc = kvp_snap_sys_err("read", path, err, errlen);
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

int kvp_snap_check(const kvp_snapshot *s, char *err, size_t errlen)
{
    int rc = kvp_snap_check_id(s->id, err, errlen);
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
int kvp_snap_encode_prefix(const kvp_snapshot *s, kvp_wbuf *w)
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

int kvp_snapshot_encode(const kvp_snapshot *snap, unsigned char **out, size_t *len,
                        char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    int rc = kvp_snap_check(snap, err, errlen);
    if (rc < 0)
        return rc;
    kvp_wbuf w;
    unsigned char *whole = NULL;
    if (kvp_snap_encode_prefix(snap, &w) < 0 ||
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
int kvp_snap_r_str(kvp_rbuf *r, char *dst, size_t max)
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
    if (kvp_snap_r_str(r, s->id, KVP_SNAPSHOT_ID_MAX) || kvp_snap_r_str(r, s->ident.model_name, KVP_SNAPSHOT_NAME_MAX) ||
        kvp_r_u64(r, &s->ident.model_hash) || kvp_snap_r_str(r, s->ident.policy_name, KVP_SNAPSHOT_NAME_MAX) ||
        kvp_r_u64(r, &s->ident.policy_hash) || kvp_r_u32(r, &budget))
        return "identity section inconsistent";
    if (strcmp(s->id, id) != 0)
        return "session id inside does not match the file name";
    if (budget > INT_MAX)
        return "budget out of range";
    s->budget = (int)budget;
    s->tenant[0] = '\0';
    if (s->version >= 4 && kvp_snap_r_str(r, s->tenant, KVP_SNAPSHOT_TENANT_MAX))
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
const char *kvp_snap_repair_utf8(kvp_snapshot_msg *m)
{
    if (kvp_utf8_valid(m->text, m->len))
        return NULL;
    kvp_utf8 u = {0};
    char *out = malloc(3 * m->len + 5);
    if (!out)
        return kvp_snap_oom;
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
        return kvp_snap_oom;
    kvp_r_bytes(r, *text, len);
    (*text)[len] = 0;
    kvp_snapshot_msg m = {0, *text, len, -1};
    if (kvp_snap_repair_utf8(&m))
        return kvp_snap_oom;
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
            return kvp_snap_oom;
    }
    /* Each message takes at least 5 bytes: bounds the allocation by the section. */
    if (kvp_r_u32(r, &n) || n > INT_MAX || n > (r->n - r->off) / 5)
        return "message count inconsistent with the section length";
    if (n && !(s->msgs = calloc(n, sizeof *s->msgs)))
        return kvp_snap_oom;
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
            return kvp_snap_oom;
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
const char *kvp_snap_check_first_tokens(const kvp_snapshot *s)
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
        return kvp_snap_oom;
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
const char *kvp_snap_parse(unsigned char *buf, size_t len, const char *id, kvp_snapshot *s,
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
        bad = kvp_snap_check_first_tokens(s);
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
    int rc = kvp_snap_check_id(id, err, errlen);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    char why[160];
    const char *bad = kvp_snap_parse(buf, len, id, out, why, sizeof why);
    if (!bad)
        return 0;
    free(buf);
    kvp_snapshot_free(out);
    snprintf(err, errlen, "snapshot %s: %s", id, bad);
    return bad == kvp_snap_oom ? -ENOMEM : -EBADMSG;
}

