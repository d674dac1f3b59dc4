/* Optimizer kernels over a flat fp32 slice: Adam/AdamW and SGD updates with torch's semantics, the
 * fused mixed-precision Adam step, and the sum of squares and scale that gradient clipping uses.
 *
 * Every element is computed with the same sequence of IEEE operations (explicit fused multiply-adds,
 * correctly rounded sqrt and divide) on the AVX-512, AVX2 and portable paths alike, and a slice's
 * tail goes through the same vector code under a mask. An element's result therefore does not depend
 * on where a ZeRO partition or a thread's chunk starts, nor on which of the three paths the CPU
 * takes, so N ranks updating N slices reproduce one rank updating the whole buffer bit for bit.
 *
 * The mixed-precision step reads 16-bit (or fp32) gradients, multiplies them by the unscale/clip
 * factor, updates the fp32 masters and moments, and writes the masters rounded to 16 bits, in one
 * pass. Its conversions are half.h's, which cast.c uses too, and its arithmetic is the fp32
 * update's after one rounded multiply, so it gives the bits of from_half, scale, adam_update and
 * to_half run one after another.
 *
 * The widest path the CPU supports runs. The environment variable ZTRAIN_OPTIM_ISA (portable, avx2
 * or avx512), read once, picks a narrower one so tests can check every path on one machine; a path
 * the CPU lacks is never taken. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "half.h"
#include "isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZT_OPTIM_X86 1
#endif

/* Elements per unit of thread work: 64 KiB of each stream, a multiple of every vector width so
 * only a slice's last chunk has a partial vector. Slices of one chunk or less stay on the calling
 * thread, where starting a parallel region would cost more than the update. */
#define CHUNK ((size_t)16384)

/* sum_squares combines per-chunk partial sums in chunk order. Partials are gathered in blocks of
 * this many chunks so the buffer is a fixed stack array whatever the slice length. */
#define SUMSQ_BLOCK 256

/* Adam's per-step constants, derived once per call in double and rounded to float, the way torch
 * turns its Python-float hyperparameters into scalars for an fp32 kernel. */
typedef struct {
    float decay;   /* 1 - lr*wd in AdamW mode, else 1 */
    float l2;      /* wd in L2 mode, else 0 */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float eps;
    float sqrt_bc2;  /* sqrt(1 - beta2^t) */
    float step_size; /* lr / (1 - beta1^t) */
} adam_coef;

typedef struct {
    float lr;
    float wd;
    float momentum;
    float one_minus_dampening;
    int use_momentum; /* torch skips the buffer entirely when momentum is 0 */
    int nesterov;
    int maximize;
    int first_step;
} sgd_coef;

/* Each path reads these through a local copy: their stores through float pointers could
 * otherwise alias the float constants and force a reload of every constant for every vector. */
typedef void (*adam_fn)(float *p, const float *g, float *m, float *v, size_t n,
                        const adam_coef *c);
typedef void (*sgd_fn)(float *p, const float *g, float *buf, size_t n, const sgd_coef *c);
/* The fused mixed-precision update: g is read as grad_type and multiplied by grad_mul; out (NULL
 * when out_type is ZT_F32) receives the updated p rounded to out_type. */
typedef void (*mixed_fn)(float *p, const void *g, zt_dtype grad_type, float grad_mul, float *m,
                         float *v, uint16_t *out, zt_dtype out_type, size_t n, const adam_coef *c);

/* One element's Adam update: the portable path, and the reference the vector paths reproduce
 * exactly. It fuses with fmaf where they use FMA instructions and leaves no other multiply-add pair
 * for GCC to contract. */
static inline void adam_elem(float *p, float g, float *m, float *v, const adam_coef *c) {
    if (c->l2 != 0.0f)
        g = fmaf(c->l2, *p, g);
    float mi = fmaf(c->beta1, *m, c->one_minus_beta1 * g);
    float vi = fmaf(c->beta2, *v, (c->one_minus_beta2 * g) * g);
    *m = mi;
    *v = vi;
    float denom = sqrtf(vi) / c->sqrt_bc2 + c->eps;
    *p = fmaf(*p, c->decay, -(c->step_size * (mi / denom)));
}

/* A gradient element as from_half (or a plain load) gives it, and an updated parameter as to_half
 * rounds it. */
static inline float grad_elem(const void *g, size_t i, zt_dtype t) {
    if (t == ZT_BF16)
        return bits_f32(f32_from_bf16(((const uint16_t *)g)[i]));
    if (t == ZT_F16)
        return bits_f32(f32_from_f16(((const uint16_t *)g)[i]));
    return ((const float *)g)[i];
}

static inline uint16_t half_elem(float x, zt_dtype t) {
    return t == ZT_BF16 ? bf16_from_f32(f32_bits(x)) : f16_from_f32(f32_bits(x));
}

/* The one loop behind adam_update and adam_update_mixed on a path. Every caller passes gt, ot and
 * scaled as constants, so inlining leaves one branch-free loop per combination: adam_update is the
 * fp32, unscaled, no-output case, with no multiply by 1 that could touch a NaN's bits. */
__attribute__((always_inline)) static inline void adam_body_portable(
    float *p, const void *g, zt_dtype gt, float mul, bool scaled, float *m, float *v,
    uint16_t *out, zt_dtype ot, size_t n, const adam_coef *coef) {
    const adam_coef local = *coef, *c = &local;
    for (size_t i = 0; i < n; i++) {
        float gi = grad_elem(g, i, gt);
        if (scaled)
            gi *= mul;
        adam_elem(p + i, gi, m + i, v + i, c);
        if (ot != ZT_F32)
            out[i] = half_elem(p[i], ot);
    }
}

/* Instantiates adam_ISA (the fp32 update) and adam_mixed_ISA, which expands adam_body_ISA once for
 * each of the three gradient types times the three output choices (none, bf16, f16). */
#define ADAM_ENTRY_POINTS(ISA, ATTR)                                                               \
    ATTR static void adam_##ISA(float *p, const float *g, float *m, float *v, size_t n,           \
                                const adam_coef *c) {                                              \
        adam_body_##ISA(p, g, ZT_F32, 1.0f, false, m, v, NULL, ZT_F32, n, c);                      \
    }                                                                                              \
                                                                                                   \
    ATTR static void adam_mixed_##ISA(float *p, const void *g, zt_dtype gt, float mul, float *m,   \
                                      float *v, uint16_t *out, zt_dtype ot, size_t n,              \
                                      const adam_coef *c) {                                        \
        switch (gt * 3 + ot) {                                                                     \
        case ZT_F32 * 3 + ZT_F32:                                                                  \
            adam_body_##ISA(p, g, ZT_F32, mul, true, m, v, out, ZT_F32, n, c);                     \
            break;                                                                                 \
        case ZT_F32 * 3 + ZT_BF16:                                                                 \
            adam_body_##ISA(p, g, ZT_F32, mul, true, m, v, out, ZT_BF16, n, c);                    \
            break;                                                                                 \
        case ZT_F32 * 3 + ZT_F16:                                                                  \
            adam_body_##ISA(p, g, ZT_F32, mul, true, m, v, out, ZT_F16, n, c);                     \
            break;                                                                                 \
        case ZT_BF16 * 3 + ZT_F32:                                                                 \
            adam_body_##ISA(p, g, ZT_BF16, mul, true, m, v, out, ZT_F32, n, c);                    \
            break;                                                                                 \
        case ZT_BF16 * 3 + ZT_BF16:                                                                \
            adam_body_##ISA(p, g, ZT_BF16, mul, true, m, v, out, ZT_BF16, n, c);                   \
            break;                                                                                 \
        case ZT_BF16 * 3 + ZT_F16:                                                                 \
            adam_body_##ISA(p, g, ZT_BF16, mul, true, m, v, out, ZT_F16, n, c);                    \
            break;                                                                                 \
        case ZT_F16 * 3 + ZT_F32:                                                                  \
            adam_body_##ISA(p, g, ZT_F16, mul, true, m, v, out, ZT_F32, n, c);                     \
            break;                                                                                 \
        case ZT_F16 * 3 + ZT_BF16:                                                                 \
            adam_body_##ISA(p, g, ZT_F16, mul, true, m, v, out, ZT_BF16, n, c);                    \
            break;                                                                                 \
        default:                                                                                   \
            adam_body_##ISA(p, g, ZT_F16, mul, true, m, v, out, ZT_F16, n, c);                     \
            break;                                                                                 \
        }                                                                                          \
    }

ADAM_ENTRY_POINTS(portable, )

static void sgd_portable(float *p, const float *g, float *buf, size_t n, const sgd_coef *coef) {
    const sgd_coef local = *coef, *c = &local;
    for (size_t i = 0; i < n; i++) {
        float gi = c->maximize ? -g[i] : g[i];
        if (c->wd != 0.0f)
            gi = fmaf(c->wd, p[i], gi);
        if (c->use_momentum) {
            float b = c->first_step ? gi : fmaf(c->momentum, buf[i], c->one_minus_dampening * gi);
            buf[i] = b;
            gi = c->nesterov ? fmaf(c->momentum, b, gi) : b;
        }
        p[i] = fmaf(-c->lr, gi, p[i]);
    }
}

#ifdef ZT_OPTIM_X86

/* The AVX-512 and AVX2 paths are one text, expanded once per instruction set by the macros below,
 * so the two cannot drift apart; the portable loops above stay the written-out reference that both
 * reproduce. Each instruction set supplies its vector type, mask type, intrinsic prefix (_mm512 or
 * _mm256) and width, three tail helpers that hide how it masks a partial vector, and two that load
 * a vector of gradients and store a vector of 16-bit parameters. */

/* AVX-512 masks the tail with a mask register. */
__attribute__((target("avx512f"))) static inline __mmask16 tail_mask_avx512(size_t rem) {
    return (__mmask16)((1u << rem) - 1u);
}

__attribute__((target("avx512f"))) static inline __m512 mask_load_avx512(const float *p,
                                                                         __mmask16 k) {
    return _mm512_maskz_loadu_ps(k, p);
}

__attribute__((target("avx512f"))) static inline void mask_store_avx512(float *p, __mmask16 k,
                                                                        __m512 x) {
    _mm512_mask_storeu_ps(p, k, x);
}

__attribute__((target("avx512f"))) static inline __m512 load_grad_avx512(const void *g, size_t i,
                                                                         zt_dtype t) {
    if (t == ZT_F32)
        return _mm512_loadu_ps((const float *)g + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
    return t == ZT_BF16 ? bf16x16_to_f32(h) : f16x16_to_f32(h);
}

__attribute__((target("avx512f"))) static inline void store_half_avx512(uint16_t *out, __m512 x,
                                                                        zt_dtype t) {
    __m256i h = t == ZT_BF16 ? f32x16_to_bf16(x) : f32x16_to_f16(x);
    _mm256_storeu_si256((__m256i *)out, h);
}

/* AVX2 has no mask registers; a lane mask built by comparing lane indices with the remaining
 * count drives maskload/maskstore, which never touch memory past the slice. */
__attribute__((target("avx2"))) static inline __m256i tail_mask_avx2(size_t rem) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2"))) static inline __m256 mask_load_avx2(const float *p, __m256i k) {
    return _mm256_maskload_ps(p, k);
}

__attribute__((target("avx2"))) static inline void mask_store_avx2(float *p, __m256i k, __m256 x) {
    _mm256_maskstore_ps(p, k, x);
}

__attribute__((target("avx2,f16c"))) static inline __m256 load_grad_avx2(const void *g, size_t i,
                                                                         zt_dtype t) {
    if (t == ZT_F32)
        return _mm256_loadu_ps((const float *)g + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
    return t == ZT_BF16 ? bf16x8_to_f32(h) : f16x8_to_f32(h);
}

__attribute__((target("avx2,f16c"))) static inline void store_half_avx2(uint16_t *out, __m256 x,
                                                                        zt_dtype t) {
    __m128i h = t == ZT_BF16 ? f32x8_to_bf16(x) : f32x8_to_f16(x);
    _mm_storeu_si128((__m128i *)out, h);
}

/* adam_vec_ISA updates one vector, for the full-width loop and the masked tail alike;
 * adam_body_ISA runs it over a slice, as adam_body_portable does. A 16-bit tail goes through a
 * W-element buffer, so no load or store reaches past the slice. */
#define ADAM_VECTOR_PATH(ISA, TARGET, V, MASK, MM, W)                                              \
    __attribute__((target(TARGET))) static inline void adam_vec_##ISA(V *p, V g, V *m, V *v,       \
                                                                      const adam_coef *c) {        \
        if (c->l2 != 0.0f)                                                                         \
            g = MM##_fmadd_ps(MM##_set1_ps(c->l2), *p, g);                                         \
        *m = MM##_fmadd_ps(MM##_set1_ps(c->beta1), *m,                                             \
                           MM##_mul_ps(MM##_set1_ps(c->one_minus_beta1), g));                      \
        *v = MM##_fmadd_ps(MM##_set1_ps(c->beta2), *v,                                             \
                           MM##_mul_ps(MM##_mul_ps(MM##_set1_ps(c->one_minus_beta2), g), g));      \
        V denom = MM##_add_ps(MM##_div_ps(MM##_sqrt_ps(*v), MM##_set1_ps(c->sqrt_bc2)),            \
                              MM##_set1_ps(c->eps));                                               \
        V upd = MM##_mul_ps(MM##_set1_ps(c->step_size), MM##_div_ps(*m, denom));                   \
        *p = MM##_fmsub_ps(*p, MM##_set1_ps(c->decay), upd);                                       \
    }                                                                                              \
                                                                                                   \
    __attribute__((target(TARGET), always_inline)) static inline void adam_body_##ISA(             \
        float *p, const void *g, zt_dtype gt, float mul, bool scaled, float *m, float *v,          \
        uint16_t *out, zt_dtype ot, size_t n, const adam_coef *coef) {                             \
        const adam_coef local = *coef, *c = &local;                                                \
        V s = MM##_set1_ps(mul);                                                                   \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W) {                                                               \
            V gv = load_grad_##ISA(g, i, gt);                                                      \
            if (scaled)                                                                            \
                gv = MM##_mul_ps(gv, s);                                                           \
            V pv = MM##_loadu_ps(p + i), mv = MM##_loadu_ps(m + i);                                \
            V vv = MM##_loadu_ps(v + i);                                                           \
            adam_vec_##ISA(&pv, gv, &mv, &vv, c);                                                  \
            MM##_storeu_ps(p + i, pv);                                                             \
            MM##_storeu_ps(m + i, mv);                                                             \
            MM##_storeu_ps(v + i, vv);                                                             \
            if (ot != ZT_F32)                                                                      \
                store_half_##ISA(out + i, pv, ot);                                                 \
        }                                                                                          \
        if (i < n) {                                                                               \
            size_t rem = n - i;                                                                    \
            MASK k = tail_mask_##ISA(rem);                                                         \
            V gv;                                                                                  \
            if (gt == ZT_F32) {                                                                    \
                gv = mask_load_##ISA((const float *)g + i, k);                                     \
            } else {                                                                               \
                uint16_t h[W] = {0};                                                               \
                memcpy(h, (const uint16_t *)g + i, rem * sizeof *h);                               \
                gv = load_grad_##ISA(h, 0, gt);                                                    \
            }                                                                                      \
            if (scaled)                                                                            \
                gv = MM##_mul_ps(gv, s);                                                           \
            V pv = mask_load_##ISA(p + i, k), mv = mask_load_##ISA(m + i, k);                      \
            V vv = mask_load_##ISA(v + i, k);                                                      \
            adam_vec_##ISA(&pv, gv, &mv, &vv, c);                                                  \
            mask_store_##ISA(p + i, k, pv);                                                        \
            mask_store_##ISA(m + i, k, mv);                                                        \
            mask_store_##ISA(v + i, k, vv);                                                        \
            if (ot != ZT_F32) {                                                                    \
                uint16_t h[W];                                                                     \
                store_half_##ISA(h, pv, ot);                                                       \
                memcpy(out + i, h, rem * sizeof *h);                                               \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    ADAM_ENTRY_POINTS(ISA, __attribute__((target(TARGET))))

/* sgd_vec_ISA and sgd_ISA, the same way; without momentum the buffer is neither read nor
 * written. */
#define SGD_VECTOR_PATH(ISA, TARGET, V, MASK, MM, W)                                               \
    __attribute__((target(TARGET))) static inline void sgd_vec_##ISA(V *p, V g, V *buf,            \
                                                                     const sgd_coef *c) {          \
        if (c->maximize)                                                                           \
            g = MM##_mul_ps(MM##_set1_ps(-1.0f), g);                                               \
        if (c->wd != 0.0f)                                                                         \
            g = MM##_fmadd_ps(MM##_set1_ps(c->wd), *p, g);                                         \
        if (c->use_momentum) {                                                                     \
            V mom = MM##_set1_ps(c->momentum);                                                     \
            V b = c->first_step                                                                    \
                      ? g                                                                          \
                      : MM##_fmadd_ps(mom, *buf,                                                   \
                                      MM##_mul_ps(MM##_set1_ps(c->one_minus_dampening), g));       \
            *buf = b;                                                                              \
            g = c->nesterov ? MM##_fmadd_ps(mom, b, g) : b;                                        \
        }                                                                                          \
        *p = MM##_fmadd_ps(MM##_set1_ps(-c->lr), g, *p);                                           \
    }                                                                                              \
                                                                                                   \
    __attribute__((target(TARGET))) static void sgd_##ISA(float *p, const float *g, float *buf,    \
                                                          size_t n, const sgd_coef *coef) {        \
        const sgd_coef local = *coef, *c = &local;                                                 \
        size_t i = 0;                                                                              \
        V zero = MM##_setzero_ps();                                                                \
        for (; i + W <= n; i += W) {                                                               \
            V pv = MM##_loadu_ps(p + i);                                                           \
            V bv = c->use_momentum ? MM##_loadu_ps(buf + i) : zero;                                \
            sgd_vec_##ISA(&pv, MM##_loadu_ps(g + i), &bv, c);                                      \
            MM##_storeu_ps(p + i, pv);                                                             \
            if (c->use_momentum)                                                                   \
                MM##_storeu_ps(buf + i, bv);                                                       \
        }                                                                                          \
        if (i < n) {                                                                               \
            MASK k = tail_mask_##ISA(n - i);                                                       \
            V pv = mask_load_##ISA(p + i, k);                                                      \
            V bv = c->use_momentum ? mask_load_##ISA(buf + i, k) : zero;                           \
            sgd_vec_##ISA(&pv, mask_load_##ISA(g + i, k), &bv, c);                                 \
            mask_store_##ISA(p + i, k, pv);                                                        \
            if (c->use_momentum)                                                                   \
                mask_store_##ISA(buf + i, k, bv);                                                  \
        }                                                                                          \
    }

ADAM_VECTOR_PATH(avx512, "avx512f", __m512, __mmask16, _mm512, 16)
SGD_VECTOR_PATH(avx512, "avx512f", __m512, __mmask16, _mm512, 16)
ADAM_VECTOR_PATH(avx2, "avx2,fma,f16c", __m256, __m256i, _mm256, 8)
SGD_VECTOR_PATH(avx2, "avx2,fma,f16c", __m256, __m256i, _mm256, 8)

#endif /* ZT_OPTIM_X86 */

typedef struct {
    const char *name;
    adam_fn adam;
    sgd_fn sgd;
    mixed_fn mixed;
} optim_path;

static const optim_path path_portable = {"portable", adam_portable, sgd_portable,
                                         adam_mixed_portable};
#ifdef ZT_OPTIM_X86
static const optim_path path_avx2 = {"avx2", adam_avx2, sgd_avx2, adam_mixed_avx2};
static const optim_path path_avx512 = {"avx512", adam_avx512, sgd_avx512, adam_mixed_avx512};
#endif

/* The path for the instruction set isa.c picks (ZTRAIN_OPTIM_ISA overrides it, for tests). */
static const optim_path *pick_path(void) {
    static int cache;
#ifdef ZT_OPTIM_X86
    static const optim_path *const by_isa[] = {&path_portable, &path_avx2, &path_avx512};
    return by_isa[zt_cpu_isa_pick("ZTRAIN_OPTIM_ISA", &cache)];
#else
    (void)zt_cpu_isa_pick("ZTRAIN_OPTIM_ISA", &cache);
    return &path_portable;
#endif
}

const char *zt_cpu_optim_isa(void) { return pick_path()->name; }

static size_t chunk_len(size_t n, size_t c) {
    size_t lo = c * CHUNK;
    return n - lo < CHUNK ? n - lo : CHUNK;
}

static adam_coef adam_coef_of(const zt_adam_args *a) {
    return (adam_coef){
        .decay = a->adamw_mode ? (float)(1.0 - (double)a->lr * a->weight_decay) : 1.0f,
        .l2 = a->adamw_mode ? 0.0f : a->weight_decay,
        .beta1 = a->beta1,
        .one_minus_beta1 = (float)(1.0 - a->beta1),
        .beta2 = a->beta2,
        .one_minus_beta2 = (float)(1.0 - a->beta2),
        .eps = a->eps,
        .sqrt_bc2 = (float)sqrt((double)a->bias_correction2),
        .step_size = (float)((double)a->lr / a->bias_correction1),
    };
}

void zt_cpu_adam_update(float *p, const float *g, float *m, float *v, size_t n,
                        const zt_adam_args *a) {
    /* maximize: the scaled path with a multiplier of -1, so the plain path keeps no multiply
     * that could touch a NaN's bits. */
    if (a->maximize) {
        zt_cpu_adam_update_mixed(p, g, ZT_F32, 1.0f, m, v, NULL, ZT_F32, n, a);
        return;
    }
    adam_coef c = adam_coef_of(a);
    adam_fn fn = pick_path()->adam;
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t lo = ci * CHUNK;
        fn(p + lo, g + lo, m + lo, v + lo, chunk_len(n, ci), &c);
    }
}

/* A dtype outside the ones the table documents is a caller's bug, not a runtime condition. */
static void require_dtype(zt_dtype t, bool f32_ok, const char *what) {
    if (t != ZT_BF16 && t != ZT_F16 && !(f32_ok && t == ZT_F32)) {
        fprintf(stderr, "ztrain: adam_update_mixed: %s dtype %d is not %s\n", what, (int)t,
                f32_ok ? "ZT_F32, ZT_BF16 or ZT_F16" : "ZT_BF16 or ZT_F16");
        abort();
    }
}

void zt_cpu_adam_update_mixed(float *master, const void *grad, zt_dtype grad_type,
                              float grad_mul, float *m, float *v, uint16_t *param16,
                              zt_dtype param_type, size_t n, const zt_adam_args *a) {
    require_dtype(grad_type, true, "gradient");
    if (param16)
        require_dtype(param_type, false, "parameter");
    else
        param_type = ZT_F32;
    adam_coef c = adam_coef_of(a);
    mixed_fn fn = pick_path()->mixed;
    /* -(g·mul) = g·(-mul) exactly: torch negates the gradient after unscaling. */
    if (a->maximize)
        grad_mul = -grad_mul;
    const char *g = grad;
    size_t gsize = grad_type == ZT_F32 ? sizeof(float) : sizeof(uint16_t);
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t lo = ci * CHUNK;
        fn(master + lo, g + lo * gsize, grad_type, grad_mul, m + lo, v + lo,
           param16 ? param16 + lo : NULL, param_type, chunk_len(n, ci), &c);
    }
}

void zt_cpu_sgd_update(float *p, const float *g, float *buf, size_t n, const zt_sgd_args *a) {
    sgd_coef c = {
        .lr = a->lr,
        .wd = a->weight_decay,
        .momentum = a->momentum,
        .one_minus_dampening = (float)(1.0 - a->dampening),
        .use_momentum = buf != NULL && a->momentum != 0.0f,
        .nesterov = a->nesterov,
        .maximize = a->maximize,
        .first_step = a->first_step,
    };
    sgd_fn fn = pick_path()->sgd;
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t lo = ci * CHUNK;
        fn(p + lo, g + lo, c.use_momentum ? buf + lo : NULL, chunk_len(n, ci), &c);
    }
}

/* A chunk's sum of squares in double, so a norm over hundreds of millions of elements keeps its
 * digits; the lane order is fixed by the compiled code, never by thread timing. */
static double sumsq_chunk(const float *x, size_t n) {
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i];
        acc += d * d;
    }
    return acc;
}

double zt_cpu_sum_squares(const float *x, size_t n) {
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    double total = 0.0;
    for (size_t b0 = 0; b0 < nchunks; b0 += SUMSQ_BLOCK) {
        size_t nb = nchunks - b0 < SUMSQ_BLOCK ? nchunks - b0 : SUMSQ_BLOCK;
        double part[SUMSQ_BLOCK];
#pragma omp parallel for schedule(static) if (nb > 1)
        for (size_t j = 0; j < nb; j++) {
            size_t ci = b0 + j;
            part[j] = sumsq_chunk(x + ci * CHUNK, chunk_len(n, ci));
        }
        for (size_t j = 0; j < nb; j++)
            total += part[j];
    }
    return total;
}

void zt_cpu_scale(float *x, size_t n, float s) {
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++) {
        float *xc = x + ci * CHUNK;
        size_t len = chunk_len(n, ci);
#pragma omp simd
        for (size_t i = 0; i < len; i++)
            xc[i] *= s;
    }
}
