/* LayerNorm on the GPU, eps 1e-5: one block per row for the forward and for the input gradient
 * (block sums in a fixed order), and one thread per channel summing over rows for the weight and
 * bias gradients, so every sum is deterministic and nothing is added atomically. Statistics are
 * fp32; the math is kernels/cpu/layernorm.c's. */
#include "cuda_common.cuh"

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

template <typename T>
__global__ void ln_bwd_params(float *dw, float *db, const T *dout, const T *inp,
                              const float *mean, const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float gw = 0.0f, gb = 0.0f;
    for (int n = 0; n < N; n++) {
        size_t i = (size_t)n * C + c;
        float d = zt_ld(dout, i);
        gw += (zt_ld(inp, i) - mean[n]) * rstd[n] * d;
        gb += d;
    }
    dw[c] += gw;
    if (db)
        db[c] += gb;
}

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
        ZT_LAUNCH(ln_bwd_params<ACT_T>, (C + ZT_CUDA_BLOCK - 1) / ZT_CUDA_BLOCK, ZT_CUDA_BLOCK, 0,
                  zt_cuda_compute(x), dw, db, (const ACT_T *)dout, (const ACT_T *)inp, mean, rstd,
                  N, C);
        ZT_CUDA_LAUNCHED(x->be);
    });
}
