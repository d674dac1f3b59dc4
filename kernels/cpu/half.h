/* Element conversions between fp32 and the 16-bit storage types (bfloat16, IEEE binary16), shared
 * by cast.c's buffer conversions and optim.c's fused mixed-precision Adam so that both round and
 * treat special values the one way cast.c's opening comment describes. The scalar functions define
 * each element's result; the x86 vector forms below reproduce them bit for bit. Internal to the CPU
 * backend. */
#ifndef ZTRAIN_CPU_HALF_H
#define ZTRAIN_CPU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* fp32 -> bfloat16. Adding 0x7FFF plus the lowest kept bit rounds to nearest even; the carry runs
 * into the exponent, so the largest finite values round up to inf and the largest subnormals to the
 * smallest normal. A NaN is truncated instead (rounding could carry it into inf) and quieted. Pure
 * integer arithmetic, so it ignores MXCSR's flush-to-zero modes, and GCC vectorises it. */
static inline uint16_t bf16_from_f32(uint32_t u) {
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

/* bfloat16 -> fp32 is exact: the bits are the high half of an fp32. A signalling NaN is quieted. */
static inline uint32_t f32_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    return (h & 0x7FFFu) > 0x7F80u ? u | 0x00400000u : u;
}

/* fp32 -> binary16, written out as the reference the F16C and AVX-512 conversions reproduce. */
static inline uint16_t f16_from_f32(uint32_t u) {
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
    /* 65520 = 65504 + half an ulp is a tie with inf, whose mantissa is even. */
    if (a >= 0x477FF000u)
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) {
        /* Normal: rebias the exponent by 127 - 15 and round off 13 mantissa bits; a carry out of
         * the mantissa bumps the exponent, correctly. */
        a -= 112u << 23;
        return (uint16_t)(sign | ((a + 0x0FFFu + ((a >> 13) & 1u)) >> 13));
    }
    /* Below 2^-14: a binary16 subnormal counts units of 2^-24. Values up to 2^-25 (a tie with 0)
     * round to zero, fp32 subnormals among them. */
    uint32_t e = a >> 23;
    if (e < 102)
        return (uint16_t)sign;
    uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q); /* q = 0x400 is the smallest normal, encoded right */
}

/* binary16 -> fp32 is exact; subnormals become fp32 normals, a signalling NaN is quieted. */
static inline uint32_t f32_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x03FFu;
    if (e == 0x1F)
        return sign | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u);
    if (e == 0) {
        if (m == 0)
            return sign;
        /* Shift the leading one up to the implicit bit's place (bit 10). */
        int s = __builtin_clz(m) - 21;
        m = (m << s) & 0x03FFu;
        e = 1u - (uint32_t)s;
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* The same conversions on 8 (AVX2) or 16 (AVX-512F) lanes, for kernels that convert in registers
 * rather than through a buffer. bfloat16 is the scalar functions' integer arithmetic lane by lane.
 * binary16 is vcvtph2ps / vcvtps2ph with an immediate round-to-nearest-even, which match
 * f32_from_f16 / f16_from_f32 exactly whatever MXCSR holds (cast.c's hardware paths rely on the
 * same fact). 16-bit halves are packed in the low bits of an __m128i / __m256i. */

__attribute__((target("avx2"))) static inline __m256 bf16x8_to_f32(__m128i h) {
    __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                     _mm256_set1_epi32(0x7F800000));
    return _mm256_castsi256_ps(
        _mm256_or_si256(u, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000))));
}

__attribute__((target("avx2"))) static inline __m128i f32x8_to_bf16(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
                                    _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                        _mm256_set1_epi32(0x7F800000));
    __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    /* Every lane holds at most 0xFFFF, so the saturating pack is a plain narrowing. */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx2,f16c"))) static inline __m256 f16x8_to_f32(__m128i h) {
    return _mm256_cvtph_ps(h);
}

__attribute__((target("avx2,f16c"))) static inline __m128i f32x8_to_f16(__m256 x) {
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx512f"))) static inline __m512 bf16x16_to_f32(__m256i h) {
    __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(u, nan, u, _mm512_set1_epi32(0x00400000)));
}

__attribute__((target("avx512f"))) static inline __m256i f32x16_to_bf16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                    _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                               _mm512_set1_epi32(0x7F800000));
    __m512i r = _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(0x0040));
    return _mm512_cvtepi32_epi16(r);
}

__attribute__((target("avx512f"))) static inline __m512 f16x16_to_f32(__m256i h) {
    return _mm512_cvtph_ps(h);
}

__attribute__((target("avx512f"))) static inline __m256i f32x16_to_f16(__m512 x) {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

#endif /* x86 */

#endif
