/* Elementwise activations on the GPU: GPT-2's tanh GELU, SwiGLU's silu(gate)·up and the residual
 * add, each the CPU's formula (kernels/cpu/elementwise.c, swiglu.c) on fp32 values loaded from
 * and stored to the activations' type. Each element is read whole before its outputs are
 * written, so outputs may alias inputs as ops.h allows. */
#include "cuda_common.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

template <typename T> __global__ void gelu_fwd(T *out, const T *inp, size_t n) {
    ZT_GRID_LOOP(i, n) {
        float x = zt_ld(inp, i);
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        zt_st(out, i, 0.5f * x * (1.0f + tanhf(u)));
    }
}

template <typename T> __global__ void gelu_bwd(T *dinp, const T *inp, const T *dout, size_t n) {
    ZT_GRID_LOOP(i, n) {
        float x = zt_ld(inp, i);
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        zt_st(dinp, i, zt_ld(dout, i) * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du));
    }
}

/* The CPU caps the exponent at 88 so that its vectorised expf never overflows; the same cap here
 * gives the same values. */
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(fminf(-g, 88.0f))); }

template <typename T> __global__ void silu_mul_fwd(T *out, const T *gate, const T *up, size_t n) {
    ZT_GRID_LOOP(i, n) {
        float g = zt_ld(gate, i), u = zt_ld(up, i);
        zt_st(out, i, g * sigmoid(g) * u);
    }
}

template <typename T>
__global__ void silu_mul_bwd(T *dgate, T *dup, const T *dout, const T *gate, const T *up,
                             size_t n) {
    ZT_GRID_LOOP(i, n) {
        float g = zt_ld(gate, i), u = zt_ld(up, i), d = zt_ld(dout, i);
        float sig = sigmoid(g);
        zt_st(dgate, i, d * u * sig * (1.0f + g * (1.0f - sig)));
        zt_st(dup, i, d * g * sig);
    }
}

template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
    ZT_GRID_LOOP(i, n) { zt_st(out, i, zt_ld(a, i) + zt_ld(b, i)); }
}

extern "C" void zt_cuda_gelu_forward(const zt_ctx *x, void *out, const void *inp, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_1D(x, n, gelu_fwd<ACT_T>, (ACT_T *)out, (const ACT_T *)inp, n));
}

extern "C" void zt_cuda_gelu_backward(const zt_ctx *x, void *dinp, const void *inp,
                                      const void *dout, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_1D(x, n, gelu_bwd<ACT_T>, (ACT_T *)dinp, (const ACT_T *)inp,
                                      (const ACT_T *)dout, n));
}

extern "C" void zt_cuda_silu_mul_forward(const zt_ctx *x, void *out, const void *gate,
                                         const void *up, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_1D(x, n, silu_mul_fwd<ACT_T>, (ACT_T *)out,
                                      (const ACT_T *)gate, (const ACT_T *)up, n));
}

extern "C" void zt_cuda_silu_mul_backward(const zt_ctx *x, void *dgate, void *dup,
                                          const void *dout, const void *gate, const void *up,
                                          size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_1D(x, n, silu_mul_bwd<ACT_T>, (ACT_T *)dgate, (ACT_T *)dup,
                                      (const ACT_T *)dout, (const ACT_T *)gate,
                                      (const ACT_T *)up, n));
}

extern "C" void zt_cuda_add(const zt_ctx *x, void *out, const void *a, const void *b, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_1D(x, n, add_kernel<ACT_T>, (ACT_T *)out, (const ACT_T *)a,
                                      (const ACT_T *)b, n));
}
