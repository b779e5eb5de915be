/* kvp_matmul: one entry point for every weight matrix (see matmul.h). */
#include "model/matmul.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/matmul_kernels.h"
#include "model/quant.h"

#define MAX_POOL KVP_MATMUL_MAX_THREADS
#define TILE_ROWS 64         /* rows decoded to f32 per sgemm on the prefill path */
#define CHUNK_ROWS 16        /* granularity of a decode split (rows) */
#define GEMM_ROWS 32         /* rows a pool thread packs and multiplies at a time (int8 GEMM) */
#define QUANT_ROWS 4         /* activation rows a pool thread quantizes at a time */
#define SPLIT_MIN_BYTES (256u << 10)  /* smaller matrices are not worth a second thread */
/* Waits poll this many pause instructions (about 70-90 ns each: ~0.15 ms) before they
 * sleep: long enough to span the gaps between a forward pass's matmuls, short enough
 * that a thread without work gives its core back when more threads than cores run. */
#define SPIN_ROUNDS 2000

/* ---- kernel selection ------------------------------------------------------------ */

static kvp_kernel_set kernels;
static const char *simd_name = "scalar";
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static _Atomic int prefill_forced = KVP_PREFILL_AUTO;

#if defined(__x86_64__)
/* CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c") */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static void select_kernels(void)
{
    const char *want = getenv("KVP_SIMD"), *prefill = getenv("KVP_PREFILL");
    if (prefill && !strcmp(prefill, "sgemm"))
        prefill_forced = KVP_PREFILL_SGEMM;
    else if (prefill && !strcmp(prefill, "int8"))
        prefill_forced = KVP_PREFILL_INT8;
    kvp_kernels_scalar(&kernels);
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    if (want && !strcmp(want, "scalar"))
        return;
    if (avx2) {
        kvp_kernels_avx2(&kernels);
        simd_name = "avx2";
    }
    if (avx512 && !(want && !strcmp(want, "avx2"))) {
        kvp_kernels_avx512(&kernels);
        simd_name = "avx512";
        if (__builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bitalg"))
            kvp_kernels_avx512vbmi(&kernels);
    }
#else
    (void)want;
#endif
}

float kvp_kv_dot(kvp_kv_type t, const void *row, const float *q, int n)
{
    pthread_once(&init_once, select_kernels);
    return kernels.kv_dot(t, row, q, n);
}

void kvp_kv_axpy(kvp_kv_type t, float *y, float a, const void *row, int n)
{
    pthread_once(&init_once, select_kernels);
    kernels.kv_axpy(t, y, a, row, n);
}

void kvp_kv_store(kvp_kv_type t, void *row, const float *x, int n)
{
    pthread_once(&init_once, select_kernels);
    kernels.kv_store(t, row, x, n);
}

void kvp_kv_dots(kvp_kv_type t, const void *rows, int n_rows, const float *q, int n, float scale,
                 float *out)
{
    pthread_once(&init_once, select_kernels);
    kernels.kv_dots(t, rows, n_rows, q, n, scale, out);
}

void kvp_kv_mix(kvp_kv_type t, const void *rows, int n_rows, const float *a, int n, float *y)
{
    pthread_once(&init_once, select_kernels);
    kernels.kv_mix(t, rows, n_rows, a, n, y);
}

const char *kvp_matmul_simd(void)
{
    pthread_once(&init_once, select_kernels);
    return simd_name;
}

/* ---- activations: quantized once per matrix --------------------------------------- */

enum act_kind { ACT_F32, ACT_Q8, ACT_Q8_K };

static enum act_kind act_kind(uint32_t type)
{
    switch (type) {
    case KVP_GGML_F32: case KVP_GGML_F16: case KVP_GGML_BF16:
        return ACT_F32;
    case KVP_GGML_Q8_0: case KVP_GGML_Q4_0: case KVP_GGML_Q4_1: case KVP_GGML_Q5_0:
    case KVP_GGML_Q5_1:
        return ACT_Q8;
    default:
        return ACT_Q8_K;
    }
}

/* Bytes of the scratch that holds one quantized activation row of n elements. */
static size_t act_bytes(int n)
{
    size_t pad = (size_t)kvp_group_pad(n, 32);  /* the larger of the two paddings */
    return (size_t)n + (size_t)(n / KVP_QK) * 2 * sizeof(float) +
           (size_t)(n / 16) * (sizeof(int16_t) + sizeof(float)) +
           (size_t)(n / 4) * (sizeof(int32_t) + sizeof(float)) +
           (size_t)KVP_X4_GROUPS(n) * (128 + 16 * (sizeof(int32_t) + sizeof(float))) + pad +
           2 * pad / 16 * sizeof(float) + 64;   /* + 64: qg starts on a cache line */
}

/* decode: also the small-T kernels' and regroup32's copies (the int8 GEMM reads neither) */
static void act_quantize(kvp_act *a, enum act_kind kind, const float *x, int n, void *scratch,
                         int decode)
{
    a->n = n;
    a->x = x;
    if (kind == ACT_F32)
        return;
    a->d = scratch;
    a->s = a->d + n / KVP_QK;
    a->s16 = a->s + n / KVP_QK;
    a->d4 = a->s16 + n / 16;
    a->o4 = (int32_t *)(a->d4 + n / 4);
    a->dx = (float *)(a->o4 + n / 4);
    a->ox = (int32_t *)(a->dx + 16 * KVP_X4_GROUPS(n));
    a->qx = (int8_t *)(a->ox + 16 * KVP_X4_GROUPS(n));
    a->bsums = (int16_t *)(a->qx + 128 * KVP_X4_GROUPS(n));
    a->q = (int8_t *)(a->bsums + n / 16);
    if (kind == ACT_Q8) {
        kernels.quantize[0](x, n, a);
        if (decode && kernels.regroup32)
            kernels.regroup32(a);
        if (decode && kernels.small_prep)
            kernels.small_prep(a);
        return;
    }
    kernels.quantize[1](x, n, a);
    for (int g = 0; g < n / 16; g++)
        a->s16[g] = a->d[g / 16] * (float)a->bsums[g];
}

/* The grouped copy of a quantized activation row for the SIMD GEMM (matmul_kernels.h):
 * codes, and the scale and d * sum(q) of each sub-block of the weight type's size. */
static void act_group(kvp_act *a, uint32_t type, enum act_kind kind)
{
    int n = a->n, g = kvp_gemm_group(type), pad = kvp_group_pad(n, g);
    a->g = g;
    a->qg = (int8_t *)(((uintptr_t)(a->q + n) + 63) & ~(uintptr_t)63);
    a->dg = (float *)(a->qg + pad);
    a->sg = a->dg + pad / g;
    kvp_group_bytes((const uint8_t *)a->q, n, g, (uint8_t *)a->qg);
    for (int j = 0; j < pad / g; j++) {
        if (j * g >= n) {
            a->dg[j] = a->sg[j] = 0.0f;
        } else if (kind == ACT_Q8) {  /* g = 32, the activation's own blocks */
            a->dg[j] = a->d[j];
            a->sg[j] = a->s[j];
        } else if (g == 16) {
            a->dg[j] = a->d[j / 16];
            a->sg[j] = a->s16[j];
        } else {
            a->dg[j] = a->d[j / 8];
            a->sg[j] = a->s16[2 * j] + a->s16[2 * j + 1];
        }
    }
}

/* ---- thread pool: helpers take row chunks of the caller's job ----------------------- */

/* One matrix of a decode job: its rows are rows [row0, row0 + w->rows) of the job. */
typedef struct segment {
    const kvp_weight *w;
    const kvp_act *act;   /* [T], or NULL for f32 weights (f32_rows reads x) */
    const float *x;       /* [T][w->cols] */
    float *y;             /* [T][w->rows] */
    int row0;
} segment;

#define MAX_SEGMENTS 3

typedef struct job {
    void (*fn)(const struct job *j, int r0, int r1);
    const segment *seg;   /* decode: the matrices, in row order */
    int n_seg;
    void (*item)(void *ctx, int i, int slot);   /* kvp_matmul_parallel's items */
    void *ctx;
    int slots;            /* threads whose slot is below this take part (0: all) */
    int linger;           /* the helpers poll for the next job afterwards */
    const kvp_weight *w;
    kvp_act *act;         /* [T] */
    const float *x;       /* [T][cols]: activations to quantize into act */
    unsigned char *scratch;
    size_t per;           /* scratch bytes per activation row */
    float *y;
    int T, accumulate;
    int rows, chunk;
    int guided;           /* 1: claims shrink with the rows left (decode), else fixed chunks */
    int threads;          /* threads sharing the job, set by run_job */
    atomic_int next;      /* next unclaimed row */
} job;

/* A job is open from its start until the caller has run out of rows: a helper joins it
 * (running + 1, then checks `open`) only while it is open, so the caller waits for the
 * helpers that joined, never for one that has not been scheduled yet. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* helpers sleep here between jobs */
    pthread_cond_t done;   /* the caller sleeps here for the helpers still in its job */
    atomic_uint gen;       /* bumped for every job */
    atomic_uint open;      /* the generation of the job helpers may join (0: none) */
    atomic_int running;    /* helpers inside a job */
    atomic_int waiting;    /* the caller sleeps on `done` */
    job *volatile cur;
    atomic_int linger;     /* the current job's: poll for the next one after it */
    atomic_int slots;      /* the current job's slot limit (0: all) */
    int n_helpers;
    atomic_int next_slot;  /* slots handed to helpers as they start */
    atomic_int owner;      /* 1 while a caller drives the pool */
    atomic_int passes;     /* forward passes in progress (kvp_matmul_enter / leave) */
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
            .done = PTHREAD_COND_INITIALIZER};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static _Atomic int threads_forced;   /* kvp_matmul_force_threads (0: none) */
/* Which thread this is to kvp_matmul_parallel's items: 0 for callers, 1.. for helpers. */
static _Thread_local int pool_slot;

static void run_chunks(job *j)
{
    for (;;) {
        int r0 = atomic_load_explicit(&j->next, memory_order_relaxed), n = j->chunk;
        if (j->threads > 1) {
            /* guided: a share of what is left, so each thread streams long contiguous
             * runs of rows and the last pieces are small enough to even out the end */
            n = (j->rows - r0) / (2 * j->threads);
            n = n < j->chunk ? j->chunk : (n + j->chunk - 1) / j->chunk * j->chunk;
        }
        if (r0 >= j->rows)
            return;
        if (!atomic_compare_exchange_weak(&j->next, &r0, r0 + n))
            continue;
        j->fn(j, r0, r0 + n < j->rows ? r0 + n : j->rows);
    }
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

static void *helper_main(void *arg)
{
    unsigned seen = (unsigned)(uintptr_t)arg;  /* the generation before the helper existed */
    pool_slot = atomic_fetch_add(&pool.next_slot, 1) + 1;
    int linger = 1;
    for (;;) {
        int spins = 0;
        while (linger && atomic_load_explicit(&pool.gen, memory_order_acquire) == seen &&
               spins < SPIN_ROUNDS) {
            cpu_relax();
            spins++;
        }
        if (atomic_load_explicit(&pool.gen, memory_order_acquire) == seen) {
            pthread_mutex_lock(&pool.mu);
            while (atomic_load(&pool.gen) == seen)
                pthread_cond_wait(&pool.wake, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = atomic_load(&pool.gen);
        atomic_fetch_add(&pool.running, 1);
        if (atomic_load(&pool.open) == seen) {   /* else the caller has finished it */
            int slots = atomic_load(&pool.slots);
            linger = atomic_load(&pool.linger);
            if (!slots || pool_slot < slots)
                run_chunks(pool.cur);
        }
        if (atomic_fetch_sub(&pool.running, 1) == 1 && atomic_load(&pool.waiting)) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_broadcast(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

/* The pool's size, the caller included (KVP_THREADS, else the online CPUs). */
static int pool_size(void)
{
    static _Atomic int size;
    int n = atomic_load(&size);
    if (!n) {
        long v = sysconf(_SC_NPROCESSORS_ONLN);
        const char *env = getenv("KVP_THREADS");
        if (env)
            v = strtol(env, NULL, 10);
        n = v < 1 ? 1 : v > MAX_POOL ? MAX_POOL : (int)v;
        atomic_store(&size, n);
    }
    return n;
}

static void start_pool(void)
{
    int n = pool_size();
    for (int i = 0; i < n - 1; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        void *gen = (void *)(uintptr_t)atomic_load(&pool.gen);
        if (pthread_create(&t, &attr, helper_main, gen) == 0)
            pool.n_helpers++;
        pthread_attr_destroy(&attr);
    }
}

void kvp_matmul_start(void) { pthread_once(&pool_once, start_pool); }

void kvp_matmul_enter(void) { atomic_fetch_add(&pool.passes, 1); }
void kvp_matmul_leave(void) { atomic_fetch_sub(&pool.passes, 1); }

/* Runs j over its rows: on the pool when this is the only forward pass and the pool is
 * free, else on the calling thread alone. */
static void run_job(job *j, size_t bytes)
{
    atomic_init(&j->next, 0);
    int cap = atomic_load(&threads_forced);
    if (cap && (!j->slots || j->slots > cap))
        j->slots = cap;
    int alone = bytes < SPLIT_MIN_BYTES || atomic_load(&pool.passes) > 1 || j->slots == 1;
    int expected = 0;
    if (!alone) {
        pthread_once(&pool_once, start_pool);
        alone = pool.n_helpers == 0 || !atomic_compare_exchange_strong(&pool.owner, &expected, 1);
    }
    if (alone) {
        run_chunks(j);
        return;
    }
    if (j->guided)
        j->threads = j->slots && j->slots < pool.n_helpers + 1 ? j->slots : pool.n_helpers + 1;
    pool.cur = j;
    atomic_store(&pool.linger, j->linger);
    atomic_store(&pool.slots, j->slots);
    unsigned gen = atomic_load(&pool.gen) + 1;   /* only the owner bumps it; never 0 */
    gen += gen == 0;
    atomic_store(&pool.open, gen);
    pthread_mutex_lock(&pool.mu);
    atomic_store(&pool.gen, gen);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    run_chunks(j);
    /* close the job, then wait for the helpers that joined it: poll, then sleep */
    atomic_store(&pool.open, 0);
    for (int spins = 0; atomic_load(&pool.running) > 0 && spins < SPIN_ROUNDS; spins++)
        cpu_relax();
    if (atomic_load(&pool.running) > 0) {
        pthread_mutex_lock(&pool.mu);
        atomic_store(&pool.waiting, 1);
        while (atomic_load(&pool.running) > 0)
            pthread_cond_wait(&pool.done, &pool.mu);
        atomic_store(&pool.waiting, 0);
        pthread_mutex_unlock(&pool.mu);
    }
    atomic_store(&pool.owner, 0);
}

/* ---- work items of the forward pass on the same threads ------------------------------ */

static void run_items(const job *j, int i0, int i1)
{
    for (int i = i0; i < i1; i++)
        j->item(j->ctx, i, pool_slot);
}

int kvp_matmul_threads(void)
{
    int cap = atomic_load(&threads_forced), n = pool_size();   /* started on first use */
    return cap && cap < n ? cap : n;
}

void kvp_matmul_force_threads(int n) { atomic_store(&threads_forced, n > 0 ? n : 0); }

void kvp_matmul_parallel(int n, void (*fn)(void *ctx, int i, int slot), void *ctx, size_t bytes,
                         int slots, int linger)
{
    if (n <= 0)
        return;
    job j = {.fn = run_items, .item = fn, .ctx = ctx, .rows = n, .chunk = 1,
             .slots = slots < 1 ? 1 : slots, .linger = linger};
    run_job(&j, n > 1 ? bytes : 0);
}

/* ---- the two paths ------------------------------------------------------------------ */

static void dot_rows(const job *j, int r0, int r1)
{
    for (const segment *g = j->seg; g < j->seg + j->n_seg; g++) {
        const kvp_weight *w = g->w;
        int a = r0 > g->row0 ? r0 - g->row0 : 0, b = r1 - g->row0 < w->rows ? r1 - g->row0 : w->rows;
        if (a >= b)
            continue;
        if (!g->act) {   /* f32: each weight row read once for all T activation rows */
            kernels.f32_rows((const float *)w->data + (size_t)a * w->cols, b - a, w->cols, g->x,
                             j->T, g->y + a, w->rows, j->accumulate);
            continue;
        }
        if (kernels.small[w->type]) {   /* each block read once for all T activation rows */
            kernels.small[w->type]((const uint8_t *)w->data + (size_t)a * w->row_bytes,
                                   w->row_bytes, b - a, g->act, j->T, g->y + a, w->rows,
                                   j->accumulate);
            continue;
        }
        kvp_dot_fn dot = kernels.dot[w->type];
        kvp_rows_fn rows = kernels.rows[w->type];
        for (int t = 0; t < j->T; t++) {
            float *y = g->y + (size_t)t * w->rows;
            if (rows && b > a) {
                rows((const uint8_t *)w->data + (size_t)a * w->row_bytes, w->row_bytes, b - a,
                     &g->act[t], y + a, j->accumulate);
                continue;
            }
            for (int r = a; r < b; r++) {
                float v = dot((const uint8_t *)w->data + (size_t)r * w->row_bytes, &g->act[t]);
                y[r] = j->accumulate ? y[r] + v : v;
            }
        }
    }
}

/* Whether a block of T activation rows against w takes the decode path (matmul_decode):
 * f32 weights up to KVP_F32_SMALL_T rows and types with a small-T kernel up to
 * KVP_QUANT_SMALL_T (each weight row streamed once, no packing: cheaper than sgemm or
 * the int8 GEMM there, see docs/benchmarks.md) unless a prefill path is forced, the other types
 * below KVP_MATMUL_TILE_MIN_T. */
static int decode_path(const kvp_weight *w, int T)
{
    int forced = atomic_load(&prefill_forced);
    if (w->type == KVP_GGML_F32)
        return T <= KVP_F32_SMALL_T && forced != KVP_PREFILL_SGEMM;
    if (kernels.small[w->type] && forced == KVP_PREFILL_AUTO)
        return T <= KVP_QUANT_SMALL_T;
    return T < KVP_MATMUL_TILE_MIN_T;
}

/* n matrices that read the same activations x[T][cols], as one job: each activation row
 * is quantized once per kind and the pool meets once for all their rows. */
static void matmul_decode(int n, float *const y[], const float *x, const kvp_weight *const w[],
                          int T, int accumulate)
{
    enum act_kind kinds[MAX_SEGMENTS];
    kvp_act *act[MAX_SEGMENTS];   /* [T] each: a matrix's quantized activation rows */
    segment seg[MAX_SEGMENTS];
    size_t per = act_bytes(w[0]->cols);
    /* quantized activations (f32 matrices read x) */
    size_t quantized_T = 0;
    for (int i = 0; i < n; i++)
        quantized_T = w[i]->type != KVP_GGML_F32 ? (size_t)T : quantized_T;
    kvp_act *acts = malloc((sizeof *acts + per) * quantized_T * (size_t)n + 1);
    if (!acts)
        abort();  /* some KB; the forward pass has no way to report it */
    unsigned char *scratch = (unsigned char *)(acts + quantized_T * (size_t)n);
    int rows = 0;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        kinds[i] = act_kind(w[i]->type);
        int f32 = w[i]->type == KVP_GGML_F32, same = 0;
        while (same < i && (kinds[same] != kinds[i] || w[same]->type == KVP_GGML_F32))
            same++;
        act[i] = acts + (size_t)i * quantized_T;
        if (!f32 && same < i) {
            memcpy(act[i], act[same], (size_t)T * sizeof *act[i]);
        } else if (!f32) {   /* (f32_rows reads x itself) */
            for (int t = 0; t < T; t++)
                act_quantize(&act[i][t], kinds[i], x + (size_t)t * w[i]->cols, w[i]->cols,
                             scratch + per * ((size_t)i * T + t), 1);
        }
        seg[i] = (segment){.w = w[i], .act = f32 ? NULL : act[i], .x = x, .y = y[i], .row0 = rows};
        rows += w[i]->rows;
        bytes += (size_t)w[i]->rows * w[i]->row_bytes;
    }
    job j = {.fn = dot_rows, .seg = seg, .n_seg = n, .T = T, .accumulate = accumulate,
             .rows = rows, .chunk = CHUNK_ROWS, .guided = 1, .linger = 1};
    run_job(&j, bytes);
    free(acts);
}

/* Buffers of the calling thread, kept between calls: prefill's buffers are MBs, and
 * malloc would map fresh pages (page faults) on every matrix. They are freed when the
 * thread exits (a daemon worker, a pool thread). */
typedef struct scratch_buf {
    void *p;
    size_t cap;
} scratch_buf;

typedef struct scratch_set {
    scratch_buf tile, packed, act, codes;
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg)
{
    scratch_set *s = arg;
    free(s->tile.p);
    free(s->packed.p);
    free(s->act.p);
    free(s->codes.p);
    free(s);
}

static void scratch_key_init(void)
{
    if (pthread_key_create(&scratch_key, scratch_free))
        abort();
}

static scratch_set *thread_scratch(void)
{
    pthread_once(&scratch_once, scratch_key_init);
    scratch_set *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)) || pthread_setspecific(scratch_key, s))
            abort();  /* the forward pass has no way to report it */
    }
    return s;
}

static void *scratch_grow(scratch_buf *b, size_t need)
{
    if (need > b->cap) {
        free(b->p);
        /* cache-line aligned: the int8 GEMM's 512-bit loads of packed rows (whose
         * stride is a multiple of 64) do not straddle two lines */
        b->p = aligned_alloc(64, (need + 63) / 64 * 64);
        b->cap = b->p ? need : 0;
        if (!b->p)
            abort();  /* the forward pass has no way to report it */
    }
    return b->p;
}

/* ---- prefill path 1: decode tiles of rows to f32, sgemm (f32 activations, exact) ---- */

/* One pool thread's tiles: each decodes TILE_ROWS rows into its own buffer and runs the
 * sgemm that fills their columns of y (the threads write disjoint columns). */
static void tile_rows(const job *j, int r0, int r1)
{
    const kvp_weight *w = j->w;
    float *tile = scratch_grow(&thread_scratch()->tile, (size_t)TILE_ROWS * w->cols * sizeof *tile);
    kvp_dequantize(w->type, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, tile,
                   (uint64_t)(r1 - r0) * w->cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, r1 - r0, w->cols, 1.0f, j->x,
                w->cols, tile, w->cols, j->accumulate ? 1.0f : 0.0f, j->y + r0, w->rows);
}

/* The tiles go to the pool's threads, so an f16/bf16 model's prefill uses every core
 * (OpenBLAS keeps one thread for such models, kvp_model_use_cores). */
static void matmul_tiles(float *y, const float *x, const kvp_weight *w, int T, int accumulate)
{
    job j = {.fn = tile_rows, .w = w, .x = x, .y = y, .T = T, .accumulate = accumulate,
             .rows = w->rows, .chunk = TILE_ROWS, .linger = 1};
    run_job(&j, (size_t)w->rows * w->row_bytes * (size_t)T);
}

/* ---- prefill path 2: int8 GEMM (activations quantized as decode does) ---------------- */

static void quantize_rows(const job *j, int t0, int t1)
{
    enum act_kind kind = act_kind(j->w->type);
    for (int t = t0; t < t1; t++) {
        act_quantize(&j->act[t], kind, j->x + (size_t)t * j->w->cols, j->w->cols,
                     j->scratch + j->per * (size_t)t, 0);
        act_group(&j->act[t], j->w->type, kind);
    }
}

/* Packs a chunk of rows (each thread keeps its own buffer) and multiplies it with every
 * activation row of the block. */
static void gemm_rows(const job *j, int r0, int r1)
{
    const kvp_weight *w = j->w;
    size_t stride = KVP_PACK_BYTES(w->cols);
    uint8_t *packed = scratch_grow(&thread_scratch()->packed, stride * (size_t)(r1 - r0));
    for (int r = r0; r < r1; r++)
        kernels.pack[w->type]((const uint8_t *)w->data + (size_t)r * w->row_bytes, w->cols,
                              packed + stride * (size_t)(r - r0));
    kernels.gemm[w->type](packed, stride, r1 - r0, j->act, j->T, j->y + r0, w->rows, j->accumulate);
}

static void matmul_int8(float *y, const float *x, const kvp_weight *w, int T, int accumulate)
{
    scratch_set *own = thread_scratch();
    size_t per = act_bytes(w->cols);
    kvp_act *act = scratch_grow(&own->act, (size_t)T * sizeof *act);
    unsigned char *scratch = scratch_grow(&own->codes, per * (size_t)T);
    job q = {.fn = quantize_rows, .w = w, .act = act, .x = x, .scratch = scratch, .per = per,
             .rows = T, .chunk = QUANT_ROWS, .linger = 1};
    run_job(&q, (size_t)T * w->cols * sizeof *x);
    job j = {.fn = gemm_rows, .w = w, .act = act, .y = y, .T = T, .accumulate = accumulate,
             .rows = w->rows, .chunk = GEMM_ROWS, .linger = 1};
    run_job(&j, (size_t)w->rows * w->row_bytes * (size_t)T);
}

/* Which prefill path a type takes unless one is forced: the int8 GEMM where the type
 * has one (measured faster than tiles + sgemm for every block format, see docs/benchmarks.md). */
static int prefill_int8(uint32_t type)
{
    if (!kernels.pack[type])
        return 0;
    int forced = atomic_load(&prefill_forced);
    return forced != KVP_PREFILL_SGEMM;
}

int kvp_matmul_pooled(const kvp_weight *w, int T)
{
    pthread_once(&init_once, select_kernels);
    return decode_path(w, T) || prefill_int8(w->type);
}

void kvp_matmul_force_prefill(enum kvp_prefill_path path)
{
    pthread_once(&init_once, select_kernels);
    atomic_store(&prefill_forced, path);
}

const char *kvp_matmul_prefill_path(uint32_t type)
{
    pthread_once(&init_once, select_kernels);
    return type == KVP_GGML_F32 ? "f32 sgemm" : prefill_int8(type) ? "int8" : "sgemm";
}

void kvp_matmul(float *y, const float *x, const kvp_weight *w, int T, int accumulate)
{
    pthread_once(&init_once, select_kernels);
    if (decode_path(w, T)) {
        matmul_decode(1, &y, x, &w, T, accumulate);
    } else if (w->type == KVP_GGML_F32) {
        const float *a = w->data;
        if (T == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, w->rows, w->cols, 1.0f, a, w->cols, x, 1,
                        accumulate ? 1.0f : 0.0f, y, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, w->rows, w->cols, 1.0f, x,
                        w->cols, a, w->cols, accumulate ? 1.0f : 0.0f, y, w->rows);
    } else if (prefill_int8(w->type)) {
        matmul_int8(y, x, w, T, accumulate);
    } else {
        matmul_tiles(y, x, w, T, accumulate);
    }
}

void kvp_matmul_shared(int n, float *const y[], const float *x, const kvp_weight *const w[], int T)
{
    pthread_once(&init_once, select_kernels);
    int fused = n <= MAX_SEGMENTS;
    for (int i = 0; i < n && fused; i++)
        fused = decode_path(w[i], T) && w[i]->cols == w[0]->cols;
    if (fused) {
        matmul_decode(n, y, x, w, T, 0);
        return;
    }
    for (int i = 0; i < n; i++)
        kvp_matmul(y[i], x, w[i], T, 0);
}

void kvp_weight_row(const kvp_weight *w, int r, float *out)
{
    kvp_dequantize(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, out,
                   (uint64_t)w->cols);
}
