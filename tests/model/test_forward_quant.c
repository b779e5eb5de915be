/* The forward pass on quantized weights against ggml's fixtures
 * (../shared/fixtures/arch/NAME.gguf and NAME.expected.gguf): the exact path (weights
 * decoded to f32, f32 activations: a prefill block on the tiles + sgemm path) within
 * 1e-4 of `logits`; the decode path and the int8 GEMM prefill (8-bit activations) about
 * as far from `logits` as ggml's own quantized path (`logits_ggml_quantized`). meson
 * runs it with the CPU's kernels and KVP_SIMD=scalar. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/matmul.h"
#include "model/model.h"
#include "testutil.h"

enum { N_TOK = 24 };

typedef struct fixture {
    kvp_model m;
    kvp_gguf want;
    int tokens[N_TOK];
    const float *logits, *ggml_quantized;  /* [N_TOK][vocab] */
} fixture;

static void load(fixture *f, const char *name)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "fixtures/arch/%s.gguf", name);
    cr_assert_eq(kvp_model_load(&f->m, tu_shared(path), NULL, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "fixtures/arch/%s.expected.gguf", name);
    cr_assert_eq(kvp_gguf_open(&f->want, tu_shared(path), err, sizeof err), 0, "%s", err);
    const kvp_gguf_kv *kv = kvp_gguf_find(&f->want, "fixture.tokens");
    cr_assert(kv && kv->type == KVP_GGUF_ARRAY && kv->val.arr.n == N_TOK &&
              (kv->val.arr.type == KVP_GGUF_INT32 || kv->val.arr.type == KVP_GGUF_UINT32));
    memcpy(f->tokens, kv->val.arr.data, sizeof f->tokens);
    const kvp_gguf_tensor *l = kvp_gguf_find_tensor(&f->want, "logits");
    const kvp_gguf_tensor *q = kvp_gguf_find_tensor(&f->want, "logits_ggml_quantized");
    cr_assert(l && q && l->ne[0] == (uint64_t)f->m.cfg.vocab_size && l->ne[1] == N_TOK);
    f->logits = l->data;
    f->ggml_quantized = q->data;
}

static void unload(fixture *f)
{
    kvp_gguf_close(&f->want);
    kvp_model_free(&f->m);
}

/* Runs the tokens as one block (block = 1: one at a time) and returns all logits. */
static float *run(const fixture *f, int block)
{
    int V = f->m.cfg.vocab_size;
    float *out = malloc((size_t)N_TOK * V * sizeof *out);
    kvp_runstate s;
    kvp_cache c;
    cr_assert_eq(kvp_runstate_init(&s, &f->m.cfg, N_TOK), 0);
    cr_assert_eq(kvp_cache_init(&c, f->m.cfg.n_layers, f->m.cfg.n_kv_heads, f->m.cfg.head_dim,
                                &f->m.cfg.rope), 0);
    for (int t = 0; t < N_TOK; t += block)
        cr_assert_eq(kvp_forward(&f->m, &s, &c, f->tokens + t, block, out + (size_t)t * V), 0);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    return out;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void check(const char *name, uint32_t matrix_type)
{
    fixture f;
    load(&f, name);
    cr_assert_eq(f.m.layers[0].wq.type, matrix_type, "%s keeps its matrices in their type", name);
    size_t n = (size_t)N_TOK * f.m.cfg.vocab_size;
    double top = max_diff(f.logits, (float[1]){0}, 1);
    for (size_t i = 0; i < n; i++)
        top = fmax(top, fabs(f.logits[i]));

    kvp_matmul_force_prefill(KVP_PREFILL_SGEMM);
    float *exact = run(&f, N_TOK);
    kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
    double e = max_diff(exact, f.logits, n);
    cr_expect(e <= 1e-4, "%s exact path: max |logit error| %.3g > 1e-4", name, e);

    float *fast = run(&f, 1);
    double ggml = max_diff(f.ggml_quantized, f.logits, n), got = max_diff(fast, f.logits, n);
    cr_expect(got <= 1.25 * ggml, "%s decode path (%s): max |logit error| %.4g, ggml's quantized "
              "path %.4g (largest logit %.3g)", name, kvp_matmul_simd(), got, ggml, top);
    cr_expect(got > 1e-4, "%s decode path: suspiciously exact (%.3g): are activations quantized?",
              name, got);

    cr_assert_str_eq(kvp_matmul_prefill_path(matrix_type), "int8");
    float *gemm = run(&f, N_TOK);
    double prefill = max_diff(gemm, f.logits, n);
    cr_expect(prefill <= 1.25 * ggml, "%s int8 prefill (%s): max |logit error| %.4g, ggml's "
              "quantized path %.4g", name, kvp_matmul_simd(), prefill, ggml);
    cr_expect(prefill > 1e-4, "%s int8 prefill: suspiciously exact (%.3g)", name, prefill);
    free(gemm);
    free(exact);
    free(fast);
    unload(&f);
}

Test(forward_quant, llama_q8_0) { check("llama-q8_0", KVP_GGML_Q8_0); }
Test(forward_quant, llama_q6_K) { check("llama-q6_K", KVP_GGML_Q6_K); }
Test(forward_quant, qwen2_q4_K) { check("qwen2-q4_K", KVP_GGML_Q4_K); }

/* ---- KV cache rows stored as f16 / q8_0 ------------------------------------------- */

/* logits of tokens[0..n) run in blocks of `block` on a cache storing rows as `type` */
static float *run_kv(const kvp_model *m, const int *tokens, int n, int block, kvp_kv_type type)
{
    int V = m->cfg.vocab_size;
    float *out = malloc((size_t)n * V * sizeof *out);
    kvp_runstate s;
    kvp_cache c;
    cr_assert_eq(kvp_runstate_init(&s, &m->cfg, block), 0);
    cr_assert_eq(kvp_cache_init(&c, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim,
                                &m->cfg.rope), 0);
    cr_assert_eq(kvp_cache_convert(&c, type), 0);
    for (int t = 0; t < n; t += block) {
        int b = n - t < block ? n - t : block;
        cr_assert_eq(kvp_forward(m, &s, &c, tokens + t, b, out + (size_t)t * V), 0);
    }
    cr_assert_eq(c.kv_type, type);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    return out;
}

/* KL(softmax(p) || softmax(q)) in nats */
static double kl_logits(const float *p, const float *q, int V)
{
    double mp = p[0], mq = q[0], zp = 0, zq = 0, kl = 0;
    for (int i = 1; i < V; i++) {
        mp = fmax(mp, p[i]);
        mq = fmax(mq, q[i]);
    }
    for (int i = 0; i < V; i++) {
        zp += exp(p[i] - mp);
        zq += exp(q[i] - mq);
    }
    for (int i = 0; i < V; i++) {
        double lp = p[i] - mp - log(zp), lq = q[i] - mq - log(zq);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

/* Attention reads f16 and q8_0 rows as stored (SIMD and scalar kernels): the logits stay
 * within the rows' rounding of the f32 cache's, and a prefill block equals one token at a
 * time on the same row type (the block's causal mask is applied on the stored rows). */
Test(forward_quant, kv_rows_f16_and_q8_0_stay_close_to_f32)
{
    const char *models[][2] = {{"models/stories260K.bin", "models/tok512.bin"},
                               {"fixtures/arch/llama-plain.gguf", NULL},
                               {"fixtures/arch/qwen2-bias-tied.gguf", NULL}};
    for (int mi = 0; mi < 3; mi++) {
        kvp_model m;
        char err[512];
        cr_assert_eq(kvp_model_load(&m, tu_shared(models[mi][0]),
                                    models[mi][1] ? tu_shared(models[mi][1]) : NULL, err, sizeof err),
                     0, "%s", err);
        int V = m.cfg.vocab_size, n = m.cfg.seq_len < 160 ? m.cfg.seq_len : 160;
        int *tokens = malloc((size_t)n * sizeof *tokens);
        uint64_t x = 88172645463325252ull;
        for (int t = 0; t < n; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            tokens[t] = t == 0 ? 1 : (int)(x % (uint64_t)V);
        }
        float *ref = run_kv(&m, tokens, n, 32, KVP_KV_F32);
        double worst[3] = {0}, mean[3] = {0};
        for (int ti = 1; ti < 3; ti++) {
            float *got = run_kv(&m, tokens, n, 32, (kvp_kv_type)ti);
            float *one = run_kv(&m, tokens, n, 1, (kvp_kv_type)ti);
            for (int t = 0; t < n; t++) {
                double kl = kl_logits(ref + (size_t)t * V, got + (size_t)t * V, V);
                worst[ti] = fmax(worst[ti], kl);
                mean[ti] += kl / n;
            }
            /* the weights' prefill and decode paths differ by ~1e-6, which can move a
             * value across a rounding boundary of the stored row: compare distributions */
            double d = 0;
            for (int t = 0; t < n; t++)
                d = fmax(d, kl_logits(one + (size_t)t * V, got + (size_t)t * V, V));
            cr_expect_leq(d, 1e-3, "%s %s: block vs one at a time, KL %g", models[mi][0],
                          kvp_kv_type_name((kvp_kv_type)ti), d);
            free(got);
            free(one);
        }
        /* f16 rows: ~1e-3 relative rounding; q8_0: ~1/254 of each block's largest value.
         * Measured (random tokens): stories260K (head_dim 8: a block is a whole row)
         * q8_0 mean 2.4e-3, worst 2.2e-2 (max / 127 scales: 2.8e-3, 3.2e-2); the fixtures
         * (wider heads) 1e-5 or less, worst 6e-4. */
        cr_expect_leq(mean[KVP_KV_F16], 1e-5, "%s: f16 mean KL %g", models[mi][0], mean[1]);
        cr_expect_leq(worst[KVP_KV_F16], 1e-4, "%s: f16 worst KL %g", models[mi][0], worst[1]);
        cr_expect_leq(mean[KVP_KV_Q8_0], 5e-3, "%s: q8_0 mean KL %g", models[mi][0], mean[2]);
        cr_expect_leq(worst[KVP_KV_Q8_0], 5e-2, "%s: q8_0 worst KL %g", models[mi][0], worst[2]);
        cr_expect_gt(mean[KVP_KV_Q8_0], 0.0, "q8_0 rows changed nothing: not stored as q8_0?");
        fprintf(stderr, "%s: KL vs f32 rows: f16 mean %.2g worst %.2g; q8_0 mean %.2g worst %.2g\n",
                models[mi][0], mean[1], worst[1], mean[2], worst[2]);
        free(ref);
        free(tokens);
        kvp_model_free(&m);
    }
}

/* The dispatched kernels (SIMD when the CPU has it) equal the portable ones. */
Test(forward_quant, kv_row_kernels_equal_the_portable_ones)
{
    unsigned char row[4 * 136];
    float x[136], q[136], y1[136], y2[136];
    const int ns[] = {8, 16, 24, 32, 40, 64, 72, 128, 136, 7, 9, 33};
    for (int ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++)
        for (int t = 0; t < 3; t++) {
            int n = ns[ni];
            for (int i = 0; i < n; i++) {
                x[i] = sinf((float)(i * 7 + n + t)) * (i % 5 ? 1.0f : 9.0f);
                q[i] = cosf((float)(i * 3 - n));
                y1[i] = y2[i] = (float)i * 0.1f;
            }
            kvp_kv_row_store((kvp_kv_type)t, row, x, n);
            float a = kvp_kv_dot((kvp_kv_type)t, row, q, n);
            float b = kvp_kv_row_dot((kvp_kv_type)t, row, q, n);
            cr_expect(fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b)), "%s n=%d: %g vs %g (%s)",
                      kvp_kv_type_name((kvp_kv_type)t), n, a, b, kvp_matmul_simd());
            kvp_kv_axpy((kvp_kv_type)t, y1, 0.37f, row, n);
            kvp_kv_row_axpy((kvp_kv_type)t, y2, 0.37f, row, n);
            for (int i = 0; i < n; i++)
                cr_expect(fabsf(y1[i] - y2[i]) <= 1e-6f * (1.0f + fabsf(y2[i])), "%s n=%d axpy[%d]",
                          kvp_kv_type_name((kvp_kv_type)t), n, i);
        }
}

/* kvp_kv_store (F16C and the AVX2 q8_0 scale search when the CPU has them) writes
 * kvp_kv_row_store's bytes, for every f32 bit pattern class: normals of every exponent,
 * f16 subnormals and underflow, halfway cases, overflow to inf, inf and NaNs with
 * payloads, both signs. */
Test(forward_quant, kv_store_writes_the_portable_bytes)
{
    enum { MAXN = 137 };
    unsigned char a[4 * MAXN], b[4 * MAXN];
    float x[MAXN];
    const int ns[] = {1, 7, 8, 9, 16, 64, 128, 136, MAXN};
    uint64_t s = 12345;
    for (int round = 0; round < 2000; round++) {
        int n = ns[round % (int)(sizeof ns / sizeof ns[0])];
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t u = (uint32_t)(s >> 32);
            switch (round % 4) {
            case 0:   /* any bit pattern */
                break;
            case 1:   /* exponents around f16's range: subnormals, normals, overflow */
                u = (u & 0x807fffffu) | ((uint32_t)(97 + (u >> 23) % 50) << 23);
                break;
            case 2:   /* halfway between two halves: the 13 dropped bits 1000... */
                u = (u & 0xffffe000u) | 0x1000u;
                u = (u & 0x807fffffu) | ((uint32_t)(100 + (u >> 23) % 45) << 23);
                break;
            default:  /* inf and NaNs */
                u = (u & 0x807fffffu) | 0x7f800000u;
                if (i % 3 == 0)
                    u &= 0xff800000u;
                break;
            }
            memcpy(&x[i], &u, sizeof u);
        }
        for (int t = 0; t < KVP_KV_N_TYPES; t++) {
            if (t == KVP_KV_Q8_0 && round % 4 == 3)
                continue;   /* (q8_0 scales of inf / NaN are not meaningful) */
            size_t bytes = kvp_kv_row_bytes((kvp_kv_type)t, n);
            memset(a, 0xa5, sizeof a);
            memset(b, 0xa5, sizeof b);
            kvp_kv_store((kvp_kv_type)t, a, x, n);
            kvp_kv_row_store((kvp_kv_type)t, b, x, n);
            cr_assert(!memcmp(a, b, sizeof a), "%s n=%d round %d: bytes differ (%s, %zu bytes)",
                      kvp_kv_type_name((kvp_kv_type)t), n, round, kvp_matmul_simd(), bytes);
        }
    }
}

/* The attention kernels over a head's consecutive rows give, bit for bit, what the row
 * kernels give: kvp_kv_dots each row's scaled kvp_kv_dot (four rows at a time in the
 * SIMD sets), kvp_kv_mix kvp_kv_axpy's sums over the rows in order from zero (64 numbers
 * of y in registers): row counts around the groups of four, widths with a short last
 * q8_0 block, past 64 numbers, and off the SIMD width (the portable path). */
Test(forward_quant, kv_rows_kernels_equal_the_row_kernels)
{
    enum { MAXR = 37, MAXN = 136 };
    static unsigned char rows[MAXR * 4 * MAXN];
    float x[MAXN], q[MAXN], a[MAXR], out[MAXR], y1[MAXN], y2[MAXN];
    const int ns[] = {8, 24, 40, 64, 72, 128, 136, 7, 33};
    const int counts[] = {0, 1, 3, 4, 5, 8, 9, MAXR};
    for (int ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++)
        for (int t = 0; t < KVP_KV_N_TYPES; t++) {
            int n = ns[ni];
            size_t rb = kvp_kv_row_bytes((kvp_kv_type)t, n);
            for (int j = 0; j < MAXR; j++) {
                for (int i = 0; i < n; i++)
                    x[i] = sinf((float)(i * 7 + j * 13 + n + t)) * (i % 5 ? 1.0f : 9.0f);
                kvp_kv_store((kvp_kv_type)t, rows + j * rb, x, n);
                a[j] = cosf((float)j * 0.7f) * 0.1f;
            }
            for (int i = 0; i < n; i++)
                q[i] = cosf((float)(i * 3 - n));
            for (int ci = 0; ci < (int)(sizeof counts / sizeof counts[0]); ci++) {
                int m = counts[ci];
                kvp_kv_dots((kvp_kv_type)t, rows, m, q, n, 0.125f, out);
                for (int j = 0; j < m; j++) {
                    float want = 0.125f * kvp_kv_dot((kvp_kv_type)t, rows + j * rb, q, n);
                    cr_assert(!memcmp(&out[j], &want, sizeof want),
                              "%s n=%d rows=%d dots[%d]: %.9g vs %.9g (%s)",
                              kvp_kv_type_name((kvp_kv_type)t), n, m, j, (double)out[j],
                              (double)want, kvp_matmul_simd());
                }
                for (int i = 0; i < n; i++)
                    y1[i] = NAN;
                kvp_kv_mix((kvp_kv_type)t, rows, m, a, n, y1);
                memset(y2, 0, sizeof y2);
                for (int j = 0; j < m; j++)
                    kvp_kv_axpy((kvp_kv_type)t, y2, a[j], rows + j * rb, n);
                cr_assert(!memcmp(y1, y2, (size_t)n * sizeof *y1),
                          "%s n=%d rows=%d: mix differs (%s)", kvp_kv_type_name((kvp_kv_type)t),
                          n, m, kvp_matmul_simd());
            }
        }
}
