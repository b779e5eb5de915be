/* Tests for model/matmul.c against ggml's fixtures (../shared/fixtures/quant): each
 * type's matrix-vector product lands within the error that quantizing the activations
 * to 8 bits can cause, the prefill tile + sgemm path matches the f32 product, the int8
 * GEMM prefill equals the per-row matrix-vector product (same activation quantization)
 * for every shape, f32 and Q8_0 weights in small blocks give each row what it gets alone, and
 * the thread pool's row split gives the same rows as one thread, and the pool's helpers
 * keep the priority of the thread that starts them.
 * meson runs this file twice: with the best kernels of the CPU and with KVP_SIMD=scalar. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/matmul.h"
#include "model/quant.h"
#include "testutil.h"

static const char *const types[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K",
                                    "q4_K", "q5_K", "q6_K", "f16", "bf16"};
#define N_TYPES (sizeof types / sizeof types[0])

static const kvp_gguf_tensor *get(const kvp_gguf *g, const char *type, const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "%s%s%s", type, *type ? "." : "", what);
    const kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, name);
    cr_assert(t, "fixture has no tensor %s", name);
    return t;
}

static kvp_weight weight_of(const kvp_gguf_tensor *t)
{
    return (kvp_weight){.type = t->type, .rows = (int)t->ne[1], .cols = (int)t->ne[0],
                        .row_bytes = kvp_type_nbytes(t->type, t->ne[0]), .data = t->data};
}

/* Largest |x| of the activation block (32 or 256 elements) holding element i. */
/* n weights in [-1, 1] in steps of 1/1000 from a 64-bit LCG started at seed */
static void fill_uniform(float *v, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((int)(seed >> 40) % 2001 - 1000) / 1000.0f;
    }
}

static float block_amax(const float *x, int i, int block)
{
    float m = 0;
    for (int j = i / block * block; j < (i / block + 1) * block; j++)
        m = fmaxf(m, fabsf(x[j]));
    return m;
}

Test(matmul, decode_within_activation_quantization_error_of_ggml)
{
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_open(&g, tu_shared("fixtures/quant/quant-fixtures.gguf"), err, sizeof err),
                 0, "%s", err);
    const float *x = get(&g, "", "x")->data;
    for (size_t k = 0; k < N_TYPES; k++) {
        const kvp_gguf_tensor *wt = get(&g, types[k], "weight");
        const float *deq = get(&g, types[k], "dequant")->data;
        const float *want = get(&g, types[k], "y")->data;
        kvp_weight w = weight_of(wt);
        int block = w.type == KVP_GGML_F16 || w.type == KVP_GGML_BF16 ? 0
                  : kvp_type_block(w.type) == KVP_QK ? KVP_QK : KVP_QK_K;
        float y[64];
        kvp_matmul(y, x, &w, 1, 0);
        double worst = 0;
        for (int r = 0; r < w.rows; r++) {
            /* each activation is off by at most half its block's step, amax / 127 / 2 */
            double bound = 0, mag = 0;
            for (int i = 0; i < w.cols; i++) {
                double a = fabs((double)deq[(size_t)r * w.cols + i]);
                mag += a * fabs((double)x[i]);
                if (block)
                    bound += a * block_amax(x, i, block) / 254.0;
            }
            bound += 1e-5 * mag;  /* f32 accumulation */
            double e = fabs((double)y[r] - want[r]);
            worst = fmax(worst, e / bound);
            cr_expect(e <= bound, "%s (%s) row %d: %.7g vs ggml %.7g, |error| %.3g > bound %.3g",
                      types[k], kvp_matmul_simd(), r, (double)y[r], (double)want[r], e, bound);
        }
        /* the error must use the bound, not be far inside it by luck of a loose bound:
         * int8 activations do cost something */
        if (block)
            cr_expect(worst > 1e-3, "%s: error suspiciously small (%.3g of the bound)", types[k], worst);
    }
    kvp_gguf_close(&g);
}

/* The 32-element formats with any number of blocks a row (the AVX-512 VBMI kernels
 * take groups of four blocks and a masked last group of one to three) and any number of
 * rows (they take rows in pairs): the first `cols` elements of fixture rows, as a
 * narrower matrix, within the activation-quantization bound of the exact product. */
Test(matmul, block32_rows_of_any_width_and_count)
{
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_open(&g, tu_shared("fixtures/quant/quant-fixtures.gguf"), err, sizeof err),
                 0, "%s", err);
    const float *x = get(&g, "", "x")->data;
    static const char *const narrow[] = {"q4_0", "q4_1", "q5_0", "q5_1"};
    static const int widths[] = {32, 64, 96, 128, 160, 896, 928, 960, 992, 1024};
    static const struct { int r0, rows; } runs[] = {{0, 64}, {1, 7}, {5, 1}, {2, 33}};
    for (size_t k = 0; k < sizeof narrow / sizeof narrow[0]; k++) {
        const kvp_gguf_tensor *wt = get(&g, narrow[k], "weight");
        const float *deq = get(&g, narrow[k], "dequant")->data;
        kvp_weight full = weight_of(wt);
        for (size_t c = 0; c < sizeof widths / sizeof widths[0]; c++)
            for (size_t u = 0; u < sizeof runs / sizeof runs[0]; u++) {
                int cols = widths[c], r0 = runs[u].r0, rows = runs[u].rows;
                kvp_weight w = {.type = full.type, .rows = rows, .cols = cols,
                                .row_bytes = full.row_bytes,
                                .data = (const uint8_t *)full.data + (size_t)r0 * full.row_bytes};
                float y[64];
                kvp_matmul(y, x, &w, 1, 0);
                for (int r = 0; r < rows; r++) {
                    const float *d = deq + (size_t)(r0 + r) * full.cols;
                    double exact = 0, bound = 0, mag = 0;
                    for (int i = 0; i < cols; i++) {
                        exact += (double)d[i] * x[i];
                        mag += fabs((double)d[i] * x[i]);
                        bound += fabs((double)d[i]) * block_amax(x, i, KVP_QK) / 254.0;
                    }
                    bound += 1e-5 * mag;
                    double e = fabs((double)y[r] - exact);
                    cr_expect(e <= bound, "%s (%s) %d cols, rows %d+%d, row %d: %.7g vs %.7g, "
                              "|error| %.3g > bound %.3g", narrow[k], kvp_matmul_simd(), cols, r0,
                              rows, r, (double)y[r], exact, e, bound);
                }
            }
    }
    kvp_gguf_close(&g);
}

Test(matmul, prefill_tiles_match_f32_product)
{
    kvp_matmul_force_prefill(KVP_PREFILL_SGEMM);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_open(&g, tu_shared("fixtures/quant/quant-fixtures.gguf"), err, sizeof err),
                 0, "%s", err);
    const float *x = get(&g, "", "x")->data;
    enum { T = KVP_MATMUL_TILE_MIN_T + 1 };
    float *xs = malloc(T * 1024 * sizeof *xs), y[T * 64];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < 1024; i++)
            xs[t * 1024 + i] = x[i] * (float)(t + 1);
    for (size_t k = 0; k < N_TYPES; k++) {
        kvp_weight w = weight_of(get(&g, types[k], "weight"));
        const float *want = get(&g, types[k], "y")->data;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < 64; r++)
                y[t * 64 + r] = 1000.0f;  /* accumulate adds to this */
        kvp_matmul(y, xs, &w, T, 1);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < 64; r++) {
                double ref = 1000.0 + (double)want[r] * (t + 1);
                cr_expect(fabs(y[t * 64 + r] - ref) <= 2e-4 * (1 + fabs(want[r]) * (t + 1)),
                          "%s t %d row %d: %.7g vs %.7g", types[k], t, r, (double)y[t * 64 + r], ref);
            }
    }
    free(xs);
    kvp_gguf_close(&g);
}

/* |y - want| within f32 rounding of the products' magnitude */
static void expect_close(const char *what, int t, int r, float got, float want, double mag)
{
    cr_expect(fabs((double)got - want) <= 2e-5 * mag + 1e-6, "%s token %d row %d: %.8g vs %.8g",
              what, t, r, (double)got, (double)want);
}

/* One int8 GEMM call against T matrix-vector products (decode's path, the same 8-bit
 * activations), for `rows` rows of w starting at row r0; with accumulate, y starts at a
 * known value. Returns the largest difference from the f32 (tile + sgemm) product, so
 * the caller can check that the activations were quantized. */
static double check_gemm(const char *name, const kvp_weight *full, int r0, int rows,
                         const float *xs, int T, int accumulate)
{
    kvp_weight w = *full;
    w.rows = rows;
    w.data = (const uint8_t *)full->data + (size_t)r0 * full->row_bytes;
    int n = w.cols;
    float *y = malloc((size_t)T * rows * sizeof *y), *want = malloc((size_t)T * rows * sizeof *y);
    float *exact = malloc((size_t)T * rows * sizeof *y), *deq = malloc((size_t)rows * n * sizeof *deq);
    cr_assert(y && want && exact && deq);
    kvp_dequantize(w.type, w.data, deq, (uint64_t)rows * n);
    for (int i = 0; i < T * rows; i++)
        y[i] = exact[i] = accumulate ? (float)(i % 7) - 3.0f : NAN;
    kvp_matmul_force_prefill(KVP_PREFILL_INT8);
    kvp_matmul(y, xs, &w, T, accumulate);
    kvp_matmul_force_prefill(KVP_PREFILL_SGEMM);
    kvp_matmul(exact, xs, &w, T, accumulate);
    kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
    for (int t = 0; t < T; t++)
        kvp_matmul(want + (size_t)t * rows, xs + (size_t)t * n, &w, 1, 0);
    double off = 0;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double mag = 0;
            for (int i = 0; i < n; i++)
                mag += fabs((double)deq[(size_t)r * n + i] * xs[(size_t)t * n + i]);
            float base = accumulate ? (float)((t * rows + r) % 7) - 3.0f : 0.0f;
            expect_close(name, t, r, y[(size_t)t * rows + r], base + want[(size_t)t * rows + r], mag);
            off = fmax(off, fabs((double)y[(size_t)t * rows + r] - exact[(size_t)t * rows + r]));
        }
    free(y);
    free(want);
    free(exact);
    free(deq);
    return off;
}

Test(matmul, int8_gemm_equals_matvec_for_every_type_and_shape)
{
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_open(&g, tu_shared("fixtures/quant/quant-fixtures.gguf"), err, sizeof err),
                 0, "%s", err);
    const float *x = get(&g, "", "x")->data;
    enum { T = 13, N = 1024 };
    float *xs = malloc(T * N * sizeof *xs);
    for (int t = 0; t < T; t++)  /* each token its own scale and a shifted pattern */
        for (int i = 0; i < N; i++)
            xs[t * N + i] = x[(i + 37 * t) % N] * (float)(t % 5 + 1) * (t % 2 ? -1.0f : 1.0f);
    static const struct { int r0, rows, T, accumulate; } shapes[] = {
        {0, 64, 13, 0}, {0, 64, 13, 1}, {3, 61, 7, 0}, {1, 5, 4, 1}, {2, 1, 9, 0}, {0, 63, 5, 1},
    };
    for (size_t k = 0; k < N_TYPES; k++) {
        kvp_weight w = weight_of(get(&g, types[k], "weight"));
        cr_assert_eq(w.cols, N);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            char what[96];
            snprintf(what, sizeof what, "%s (%s) rows %d+%d T %d acc %d", types[k], kvp_matmul_simd(),
                     shapes[s].r0, shapes[s].rows, shapes[s].T, shapes[s].accumulate);
            double off = check_gemm(what, &w, shapes[s].r0, shapes[s].rows, xs, shapes[s].T,
                                    shapes[s].accumulate);
            if (kvp_type_block(w.type) > 1)  /* the int8 path ran: it is not the f32 product */
                cr_expect(off > 0, "%s: equals the f32 product: did the int8 GEMM run?", what);
        }
    }
    free(xs);
    kvp_gguf_close(&g);
}

/* A matrix large enough for the pool: every row equals the one computed alone. */
Test(matmul, row_split_equals_single_rows)
{
    enum { ROWS = 1000, COLS = 1024 };
    float *src = malloc((size_t)ROWS * COLS * sizeof *src), x[COLS], y[ROWS];
    fill_uniform(src, (size_t)ROWS * COLS, 12345);
    for (int i = 0; i < COLS; i++)
        x[i] = sinf((float)i);
    static const uint32_t kinds[] = {KVP_GGML_Q4_K, KVP_GGML_Q8_0, KVP_GGML_F16, KVP_GGML_Q5_0};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t rb = kvp_type_nbytes(kinds[k], COLS);
        uint8_t *q = malloc(rb * ROWS);
        cr_assert_eq(kvp_quantize(kinds[k], src, q, (uint64_t)ROWS * COLS), 0);
        kvp_weight w = {kinds[k], ROWS, COLS, rb, q};
        kvp_matmul_enter();
        kvp_matmul(y, x, &w, 1, 0);
        kvp_matmul_leave();
        for (int r = 0; r < ROWS; r++) {
            kvp_weight one = {kinds[k], 1, COLS, rb, q + rb * r};
            float y1;
            kvp_matmul(&y1, x, &one, 1, 0);
            cr_assert(!memcmp(&y1, &y[r], sizeof y1), "%s row %d: %g vs %g",
                      kvp_type_name(kinds[k]), r, (double)y[r], (double)y1);
        }
        free(q);
    }
    free(src);
}

/* f32 weights in blocks of up to KVP_F32_SMALL_T activation rows (a batched decode
 * step) take the pool's kernel: each product is within float rounding of the exact one
 * (|error| <= 1e-5 of sum |w| |x|), and each activation row's outputs equal, bit for bit,
 * the same row multiplied alone (T = 1) on one thread: a session's logits do not depend
 * on the batch it runs in. Rows not a multiple of the kernels' tiles, widths with and
 * without a tail of 8, T across the tiles' remainders and past the sgemm crossover
 * (those only within rounding), and accumulate. */
Test(matmul, f32_small_blocks_equal_rows_alone)
{
    enum { ROWS = 301, MAXT = KVP_F32_SMALL_T + 3 };
    static const int widths[] = {768, 100};
    static const int Ts[] = {1, 2, 3, 4, 5, 7, 16, 17, 33, KVP_F32_SMALL_T, MAXT};
    float *w = malloc((size_t)ROWS * 768 * sizeof *w), *x = malloc((size_t)MAXT * 768 * sizeof *x);
    float *y = malloc((size_t)MAXT * ROWS * sizeof *y), *alone = malloc(ROWS * sizeof *alone);
    cr_assert(w && x && y && alone);
    fill_uniform(w, ROWS * 768, 99);
    for (int i = 0; i < MAXT * 768; i++)
        x[i] = cosf(0.71f * (float)i) * (float)(1 + i % 5);
    for (size_t c = 0; c < sizeof widths / sizeof widths[0]; c++) {
        int cols = widths[c];
        kvp_weight wt = {KVP_GGML_F32, ROWS, cols, (size_t)cols * sizeof(float), w};
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k];
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                for (int i = 0; i < T * ROWS; i++)
                    y[i] = accumulate ? 0.5f * (float)(i % 7) : NAN;
                kvp_matmul_enter();
                kvp_matmul(y, x, &wt, T, accumulate);
                kvp_matmul_leave();
                kvp_matmul_force_threads(1);
                for (int t = 0; t < T; t++) {
                    for (int r = 0; r < ROWS; r++)
                        alone[r] = accumulate ? 0.5f * (float)((t * ROWS + r) % 7) : 0.0f;
                    kvp_matmul(alone, x + (size_t)t * cols, &wt, 1, accumulate);
                    for (int r = 0; r < ROWS; r++) {
                        double exact = accumulate ? 0.5 * ((t * ROWS + r) % 7) : 0.0, mag = 0;
                        for (int e = 0; e < cols; e++) {
                            double p = (double)w[(size_t)r * cols + e] * x[(size_t)t * cols + e];
                            exact += p;
                            mag += fabs(p);
                        }
                        float got = y[(size_t)t * ROWS + r];
                        cr_assert(fabs(got - exact) <= 1e-5 * mag + 1e-6, "cols %d T %d row %d: %g vs %g",
                                  cols, T, r, (double)got, exact);
                        if (T <= KVP_F32_SMALL_T)
                            cr_assert(!memcmp(&got, &alone[r], sizeof got),
                                      "cols %d T %d acc %d token %d row %d: %.9g in the block, %.9g alone",
                                      cols, T, accumulate, t, r, (double)got, (double)alone[r]);
                    }
                }
                kvp_matmul_force_threads(0);
            }
        }
    }
    free(w);
    free(x);
    free(y);
    free(alone);
}

/* Q8_0 weights in blocks of up to KVP_QUANT_SMALL_T activation rows take the small-T
 * kernel (each block read once for all the rows): each product is within the error
 * that quantizing the activations to 8 bits can cause (the bound of
 * block32_rows_of_any_width_and_count), and each activation row's outputs equal, bit for
 * bit, the same row multiplied alone (T = 1) on one thread, so a session's logits do not
 * depend on its batch. Rows not a multiple of the tiles, widths of an even and an odd
 * number of blocks (the AVX-512 kernel takes blocks in pairs), T across the tiles'
 * remainders and past the GEMM crossover (there only within the bound), accumulate. */
Test(matmul, q8_0_small_blocks_equal_rows_alone)
{
    enum { ROWS = 331, MAXC = 800, MAXT = KVP_QUANT_SMALL_T + 3 };
    static const int widths[] = {768, 800, 96};
    static const int Ts[] = {1, 2, 3, 4, 5, 7, 16, 17, KVP_QUANT_SMALL_T, MAXT};
    float *src = malloc((size_t)ROWS * MAXC * sizeof *src), *x = malloc((size_t)MAXT * MAXC * sizeof *x);
    float *deq = malloc((size_t)ROWS * MAXC * sizeof *deq), *y = malloc((size_t)MAXT * ROWS * sizeof *y);
    float *alone = malloc(ROWS * sizeof *alone);
    uint8_t *q = malloc(kvp_type_nbytes(KVP_GGML_Q8_0, MAXC) * ROWS);
    cr_assert(src && x && deq && y && alone && q);
    uint64_t s = 4242;
    for (int i = 0; i < ROWS * MAXC; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (float)((int)(s >> 40) % 2001 - 1000) / 1000.0f * (float)(1 + i % 3);
    }
    for (int i = 0; i < MAXT * MAXC; i++)
        x[i] = cosf(0.53f * (float)i) * (float)(1 + i % 7);
    for (size_t c = 0; c < sizeof widths / sizeof widths[0]; c++) {
        int cols = widths[c];
        size_t rb = kvp_type_nbytes(KVP_GGML_Q8_0, (uint64_t)cols);
        cr_assert_eq(kvp_quantize(KVP_GGML_Q8_0, src, q, (uint64_t)ROWS * cols), 0);
        kvp_dequantize(KVP_GGML_Q8_0, q, deq, (uint64_t)ROWS * cols);
        kvp_weight wt = {KVP_GGML_Q8_0, ROWS, cols, rb, q};
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k];
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                for (int i = 0; i < T * ROWS; i++)
                    y[i] = accumulate ? 0.5f * (float)(i % 7) : NAN;
                kvp_matmul_enter();
                kvp_matmul(y, x, &wt, T, accumulate);
                kvp_matmul_leave();
                kvp_matmul_force_threads(1);
                for (int t = 0; t < T; t++) {
                    const float *xt = x + (size_t)t * cols;
                    for (int r = 0; r < ROWS; r++)
                        alone[r] = accumulate ? 0.5f * (float)((t * ROWS + r) % 7) : 0.0f;
                    kvp_matmul(alone, xt, &wt, 1, accumulate);
                    for (int r = 0; r < ROWS; r++) {
                        double exact = accumulate ? 0.5 * ((t * ROWS + r) % 7) : 0.0, bound = 0, mag = 0;
                        for (int e = 0; e < cols; e++) {
                            double d = deq[(size_t)r * cols + e];
                            exact += d * xt[e];
                            mag += fabs(d * xt[e]);
                            bound += fabs(d) * block_amax(xt, e, KVP_QK) / 254.0;
                        }
                        float got = y[(size_t)t * ROWS + r];
                        cr_assert(fabs(got - exact) <= bound + 1e-5 * mag + 1e-6,
                                  "cols %d T %d row %d: %g vs %g (bound %g)", cols, T, r, (double)got,
                                  exact, bound);
                        if (T <= KVP_QUANT_SMALL_T)
                            cr_assert(!memcmp(&got, &alone[r], sizeof got),
                                      "%s cols %d T %d acc %d token %d row %d: %.9g in the block, "
                                      "%.9g alone", kvp_matmul_simd(), cols, T, accumulate, t, r,
                                      (double)got, (double)alone[r]);
                    }
                }
                kvp_matmul_force_threads(0);
            }
        }
    }
    free(src);
    free(x);
    free(deq);
    free(y);
    free(alone);
    free(q);
}

/* The tiles + sgemm prefill path (f16, bf16) split over the pool's threads: rows not a
 * multiple of the tile, an odd T, with and without accumulate, equal bit for bit the same
 * product on one thread (each tile's sgemm sees the same operands either way). */
Test(matmul, prefill_tiles_row_split_equals_one_thread)
{
    enum { ROWS = 333, COLS = 256, T = 41 };
    float *src = malloc((size_t)ROWS * COLS * sizeof *src), *x = malloc((size_t)T * COLS * sizeof *x);
    float *y = malloc((size_t)T * ROWS * sizeof *y), *one = malloc((size_t)T * ROWS * sizeof *one);
    cr_assert(src && x && y && one);
    fill_uniform(src, (size_t)ROWS * COLS, 777);
    for (int i = 0; i < T * COLS; i++)
        x[i] = sinf(0.37f * (float)i);
    static const uint32_t kinds[] = {KVP_GGML_F16, KVP_GGML_BF16};
    kvp_matmul_force_prefill(KVP_PREFILL_SGEMM);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t rb = kvp_type_nbytes(kinds[k], COLS);
        uint8_t *q = malloc(rb * ROWS);
        cr_assert_eq(kvp_quantize(kinds[k], src, q, (uint64_t)ROWS * COLS), 0);
        kvp_weight w = {kinds[k], ROWS, COLS, rb, q};
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            for (int i = 0; i < T * ROWS; i++)
                y[i] = one[i] = accumulate ? 0.25f * (float)(i % 5) : NAN;
            kvp_matmul_enter();
            kvp_matmul(y, x, &w, T, accumulate);
            kvp_matmul_leave();
            kvp_matmul_force_threads(1);
            kvp_matmul(one, x, &w, T, accumulate);
            kvp_matmul_force_threads(0);
            for (int i = 0; i < T * ROWS; i++)
                cr_assert(!memcmp(&y[i], &one[i], sizeof y[i]), "%s acc %d token %d row %d: "
                          "%.9g split, %.9g on one thread", kvp_type_name(kinds[k]), accumulate,
                          i / ROWS, i % ROWS, (double)y[i], (double)one[i]);
            /* and it is the product: one spot check per token against double precision */
            for (int t = 0; t < T; t++) {
                int r = (t * 37) % ROWS;
                float deq[COLS];
                kvp_dequantize(kinds[k], q + rb * r, deq, COLS);
                double exact = accumulate ? 0.25 * ((t * ROWS + r) % 5) : 0.0, mag = 0;
                for (int e = 0; e < COLS; e++) {
                    exact += (double)deq[e] * x[t * COLS + e];
                    mag += fabs((double)deq[e] * x[t * COLS + e]);
                }
                cr_assert(fabs(y[t * ROWS + r] - exact) <= 1e-5 * mag + 1e-6, "%s token %d row %d",
                          kvp_type_name(kinds[k]), t, r);
            }
        }
        free(q);
    }
    kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
    free(src);
    free(x);
    free(y);
    free(one);
}

/* The int8 GEMM split over the pool (odd rows, odd T) against the matrix-vector rows,
 * with rows that fill whole groups of eight sub-blocks and rows that do not (896:
 * Qwen2.5-0.5B's width, 28 blocks of 32). */
Test(matmul, int8_gemm_row_split_equals_matvec)
{
    enum { ROWS = 999, MAX_COLS = 896, T = 11 };
    float *src = malloc((size_t)ROWS * MAX_COLS * sizeof *src);
    float *xs = malloc((size_t)T * MAX_COLS * sizeof *xs);
    fill_uniform(src, (size_t)ROWS * MAX_COLS, 99);
    static const struct { uint32_t type; int cols; } kinds[] = {
        {KVP_GGML_Q4_K, 768}, {KVP_GGML_Q8_0, 896}, {KVP_GGML_Q6_K, 768}, {KVP_GGML_Q5_0, 864},
        {KVP_GGML_Q8_0, 768}, {KVP_GGML_Q4_1, 96},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int cols = kinds[k].cols;
        for (int i = 0; i < T * cols; i++)
            xs[i] = sinf(0.37f * (float)i) * (float)(i / cols + 1);
        size_t rb = kvp_type_nbytes(kinds[k].type, (uint64_t)cols);
        uint8_t *q = malloc(rb * ROWS);
        cr_assert_eq(kvp_quantize(kinds[k].type, src, q, (uint64_t)ROWS * cols), 0);
        kvp_weight w = {kinds[k].type, ROWS, cols, rb, q};
        char what[64];
        snprintf(what, sizeof what, "%s x %d", kvp_type_name(kinds[k].type), cols);
        kvp_matmul_enter();
        check_gemm(what, &w, 0, ROWS, xs, T, k % 2);
        kvp_matmul_leave();
        free(q);
    }
    free(src);
    free(xs);
}

Test(matmul, weight_row_decodes_one_row)
{
    float src[3 * 64], out[64];
    for (int i = 0; i < 3 * 64; i++)
        src[i] = (float)i / 7.0f;
    uint8_t q[3 * 68];
    cr_assert_eq(kvp_quantize(KVP_GGML_Q8_0, src, q, 3 * 64), 0);
    kvp_weight w = {KVP_GGML_Q8_0, 3, 64, 68, q};
    kvp_weight_row(&w, 2, out);
    float want[64];
    kvp_dequantize(KVP_GGML_Q8_0, q + 2 * 68, want, 64);
    cr_expect(!memcmp(out, want, sizeof out));
    cr_expect(fabsf(out[5] - src[2 * 64 + 5]) < 0.05f);
}

/* Matrices that read the same activations, as one job (q/k/v, gate/up): each output
 * equals its own kvp_matmul bit for bit, with types of different activation kinds, at
 * decode (T = 1, 3) and on the prefill path (T = 5), and with an f32 matrix among them. */
Test(matmul, shared_input_equals_separate_products)
{
    enum { COLS = 1024, MAXR = 600, MAXT = 5 };
    static const uint32_t types[][3] = {
        {KVP_GGML_Q8_0, KVP_GGML_Q6_K, KVP_GGML_F16},
        {KVP_GGML_Q5_0, KVP_GGML_Q5_0, KVP_GGML_Q4_K},
        {KVP_GGML_Q8_0, KVP_GGML_F32, KVP_GGML_Q8_0},
    };
    static const int rows[3] = {600, 40, 130};
    float *src = malloc((size_t)MAXR * COLS * sizeof *src), x[MAXT * COLS];
    fill_uniform(src, (size_t)MAXR * COLS, 777);
    for (int i = 0; i < MAXT * COLS; i++)
        x[i] = cosf(0.37f * (float)i);
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        kvp_weight w[3];
        const kvp_weight *wp[3];
        float *y[3], *ref[3];
        for (int i = 0; i < 3; i++) {
            size_t rb = kvp_type_nbytes(types[c][i], COLS);
            uint8_t *q = malloc(rb * rows[i]);
            if (types[c][i] == KVP_GGML_F32)
                memcpy(q, src, rb * rows[i]);
            else
                cr_assert_eq(kvp_quantize(types[c][i], src, q, (uint64_t)rows[i] * COLS), 0);
            w[i] = (kvp_weight){types[c][i], rows[i], COLS, rb, q};
            wp[i] = &w[i];
            y[i] = malloc((size_t)MAXT * rows[i] * sizeof(float));
            ref[i] = malloc((size_t)MAXT * rows[i] * sizeof(float));
        }
        static const int Ts[] = {1, 3, 5};
        for (int k = 0; k < 3; k++) {
            int T = Ts[k];
            kvp_matmul_enter();
            kvp_matmul_shared(3, y, x, wp, T);
            for (int i = 0; i < 3; i++)
                kvp_matmul(ref[i], x, &w[i], T, 0);
            kvp_matmul_leave();
            for (int i = 0; i < 3; i++)
                cr_assert(!memcmp(y[i], ref[i], (size_t)T * rows[i] * sizeof(float)),
                          "case %zu, matrix %d (%s), T %d", c, i, kvp_type_name(types[c][i]), T);
        }
        for (int i = 0; i < 3; i++) {
            free((void *)w[i].data);
            free(y[i]);
            free(ref[i]);
        }
    }
    free(src);
}

/* The pool's helpers take the nice value of the thread that starts them: kvp_matmul_start
 * on a thread at the process's own keeps them there even when the first split job comes
 * from a background thread (base/thread.h), as a daemon's niced job worker may run it. */
#include <dirent.h>
#include <pthread.h>
#include "base/thread.h"

static void no_item(void *ctx, int i, int slot)
{
    (void)ctx;
    (void)i;
    (void)slot;
}

static void *split_job_from_background(void *arg)
{
    (void)arg;
    cr_assert_eq(kvp_thread_nice(KVP_BACKGROUND_NICE), 0);
    kvp_matmul_parallel(64, no_item, NULL, 64u << 20, kvp_matmul_threads(), 0);
    return NULL;
}

/* The nice values of this process's threads but the caller's: how many are at `nice`,
 * how many are not. */
static void count_nice(int nice, int *at, int *other)
{
    *at = *other = 0;
    DIR *d = opendir("/proc/self/task");
    cr_assert(d);
    struct dirent *e;
    long me = (long)kvp_thread_self_id();
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strtol(e->d_name, NULL, 10) == me)
            continue;
        char path[300], buf[1024];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* after the name's closing parenthesis: field 3 is the state, 19 the nice value */
        char *p = strrchr(buf, ')');
        cr_assert(p);
        int field = 2, v = 0;
        for (char *t = strtok(p + 1, " "); t; t = strtok(NULL, " "))
            if (++field == 19) {
                v = atoi(t);
                break;
            }
        if (v == nice)
            (*at)++;
        else
            (*other)++;
    }
    closedir(d);
}

Test(matmul, the_pool_started_early_keeps_its_starters_priority)
{
    int mine = kvp_thread_nice_now();
    cr_assert_lt(mine, KVP_BACKGROUND_NICE, "run the suite below nice %d", KVP_BACKGROUND_NICE);
    kvp_matmul_start();
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, split_job_from_background, NULL), 0);
    pthread_join(th, NULL);
    int at, other;
    count_nice(mine, &at, &other);
    cr_assert_geq(at, kvp_matmul_threads() - 1, "the helpers are at %d", mine);
    cr_assert_eq(other, 0, "%d threads at another nice value", other);
}
