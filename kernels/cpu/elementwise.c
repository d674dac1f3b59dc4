/* Elementwise ops: GPT-2's tanh-approximated GELU and the residual add. Threads take runs of RUN
 * elements, and each run is rounded to the activations' precision right after it is written. */
#include <math.h>

#include "cpu_kernels.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

void zt_cpu_gelu_forward(float *out, const float *inp, size_t n, zt_dtype act) {
    size_t runs = (n + ZT_CPU_RUN - 1) / ZT_CPU_RUN;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < runs; r++) {
        size_t lo = r * ZT_CPU_RUN, hi = lo + ZT_CPU_RUN < n ? lo + ZT_CPU_RUN : n;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            float x = inp[i];
            float u = GELU_SCALE * (x + 0.044715f * x * x * x);
            out[i] = 0.5f * x * (1.0f + tanhf(u));
        }
        zt_cpu_round_run(out + lo, hi - lo, act);
    }
}

void zt_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                          zt_dtype act) {
    size_t runs = (n + ZT_CPU_RUN - 1) / ZT_CPU_RUN;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < runs; r++) {
        size_t lo = r * ZT_CPU_RUN, hi = lo + ZT_CPU_RUN < n ? lo + ZT_CPU_RUN : n;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            float x = inp[i];
            float u = GELU_SCALE * (x + 0.044715f * x * x * x);
            float th = tanhf(u);
            float sech2 = 1.0f - th * th;
            float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
            dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
        }
        zt_cpu_round_run(dinp + lo, hi - lo, act);
    }
}

void zt_cpu_add(float *out, const float *a, const float *b, size_t n, zt_dtype act) {
    size_t runs = (n + ZT_CPU_RUN - 1) / ZT_CPU_RUN;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < runs; r++) {
        size_t lo = r * ZT_CPU_RUN, hi = lo + ZT_CPU_RUN < n ? lo + ZT_CPU_RUN : n;
#pragma omp simd
        for (size_t i = lo; i < hi; i++)
            out[i] = a[i] + b[i];
        zt_cpu_round_run(out + lo, hi - lo, act);
    }
}
