/* The SwiGLU gate of Llama's MLP: silu(gate) · up elementwise, silu(g) = g·sigmoid(g). gate and
 * up are rows at a stride (ld), so they can be the two halves of each row of one product of the
 * stacked gate_proj|up_proj weights; out and dout are dense. Each element is read whole before
 * any output is written (and rounded only after its whole run is written), so an output may
 * alias an input as ops.h allows.
 *
 * Built with -ffast-math so that expf vectorises (CMakeLists.txt), this file avoids infinities:
 * the exponent is capped at 88, where expf is still finite and the sigmoid already 0 in fp32. */
#include <math.h>

#include "cpu_kernels.h"

static inline float sigmoid(float g) { return 1.0f / (1.0f + expf(fminf(-g, 88.0f))); }

/* The work is split into runs of at most ZT_CPU_RUN elements of one row, so a row of any width
 * and any number of rows both spread over the threads. */
static size_t runs_per_row(size_t cols) { return cols ? (cols + ZT_CPU_RUN - 1) / ZT_CPU_RUN : 1; }

void zt_cpu_silu_mul_forward(float *out, const float *gate, const float *up, size_t rows,
                             size_t cols, size_t ld, zt_dtype act) {
    const size_t per_row = runs_per_row(cols), runs = rows * per_row;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < runs; k++) {
        const size_t r = k / per_row, lo = k % per_row * ZT_CPU_RUN;
        const size_t hi = lo + ZT_CPU_RUN < cols ? lo + ZT_CPU_RUN : cols;
        const float *g = gate + r * ld, *u = up + r * ld;
        float *o = out + r * cols;
#pragma omp simd
        for (size_t i = lo; i < hi; i++)
            o[i] = g[i] * sigmoid(g[i]) * u[i];
        zt_cpu_round_run(o + lo, hi - lo, act);
    }
}

void zt_cpu_silu_mul_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t rows, size_t cols, size_t ld,
                              zt_dtype act) {
    const size_t per_row = runs_per_row(cols), runs = rows * per_row;
    /* d silu(g)/dg = sig·(1 + g·(1 - sig)) */
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < runs; k++) {
        const size_t r = k / per_row, lo = k % per_row * ZT_CPU_RUN;
        const size_t hi = lo + ZT_CPU_RUN < cols ? lo + ZT_CPU_RUN : cols;
        const float *gr = gate + r * ld, *ur = up + r * ld, *dr = dout + r * cols;
        float *dg = dgate + r * ld, *du = dup + r * ld;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            float g = gr[i], u = ur[i], d = dr[i];
            float sig = sigmoid(g);
            dg[i] = d * u * sig * (1.0f + g * (1.0f - sig));
            du[i] = d * g * sig;
        }
        zt_cpu_round_run(dg + lo, hi - lo, act);
        zt_cpu_round_run(du + lo, hi - lo, act);
    }
}
