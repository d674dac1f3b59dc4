/* Rotary embedding on the GPU, in place: one thread per rotated pair (dimension j and
 * j + head_dim/2 of a head), the backward the same rotation with the sine negated, as
 * kernels/cpu/rope.c. */
#include "cuda_common.cuh"

template <typename T>
__global__ void rope_kernel(T *x, const float *cos, const float *sin, float sign, int T_,
                            int n_heads, int half, size_t row_stride, size_t pairs) {
    ZT_GRID_LOOP(i, pairs) {
        int j = (int)(i % half);
        size_t rest = i / half;
        int h = (int)(rest % n_heads);
        size_t bt = rest / n_heads;
        int t = (int)(bt % T_);
        size_t lo = bt * row_stride + (size_t)h * 2 * half + j, hi = lo + half;
        float a = zt_ld(x, lo), e = zt_ld(x, hi);
        float c = cos[(size_t)t * half + j], sn = sign * sin[(size_t)t * half + j];
        zt_st(x, lo, a * c - e * sn);
        zt_st(x, hi, e * c + a * sn);
    }
}

static void rope(const zt_ctx *x, void *xq, const float *cos, const float *sin, float sign, int B,
                 int T, int n_heads, int head_dim, size_t row_stride) {
    ZT_ASSERT(head_dim % 2 == 0);
    const int half = head_dim / 2;
    size_t pairs = (size_t)B * T * n_heads * half;
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_1D(x, pairs, rope_kernel<ACT_T>, (ACT_T *)xq, cos, sin,
                                         sign, T, n_heads, half, row_stride, pairs));
}

extern "C" void zt_cuda_rope_forward(const zt_ctx *x, void *xq, const float *cos,
                                     const float *sin, int B, int T, int n_heads, int head_dim,
                                     size_t row_stride) {
    rope(x, xq, cos, sin, 1.0f, B, T, n_heads, head_dim, row_stride);
}

extern "C" void zt_cuda_rope_backward(const zt_ctx *x, void *dxq, const float *cos,
                                      const float *sin, int B, int T, int n_heads, int head_dim,
                                      size_t row_stride) {
    rope(x, dxq, cos, sin, -1.0f, B, T, n_heads, head_dim, row_stride);
}
