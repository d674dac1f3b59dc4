/* LayerNorm on the GPU, eps 1e-5: one block per row for the forward and for the input gradient
 * (block sums in a fixed order, 128-bit loads), and the weight and bias gradients as per-channel sums over row
 * tiles with a second pass in a fixed order (channel_sums.cuh), so every sum is deterministic and
 * nothing is added atomically. Statistics are fp32; the math is kernels/cpu/layernorm.c's. The
 * weight and bias are read through their 16-bit twins where the ctx has them (zt_param_view). */
#include "channel_sums.cuh"

/* A row is walked in 16-byte chunks (cuda_common.cuh): a thread takes ZT_VEC(T) consecutive
 * elements per step, loaded whole when aligned (rows of C·sizeof(T) a multiple of 16) and one
 * by one otherwise; elements past C read as 0 and are left out of every sum. */
#define ROW_CHUNKS(T, c, C)                                                                        \
    for (int c = threadIdx.x * ZT_VEC(T); c < (C); c += blockDim.x * ZT_VEC(T))

template <typename T>
__global__ void ln_fwd(T *out, float *mean, float *rstd, const T *inp, zt_param_view w,
                       zt_param_view b, int C) {
    constexpr int W = ZT_VEC(T);
    __shared__ float red[32];
    const T *x = inp + (size_t)blockIdx.x * C;
    T *o = out + (size_t)blockIdx.x * C;
    float sum = 0.0f;
    ROW_CHUNKS(T, c, C) {
        float v[W] = {};
        zt_ldv(x, c, C, v);
        for (int j = 0; j < W; j++)
            sum += v[j];
    }
    float m = zt_block_sum(sum, red) / C;
    float var = 0.0f;
    ROW_CHUNKS(T, c, C) {
        float v[W] = {};
        zt_ldv(x, c, C, v);
        for (int j = 0; j < W && c + j < C; j++)
            var += (v[j] - m) * (v[j] - m);
    }
    float s = 1.0f / sqrtf(zt_block_sum(var, red) / C + 1e-5f);
    ROW_CHUNKS(T, c, C) {
        float v[W] = {};
        zt_ldv(x, c, C, v);
        for (int j = 0; j < W && c + j < C; j++) {
            v[j] = (v[j] - m) * s * w[c + j];
            if (b.present())
                v[j] += b[c + j];
        }
        zt_stv(o, c, C, v);
    }
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = s;
    }
}

template <typename T>
__global__ void ln_bwd_inp(T *dinp, const T *dout, const T *inp, zt_param_view w,
                           const float *mean, const float *rstd, int C) {
    constexpr int W = ZT_VEC(T);
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    const T *x = inp + row, *dy = dout + row;
    T *dx = dinp + row;
    const float m = mean[blockIdx.x], s = rstd[blockIdx.x];
    float a = 0.0f, b = 0.0f;
    ROW_CHUNKS(T, c, C) {
        float v[W] = {}, d[W] = {};
        zt_ldv(x, c, C, v);
        zt_ldv(dy, c, C, d);
        for (int j = 0; j < W && c + j < C; j++) {
            float dnorm = w[c + j] * d[j];
            a += dnorm;
            b += dnorm * (v[j] - m) * s;
        }
    }
    float dnorm_mean = zt_block_sum(a, red) / C;
    float dnorm_norm_mean = zt_block_sum(b, red) / C;
    ROW_CHUNKS(T, c, C) {
        float v[W] = {}, d[W] = {}, g[W] = {};
        zt_ldv(x, c, C, v);
        zt_ldv(dy, c, C, d);
        zt_ldv(dx, c, C, g);
        for (int j = 0; j < W && c + j < C; j++) {
            float norm = (v[j] - m) * s;
            g[j] += s * (w[c + j] * d[j] - dnorm_mean - norm * dnorm_norm_mean);
        }
        zt_stv(dx, c, C, g);
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
        ZT_LAUNCH(ln_fwd<ACT_T>, N, zt_row_threads_vec<ACT_T>(C), 0, zt_cuda_compute(x),
                  (ACT_T *)out, mean, rstd, (const ACT_T *)inp, zt_cuda_param(x, w, C),
                  zt_cuda_param(x, b, C), C);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

extern "C" void zt_cuda_layernorm_backward(const zt_ctx *x, void *dinp, float *dw, float *db,
                                           const void *dout, const void *inp, const float *w,
                                           const float *mean, const float *rstd, int N, int C) {
    if (N == 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(ln_bwd_inp<ACT_T>, N, zt_row_threads_vec<ACT_T>(C), 0, zt_cuda_compute(x),
                  (ACT_T *)dinp, (const ACT_T *)dout, (const ACT_T *)inp, zt_cuda_param(x, w, C),
                  mean, rstd, C);
        ZT_CUDA_LAUNCHED(x->be);
        ln_param_terms<ACT_T> terms = {(const ACT_T *)dout, (const ACT_T *)inp, mean, rstd, C};
        zt_channel_sums(x, zt_cuda_grad(x, dw, C), zt_cuda_grad(x, db, C), terms, N, C);
    });
}
