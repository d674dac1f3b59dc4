/* Launch shapes of the CUDA kernels, computed on the host (cuda_host.h). Plain C, so the unit
 * tests check them on machines without a GPU. */
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
