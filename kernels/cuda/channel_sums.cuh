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
 * K · ZT_CHANNEL_MAX_TILES · C (6 MB for K = 2 at C = 768).
 *
 * The norms' backward kernels (layernorm.cu, rmsnorm.cu) take the sums' first pass into their
 * own rows instead, so that dout and the input are read once: a block owns a tile of
 * zt_channel_fused_tile_rows(N) consecutive rows, adds each row's terms into per-channel
 * accumulators in shared memory while it computes that row's input gradient, and writes its
 * partial row here for zt_channel_finish. Its tiles are the same in number as above at most
 * (ZT_CHANNEL_MAX_TILES), but of ZT_CHANNEL_FUSED_MIN_ROWS rows at least, so the bound holds;
 * where the accumulators would take more than ZT_CHANNEL_FUSED_SMEM bytes (very wide rows), the
 * norms take the two passes above. */
#ifndef ZTRAIN_CUDA_CHANNEL_SUMS_CUH
#define ZTRAIN_CUDA_CHANNEL_SUMS_CUH

#include "cuda_common.cuh"

enum {
    ZT_CHANNEL_COLS = 32,       /* channels per block: one warp's width */
    ZT_CHANNEL_LANES = 8,       /* warps per block, each reading every 8th row of the tile */
    ZT_CHANNEL_MIN_ROWS = 64,   /* rows per tile at least: 8 rows per warp amortise the pass */
    ZT_CHANNEL_MAX_TILES = 1024 /* tiles at most, bounding the scratch and the second pass */
};
/* Rows per tile of the norms' fused backward at least. A tile's K partial rows are written and
 * read back once (8 · K bytes a channel) while each of its R rows moves 8 bytes a channel at
 * bf16 (dout and the input read, the input gradient read and written), so the partials add K / R
 * to the kernel's traffic: with tiles of one row, which 1024 tiles gave up to 1024 rows, K times
 * the rows' own, and 12.5% for LayerNorm at 16K rows (GPT-2 at B = 16, T = 1024: 16 rows a
 * tile). At 32 rows at least it is 3% (RMSNorm) or 6% (LayerNorm) at most, and 16K rows still
 * make 512 blocks, several per SM; a batch under 32 · 132 rows leaves some of an H100's SMs
 * idle, but its kernel takes a few microseconds, about its launch. */
enum { ZT_CHANNEL_FUSED_MIN_ROWS = 32 };
static_assert(ZT_CHANNEL_MAX_TILES == ZT_CUDA_CHANNEL_TILES &&
                  ZT_CHANNEL_MIN_ROWS == ZT_CUDA_CHANNEL_MIN_ROWS &&
                  ZT_CHANNEL_FUSED_MIN_ROWS == ZT_CUDA_CHANNEL_FUSED_MIN_ROWS,
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
              zt_cuda_stream(x), partial, term, N, C, tile_rows);
    ZT_CUDA_LAUNCHED(x->be);
    ZT_LAUNCH(zt_channel_finish<K>, (C + ZT_CUDA_BLOCK - 1) / ZT_CUDA_BLOCK, ZT_CUDA_BLOCK, 0,
              zt_cuda_stream(x), out0, out1, partial, tiles, C);
    ZT_CUDA_LAUNCHED(x->be);
}

/* ---- the fused first pass of the norms' backward ------------------------------------------- */

enum {
    /* Shared memory a fused kernel's accumulators may take at most; wider rows take the two
     * passes. 32 KiB keeps several blocks on an SM and covers LayerNorm's 2 · C up to C = 4096
     * and RMSNorm's C up to 8192. */
    ZT_CHANNEL_FUSED_SMEM = 32 << 10
};

/* Rows per tile of a fused kernel for N rows: ceil(N / ZT_CHANNEL_MAX_TILES), but at least
 * ZT_CHANNEL_FUSED_MIN_ROWS (above). A function of N alone, as the order of every addition is,
 * so the sums are bit-identical from run to run. */
static inline int zt_channel_fused_tile_rows(int N) {
    int rows = (N + ZT_CHANNEL_MAX_TILES - 1) / ZT_CHANNEL_MAX_TILES;
    return rows < ZT_CHANNEL_FUSED_MIN_ROWS ? ZT_CHANNEL_FUSED_MIN_ROWS : rows;
}

/* The shared memory of a fused kernel's K sums over rows of C elements of T walked in 16-byte
 * chunks: K · ZT_VEC(T) · Q floats for Q = ceil(C / ZT_VEC(T)) chunks, laid out [K][ZT_VEC(T)][Q]
 * (zt_channel_acc_at) so that the 32 lanes of a warp, each at its own chunk, touch 32
 * consecutive floats. */
template <typename T> static inline size_t zt_channel_fused_smem(int K, int C) {
    const size_t chunks = (size_t)(C + ZT_VEC(T) - 1) / ZT_VEC(T);
    return (size_t)K * ZT_VEC(T) * chunks * sizeof(float);
}

/* Whether a fused kernel's accumulators for K sums over C channels fit its budget. */
template <typename T> static inline bool zt_channel_fused_fits(int K, int C) {
    return zt_channel_fused_smem<T>(K, C) <= ZT_CHANNEL_FUSED_SMEM;
}

/* Element j of chunk q (the chunk at channel q · W) of sum k in the accumulators of
 * zt_channel_fused_smem, for chunks of W elements and Q chunks a row. */
__device__ __forceinline__ size_t zt_channel_acc_at(int k, int j, int q, int W, int Q) {
    return ((size_t)k * W + j) * Q + q;
}

/* The partials of a fused kernel: K rows of tiles · C floats in the ZT_CUDA_SCRATCH_PARTIALS
 * scratch (NULL after recording the failure). */
static inline float *zt_channel_fused_partials(const zt_ctx *x, int K, int tiles, int C) {
    return (float *)zt_cuda_scratch(x, ZT_CUDA_SCRATCH_PARTIALS,
                                    (size_t)K * tiles * C * sizeof(float));
}

/* The second pass after a fused kernel wrote its partials: zt_channel_finish<K>, on the compute
 * stream of x. */
template <int K>
static void zt_channel_fused_finish(const zt_ctx *x, zt_grad_view out0, zt_grad_view out1,
                                    const float *partial, int tiles, int C) {
    ZT_LAUNCH(zt_channel_finish<K>, (C + ZT_CUDA_BLOCK - 1) / ZT_CUDA_BLOCK, ZT_CUDA_BLOCK, 0,
              zt_cuda_stream(x), out0, out1, partial, tiles, C);
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
