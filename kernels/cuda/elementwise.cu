/* Elementwise activations on the GPU: GPT-2's tanh GELU, SwiGLU's silu(gate)·up and the residual
 * add, each the CPU's formula (kernels/cpu/elementwise.c, swiglu.c) on fp32 values loaded from
 * and stored to the activations' type, 16 bytes per load and store where a chunk is whole and
 * aligned. Each element is read whole before its outputs are written, so outputs may alias
 * inputs as ops.h allows. */
#include "cuda_common.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

__device__ __forceinline__ float gelu(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_grad(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
}

/* The CPU caps the exponent at 88 so that its vectorised expf never overflows; the same cap here
 * gives the same values. */
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(fminf(-g, 88.0f))); }

/* Each thread takes a chunk of 16 bytes per tensor (cuda_common.cuh's 128-bit loads), reads all
 * of its inputs and then writes: outputs may alias inputs. */
template <typename T> __global__ void gelu_fwd(T *out, const T *inp, size_t n) {
    ZT_GRID_LOOP_VEC(T, base, n) {
        float v[ZT_VEC(T)] = {};
        zt_ldv(inp, base, n, v);
        for (int j = 0; j < ZT_VEC(T); j++)
            v[j] = gelu(v[j]);
        zt_stv(out, base, n, v);
    }
}

template <typename T> __global__ void gelu_bwd(T *dinp, const T *inp, const T *dout, size_t n) {
    ZT_GRID_LOOP_VEC(T, base, n) {
        float v[ZT_VEC(T)] = {}, d[ZT_VEC(T)] = {};
        zt_ldv(inp, base, n, v);
        zt_ldv(dout, base, n, d);
        for (int j = 0; j < ZT_VEC(T); j++)
            d[j] *= gelu_grad(v[j]);
        zt_stv(dinp, base, n, d);
    }
}

template <typename T> __global__ void silu_mul_fwd(T *out, const T *gate, const T *up, size_t n) {
    ZT_GRID_LOOP_VEC(T, base, n) {
        float g[ZT_VEC(T)] = {}, u[ZT_VEC(T)] = {};
        zt_ldv(gate, base, n, g);
        zt_ldv(up, base, n, u);
        for (int j = 0; j < ZT_VEC(T); j++)
            g[j] = g[j] * sigmoid(g[j]) * u[j];
        zt_stv(out, base, n, g);
    }
}

template <typename T>
__global__ void silu_mul_bwd(T *dgate, T *dup, const T *dout, const T *gate, const T *up,
                             size_t n) {
    ZT_GRID_LOOP_VEC(T, base, n) {
        float g[ZT_VEC(T)] = {}, u[ZT_VEC(T)] = {}, d[ZT_VEC(T)] = {};
        zt_ldv(gate, base, n, g);
        zt_ldv(up, base, n, u);
        zt_ldv(dout, base, n, d);
        float dg[ZT_VEC(T)], du[ZT_VEC(T)];
        for (int j = 0; j < ZT_VEC(T); j++) {
            float sig = sigmoid(g[j]);
            dg[j] = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
            du[j] = d[j] * g[j] * sig;
        }
        zt_stv(dgate, base, n, dg);
        zt_stv(dup, base, n, du);
    }
}

template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
    ZT_GRID_LOOP_VEC(T, base, n) {
        float va[ZT_VEC(T)] = {}, vb[ZT_VEC(T)] = {};
        zt_ldv(a, base, n, va);
        zt_ldv(b, base, n, vb);
        for (int j = 0; j < ZT_VEC(T); j++)
            va[j] += vb[j];
        zt_stv(out, base, n, va);
    }
}

extern "C" void zt_cuda_gelu_forward(const zt_ctx *x, void *out, const void *inp, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_VEC(x, ACT_T, n, gelu_fwd<ACT_T>, (ACT_T *)out,
                                          (const ACT_T *)inp, n));
}

extern "C" void zt_cuda_gelu_backward(const zt_ctx *x, void *dinp, const void *inp,
                                      const void *dout, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_VEC(x, ACT_T, n, gelu_bwd<ACT_T>, (ACT_T *)dinp,
                                          (const ACT_T *)inp, (const ACT_T *)dout, n));
}

extern "C" void zt_cuda_silu_mul_forward(const zt_ctx *x, void *out, const void *gate,
                                         const void *up, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_VEC(x, ACT_T, n, silu_mul_fwd<ACT_T>, (ACT_T *)out,
                                          (const ACT_T *)gate, (const ACT_T *)up, n));
}

extern "C" void zt_cuda_silu_mul_backward(const zt_ctx *x, void *dgate, void *dup,
                                          const void *dout, const void *gate, const void *up,
                                          size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_VEC(x, ACT_T, n, silu_mul_bwd<ACT_T>, (ACT_T *)dgate,
                                          (ACT_T *)dup, (const ACT_T *)dout, (const ACT_T *)gate,
                                          (const ACT_T *)up, n));
}

extern "C" void zt_cuda_add(const zt_ctx *x, void *out, const void *a, const void *b, size_t n) {
    ZT_ACT_DISPATCH(x->act, ZT_LAUNCH_VEC(x, ACT_T, n, add_kernel<ACT_T>, (ACT_T *)out,
                                          (const ACT_T *)a, (const ACT_T *)b, n));
}
