/* Rotary position embedding in place, with Hugging Face's rotate_half pairing: dimension j of a
 * head turns together with dimension j + head_dim/2 by the angle whose cosine and sine the model
 * tabulated for the token's position. The backward is the same rotation by the negative angle
 * (a rotation's transpose is its inverse), so one kernel serves both with the sine's sign. */
#include "cpu_kernels.h"
#include "ztrain/status.h"

static void rotate(float *x, const float *cos, const float *sin, float sign, int B, int T,
                   int n_heads, int head_dim, size_t row_stride, zt_dtype act) {
    ZT_ASSERT(head_dim % 2 == 0);
    const int half = head_dim / 2;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *row = x + ((size_t)b * T + t) * row_stride;
            const float *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
            for (int h = 0; h < n_heads; h++) {
                float *lo = row + (size_t)h * head_dim, *hi = lo + half;
#pragma omp simd
                for (int j = 0; j < half; j++) {
                    float a = lo[j], e = hi[j], sn = sign * s[j];
                    lo[j] = a * c[j] - e * sn;
                    hi[j] = e * c[j] + a * sn;
                }
            }
            zt_cpu_round_run(row, (size_t)n_heads * head_dim, act);
        }
    }
}

void zt_cpu_rope_forward(float *x, const float *cos, const float *sin, int B, int T, int n_heads,
                         int head_dim, size_t row_stride, zt_dtype act) {
    rotate(x, cos, sin, 1.0f, B, T, n_heads, head_dim, row_stride, act);
}

void zt_cpu_rope_backward(float *dx, const float *cos, const float *sin, int B, int T,
                          int n_heads, int head_dim, size_t row_stride, zt_dtype act) {
    rotate(dx, cos, sin, -1.0f, B, T, n_heads, head_dim, row_stride, act);
}
