/* What the CUDA kernel files share: activations loaded to fp32 and stored back in their type
 * (fp32, bfloat16 or binary16, rounded to nearest even), the switch from a zt_dtype to a kernel
 * instantiation, block-wide reductions in a fixed order, and the exact 16-bit conversions of the
 * cast and optimizer ops. Arithmetic is fp32 throughout; only storage is 16-bit. */
#ifndef ZTRAIN_CUDA_COMMON_CUH
#define ZTRAIN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_backend.h"

/* Every launch goes through ZT_LAUNCH and every dynamic shared array through ZT_DYN_SHARED, so
 * that the same source builds for the GPU (here, under nvcc) and for the emulated device, whose
 * emu_device.h defines both as calls (chevrons and extern __shared__ have no host meaning). */
#ifndef ZT_LAUNCH
#define ZT_LAUNCH(kernel, grid, block, smem, stream, ...)                                          \
    kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define ZT_DYN_SHARED(T, name) extern __shared__ T name[]
#endif

/* The vector type V at address p, for a load or store of sizeof(V) bytes at once. A GPU faults on
 * such an access unless p is aligned to sizeof(V) (cudaErrorMisalignedAddress), while x86 takes
 * it, so the emulated device defines this as a check that fails the launch (emu_device.h). Every
 * vector access goes through it. */
#ifndef ZT_VEC_AT
#define ZT_VEC_AT(V, p) reinterpret_cast<V *>(p)
#endif

__device__ __forceinline__ float zt_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float zt_ld(const __nv_bfloat16 *p, size_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ float zt_ld(const __half *p, size_t i) { return __half2float(p[i]); }

__device__ __forceinline__ void zt_st(float *p, size_t i, float x) { p[i] = x; }
__device__ __forceinline__ void zt_st(__nv_bfloat16 *p, size_t i, float x) {
    p[i] = __float2bfloat16_rn(x);
}
__device__ __forceinline__ void zt_st(__half *p, size_t i, float x) { p[i] = __float2half_rn(x); }

/* Runs the statement with ACT_T naming the storage type of activations at act. */
#define ZT_ACT_DISPATCH(act, ...)                                                                  \
    do {                                                                                           \
        switch (act) {                                                                             \
        case ZT_F32: {                                                                             \
            typedef float ACT_T;                                                                   \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case ZT_BF16: {                                                                            \
            typedef __nv_bfloat16 ACT_T;                                                           \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case ZT_F16: {                                                                             \
            typedef __half ACT_T;                                                                  \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        default:                                                                                   \
            ZT_ASSERT(!"activation dtype is fp32, bf16 or fp16");                                  \
        }                                                                                          \
    } while (0)

/* Sum or max over the block, whose size is a multiple of 32 (zt_cuda_row_threads), returned to
 * every thread. The order of additions depends only on the block size: deterministic. scratch
 * holds 32 values; the call begins and ends with a barrier so it may be reused at once. */
template <typename T, typename Op>
__device__ __forceinline__ T zt_block_reduce(T v, T *scratch, Op op) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o /= 2)
        v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    T r = scratch[0];
    for (int w = 1; w < warps; w++)
        r = op(r, scratch[w]);
    __syncthreads();
    return r;
}

struct zt_add_op {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct zt_max_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return a > b ? a : b; }
};

template <typename T> __device__ __forceinline__ T zt_block_sum(T v, T *scratch) {
    return zt_block_reduce(v, scratch, zt_add_op());
}
__device__ __forceinline__ float zt_block_max(float v, float *scratch) {
    return zt_block_reduce(v, scratch, zt_max_op());
}

/* A grid-stride loop over [0, n). */
#define ZT_GRID_LOOP(i, n)                                                                         \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* The grid of elementwise kernels: enough blocks to fill any current GPU several times over. */
enum { ZT_CUDA_MAX_GRID = 65535 };

/* Launches an elementwise kernel over n elements on the compute stream of ctx x. */
#define ZT_LAUNCH_1D(x, n, kernel, ...)                                                               \
    do {                                                                                           \
        zt_cuda_launch l_ = zt_cuda_launch_1d((n), ZT_CUDA_BLOCK, ZT_CUDA_MAX_GRID);               \
        if (l_.grid == 0)                                                                          \
            break;                                                                                 \
        ZT_LAUNCH(kernel, l_.grid, l_.block, 0, zt_cuda_stream(x), __VA_ARGS__);                  \
        ZT_CUDA_LAUNCHED((x)->be);                                                                 \
    } while (0)

/* ---- 128-bit loads and stores -----------------------------------------------------------------
 * A memory-bound kernel moves 16 bytes per instruction instead of 2 or 4: a chunk of ZT_VEC(T)
 * elements (8 bf16/fp16, 4 fp32) per thread. Activations are slices of larger buffers at any
 * element offset, so a chunk is loaded whole only when it lies inside [0, n) and starts 16-byte
 * aligned; otherwise (the tail of a size that is not a multiple of the vector, or a misaligned
 * slice) element by element. Either way every element is read once, as fp32. */
template <typename T> struct zt_vec_width {
    static constexpr int value = 16 / (int)sizeof(T);
};
#define ZT_VEC(T) (zt_vec_width<T>::value)

template <typename T> struct alignas(16) zt_pack16 {
    T v[16 / sizeof(T)];
};

template <typename T>
__device__ __forceinline__ bool zt_vec_whole(const T *p, size_t base, size_t n) {
    return base + ZT_VEC(T) <= n && ((uintptr_t)(p + base) & 15u) == 0;
}

/* x[j] = widen(p[base + j]) for the chunk's elements below n (the others are left as they are).
 * widen takes a stored element to fp32: zt_ldv's zt_widen for the activation types, zt_half_bits
 * for 16-bit values whose format is known only at run time. */
template <typename T, typename Widen>
__device__ __forceinline__ void zt_ldv_as(const T *p, size_t base, size_t n, float *x, Widen widen) {
    if (zt_vec_whole(p, base, n)) {
        zt_pack16<T> pk = *ZT_VEC_AT(const zt_pack16<T>, p + base);
        for (int j = 0; j < ZT_VEC(T); j++)
            x[j] = widen(pk.v[j]);
    } else {
        for (int j = 0; j < ZT_VEC(T) && base + j < n; j++)
            x[j] = widen(p[base + j]);
    }
}

/* p[base + j] = narrow(x[j]) for the chunk's elements below n; narrow rounds fp32 to T. */
template <typename T, typename Narrow>
__device__ __forceinline__ void zt_stv_as(T *p, size_t base, size_t n, const float *x,
                                          Narrow narrow) {
    if (zt_vec_whole(p, base, n)) {
        zt_pack16<T> pk;
        for (int j = 0; j < ZT_VEC(T); j++)
            pk.v[j] = narrow(x[j]);
        *ZT_VEC_AT(zt_pack16<T>, p + base) = pk;
    } else {
        for (int j = 0; j < ZT_VEC(T) && base + j < n; j++)
            p[base + j] = narrow(x[j]);
    }
}

/* The activation types' conversions (zt_ld and zt_st) as zt_ldv_as and zt_stv_as take them. */
template <typename T> struct zt_widen {
    __device__ __forceinline__ float operator()(T v) const { return zt_ld(&v, 0); }
};
template <typename T> struct zt_narrow {
    __device__ __forceinline__ T operator()(float x) const {
        T v;
        zt_st(&v, 0, x);
        return v;
    }
};

/* x[j] = p[base + j] for the chunk's elements below n (the others are left as they are). */
template <typename T>
__device__ __forceinline__ void zt_ldv(const T *p, size_t base, size_t n, float *x) {
    zt_ldv_as(p, base, n, x, zt_widen<T>());
}

/* p[base + j] = x[j] rounded to T, for the chunk's elements below n. */
template <typename T>
__device__ __forceinline__ void zt_stv(T *p, size_t base, size_t n, const float *x) {
    zt_stv_as(p, base, n, x, zt_narrow<T>());
}

/* The N fp32 elements [base, base + N) below n, N a multiple of ZT_VEC(float), in 16-byte
 * pieces: the fp32 arrays that a thread walks beside a chunk of narrower elements (embedding and
 * rotary tables, optimizer states). */
template <int N>
__device__ __forceinline__ void zt_ldv_f32(const float *p, size_t base, size_t n, float *x) {
    static_assert(N % ZT_VEC(float) == 0, "whole 16-byte pieces");
    for (int k = 0; k < N; k += ZT_VEC(float))
        zt_ldv(p, base + k, n, x + k);
}
template <int N>
__device__ __forceinline__ void zt_stv_f32(float *p, size_t base, size_t n, const float *x) {
    static_assert(N % ZT_VEC(float) == 0, "whole 16-byte pieces");
    for (int k = 0; k < N; k += ZT_VEC(float))
        zt_stv(p, base + k, n, x + k);
}

/* A grid-stride loop over the chunks of [0, n): base is each chunk's first element. Launch with
 * ZT_LAUNCH_VEC. */
#define ZT_GRID_LOOP_VEC(T, base, n)                                                               \
    for (size_t base = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * ZT_VEC(T); base < (n);    \
         base += (size_t)gridDim.x * blockDim.x * ZT_VEC(T))

/* Threads for a block that walks a row of C elements of T in 16-byte chunks. */
template <typename T> static inline unsigned zt_row_threads_vec(int C) {
    return zt_cuda_row_threads((size_t)(C + ZT_VEC(T) - 1) / ZT_VEC(T));
}

/* Launches a chunked elementwise kernel over n elements of type T on the compute stream of x. */
#define ZT_LAUNCH_VEC(x, T, n, kernel, ...)                                                        \
    ZT_LAUNCH_1D(x, ((n) + ZT_VEC(T) - 1) / ZT_VEC(T), kernel, __VA_ARGS__)

/* ---- exact 16-bit conversions (the CPU's half.h, bit for bit) ------------------------------- */

__device__ __forceinline__ uint16_t zt_bf16_from_f32(float x) {
    uint32_t u = __float_as_uint(x);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

__device__ __forceinline__ float zt_f32_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    return __uint_as_float((h & 0x7FFFu) > 0x7F80u ? u | 0x00400000u : u);
}

/* Round to nearest even with subnormals and overflow to inf, as the hardware conversion does;
 * a NaN keeps its sign and top payload bits and is quieted, as the CPU's. */
__device__ __forceinline__ uint16_t zt_f16_from_f32(float x) {
    uint32_t u = __float_as_uint(x);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7E00u | ((a >> 13) & 0x03FFu));
    return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float zt_f32_from_f16(uint16_t h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu))
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7FC00000u |
                               ((uint32_t)(h & 0x03FFu) << 13));
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ uint16_t zt_half_from_f32(float x, bool bf16) {
    return bf16 ? zt_bf16_from_f32(x) : zt_f16_from_f32(x);
}
__device__ __forceinline__ float zt_f32_from_half(uint16_t h, bool bf16) {
    return bf16 ? zt_f32_from_bf16(h) : zt_f32_from_f16(h);
}

/* 16-bit values held as raw uint16_t, bf16 or binary16 as chosen at run time, converted exactly
 * as above: the widen and narrow of zt_ldv_as and zt_stv_as. */
struct zt_half_bits {
    bool bf16;
    __device__ __forceinline__ float operator()(uint16_t h) const {
        return zt_f32_from_half(h, bf16);
    }
    __device__ __forceinline__ uint16_t operator()(float x) const {
        return zt_half_from_f32(x, bf16);
    }
};

/* ---- parameters as the kernels read them ------------------------------------------------------
 * A parameter vector of ops.h (the model's fp32 working copy) or, where the ctx carries a 16-bit
 * twin covering it (zt_param16), that twin widened. The two are the same values whenever the
 * twin's invariant holds, and in mixed precision ZeRO's fp32 working copy is the twin widened,
 * so with every parameter read through a view the step needs no fp32 copy of the parameters
 * (backend.h, reads_param16). ZTRAIN_CUDA_WEIGHTS=round reads the fp32 values. */
struct zt_param_view {
    const float *f32;     /* NULL: no parameter (an optional bias) */
    const uint16_t *half; /* the twin at the same element, or NULL: read f32 */
    bool bf16;
    __device__ __forceinline__ float operator[](size_t i) const {
        return half ? zt_f32_from_half(half[i], bf16) : f32[i];
    }
    __host__ __device__ __forceinline__ bool present() const { return f32 != NULL; }
    /* The memory the kernel reads, for the emulated device's launch checks (emu_device.h). */
    __host__ int device_pointers(const void **out) const {
        out[0] = half ? (const void *)half : (const void *)f32;
        return 1;
    }
    /* The view of the vector from element off on. */
    __host__ __device__ __forceinline__ zt_param_view at(size_t off) const {
        return {f32 + off, half ? half + off : NULL, bf16};
    }
    /* x[k] = element base + k for the N elements below n, in 16-byte pieces where whole and
     * aligned (zt_ldv_f32, or zt_ldv_as for the twin). */
    template <int N> __device__ __forceinline__ void load(size_t base, size_t n, float *x) const {
        if (!half) {
            zt_ldv_f32<N>(f32, base, n, x);
        } else if (N % ZT_VEC(uint16_t) == 0) {
            for (int k = 0; k < N; k += ZT_VEC(uint16_t))
                zt_ldv_as(half, base + k, n, x + k, zt_half_bits{bf16});
        } else {
            for (int k = 0; k < N && base + k < n; k++)
                x[k] = zt_f32_from_half(half[base + k], bf16);
        }
    }
};

/* The view of p[0, n) for ctx x: its twin when x carries one covering it and the backend reads
 * twins; p itself otherwise (p may be NULL). */
static inline zt_param_view zt_cuda_param(const zt_ctx *x, const float *p, size_t n) {
    zt_param_view v = {p, NULL, x->act == ZT_BF16};
    if (p && x->be->reads_param16)
        v.half = zt_param16_of(x, p, n);
    return v;
}

/* ---- parameter gradients as the kernels accumulate into them ---------------------------------
 * A gradient vector of ops.h (the model's fp32 gradients) or, where the ctx carries a 16-bit
 * gradient buffer covering it (zt_grad16) and the backend writes there (backend.h,
 * writes_grad16), that buffer. An op adds its contribution in fp32 and rounds once to nearest
 * even: what accumulate_half does with the fp32 gradient the op would otherwise have written. */
struct zt_grad_view {
    float *f32;     /* NULL: no gradient wanted (a frozen or absent parameter) */
    uint16_t *half; /* the 16-bit gradient at the same element, or NULL: accumulate into f32 */
    bool bf16;
    __host__ __device__ __forceinline__ bool present() const { return f32 != NULL; }
    /* The memory the kernel writes, for the emulated device's launch checks (emu_device.h),
     * which restore it between the two runs of a grid. */
    __host__ int device_pointers(const void **out) const {
        out[0] = half ? (const void *)half : (const void *)f32;
        return 1;
    }
    /* The view of the vector from element off on. */
    __host__ __device__ __forceinline__ zt_grad_view at(size_t off) const {
        return {f32 + off, half ? half + off : NULL, bf16};
    }
    __device__ __forceinline__ void add(size_t i, float s) const {
        if (half)
            half[i] = zt_half_from_f32(zt_f32_from_half(half[i], bf16) + s, bf16);
        else
            f32[i] += s;
    }
    /* Element base + k += s[k] for the N elements below n, in 16-byte pieces where whole and
     * aligned, as zt_param_view::load reads them. */
    template <int N>
    __device__ __forceinline__ void add_vec(size_t base, size_t n, const float *s) const {
        float r[N] = {};
        if (!half) {
            zt_ldv_f32<N>(f32, base, n, r);
            for (int k = 0; k < N; k++)
                r[k] += s[k];
            zt_stv_f32<N>(f32, base, n, r);
        } else if (N % ZT_VEC(uint16_t) == 0) {
            const zt_half_bits bits = {bf16};
            for (int k = 0; k < N; k += ZT_VEC(uint16_t)) {
                zt_ldv_as(half, base + k, n, r + k, bits);
                for (int j = k; j < k + ZT_VEC(uint16_t); j++)
                    r[j] += s[j];
                zt_stv_as(half, base + k, n, r + k, bits);
            }
        } else {
            for (int k = 0; k < N && base + k < n; k++)
                add(base + k, s[k]);
        }
    }
};

/* The view of the gradient g[0, n) for ctx x: its 16-bit buffer when x carries one covering it
 * and the backend writes there; g itself otherwise (g may be NULL). */
static inline zt_grad_view zt_cuda_grad(const zt_ctx *x, float *g, size_t n) {
    zt_grad_view v = {g, NULL, x->act == ZT_BF16};
    if (g && x->be->writes_grad16)
        v.half = zt_grad16_of(x, g, n);
    return v;
}

#endif
