/* Optimizer kernels over a flat fp32 slice: Adam/AdamW and SGD updates with torch's semantics, and
 * the sum of squares and scale that gradient clipping uses.
 *
 * Every element is computed with the same sequence of IEEE operations (explicit fused multiply-adds,
 * correctly rounded sqrt and divide) on the AVX-512, AVX2 and portable paths alike, and a slice's
 * tail goes through the same vector code under a mask. An element's result therefore does not depend
 * on where a ZeRO partition or a thread's chunk starts, nor on which of the three paths the CPU
 * takes, so N ranks updating N slices reproduce one rank updating the whole buffer bit for bit. */
#include <math.h>
#include <stdint.h>

#include "cpu_kernels.h"

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
    int first_step;
} sgd_coef;

/* Each path reads these through a local copy: their stores through float pointers could
 * otherwise alias the float constants and force a reload of every constant for every vector. */
typedef void (*adam_fn)(float *p, const float *g, float *m, float *v, size_t n,
                        const adam_coef *c);
typedef void (*sgd_fn)(float *p, const float *g, float *buf, size_t n, const sgd_coef *c);

/* The portable path, and the reference the vector paths reproduce exactly: it fuses with fmaf
 * where they use FMA instructions and leaves no other multiply-add pair for GCC to contract. */
static void adam_portable(float *p, const float *g, float *m, float *v, size_t n,
                          const adam_coef *coef) {
    const adam_coef local = *coef, *c = &local;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        if (c->l2 != 0.0f)
            gi = fmaf(c->l2, p[i], gi);
        float mi = fmaf(c->beta1, m[i], c->one_minus_beta1 * gi);
        float vi = fmaf(c->beta2, v[i], (c->one_minus_beta2 * gi) * gi);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / c->sqrt_bc2 + c->eps;
        p[i] = fmaf(p[i], c->decay, -(c->step_size * (mi / denom)));
    }
}

static void sgd_portable(float *p, const float *g, float *buf, size_t n, const sgd_coef *coef) {
    const sgd_coef local = *coef, *c = &local;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
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

/* The AVX-512 and AVX2 paths are one text, expanded once per instruction set by the two macros
 * below, so the two cannot drift apart; the portable loops above stay the written-out reference
 * that both reproduce. Each instruction set supplies its vector type, mask type, intrinsic prefix
 * (_mm512 or _mm256) and width, and three tail helpers that hide how it masks a partial vector. */

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

/* adam_vec_ISA updates one vector, for the full-width loop and the masked tail alike; adam_ISA
 * runs it over a slice. */
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
    __attribute__((target(TARGET))) static void adam_##ISA(float *p, const float *g, float *m,     \
                                                           float *v, size_t n,                     \
                                                           const adam_coef *coef) {                \
        const adam_coef local = *coef, *c = &local;                                                \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W) {                                                               \
            V pv = MM##_loadu_ps(p + i), mv = MM##_loadu_ps(m + i);                                \
            V vv = MM##_loadu_ps(v + i);                                                           \
            adam_vec_##ISA(&pv, MM##_loadu_ps(g + i), &mv, &vv, c);                                \
            MM##_storeu_ps(p + i, pv);                                                             \
            MM##_storeu_ps(m + i, mv);                                                             \
            MM##_storeu_ps(v + i, vv);                                                             \
        }                                                                                          \
        if (i < n) {                                                                               \
            MASK k = tail_mask_##ISA(n - i);                                                       \
            V pv = mask_load_##ISA(p + i, k), mv = mask_load_##ISA(m + i, k);                      \
            V vv = mask_load_##ISA(v + i, k);                                                      \
            adam_vec_##ISA(&pv, mask_load_##ISA(g + i, k), &mv, &vv, c);                           \
            mask_store_##ISA(p + i, k, pv);                                                        \
            mask_store_##ISA(m + i, k, mv);                                                        \
            mask_store_##ISA(v + i, k, vv);                                                        \
        }                                                                                          \
    }

/* sgd_vec_ISA and sgd_ISA, the same way; without momentum the buffer is neither read nor
 * written. */
#define SGD_VECTOR_PATH(ISA, TARGET, V, MASK, MM, W)                                               \
    __attribute__((target(TARGET))) static inline void sgd_vec_##ISA(V *p, V g, V *buf,            \
                                                                     const sgd_coef *c) {          \
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
ADAM_VECTOR_PATH(avx2, "avx2,fma", __m256, __m256i, _mm256, 8)
SGD_VECTOR_PATH(avx2, "avx2,fma", __m256, __m256i, _mm256, 8)

#endif /* ZT_OPTIM_X86 */

/* The widest path this CPU runs. __builtin_cpu_supports reads a table libgcc fills at startup, so
 * asking on every call costs a load and a test. */
static adam_fn pick_adam(void) {
#ifdef ZT_OPTIM_X86
    if (__builtin_cpu_supports("avx512f"))
        return adam_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return adam_avx2;
#endif
    return adam_portable;
}

static sgd_fn pick_sgd(void) {
#ifdef ZT_OPTIM_X86
    if (__builtin_cpu_supports("avx512f"))
        return sgd_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return sgd_avx2;
#endif
    return sgd_portable;
}

static size_t chunk_len(size_t n, size_t c) {
    size_t lo = c * CHUNK;
    return n - lo < CHUNK ? n - lo : CHUNK;
}

void zt_cpu_adam_update(float *p, const float *g, float *m, float *v, size_t n,
                        const zt_adam_args *a) {
    adam_coef c = {
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
    adam_fn fn = pick_adam();
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t lo = ci * CHUNK;
        fn(p + lo, g + lo, m + lo, v + lo, chunk_len(n, ci), &c);
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
        .first_step = a->first_step,
    };
    sgd_fn fn = pick_sgd();
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
