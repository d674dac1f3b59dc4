/* Conversions between fp32 and the 16-bit storage types of mixed precision (bfloat16 and IEEE
 * binary16), the fused round trip, accumulation into a 16-bit buffer, and a 16-bit buffer's sum of
 * squares. They run over whole parameter and gradient buffers every step.
 *
 * Every conversion is exact IEEE: round to nearest even, subnormals produced and consumed, ±inf
 * past the 16-bit range, -0 kept, and a NaN stays a NaN of the same sign with its quiet bit set and
 * the high bits of its payload. The scalar functions in half.h define each element's result; the
 * vector paths reproduce them bit for bit (verified over all 2^32 fp32 and all 2^16 16-bit patterns
 * when written; tests/reference/test_casts.py holds every path to PyTorch's casts), so a buffer
 * converts the same way on every CPU, whatever the thread count or where a slice starts.
 *
 * ZT_F32 is no 16-bit type: round_to leaves the values as they are (each already is the nearest
 * fp32), the other entries stop the process, since a caller passing it has mixed up its buffers.
 *
 * The widest path the CPU supports runs. The environment variable ZTRAIN_CAST_ISA (portable, avx2
 * or avx512), read once, picks a narrower one so tests can check every path on one machine; a path
 * the CPU lacks is never taken. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "half.h"
#include "isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZT_CAST_X86 1
#endif

/* Elements per unit of thread work (64 KiB of fp32); slices of one chunk stay on the calling
 * thread. A multiple of every vector width, so only a slice's last chunk has a scalar tail. */
#define CHUNK ((size_t)16384)

/* sum_squares_half gathers per-chunk partials in blocks of this many chunks (a fixed stack array),
 * converts a chunk to fp32 this many elements at a time, and accumulates in this many double lanes:
 * element k of a chunk always lands in lane k % SUMSQ_LANES, so the result does not depend on the
 * vector width a path uses. */
#define SUMSQ_BLOCK 256
#define SUMSQ_SUB 512
#define SUMSQ_LANES 8

/* accumulate_half's sum. When both terms are NaN, which payload an add returns depends on its
 * operand order, which the compiler may swap; a NaN accumulator therefore passes through as it is,
 * so every path gives the same bits. */
static inline float acc_sum(float acc, float add) {
    float s = acc + add;
    return acc != acc ? acc : s;
}

/* One path: each function converts a contiguous run on the calling thread. */
typedef void (*to_fn)(uint16_t *dst, const float *src, size_t n);
typedef void (*from_fn)(float *dst, const uint16_t *src, size_t n);
typedef void (*round_fn)(float *x, size_t n);
typedef void (*acc_fn)(uint16_t *dst, const float *src, size_t n);

typedef struct {
    const char *name;
    /* Indexed by zt_dtype; [ZT_F32] is unused. */
    to_fn to[3];
    from_fn from[3];
    round_fn round[3];
    acc_fn acc[3];
} cast_path;

/* f32_from_bf16(bf16_from_f32(u)) in 32-bit lanes, which is what the held roundings of every
 * op run: without the trip through 16 bits the compiler needs no packing and unpacking of lanes
 * (about twice as fast in AVX-512). The same bits: a NaN keeps its high half and gets the quiet
 * bit; anything else is rounded to nearest even in the high half, and a finite value that rounds
 * up to 0x7F80 becomes infinity there as well, never a NaN. */
static inline uint32_t round_bf16_bits(uint32_t u) {
    uint32_t nan = (u & 0xFFFF0000u) | 0x00400000u;
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
}

/* The bfloat16 loops are the scalar functions in a plain loop, which GCC vectorises at whatever
 * instruction set the function is compiled for; integer arithmetic (and acc_sum's NaN rule) makes
 * every width agree. They are instantiated once per path, under that path's target attribute.
 * AVX512-BF16's vcvtneps2bf16 is not used: it treats fp32 subnormal inputs as zero, where bfloat16
 * (fp32's exponent range) has subnormals of its own. */
#define BF16_LOOPS(ISA, ATTR)                                                                      \
    ATTR static void to_bf16_##ISA(uint16_t *dst, const float *src, size_t n) {                    \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = bf16_from_f32(f32_bits(src[i]));                                              \
    }                                                                                              \
    ATTR static void from_bf16_##ISA(float *dst, const uint16_t *src, size_t n) {                  \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = bits_f32(f32_from_bf16(src[i]));                                              \
    }                                                                                              \
    ATTR static void round_bf16_##ISA(float *x, size_t n) {                                        \
        for (size_t i = 0; i < n; i++)                                                             \
            x[i] = bits_f32(round_bf16_bits(f32_bits(x[i])));                                      \
    }                                                                                              \
    ATTR static void acc_bf16_##ISA(uint16_t *dst, const float *src, size_t n) {                   \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = bf16_from_f32(f32_bits(acc_sum(bits_f32(f32_from_bf16(dst[i])), src[i])));  \
    }

BF16_LOOPS(portable, )

/* The portable binary16 loops run the reference itself: every x86 CPU with AVX2 takes a hardware
 * path instead. */
static void to_f16_portable(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = f16_from_f32(f32_bits(src[i]));
}

static void from_f16_portable(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = bits_f32(f32_from_f16(src[i]));
}

static void round_f16_portable(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = bits_f32(f32_from_f16(f16_from_f32(f32_bits(x[i]))));
}

static void acc_f16_portable(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = f16_from_f32(f32_bits(acc_sum(bits_f32(f32_from_f16(dst[i])), src[i])));
}

static const cast_path path_portable = {
    .name = "portable",
    .to = {NULL, to_bf16_portable, to_f16_portable},
    .from = {NULL, from_bf16_portable, from_f16_portable},
    .round = {NULL, round_bf16_portable, round_f16_portable},
    .acc = {NULL, acc_bf16_portable, acc_f16_portable},
};

#ifdef ZT_CAST_X86

/* binary16 in hardware: vcvtps2ph with an immediate round-to-nearest-even (MXCSR's rounding mode
 * does not apply) and vcvtph2ps, which convert subnormals both ways whatever MXCSR's DAZ/FTZ say
 * (an fp32 subnormal becomes ±0 in binary16 either way) and quiet NaNs keeping sign and payload
 * bits, as the reference does. The two widths are one text; each supplies its vector types, load
 * and store of the 16-bit half, intrinsic prefix and width. Tails take the reference. */
#define F16_LOOPS(ISA, TARGET, VF, VH, MM, W, LOADH, STOREH, CVT_TO, KEEP_NAN)                     \
    __attribute__((target(TARGET))) static void to_f16_##ISA(uint16_t *dst, const float *src,      \
                                                             size_t n) {                           \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W)                                                                 \
            STOREH((VH *)(dst + i), CVT_TO(MM##_loadu_ps(src + i)));                               \
        to_f16_portable(dst + i, src + i, n - i);                                                  \
    }                                                                                              \
    __attribute__((target(TARGET))) static void from_f16_##ISA(float *dst, const uint16_t *src,    \
                                                               size_t n) {                         \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W)                                                                 \
            MM##_storeu_ps(dst + i, MM##_cvtph_ps(LOADH((const VH *)(src + i))));                  \
        from_f16_portable(dst + i, src + i, n - i);                                                \
    }                                                                                              \
    __attribute__((target(TARGET))) static void round_f16_##ISA(float *x, size_t n) {              \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W)                                                                 \
            MM##_storeu_ps(x + i, MM##_cvtph_ps(CVT_TO(MM##_loadu_ps(x + i))));                    \
        round_f16_portable(x + i, n - i);                                                          \
    }                                                                                              \
    __attribute__((target(TARGET))) static void acc_f16_##ISA(uint16_t *dst, const float *src,     \
                                                              size_t n) {                          \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W) {                                                               \
            VF acc = MM##_cvtph_ps(LOADH((const VH *)(dst + i)));                                  \
            VF sum = KEEP_NAN(MM##_add_ps(acc, MM##_loadu_ps(src + i)), acc);                      \
            STOREH((VH *)(dst + i), CVT_TO(sum));                                                  \
        }                                                                                          \
        acc_f16_portable(dst + i, src + i, n - i);                                                 \
    }

#define CVT_TO_AVX2(x) _mm256_cvtps_ph((x), _MM_FROUND_TO_NEAREST_INT)
#define CVT_TO_AVX512(x) _mm512_cvtps_ph((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* acc_sum in vector form: the lanes where acc is NaN take acc. */
#define KEEP_NAN_AVX2(s, acc)                                                                      \
    _mm256_blendv_ps((s), (acc), _mm256_cmp_ps((acc), (acc), _CMP_UNORD_Q))
#define KEEP_NAN_AVX512(s, acc)                                                                    \
    _mm512_mask_mov_ps((s), _mm512_cmp_ps_mask((acc), (acc), _CMP_UNORD_Q), (acc))

F16_LOOPS(avx2, "avx2,f16c", __m256, __m128i, _mm256, 8, _mm_loadu_si128, _mm_storeu_si128,
          CVT_TO_AVX2, KEEP_NAN_AVX2)
F16_LOOPS(avx512, "avx512f,avx512bw", __m512, __m256i, _mm512, 16, _mm256_loadu_si256,
          _mm256_storeu_si256, CVT_TO_AVX512, KEEP_NAN_AVX512)

BF16_LOOPS(avx2, __attribute__((target("avx2,f16c"))))
BF16_LOOPS(avx512, __attribute__((target("avx512f,avx512bw,prefer-vector-width=512"))))

static const cast_path path_avx2 = {
    .name = "avx2",
    .to = {NULL, to_bf16_avx2, to_f16_avx2},
    .from = {NULL, from_bf16_avx2, from_f16_avx2},
    .round = {NULL, round_bf16_avx2, round_f16_avx2},
    .acc = {NULL, acc_bf16_avx2, acc_f16_avx2},
};

static const cast_path path_avx512 = {
    .name = "avx512",
    .to = {NULL, to_bf16_avx512, to_f16_avx512},
    .from = {NULL, from_bf16_avx512, from_f16_avx512},
    .round = {NULL, round_bf16_avx512, round_f16_avx512},
    .acc = {NULL, acc_bf16_avx512, acc_f16_avx512},
};

#endif /* ZT_CAST_X86 */

/* The path for the instruction set isa.c picks (ZTRAIN_CAST_ISA overrides it, for tests). */
static const cast_path *pick_path(void) {
    static int cache;
#ifdef ZT_CAST_X86
    static const cast_path *const by_isa[] = {&path_portable, &path_avx2, &path_avx512};
    return by_isa[zt_cpu_isa_pick("ZTRAIN_CAST_ISA", &cache)];
#else
    (void)zt_cpu_isa_pick("ZTRAIN_CAST_ISA", &cache);
    return &path_portable;
#endif
}

/* A dtype other than the two 16-bit types is a caller's bug, not a runtime condition. */
static void require_half(zt_dtype t, const char *fn) {
    if (t != ZT_BF16 && t != ZT_F16) {
        fprintf(stderr, "ztrain: %s: dtype %d is not ZT_BF16 or ZT_F16\n", fn, (int)t);
        abort();
    }
}

static size_t chunk_len(size_t n, size_t c) {
    size_t lo = c * CHUNK;
    return n - lo < CHUNK ? n - lo : CHUNK;
}

void zt_cpu_to_half(uint16_t *dst, const float *src, size_t n, zt_dtype t) {
    require_half(t, "to_half");
    to_fn fn = pick_path()->to[t];
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++)
        fn(dst + ci * CHUNK, src + ci * CHUNK, chunk_len(n, ci));
}

void zt_cpu_from_half(float *dst, const uint16_t *src, size_t n, zt_dtype t) {
    require_half(t, "from_half");
    from_fn fn = pick_path()->from[t];
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++)
        fn(dst + ci * CHUNK, src + ci * CHUNK, chunk_len(n, ci));
}

void zt_cpu_round_to(float *x, size_t n, zt_dtype t) {
    if (t == ZT_F32)
        return;
    require_half(t, "round_to");
    round_fn fn = pick_path()->round[t];
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++)
        fn(x + ci * CHUNK, chunk_len(n, ci));
}

void zt_cpu_round_run(float *x, size_t n, zt_dtype t) {
    if (t == ZT_F32)
        return;
    require_half(t, "round_run");
    pick_path()->round[t](x, n);
}

void zt_cpu_accumulate_half(uint16_t *dst, const float *src, size_t n, zt_dtype t) {
    require_half(t, "accumulate_half");
    acc_fn fn = pick_path()->acc[t];
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++)
        fn(dst + ci * CHUNK, src + ci * CHUNK, chunk_len(n, ci));
}

/* A chunk's sum of squares in double. A 16-bit value's square is exact in double (at most 22
 * significant bits, exponents far inside double's range), so only the additions round, in an order
 * fixed by the lane layout; whether GCC fuses the multiply-add changes nothing. */
static double sumsq_chunk(const uint16_t *x, size_t n, from_fn from) {
    double lane[SUMSQ_LANES] = {0};
    float buf[SUMSQ_SUB];
    for (size_t i0 = 0; i0 < n; i0 += SUMSQ_SUB) {
        size_t m = n - i0 < SUMSQ_SUB ? n - i0 : SUMSQ_SUB;
        from(buf, x + i0, m);
        size_t i = 0;
        for (; i + SUMSQ_LANES <= m; i += SUMSQ_LANES)
            for (size_t j = 0; j < SUMSQ_LANES; j++) {
                double d = (double)buf[i + j];
                lane[j] += d * d;
            }
        for (size_t j = 0; i + j < m; j++) {
            double d = (double)buf[i + j];
            lane[j] += d * d;
        }
    }
    double lo = (lane[0] + lane[1]) + (lane[2] + lane[3]);
    double hi = (lane[4] + lane[5]) + (lane[6] + lane[7]);
    return lo + hi;
}

double zt_cpu_sum_squares_half(const uint16_t *x, size_t n, zt_dtype t) {
    require_half(t, "sum_squares_half");
    from_fn from = pick_path()->from[t];
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    double total = 0.0;
    for (size_t b0 = 0; b0 < nchunks; b0 += SUMSQ_BLOCK) {
        size_t nb = nchunks - b0 < SUMSQ_BLOCK ? nchunks - b0 : SUMSQ_BLOCK;
        double part[SUMSQ_BLOCK];
#pragma omp parallel for schedule(static) if (nb > 1)
        for (size_t j = 0; j < nb; j++) {
            size_t ci = b0 + j;
            part[j] = sumsq_chunk(x + ci * CHUNK, chunk_len(n, ci), from);
        }
        for (size_t j = 0; j < nb; j++)
            total += part[j];
    }
    return total;
}
