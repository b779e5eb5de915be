#include "cache/kvrow.h"

#include <math.h>
#include <string.h>

#include "base/half.h"

static const char *const names[KVP_KV_N_TYPES] = { "f32", "f16", "q8_0" };

const char *kvp_kv_type_name(kvp_kv_type t)
{
    return (unsigned)t < KVP_KV_N_TYPES ? names[t] : "?";
}

int kvp_kv_type_parse(const char *name)
{
    for (int t = 0; name && t < KVP_KV_N_TYPES; t++)
        if (!strcmp(name, names[t]))
            return t;
    return -1;
}

const char *kvp_kv_type_names(void) { return "f32 f16 q8_0"; }

size_t kvp_kv_row_bytes(kvp_kv_type t, int n)
{
    switch (t) {
    case KVP_KV_F16: return (size_t)n * 2;
    case KVP_KV_Q8_0: return (size_t)n + 2 * (size_t)kvp_kv_blocks(n);
    default: return (size_t)n * sizeof(float);
    }
}

static float q8_scale(const void *row, int b)
{
    uint16_t d;
    memcpy(&d, (const uint8_t *)row + 2 * b, 2);
    return kvp_f16_to_f32(d);
}

/* The q8_0 code of v = x / d: the nearest integer (ties to even, without a libm call so
 * the loops below vectorize; exact for |v| < 2^22), a NaN to 0, clamped to +-127. */
static inline float q8_code(float v)
{
    float c = (v + 12582912.0f) - 12582912.0f;
    c = c == c ? c : 0.0f;
    return c > 127.0f ? 127.0f : c < -127.0f ? -127.0f : c;
}

/* The error of x[n] coded against the scale d (as stored) with inverse id: the squared
 * error of each number weighted by its magnitude, sum |x| (x - d code)^2, in eight partial
 * sums (number i in sum i % 8) added as ((0+4)+(2+6))+((1+5)+(3+7)): the order of the
 * AVX2 store (model/x86_kvrow.h), so both keep the same scale. */
static float q8_block_error(const float *x, int n, float d, float id)
{
    float acc[8] = {0};
    for (int i = 0; i < n; i++) {
        float e = x[i] - q8_code(x[i] * id) * d;
        acc[i % 8] += fabsf(x[i]) * e * e;
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

void kvp_kv_row_store(kvp_kv_type t, void *row, const float *x, int n)
{
    if (t == KVP_KV_F32) {
        memcpy(row, x, (size_t)n * sizeof *x);
    } else if (t == KVP_KV_F16) {
        for (int i = 0; i < n; i++) {
            uint16_t h = kvp_f32_to_f16(x[i]);
            memcpy((uint8_t *)row + 2 * i, &h, 2);
        }
    } else {
        int8_t *codes = (int8_t *)row + 2 * kvp_kv_blocks(n);
        for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
            int lo = b * KVP_KV_BLOCK, m = lo + KVP_KV_BLOCK < n ? KVP_KV_BLOCK : n - lo;
            const float *xb = x + lo;
            float amax = 0.0f;
            for (int i = 0; i < m; i++)
                amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
            /* The scale that codes the block's largest |x| as 127 - k, k = 0..KVP_KV_Q8_SEARCH,
             * whose codes leave the least error (k = 0 is ggml's max / 127); the codes are
             * rounded against the scale as stored, so its f16 rounding adds no error */
            uint16_t best = 0;
            float best_err = INFINITY;
            for (int k = 0; k <= KVP_KV_Q8_SEARCH; k++) {
                uint16_t dh = kvp_f32_to_f16(amax / (float)(127 - k));
                float d = kvp_f16_to_f32(dh);
                float err = q8_block_error(xb, m, d, d > 0.0f ? 1.0f / d : 0.0f);
                if (err < best_err) {
                    best_err = err;
                    best = dh;
                }
                if (err == 0.0f)
                    break;
            }
            memcpy((uint8_t *)row + 2 * b, &best, 2);
            float d = kvp_f16_to_f32(best), id = d > 0.0f ? 1.0f / d : 0.0f;
            for (int i = 0; i < m; i++)
                codes[lo + i] = (int8_t)q8_code(xb[i] * id);
        }
    }
}

void kvp_kv_row_load(kvp_kv_type t, float *x, const void *row, int n)
{
    if (t == KVP_KV_F32) {
        memcpy(x, row, (size_t)n * sizeof *x);
    } else if (t == KVP_KV_F16) {
        for (int i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)row + 2 * i, 2);
            x[i] = kvp_f16_to_f32(h);
        }
    } else {
        const int8_t *codes = kvp_kv_q8_codes(row, n);
        for (int i = 0; i < n; i++)
            x[i] = q8_scale(row, i / KVP_KV_BLOCK) * (float)codes[i];
    }
}

float kvp_kv_row_dot(kvp_kv_type t, const void *row, const float *q, int n)
{
    float sum = 0.0f;
    if (t == KVP_KV_F32) {
        const float *r = row;
        for (int i = 0; i < n; i++)
            sum += r[i] * q[i];
    } else if (t == KVP_KV_F16) {
        for (int i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)row + 2 * i, 2);
            sum += kvp_f16_to_f32(h) * q[i];
        }
    } else {
        const int8_t *codes = kvp_kv_q8_codes(row, n);
        for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
            int lo = b * KVP_KV_BLOCK, hi = lo + KVP_KV_BLOCK < n ? lo + KVP_KV_BLOCK : n;
            float s = 0.0f;
            for (int i = lo; i < hi; i++)
                s += (float)codes[i] * q[i];
            sum += q8_scale(row, b) * s;
        }
    }
    return sum;
}

void kvp_kv_row_axpy(kvp_kv_type t, float *y, float a, const void *row, int n)
{
    if (t == KVP_KV_F32) {
        const float *r = row;
        for (int i = 0; i < n; i++)
            y[i] += a * r[i];
    } else if (t == KVP_KV_F16) {
        for (int i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)row + 2 * i, 2);
            y[i] += a * kvp_f16_to_f32(h);
        }
    } else {
        const int8_t *codes = kvp_kv_q8_codes(row, n);
        for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
            int lo = b * KVP_KV_BLOCK, hi = lo + KVP_KV_BLOCK < n ? lo + KVP_KV_BLOCK : n;
            float ad = a * q8_scale(row, b);
            for (int i = lo; i < hi; i++)
                y[i] += ad * (float)codes[i];
        }
    }
}
