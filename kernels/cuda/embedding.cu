/* Token (and learned position) embeddings on the GPU. The backward adds each position's gradient
 * into its token's row without atomics: the host groups positions by token (token_buckets.c),
 * then one block per distinct token sums its positions in position order, so the result is the
 * same on every run. The position gradient sums over the batch per (t, channel).
 *
 * Every kernel walks its rows in chunks of ZT_VEC(T) channels (8 at bf16/fp16, 4 at fp32) with
 * 16-byte loads and stores (cuda_common.cuh's zt_ldv/zt_stv), the fp32 weight rows in 16-byte
 * pieces too (zt_ldv_f32/zt_stv_f32); a chunk past the end of a row (C not a multiple of the
 * vector) or a row that does not start 16-byte aligned (an odd C) goes element by element. Each
 * element's sum runs in the same order as one thread per element would run it. The forward reads
 * the tables through their 16-bit twins where the ctx has them (zt_param_view); the backward adds
 * into the 16-bit gradients where the ctx has them (zt_grad_view). The op is not told the
 * vocabulary, so a twin or a 16-bit gradient must cover the rows the tokens select, up to the
 * largest, read from the host's tokens: one that covers fewer leaves the table to its fp32
 * values, never read or written past its end. */
#include "cuda_common.cuh"

/* The elements of a table of rows of C that the tokens use: rows [0, largest token + 1), one row
 * at least (no token selects a row of this shard: the rows' count does not matter then). */
static size_t used_rows_elems(const int32_t *tokens, size_t n, int C) {
    int32_t most = 0;
    for (size_t i = 0; i < n; i++)
        most = tokens[i] > most ? tokens[i] : most;
    return ((size_t)most + 1) * (size_t)C;
}

/* Thread i: channels [c0, c0 + ZT_VEC(T)) of position bt. */
template <typename T>
__global__ void emb_fwd(T *out, const int32_t *tokens, zt_param_view wte, zt_param_view wpe,
                        int T_, int C, size_t chunks) {
    const int per_row = (C + ZT_VEC(T) - 1) / ZT_VEC(T);
    ZT_GRID_LOOP(i, chunks) {
        size_t bt = i / per_row;
        int c0 = (int)(i % per_row) * ZT_VEC(T);
        float v[ZT_VEC(T)] = {}, p[ZT_VEC(T)] = {};
        /* A negative token has no row in this vocabulary-parallel shard (ops.h). */
        if (tokens[bt] >= 0)
            wte.at((size_t)tokens[bt] * C).load<ZT_VEC(T)>(c0, C, v);
        if (wpe.present()) {
            wpe.at((bt % T_) * C).load<ZT_VEC(T)>(c0, C, p);
            for (int k = 0; k < ZT_VEC(T); k++)
                v[k] += p[k];
        }
        zt_stv(out + bt * C, c0, C, v);
    }
}

/* Block i: token uniq[i], whose positions are pos[start[i], start[i+1]). */
template <typename T>
__global__ void __launch_bounds__(ZT_CUDA_MAX_BLOCK)
emb_bwd_wte(zt_grad_view dwte, const T *dout, const int32_t *uniq,
            const int32_t *start, const int32_t *pos, int C) {
    const int b = blockIdx.x;
    if (uniq[b] < 0)
        return;
    const zt_grad_view row = dwte.at((size_t)uniq[b] * C);
    for (int c0 = threadIdx.x * ZT_VEC(T); c0 < C; c0 += blockDim.x * ZT_VEC(T)) {
        float acc[ZT_VEC(T)] = {}, d[ZT_VEC(T)] = {};
        for (int k = start[b]; k < start[b + 1]; k++) {
            zt_ldv(dout + (size_t)pos[k] * C, c0, C, d);
            for (int j = 0; j < ZT_VEC(T); j++)
                acc[j] += d[j];
        }
        row.add_vec<ZT_VEC(T)>(c0, C, acc);
    }
}

/* Thread i: channels [c0, c0 + ZT_VEC(T)) of position t, summed over the batch. */
template <typename T>
__global__ void emb_bwd_wpe(zt_grad_view dwpe, const T *dout, int B, int T_, int C,
                            size_t chunks) {
    const int per_row = (C + ZT_VEC(T) - 1) / ZT_VEC(T);
    ZT_GRID_LOOP(i, chunks) {
        size_t t = i / per_row;
        int c0 = (int)(i % per_row) * ZT_VEC(T);
        float acc[ZT_VEC(T)] = {}, d[ZT_VEC(T)] = {};
        for (int b = 0; b < B; b++) {
            zt_ldv(dout + ((size_t)b * T_ + t) * C, c0, C, d);
            for (int j = 0; j < ZT_VEC(T); j++)
                acc[j] += d[j];
        }
        dwpe.at(t * C).add_vec<ZT_VEC(T)>(c0, C, acc);
    }
}

extern "C" void zt_cuda_embedding_forward(const zt_ctx *x, void *out, const int32_t *tokens,
                                          const float *wte, const float *wpe, int B, int T,
                                          int C) {
    const int32_t *tok = zt_cuda_upload_i32(x, ZT_CUDA_SCRATCH_TOKENS, tokens, (size_t)B * T);
    if (!tok)
        return;
    ZT_ACT_DISPATCH(x->act, {
        size_t chunks = (size_t)B * T * ((C + ZT_VEC(ACT_T) - 1) / ZT_VEC(ACT_T));
        ZT_LAUNCH_1D(x, chunks, emb_fwd<ACT_T>, (ACT_T *)out, tok,
                     zt_cuda_param(x, wte, used_rows_elems(tokens, (size_t)B * T, C)),
                     zt_cuda_param(x, wpe, (size_t)T * C), T, C, chunks);
    });
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
        ZT_LAUNCH(emb_bwd_wte<ACT_T>, k, zt_row_threads_vec<ACT_T>(C), 0, zt_cuda_stream(x),
                  zt_cuda_grad(x, dwte, used_rows_elems(tokens, (size_t)n, C)),
                  (const ACT_T *)dout, d, d + n + 1,
                  d + 2 * (size_t)n + 2, C);
        ZT_CUDA_LAUNCHED(x->be);
        if (dwpe) {
            size_t chunks = (size_t)T * ((C + ZT_VEC(ACT_T) - 1) / ZT_VEC(ACT_T));
            ZT_LAUNCH_1D(x, chunks, emb_bwd_wpe<ACT_T>, zt_cuda_grad(x, dwpe, (size_t)T * C),
                         (const ACT_T *)dout, B, T, C, chunks);
        }
    });
}
