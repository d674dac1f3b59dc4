/* Host-side logic of the CUDA backend that needs no GPU: launch shapes, the bookkeeping of
 * released device ranges and the grouping of token positions for the embedding backward. It is
 * plain C, built into every build (CUDA or not), so that tests/unit/test_cuda_host.c checks it on
 * machines without a GPU. */
#ifndef ZTRAIN_CUDA_HOST_H
#define ZTRAIN_CUDA_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "ztrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- launch shapes (launch.c) ----------------------------------------------------------------- */

/* Threads per block of the elementwise kernels. */
enum { ZT_CUDA_BLOCK = 256, ZT_CUDA_MAX_BLOCK = 1024 };

typedef struct {
    unsigned grid, block;
} zt_cuda_launch;

/* An elementwise kernel over n elements whose threads loop with a grid-wide stride: blocks of
 * `block` threads, enough of them to give every element a thread but at most max_grid (the
 * kernels loop over the rest). n = 0 gives grid 0: nothing to launch. */
zt_cuda_launch zt_cuda_launch_1d(size_t n, unsigned block, unsigned max_grid);

/* Threads of a kernel that gives one block to each row of `width` elements and reduces across
 * the block: the width rounded up to whole warps, between one warp and ZT_CUDA_MAX_BLOCK. The
 * block reductions (cuda_common.cuh) need a multiple of 32. A kernel launched with it declares
 * __launch_bounds__(ZT_CUDA_MAX_BLOCK): 1,024 threads share a multiprocessor's 65,536
 * registers, and a kernel compiled to more than 64 a thread would fail to launch on the widest
 * rows (a vocabulary's logits) on a GPU, which the emulated device cannot see. */
unsigned zt_cuda_row_threads(size_t width);

/* Blocks of the two-pass sums (sum_squares, lamb_moments): a fixed count for a given n, so that
 * the order of additions, and the result, depends on n alone. */
enum { ZT_CUDA_SUM_BLOCKS = 1024 };
unsigned zt_cuda_sum_blocks(size_t n);

/* Flash attention's tiles (attention/flash_attention.cu): the shared memory, in bytes, of its
 * forward, dQ and dK/dV kernels for tiles of R query or key rows at head dimension hd (the fp32
 * tiles of R·hd, the R×R score or gradient tiles, the per-row values); and the rows of a tile,
 * the largest power of two up to 32 whose three kernels fit smem_limit (the device's opt-in
 * shared memory per block), 0 when not even one row fits. The dK/dV kernel is the largest: 32
 * rows fit up to head_dim 291 on an H100 or H200 (227 KiB), 206 on an A100 (163 KiB). */
size_t zt_cuda_flash_fwd_smem(int R, int hd);
size_t zt_cuda_flash_dq_smem(int R, int hd);
size_t zt_cuda_flash_kv_smem(int R, int hd);
int zt_cuda_flash_tile(int hd, size_t smem_limit);

/* ---- released device ranges (released.c) ------------------------------------------------------
 * The CUDA backend keeps released ranges of device memory here, so that
 * zt_backend_resident_bytes reports what a rank has given back and a granule is given back once
 * all of it is released (memory/device_vmm.c). A set of disjoint half-open address intervals,
 * kept sorted. */

typedef struct {
    uintptr_t *lo, *hi;
    size_t n, cap;
} zt_cuda_ranges;

/* Adds [lo, hi) (merging with what it touches); ZT_ERR_NOMEM when the set cannot grow. */
zt_status zt_cuda_ranges_add(zt_cuda_ranges *r, uintptr_t lo, uintptr_t hi);
/* Removes [lo, hi), splitting an interval that contains it. */
zt_status zt_cuda_ranges_remove(zt_cuda_ranges *r, uintptr_t lo, uintptr_t hi);
/* Bytes of [lo, hi) inside the set. */
size_t zt_cuda_ranges_overlap(const zt_cuda_ranges *r, uintptr_t lo, uintptr_t hi);
void zt_cuda_ranges_free(zt_cuda_ranges *r);

/* ---- token buckets (token_buckets.c) -----------------------------------------------------------
 * The embedding backward adds the gradient of every position into the row of its token. To do it
 * without atomics, and so deterministically, positions are grouped by token on the host (the
 * tokens are host memory, ops.h): one GPU block per distinct token then sums its positions in
 * order. */

/* For tokens[0, n): uniq[0, k) receives the k distinct tokens in increasing order, and
 * pos[start[i], start[i+1]) the positions holding uniq[i], increasing; start has k + 1 entries.
 * work[n] is scratch. Returns k. uniq and start need room for n + 1 entries, pos for n. */
int zt_cuda_token_buckets(const int32_t *tokens, int n, int32_t *uniq, int32_t *start,
                          int32_t *pos, uint64_t *work);

#ifdef __cplusplus
}
#endif

#endif
