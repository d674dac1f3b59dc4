/* LayerNorm on the GPU, eps 1e-5: one block per row for the forward (block sums in a fixed
 * order, 128-bit loads). The backward is one kernel over tiles of consecutive rows that computes
 * each row's input gradient and, with that row's dout and input at hand, adds its terms of the
 * weight and bias gradients into per-channel accumulators; a second pass adds the tiles'
 * partials in tile order (channel_sums.cuh), so every sum is deterministic, nothing is added
 * atomically, and dout and the input are read once. Rows too wide for the accumulators take the
 * input gradient a block per row and the parameter gradients in two passes of their own.
 * Statistics are fp32; the math is kernels/cpu/layernorm.c's. The weight and bias are read
 * through their 16-bit twins where the ctx has them (zt_param_view). */
#include "channel_sums.cuh"

/* A row is walked in 16-byte chunks (cuda_common.cuh): a thread takes ZT_VEC(T) consecutive
 * elements per step, loaded whole when aligned (rows of C·sizeof(T) a multiple of 16) and one
 * by one otherwise; elements past C read as 0 and are left out of every sum. */
#define ROW_CHUNKS(T, c, C)                                                                        \
    for (int c = threadIdx.x * ZT_VEC(T); c < (C); c += blockDim.x * ZT_VEC(T))

template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
ln_fwd(T *out, float *mean, float *rstd, const T *inp, zt_param_view w,
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

/* One row's input gradient, added into dx: dx += s·(w⊙d - mean(w⊙d) - xhat·mean(w⊙d⊙xhat)),
 * with both means block sums in a fixed order. With each element's xhat and dout at hand it
 * calls terms(c, j, xhat, dout) for element j of the chunk at channel c: the fused kernel's
 * per-channel sums, nothing in ln_bwd_inp. */
template <typename T, typename Terms>
__device__ __forceinline__ void ln_bwd_row(T *dx, const T *dy, const T *x, zt_param_view w,
                                           float m, float s, int C, float *red, Terms terms) {
    constexpr int W = ZT_VEC(T);
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
            terms(c, j, norm, d[j]);
        }
        zt_stv(dx, c, C, g);
    }
}

struct ln_no_terms {
    __device__ __forceinline__ void operator()(int, int, float, float) const {}
};

/* xhat·dout into sum 0 and dout into sum 1 of the fused kernel's accumulators. */
template <typename T> struct ln_acc_terms {
    float *acc;
    int Q;
    __device__ __forceinline__ void operator()(int c, int j, float xhat, float d) const {
        constexpr int W = ZT_VEC(T);
        acc[zt_channel_acc_at(0, j, c / W, W, Q)] += xhat * d;
        acc[zt_channel_acc_at(1, j, c / W, W, Q)] += d;
    }
};

/* The input gradient alone, a block per row (the two passes' route). */
template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
ln_bwd_inp(T *dinp, const T *dout, const T *inp, zt_param_view w,
           const float *mean, const float *rstd, int C) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    ln_bwd_row(dinp + row, dout + row, inp + row, w, mean[blockIdx.x], rstd[blockIdx.x], C, red,
               ln_no_terms());
}

/* The fused backward: block t owns rows [t · tile_rows, (t + 1) · tile_rows) below N and walks
 * them in order, each with ln_bwd_row, adding xhat·dout and dout of each of its channels into
 * acc (zt_channel_fused_smem's layout: sum 0 the weight's, sum 1 the bias's), which only the
 * thread owning that chunk of the row touches; then it writes its partial row of both sums,
 * partial[k][t][C], for zt_channel_finish. */
template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
ln_bwd_fused(T *dinp, float *partial, const T *dout, const T *inp, zt_param_view w,
             const float *mean, const float *rstd, int N, int C, int tile_rows) {
    constexpr int W = ZT_VEC(T);
    __shared__ float red[32];
    ZT_DYN_SHARED(float, acc);
    const int Q = (C + W - 1) / W;
    ROW_CHUNKS(T, c, C) {
        for (int j = 0; j < W; j++) {
            acc[zt_channel_acc_at(0, j, c / W, W, Q)] = 0.0f;
            acc[zt_channel_acc_at(1, j, c / W, W, Q)] = 0.0f;
        }
    }
    const ln_acc_terms<T> terms = {acc, Q};
    const int r0 = blockIdx.x * tile_rows;
    const int r1 = r0 + tile_rows < N ? r0 + tile_rows : N;
    for (int r = r0; r < r1; r++) {
        const size_t row = (size_t)r * C;
        ln_bwd_row(dinp + row, dout + row, inp + row, w, mean[r], rstd[r], C, red, terms);
    }
    float *p0 = partial + (size_t)blockIdx.x * C;
    float *p1 = partial + ((size_t)gridDim.x + blockIdx.x) * C;
    ROW_CHUNKS(T, c, C) {
        float s0[W] = {}, s1[W] = {};
        for (int j = 0; j < W; j++) {
            s0[j] = acc[zt_channel_acc_at(0, j, c / W, W, Q)];
            s1[j] = acc[zt_channel_acc_at(1, j, c / W, W, Q)];
        }
        zt_stv_f32<W>(p0, c, C, s0);
        zt_stv_f32<W>(p1, c, C, s1);
    }
}

/* The two passes' route, for rows whose accumulators do not fit: dw += Σ xhat·dout,
 * db += Σ dout over the rows (zt_channel_sums after ln_bwd_inp). */
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
        ZT_LAUNCH(ln_fwd<ACT_T>, N, zt_row_threads_vec<ACT_T>(C), 0, zt_cuda_stream(x),
                  (ACT_T *)out, mean, rstd, (const ACT_T *)inp, zt_cuda_param(x, w, C),
                  zt_cuda_param(x, b, C), C);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

/* One fused kernel over row tiles, then the tiles' partials added in order into dw and db. */
template <typename T>
static void ln_backward_fused(const zt_ctx *x, T *dinp, zt_grad_view dw, zt_grad_view db,
                              const T *dout, const T *inp, const float *w, const float *mean,
                              const float *rstd, int N, int C) {
    const int tile_rows = zt_channel_fused_tile_rows(N);
    const int tiles = (N + tile_rows - 1) / tile_rows;
    float *partial = zt_channel_fused_partials(x, 2, tiles, C);
    if (!partial)
        return;
    ZT_LAUNCH(ln_bwd_fused<T>, tiles, zt_row_threads_vec<T>(C), zt_channel_fused_smem<T>(2, C),
              zt_cuda_stream(x), dinp, partial, dout, inp, zt_cuda_param(x, w, C), mean, rstd, N,
              C, tile_rows);
    ZT_CUDA_LAUNCHED(x->be);
    zt_channel_fused_finish<2>(x, dw, db, partial, tiles, C);
}

/* Rows too wide for ln_bwd_fused's accumulators: the input gradient a block per row, then the
 * parameter gradients' own two passes, which read dout and the input again. */
template <typename T>
static void ln_backward_two_pass(const zt_ctx *x, T *dinp, zt_grad_view dw, zt_grad_view db,
                                 const T *dout, const T *inp, const float *w, const float *mean,
                                 const float *rstd, int N, int C) {
    ZT_LAUNCH(ln_bwd_inp<T>, N, zt_row_threads_vec<T>(C), 0, zt_cuda_stream(x), dinp, dout, inp,
              zt_cuda_param(x, w, C), mean, rstd, C);
    ZT_CUDA_LAUNCHED(x->be);
    ln_param_terms<T> terms = {dout, inp, mean, rstd, C};
    zt_channel_sums(x, dw, db, terms, N, C);
}

extern "C" void zt_cuda_layernorm_backward(const zt_ctx *x, void *dinp, float *dw, float *db,
                                           const void *dout, const void *inp, const float *w,
                                           const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        const zt_grad_view gw = zt_cuda_grad(x, dw, C), gb = zt_cuda_grad(x, db, C);
        if (zt_channel_fused_fits<ACT_T>(2, C))
            ln_backward_fused(x, (ACT_T *)dinp, gw, gb, (const ACT_T *)dout, (const ACT_T *)inp,
                              w, mean, rstd, N, C);
        else
            ln_backward_two_pass(x, (ACT_T *)dinp, gw, gb, (const ACT_T *)dout,
                                 (const ACT_T *)inp, w, mean, rstd, N, C);
    });
}
