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

/* Codes x[lo, hi) against the scale d as stored (dh, so the f16 rounding adds no error);
 * returns their squared error. */
static float q8_code_block(int8_t *codes, const float *x, int lo, int hi, uint16_t dh)
{
    float d = kvp_f16_to_f32(dh), id = d > 0.0f ? 1.0f / d : 0.0f, err = 0.0f;
    for (int i = lo; i < hi; i++) {
        float c = roundf(x[i] * id);
        c = c > 127.0f ? 127.0f : c < -127.0f ? -127.0f : c;
        codes[i - lo] = (int8_t)c;
        err += (x[i] - c * d) * (x[i] - c * d);
    }
    return err;
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
        int8_t *codes = (int8_t *)row + 2 * kvp_kv_blocks(n), trial[KVP_KV_BLOCK];
        for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
            int lo = b * KVP_KV_BLOCK, hi = lo + KVP_KV_BLOCK < n ? lo + KVP_KV_BLOCK : n;
            float amax = 0.0f;
            for (int i = lo; i < hi; i++)
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            /* The scale that codes the block's largest |x| as 127 - k, k = 0..KVP_KV_Q8_SEARCH,
             * whose codes leave the least squared error: k = 0 is ggml's max / 127 */
            uint16_t best = kvp_f32_to_f16(amax / 127.0f);
            float best_err = q8_code_block(codes + lo, x, lo, hi, best);
            for (int k = 1; k <= KVP_KV_Q8_SEARCH && best_err > 0.0f; k++) {
                uint16_t dh = kvp_f32_to_f16(amax / (float)(127 - k));
                float err = q8_code_block(trial, x, lo, hi, dh);
                if (err < best_err) {
                    best_err = err;
                    best = dh;
                    memcpy(codes + lo, trial, (size_t)(hi - lo));
                }
            }
            memcpy((uint8_t *)row + 2 * b, &best, 2);
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
