/* Rotary embedding on the GPU, in place, as kernels/cpu/rope.c: each head's dimension j and
 * j + head_dim/2 rotate together, the backward the same rotation with the sine negated.
 *
 * A thread takes a chunk of ZT_VEC(T) pairs (8 at bf16/fp16, 4 at fp32): 16-byte loads and
 * stores of the chunk's low and high halves and of its cos and sin entries (cuda_common.cuh's
 * zt_ldv/zt_stv, zt_ldv_f32 for the fp32 tables). A chunk past the end of a half (head_dim/2
 * not a multiple of the vector), or a head that does not start 16-byte aligned (q or k of a
 * packed q|k|v row at an odd offset), goes element by element; the arithmetic is the same
 * either way. */
#include "cuda_common.cuh"

template <typename T>
__global__ void rope_kernel(T *x, const float *cos, const float *sin, float sign, int T_,
                            int n_heads, int half, size_t row_stride, size_t chunks) {
    const int per_half = (half + ZT_VEC(T) - 1) / ZT_VEC(T);
    ZT_GRID_LOOP(i, chunks) {
        const int j0 = (int)(i % per_half) * ZT_VEC(T);
        size_t rest = i / per_half;
        int h = (int)(rest % n_heads);
        size_t bt = rest / n_heads;
        int t = (int)(bt % T_);
        T *lo = x + bt * row_stride + (size_t)h * 2 * half, *hi = lo + half;
        float a[ZT_VEC(T)] = {}, e[ZT_VEC(T)] = {}, c[ZT_VEC(T)] = {}, s[ZT_VEC(T)] = {};
        zt_ldv(lo, j0, half, a);
        zt_ldv(hi, j0, half, e);
        zt_ldv_f32<ZT_VEC(T)>(cos + (size_t)t * half, j0, half, c);
        zt_ldv_f32<ZT_VEC(T)>(sin + (size_t)t * half, j0, half, s);
        float out_lo[ZT_VEC(T)] = {}, out_hi[ZT_VEC(T)] = {};
        for (int k = 0; k < ZT_VEC(T) && j0 + k < half; k++) {
            float sn = sign * s[k];
            out_lo[k] = a[k] * c[k] - e[k] * sn;
            out_hi[k] = e[k] * c[k] + a[k] * sn;
        }
        zt_stv(lo, j0, half, out_lo);
        zt_stv(hi, j0, half, out_hi);
    }
}

static void rope(const zt_ctx *x, void *xq, const float *cos, const float *sin, float sign, int B,
                 int T, int n_heads, int head_dim, size_t row_stride) {
    ZT_ASSERT(head_dim % 2 == 0);
    const int half = head_dim / 2;
    ZT_ACT_DISPATCH(x->act, {
        size_t chunks = (size_t)B * T * n_heads * ((half + ZT_VEC(ACT_T) - 1) / ZT_VEC(ACT_T));
        ZT_LAUNCH_1D(x, chunks, rope_kernel<ACT_T>, (ACT_T *)xq, cos, sin, sign, T, n_heads,
                     half, row_stride, chunks);
    });
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
