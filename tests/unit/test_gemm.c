/* The CPU backend's matrix products (kernels/cpu/gemm.h) against a double-precision loop: every
 * transposition, strided operands (the attention's heads inside packed rows), beta 0 and 1, odd
 * shapes around the libraries' block sizes, and calls from inside an OpenMP parallel region (the
 * attention's per-head products). ctest runs it once per library (ZTRAIN_GEMM=openblas, onednn)
 * and once with the native bf16 product forced on (ZTRAIN_GEMM_BF16=on), which is checked on bf16
 * operands where the CPU has AVX512_BF16 and said to be skipped where it has not.
 *
 * It also checks that a value of ZTRAIN_GEMM, ZTRAIN_GEMM_BF16, ZTRAIN_OPTIM_ISA or ZTRAIN_CAST_ISA
 * that is not understood stops the CPU backend from being created, with a message naming the
 * variable, the value and the accepted values, while the accepted values create it.
 *
 *   test_gemm            the library this build and environment choose
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gemm.h"
#include "ztrain/backend.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static float uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

/* x rounded to the nearest bfloat16 (ties to even), as a float. */
static float to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

typedef struct {
    bool ta, tb;
    int M, N, K, lda, ldb, ldc;
    float alpha, beta;
} shape;

/* Stored sizes of op(A) (M×K) and op(B) (K×N) with their row strides. */
static size_t a_len(const shape *s) { return (size_t)(s->ta ? s->K : s->M) * s->lda; }
static size_t b_len(const shape *s) { return (size_t)(s->tb ? s->N : s->K) * s->ldb; }

static float at_a(const shape *s, const float *A, int i, int k) {
    return s->ta ? A[(size_t)k * s->lda + i] : A[(size_t)i * s->lda + k];
}
static float at_b(const shape *s, const float *B, int k, int j) {
    return s->tb ? B[(size_t)j * s->ldb + k] : B[(size_t)k * s->ldb + j];
}

/* Checks C (computed from C0) against the double-precision product. The bound is fp32's
 * accumulation error, relative to the sum of the terms' magnitudes: both paths multiply exactly
 * (fp32 products of fp32 values round once; bf16 ones are exact) and add K terms in fp32. */
static void check_product(const shape *s, const float *A, const float *B, const float *C0,
                          const float *C, const char *what) {
    long off = 0;
    double worst = 0.0;
    int wi = 0, wj = 0;
    for (int i = 0; i < s->M; i++)
        for (int j = 0; j < s->N; j++) {
            double acc = 0.0, mag = 0.0;
            for (int k = 0; k < s->K; k++) {
                double p = (double)at_a(s, A, i, k) * at_b(s, B, k, j);
                acc += p, mag += fabs(p);
            }
            double c0 = C0[(size_t)i * s->ldc + j];
            double want = s->alpha * acc + s->beta * c0;
            double bound = 1e-6 * (s->K + 2) * (fabs(s->alpha) * mag + fabs(s->beta * c0)) + 1e-30;
            double err = fabs(C[(size_t)i * s->ldc + j] - want) / bound;
            if (err > 1.0)
                off++;
            if (err > worst)
                worst = err, wi = i, wj = j;
        }
    check_at(__FILE__, __LINE__, off == 0,
             "%s %c%c M=%d N=%d K=%d lda=%d ldb=%d ldc=%d beta=%g: %ld elements off, worst [%d,%d] "
             "at %.2f of its bound",
             what, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N, s->K, s->lda, s->ldb, s->ldc,
             (double)s->beta, off, wi, wj, worst);
    /* Padding between rows of C (ldc > N) is never written. */
    bool pad_kept = true;
    for (int i = 0; i < s->M && pad_kept; i++)
        for (int j = s->N; j < s->ldc; j++)
            pad_kept &= memcmp(&C[(size_t)i * s->ldc + j], &C0[(size_t)i * s->ldc + j], 4) == 0;
    check_at(__FILE__, __LINE__, pad_kept, "%s M=%d N=%d ldc=%d: wrote into C's row padding",
             what, s->M, s->N, s->ldc);
}

static float *filled(size_t n, bool bf16) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = bf16 ? to_bf16(uniform()) : uniform();
    return x;
}

static void run_shape(shape s, bool bf16, bool nested) {
    s.lda = (s.ta ? s.M : s.K) + s.lda, s.ldb = (s.tb ? s.K : s.N) + s.ldb, s.ldc = s.N + s.ldc;
    float *A = filled(a_len(&s), bf16), *B = filled(b_len(&s), bf16);
    float *C0 = filled((size_t)s.M * s.ldc, false), *C = malloc(sizeof(float) * s.M * s.ldc);
    memcpy(C, C0, sizeof(float) * s.M * s.ldc);
    const char *what;
    if (bf16) {
        s.alpha = 1.0f;
        bool ran = zt_cpu_gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, A, s.lda, B, s.ldb, s.beta, C,
                                    s.ldc);
        CHECK(ran, "zt_cpu_gemm_bf16 refused a product it is enabled for");
        what = "bf16";
    } else if (nested) {
        /* Four threads each compute a quarter of C's rows with their own call. */
        int q = (s.M + 3) / 4;
#pragma omp parallel for num_threads(4)
        for (int t = 0; t < 4; t++) {
            int r0 = t * q, r1 = r0 + q < s.M ? r0 + q : s.M;
            if (r0 >= r1)
                continue;
            const float *At = s.ta ? A + r0 : A + (size_t)r0 * s.lda;
            zt_cpu_sgemm(s.ta, s.tb, r1 - r0, s.N, s.K, s.alpha, At, s.lda, B, s.ldb, s.beta,
                         C + (size_t)r0 * s.ldc, s.ldc);
        }
        what = "fp32 inside a parallel region";
    } else {
        zt_cpu_sgemm(s.ta, s.tb, s.M, s.N, s.K, s.alpha, A, s.lda, B, s.ldb, s.beta, C, s.ldc);
        what = "fp32";
    }
    check_product(&s, A, B, C0, C, what);
    free(A), free(B), free(C0), free(C);
}

static void run_all(bool bf16) {
    static const int dims[][3] = {{1, 1, 1},    {7, 5, 3},     {64, 64, 64},  {65, 63, 129},
                                  {256, 64, 256}, {301, 131, 257}, {17, 300, 33}, {2, 513, 1}};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int t = 0; t < 4; t++)
            for (int b = 0; b < 2; b++) {
                shape s = {.ta = t & 1, .tb = t >> 1, .M = dims[d][0], .N = dims[d][1],
                           .K = dims[d][2], .lda = (int)d % 3, .ldb = (int)(d + t) % 2,
                           .ldc = (int)d % 2 * 5, .alpha = d % 3 ? 1.0f : 0.5f,
                           .beta = (float)b};
                run_shape(s, bf16, false);
                if (!bf16 && d >= 2 && d < 6)
                    run_shape(s, false, true);
            }
}

/* Creates the CPU backend with var=value (restoring var after); expects a refusal naming var,
 * value and each of the NULL-terminated accepted values, or, when accepted is NULL, success. */
static void create_with(const char *var, const char *value, const char *const *accepted) {
    const char *was = getenv(var);
    char *saved = was ? strdup(was) : NULL;
    setenv(var, value, 1);
    zt_backend *be = NULL;
    zt_status s = zt_backend_create(&be, ZT_DEVICE_CPU, NULL);
    if (!accepted) {
        CHECK(s == ZT_OK, "%s=%s: the CPU backend was refused: %s", var, value, zt_last_error());
    } else {
        const char *msg = zt_last_error();
        CHECK(s == ZT_ERR_INVALID && !be, "%s=%s: the CPU backend was created (status %s)", var,
              value, zt_status_name(s));
        CHECK(strstr(msg, var) && strstr(msg, value), "%s=%s: the refusal names neither: %s", var,
              value, msg);
        for (const char *const *a = accepted; *a; a++)
            CHECK(strstr(msg, *a), "%s=%s: the refusal does not list the accepted value %s: %s",
                  var, value, *a, msg);
    }
    if (be)
        zt_backend_destroy(be);
    if (saved)
        setenv(var, saved, 1);
    else
        unsetenv(var);
    free(saved);
}

static void check_environment(void) {
#ifdef ZT_HAVE_ONEDNN
    static const char *const libs[] = {"openblas", "onednn", NULL};
#else
    static const char *const libs[] = {"openblas", NULL};
#endif
    static const char *const bf16[] = {"on", "off", NULL};
    static const char *const isas[] = {"portable", "avx2", "avx512", NULL};
    create_with("ZTRAIN_GEMM", "mkl", libs);
    create_with("ZTRAIN_GEMM", "OpenBLAS", libs);
    create_with("ZTRAIN_GEMM_BF16", "yes", bf16);
    create_with("ZTRAIN_OPTIM_ISA", "sse2", isas);
    create_with("ZTRAIN_CAST_ISA", "AVX512", isas);
#ifndef ZT_HAVE_ONEDNN
    create_with("ZTRAIN_GEMM", "onednn", libs);
#endif
    for (const char *const *v = libs; *v; v++)
        create_with("ZTRAIN_GEMM", *v, NULL);
    for (const char *const *v = bf16; *v; v++)
        create_with("ZTRAIN_GEMM_BF16", *v, NULL);
    for (const char *const *v = isas; *v; v++)
        create_with("ZTRAIN_OPTIM_ISA", *v, NULL);
    create_with("ZTRAIN_GEMM", "", NULL);
}

int main(void) {
    printf("test_gemm: fp32 products in %s, native bf16 products %s\n",
           zt_cpu_gemm_lib_name(zt_cpu_gemm_lib()), zt_cpu_gemm_bf16_enabled() ? "on" : "off");
    /* The library asked for is the one tested: a build without it would test another under
     * its name (ctest registers each library's run only where the build has it). */
    const char *want = getenv("ZTRAIN_GEMM");
    if (want && *want)
        CHECK(strcmp(want, zt_cpu_gemm_lib_name(zt_cpu_gemm_lib())) == 0,
              "ZTRAIN_GEMM=%s chose %s", want, zt_cpu_gemm_lib_name(zt_cpu_gemm_lib()));
    check_environment();
    run_all(false);
    if (zt_cpu_gemm_bf16_enabled())
        run_all(true);
    else if (getenv("ZTRAIN_GEMM_BF16") && strcmp(getenv("ZTRAIN_GEMM_BF16"), "on") == 0)
        printf("test_gemm: bf16 products: SKIPPED: this build or CPU has no native bf16 products "
               "(oneDNN and AVX512_BF16 are both needed)\n");
    return check_summary("test_gemm");
}
