/* Shared x86 helpers: byte products, horizontal sums, f16, nibble and fifth-bit unpacking.
 * Part of the x86 kernel sets: included by matmul_x86.h only, in the target and with the
 * KVP_VNNI setting of the file that includes it (matmul_avx2.c, matmul_avx512.c). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "model/matmul_kernels.h"

/* 32 unsigned bytes times 32 signed bytes, summed in fours: 8 int32 */
static inline __m256i mulsum_i32(__m256i u, __m256i s)
{
#if KVP_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

static inline __m256 mulsum_f32(__m256i u, __m256i s)
{
    return _mm256_cvtepi32_ps(mulsum_i32(u, s));
}

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float h2f(uint16_t h)
{
    return _cvtsh_ss(h);
}

static inline __m256i load256(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* 16 bytes of nibble pairs -> 32 codes: low nibbles (elements 0..15), then high */
static inline __m256i nibbles(const uint8_t *qs)
{
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0xF));
}

/* The 256 codes of a Q4_K or Q5_K super-block as 8 vectors of 32, in element order:
 * each 32 bytes of qs give the low nibbles, then the high ones; Q5_K's qh adds bit 4
 * (two bits of each qh byte per 64 codes). qh is NULL for Q4_K; callers inline this with
 * a constant, so each format gets its own code. */
static inline __attribute__((always_inline)) void
k4_codes(const uint8_t *qs, const uint8_t *qh, __m256i codes[8])
{
    const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256i hbits = qh ? load256(qh) : _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        __m256i c = load256(qs + 32 * k);
        __m256i lo = _mm256_and_si256(c, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), low4);
        if (qh) {
            __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4);
            __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4);
            hbits = _mm256_srli_epi16(hbits, 2);
            lo = _mm256_or_si256(lo, hlo);
            hi = _mm256_or_si256(hi, hhi);
        }
        codes[2 * k] = lo;
        codes[2 * k + 1] = hi;
    }
}

/* bit j of the 32-bit word -> 0x10 in byte j (the fifth bit of the Q5 codes) */
static inline __m256i fifth_bits(const uint8_t *qh4)
{
    uint32_t x;
    memcpy(&x, qh4, 4);
#if KVP_VNNI
    /* AVX-512BW: the word is a byte mask */
    return _mm256_maskz_mov_epi8((__mmask32)x, _mm256_set1_epi8(0x10));
#else
    const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                              0x0202020202020202, 0x0303030303030303);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
    /* each byte j of a group of 8 keeps only bit j (all others forced to 1) */
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
#endif
}
