/* LAMB's two passes over a flat fp32 slice, as DeepSpeed's FusedLamb computes them (ops.h): the
 * moments with the sums of squares of the weights and of the update, then the update scaled by
 * the trust ratio; between them lamb_steps turns each tensor's sums into its step.
 *
 * Like optim.c's Adam, every element goes through the same IEEE operations (explicit fused
 * multiply-adds, correctly rounded sqrt and divide) on the AVX-512, AVX2 and portable paths, so an
 * element's m, v and p do not depend on the path nor on where a ZeRO partition starts. The sums
 * are accumulated in double; their order of additions (vector lanes, chunks) depends on the path,
 * which moves a trust ratio by about 1e-16 relative. ZTRAIN_OPTIM_ISA forces a narrower path. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#include "cpu_kernels.h"
#include "isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZT_LAMB_X86 1
#endif

/* Elements per unit of thread work, as optim.c's. */
#define CHUNK ((size_t)16384)

typedef struct {
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float eps, wd;
    int eps_inside_sqrt;
} lamb_coef;

typedef void (*moments_fn)(const float *p, const float *g, float *m, float *v, size_t n,
                           const lamb_coef *c, double sums[2]);
typedef void (*apply_fn)(float *p, const float *m, const float *v, size_t n, const lamb_coef *c,
                         float step);

/* The update of one element from its new moments: the portable reference the vector paths
 * reproduce. */
static inline float lamb_u(float p, float m, float v, const lamb_coef *c) {
    float denom = c->eps_inside_sqrt ? sqrtf(v + c->eps) : sqrtf(v) + c->eps;
    return fmaf(c->wd, p, m / denom);
}

static inline float lamb_moment_elem(float p, float g, float *m, float *v, const lamb_coef *c) {
    float mi = fmaf(c->beta1, *m, c->one_minus_beta1 * g);
    float vi = fmaf(c->beta2, *v, (c->one_minus_beta2 * g) * g);
    *m = mi;
    *v = vi;
    return lamb_u(p, mi, vi, c);
}

static void moments_portable(const float *p, const float *g, float *m, float *v, size_t n,
                             const lamb_coef *coef, double sums[2]) {
    const lamb_coef local = *coef, *c = &local;
    double w2 = 0.0, u2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        float u = lamb_moment_elem(p[i], g[i], m + i, v + i, c);
        w2 += (double)p[i] * p[i];
        u2 += (double)u * u;
    }
    sums[0] = w2;
    sums[1] = u2;
}

static void apply_portable(float *p, const float *m, const float *v, size_t n,
                           const lamb_coef *coef, float step) {
    const lamb_coef local = *coef, *c = &local;
    for (size_t i = 0; i < n; i++)
        p[i] = fmaf(-step, lamb_u(p[i], m[i], v[i], c), p[i]);
}

#ifdef ZT_LAMB_X86

/* Squares of a float vector added into two double accumulators (its low and high halves). */
__attribute__((target("avx512f"))) static inline void sq_acc_avx512(__m512 x, __m512d *acc) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    *acc = _mm512_fmadd_pd(lo, lo, *acc);
    *acc = _mm512_fmadd_pd(hi, hi, *acc);
}

__attribute__((target("avx512f"))) static inline double hsum_avx512(__m512d acc) {
    return _mm512_reduce_add_pd(acc);
}

__attribute__((target("avx2,fma"))) static inline void sq_acc_avx2(__m256 x, __m256d *acc) {
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    *acc = _mm256_fmadd_pd(lo, lo, *acc);
    *acc = _mm256_fmadd_pd(hi, hi, *acc);
}

__attribute__((target("avx2,fma"))) static inline double hsum_avx2(__m256d acc) {
    double d[4];
    _mm256_storeu_pd(d, acc);
    return (d[0] + d[1]) + (d[2] + d[3]);
}

/* moments_ISA and apply_ISA over full vectors; a slice's last partial vector goes through the
 * portable element functions, which give the same bits per element. */
#define LAMB_VECTOR_PATH(ISA, TARGET, V, D, MM, MMD, W)                                            \
    __attribute__((target(TARGET))) static inline V lamb_u_##ISA(V p, V m, V v,                    \
                                                                 const lamb_coef *c) {             \
        V denom = c->eps_inside_sqrt ? MM##_sqrt_ps(MM##_add_ps(v, MM##_set1_ps(c->eps)))          \
                                     : MM##_add_ps(MM##_sqrt_ps(v), MM##_set1_ps(c->eps));         \
        return MM##_fmadd_ps(MM##_set1_ps(c->wd), p, MM##_div_ps(m, denom));                       \
    }                                                                                              \
                                                                                                   \
    __attribute__((target(TARGET))) static void moments_##ISA(const float *p, const float *g,      \
                                                              float *m, float *v, size_t n,        \
                                                              const lamb_coef *coef,               \
                                                              double sums[2]) {                    \
        const lamb_coef local = *coef, *c = &local;                                                \
        D w2 = MMD##_setzero_pd(), u2 = MMD##_setzero_pd();                                        \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W) {                                                               \
            V pv = MM##_loadu_ps(p + i), gv = MM##_loadu_ps(g + i);                                \
            V mv = MM##_fmadd_ps(MM##_set1_ps(c->beta1), MM##_loadu_ps(m + i),                     \
                                 MM##_mul_ps(MM##_set1_ps(c->one_minus_beta1), gv));               \
            V vv = MM##_fmadd_ps(MM##_set1_ps(c->beta2), MM##_loadu_ps(v + i),                     \
                                 MM##_mul_ps(MM##_mul_ps(MM##_set1_ps(c->one_minus_beta2), gv),    \
                                             gv));                                                 \
            MM##_storeu_ps(m + i, mv);                                                             \
            MM##_storeu_ps(v + i, vv);                                                             \
            sq_acc_##ISA(pv, &w2);                                                                 \
            sq_acc_##ISA(lamb_u_##ISA(pv, mv, vv, c), &u2);                                        \
        }                                                                                          \
        double tail[2];                                                                            \
        moments_portable(p + i, g + i, m + i, v + i, n - i, c, tail);                              \
        sums[0] = hsum_##ISA(w2) + tail[0];                                                        \
        sums[1] = hsum_##ISA(u2) + tail[1];                                                        \
    }                                                                                              \
                                                                                                   \
    __attribute__((target(TARGET))) static void apply_##ISA(float *p, const float *m,              \
                                                            const float *v, size_t n,              \
                                                            const lamb_coef *coef, float step) {   \
        const lamb_coef local = *coef, *c = &local;                                                \
        V s = MM##_set1_ps(-step);                                                                 \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W) {                                                               \
            V pv = MM##_loadu_ps(p + i);                                                           \
            V u = lamb_u_##ISA(pv, MM##_loadu_ps(m + i), MM##_loadu_ps(v + i), c);                 \
            MM##_storeu_ps(p + i, MM##_fmadd_ps(s, u, pv));                                        \
        }                                                                                          \
        apply_portable(p + i, m + i, v + i, n - i, c, step);                                       \
    }

LAMB_VECTOR_PATH(avx512, "avx512f", __m512, __m512d, _mm512, _mm512, 16)
LAMB_VECTOR_PATH(avx2, "avx2,fma", __m256, __m256d, _mm256, _mm256, 8)

#endif /* ZT_LAMB_X86 */

typedef struct {
    moments_fn moments;
    apply_fn apply;
} lamb_path;

static const lamb_path *pick_path(void) {
    static int cache;
    static const lamb_path portable = {moments_portable, apply_portable};
#ifdef ZT_LAMB_X86
    static const lamb_path avx2 = {moments_avx2, apply_avx2};
    static const lamb_path avx512 = {moments_avx512, apply_avx512};
    static const lamb_path *const by_isa[] = {&portable, &avx2, &avx512};
    return by_isa[zt_cpu_isa_pick("ZTRAIN_OPTIM_ISA", &cache)];
#else
    (void)zt_cpu_isa_pick("ZTRAIN_OPTIM_ISA", &cache);
    return &portable;
#endif
}

static lamb_coef lamb_coef_of(const zt_lamb_args *a) {
    return (lamb_coef){
        .beta1 = a->beta1,
        .one_minus_beta1 = 1.0f - a->beta1,
        .beta2 = a->beta2,
        .one_minus_beta2 = 1.0f - a->beta2,
        .eps = a->eps,
        .wd = a->weight_decay,
        .eps_inside_sqrt = a->eps_inside_sqrt,
    };
}

static size_t chunk_len(size_t n, size_t c) {
    size_t lo = c * CHUNK;
    return n - lo < CHUNK ? n - lo : CHUNK;
}

/* Partial sums go into a fixed stack array per block of chunks, and are added in chunk order, so
 * the result does not depend on the thread count. */
#define SUMS_BLOCK 128

void zt_cpu_lamb_moments(const float *p, const float *g, float *m, float *v, size_t n,
                         const zt_lamb_args *a, double sums[2]) {
    lamb_coef c = lamb_coef_of(a);
    moments_fn fn = pick_path()->moments;
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    sums[0] = sums[1] = 0.0;
    for (size_t b0 = 0; b0 < nchunks; b0 += SUMS_BLOCK) {
        size_t nb = nchunks - b0 < SUMS_BLOCK ? nchunks - b0 : SUMS_BLOCK;
        double part[SUMS_BLOCK][2];
#pragma omp parallel for schedule(static) if (nb > 1)
        for (size_t j = 0; j < nb; j++) {
            size_t lo = (b0 + j) * CHUNK;
            fn(p + lo, g + lo, m + lo, v + lo, chunk_len(n, b0 + j), &c, part[j]);
        }
        for (size_t j = 0; j < nb; j++) {
            sums[0] += part[j][0];
            sums[1] += part[j][1];
        }
    }
}

void zt_cpu_lamb_apply(float *p, const float *m, const float *v, size_t n, const zt_lamb_args *a,
                       float step) {
    lamb_coef c = lamb_coef_of(a);
    apply_fn fn = pick_path()->apply;
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t lo = ci * CHUNK;
        fn(p + lo, m + lo, v + lo, chunk_len(n, ci), &c, step);
    }
}

/* The arithmetic the optimizer did on the host before the steps moved to the device, unchanged:
 * kernels/cuda/lamb.cu's lamb_steps_kernel repeats it operation for operation. */
void zt_cpu_lamb_steps(float *steps, const double *sums, size_t n, const zt_lamb_step_args *a) {
    for (size_t i = 0; i < n; i++) {
        float w = (float)sqrt(sums[2 * i]), u = (float)sqrt(sums[2 * i + 1]);
        float coeff = 1.0f;
        if (w != 0.0f && u != 0.0f) {
            coeff = w / u;
            if (coeff > a->max_coeff)
                coeff = a->max_coeff;
            if (coeff < a->min_coeff)
                coeff = a->min_coeff;
        }
        steps[i] = a->step_size * coeff;
    }
}
