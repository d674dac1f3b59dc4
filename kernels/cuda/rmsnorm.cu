/* RMSNorm (Llama) on the GPU, shaped as layernorm.cu: a block per row for the forward and the
 * input gradient, per-channel sums over row tiles for the weight gradient (channel_sums.cuh);
 * fp32 statistics, the math of kernels/cpu/rmsnorm.c. */
#include "channel_sums.cuh"

template <typename T>
__global__ void rms_fwd(T *out, float *rstd, const T *inp, const float *w, float eps, int C) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = zt_ld(inp, row + c);
        ss += v * v;
    }
    float s = 1.0f / sqrtf(zt_block_sum(ss, red) / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        zt_st(out, row + c, zt_ld(inp, row + c) * s * w[c]);
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = s;
}

/* dx = rstd·(w⊙d - xhat·mean(w⊙d⊙xhat)), accumulated. */
template <typename T>
__global__ void rms_bwd_inp(T *dinp, const T *dout, const T *inp, const float *w,
                            const float *rstd, int C) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    const float s = rstd[blockIdx.x];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += w[c] * zt_ld(dout, row + c) * zt_ld(inp, row + c) * s;
    dot = zt_block_sum(dot, red) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = s * (w[c] * zt_ld(dout, row + c) - zt_ld(inp, row + c) * s * dot);
        zt_st(dinp, row + c, zt_ld(dinp, row + c) + g);
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
        ZT_LAUNCH(rms_fwd<ACT_T>, N, zt_cuda_row_threads(C), 0, zt_cuda_compute(x), (ACT_T *)out,
                  rstd, (const ACT_T *)inp, w, eps, C);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

extern "C" void zt_cuda_rmsnorm_backward(const zt_ctx *x, void *dinp, float *dw, const void *dout,
                                         const void *inp, const float *w, const float *rstd,
                                         int N, int C) {
    if (N == 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(rms_bwd_inp<ACT_T>, N, zt_cuda_row_threads(C), 0, zt_cuda_compute(x),
                  (ACT_T *)dinp, (const ACT_T *)dout, (const ACT_T *)inp, w, rstd, C);
        ZT_CUDA_LAUNCHED(x->be);
        rms_weight_term<ACT_T> term = {(const ACT_T *)dout, (const ACT_T *)inp, rstd, C};
        zt_channel_sums(x, dw, NULL, term, N, C);
    });
}
