/* Launch shapes of the CUDA kernels, computed on the host (cuda_host.h). Plain C, so the unit
 * tests check them on machines without a GPU. */
#include <stdbool.h>

#include "cuda_host.h"

zt_cuda_launch zt_cuda_launch_1d(size_t n, unsigned block, unsigned max_grid) {
    ZT_ASSERT(block > 0 && block <= ZT_CUDA_MAX_BLOCK && max_grid > 0);
    size_t blocks = (n + block - 1) / block;
    return (zt_cuda_launch){blocks < max_grid ? (unsigned)blocks : max_grid, block};
}

unsigned zt_cuda_row_threads(size_t width) {
    size_t warps = (width + 31) / 32;
    if (warps < 1)
        warps = 1;
    if (warps > ZT_CUDA_MAX_BLOCK / 32)
        warps = ZT_CUDA_MAX_BLOCK / 32;
    return (unsigned)warps * 32;
}

unsigned zt_cuda_sum_blocks(size_t n) {
    /* A block's threads each take at least one element; a short slice needs few blocks. */
    size_t blocks = (n + ZT_CUDA_BLOCK - 1) / ZT_CUDA_BLOCK;
    if (blocks < 1)
        blocks = 1;
    return blocks < ZT_CUDA_SUM_BLOCKS ? (unsigned)blocks : ZT_CUDA_SUM_BLOCKS;
}

size_t zt_cuda_flash_fwd_smem(int R, int hd) {
    return sizeof(float) * ((size_t)4 * R * hd + (size_t)R * R + 3 * (size_t)R) +
           sizeof(int) * (size_t)R;
}

size_t zt_cuda_flash_dq_smem(int R, int hd) {
    return sizeof(float) * ((size_t)5 * R * hd + (size_t)R * R + 2 * (size_t)R) +
           sizeof(int) * (size_t)R;
}

size_t zt_cuda_flash_kv_smem(int R, int hd) {
    return sizeof(float) * ((size_t)6 * R * hd + 2 * (size_t)R * R + 2 * (size_t)R) +
           sizeof(int) * (size_t)R;
}

static bool flash_fits(int R, int hd, size_t limit) {
    return zt_cuda_flash_fwd_smem(R, hd) <= limit && zt_cuda_flash_dq_smem(R, hd) <= limit &&
           zt_cuda_flash_kv_smem(R, hd) <= limit;
}

int zt_cuda_flash_tile(int hd, size_t smem_limit) {
    int R = 32;
    while (R > 0 && !flash_fits(R, hd, smem_limit))
        R /= 2;
    return R;
}
