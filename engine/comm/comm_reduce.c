/* The host-side reduction that every transport reducing on the CPU uses, so that all of them, and
 * every rank of one of them, produce the same bits: contributions folded in rank order, 16-bit
 * values widened exactly, summed in fp32 and rounded once with the CPU backend's conversions
 * (kernels/cpu/half.h, whose scalar functions define the project's rounding). */
#include <string.h>

#include "comm_transport.h"
#include "half.h"

/* Elements per block: small enough that the accumulator and one contribution stay in L1 while
 * every rank's contribution is folded in. */
enum { BLOCK = 1024 };

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* MAX keeps a NaN from any contribution: once d is NaN no comparison replaces it, and a NaN in s
 * replaces d. */
#define DEFINE_FOLD(T, NAME)                                                   \
    static void NAME(T *restrict d, const T *restrict s, size_t n, zt_reduce_op op) { \
        if (op == ZT_REDUCE_MAX) {                                             \
            for (size_t i = 0; i < n; i++)                                     \
                d[i] = s[i] != s[i] ? s[i] : s[i] > d[i] ? s[i] : d[i];        \
        } else {                                                               \
            for (size_t i = 0; i < n; i++)                                     \
                d[i] += s[i];                                                  \
        }                                                                      \
    }

DEFINE_FOLD(float, fold_f32)
DEFINE_FOLD(double, fold_f64)

/* fp32 and fp64 reduce in their own precision, straight into dst. */
#define DEFINE_REDUCE(T, NAME, FOLD)                                                         \
    static void NAME(T *dst, const unsigned char *src, size_t stride, int nsrc, size_t n,    \
                     zt_reduce_op op) {                                                      \
        for (size_t b = 0; b < n; b += BLOCK) {                                              \
            size_t m = min_sz(BLOCK, n - b);                                                 \
            T *d = dst + b;                                                                  \
            const T *s0 = (const T *)src + b;                                                \
            if (d != s0)                                                                     \
                memcpy(d, s0, m * sizeof(T));                                                \
            for (int k = 1; k < nsrc; k++)                                                   \
                FOLD(d, (const T *)(src + (size_t)k * stride) + b, m, op);                   \
            if (op == ZT_REDUCE_AVG)                                                         \
                for (size_t i = 0; i < m; i++)                                               \
                    d[i] /= (T)nsrc;                                                         \
        }                                                                                    \
    }

DEFINE_REDUCE(float, reduce_f32, fold_f32)
DEFINE_REDUCE(double, reduce_f64, fold_f64)

static void widen(float *dst, const uint16_t *src, size_t n, zt_dtype t) {
    if (t == ZT_BF16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = bits_f32(f32_from_bf16(src[i]));
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = bits_f32(f32_from_f16(src[i]));
    }
}

static void narrow(uint16_t *dst, const float *src, size_t n, zt_dtype t) {
    if (t == ZT_BF16) {
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_from_f32(f32_bits(src[i]));
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_from_f32(f32_bits(src[i]));
    }
}

/* bf16 and fp16: an fp32 accumulator per block, rounded into dst once every contribution is in.
 * dst may be src_0: each block of it is read before it is written. */
static void reduce_half(uint16_t *dst, const unsigned char *src, size_t stride, int nsrc,
                        size_t n, zt_dtype t, zt_reduce_op op) {
    float acc[BLOCK], next[BLOCK];
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t m = min_sz(BLOCK, n - b);
        widen(acc, (const uint16_t *)src + b, m, t);
        for (int k = 1; k < nsrc; k++) {
            widen(next, (const uint16_t *)(src + (size_t)k * stride) + b, m, t);
            fold_f32(acc, next, m, op);
        }
        if (op == ZT_REDUCE_AVG)
            for (size_t i = 0; i < m; i++)
                acc[i] /= (float)nsrc;
        narrow(dst + b, acc, m, t);
    }
}

void zt_comm_reduce(void *dst, const void *src, size_t stride, int nsrc, size_t n, zt_dtype t,
                    zt_reduce_op op) {
    switch (t) {
    case ZT_F32: reduce_f32(dst, src, stride, nsrc, n, op); break;
    case ZT_F64: reduce_f64(dst, src, stride, nsrc, n, op); break;
    case ZT_BF16:
    case ZT_F16: reduce_half(dst, src, stride, nsrc, n, t, op); break;
    default: ZT_ASSERT(!"zt_comm_reduce: unknown dtype");
    }
}
