/* The SwiGLU gate of Llama's MLP: silu(gate) · up elementwise, silu(g) = g·sigmoid(g). Each
 * element is read whole before any output is written (and rounded only after its whole run is
 * written), so an output may alias an input.
 *
 * Built with -ffast-math so that expf vectorises (CMakeLists.txt), this file avoids infinities:
 * the exponent is capped at 88, where expf is still finite and the sigmoid already 0 in fp32. */
#include <math.h>

#include "cpu_kernels.h"

static inline float sigmoid(float g) { return 1.0f / (1.0f + expf(fminf(-g, 88.0f))); }

void zt_cpu_silu_mul_forward(float *out, const float *gate, const float *up, size_t n,
                             zt_dtype act) {
    size_t runs = (n + ZT_CPU_RUN - 1) / ZT_CPU_RUN;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < runs; r++) {
        size_t lo = r * ZT_CPU_RUN, hi = lo + ZT_CPU_RUN < n ? lo + ZT_CPU_RUN : n;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            float g = gate[i];
            out[i] = g * sigmoid(g) * up[i];
        }
        zt_cpu_round_run(out + lo, hi - lo, act);
    }
}

void zt_cpu_silu_mul_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t n, zt_dtype act) {
    size_t runs = (n + ZT_CPU_RUN - 1) / ZT_CPU_RUN;
    /* d silu(g)/dg = sig·(1 + g·(1 - sig)) */
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < runs; r++) {
        size_t lo = r * ZT_CPU_RUN, hi = lo + ZT_CPU_RUN < n ? lo + ZT_CPU_RUN : n;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            float g = gate[i], u = up[i], d = dout[i];
            float sig = sigmoid(g);
            dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
            dup[i] = d * g * sig;
        }
        zt_cpu_round_run(dgate + lo, hi - lo, act);
        zt_cpu_round_run(dup + lo, hi - lo, act);
    }
}
