#include "offline/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>

#include "base/checksum.h"
#include "base/errors.h"
#include "model/matmul.h"
#include "model/quant.h"

_Static_assert(sizeof(kvp_trace_header) == 144, "trace header is 144 bytes on disk");

int kvp_trace_n_cuts(const kvp_trace_header *h, int len)
{
    return len - h->cut_tail >= h->cut_min ? (len - h->cut_tail - h->cut_min) / h->cut_stride + 1 : 0;
}

int kvp_trace_cut_index(const kvp_trace_header *h, int n)
{
    return n >= h->cut_min && (n - h->cut_min) % h->cut_stride == 0 ? (n - h->cut_min) / h->cut_stride : -1;
}

/* Floats of importance one agent stores for a sequence with g cuts (the cuts' I(n) one
 * after the other), and where cut g starts among them. */
static size_t cut_offset(const kvp_trace_header *h, int g)
{
    return (size_t)g * h->cut_min + (size_t)h->cut_stride * g * (g - 1) / 2;
}

static size_t agent_bytes(const kvp_trace_header *h, int len)
{
    return 2 * (size_t)len * h->head_dim * sizeof(uint16_t) +
           cut_offset(h, kvp_trace_n_cuts(h, len)) * sizeof(float);
}

static size_t seq_bytes(const kvp_trace_header *h, int len)
{
    return sizeof(int32_t) + (size_t)len * sizeof(int32_t) +
           (size_t)h->n_layers * h->n_kv_heads * agent_bytes(h, len);
}

int kvp_trace_open(kvp_trace *t, const char *path, const kvp_model_config *cfg,
                   char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return KVP_ERR(-errno, "cannot open trace %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || (size_t)st.st_size < sizeof t->h + 8) {
        close(fd);
        return KVP_ERR(-EINVAL, "%s: too short for a trace", path);
    }
    t->size = (size_t)st.st_size;
    t->map = mmap(NULL, t->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        return KVP_ERR(-errno, "cannot map %s: %s", path, strerror(errno));
    }
    const unsigned char *b = t->map;
    memcpy(&t->h, b, sizeof t->h);
    const kvp_trace_header *h = &t->h;
    int rc;
    if (memcmp(h->magic, "KVPTRACE", 8)) {
        rc = KVP_ERR(-EINVAL, "%s: not a trace file (bad magic)", path);
        goto fail;
    }
    if (h->version != 2) {
        rc = KVP_ERR(-EINVAL, "%s: unsupported trace version %u%s", path, h->version,
                     h->version == 1 ? " (f32 q/k/v of kvp trace before the compact format; "
                     "trace again)" : "");
        goto fail;
    }
    if (h->n_layers <= 0 || h->n_layers > 1024 || h->n_heads <= 0 || h->n_heads > 4096 ||
        h->n_kv_heads <= 0 || h->n_heads % h->n_kv_heads || h->head_dim <= 0 ||
        h->head_dim > 4096 || h->seq_len <= 1 || h->seq_len > (1 << 20) || h->n_seqs <= 0 ||
        h->n_train < 0 || h->n_train > h->n_seqs || h->cut_min < 1 || h->cut_stride < 1 ||
        h->cut_tail < 1 || h->cut_min > (1 << 20) || h->cut_stride > (1 << 20) ||
        h->cut_tail > (1 << 20) ||
        (h->targets != KVP_TRACE_TARGETS_FUTURE && h->targets != KVP_TRACE_TARGETS_KVZIP)) {
        rc = KVP_ERR(-EINVAL, "%s: bad trace header", path);
        goto fail;
    }
    uint64_t want;
    memcpy(&want, b + t->size - 8, 8);
    if (kvp_fnv1a(KVP_FNV1A_INIT, b, t->size - 8) != want) {
        rc = KVP_ERR(-EBADMSG, "%s: checksum mismatch (truncated or corrupted trace)", path);
        goto fail;
    }
    if (cfg && (cfg->n_layers != h->n_layers || cfg->n_heads != h->n_heads ||
                cfg->n_kv_heads != h->n_kv_heads || cfg->head_dim != h->head_dim)) {
        rc = KVP_ERR(-EINVAL, "%s: trace is for %d layers x %d heads (%d KV) x head_dim %d, "
                 "model has %d x %d (%d) x %d", path, h->n_layers, h->n_heads, h->n_kv_heads,
                 h->head_dim, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim);
        goto fail;
    }
    t->offsets = malloc((size_t)h->n_seqs * sizeof *t->offsets);
    if (!t->offsets) {
        rc = KVP_ERR(-ENOMEM, "out of memory");
        goto fail;
    }
    size_t off = sizeof t->h, end = t->size - 8;
    for (int s = 0; s < h->n_seqs; s++) {
        int32_t len;
        if (end - off < 4) {
            rc = KVP_ERR(-EINVAL, "%s: sequence %d past the end", path, s);
            goto fail;
        }
        memcpy(&len, b + off, 4);
        if (len < 2 || len > h->seq_len || seq_bytes(h, len) > end - off) {
            rc = KVP_ERR(-EINVAL, "%s: sequence %d has a bad length %d", path, s, len);
            goto fail;
        }
        t->offsets[s] = off;
        off += seq_bytes(h, len);
    }
    if (off != end) {
        rc = KVP_ERR(-EINVAL, "%s: %zu unexpected trailing bytes", path, end - off);
        goto fail;
    }
    return 0;
fail:
    kvp_trace_close(t);
    return rc;
}

void kvp_trace_close(kvp_trace *t)
{
    if (t->map)
        munmap(t->map, t->size);
    free(t->offsets);
    memset(t, 0, sizeof *t);
}

int kvp_trace_len(const kvp_trace *t, int seq)
{
    int32_t len;
    memcpy(&len, (const char *)t->map + t->offsets[seq], 4);
    return len;
}

const int32_t *kvp_trace_tokens(const kvp_trace *t, int seq)
{
    return (const int32_t *)((const char *)t->map + t->offsets[seq] + 4);
}

/* Start of agent (layer, kvh) of a sequence: k, then v, then the importance. */
static const char *agent_base(const kvp_trace *t, int seq, int layer, int kvh)
{
    int len = kvp_trace_len(t, seq);
    size_t agent = (size_t)layer * t->h.n_kv_heads + (size_t)kvh;
    return (const char *)t->map + t->offsets[seq] + 4 + (size_t)len * 4 +
           agent * agent_bytes(&t->h, len);
}

const uint16_t *kvp_trace_k(const kvp_trace *t, int seq, int layer, int kvh)
{
    return (const uint16_t *)agent_base(t, seq, layer, kvh);
}

const uint16_t *kvp_trace_v(const kvp_trace *t, int seq, int layer, int kvh)
{
    return kvp_trace_k(t, seq, layer, kvh) + (size_t)kvp_trace_len(t, seq) * t->h.head_dim;
}

const float *kvp_trace_importance(const kvp_trace *t, int seq, int layer, int kvh, int g)
{
    const uint16_t *end = kvp_trace_v(t, seq, layer, kvh) +
                          (size_t)kvp_trace_len(t, seq) * t->h.head_dim;
    return (const float *)end + cut_offset(&t->h, g);
}

size_t kvp_importance_work(int len)
{
    return (2 * (size_t)KVP_IMPORTANCE_BLOCK + 1) * (size_t)len;
}

void kvp_importance_cuts(const float *q, const float *k, int len, int n_heads,
                         int n_kv_heads, int head_dim, int kvh, int first, int stride,
                         int n_cuts, float *const *out, float *work)
{
    int hd = head_dim, group = n_heads / n_kv_heads, g = n_cuts - 1;
    int qd = n_heads * hd, kvd = n_kv_heads * hd;
    k += (size_t)kvh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (; g >= 0 && first + g * stride >= len; g--)   /* no query comes after the cut */
        memset(out[g], 0, (size_t)(first + g * stride) * sizeof **out);
    int last = g >= 0 ? first + g * stride : 0;
    /* scores [B][len] of one query head, the group's max [B][len], the running sum [len] */
    float *att = work, *amax = work + (size_t)KVP_IMPORTANCE_BLOCK * len,
          *acc = amax + (size_t)KVP_IMPORTANCE_BLOCK * len;
    memset(acc, 0, (size_t)last * sizeof *acc);
    /* blocks of queries [t0, t1) from the last back to the first cut; a block's scores
     * are one sgemm per query head of the group */
    for (int t1 = len; t1 > first && g >= 0; t1 -= KVP_IMPORTANCE_BLOCK) {
        int t0 = t1 - KVP_IMPORTANCE_BLOCK > first ? t1 - KVP_IMPORTANCE_BLOCK : first;
        int nb = t1 - t0;
        int cols = t1 < last ? t1 : last;   /* rows past the largest cut: never ranked */
        for (int gi = 0; gi < group; gi++) {
            /* att[b][j] = q[t0 + b] . k[j] * scale, j < t1 */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, t1, hd, scale,
                        q + (size_t)t0 * qd + (size_t)(kvh * group + gi) * hd, qd, k, kvd,
                        0.0f, att, t1);
            for (int b = 0; b < nb; b++) {
                float *a = att + (size_t)b * t1, *mxr = amax + (size_t)b * t1;
                int seen = t0 + b + 1, n = seen < cols ? seen : cols;
                float mx = -INFINITY, sum = 0.0f;
                for (int j = 0; j < seen; j++)
                    mx = a[j] > mx ? a[j] : mx;
                for (int j = 0; j < seen; j++)
                    sum += a[j] = expf(a[j] - mx);
                float inv = 1.0f / sum;
                /* the max over the group is taken per query, before summing over queries */
                for (int i = 0; i < n; i++) {
                    float p = a[i] * inv;
                    mxr[i] = gi == 0 || p > mxr[i] ? p : mxr[i];
                }
            }
        }
        for (int tq = t1 - 1; tq >= t0 && g >= 0; tq--) {
            const float *mxr = amax + (size_t)(tq - t0) * t1;
            int n = tq + 1 < cols ? tq + 1 : cols;
            for (int i = 0; i < n; i++)
                acc[i] += mxr[i];
            int cut = first + g * stride;
            if (tq == cut) {
                memcpy(out[g], acc, (size_t)cut * sizeof *acc);
                g--;
            }
        }
    }
}

size_t kvp_trace_split_at(const char *text, size_t len, double split)
{
    size_t cut = (size_t)(split * (double)len);
    while (cut < len && cut > 0 && text[cut - 1] != '\n')
        cut++;
    return cut;
}

long kvp_trace_tokenize(const kvp_tokenizer *tok, const char *text, size_t len, int **out)
{
    size_t cap = len + 16, n = 0;
    int *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    for (size_t off = 0; off < len;) {
        const char *nl = memchr(text + off, '\n', len - off);
        size_t line = nl ? (size_t)(nl - (text + off)) + 1 : len - off;
        /* the dummy prefix belongs to the start of the text only */
        int got = kvp_tokenizer_encode(tok, text + off, line, off ? KVP_ENCODE_NO_PREFIX : 0,
                                       ids + n, (int)(cap - n));
        if (got < 0) {
            free(ids);
            return -1;
        }
        n += (size_t)got;
        off += line;
    }
    *out = ids;
    return (long)n;
}

/* ---- writer -------------------------------------------------------------------- */

static void writer_free(kvp_trace_writer *w)
{
    free(w->imp);
    free(w->cuts);
    free(w->work);
    free(w->half);
    w->imp = w->work = NULL;
    w->cuts = NULL;
    w->half = NULL;
}

static int wr(kvp_trace_writer *w, const void *p, size_t n)
{
    return fwrite(p, 1, n, w->f) == n ? 0 : -EIO;
}

int kvp_trace_writer_open(kvp_trace_writer *w, const char *path, const kvp_trace_header *h,
                          char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->h = *h;
    memcpy(w->h.magic, "KVPTRACE", 8);
    w->h.version = 2;
    w->h.n_seqs = 0;
    if (h->targets != KVP_TRACE_TARGETS_FUTURE && h->targets != KVP_TRACE_TARGETS_KVZIP)
        return KVP_ERR(-EINVAL, "bad trace targets %d", h->targets);
    if (h->cut_min < 1 || h->cut_stride < 1 || h->cut_tail < 1 || h->seq_len < 2 ||
        h->head_dim < 1 || h->n_kv_heads < 1 || h->n_heads % h->n_kv_heads)
        return KVP_ERR(-EINVAL, "bad trace shape or cut grid (cut min %d, stride %d, tail %d)",
                       h->cut_min, h->cut_stride, h->cut_tail);
    int grid = kvp_trace_n_cuts(&w->h, h->seq_len);
    size_t agents = (size_t)h->n_layers * h->n_kv_heads;
    w->slots = kvp_matmul_threads();
    w->imp = malloc((agents * cut_offset(&w->h, grid) + 1) * sizeof *w->imp);
    w->cuts = malloc((agents * grid + 1) * sizeof *w->cuts);
    w->work = malloc((size_t)w->slots * kvp_importance_work(h->seq_len) * sizeof *w->work);
    w->half = malloc((size_t)h->seq_len * h->head_dim * sizeof *w->half);
    if (!w->imp || !w->cuts || !w->work || !w->half) {
        kvp_trace_writer_abort(w);
        return KVP_ERR(-ENOMEM, "out of memory");
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        int e = errno;
        kvp_trace_writer_abort(w);
        return KVP_ERR(-e, "cannot create %s: %s", w->tmp, strerror(e));
    }
    /* the header is rewritten with the final counts at close */
    if (fwrite(&w->h, sizeof w->h, 1, w->f) != 1) {
        kvp_trace_writer_abort(w);
        return KVP_ERR(-EIO, "cannot write %s", w->tmp);
    }
    return 0;
}

/* Rows [len][head_dim] of one KV head out of x [len][n_kv_heads * head_dim], in f16. */
static int write_half(kvp_trace_writer *w, const float *x, int len, int kvh)
{
    int hd = w->h.head_dim, kvd = w->h.n_kv_heads * hd;
    for (int r = 0; r < len; r++)
        for (int i = 0; i < hd; i++)
            w->half[(size_t)r * hd + i] = kvp_f32_to_f16(x[(size_t)r * kvd + (size_t)kvh * hd + i]);
    return wr(w, w->half, (size_t)len * hd * sizeof *w->half);
}

typedef struct importance_job {
    kvp_trace_writer *w;
    const float *const *q, *const *k;
    int len, grid;
} importance_job;

/* Item a: agent a = layer * n_kv_heads + kvh into its own part of w->imp. */
static void importance_item(void *ctx, int a, int slot)
{
    const importance_job *j = ctx;
    const kvp_trace_header *h = &j->w->h;
    int l = a / h->n_kv_heads, kvh = a % h->n_kv_heads;
    kvp_importance_cuts(j->q[l], j->k[l], j->len, h->n_heads, h->n_kv_heads, h->head_dim,
                        kvh, h->cut_min, h->cut_stride, j->grid, j->w->cuts + (size_t)a * j->grid,
                        j->w->work + (size_t)slot * kvp_importance_work(h->seq_len));
}

/* One sequence's record once w->imp holds every agent's targets. */
static int write_sequence(kvp_trace_writer *w, const int32_t *tokens, int len,
                          const float *const *k, const float *const *v)
{
    const kvp_trace_header *h = &w->h;
    int32_t l32 = len;
    int agents = h->n_layers * h->n_kv_heads;
    size_t per_agent = cut_offset(h, kvp_trace_n_cuts(h, len));
    if (wr(w, &l32, 4) || wr(w, tokens, (size_t)len * 4))
        return -EIO;
    for (int a = 0; a < agents; a++) {
        int l = a / h->n_kv_heads, kvh = a % h->n_kv_heads;
        if (write_half(w, k[l], len, kvh) || write_half(w, v[l], len, kvh) ||
            wr(w, w->imp + (size_t)a * per_agent, per_agent * sizeof *w->imp))
            return -EIO;
    }
    w->h.n_seqs++;
    return 0;
}

int kvp_trace_writer_add(kvp_trace_writer *w, const int32_t *tokens, int len,
                         const float *const *q, const float *const *k, const float *const *v)
{
    const kvp_trace_header *h = &w->h;
    if (len < 2 || len > h->seq_len || h->targets != KVP_TRACE_TARGETS_FUTURE)
        return -EINVAL;
    int grid = kvp_trace_n_cuts(h, len);
    int agents = h->n_layers * h->n_kv_heads;
    size_t per_agent = cut_offset(h, grid);
    for (int a = 0; a < agents; a++)
        for (int g = 0; g < grid; g++)
            w->cuts[(size_t)a * grid + g] = w->imp + (size_t)a * per_agent + cut_offset(h, g);
    importance_job job = {w, q, k, len, grid};
    kvp_matmul_parallel(agents, importance_item, &job,
                        (size_t)agents * len * h->head_dim * sizeof(float), w->slots, 0);
    return write_sequence(w, tokens, len, k, v);
}

int kvp_trace_writer_add_scores(kvp_trace_writer *w, const int32_t *tokens, int len,
                                const float *const *k, const float *const *v,
                                const float *const *scores)
{
    const kvp_trace_header *h = &w->h;
    if (len < 2 || len > h->seq_len || h->targets != KVP_TRACE_TARGETS_KVZIP)
        return -EINVAL;
    int grid = kvp_trace_n_cuts(h, len);
    int agents = h->n_layers * h->n_kv_heads;
    size_t per_agent = cut_offset(h, grid);
    for (int a = 0; a < agents; a++)
        for (int g = 0; g < grid; g++)
            memcpy(w->imp + (size_t)a * per_agent + cut_offset(h, g), scores[(size_t)a * grid + g],
                   ((size_t)h->cut_min + (size_t)g * h->cut_stride) * sizeof *w->imp);
    return write_sequence(w, tokens, len, k, v);
}

int kvp_trace_targets_parse(const char *name)
{
    return !strcmp(name, "future") ? KVP_TRACE_TARGETS_FUTURE
           : !strcmp(name, "kvzip") ? KVP_TRACE_TARGETS_KVZIP : -1;
}

const char *kvp_trace_targets_name(int targets)
{
    return targets == KVP_TRACE_TARGETS_KVZIP ? "kvzip" : "future";
}

int kvp_trace_writer_close(kvp_trace_writer *w, int n_train, char *err, size_t errlen)
{
    w->h.n_train = n_train;
    /* the header gets its final counts now, so the checksum is computed by reading
     * the finished file back */
    long body = ftell(w->f);
    if (body < 0 || fflush(w->f) || fseek(w->f, 0, SEEK_SET) ||
        fwrite(&w->h, sizeof w->h, 1, w->f) != 1 || fflush(w->f)) {
        kvp_trace_writer_abort(w);
        return KVP_ERR(-EIO, "cannot write %s", w->tmp);
    }
    FILE *r = fopen(w->tmp, "rb");
    if (!r) {
        kvp_trace_writer_abort(w);
        return KVP_ERR(-errno, "cannot reread %s", w->tmp);
    }
    uint64_t hash = KVP_FNV1A_INIT;
    char buf[1 << 16];
    size_t got;
    long left = body;
    while (left > 0 && (got = fread(buf, 1, left < (long)sizeof buf ? (size_t)left : sizeof buf, r)) > 0) {
        hash = kvp_fnv1a(hash, buf, got);
        left -= (long)got;
    }
    fclose(r);
    if (left || fseek(w->f, 0, SEEK_END) || fwrite(&hash, 8, 1, w->f) != 1 || fflush(w->f) ||
        fsync(fileno(w->f))) {
        kvp_trace_writer_abort(w);
        return KVP_ERR(-EIO, "cannot finish %s", w->tmp);
    }
    fclose(w->f);
    w->f = NULL;
    writer_free(w);
    if (rename(w->tmp, w->path)) {
        int e = errno;
        remove(w->tmp);
        return KVP_ERR(-e, "cannot rename %s: %s", w->tmp, strerror(e));
    }
    return 0;
}

void kvp_trace_writer_abort(kvp_trace_writer *w)
{
    if (w->f) {
        fclose(w->f);
        remove(w->tmp);
    }
    w->f = NULL;
    writer_free(w);
}
