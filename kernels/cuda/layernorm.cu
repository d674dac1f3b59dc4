/* LayerNorm on the GPU, eps 1e-5: one block per row for the forward and for the input gradient
 * (block sums in a fixed order), and the weight and bias gradients as per-channel sums over row
 * tiles with a second pass in a fixed order (channel_sums.cuh), so every sum is deterministic and
 * nothing is added atomically. Statistics are fp32; the math is kernels/cpu/layernorm.c's. */
#include "channel_sums.cuh"

template <typename T>
__global__ void ln_fwd(T *out, float *mean, float *rstd, const T *inp, const float *w,
                       const float *b, int C) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        sum += zt_ld(inp, row + c);
    float m = zt_block_sum(sum, red) / C;
    float var = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float d = zt_ld(inp, row + c) - m;
        var += d * d;
    }
    float s = 1.0f / sqrtf(zt_block_sum(var, red) / C + 1e-5f);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float o = (zt_ld(inp, row + c) - m) * s * w[c];
        zt_st(out, row + c, b ? o + b[c] : o);
    }
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = s;
    }
}

template <typename T>
__global__ void ln_bwd_inp(T *dinp, const T *dout, const T *inp, const float *w,
                           const float *mean, const float *rstd, int C) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    const float m = mean[blockIdx.x], s = rstd[blockIdx.x];
    float a = 0.0f, b = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dnorm = w[c] * zt_ld(dout, row + c);
        a += dnorm;
        b += dnorm * (zt_ld(inp, row + c) - m) * s;
    }
    float dnorm_mean = zt_block_sum(a, red) / C;
    float dnorm_norm_mean = zt_block_sum(b, red) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float norm = (zt_ld(inp, row + c) - m) * s;
        float g = s * (w[c] * zt_ld(dout, row + c) - dnorm_mean - norm * dnorm_norm_mean);
        zt_st(dinp, row + c, zt_ld(dinp, row + c) + g);
    }
}

/* dw += Σ xhat·dout, db += Σ dout over the rows. */
template <typename T> struct ln_param_terms {
    static constexpr int K = 2;
    const T *dout, *inp;
    const float *mean, *rstd;
    int C;
    __device__ void operator()(int r, int c, float *acc) const {
        size_t i = (size_t)r * C + c;
        float d = zt_ld(dout, i);
        acc[0] += (zt_ld(inp, i) - mean[r]) * rstd[r] * d;
        acc[1] += d;
    }
};

extern "C" void zt_cuda_layernorm_forward(const zt_ctx *x, void *out, float *mean, float *rstd,
                                          const void *inp, const float *w, const float *b, int N,
                                          int C) {
    if (N == 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(ln_fwd<ACT_T>, N, zt_cuda_row_threads(C), 0, zt_cuda_compute(x), (ACT_T *)out,
                  mean, rstd, (const ACT_T *)inp, w, b, C);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

extern "C" void zt_cuda_layernorm_backward(const zt_ctx *x, void *dinp, float *dw, float *db,
                                           const void *dout, const void *inp, const float *w,
                                           const float *mean, const float *rstd, int N, int C) {
    if (N == 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(ln_bwd_inp<ACT_T>, N, zt_cuda_row_threads(C), 0, zt_cuda_compute(x),
                  (ACT_T *)dinp, (const ACT_T *)dout, (const ACT_T *)inp, w, mean, rstd, C);
        ZT_CUDA_LAUNCHED(x->be);
        ln_param_terms<ACT_T> terms = {(const ACT_T *)dout, (const ACT_T *)inp, mean, rstd, C};
        zt_channel_sums(x, dw, db, terms, N, C);
    });
}
