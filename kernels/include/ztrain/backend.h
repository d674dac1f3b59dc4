/* The backend object: one compute device as the engine sees it.
 *
 * A backend owns the memory that parameters, gradients, optimizer state and activations live in,
 * the streams that compute and communication run on, and the op table (ops.h) that computes on
 * that memory. The engine, ZeRO, the optimizer and the model files touch that memory only through
 * these calls, so a new device is a new implementation of zt_backend_iface and a new op table
 * (kernels/<device>/), not edits across the engine. The CPU backend (kernels/cpu/) is the first and
 * the reference: OpenBLAS and OpenMP, device memory = host memory, streams and events that do
 * nothing because every call completes before it returns.
 *
 * Memory. zt_backend_alloc returns zeroed memory of a kind: ZT_MEM_DEVICE (where ops compute;
 * on the CPU an anonymous mapping whose pages are committed on first touch), ZT_MEM_HOST (plain
 * host memory, 64-byte aligned) or ZT_MEM_PINNED (host memory the device can copy from
 * asynchronously; plain host memory on the CPU). A device range can be released — its contents
 * become zero and whole pages go back to the system — and committed again before it is written;
 * zt_backend_resident_bytes measures what a range really holds, which is how ZeRO's memory
 * savings are measured. Offsets and sizes of these calls are in bytes.
 *
 * Ordering. Ops and copies are issued on a stream (compute by default). Within a stream they run
 * in issue order; across streams, record an event on one and make the other wait for it.
 * zt_backend_sync waits for everything issued and returns the first asynchronous error (a GPU
 * fault surfaces there), with a message naming the device. */
#ifndef ZTRAIN_BACKEND_H
#define ZTRAIN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/dtype.h"
#include "ztrain/ops.h"
#include "ztrain/status.h"

/* Where a job's ranks compute (the job spec's "device"). */
typedef enum { ZT_DEVICE_CPU = 0, ZT_DEVICE_CUDA, ZT_DEVICE_COUNT } zt_device;

/* "cpu", "cuda". */
const char *zt_device_name(zt_device d);

typedef enum {
    ZT_MEM_DEVICE = 0, /* where ops compute */
    ZT_MEM_HOST,       /* host memory for the host's own work (offload buffers, staging) */
    ZT_MEM_PINNED,     /* host memory for asynchronous copies to and from the device */
} zt_mem;

typedef enum { ZT_COPY_H2D = 0, ZT_COPY_D2H, ZT_COPY_D2D, ZT_COPY_H2H } zt_copy_kind;

/* zt_stream, the streams every backend has, is ops.h's (an op runs on its ctx's). */

typedef struct zt_event zt_event;
typedef struct zt_backend zt_backend;

/* What each backend implements. Every entry is required; "no-op" below means what the CPU does. */
typedef struct {
    void *(*alloc)(zt_backend *be, zt_mem kind, size_t bytes);
    void *(*alloc_released)(zt_backend *be, size_t bytes);
    void *(*reserve)(zt_backend *be, size_t bytes);
    void (*free)(zt_backend *be, zt_mem kind, void *p, size_t bytes);
    void (*zero)(zt_backend *be, void *p, size_t bytes, zt_stream s);
    void (*copy)(zt_backend *be, void *dst, const void *src, size_t bytes, zt_copy_kind kind,
                 zt_stream s);
    void (*release)(zt_backend *be, void *p, size_t lo, size_t hi);
    zt_status (*commit)(zt_backend *be, void *p, size_t lo, size_t hi);
    size_t (*resident_bytes)(zt_backend *be, const void *p, size_t lo, size_t hi);
    zt_event *(*event_create)(zt_backend *be);
    void (*event_destroy)(zt_backend *be, zt_event *ev);
    void (*event_record)(zt_backend *be, zt_event *ev, zt_stream s);
    void (*stream_wait)(zt_backend *be, zt_stream s, zt_event *ev);
    zt_status (*event_wait)(zt_backend *be, zt_event *ev);
    zt_status (*sync)(zt_backend *be);
    void (*destroy)(zt_backend *be);
    /* Timing events (op_profile.h); NULL entries: the backend has none. */
    zt_event *(*timer_create)(zt_backend *be);
    zt_status (*timer_elapsed)(zt_backend *be, zt_event *start, zt_event *end, double *ms);
} zt_backend_iface;

struct zt_backend {
    const char *name;               /* "cpu", "cuda" */
    zt_device device;
    int device_index;               /* which GPU of this process's visible ones; 0 on the CPU */
    const zt_backend_iface *iface;
    const zt_ops *ops;              /* the op table; entries a backend lacks are NULL */
    /* Activations are stored as fp32 values held at ctx.act precision (the CPU's emulation of
     * 16-bit activations); otherwise they are stored in ctx.act itself. */
    bool act_as_f32;
    /* Attention keeps each row's log-sum-exp for its backward, not the T×T probabilities
     * (ops.h, attention_forward; zt_attn_state_floats sizes it). */
    bool attn_lse;
    /* Every op that reads a parameter reads its 16-bit twin instead whenever the ctx carries one
     * covering it (ops.h, zt_param16): the fp32 values are then never read, so in mixed
     * precision a caller need not fill the fp32 working copy (ZeRO does not, zero.h). The CUDA
     * backend's (but under ZTRAIN_CUDA_WEIGHTS=round); the CPU computes from the fp32 values. */
    bool reads_param16;
    /* Every op that accumulates a parameter gradient adds into the 16-bit gradients instead
     * whenever the ctx carries a buffer covering it (ops.h, zt_grad16): the fp32 gradients are
     * then never touched, so in mixed precision at ZeRO stages 0-1 a caller need not hold them
     * (ZeRO does not, zero.h). The CUDA backend's (but under ZTRAIN_CUDA_GRADS=f32). */
    bool writes_grad16;
    void *impl;                     /* the implementation's own state */
};

/* Bytes per activation element at precision act on this backend: what a model carves its
 * activation buffers with. */
static inline size_t zt_backend_act_size(const zt_backend *be, zt_dtype act) {
    return be->act_as_f32 ? sizeof(float) : zt_dtype_size(act);
}

typedef struct {
    int threads;                    /* CPU: OpenMP and OpenBLAS threads; 0 leaves the default */
    int device_index;               /* GPU: which visible device; ignored on the CPU */
} zt_backend_options;

/* Creates the backend for a device. A device this build lacks is ZT_ERR_INVALID naming the
 * build option that adds it ("device \"cuda\": this build has no CUDA backend (configure with
 * -DZT_CUDA=ON)"). Free with zt_backend_destroy. opts may be NULL (defaults). */
zt_status zt_backend_create(zt_backend **out, zt_device device, const zt_backend_options *opts);
void zt_backend_destroy(zt_backend *be);

/* Whether this build has a backend for the device. */
bool zt_backend_available(zt_device device);

/* How many devices of the kind this process can create a backend for: 1 for the CPU; for CUDA
 * the GPUs the driver shows it (after CUDA_VISIBLE_DEVICES), 0 without a driver or a GPU, and 0
 * in a build without CUDA. What decides whether GPU tests run or are skipped. */
int zt_backend_device_count(zt_device device);

/* ---- memory (offsets and sizes in bytes) ------------------------------------------------- */

/* Zeroed memory of the kind, or NULL when it cannot be had. Device memory is at least 64-byte
 * aligned (page-aligned on the CPU); host and pinned memory are page-aligned, so O_DIRECT I/O can
 * use them. A 0-byte request still returns a distinct pointer. */
static inline void *zt_backend_alloc(zt_backend *be, zt_mem kind, size_t bytes) {
    return be->iface->alloc(be, kind, bytes);
}
/* Device memory whose whole range starts released (zt_backend_release): an address range that
 * holds nothing yet, for a buffer whose parts are written one at a time (ZeRO's gradients), so
 * that it never holds all of its memory at once. Each part reads as zero and must be committed
 * (zt_backend_commit) before it is written, as after a release. On the CPU an anonymous mapping
 * whose pages are committed on first touch (what zt_backend_alloc gives); on the CUDA backend a
 * large allocation reserves its granules and maps none, a small one is allocated and zeroed.
 * NULL when it cannot be had; freed with zt_backend_free(ZT_MEM_DEVICE, same size). */
static inline void *zt_backend_alloc_released(zt_backend *be, size_t bytes) {
    return be->iface->alloc_released(be, bytes);
}
/* As zt_backend_alloc_released, for a buffer the caller expects never to write, or only a part
 * of it now and then, whose addresses it still needs (the model's fp32 gradients in mixed
 * precision, which are only the keys of their 16-bit buffer, ops.h zt_grad16): it holds no
 * memory at any size until a part is committed. On the CUDA backend with virtual memory
 * management it is a reserved range of whole granules whatever its size (zt_backend_alloc_released
 * keeps an allocation under four granules whole), so a commit holds a whole granule (2 MiB on
 * an H100) even for a few bytes: for a buffer that is written whole, zt_backend_alloc_released
 * costs less. Without virtual memory management (ZTRAIN_CUDA_VMM=off, an old driver) it is
 * zt_backend_alloc_released's; on the CPU the same anonymous mapping. NULL when it cannot be
 * had; freed with zt_backend_free(ZT_MEM_DEVICE, same size). */
static inline void *zt_backend_reserve(zt_backend *be, size_t bytes) {
    return be->iface->reserve(be, bytes);
}
/* Frees what zt_backend_alloc, zt_backend_alloc_released or zt_backend_reserve returned, with
 * the same kind and size. NULL is ignored. */
static inline void zt_backend_free(zt_backend *be, zt_mem kind, void *p, size_t bytes) {
    be->iface->free(be, kind, p, bytes);
}
/* p[0, bytes) = 0, on stream s. */
static inline void zt_backend_zero(zt_backend *be, void *p, size_t bytes, zt_stream s) {
    be->iface->zero(be, p, bytes, s);
}
/* Copies bytes from src to dst on stream s, after the work issued before it on s; the buffers
 * may not overlap. With non-pinned host memory the call returns only when the host buffer may be
 * reused: for ZT_COPY_D2H, once the bytes are in dst, so the caller reads them without a sync of
 * its own (the loss of an evaluation, a checkpoint's tensors). Into pinned memory a D2H copy is
 * asynchronous: read it after zt_backend_sync. */
static inline void zt_backend_copy(zt_backend *be, void *dst, const void *src, size_t bytes,
                                   zt_copy_kind kind, zt_stream s) {
    be->iface->copy(be, dst, src, bytes, kind, s);
}
/* Device memory: [lo, hi) of p is given back, so memory a rank no longer holds stops counting
 * against it: the whole pages inside it on the CPU, the whole granules (2 MiB on an H100) of a
 * large allocation on the CUDA backend. Ordered after everything issued on the compute stream.
 * Its bytes read as zero once committed again (on the CPU at once), and it must be committed
 * before it is written: on a GPU a released granule's memory may meanwhile hold another range's
 * bytes, so a write without a commit corrupts them (a copy into it is refused, an error at the
 * next sync). */
static inline void zt_backend_release(zt_backend *be, void *p, size_t lo, size_t hi) {
    be->iface->release(be, p, lo, hi);
}
/* Device memory: makes a released [lo, hi) usable again, zero-filled, before any work issued
 * on either stream afterwards. On the CPU pages come back on first touch, so this is a no-op;
 * the CUDA backend maps physical memory back into the granules it touches (its own, free, with
 * no driver call in the steady state of training), which can fail (ZT_ERR_NOMEM naming the
 * device and the size). */
static inline zt_status zt_backend_commit(zt_backend *be, void *p, size_t lo, size_t hi) {
    return be->iface->commit(be, p, lo, hi);
}
/* Bytes of device memory [lo, hi) of p that are really held (resident pages inside the range). */
static inline size_t zt_backend_resident_bytes(zt_backend *be, const void *p, size_t lo,
                                               size_t hi) {
    return be->iface->resident_bytes(be, p, lo, hi);
}

/* ---- ordering ---------------------------------------------------------------------------- */

/* An event to order streams with; NULL when none can be made. */
static inline zt_event *zt_backend_event_create(zt_backend *be) {
    return be->iface->event_create(be);
}
static inline void zt_backend_event_destroy(zt_backend *be, zt_event *ev) {
    be->iface->event_destroy(be, ev);
}
/* The event completes when everything issued on s so far has. */
static inline void zt_backend_event_record(zt_backend *be, zt_event *ev, zt_stream s) {
    be->iface->event_record(be, ev, s);
}
/* Work issued on s from now on starts after ev completes (the host does not wait). */
static inline void zt_backend_stream_wait(zt_backend *be, zt_stream s, zt_event *ev) {
    be->iface->stream_wait(be, s, ev);
}
/* The host waits until ev completes: for the work issued on the event's stream before its
 * record, and nothing else, so the device may go on with what was issued after it (the next
 * tile's copies of an offloaded update) while the host computes on what the event covers. An
 * event never recorded is complete. Returns the first asynchronous error as zt_backend_sync
 * does (ZT_ERR_IO naming the device), which it then clears as sync does; on the CUDA backend the
 * wait counts as one of the host's waits (zt_backend_cuda_waits) and is watched as sync's is, so
 * a collective whose peer died ends it with the communicator's error, not a hang. The CPU
 * backend has nothing to wait for. */
static inline zt_status zt_backend_event_wait(zt_backend *be, zt_event *ev) {
    return be->iface->event_wait(be, ev);
}
/* An event that also marks when it completes, for profiling: recorded and destroyed as any
 * event. NULL when none can be made, or the backend has no timing events. The CPU's holds the
 * monotonic clock at its record; the CUDA backend's is a CUDA event with timing. */
static inline zt_event *zt_backend_timer_create(zt_backend *be) {
    return be->iface->timer_create ? be->iface->timer_create(be) : NULL;
}
/* *ms = the time from start's completion to end's, both recorded timers (start first); waits for
 * end to complete. ZT_ERR_IO naming the device when the backend cannot tell. */
static inline zt_status zt_backend_timer_elapsed(zt_backend *be, zt_event *start, zt_event *end,
                                                 double *ms) {
    if (!be->iface->timer_elapsed)
        return zt_error(ZT_ERR_UNSUPPORTED, "backend \"%s\" has no timing events", be->name);
    return be->iface->timer_elapsed(be, start, end, ms);
}

/* Waits for everything issued on every stream; the first asynchronous error, if any. */
static inline zt_status zt_backend_sync(zt_backend *be) { return be->iface->sync(be); }

/* ---- the CUDA backend (kernels/cuda/, in builds with CUDA) -------------------------------------- */

/* The CUDA backend on visible device opts->device_index: ZT_ERR_UNSUPPORTED when no GPU is
 * visible, ZT_ERR_INVALID for an index past the visible ones. Creation makes that device the
 * calling thread's current one (cudaSetDevice), which the ops rely on: one CUDA backend per
 * process, as one rank per GPU has. Activations are stored in their
 * 16-bit type (act_as_f32 is false). Ops, copies and the other calls that return nothing record
 * their first failure, which zt_backend_sync returns as ZT_ERR_IO naming the device. Device
 * allocations of at least four granules (8 MiB on an H100; ZTRAIN_CUDA_VMM_MIN_BYTES changes
 * it) are reserved address ranges over physical granules (CUDA's virtual memory management),
 * whose whole granules release gives back without waiting for the device and commit maps
 * again; smaller ones are cudaMalloc's, and release zeroes them but they stay allocated.
 * ZTRAIN_CUDA_VMM=off makes every allocation cudaMalloc's (docs/gpu.md, "Device memory"). */
zt_status zt_backend_cuda_create(zt_backend **out, const zt_backend_options *opts);
/* cudaGetDeviceCount, 0 on any error. */
int zt_backend_cuda_device_count(void);
/* An entry point of the loaded CUDA module by name (dlsym), loading it first; NULL when there
 * is no module (the reason is left for zt_last_error) or no such symbol. The environment may
 * name another module than the real one, for tests: ZTRAIN_CUDA_EMU=1 loads the emulated CUDA
 * device of the build tree, ZTRAIN_CUDA_MODULE=<path> any file (docs/gpu.md). */
void *zt_backend_cuda_symbol(const char *name);

/* Device memory as a CUDA backend sees it: the physical bytes its ZT_MEM_DEVICE allocations and
 * its own workspaces hold now (a large allocation's mapped granules, including released ones it
 * keeps for the next commit, not its address range) and the most they have held, and the
 * device's free and total bytes (cudaMemGetInfo, which counts other processes and the CUDA
 * context too). */
typedef struct {
    size_t allocated, peak;
    size_t device_free, device_total;
} zt_cuda_memory;

/* ZT_ERR_INVALID for a backend that is not CUDA (and in a build without CUDA). When
 * cudaMemGetInfo fails, an error naming the device, with allocated and peak filled all the same
 * (they are the backend's own counts). */
zt_status zt_backend_cuda_memory(zt_backend *be, zt_cuda_memory *out);

/* The host's waits for a CUDA backend's device since it was made: how many (the step's
 * synchronisation and every other, on every thread), the device-to-host copies, and the
 * milliseconds the calling thread has spent blocked in such waits (on any CUDA backend of the
 * process; another thread's, such as ZeRO's communication thread's, are not the caller's).
 * Over a step of the training thread, wait_ms near zero means the device finished before the
 * host asked (the host issues slower than the device runs: what a CUDA graph would help); near
 * the step's time, the host issued everything and waited for the device. */
typedef struct {
    unsigned long long waits, reads;
    double wait_ms;
    /* How the two streams are ordered (docs/gpu.md, "The communication thread's streams"):
     * work put on the compute stream by a thread other than the one that made the backend
     * (ZeRO's communication thread puts none there), and the compute stream's waits for an
     * event recorded on the communication stream (where the training thread uses a
     * collective's result). */
    unsigned long long compute_issued_elsewhere, compute_waits_on_comm;
} zt_cuda_waits;

/* ZT_ERR_INVALID for a backend that is not CUDA (and in a build without CUDA). */
zt_status zt_backend_cuda_waits(zt_backend *be, zt_cuda_waits *out);

/* The CUDA backend's own device memory besides its callers' allocations, stated here so that an
 * estimate made without a GPU (admission.h) counts what the backend will take: cuBLASLt's
 * workspace and the two-pass sums' partials and totals, taken at creation; and scratch buffers
 * that grow to a quarter more than their largest request (zt_cuda_scratch_bytes): the tokens or
 * targets of a forward, the embedding backward's token buckets (3 · rows + 2 ints), the
 * per-channel gradient sums' partials, one row of channels per tile of at most
 * ZT_CUDA_CHANNEL_TILES row tiles: of at least ZT_CUDA_CHANNEL_MIN_ROWS rows for the bias
 * gradients' two passes, of at least ZT_CUDA_CHANNEL_FUSED_MIN_ROWS in the norms' fused
 * backward; and one linear layer's bias gradient in
 * fp32 (cuBLASLt's BGRADA / BGRADB epilogue writes it there before it is added). The kernels
 * check these against their own constants. */
#define ZT_CUDA_CUBLAS_WORKSPACE_BYTES ((uint64_t)32 << 20)
/* The granule of CUDA's virtual memory management on the GPUs ztrain is built for (2 MiB on
 * H100 and H200, cuMemGetAllocationGranularity) and the size from which an allocation is a
 * reserved range of whole granules (four of them; ZTRAIN_CUDA_VMM_MIN_BYTES moves it at run
 * time): what an estimate made without a GPU rounds such allocations to. */
#define ZT_CUDA_VMM_GRANULE_BYTES ((uint64_t)2 << 20)
#define ZT_CUDA_VMM_MIN_BYTES (4 * ZT_CUDA_VMM_GRANULE_BYTES)
#define ZT_CUDA_SUMS_BYTES ((uint64_t)(2 * 1024 + 2) * sizeof(double))
#define ZT_CUDA_CHANNEL_TILES 1024
#define ZT_CUDA_CHANNEL_MIN_ROWS 64
#define ZT_CUDA_CHANNEL_FUSED_MIN_ROWS 32
static inline uint64_t zt_cuda_scratch_bytes(uint64_t request) { return request + request / 4; }

/* ---- the CPU backend ---------------------------------------------------------------------- */

/* The CPU backend (kernels/cpu/backend_cpu.c). */
zt_status zt_backend_cpu_create(zt_backend **out, const zt_backend_options *opts);

/* The instruction-set path of the CPU optimizer kernels (adam_update, sgd_update,
 * adam_update_mixed): "avx512", "avx2" or "portable". It is the widest this CPU has, unless the
 * environment variable ZTRAIN_OPTIM_ISA, read at the first call, names a narrower one the CPU has;
 * every path gives the same bits. A static string. */
const char *zt_backend_cpu_optim_isa(void);

/* The library the CPU backend's matrix products run in: "onednn" (oneDNN, which generates its
 * kernels for the instruction sets the CPU reports) when the build has it, else "openblas"; the
 * environment variable ZTRAIN_GEMM ("openblas" or "onednn"), read at the first product, picks one.
 * zt_backend_cpu_create refuses (ZT_ERR_INVALID, naming the variable, its value and the accepted
 * values) a ZTRAIN_GEMM, ZTRAIN_GEMM_BF16, ZTRAIN_OPTIM_ISA or ZTRAIN_CAST_ISA it does not
 * understand. A static string. */
const char *zt_backend_cpu_matmul(void);

/* Whether the CPU backend runs a bf16 job's dense-layer products on bf16 instructions (oneDNN's
 * bf16 matmul, fp32 accumulation) instead of fp32 ones. Then those products, and what is computed
 * from them, agree with the fp32 path within bf16 tolerance rather than bit for bit. On by default
 * where the CPU has AMX-BF16 (several times its fp32 rate), off where it has only AVX512_BF16 (no
 * faster than fp32 there); ZTRAIN_GEMM_BF16=on|off overrides it on CPUs with AVX512_BF16. */
bool zt_backend_cpu_bf16_matmul(void);

#endif
