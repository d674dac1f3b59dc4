/* Per-channel sums over the rows of a [N, C] activation: the bias gradient (Σ dout), LayerNorm's
 * weight and bias gradients (Σ xhat·dout, Σ dout) and RMSNorm's weight gradient (Σ xhat·dout).
 *
 * A thread per channel looping over all N rows keeps only C / 256 blocks busy (3 of a GPU's 132
 * SMs at GPT-2's C = 768, and a row of B·T = 16K reads per thread), so the rows are cut into
 * tiles instead: a block owns 32 channels × one tile of rows, its 8 warps each read every 8th row
 * of the tile (a warp reads 32 consecutive channels of a row, one coalesced transaction), and the
 * 8 lanes' sums are added in a fixed order into one partial per (tile, channel). A second kernel,
 * a thread per channel, adds the tiles' partials in tile order and accumulates into the fp32
 * gradient (or its 16-bit buffer, zt_grad_view). The tiling depends only on N, so the result is bit-identical from run to run, with
 * no atomics; it differs from a sequential sum by rounding only (compare with a tolerance).
 *
 * The partials live in the ZT_CUDA_SCRATCH_PARTIALS scratch: K · tiles · C floats, at most
 * K · ZT_CHANNEL_MAX_TILES · C (6 MB for K = 2 at C = 768). */
#ifndef ZTRAIN_CUDA_CHANNEL_SUMS_CUH
#define ZTRAIN_CUDA_CHANNEL_SUMS_CUH

#include "cuda_common.cuh"

enum {
    ZT_CHANNEL_COLS = 32,       /* channels per block: one warp's width */
    ZT_CHANNEL_LANES = 8,       /* warps per block, each reading every 8th row of the tile */
    ZT_CHANNEL_MIN_ROWS = 64,   /* rows per tile at least: 8 rows per warp amortise the pass */
    ZT_CHANNEL_MAX_TILES = 1024 /* tiles at most, bounding the scratch and the second pass */
};
static_assert(ZT_CHANNEL_MAX_TILES == ZT_CUDA_CHANNEL_TILES &&
                  ZT_CHANNEL_MIN_ROWS == ZT_CUDA_CHANNEL_MIN_ROWS,
              "backend.h states the tiles");

/* Rows per tile for N rows, a function of N alone (so is the order of every addition). */
static inline int zt_channel_tile_rows(int N) {
    int rows = (N + ZT_CHANNEL_MAX_TILES - 1) / ZT_CHANNEL_MAX_TILES;
    return rows < ZT_CHANNEL_MIN_ROWS ? ZT_CHANNEL_MIN_ROWS : rows;
}

/* First pass. Term is a functor passed by value: term(r, c, acc) adds the Term::K terms of row
 * r, channel c to acc[K]. */
template <typename Term>
__global__ void zt_channel_partials(float *partial, Term term, int N, int C, int tile_rows) {
    constexpr int K = Term::K;
    __shared__ float lanes[K][ZT_CHANNEL_LANES][ZT_CHANNEL_COLS];
    const int tx = threadIdx.x % ZT_CHANNEL_COLS, ty = threadIdx.x / ZT_CHANNEL_COLS;
    const int c = blockIdx.x * ZT_CHANNEL_COLS + tx;
    const int r0 = blockIdx.y * tile_rows;
    const int r1 = r0 + tile_rows < N ? r0 + tile_rows : N;
    float acc[K];
    for (int k = 0; k < K; k++)
        acc[k] = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += ZT_CHANNEL_LANES)
            term(r, c, acc);
    for (int k = 0; k < K; k++)
        lanes[k][ty][tx] = acc[k];
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 0; k < K; k++) {
            float s = lanes[k][0][tx];
            for (int l = 1; l < ZT_CHANNEL_LANES; l++)
                s += lanes[k][l][tx];
            partial[((size_t)k * gridDim.y + blockIdx.y) * C + c] = s;
        }
    }
}

/* Second pass: out_k[c] += Σ over tiles of partial k, in tile order, into the fp32 or the 16-bit
 * gradient (zt_grad_view); out1 is absent when K = 1 (or when the caller does not want the
 * second sum). */
template <int K>
__global__ void zt_channel_finish(zt_grad_view out0, zt_grad_view out1, const float *partial,
                                  int tiles, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int k = 0; k < K; k++) {
        const zt_grad_view &out = k == 0 ? out0 : out1;
        if (!out.present())
            continue;
        float s = 0.0f;
        for (int t = 0; t < tiles; t++)
            s += partial[((size_t)k * tiles + t) * C + c];
        out.add(c, s);
    }
}

/* Accumulates the Term::K per-channel sums of term over N rows into out0[C] (and out1[C] when
 * K = 2 and out1 is present), on the compute stream of x. */
template <typename Term>
static void zt_channel_sums(const zt_ctx *x, zt_grad_view out0, zt_grad_view out1, Term term,
                            int N, int C) {
    if (N <= 0 || C <= 0)
        return;
    constexpr int K = Term::K;
    const int tile_rows = zt_channel_tile_rows(N);
    const int tiles = (N + tile_rows - 1) / tile_rows;
    float *partial = (float *)zt_cuda_scratch(x, ZT_CUDA_SCRATCH_PARTIALS,
                                              (size_t)K * tiles * C * sizeof(float));
    if (!partial)
        return;
    const dim3 grid((C + ZT_CHANNEL_COLS - 1) / ZT_CHANNEL_COLS, tiles);
    ZT_LAUNCH(zt_channel_partials<Term>, grid, ZT_CHANNEL_COLS * ZT_CHANNEL_LANES, 0,
              zt_cuda_compute(x), partial, term, N, C, tile_rows);
    ZT_CUDA_LAUNCHED(x->be);
    ZT_LAUNCH(zt_channel_finish<K>, (C + ZT_CUDA_BLOCK - 1) / ZT_CUDA_BLOCK, ZT_CUDA_BLOCK, 0,
              zt_cuda_compute(x), out0, out1, partial, tiles, C);
    ZT_CUDA_LAUNCHED(x->be);
}

/* The bias gradient's term: Σ dout[r, c]. */
template <typename T> struct zt_bias_term {
    static constexpr int K = 1;
    const T *dout;
    int C;
    __device__ void operator()(int r, int c, float *acc) const {
        acc[0] += zt_ld(dout, (size_t)r * C + c);
    }
};

#endif
