/* RMSNorm (Llama) on the GPU, shaped as layernorm.cu: a block per row for the forward (128-bit
 * loads); the backward one kernel over tiles of consecutive rows that computes each row's input
 * gradient and adds its xhat·dout into per-channel accumulators, then a second pass that adds
 * the tiles' partials in order into the weight gradient (channel_sums.cuh), so dout and the
 * input are read once and nothing is added atomically; rows too wide for the accumulators take
 * the two passes of the sums instead. fp32 statistics, the math of kernels/cpu/rmsnorm.c. The
 * weight is read through its 16-bit twin where the ctx has it (zt_param_view). */
#include "channel_sums.cuh"

/* Rows are walked in 16-byte chunks as in layernorm.cu. */
#define ROW_CHUNKS(T, c, C)                                                                        \
    for (int c = threadIdx.x * ZT_VEC(T); c < (C); c += blockDim.x * ZT_VEC(T))

template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
rms_fwd(T *out, float *rstd, const T *inp, zt_param_view w, float eps, int C) {
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

/* One row's input gradient, added into dx: dx += s·(w⊙d - xhat·mean(w⊙d⊙xhat)), the mean a
 * block sum in a fixed order. With each element's xhat and dout at hand it calls
 * terms(c, j, xhat, dout) for element j of the chunk at channel c: the fused kernel's
 * per-channel sums, nothing in rms_bwd_inp. */
template <typename T, typename Terms>
__device__ __forceinline__ void rms_bwd_row(T *dx, const T *dy, const T *x, zt_param_view w,
                                            float s, int C, float *red, Terms terms) {
    constexpr int W = ZT_VEC(T);
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
        for (int j = 0; j < W && c + j < C; j++) {
            g[j] += s * (w[c + j] * d[j] - v[j] * s * dot);
            terms(c, j, v[j] * s, d[j]);
        }
        zt_stv(dx, c, C, g);
    }
}

struct rms_no_terms {
    __device__ __forceinline__ void operator()(int, int, float, float) const {}
};

/* xhat·dout into the fused kernel's accumulators. */
template <typename T> struct rms_acc_terms {
    float *acc;
    int Q;
    __device__ __forceinline__ void operator()(int c, int j, float xhat, float d) const {
        constexpr int W = ZT_VEC(T);
        acc[zt_channel_acc_at(0, j, c / W, W, Q)] += xhat * d;
    }
};

/* The input gradient alone, a block per row (the two passes' route). */
template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
rms_bwd_inp(T *dinp, const T *dout, const T *inp, zt_param_view w,
            const float *rstd, int C) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * C;
    rms_bwd_row(dinp + row, dout + row, inp + row, w, rstd[blockIdx.x], C, red, rms_no_terms());
}

/* The fused backward: block t owns rows [t · tile_rows, (t + 1) · tile_rows) below N and walks
 * them in order, each with rms_bwd_row, adding xhat·dout of each of its channels into acc
 * (zt_channel_fused_smem's layout), which only the thread owning that chunk of the row touches;
 * then it writes its partial row, partial[t][C], for zt_channel_finish. */
template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
rms_bwd_fused(T *dinp, float *partial, const T *dout, const T *inp,
              zt_param_view w, const float *rstd, int N, int C, int tile_rows) {
    constexpr int W = ZT_VEC(T);
    __shared__ float red[32];
    ZT_DYN_SHARED(float, acc);
    const int Q = (C + W - 1) / W;
    ROW_CHUNKS(T, c, C) {
        for (int j = 0; j < W; j++)
            acc[zt_channel_acc_at(0, j, c / W, W, Q)] = 0.0f;
    }
    const rms_acc_terms<T> terms = {acc, Q};
    const int r0 = blockIdx.x * tile_rows;
    const int r1 = r0 + tile_rows < N ? r0 + tile_rows : N;
    for (int r = r0; r < r1; r++) {
        const size_t row = (size_t)r * C;
        rms_bwd_row(dinp + row, dout + row, inp + row, w, rstd[r], C, red, terms);
    }
    float *p = partial + (size_t)blockIdx.x * C;
    ROW_CHUNKS(T, c, C) {
        float sum[W] = {};
        for (int j = 0; j < W; j++)
            sum[j] = acc[zt_channel_acc_at(0, j, c / W, W, Q)];
        zt_stv_f32<W>(p, c, C, sum);
    }
}

/* The two passes' route, for rows whose accumulators do not fit: dw += Σ xhat·dout over the
 * rows (zt_channel_sums after rms_bwd_inp). */
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
        ZT_LAUNCH(rms_fwd<ACT_T>, N, zt_row_threads_vec<ACT_T>(C), 0, zt_cuda_stream(x),
                  (ACT_T *)out, rstd, (const ACT_T *)inp, zt_cuda_param(x, w, C), eps, C);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

/* One fused kernel over row tiles, then the tiles' partials added in order into dw. */
template <typename T>
static void rms_backward_fused(const zt_ctx *x, T *dinp, zt_grad_view dw, const T *dout,
                               const T *inp, const float *w, const float *rstd, int N, int C) {
    const int tile_rows = zt_channel_fused_tile_rows(N);
    const int tiles = (N + tile_rows - 1) / tile_rows;
    float *partial = zt_channel_fused_partials(x, 1, tiles, C);
    if (!partial)
        return;
    ZT_LAUNCH(rms_bwd_fused<T>, tiles, zt_row_threads_vec<T>(C), zt_channel_fused_smem<T>(1, C),
              zt_cuda_stream(x), dinp, partial, dout, inp, zt_cuda_param(x, w, C), rstd, N, C,
              tile_rows);
    ZT_CUDA_LAUNCHED(x->be);
    zt_channel_fused_finish<1>(x, dw, zt_grad_view{}, partial, tiles, C);
}

/* Rows too wide for rms_bwd_fused's accumulators: the input gradient a block per row, then the
 * weight gradient's own two passes, which read dout and the input again. */
template <typename T>
static void rms_backward_two_pass(const zt_ctx *x, T *dinp, zt_grad_view dw, const T *dout,
                                  const T *inp, const float *w, const float *rstd, int N, int C) {
    ZT_LAUNCH(rms_bwd_inp<T>, N, zt_row_threads_vec<T>(C), 0, zt_cuda_stream(x), dinp, dout, inp,
              zt_cuda_param(x, w, C), rstd, C);
    ZT_CUDA_LAUNCHED(x->be);
    rms_weight_term<T> term = {dout, inp, rstd, C};
    zt_channel_sums(x, dw, zt_grad_view{}, term, N, C);
}

extern "C" void zt_cuda_rmsnorm_backward(const zt_ctx *x, void *dinp, float *dw, const void *dout,
                                         const void *inp, const float *w, const float *rstd,
                                         int N, int C) {
    if (N <= 0 || C <= 0)
        return;
    ZT_ACT_DISPATCH(x->act, {
        const zt_grad_view gw = zt_cuda_grad(x, dw, C);
        if (zt_channel_fused_fits<ACT_T>(1, C))
            rms_backward_fused(x, (ACT_T *)dinp, gw, (const ACT_T *)dout, (const ACT_T *)inp, w,
                               rstd, N, C);
        else
            rms_backward_two_pass(x, (ACT_T *)dinp, gw, (const ACT_T *)dout,
                                  (const ACT_T *)inp, w, rstd, N, C);
    });
}
