#include "model/sampler.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/matmul.h"
#include "model/sampler_kernels.h"

/* Candidate sets up to this size are sorted; larger ones (flat distributions) go
 * through the radix selection below, which stays O(size). */
#define SORT_MAX 512

typedef kvp_smp_cand cand;

/* xorshift64*, the generator of llama2.c's run.c */
static uint32_t rand_u32(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1Dull) >> 32);
}

float kvp_rand_f32(uint64_t *state) { return (float)(rand_u32(state) >> 8) / 16777216.0f; }

/* ---- the vector passes: AVX2 when matmul.c picked a SIMD set, else portable ---------- */

static int use_avx2;
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;

static void pick_simd(void)
{
    const char *m = kvp_matmul_simd();   /* honours KVP_SIMD=scalar */
    use_avx2 = !strcmp(m, "avx2") || !strcmp(m, "avx512");
}

const char *kvp_sampler_simd(void)
{
    pthread_once(&simd_once, pick_simd);
    return use_avx2 ? "avx2" : "scalar";
}

/* The largest logit's index (the first of equals); NaN never wins (all NaN: 0). */
static int argmax(const float *x, int n)
{
    if (use_avx2) {
        float mx = kvp_smp_max_avx2(x, n);
        for (int i = 0; i < n; i++)
            if (x[i] == mx)
                return i;
        return 0;
    }
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i]))
            best = i;
    return best;
}

/* p_i = exp((x_i - max) / T) / sum, with x[best] the max: it is subtracted before the
 * division, so a small T sends the others to 0 instead of overflowing. NaN logits get
 * p = 0, a +inf max shares the mass with the other +inf logits, and x[best] counts
 * exp(0) = 1 so the sum is never 0. */
static void softmax(float *x, int n, int best, float temperature)
{
    float mx = x[best], sum = 0.0f;
    if (use_avx2 && isfinite(mx)) {
        sum = kvp_smp_exp_avx2(x, n, mx, temperature);
        kvp_smp_div_avx2(x, n, sum);
        return;
    }
    for (int i = 0; i < n; i++) {
        float d = i == best ? 0.0f
                  : isinf(mx) ? (x[i] == mx ? 0.0f : -INFINITY)
                              : x[i] - mx;
        x[i] = d == d ? expf(d / temperature) : 0.0f;
        sum += x[i];
    }
    if (use_avx2) {
        kvp_smp_div_avx2(x, n, sum);
        return;
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

/* ---- settings and the penalties' history ------------------------------------------- */

void kvp_sampler_seed(kvp_sampler *s, uint64_t seed)
{
    s->rng = seed ? seed : 0x9E3779B97F4A7C15ull;  /* xorshift must not start at 0 */
}

int kvp_sampler_init(kvp_sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    if (vocab_size <= 0 || !(temperature >= 0.0f && isfinite(temperature)) || !(top_p > 0.0f && top_p <= 1.0f))
        return -EINVAL;
    pthread_once(&simd_once, pick_simd);
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->top_p = top_p;
    kvp_sampler_seed(s, seed);
    s->scratch = malloc((size_t)vocab_size * sizeof *s->scratch);
    return s->scratch ? 0 : -ENOMEM;
}

void kvp_sampler_free(kvp_sampler *s)
{
    free(s->scratch);
    free(s->bias);
    free(s->hist_tok);
    free(s->hist_cnt);
    free(s->hist_slot);
    memset(s, 0, sizeof *s);
}

int kvp_sample_opts_check(const kvp_sample_opts *o, int vocab_size, const char **field)
{
    *field = NULL;
    if (o->top_k < 0)
        *field = "top_k";
    else if (!(o->min_p >= 0.0f && o->min_p <= 1.0f))
        *field = "min_p";
    else if (!(o->frequency_penalty >= -2.0f && o->frequency_penalty <= 2.0f))
        *field = "frequency_penalty";
    else if (!(o->presence_penalty >= -2.0f && o->presence_penalty <= 2.0f))
        *field = "presence_penalty";
    else if (!(o->repetition_penalty >= 0.0f && o->repetition_penalty <= 10.0f))
        *field = "repetition_penalty";
    else if (o->n_bias < 0 || o->n_bias > KVP_SAMPLER_MAX_BIAS || (o->n_bias && !o->bias))
        *field = "logit_bias";
    for (int i = 0; !*field && i < o->n_bias; i++)
        if (o->bias[i].token < 0 || o->bias[i].token >= vocab_size ||
            !(o->bias[i].bias >= -100.0f && o->bias[i].bias <= 100.0f))
            *field = "logit_bias";
    return *field ? -EINVAL : 0;
}

void kvp_sampler_reset(kvp_sampler *s)
{
    if (s->n_hist)
        memset(s->hist_slot, 0xff, (size_t)2 * s->cap_hist * sizeof *s->hist_slot);
    s->n_hist = 0;
}

int kvp_sampler_set_opts(kvp_sampler *s, const kvp_sample_opts *o)
{
    static const kvp_sample_opts none;
    const char *field;
    if (!o)
        o = &none;
    if (kvp_sample_opts_check(o, s->vocab_size, &field) < 0)
        return -EINVAL;
    kvp_logit_bias *b = NULL;
    if (o->n_bias) {
        if (!(b = malloc((size_t)o->n_bias * sizeof *b)))
            return -ENOMEM;
        memcpy(b, o->bias, (size_t)o->n_bias * sizeof *b);
    }
    free(s->bias);
    s->bias = b;
    s->n_bias = o->n_bias;
    s->top_k = o->top_k;
    s->min_p = o->min_p;
    s->frequency_penalty = o->frequency_penalty;
    s->presence_penalty = o->presence_penalty;
    s->repetition_penalty = o->repetition_penalty == 0.0f ? 1.0f : o->repetition_penalty;
    kvp_sampler_reset(s);
    return 0;
}

static int penalized(const kvp_sampler *s)
{
    return s->frequency_penalty != 0.0f || s->presence_penalty != 0.0f ||
           (s->repetition_penalty != 1.0f && s->repetition_penalty != 0.0f);
}

/* Counts tok in the history: a hash of token -> entry (open addressing, at most half
 * full) over the entries' arrays. Out of memory: the token goes uncounted. */
static void hist_add(kvp_sampler *s, int tok)
{
    if (s->n_hist == s->cap_hist) {
        int cap = s->cap_hist ? 2 * s->cap_hist : 64;
        int *t = realloc(s->hist_tok, (size_t)cap * sizeof *t);
        if (t)
            s->hist_tok = t;
        int *c = t ? realloc(s->hist_cnt, (size_t)cap * sizeof *c) : NULL;
        if (c)
            s->hist_cnt = c;
        int *slot = c ? malloc((size_t)2 * cap * sizeof *slot) : NULL;
        if (!slot)
            return;
        free(s->hist_slot);
        s->hist_slot = slot;
        s->cap_hist = cap;
        memset(slot, 0xff, (size_t)2 * cap * sizeof *slot);
        for (int i = 0; i < s->n_hist; i++) {
            unsigned h = (unsigned)s->hist_tok[i] * 2654435761u & (unsigned)(2 * cap - 1);
            while (slot[h] >= 0)
                h = (h + 1) & (unsigned)(2 * cap - 1);
            slot[h] = i;
        }
    }
    unsigned mask = (unsigned)(2 * s->cap_hist - 1), h = (unsigned)tok * 2654435761u & mask;
    for (; s->hist_slot[h] >= 0; h = (h + 1) & mask)
        if (s->hist_tok[s->hist_slot[h]] == tok) {
            s->hist_cnt[s->hist_slot[h]]++;
            return;
        }
    s->hist_slot[h] = s->n_hist;
    s->hist_tok[s->n_hist] = tok;
    s->hist_cnt[s->n_hist++] = 1;
}

/* Penalties over the drawn tokens, then the biases: touches only those logits. */
static void adjust(const kvp_sampler *s, float *x)
{
    float rp = s->repetition_penalty == 0.0f ? 1.0f : s->repetition_penalty;
    for (int i = 0; i < s->n_hist; i++) {
        float *l = &x[s->hist_tok[i]];
        if (rp != 1.0f)
            *l = *l > 0.0f ? *l / rp : *l * rp;
        *l -= (float)s->hist_cnt[i] * s->frequency_penalty + s->presence_penalty;
    }
    for (int i = 0; i < s->n_bias; i++)
        x[s->bias[i].token] = s->bias[i].bias <= KVP_SAMPLER_BAN_BIAS
                                  ? -INFINITY : x[s->bias[i].token] + s->bias[i].bias;
}

/* ---- bounded selection ------------------------------------------------------------- */

/* Most likely first; equal probabilities in token order. */
static int by_prob_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p)
        return (x->p < y->p) - (x->p > y->p);
    return (x->i > y->i) - (x->i < y->i);
}

static uint32_t bits(float p)
{
    uint32_t u;
    memcpy(&u, &p, sizeof u);
    return u;   /* p >= 0: the order of the bits is the order of the values */
}

/* The key of p at radix level l: 10 bits each, the bits below the sign from 30 down
 * (level 0: exponent and 3 mantissa bits, clamped at 1023, which holds every p below
 * 1.875: probabilities never reach it), then 10 and 10. */
static unsigned key(float p, int l)
{
    uint32_t u = bits(p);
    return l == 0 ? (u >> 20 < 1023u ? u >> 20 : 1023u) : l == 1 ? (u >> 10) & 1023u : u & 1023u;
}

/* The smallest p >= 0 whose level-0 key is above k (k < 1023): p >= it is key > k. */
static float key0_above(int k)
{
    uint32_t u = (uint32_t)(k + 1) << 20;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bucket at radix level l of n probabilities p[0], p[stride], ... (a candidate
 * array's, or a softmax's) where, walking down from the top bucket, the count of those
 * above plus its own reaches k (k > 0; `base` counted before), or (k == 0) the mass
 * *kept plus its own exceeds target; adds the count and mass of the buckets above it to
 * *above and *kept. -1: no bucket does. */
static int crossing(const float *p, int n, int stride, int l, int k, int base, double target,
                    int *above, double *kept)
{
    /* four histograms, items j % 4: a flat distribution sends most of them to a few
     * buckets, and one histogram would chain every update on the last */
    enum { H = 4, NB = 1024 };
    static _Thread_local unsigned cnt[H][NB];
    static _Thread_local double mass[H][NB];
    int j = 0;
    memset(cnt, 0, sizeof cnt);
    memset(mass, 0, sizeof mass);
    for (; j + H <= n; j += H)
        for (int h = 0; h < H; h++) {
            float a = p[(size_t)(j + h) * stride];
            unsigned b = key(a, l);
            cnt[h][b]++;
            mass[h][b] += a;
        }
    for (; j < n; j++) {
        cnt[0][key(p[(size_t)j * stride], l)]++;
        mass[0][key(p[(size_t)j * stride], l)] += p[(size_t)j * stride];
    }
    for (int b = NB - 1; b >= 0; b--) {
        int nc = (int)(cnt[0][b] + cnt[1][b] + cnt[2][b] + cnt[3][b]);
        double mb = (mass[0][b] + mass[1][b]) + (mass[2][b] + mass[3][b]);
        if (k ? base + *above + nc >= k : *kept + mb > target)
            return b;
        *above += nc;
        *kept += mb;
    }
    return -1;
}

/* The tokens of p[0..n) with lo <= p < hi into c, in token order; returns their count. */
static int gather(const float *p, int n, float lo, float hi, cand *c)
{
    if (use_avx2)
        return kvp_smp_gather_avx2(p, n, lo, hi, c);
    int g = 0;
    for (int i = 0; i < n; i++)
        if (p[i] >= lo && p[i] < hi) {
            c[g].p = p[i];
            c[g].i = i;
            g++;
        }
    return g;
}

/* Reorders c[0..m) so that c[0..return) are its k most likely (k > 0), or (k == 0) the
 * fewest most likely whose mass first exceeds target, the one crossing it included (all
 * of them when rounding leaves the sum short): a most-significant-digit radix select on
 * the probabilities' bits. Each level histograms the undecided candidates (count and
 * mass per bucket), keeps the buckets above the crossing one, and goes on within the
 * crossing bucket; once that holds at most SORT_MAX candidates (or, after the last
 * level, only equal ones), it is sorted and cut. O(m) whatever the distribution. The
 * kept candidates above the crossing bucket stay in candidate order; the crossing
 * bucket's in sorted order after them, from *sorted_at, with *mass_before the mass of
 * those before it. */
static int select_top(cand *c, int m, int k, double target, int *sorted_at, double *mass_before)
{
    int head = 0, end = m;   /* c[0..head) kept; c[head..end) undecided */
    double kept = 0.0;
    *sorted_at = 0;
    *mass_before = 0.0;
    for (int l = 0; l < 3 && end - head > SORT_MAX; l++) {
        int above = 0;
        int cross = crossing(&c[head].p, end - head, (int)(sizeof(cand) / sizeof(float)), l, k,
                             head, target, &above, &kept);
        if (cross < 0) {
            *sorted_at = end;
            *mass_before = kept;
            return end;
        }
        /* partition c[head..end): keys above cross, then cross's, the rest dropped */
        int w = head;
        for (int j = head; j < end; j++)
            if (key(c[j].p, l) > (unsigned)cross) {
                cand t = c[w]; c[w] = c[j]; c[j] = t;
                w++;
            }
        int v = w;
        for (int j = w; j < end; j++)
            if (key(c[j].p, l) == (unsigned)cross) {
                cand t = c[v]; c[v] = c[j]; c[j] = t;
                v++;
            }
        head = w;
        end = v;
    }
    qsort(c + head, (size_t)(end - head), sizeof *c, by_prob_desc);
    *sorted_at = head;
    *mass_before = kept;
    if (k)
        return k < end ? k : end;
    for (int j = head; j < end; j++) {
        kept += c[j].p;
        if (kept > target)
            return j + 1;
    }
    return end;
}

/* The candidates of a draw from softmaxed p[0..n) (best: the most likely) into
 * s->scratch; returns their number (>= 1), the order the draw walks them in. */
static int candidates(kvp_sampler *s, const float *p, int best)
{
    int n = s->vocab_size, m = 0;
    cand *c = (cand *)s->scratch;
    float top_p = s->top_p < 1.0f ? s->top_p : 1.0f;
    /* A lower bound below which no token can be kept: min-p's threshold and, with no
     * other filter before top-p, the top-p bound (1 - top_p)/(n - 1) (the tokens below
     * it hold less than 1 - top_p in all, so they can all be cut). */
    float lo = s->min_p * p[best];
    int filtered = s->min_p > 0.0f || (s->top_k > 0 && s->top_k < n);
    if (!filtered && top_p < 1.0f) {
        float cut = (1.0f - top_p) / (float)(n - 1 > 0 ? n - 1 : 1);
        lo = cut > lo ? cut : lo;
    }
    for (int i = 0; i < n; i++)
        if (p[i] >= lo || i == best) {
            c[m].p = p[i];
            c[m].i = i;
            m++;
        }
    if (s->top_k > 0 && s->top_k < m) {
        int at;
        double before;
        if (m > SORT_MAX)
            m = select_top(c, m, s->top_k, 0.0, &at, &before);
        if (m <= SORT_MAX)
            qsort(c, (size_t)m, sizeof *c, by_prob_desc);
        m = s->top_k < m ? s->top_k : m;
    }
    if (top_p >= 1.0f)
        return m;
    /* top-p over what is left: the whole distribution's mass 1 without filters, else
     * theirs (renormalized) */
    float total = 1.0f;
    if (filtered) {
        total = 0.0f;
        for (int j = 0; j < m; j++)
            total += c[j].p;
        if (m > SORT_MAX) {   /* the same bound within the set */
            float cut = (1.0f - top_p) * total / (float)(m - 1), t = 0.0f;
            int w = 0;
            for (int j = 0; j < m; j++)
                if (c[j].p >= cut || c[j].i == best) {
                    c[w++] = c[j];
                    t += c[j].p;
                }
            m = w;
            total = t;
        }
    }
    float target = top_p * total;
    if (m > SORT_MAX) {
        /* A few more than the nucleus (the selection sums in double, the cut below in
         * float, as the sort-based sampler did); when that is few enough to sort, the
         * cut below makes it the same nucleus in the same order. */
        int at;
        double before;
        m = select_top(c, m, 0, (double)target * (1.0 + 1e-4), &at, &before);
        if (m > SORT_MAX) {
            /* the nucleus is within those: its exact end in the sorted part, or (when
             * the margin reached into an earlier bucket) a selection among them */
            if (before > (double)target)
                return select_top(c, m, 0, (double)target, &at, &before);
            for (int j = at; j < m; j++) {
                before += c[j].p;
                if (before > (double)target)
                    return j + 1;
            }
            return m;
        }
    }
    qsort(c, (size_t)m, sizeof *c, by_prob_desc);
    float cum = 0.0f;
    for (int j = 0; j < m; j++) {
        cum += c[j].p;
        if (cum > target)
            return j + 1;
    }
    return m;
}

/* Top-p alone with a nucleus too large to sort (a flat distribution), found without
 * collecting every candidate: one histogram of p[] at select_top's first level; the
 * tokens of the buckets above the crossing one are the nucleus's bulk and stay where
 * they are in p[] (*above_key: that bucket, *above_mass: their mass); only the crossing
 * bucket's tokens are gathered into s->scratch and selected there. Returns their number,
 * or -1 when the bulk holds at most SORT_MAX tokens (candidates() then sorts the
 * nucleus, as the sort-based sampler did) or rounding left the mass short. */
static int flat_nucleus(kvp_sampler *s, const float *p, int *above_key, double *above_mass)
{
    int n = s->vocab_size, above = 0;
    double target = s->top_p, kept = 0.0;   /* in the softmax's units: the whole mass is 1 */
    int cross = crossing(p, n, 1, 0, 0, 0, target, &above, &kept);
    if (cross < 0 || above <= SORT_MAX)
        return -1;
    cand *c = (cand *)s->scratch;
    int g = gather(p, n, cross > 0 ? key0_above(cross - 1) : 0.0f, key0_above(cross), c);
    int at;
    double before;
    *above_key = cross;
    *above_mass = kept;
    return select_top(c, g, 0, target - kept, &at, &before);
}

/* Penalties, biases, greedy or softmax + candidates. Returns the greedy token, or -1
 * with *m candidates in s->scratch, after (when *above >= 0) the tokens of logits[]
 * whose first-level key is above *above, of mass *above_mass; *best is the most likely
 * token. */
static int prepare(kvp_sampler *s, float *logits, int *m, int *best, int *above,
                   double *above_mass)
{
    int n = s->vocab_size;
    pthread_once(&simd_once, pick_simd);
    if (s->n_hist || s->n_bias)
        adjust(s, logits);
    *best = argmax(logits, n);
    if (s->temperature < KVP_SAMPLER_GREEDY_BELOW)
        return *best;
    softmax(logits, n, *best, s->temperature);
    int filtered = s->min_p > 0.0f || (s->top_k > 0 && s->top_k < n);
    *above = -1;
    *above_mass = 0.0;
    if (s->top_p >= 1.0f && !filtered)
        *m = 0;
    else if (filtered || (*m = flat_nucleus(s, logits, above, above_mass)) < 0)
        *m = candidates(s, logits, *best);
    return -1;
}

/* ---- the draw's walk ------------------------------------------------------------- */

/* Tokens per block of a walk: the walk sums a block's kept mass in one vector pass and
 * goes token by token only in the block where the running sum passes the coin. */
#define DRAW_BLOCK 512

/* The sum of the x[i] >= thr of x[0..n) (thr 0: all of them, the x being >= 0). */
static float sum_ge(const float *x, int n, float thr)
{
    if (use_avx2)
        return kvp_smp_sum_ge_avx2(x, n, thr);
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            lane[k] += x[i + k] >= thr ? x[i + k] : 0.0f;
    float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < n; i++)
        sum += x[i] >= thr ? x[i] : 0.0f;
    return sum;
}

/* The first i of x[0..n) with x[i] >= thr where *cdf plus the running sum of those
 * passes r, *cdf advanced by what was walked; -1 (the whole sum added) when none. */
static int draw_walk(const float *x, int n, float thr, double r, double *cdf)
{
    for (int b = 0; b < n; b += DRAW_BLOCK) {
        int e = n - b < DRAW_BLOCK ? n : b + DRAW_BLOCK;
        double sb = sum_ge(x + b, e - b, thr);
        if (*cdf + sb <= r) {
            *cdf += sb;
            continue;
        }
        /* the block's float sum and this double one may disagree by rounding: then
         * the walk goes on from the exact sum */
        for (int i = b; i < e; i++)
            if (x[i] >= thr && (*cdf += x[i]) > r)
                return i;
    }
    return -1;
}

static int drawn(kvp_sampler *s, int tok)
{
    if (penalized(s))
        hist_add(s, tok);
    return tok;
}

int kvp_sample(kvp_sampler *s, float *logits)
{
    int m = 0, best, above;
    double above_mass;
    int tok = prepare(s, logits, &m, &best, &above, &above_mass);
    if (tok >= 0)
        return drawn(s, tok);
    float coin = kvp_rand_f32(&s->rng);
    const cand *c = (const cand *)s->scratch;
    if (above >= 0) {   /* the bulk in token order, then the selected crossing tokens */
        double total = above_mass, cdf = 0.0;
        for (int j = 0; j < m; j++)
            total += c[j].p;
        double r = (double)coin * total;
        int tok = draw_walk(logits, s->vocab_size, key0_above(above), r, &cdf);
        if (tok >= 0)
            return drawn(s, tok);
        for (int j = 0; j < m; j++)
            if ((cdf += c[j].p) > r)
                return drawn(s, c[j].i);
        return drawn(s, best);
    }
    if (m == 0 && use_avx2) {   /* no filter: the whole distribution in token order */
        double cdf = 0.0;
        int tok = draw_walk(logits, s->vocab_size, 0.0f, (double)coin, &cdf);
        return drawn(s, tok >= 0 ? tok : best);
    }
    if (m == 0) {   /* the same in float, as the sort-based sampler summed */
        float cdf = 0.0f;
        for (int i = 0; i < s->vocab_size; i++) {
            cdf += logits[i];
            if (coin < cdf)
                return drawn(s, i);
        }
        return drawn(s, best);   /* rounding left the cdf short of the coin */
    }
    float cum = 0.0f, cdf = 0.0f;
    for (int j = 0; j < m; j++)
        cum += c[j].p;
    float r = coin * cum;
    for (int j = 0; j < m; j++) {
        cdf += c[j].p;
        if (r < cdf)
            return drawn(s, c[j].i);
    }
    return drawn(s, best);
}

int kvp_sampler_dist(kvp_sampler *s, float *logits, int *ids, float *p)
{
    int m = 0, best, above;
    double above_mass;
    int tok = prepare(s, logits, &m, &best, &above, &above_mass);
    if (tok >= 0) {
        ids[0] = tok;
        p[0] = 1.0f;
        return 1;
    }
    if (m == 0) {
        for (int i = 0; i < s->vocab_size; i++) {
            ids[i] = i;
            p[i] = logits[i];
        }
        return s->vocab_size;
    }
    const cand *c = (const cand *)s->scratch;
    double cum = above_mass;
    for (int j = 0; j < m; j++)
        cum += c[j].p;
    int k = 0;
    for (int i = 0; above >= 0 && i < s->vocab_size; i++)
        if (key(logits[i], 0) > (unsigned)above) {
            ids[k] = i;
            p[k++] = (float)(logits[i] / cum);
        }
    for (int j = 0; j < m; j++) {
        ids[k] = c[j].i;
        p[k++] = (float)(c[j].p / cum);
    }
    return k;
}
