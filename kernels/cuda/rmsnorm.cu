/* RMSNorm (Llama) on the GPU, shaped as layernorm.cu: a block per row for the forward and the
 * input gradient (128-bit loads), per-channel sums over row tiles for the weight gradient
 * (channel_sums.cuh); fp32 statistics, the math of kernels/cpu/rmsnorm.c. The weight is read
 * through its 16-bit twin where the ctx has it (zt_param_view). */
#include "channel_sums.cuh"

/* Rows are walked in 16-byte chunks as in layernorm.cu. */
#define ROW_CHUNKS(T, c, C)                                                                        \
    for (int c = threadIdx.x * ZT_VEC(T); c < (C); c += blockDim.x * ZT_VEC(T))

template <typename T>
__global__ void rms_fwd(T *out, float *rstd, const T *inp, zt_param_view w, float eps, int C) {
    constexpr int W = ZT_VEC(T);
    __shared__ float red[32];
    const T *x = inp + (size_t)blockIdx.x * C;
    T *o = out + (size_t)blockIdx.x * C;
    float ss = 0.0f;
    ROW_CHUNKS(T, c, C) {
        float v[W] = {};
        zt_ldv(x, c, C, v);
        for (int j = 0; j < W; j++)
            ss += v[j] * v[j];
    }
    float s = 1.0f / sqrtf(zt_block_sum(ss, red) / C + eps);
    ROW_CHUNKS(T, c, C) {
        float v[W] = {};
        zt_ldv(x, c, C, v);
        for (int j = 0; j < W && c + j < C; j++)
            v[j] = v[j] * s * w[c + j];
        zt_stv(o, c, C, v);
    }
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = s;
}

/* dx = rstd·(w⊙d - xhat·mean(w⊙d⊙xhat)), accumulated. */
template <typename T>
__global__ void rms_bwd_inp(T *dinp, const T *dout, const T *inp, zt_param_view w,
                            const float *rstd, int C) {
    constexpr int W = ZT_VEC(T);
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    const T *x = inp + row, *dy = dout + row;
    T *dx = dinp + row;
    const float s = rstd[blockIdx.x];
    float dot = 0.0f;
    ROW_CHUNKS(T, c, C) {
        float v[W] = {}, d[W] = {};
        zt_ldv(x, c, C, v);
        zt_ldv(dy, c, C, d);
        for (int j = 0; j < W && c + j < C; j++)
            dot += w[c + j] * d[j] * v[j] * s;
    }
    dot = zt_block_sum(dot, red) / C;
    ROW_CHUNKS(T, c, C) {
        float v[W] = {}, d[W] = {}, g[W] = {};
        zt_ldv(x, c, C, v);
        zt_ldv(dy, c, C, d);
        zt_ldv(dx, c, C, g);
        for (int j = 0; j < W && c + j < C; j++)
            g[j] += s * (w[c + j] * d[j] - v[j] * s * dot);
        zt_stv(dx, c, C, g);
    }
}

/* dw += Σ xhat·dout over the rows. */
template <typename T> struct rms_weight_term {
    static constexpr int K = 1;
    const T *dout, *inp;
    const float *rstd;
    int C;
    __device__ void operator()(int r, int c, float *acc) const {
        size_t i = (size_t)r * C + c;
        acc[0] += zt_ld(inp, i) * rstd[r] * zt_ld(dout, i);
    }
};

extern "C" void zt_cuda_rmsnorm_forward(const zt_ctx *x, void *out, float *rstd, const void *inp,
                                        const float *w, float eps, int N, int C) {
    if (N == 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(rms_fwd<ACT_T>, N, zt_row_threads_vec<ACT_T>(C), 0, zt_cuda_compute(x),
                  (ACT_T *)out, rstd, (const ACT_T *)inp, zt_cuda_param(x, w, C), eps, C);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

extern "C" void zt_cuda_rmsnorm_backward(const zt_ctx *x, void *dinp, float *dw, const void *dout,
                                         const void *inp, const float *w, const float *rstd,
                                         int N, int C) {
    if (N == 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(rms_bwd_inp<ACT_T>, N, zt_row_threads_vec<ACT_T>(C), 0, zt_cuda_compute(x),
                  (ACT_T *)dinp, (const ACT_T *)dout, (const ACT_T *)inp, zt_cuda_param(x, w, C),
                  rstd, C);
        ZT_CUDA_LAUNCHED(x->be);
        rms_weight_term<ACT_T> term = {(const ACT_T *)dout, (const ACT_T *)inp, rstd, C};
        zt_channel_sums(x, zt_cuda_grad(x, dw, C), zt_grad_view{}, term, N, C);
    });
}
