/* The CUDA backend's internals shared by backend_cuda.c, ops_cuda.c and the kernel files, which
 * make up the shared module libztrain_cuda.so (kernels/backend.c loads it on first use, so that
 * programs running on the CPU never map the CUDA libraries): the
 * state behind zt_backend.impl, the one generator of the CUDA / cuBLASLt check macros, the GPU
 * count (cuda_driver.c, which NCCL's nccl_comm.c uses too), the growable scratch buffers and the op entry points, one per zt_ops field
 * with that field's signature. C and CUDA C++ both include it. */
#ifndef ZTRAIN_CUDA_BACKEND_H
#define ZTRAIN_CUDA_BACKEND_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "cuda_host.h"
#include "ztrain/backend.h"
#include "ztrain/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch buffers that grow to the largest request and are then reused: a model's first step
 * sizes them, later steps allocate nothing. Each is used only on the compute stream. */
typedef enum {
    ZT_CUDA_SCRATCH_W16 = 0, /* a weight (and bias) rounded to the activations' 16-bit type */
    ZT_CUDA_SCRATCH_TOKENS,  /* tokens or targets copied from the host */
    ZT_CUDA_SCRATCH_BUCKETS, /* the embedding backward's token buckets */
    ZT_CUDA_SCRATCH_PARTIALS, /* per-channel sums' partials over row tiles (channel_sums.cuh) */
    ZT_CUDA_SCRATCH_BIAS_GRAD, /* a bias gradient from cuBLASLt's epilogue, fp32 (linear.cu) */
    ZT_CUDA_SCRATCHES
} zt_cuda_scratch_slot;

/* Pinned staging blocks at most: 1 MB doubling to 256 MB, so this many cover any step's
 * uploads. */
enum { ZT_CUDA_STAGE_BLOCKS = 32 };

/* The cuBLASLt workspace: what llm.c found Hopper's kernels to want. */
enum { ZT_CUDA_CUBLAS_WORKSPACE = 32 << 20 };

/* ZTRAIN_ATTENTION: unset or "auto" lets the attention op choose cuDNN where it applies and the
 * flash kernel otherwise; "flash" runs the flash kernel everywhere; "cudnn" insists on cuDNN (a
 * call it does not take is then the backend's error), so gpu-check can check each on one GPU. */
typedef enum { ZT_CUDA_ATTN_AUTO, ZT_CUDA_ATTN_FLASH, ZT_CUDA_ATTN_CUDNN } zt_cuda_attention_policy;

/* The policy ZTRAIN_ATTENTION asks for; ZT_ERR_INVALID naming the variable for another value. */
zt_status zt_cuda_attention_policy_of_env(zt_cuda_attention_policy *out);

/* ZTRAIN_CUDA_BIAS_GRAD: unset or "auto" has the linear ops take the bias gradient from the
 * weight-gradient GEMM's epilogue (BGRADA / BGRADB) where cuBLASLt takes it for the shape and the
 * row-tile sums (channel_sums.cuh) where it refuses; "sums" runs the sums everywhere; "epilogue"
 * insists on the epilogue (a refusal is then the backend's error), so gpu-check can check each. */
typedef enum { ZT_CUDA_BIAS_GRAD_AUTO, ZT_CUDA_BIAS_GRAD_SUMS, ZT_CUDA_BIAS_GRAD_EPILOGUE }
    zt_cuda_bias_grad_policy;

/* The policy ZTRAIN_CUDA_BIAS_GRAD asks for (backend_cuda.c); ZT_ERR_INVALID naming the
 * variable and the values it takes for another value. */
zt_status zt_cuda_bias_grad_policy_of_env(zt_cuda_bias_grad_policy *out);

/* Communicators that may watch one backend's streams at once (stream_watch.c): the data-parallel group, the tensor-parallel one
 * and its kv-head sharing group, a pipeline's world and tied-embedding groups, with room. */
enum { ZT_CUDA_WATCHERS = 16 };

typedef struct {
    zt_backend be;
    char device_name[256];
    cudaStream_t stream[ZT_STREAMS];
    cudaEvent_t joined[ZT_STREAMS]; /* sync: where the other streams are, for the compute one */
    cublasLtHandle_t lt;
    void *lt_workspace;
    struct zt_cuda_matmul_plans *plans; /* cuBLASLt plans per shape (matmul.cu), made on first use */
    double *sums_dev;  /* [2 · ZT_CUDA_SUM_BLOCKS + 2]: the two-pass sums' partials and totals */
    double *sums_host; /* [2], pinned: the totals read back */
    void *scratch[ZT_CUDA_SCRATCHES];
    size_t scratch_bytes[ZT_CUDA_SCRATCHES];
    /* The host side of the token buckets, grown like the device scratch. */
    void *bucket_host;
    size_t bucket_host_bytes;
    /* Pinned staging for uploads of host data (zt_cuda_upload_i32): blocks handed out in turn
     * and taken back all at once by sync, when every copy from them has run. The device reads
     * pinned memory when the copy runs, so a block is never reused before; and a copy from
     * pageable memory may make CUDA wait for the stream, a host round trip. */
    struct zt_cuda_stage_block {
        char *p;
        size_t bytes, used;
    } stage[ZT_CUDA_STAGE_BLOCKS];
    int stage_at;                /* the block in use */
    unsigned long long staged;   /* uploads staged since creation */
    /* Held from staging to queueing the copy, and by sync while it notes what it waits for:
     * sync takes the blocks back only if nothing was staged while it waited (another thread
     * may upload meanwhile, ZeRO's offload). */
    pthread_mutex_t stage_lock;
    /* Released ranges: release and commit come from the ZeRO communication thread and the
     * main thread at once (stage 3 with overlap_comm), and the set reallocates as it grows. */
    pthread_mutex_t released_lock;
    zt_cuda_ranges released;
    /* The parameters' 16-bit twins (zt_param_view): weights_round makes every op read the fp32
     * values, the linear ops rounding each weight into scratch even where the ctx has its twin
     * (ZTRAIN_CUDA_WEIGHTS=round, read at creation; be->reads_param16 is then false);
     * weights_rounded counts the products that did. */
    bool weights_round;
    unsigned long long weights_rounded;
    /* Which attention runs (attention/attention.c): ZTRAIN_ATTENTION, read at creation. */
    zt_cuda_attention_policy attention;
    /* How the linear ops take a bias gradient (linear.cu): ZTRAIN_CUDA_BIAS_GRAD, read at
     * creation. */
    zt_cuda_bias_grad_policy bias_grad;
    /* Since creation: the host's waits for the device this module made (zt_cuda_wait) and its
     * device-to-host copies. Relaxed counters, cheap enough for a GPU run (each thread's time
     * in its waits is its own: zt_cuda_wait_end). */
    unsigned long long waits, reads;
    /* zt_cuda_waits' stream order: the thread that made the backend, the compute stream's work
     * that other threads issued, and its waits for events of the communication stream. */
    pthread_t owner;
    unsigned long long compute_elsewhere, compute_waits_on_comm;
    /* Device bytes held by allocations, scratch and workspaces (zt_backend_cuda_memory): the
     * physical granules mapped for the large allocations (memory/device_vmm.c), not their address
     * ranges. */
    size_t allocated, peak;
    /* The large device allocations: reserved address ranges over physical granules that
     * release gives back and commit maps again (memory/device_vmm.c); NULL when the driver has no
     * virtual-memory management, and then every allocation is cudaMalloc's. */
    struct zt_cuda_vmm *vmm;
    /* The first failure of a call that cannot return one (an op, a copy), reported by sync. */
    pthread_mutex_t lock;
    char first_error[512];
    /* Communicators whose collectives are posted on the streams (stream_watch.c). */
    struct zt_cuda_watcher {
        zt_status (*poll)(void *ctx, long covered);
        long (*mark)(void *ctx);
        void *ctx;
        /* Never reused within the process (stream_watch.c): a snapshot matches a watcher by it,
         * so a communicator that replaced another at the same address between the snapshot and
         * the settle is not given the other's sequence. */
        unsigned long long id;
    } watch[ZT_CUDA_WATCHERS];
    int watchers;
} zt_cuda_state;

static inline zt_cuda_state *zt_cuda_of(const zt_ctx *x) { return (zt_cuda_state *)x->be->impl; }
/* Counts work issued on stream s for zt_cuda_waits: on the compute stream from a thread other
 * than the backend's maker. */
static inline void zt_cuda_note_issue(zt_cuda_state *st, zt_stream s) {
    if (s == ZT_STREAM_COMPUTE && !pthread_equal(pthread_self(), st->owner))
        __atomic_add_fetch(&st->compute_elsewhere, 1, __ATOMIC_RELAXED);
}

/* The stream an op is issued on: its ctx's (ops.h, zt_ctx.stream). */
static inline cudaStream_t zt_cuda_stream(const zt_ctx *x) {
    zt_cuda_state *st = zt_cuda_of(x);
    zt_cuda_note_issue(st, x->stream);
    return st->stream[x->stream];
}

/* Records a failed call as the backend's first error, unless one is already recorded: lib is
 * "CUDA" or "cuBLASLt", call the statement as written. Thread-safe. */
void zt_cuda_fail(zt_backend *be, const char *lib, const char *call, const char *msg,
                  const char *file, int line);

/* The one generator: evaluates expr, a call returning a status of type `type` that is `ok` on
 * success, and on failure runs on_error with zt_msg_ holding the library's text for the status. */
#define ZT_GPU_CALL_(type, ok, errstr, expr, on_error)                                             \
    do {                                                                                           \
        type zt_rc_ = (expr);                                                                      \
        if (zt_rc_ != (ok)) {                                                                      \
            const char *zt_msg_ = errstr(zt_rc_);                                                  \
            on_error;                                                                              \
        }                                                                                          \
    } while (0)

/* For calls that cannot return a status (ops, copies): the failure is recorded for sync. */
#define ZT_GPU_RECORD_(be, lib, type, ok, errstr, expr)                                            \
    ZT_GPU_CALL_(type, ok, errstr, expr, zt_cuda_fail((be), lib, #expr, zt_msg_, __FILE__, __LINE__))
#define ZT_CUDA_CHECK(be, expr)                                                                    \
    ZT_GPU_RECORD_(be, "CUDA", cudaError_t, cudaSuccess, cudaGetErrorString, expr)
#define ZT_CUBLAS_CHECK(be, expr)                                                                  \
    ZT_GPU_RECORD_(be, "cuBLASLt", cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString, \
                   expr)
/* After a kernel launch: a bad launch configuration shows here, a fault inside only at sync. */
#define ZT_CUDA_LAUNCHED(be) ZT_CUDA_CHECK(be, cudaGetLastError())

/* For calls at creation, which return a status: ZT_ERR_UNSUPPORTED naming the device index. */
#define ZT_CUDA_TRY(dev, expr)                                                                     \
    ZT_GPU_CALL_(cudaError_t, cudaSuccess, cudaGetErrorString, expr,                               \
                 return zt_error(ZT_ERR_UNSUPPORTED, "cuda device %d: %s: %s", (dev), #expr,       \
                                 zt_msg_))
#define ZT_CUBLAS_TRY(dev, expr)                                                                   \
    ZT_GPU_CALL_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString, expr,             \
                 return zt_error(ZT_ERR_UNSUPPORTED, "cuda device %d: %s: %s", (dev), #expr,       \
                                 zt_msg_))

/* Every wait of the host for a stream goes through here (counted); and every device-to-host copy
 * is counted by zt_cuda_count_read. zt_cuda_round_trips gives both counts ([0] waits, [1]
 * copies back) since the backend began; test_cuda_emu_syncs finds it by name
 * (zt_backend_cuda_symbol) and checks it against the emulated runtime's own counts. */
void zt_cuda_wait(zt_backend *be, cudaStream_t s);
/* Around every other host wait for the device: begin counts it and returns the time, end adds
 * the time blocked to the calling thread's (zt_backend_cuda_waits' wait_ms). */
unsigned long long zt_cuda_wait_begin(zt_backend *be);
void zt_cuda_wait_end(unsigned long long t0);

/* Communicators that post collectives on the backend's streams without waiting for them
 * (nccl_comm.c) watch its host waits (stream_watch.c): while one is registered, a host wait
 * polls the stream instead of blocking, and between queries calls poll(ctx, -1), which
 * returns ZT_OK while the posted work is healthy and fails (the communicator aborted, the error
 * set) on NCCL's asynchronous error or past its deadline; the failure becomes the backend's,
 * reported by sync. mark(ctx) is the communicator's posting sequence (operations posted so far),
 * read from any thread; poll(ctx, covered ≥ 0) says that a wait which began when mark gave
 * covered has finished and covered every stream (sync), so the work posted up to it is
 * complete, and only that: another thread may have posted more since. Registration fails past
 * ZT_CUDA_WATCHERS communicators. */
typedef zt_status (*zt_cuda_watch_fn)(void *ctx, long covered);
typedef long (*zt_cuda_mark_fn)(void *ctx);
zt_status zt_cuda_watch_add(zt_backend *be, zt_cuda_watch_fn poll, zt_cuda_mark_fn mark,
                            void *ctx);
void zt_cuda_watch_remove(zt_backend *be, void *ctx);
/* The host wait for s when communicators watch (true), else false: the caller synchronises. */
bool zt_cuda_watched_wait(zt_backend *be, cudaStream_t s);
/* The host wait for event e, watched as zt_cuda_watched_wait's (or cudaEventSynchronize when no
 * communicator watches): a posted collective whose peer died ends it in the communicator's
 * abort and an error (returned, and recorded as the backend's) instead of a wait forever. */
zt_status zt_cuda_watched_event_wait(zt_backend *be, cudaEvent_t e);
/* Each watcher's mark, taken before a wait that will cover every stream (before the streams are
 * joined), and given back to them by zt_cuda_watch_settled once it has: to the watchers
 * registered when the marks were taken and still registered, by their registration's id (a
 * watcher removed meanwhile and one registered since, at the same ctx or not, are only looked
 * at, as during a wait). */
typedef struct {
    int n;
    unsigned long long id[ZT_CUDA_WATCHERS];
    long seq[ZT_CUDA_WATCHERS];
} zt_cuda_watch_marks;
void zt_cuda_watch_mark(zt_backend *be, zt_cuda_watch_marks *m);
void zt_cuda_watch_settled(zt_backend *be, const zt_cuda_watch_marks *m);
void zt_cuda_count_read(zt_backend *be);
void zt_cuda_round_trips(zt_backend *be, unsigned long long out[2]);

/* Counts bytes of device memory taken (a positive delta) or given back (negative). */
void zt_cuda_count(zt_cuda_state *st, long long delta);

/* Whether an op that uses the backend's shared scratch (the slots below, the two-pass sums'
 * partials, cuBLASLt's workspace) may run with ctx x: only on the compute stream (ops.h,
 * zt_ctx.stream). Otherwise false, after recording a failure naming `op`. */
bool zt_cuda_on_compute(const zt_ctx *x, const char *op);

/* Device scratch of at least bytes in the slot (contents undefined), or NULL after recording the
 * failure. Growing waits for the compute stream, whose earlier work may still read the old one. */
void *zt_cuda_scratch(const zt_ctx *x, zt_cuda_scratch_slot slot, size_t bytes);
/* n int32 values of host memory copied to the slot's device scratch, in stream order, through
 * pinned staging (the host buffer may be reused when the call returns; no host wait). */
const int32_t *zt_cuda_upload_i32(const zt_ctx *x, zt_cuda_scratch_slot slot, const int32_t *host,
                                  size_t n);
/* Host scratch for the token buckets (ZT_ERR_NOMEM recorded and NULL when it cannot grow). */
void *zt_cuda_bucket_host(const zt_ctx *x, size_t bytes);

/* The second pass of the two-pass sums (optim.cu): out[j], j < count, is the sum of the first
 * `blocks` partials in row j of sums_dev (rows of ZT_CUDA_SUM_BLOCKS), in a fixed order; waits
 * for the compute stream. */
void zt_cuda_sum_totals(const zt_ctx *x, unsigned blocks, int count, double *out);
/* The same second pass into out[0 .. count), device memory, in stream order without a wait. */
void zt_cuda_sum_totals_to(const zt_ctx *x, unsigned blocks, int count, double *out);
/* The same added to out[0 .. count) (out[j] + the total, one double addition). */
void zt_cuda_sum_totals_add(const zt_ctx *x, unsigned blocks, int count, double *out);

/* Frees the cuBLASLt plans (matmul.cu), at the backend's end. */
void zt_cuda_matmul_plans_free(zt_cuda_state *st);
/* Since the backend began: products run through the plan table, heuristic queries made, and
 * products run with a GELU epilogue (GELU_AUX_BIAS or DGELU). What shows that a step reuses its
 * plans and that GPT-2's MLP takes the fused path; test_ops finds it by name through
 * zt_backend_cuda_symbol. */
void zt_cuda_matmul_counts(zt_backend *be, unsigned long long *products,
                           unsigned long long *heuristics, unsigned long long *gelu_products);

/* Products since the backend began whose 16-bit weight was rounded from fp32 into scratch
 * rather than read from its twin (zt_param16): 0 for a mixed-precision model whose twin is in
 * place. What shows that a job's GEMMs read the twin; the trainer records it and test_ops reads
 * it by name through zt_backend_cuda_symbol. */
unsigned long long zt_cuda_weights_rounded(zt_backend *be);

/* The module's entry points, which kernels/backend.c finds with dlsym (the public
 * zt_backend_cuda_* calls of backend.h are its wrappers). */
zt_status zt_cuda_backend_create(zt_backend **out, const zt_backend_options *opts);
int zt_cuda_device_count(void);
zt_status zt_cuda_memory_of(zt_backend *be, zt_cuda_memory *out);
zt_status zt_cuda_waits_of(zt_backend *be, zt_cuda_waits *out);
/* What kernels/gpu_info.c asks for ztrain/gpu.h (by name, through zt_backend_cuda_symbol):
 * properties (a zt_gpu_props *), free and total memory of a visible device, and making it the
 * calling thread's current one. */
zt_status zt_cuda_device_props(int index, zt_gpu_props *out);
zt_status zt_cuda_device_mem(int index, size_t *free_bytes, size_t *total_bytes);
void zt_cuda_device_bind(int index);

/* The GPUs this process sees (cuda_driver.c): *count, 0 without a GPU; an error saying why when
 * the runtime cannot tell, a driver too old for this build named with both versions. */
zt_status zt_cuda_visible(int *count);

/* The op table (ops_cuda.c). */
const zt_ops *zt_cuda_ops(void);

/* ---- op entry points, each with the signature of its zt_ops field (ops.h) ------------------- */

void zt_cuda_embedding_forward(const zt_ctx *x, void *out, const int32_t *tokens,
                               const float *wte, const float *wpe, int B, int T, int C);
void zt_cuda_embedding_backward(const zt_ctx *x, float *dwte, float *dwpe, const void *dout,
                                const int32_t *tokens, int B, int T, int C);
void zt_cuda_layernorm_forward(const zt_ctx *x, void *out, float *mean, float *rstd,
                               const void *inp, const float *w, const float *b, int N, int C);
void zt_cuda_layernorm_backward(const zt_ctx *x, void *dinp, float *dw, float *db,
                                const void *dout, const void *inp, const float *w,
                                const float *mean, const float *rstd, int N, int C);
void zt_cuda_rmsnorm_forward(const zt_ctx *x, void *out, float *rstd, const void *inp,
                             const float *w, float eps, int N, int C);
void zt_cuda_rmsnorm_backward(const zt_ctx *x, void *dinp, float *dw, const void *dout,
                              const void *inp, const float *w, const float *rstd, int N, int C);
void zt_cuda_rope_forward(const zt_ctx *x, void *xq, const float *cos, const float *sin, int B,
                          int T, int n_heads, int head_dim, size_t row_stride);
void zt_cuda_rope_backward(const zt_ctx *x, void *dxq, const float *cos, const float *sin, int B,
                           int T, int n_heads, int head_dim, size_t row_stride);
void zt_cuda_linear_forward(const zt_ctx *x, void *out, const void *inp, const float *w,
                            const float *bias, const void *residual, int N, int C, int OC,
                            zt_weight_layout layout);
void zt_cuda_linear_backward(const zt_ctx *x, void *dinp, float *dw, float *dbias,
                             const void *dout, const void *inp, const float *w, int N, int C,
                             int OC, zt_weight_layout layout, bool accumulate_dinp);
void zt_cuda_linear_gelu_forward(const zt_ctx *x, void *out, void *pre, const void *inp,
                                 const float *w, const float *bias, int N, int C, int OC,
                                 zt_weight_layout layout);
void zt_cuda_linear_backward_gelu(const zt_ctx *x, void *dpre, float *dw, float *dbias,
                                  const void *dout, const void *inp, const void *pre,
                                  const float *w, int N, int C, int OC, zt_weight_layout layout);
/* How the linear ops' first bias gradient in this process was taken: "epilogue" (cuBLASLt's
 * BGRADA / BGRADB on the weight-gradient GEMM) or "sums" (the row-tile sums), NULL before any;
 * a static string, reported once on stderr with the reason. Found by name
 * (zt_backend_cuda_symbol). */
const char *zt_cuda_bias_grad_choice(void);
void zt_cuda_attention_forward(const zt_ctx *x, const zt_attn_shape *s, void *out, float *att,
                               const void *q, const void *k, const void *v);
void zt_cuda_attention_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk,
                                void *dv, float *scratch, const void *dout, const void *out,
                                const void *q, const void *k, const void *v, const float *att);
/* The implementations behind the attention entries (attention/attention.c chooses): ztrain's
 * flash-style kernel (attention/flash_attention.cu), whose backward reads the forward's output
 * and whose att and scratch are [B,n_head,T] (zt_attn_state_floats with attn_lse). */
void zt_cuda_flash_attention_forward(const zt_ctx *x, const zt_attn_shape *s, void *out,
                                     float *lse, const void *q, const void *k, const void *v);
void zt_cuda_flash_attention_backward(const zt_ctx *x, const zt_attn_shape *s, void *dq, void *dk,
                                      void *dv, float *scratch, const void *dout, const void *out,
                                      const void *q, const void *k, const void *v,
                                      const float *lse);
/* The attention implementation this process chose first ("flash", "cudnn"), NULL before any
 * attention ran; a static string. Found by name (zt_backend_cuda_symbol). */
const char *zt_cuda_attention_choice(void);
void zt_cuda_gelu_forward(const zt_ctx *x, void *out, const void *inp, size_t n);
void zt_cuda_gelu_backward(const zt_ctx *x, void *dinp, const void *inp, const void *dout,
                           size_t n);
void zt_cuda_silu_mul_forward(const zt_ctx *x, void *out, const void *gate, const void *up,
                              size_t n);
void zt_cuda_silu_mul_backward(const zt_ctx *x, void *dgate, void *dup, const void *dout,
                               const void *gate, const void *up, size_t n);
void zt_cuda_add(const zt_ctx *x, void *out, const void *a, const void *b, size_t n);
void zt_cuda_softmax_xent(const zt_ctx *x, float *losses, void *logits, const int32_t *targets,
                          int N, int V, float grad_scale);
void zt_cuda_xent_partial_stats(const zt_ctx *x, float *stats, const void *logits,
                                const int32_t *targets, int N, int V);
void zt_cuda_xent_partial_combine(const zt_ctx *x, float *logz, float *losses,
                                  const float *stats, const int32_t *targets, int N, int shards);
void zt_cuda_xent_partial_grad(const zt_ctx *x, void *logits, const float *logz,
                               const int32_t *targets, int N, int V, float grad_scale);
void zt_cuda_adam_update(const zt_ctx *x, float *p, const float *g, float *m, float *v, size_t n,
                         const zt_adam_args *a);
void zt_cuda_sgd_update(const zt_ctx *x, float *p, const float *g, float *buf, size_t n,
                        const zt_sgd_args *a);
void zt_cuda_adam_update_mixed(const zt_ctx *x, float *master, const void *grad,
                               zt_dtype grad_type, float grad_mul, float *m, float *v,
                               uint16_t *param16, zt_dtype param_type, size_t n,
                               const zt_adam_args *a);
void zt_cuda_sgd_update_mixed(const zt_ctx *x, float *master, const void *grad,
                              zt_dtype grad_type, float grad_mul, float *buf, uint16_t *param16,
                              zt_dtype param_type, size_t n, const zt_sgd_args *a);
void zt_cuda_lamb_apply_mixed(const zt_ctx *x, float *p, const float *m, const float *v, size_t n,
                              const zt_lamb_args *a, const float *step, uint16_t *param16,
                              zt_dtype param_type);
void zt_cuda_lamb_moments(const zt_ctx *x, const float *p, const float *g, float *m, float *v,
                          size_t n, const zt_lamb_args *a, double sums[2]);
void zt_cuda_lamb_moments_to(const zt_ctx *x, const float *p, const float *g, float *m,
                             float *v, size_t n, const zt_lamb_args *a, double *sums);
void zt_cuda_lamb_apply(const zt_ctx *x, float *p, const float *m, const float *v, size_t n,
                        const zt_lamb_args *a, const float *step);
void zt_cuda_lamb_steps(const zt_ctx *x, float *steps, const double *sums, size_t n,
                        const zt_lamb_step_args *a);
double zt_cuda_sum_squares(const zt_ctx *x, const float *v, size_t n);
void zt_cuda_scale(const zt_ctx *x, float *v, size_t n, float s);
void zt_cuda_to_half(const zt_ctx *x, uint16_t *dst, const float *src, size_t n, zt_dtype t);
void zt_cuda_from_half(const zt_ctx *x, float *dst, const uint16_t *src, size_t n, zt_dtype t);
void zt_cuda_round_to(const zt_ctx *x, float *v, size_t n, zt_dtype t);
void zt_cuda_accumulate_half(const zt_ctx *x, uint16_t *dst, const float *src, size_t n,
                             zt_dtype t);
double zt_cuda_sum_squares_half(const zt_ctx *x, const uint16_t *v, size_t n, zt_dtype t);
void zt_cuda_sum_to(const zt_ctx *x, double *out, const void *v, size_t n, zt_dtype t,
                    bool squares);
void zt_cuda_weighted_sum_to(const zt_ctx *x, double *out, const double *parts,
                             const double *weights, int n);
/* The sum of the squares of v (fp32, bf16 or fp16), as sum_to computes it, read back with one
 * wait: sum_squares and sum_squares_half. */
double zt_cuda_squares_now(const zt_ctx *x, const void *v, size_t n, zt_dtype t);

#ifdef __cplusplus
}
#endif

#endif
