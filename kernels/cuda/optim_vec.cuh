/* The optimizer kernels' chunks (optim.cu, lamb.cu): each thread takes OPT_VEC consecutive
 * elements, moved in 16-byte loads and stores (two per fp32 array, one per 16-bit one) where the
 * chunk is whole and aligned, element by element otherwise (a slice's tail, an odd offset). The
 * elements' arithmetic is unchanged, so the results do not depend on the chunking. */
#ifndef ZTRAIN_CUDA_OPTIM_VEC_CUH
#define ZTRAIN_CUDA_OPTIM_VEC_CUH

#include "cuda_common.cuh"

/* Elements per thread in the update kernels: 32 bytes of every fp32 array, 16 of a 16-bit one. */
enum { OPT_VEC = 8 };

#define OPT_LOOP(base, n)                                                                          \
    for (size_t base = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * OPT_VEC; base < (n);      \
         base += (size_t)gridDim.x * blockDim.x * OPT_VEC)
#define OPT_LAUNCH(x, n, kernel, ...)                                                              \
    ZT_LAUNCH_1D(x, ((n) + OPT_VEC - 1) / OPT_VEC, kernel, __VA_ARGS__)

/* The chunk's fp32 arrays in two 16-byte pieces, its 16-bit ones (a gradient, the parameters'
 * 16-bit twin) in one, through cuda_common.cuh's chunk loads and stores. */
static_assert(OPT_VEC == ZT_VEC(uint16_t), "a 16-bit chunk is one 16-byte piece");

__device__ __forceinline__ void ld8(const float *p, size_t base, size_t n, float *x) {
    zt_ldv_f32<OPT_VEC>(p, base, n, x);
}

__device__ __forceinline__ void st8(float *p, size_t base, size_t n, const float *x) {
    zt_stv_f32<OPT_VEC>(p, base, n, x);
}

/* 16-bit values widened exactly (as from_half). */
__device__ __forceinline__ void ld8_half(const uint16_t *p, size_t base, size_t n, bool bf16,
                                         float *x) {
    zt_ldv_as(p, base, n, x, zt_half_bits{bf16});
}

/* x rounded to nearest even (as to_half). */
__device__ __forceinline__ void st8_half(uint16_t *p, size_t base, size_t n, bool bf16,
                                         const float *x) {
    zt_stv_as(p, base, n, x, zt_half_bits{bf16});
}

#endif
