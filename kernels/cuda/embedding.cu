/* Token (and learned position) embeddings on the GPU. The backward adds each position's gradient
 * into its token's row without atomics: the host groups positions by token (token_buckets.c),
 * then one block per distinct token sums its positions in position order, so the result is the
 * same on every run. The position gradient is a thread per (t, channel) summing over the batch. */
#include "cuda_common.cuh"

template <typename T>
__global__ void emb_fwd(T *out, const int32_t *tokens, const float *wte, const float *wpe, int T_,
                        int C, size_t n) {
    ZT_GRID_LOOP(i, n) {
        size_t bt = i / C;
        int c = (int)(i % C);
        /* A negative token has no row in this vocabulary-parallel shard (ops.h). */
        float v = tokens[bt] >= 0 ? wte[(size_t)tokens[bt] * C + c] : 0.0f;
        if (wpe)
            v += wpe[(bt % T_) * C + c];
        zt_st(out, i, v);
    }
}

/* Block i: token uniq[i], whose positions are pos[start[i], start[i+1]). */
template <typename T>
__global__ void emb_bwd_wte(float *dwte, const T *dout, const int32_t *uniq,
                            const int32_t *start, const int32_t *pos, int C) {
    const int b = blockIdx.x;
    if (uniq[b] < 0)
        return;
    float *row = dwte + (size_t)uniq[b] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int k = start[b]; k < start[b + 1]; k++)
            acc += zt_ld(dout, (size_t)pos[k] * C + c);
        row[c] += acc;
    }
}

template <typename T>
__global__ void emb_bwd_wpe(float *dwpe, const T *dout, int B, int T_, int C) {
    ZT_GRID_LOOP(i, (size_t)T_ * C) {
        float acc = 0.0f;
        for (int b = 0; b < B; b++)
            acc += zt_ld(dout, (size_t)b * T_ * C + i);
        dwpe[i] += acc;
    }
}

extern "C" void zt_cuda_embedding_forward(const zt_ctx *x, void *out, const int32_t *tokens,
                                          const float *wte, const float *wpe, int B, int T,
                                          int C) {
    size_t n = (size_t)B * T * C;
    const int32_t *tok = zt_cuda_upload_i32(x, ZT_CUDA_SCRATCH_TOKENS, tokens, (size_t)B * T);
    if (!tok)
        return;
    ZT_ACT_DISPATCH(x->act,
                    ZT_LAUNCH_1D(x, n, emb_fwd<ACT_T>, (ACT_T *)out, tok, wte, wpe, T, C, n));
}

extern "C" void zt_cuda_embedding_backward(const zt_ctx *x, float *dwte, float *dwpe,
                                           const void *dout, const int32_t *tokens, int B, int T,
                                           int C) {
    const int n = B * T;
    if (n == 0)
        return;
    /* Host layout: uniq[n + 1] | start[n + 1] | pos[n], then the sort's work[n]. */
    size_t ints = 3 * (size_t)n + 2;
    char *host = (char *)zt_cuda_bucket_host(x, ints * sizeof(int32_t) + n * sizeof(uint64_t));
    if (!host)
        return;
    int32_t *uniq = (int32_t *)host, *start = uniq + n + 1, *pos = start + n + 1;
    uint64_t *work = (uint64_t *)(host + ints * sizeof(int32_t));
    int k = zt_cuda_token_buckets(tokens, n, uniq, start, pos, work);
    const int32_t *d = zt_cuda_upload_i32(x, ZT_CUDA_SCRATCH_BUCKETS, uniq, ints);
    if (!d)
        return;
    ZT_ACT_DISPATCH(x->act, {
        ZT_LAUNCH(emb_bwd_wte<ACT_T>, k, zt_cuda_row_threads(C), 0, zt_cuda_compute(x), dwte,
                  (const ACT_T *)dout, d, d + n + 1, d + 2 * (size_t)n + 2, C);
        ZT_CUDA_LAUNCHED(x->be);
        if (dwpe)
            ZT_LAUNCH_1D(x, (size_t)T * C, emb_bwd_wpe<ACT_T>, dwpe, (const ACT_T *)dout, B, T, C);
    });
}
