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

/* x[j] = p[base + j] for the chunk's elements below n (the rest are left as they are). */
__device__ __forceinline__ void ld8(const float *p, size_t base, size_t n, float *x) {
    zt_ldv(p, base, n, x);
    zt_ldv(p, base + ZT_VEC(float), n, x + ZT_VEC(float));
}

__device__ __forceinline__ void st8(float *p, size_t base, size_t n, const float *x) {
    zt_stv(p, base, n, x);
    zt_stv(p, base + ZT_VEC(float), n, x + ZT_VEC(float));
}

__device__ __forceinline__ bool whole8(const uint16_t *p, size_t base, size_t n) {
    return base + OPT_VEC <= n && ((uintptr_t)(p + base) & 15u) == 0;
}

/* 16-bit values widened exactly (as from_half), the chunk in one 16-byte load when it can. */
__device__ __forceinline__ void ld8_half(const uint16_t *p, size_t base, size_t n, bool bf16,
                                         float *x) {
    if (whole8(p, base, n)) {
        zt_pack16<uint16_t> pk = *reinterpret_cast<const zt_pack16<uint16_t> *>(p + base);
        for (int j = 0; j < OPT_VEC; j++)
            x[j] = zt_f32_from_half(pk.v[j], bf16);
    } else {
        for (int j = 0; j < OPT_VEC && base + j < n; j++)
            x[j] = zt_f32_from_half(p[base + j], bf16);
    }
}

/* x rounded to nearest even (as to_half), the chunk in one 16-byte store when it can. */
__device__ __forceinline__ void st8_half(uint16_t *p, size_t base, size_t n, bool bf16,
                                         const float *x) {
    if (whole8(p, base, n)) {
        zt_pack16<uint16_t> pk;
        for (int j = 0; j < OPT_VEC; j++)
            pk.v[j] = zt_half_from_f32(x[j], bf16);
        *reinterpret_cast<zt_pack16<uint16_t> *>(p + base) = pk;
    } else {
        for (int j = 0; j < OPT_VEC && base + j < n; j++)
            p[base + j] = zt_half_from_f32(x[j], bf16);
    }
}

#endif
