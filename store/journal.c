/* The journal: one record per turn appended to <id>.journal between full snapshots, and
 * its replay onto the last snapshot (docs/snapshot-format.md, "Journal"). */
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
    int rc = kvp_snap_check_id(id, err, errlen);
    char path[PATH_MAX];
    if (rc < 0 || (rc = kvp_snap_path(path, sizeof path, dir, id, ".journal", err, errlen)) < 0)
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
        rc = kvp_snap_sys_fail(fd, "open", path, err, errlen);
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
        rc = kvp_snap_sys_fail(rc, "append to", path, err, errlen);
    else if (fsync(fd) < 0)
        rc = kvp_snap_sys_err("fsync", path, err, errlen);
    if (!rc && st.st_size == 0) {   /* a new file: its directory entry must last too */
        int dfd = kvp_snap_open_dir(dir, err, errlen);
        rc = dfd < 0 ? dfd : fsync(dfd) < 0 ? kvp_snap_sys_err("fsync state directory", dir, err, errlen) : 0;
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
        if (kvp_snap_repair_utf8(dst)) {
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
        cached > (uint32_t)s->n_tokens || kvp_snap_check_first_tokens(s)) {
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
    int rc = kvp_snap_check_id(id, err, errlen);
    char path[PATH_MAX];
    if (rc < 0 || (rc = kvp_snap_path(path, sizeof path, dir, id, ".journal", err, errlen)) < 0)
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
        version >= 1 && version <= JOURNAL_VERSION && !kvp_snap_r_str(&r, jid, KVP_SNAPSHOT_ID_MAX) && !strcmp(jid, id)) {
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

