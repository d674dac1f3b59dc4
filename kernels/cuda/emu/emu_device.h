/* The device side of the emulated CUDA device, force-included (g++ -include) before every .cu
 * file that the emulator builds with the host compiler: the vocabulary a kernel uses (thread and
 * block indices, __shared__ memory, barriers, warp shuffles and votes, atomics, the intrinsics
 * that only nvcc declares) and the launch that ZT_LAUNCH expands to. The toolkit's own
 * cuda_runtime.h, cuda_bf16.h and cuda_fp16.h are included as they are, without __CUDACC__,
 * which gives their host versions of the 16-bit types.
 *
 * Kernels run on the CPU, one block at a time, each CUDA thread a fiber (emu_block.cc), so that
 * a barrier or a warp shuffle waits as on the GPU and the order of threads between barriers is a
 * parameter that the emulator varies to catch races. See docs/gpu.md, "The emulated CUDA device".
 * Never compiled by nvcc. */
#ifndef ZTRAIN_CUDA_EMU_DEVICE_H
#define ZTRAIN_CUDA_EMU_DEVICE_H

#if defined(__CUDACC__) || !defined(__cplusplus)
#error "emu_device.h is the emulator's: C++ built by the host compiler only"
#endif

/* Static __shared__ storage is one section, so the emulator can fill every block's shared memory
 * with 0xFF (NaN in fp32/bf16/fp16) before the block runs: it is uninitialised on a GPU. Blocks
 * run one at a time, so one copy serves them all. host_defines.h keeps a __shared__ defined
 * before it. */
#define __shared__ __attribute__((section("zt_emu_shared"))) static
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- what the block scheduler exposes (emu_block.cc) ----------------------------------------- */

struct zt_emu_thread {
    uint3 tid;
    unsigned linear, lane, warp;
};
extern zt_emu_thread *zt_emu_cur; /* the fiber running now */
extern uint3 zt_emu_block_idx;
extern dim3 zt_emu_block_dim, zt_emu_grid_dim;

#define threadIdx (zt_emu_cur->tid)
#define blockIdx (zt_emu_block_idx)
#define blockDim (zt_emu_block_dim)
#define gridDim (zt_emu_grid_dim)
static constexpr int warpSize = 32;

#define ZT_EMU_STR2_(x) #x
#define ZT_EMU_STR_(x) ZT_EMU_STR2_(x)
#define ZT_EMU_SITE __FILE__ ":" ZT_EMU_STR_(__LINE__)

/* Waits until every thread of the block reaches the same __syncthreads (a barrier reached at
 * different sites, or by some threads while others have returned, fails the launch). */
void zt_emu_barrier(const char *site);
#define __syncthreads() zt_emu_barrier(ZT_EMU_SITE)
/* Waits until every lane of mask reaches a warp sync with the same mask. */
void zt_emu_warp_sync(unsigned mask, const char *site);
#define __syncwarp(...) zt_emu_warp_sync_opt(ZT_EMU_SITE, ##__VA_ARGS__)
static inline void zt_emu_warp_sync_opt(const char *site, unsigned mask = 0xFFFFFFFFu) {
    zt_emu_warp_sync(mask, site);
}
/* The lanes' exchange slots: a lane writes its value, syncs, reads its source, syncs again. */
uint64_t *zt_emu_warp_slots(void);
/* Fails the running launch with the message (the kernel does not continue). */
[[noreturn]] void zt_emu_kernel_fault(const char *site, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The launch's dynamic shared memory (poisoned with 0xFF before each block). */
void *zt_emu_dyn_smem(void);

/* ---- warp shuffles and votes (CUDA Programming Guide, "Warp Shuffle Functions") -------------- */

enum zt_emu_shfl_kind { ZT_EMU_SHFL_IDX, ZT_EMU_SHFL_UP, ZT_EMU_SHFL_DOWN, ZT_EMU_SHFL_XOR };

static inline unsigned zt_emu_shfl_src(zt_emu_shfl_kind kind, unsigned lane, int arg, int width) {
    const unsigned w = (unsigned)width, base = lane & ~(w - 1);
    switch (kind) {
    case ZT_EMU_SHFL_IDX: return base + ((unsigned)arg & (w - 1));
    case ZT_EMU_SHFL_UP: return lane - base >= (unsigned)arg ? lane - (unsigned)arg : lane;
    case ZT_EMU_SHFL_DOWN: return lane - base + (unsigned)arg < w ? lane + (unsigned)arg : lane;
    default: {
        unsigned src = lane ^ (unsigned)arg;
        return src >= base + w ? lane : src;
    }
    }
}

template <typename T>
static inline T zt_emu_shfl(zt_emu_shfl_kind kind, unsigned mask, T v, int arg, int width,
                            const char *site) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffled type");
    const unsigned lane = zt_emu_cur->lane;
    if (width <= 0 || width > 32 || (width & (width - 1)))
        zt_emu_kernel_fault(site, "shuffle width %d is not a power of two up to 32", width);
    if (!(mask >> lane & 1u))
        zt_emu_kernel_fault(site, "lane %u shuffles with mask 0x%08x, which does not name it", lane,
                            mask);
    uint64_t *slots = zt_emu_warp_slots();
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    slots[lane] = bits;
    zt_emu_warp_sync(mask, site);
    const unsigned src = zt_emu_shfl_src(kind, lane, arg, width);
    if (!(mask >> src & 1u))
        zt_emu_kernel_fault(site, "lane %u reads lane %u, which mask 0x%08x leaves out", lane, src,
                            mask);
    memcpy(&v, &slots[src], sizeof v);
    zt_emu_warp_sync(mask, site);
    return v;
}

#define __shfl_sync(m, v, a, ...) zt_emu_shfl_(ZT_EMU_SHFL_IDX, m, v, a, ZT_EMU_SITE, ##__VA_ARGS__)
#define __shfl_up_sync(m, v, a, ...)                                                               \
    zt_emu_shfl_(ZT_EMU_SHFL_UP, m, v, a, ZT_EMU_SITE, ##__VA_ARGS__)
#define __shfl_down_sync(m, v, a, ...)                                                             \
    zt_emu_shfl_(ZT_EMU_SHFL_DOWN, m, v, a, ZT_EMU_SITE, ##__VA_ARGS__)
#define __shfl_xor_sync(m, v, a, ...)                                                              \
    zt_emu_shfl_(ZT_EMU_SHFL_XOR, m, v, a, ZT_EMU_SITE, ##__VA_ARGS__)
template <typename T>
static inline T zt_emu_shfl_(zt_emu_shfl_kind k, unsigned m, T v, int a, const char *site,
                             int width = 32) {
    return zt_emu_shfl(k, m, v, a, width, site);
}

/* Votes: the same exchange over the predicate. */
unsigned zt_emu_ballot(unsigned mask, int pred, const char *site);
#define __ballot_sync(m, p) zt_emu_ballot(m, p, ZT_EMU_SITE)
#define __any_sync(m, p) (zt_emu_ballot(m, p, ZT_EMU_SITE) != 0u)
#define __all_sync(m, p) (zt_emu_ballot(m, p, ZT_EMU_SITE) == (m))

/* ---- atomics: relaxed, as CUDA's (they order nothing beyond their own location) -------------- */

template <typename T> static inline T atomicAdd(T *p, T v) {
    if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
        std::atomic_ref<unsigned short> a(*reinterpret_cast<unsigned short *>(p));
        unsigned short old = a.load(std::memory_order_relaxed), want;
        T r;
        do {
            memcpy(&r, &old, sizeof r);
            T s = T(float(r) + float(v));
            memcpy(&want, &s, sizeof want);
        } while (!a.compare_exchange_weak(old, want, std::memory_order_relaxed));
        return r;
    } else {
        return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
    }
}
template <typename T> static inline T atomicSub(T *p, T v) {
    return std::atomic_ref<T>(*p).fetch_sub(v, std::memory_order_relaxed);
}
template <typename T> static inline T atomicExch(T *p, T v) {
    return std::atomic_ref<T>(*p).exchange(v, std::memory_order_relaxed);
}
template <typename T> static inline T atomicCAS(T *p, T expected, T desired) {
    std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired, std::memory_order_relaxed);
    return expected;
}
template <typename T> static inline T atomicMax(T *p, T v) {
    std::atomic_ref<T> a(*p);
    T old = a.load(std::memory_order_relaxed);
    while (old < v && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
    }
    return old;
}
template <typename T> static inline T atomicMin(T *p, T v) {
    std::atomic_ref<T> a(*p);
    T old = a.load(std::memory_order_relaxed);
    while (v < old && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
    }
    return old;
}
static inline void __threadfence(void) { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_block(void) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

/* ---- intrinsics nvcc alone declares: exact IEEE operations (the module builds with
 * -ffp-contract=off, so a + b is one rounding as __fadd_rn) ------------------------------------ */

static inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
static inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
static inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
static inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline float __double2float_rn(double a) { return (float)a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline float __fdividef(float a, float b) { return a / b; }
/* __expf and __logf: glibc declares its own, the exact ones. */
static inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline void __nanosleep(unsigned) {}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

/* ---- vector accesses ------------------------------------------------------------------------ */

/* p as a V * for one access of sizeof(V) bytes (cuda_common.cuh's ZT_VEC_AT). A GPU's 8- and
 * 16-byte loads and stores need an address aligned to their size, or the kernel faults
 * (cudaErrorMisalignedAddress); x86 loads such data unaligned without complaint (and stores it
 * with an aligned instruction that crashes the process or not, as the compiler chose), so the
 * launch fails here instead, naming the site and the address. */
template <typename V> static inline V *zt_emu_vec_at(V *p, const char *site) {
    if ((uintptr_t)p % sizeof(V) != 0)
        zt_emu_kernel_fault(site, "misaligned address: a %zu-byte vector access at %p (%zu bytes "
                            "past a %zu-byte boundary)", sizeof(V), (const void *)p,
                            (size_t)((uintptr_t)p % sizeof(V)), sizeof(V));
    return p;
}
#define ZT_VEC_AT(V, p) zt_emu_vec_at(reinterpret_cast<V *>(p), ZT_EMU_SITE)

/* ---- dynamic shared memory and launches ----------------------------------------------------- */

/* extern __shared__ T name[] under nvcc; the launch's buffer here. */
#define ZT_DYN_SHARED(T, name) T *name = static_cast<T *>(zt_emu_dyn_smem())

/* The section bounds of this module's static __shared__ storage (null when it has none). */
extern "C" char __start_zt_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_zt_emu_shared[] __attribute__((weak, visibility("hidden")));

struct zt_emu_launch_desc {
    const char *name; /* the kernel as written at the launch */
    const void *fn;   /* its address: the key of cudaFuncSetAttribute */
    dim3 grid, block;
    size_t dyn_smem;
    cudaStream_t stream;
    char *shared_lo, *shared_hi; /* the static __shared__ section to poison */
};

/* Checks the configuration (an error is left for cudaGetLastError, as the runtime does) and
 * enqueues the grid on the stream; body runs one thread. `pointer_args` are the kernel's pointer
 * arguments, each checked to be device-accessible memory (or null). */
void zt_emu_launch_enqueue(const zt_emu_launch_desc &d, std::function<void()> body,
                           const void *const *pointer_args, size_t n_pointer_args);

/* A kernel's pointer arguments, and the memory a struct argument points at where the struct
 * names it (a member `int device_pointers(const void **out) const` writing at most two). */
template <typename T>
static inline void zt_emu_collect_ptr(const T &v, const void **out, size_t &n) {
    if constexpr (std::is_pointer_v<T>)
        out[n++] = (const void *)v;
    else if constexpr (requires { v.device_pointers(out); })
        n += (size_t)v.device_pointers(out + n);
}

/* Kernel parameters are copied when the launch is enqueued, converted to the kernel's parameter
 * types, as CUDA copies them at the launch call; every thread gets its own copy. */
template <typename... P, typename... A>
void zt_emu_launch(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
    auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(args)...);
    const void *ptrs[2 * sizeof...(P) + 1];
    size_t n = 0;
    std::apply([&](const auto &...p) { (zt_emu_collect_ptr(p, ptrs, n), ...); }, *params);
    zt_emu_launch_desc d{name,
                         (const void *)k,
                         grid,
                         block,
                         smem,
                         stream,
                         __start_zt_emu_shared,
                         __stop_zt_emu_shared};
    zt_emu_launch_enqueue(
        d, [k, params] { std::apply([k](auto... p) { k(p...); }, *params); }, ptrs, n);
}

#define ZT_LAUNCH(kernel, grid, block, smem, stream, ...)                                          \
    zt_emu_launch(#kernel, &kernel, grid, block, smem, stream, ##__VA_ARGS__)

#endif
