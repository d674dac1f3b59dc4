/* Softmax cross-entropy fused with its backward on the GPU: one block per row finds the row's max
 * and log-sum-exp in fp32, writes the loss, and overwrites the logits with their gradient
 * grad_scale·(softmax - onehot) in the same pass, so the probabilities are never stored
 * (kernels/cpu/softmax_xent.c). */
#include "cuda_common.cuh"

/* The sum of exp(x - max) over the row of V logits at row, and its maximum in *mx, each the
 * block's (red: zt_block_reduce's scratch), returned to every thread. */
template <typename T>
__device__ __forceinline__ float row_sum_exp(const T *logits, size_t row, int V, float *red,
                                             float *mx) {
    float m = zt_ld(logits, row);
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        m = fmaxf(m, zt_ld(logits, row + v));
    m = zt_block_max(m, red);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        sum += expf(zt_ld(logits, row + v) - m);
    *mx = m;
    return zt_block_sum(sum, red);
}

template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
xent_kernel(float *losses, T *logits, const int32_t *targets, int V,
            float grad_scale) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * V;
    const int32_t y = targets[blockIdx.x];
    if (y < 0) {
        if (threadIdx.x == 0)
            losses[blockIdx.x] = 0.0f;
        if (grad_scale != 0.0f)
            for (int v = threadIdx.x; v < V; v += blockDim.x)
                zt_st(logits, row + v, 0.0f);
        return;
    }
    float mx;
    const float sum = row_sum_exp(logits, row, V, red, &mx);
    const float logz = mx + logf(sum);
    /* Every thread reads the target's logit before any thread overwrites it. */
    float xy = zt_ld(logits, row + y);
    if (threadIdx.x == 0)
        losses[blockIdx.x] = logz - xy;
    if (grad_scale == 0.0f)
        return;
    __syncthreads();
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float g = expf(zt_ld(logits, row + v) - logz) * grad_scale;
        zt_st(logits, row + v, v == y ? g - grad_scale : g);
    }
}

extern "C" void zt_cuda_softmax_xent(const zt_ctx *x, float *losses, void *logits,
                                     const int32_t *targets, int N, int V, float grad_scale) {
    if (N == 0)
        return;
    const int32_t *tgt = zt_cuda_upload_i32(x, ZT_CUDA_SCRATCH_TOKENS, targets, (size_t)N);
    if (!tgt)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(xent_kernel<ACT_T>, N, zt_cuda_row_threads(V), 0, zt_cuda_stream(x), losses,
                  (ACT_T *)logits, tgt, V, grad_scale);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

/* The vocabulary-parallel cross-entropy's halves (ops.h; kernels/cpu/softmax_xent.c): one block
 * per row of a shard's columns. The stats: the shard's maximum, sum of exp(x - max) and the
 * target's logit when the shard holds it (targets[n] >= 0 is a local column). */
template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
xent_stats_kernel(float *stats, const T *logits, const int32_t *targets, int V) {
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * V;
    const int32_t y = targets[blockIdx.x];
    float mx;
    const float sum = row_sum_exp(logits, row, V, red, &mx);
    if (threadIdx.x == 0) {
        stats[3 * (size_t)blockIdx.x] = mx;
        stats[3 * (size_t)blockIdx.x + 1] = sum;
        stats[3 * (size_t)blockIdx.x + 2] = y >= 0 ? zt_ld(logits, row + y) : 0.0f;
    }
}

/* The shard's gradient from the whole row's log-partition: grad_scale · (softmax - onehot);
 * zeros for a row without a target (ZT_XENT_IGNORED). */
template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
xent_grad_kernel(T *logits, const float *logz, const int32_t *targets, int V,
                 float grad_scale) {
    const size_t row = (size_t)blockIdx.x * V;
    const int32_t y = targets[blockIdx.x];
    const float lz = logz[blockIdx.x];
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float g = y == ZT_XENT_IGNORED ? 0.0f : expf(zt_ld(logits, row + v) - lz) * grad_scale;
        zt_st(logits, row + v, v == y ? g - grad_scale : g);
    }
}

extern "C" void zt_cuda_xent_partial_stats(const zt_ctx *x, float *stats, const void *logits,
                                           const int32_t *targets, int N, int V) {
    if (N == 0)
        return;
    const int32_t *tgt = zt_cuda_upload_i32(x, ZT_CUDA_SCRATCH_TOKENS, targets, (size_t)N);
    if (!tgt)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(xent_stats_kernel<ACT_T>, N, zt_cuda_row_threads(V), 0, zt_cuda_stream(x),
                  stats, (const ACT_T *)logits, tgt, V);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

extern "C" void zt_cuda_xent_partial_grad(const zt_ctx *x, void *logits, const float *logz,
                                          const int32_t *targets, int N, int V,
                                          float grad_scale) {
    if (N == 0)
        return;
    const int32_t *tgt = zt_cuda_upload_i32(x, ZT_CUDA_SCRATCH_TOKENS, targets, (size_t)N);
    if (!tgt)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(xent_grad_kernel<ACT_T>, N, zt_cuda_row_threads(V), 0, zt_cuda_stream(x),
                  (ACT_T *)logits, logz, tgt, V, grad_scale);
        ZT_CUDA_LAUNCHED(x->be);
    });
}

/* The shards' stats combined into each row's log-partition and loss (ops.h; the CPU's
 * zt_cpu_xent_partial_combine): a thread per row (grid-stride), the shards in order, the double sum's terms
 * each added with one fma and nothing else contracted, so the row's operations are the CPU's. */
__global__ void xent_combine_kernel(float *logz, float *losses, const float *stats,
                                    const int32_t *targets, int N, int shards) {
    const size_t part = 3 * (size_t)N;
    ZT_GRID_LOOP(n, (size_t)N) {
        const float *row = stats + 3 * n;
        float mx = row[0], target = 0.0f;
        for (int s = 1; s < shards; s++)
            mx = fmaxf(mx, row[(size_t)s * part]);
        double sum = 0.0;
        for (int s = 0; s < shards; s++) {
            const float *st = row + (size_t)s * part;
            sum = fma((double)st[1], exp((double)st[0] - (double)mx), sum);
            target = __fadd_rn(target, st[2]);
        }
        const float lz = __fadd_rn(mx, (float)log(sum));
        logz[n] = lz;
        losses[n] = targets[n] == ZT_XENT_IGNORED ? 0.0f : __fsub_rn(lz, target);
    }
}

extern "C" void zt_cuda_xent_partial_combine(const zt_ctx *x, float *logz, float *losses,
                                             const float *stats, const int32_t *targets, int N,
                                             int shards) {
    if (N == 0)
        return;
    const int32_t *tgt = zt_cuda_upload_i32(x, ZT_CUDA_SCRATCH_TOKENS, targets, (size_t)N);
    if (!tgt)
        return;
    ZT_LAUNCH_1D(x, (size_t)N, xent_combine_kernel, logz, losses, stats, tgt, N, shards);
}
