/* The ZeRO partitioner (internal to the engine): which slice of the flat buffers each rank owns,
 * and the communication that stages 0–3 need around the model's forward, backward and step.
 * zero.c holds the partition state, zero_gather.c the parameter gathering, zero_buckets.c the
 * gradient buckets and their reduction, zero_comm_thread.c the communication thread and
 * zero_optim.c the partition's optimizer state and update; all memory is the model's backend's.
 *
 * The flat buffers (n_padded elements, a multiple of 16·world) split into world equal slices;
 * rank r owns [r·part, (r+1)·part). Stage 0 all-reduces gradients and keeps everything whole;
 * stage 1 reduce-scatters gradients at the boundary and keeps the optimizer state of its slice;
 * stage 2 reduce-scatters buckets of gradients as the backward produces them into a slice-sized
 * accumulator, releasing the rest; stage 3 also releases the parameters it does not own, gathering
 * each layer just before its use (tensors under stage3_param_persistence_threshold stay whole). */
#ifndef ZTRAIN_ZERO_H
#define ZTRAIN_ZERO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/comm.h"
#include "ztrain/engine.h"
#include "ztrain/model.h"
#include "ztrain/optimizer.h"
#include "ztrain/offload.h"

typedef struct {
    size_t off[2], len[2];
    int n;
} zt_zero_segment;

/* Work for the communication thread: reduce-scatter a gradient range, or gather a parameter range. */
typedef struct {
    enum { ZT_ZERO_REDUCE, ZT_ZERO_GATHER } kind;
    size_t lo, hi;
} zt_zero_job;

enum { ZT_ZERO_QUEUE = 64, ZT_ZERO_CHUNK = 1 << 16 };

/* The offloaded update on a GPU stages its tiles through this many sets of pinned host buffers,
 * so that one tile's copies run while the host updates another (zero_optim.c). */
enum { ZT_ZERO_TILE_SLOTS = 2 };

/* One set: a tile's gradients (g) and parameters (p, fp32 ones copied in with the gradients; in
 * mixed precision the host writes the 16-bit ones there), and the event recorded after the
 * copies into it, which the host waits for before it reads them. */
typedef struct {
    void *g, *p;
    zt_event *copied;
} zt_zero_tile_slot;

/* With overlap_comm (stage 2/3, several ranks) one thread per rank runs the collectives the
 * hooks queue, in order, so they overlap the compute of the following layers; stage 3 also
 * prefetches the next layer's parameters. Every rank queues the same sequence, so the ranks'
 * collectives still match one for one. The main thread waits for a job only when it needs its
 * result, and drains the queue before it talks to the communicator itself. On a device with
 * streams the job's collective runs on the communication stream: it starts after the compute
 * issued before it was queued (its `ready` event), and compute that needs its result waits for
 * its `done` event; on the CPU both are no-ops, every op having finished when it returns. */
typedef struct {
    bool running;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    zt_zero_job queue[ZT_ZERO_QUEUE];
    zt_event *ready[ZT_ZERO_QUEUE], *finished[ZT_ZERO_QUEUE]; /* per queue slot */
    uint64_t submitted, completed; /* job sequence numbers */
    /* The jobs up to this one have had their ranges let go: a reduction that ran here leaves
     * its gradients' range to the training thread, which lets it go once the compute stream
     * waits for the job (zt_zero_wait_for), so that the release is ordered after the job's
     * work on the communication stream. */
    uint64_t released;
    /* ZeRO's ctx on the communication stream: the jobs' own ops (adds, conversions) run there,
     * in order with their collectives, and the thread issues nothing on the compute stream. */
    zt_ctx ctx;
    bool stop;
} zt_zero_comm_thread;

typedef struct {
    int stage, rank, world;
    int job_rank;               /* this process's rank in the job (rank is its place in comm, the
                                   data-parallel group): what messages and offload directories
                                   name; set by the caller after zt_zero_init */
    zt_comm *comm;              /* NULL when world == 1 */
    zt_model *model;
    zt_backend *be;             /* the model's: every buffer below is its device memory */
    zt_ctx ctx;                 /* ZeRO's own arithmetic on it, in fp32 */
    size_t part;                /* slice length */
    size_t own_lo, own_hi;      /* this rank's slice */
    float *grad_acc;            /* stages 2, 3 in fp32 or with accum32: reduced gradients of
                                   the slice [part] */
    size_t bucket_size;
    size_t pend_lo, pend_hi;    /* stages 2, 3: ready gradients not yet reduced */
    zt_zero_segment *segments;  /* per layer + 1 (index 0: the outer tensors) */
    bool *persistent;           /* stage 3: per model tensor, kept whole */
    /* Stage 3 in fp32: the values of the tensors kept whole, back to back in a small buffer of
     * their own [kept_n] (tensor t's from kept_at[t]), current on every rank. The flat buffer
     * holds them only while their layer is in use, so that they pin none of the granules the
     * large tensors around them give back (zero_gather.c); NULL without such tensors. */
    float *kept;
    size_t kept_n, *kept_at;
    zt_status error;            /* first failure inside a model hook or the comm thread */
    char error_msg[512];        /* its message (the comm thread's own is thread-local) */
    zt_zero_comm_thread ct;
    bool prefetch;              /* stage 3: gather the next layer while this one computes */
    uint64_t *prefetched;       /* per layer + 1: sequence number of its queued gather, or 0 */
    uint64_t last_reduce;       /* sequence number of the last queued gradient bucket */
    /* Mixed precision (dtype bf16 or fp16): the parameters and gradients live in 16 bits and the
     * model's fp32 buffers become a working copy of the layers in use; fp32 master weights of the
     * slice feed the optimizer and are rounded to nearest even into the 16-bit parameters. On a
     * backend whose ops read the 16-bit twin (backend.h, reads_param16) a step leaves the fp32
     * parameters unfilled, and on one whose ops write 16-bit gradients (writes_grad16, grads16
     * below) the fp32 gradients too. */
    bool half;
    zt_dtype dtype;             /* storage type of parameters and gradients */
    zt_dtype comm_dtype;        /* values are rounded to this before they are communicated */
    uint16_t *p16;              /* [n_padded] 16-bit parameters (stage 3: the slice resident) */
    uint16_t *g16;              /* stages 0, 1: [n_padded] 16-bit gradients; stages 2, 3 with
                                   grads16: the backward's, reserved, held per bucket */
    uint16_t *gacc16;           /* stages 2, 3: [part] reduced 16-bit gradients of the slice */
    float *master;              /* [master_n] fp32 master weights (stage 0: everything) */
    size_t master_n, master_base;
    float *chunk;               /* [ZT_ZERO_CHUNK] staging for the step's conversions */
    /* p16 as the model's ctx sees it (ops.h, zt_param16): the 16-bit twin of model->params
     * that a backend's ops read. Wherever a range of the fp32 working copy is in place, p16
     * holds the same values there (stage 3 gathers the 16-bit parameters first and widens
     * them), so the twin is never stale; where the backend reads twins the step fills no fp32
     * copy at all, and the layers gathered for a checkpoint or an export are still widened. */
    zt_param16 twin;
    /* On a backend whose ops accumulate into 16-bit gradients (backend.h, writes_grad16), at
     * stages 0-1, and from stage 2 where the gradients are reduced in their own type
     * (communication_data_type the training type): g16 as the model's ctx sees it (ops.h,
     * zt_grad16), so the backward writes no fp32 gradient at all (grads16 true; the model's
     * fp32 gradients stay released) and from stage 2 each bucket is reduce-scattered where the
     * backward wrote it. */
    zt_grad16 gtwin;
    bool grads16;
    /* Mixed precision with data_types.grad_accum_dtype "fp32" (stages 1-3, as DeepSpeed's
     * BF16_Optimizer and ZeRO optimizers take it): the micro-steps' gradients add up in fp32 —
     * at stage 1 in the model's fp32 gradients, held whole; from stage 2 each reduced bucket in
     * grad_acc — and the sum is rounded into the 16-bit gradients once, at the boundary
     * (zt_zero_reduce_gradients_half), so no micro-step's addition is rounded to 16 bits. The
     * ops then write fp32 gradients (grads16 false). */
    bool accum32;
    bool poison_next;           /* fault injection: make this rank's next gradients not finite */
    /* Offload (offload.h): with offload_optimizer "cpu"/"nvme" the masters and the optimizer's
     * state live in the store (master is NULL); with offload_param "nvme" at stage 3 so does this
     * rank's slice of the parameters (param_file), read piece by piece as layers are gathered.
     * NULL when nothing is offloaded. */
    zt_offload *off;
    bool masters_offloaded;
    bool param_file;
    /* The offloaded update on a GPU (zero_optim.c): the host's CPU backend runs the optimizer on
     * the host tiles, with each tile's gradients (and fp32 parameters) copied to a slot's g / p
     * first, tile i in slot i mod ZT_ZERO_TILE_SLOTS, and the parameters copied back; NULL on
     * the CPU, whose tiles the update reads where they are. ZTRAIN_OFFLOAD_STAGED=1 takes this
     * path on the CPU too, for tests. */
    zt_backend *host_be;
    zt_zero_tile_slot host_slot[ZT_ZERO_TILE_SLOTS];
    size_t host_bytes;          /* of each slot's g and p */
    /* bf16_master_weights_and_grads with bf16_optimizer_states (zt_zero_use_states16): no fp32
     * masters (the 16-bit parameters of the slice are the masters) and the optimizer's state in
     * 16 bits, m16/v16 [part] (NULL where the optimizer has no such state), updated through
     * staging16 [4 × ZT_OPTIMIZER_PIECE16]. */
    bool states16;
    uint16_t *m16, *v16;
    float *staging16;
    zt_engine_memory peak;      /* bytes held, maxima since the last zt_zero_take_memory */
    /* A pipeline stage (zt_zero_set_pipeline): the gradient norm leaves out [skip_lo, skip_hi)
     * (a tied copy, counted on the stage that owns the tensor) and is summed over norm_comm (the
     * replica's stages; NULL: none). */
    size_t skip_lo, skip_hi;
    zt_comm *norm_comm;
    /* Tensor parallelism (zt_zero_set_tensor_parallel): the flat buffer as ranges of one weight
     * each, by which the gradient norm counts them (1 for a shard, 1/tp for a tensor every TP
     * rank holds alike, 0 for a pipeline stage's tied copy); NULL: every element counts once. */
    struct zt_zero_norm_range {
        size_t lo, hi;
        double weight;
    } *norm_ranges;
    int n_norm_ranges;
    /* [n_norm_ranges]: the weights of the norm's pieces in the order they are added, handed to
     * the backend's weighted_sum_to when the norm is summed over the ranks on the device
     * (zt_zero_norm_enqueue); NULL with norm_ranges. */
    double *norm_weights;
} zt_zero;

/* After the model's fp32 parameters are initialised or loaded (identically on every rank). Lets
 * go of what a step holds of the model's fp32 buffers only per layer before allocating its own
 * buffers, so that they take that memory: the gradients at stages 2-3 and in mixed precision,
 * the parameters outside this rank's slice at stage 3 (but the tensors kept whole), and in mixed
 * precision all of the fp32 parameters, once rounded into the 16-bit ones (the slice's at stage
 * 3). masters_offloaded: offload_optimizer is on, so the fp32 masters are not allocated here
 * (the store of zt_zero_init_offload holds them). accum_dtype: the type micro-steps' gradients
 * add up in (data_types.grad_accum_dtype, by default dtype); ZT_F32 with a 16-bit dtype at
 * stage 1-3 sets accum32, anything else than dtype is the caller's to refuse. Finish with zt_zero_after_init. */
zt_status zt_zero_init(zt_zero *z, zt_model *m, zt_comm *comm, int stage, size_t bucket_size,
                       size_t persistence_threshold, bool overlap_comm, size_t prefetch_size,
                       zt_dtype dtype, zt_dtype comm_dtype, zt_dtype accum_dtype,
                       bool masters_offloaded);
void zt_zero_free(zt_zero *z);

/* Makes the partitioner a pipeline stage's: the squared gradient norm is summed over
 * stage_comm (may be NULL) after the data-parallel reduction, and the tensors the model marks
 * tied_copy are left out of it. */
void zt_zero_set_pipeline(zt_zero *z, zt_comm *stage_comm);

/* Makes the partitioner a tensor-parallel shard's: each tensor's squared gradient norm is
 * weighted by 1/zt_tensor_info.tp_shared (whole tensors, held alike by every TP rank, count once
 * over the group; a pipeline stage's tied copy not at all) and the sum is taken over norm_comm
 * after the data-parallel reduction: the TP group, or for a pipeline stage every rank of its
 * replica (stages × shards), replacing zt_zero_set_pipeline's stage_comm. */
zt_status zt_zero_set_tensor_parallel(zt_zero *z, zt_comm *norm_comm);

/* Mixed precision at stages 1-3 without offload, after the optimizer exists (created with
 * zt_optimizer_init_external; o NULL without one) and before the parameters are loaded: keeps
 * the masters in the 16-bit parameters and the optimizer's state in 16 bits (see states16). */
zt_status zt_zero_use_states16(zt_zero *z, const zt_optimizer *o);

/* After the optimizer exists (created with zt_optimizer_init_external when offload_optimizer is
 * on): sets up the offload store for cfg's offload sections, or does nothing when nothing is
 * offloaded. o may be NULL (no optimizer). job_name names the NVMe directories. */
zt_status zt_zero_init_offload(zt_zero *z, const zt_zero_config *cfg, zt_optimizer *o,
                               const char *job_name);

/* The end of setup, after the optimizer and the offload store exist: mixed precision widens
 * its fp32 masters from the 16-bit parameters zt_zero_init made; offloaded parameters and
 * masters are written to the store; stage 3 lets go of what this rank does not own. */
zt_status zt_zero_after_init(zt_zero *z);
/* After new fp32 parameters were written into the model (a checkpoint; identically on every
 * rank): mixed precision rounds them into its 16-bit parameters again, then as
 * zt_zero_after_init (the masters from those, the fp32 copy let go). */
zt_status zt_zero_after_load(zt_zero *z);
/* After zt_zero_gather_all: lets go of what the gather brought in. */
void zt_zero_release_gathered(zt_zero *z);

/* Mixed precision at an accumulation boundary: finishes the reduction and points *g at the
 * 16-bit gradient slice this rank updates (count elements). */
zt_status zt_zero_reduce_gradients_half(zt_zero *z, uint16_t **g, size_t *count);
/* Applies the optimizer (begun by the caller) to the master weights with gradients multiplied by
 * grad_mul (unscale and clip), and rounds the masters into the 16-bit parameters. With offload
 * the update streams through the store, and every rank learns whether any rank's update failed
 * (collective), so none publishes parameters from a failed update. */
zt_status zt_zero_update_half(zt_zero *z, zt_optimizer *o, const uint16_t *g, size_t count,
                              float grad_mul, double lr, double momentum);

/* At an accumulation boundary: finishes the gradient reduction and points *g and *p at the
 * gradient and parameter slice this rank updates (count elements). */
zt_status zt_zero_reduce_gradients(zt_zero *z, float **g, float **p, size_t *count);
/* The squared global gradient norm in two halves, so that a step reads it back with its other
 * scalars at one synchronisation (docs/gpu.md). zt_zero_norm_enqueue queues the sums of squares
 * of the pieces of this rank's slice (g in fp32, or else g16 in the 16-bit training type, as
 * the reduce call gave them; still loss-scaled, not finite on overflow) into parts[0, n),
 * device doubles. Where the ranks' communicator reads device memory itself (NCCL,
 * zt_comm_dev_native), it also combines them into parts[n] (op weighted_sum_to: the same
 * weights and order as the host's loop) and sums that over the ranks on the device, posted
 * (zt_comm_dev_all_reduce: a collective), so the total comes back with the step's one read
 * instead of a host collective after it that would wait for the device again; then n + 1.
 * *slots ≤ zt_zero_norm_parts(z) is what to read back; an error is the collective's. Once
 * the caller has read them, zt_zero_norm_combine adds the pieces in that fixed order, weighted
 * with tensor parallelism, and sums over the ranks whatever was not summed on the device (a
 * collective) into *out: the same bits either way on one rank and on two (on more, the sum
 * over the ranks is in NCCL's order, not the host's rank order). */
int zt_zero_norm_parts(const zt_zero *z);
zt_status zt_zero_norm_enqueue(zt_zero *z, const float *g, const uint16_t *g16, size_t count,
                               double *parts, int *slots);
zt_status zt_zero_norm_combine(zt_zero *z, size_t count, const double *parts, double *out);
/* fp32: applies the optimizer (begun by the caller) to the slice's parameters p from g (as
 * zt_zero_reduce_gradients gave them; with offloaded parameters p is not used), through the
 * store when anything is offloaded (collective then, as zt_zero_update_half). */
zt_status zt_zero_update(zt_zero *z, zt_optimizer *o, float *p, const float *g, size_t count,
                         double lr, double momentum);

/* Collective: whether any rank's `mine` failed. A failing rank keeps its own status and message;
 * the others return ZT_ERR_IO with "rank R could not <what> (its own message says why)" naming
 * the failing rank of the lowest job_rank. Without a communicator, mine. */
zt_status zt_zero_agree(zt_zero *z, zt_status mine, const char *what);

/* The fp32 masters (ZT_OFFLOAD_MASTER) and the optimizer's state (ZT_OFFLOAD_EXP_AVG: Adam's
 * first moment or SGD's momentum buffer; ZT_OFFLOAD_EXP_AVG_SQ) of this rank's slice, wherever
 * they live: whether there is one, and copies of elements [first, first + count) out and in. */
bool zt_zero_has_state(const zt_zero *z, const zt_optimizer *o, int stream);
zt_status zt_zero_state_copy(zt_zero *z, zt_optimizer *o, int stream, bool write, size_t first,
                             float *data, size_t count);
/* After the update: clears the gradients and brings every rank's parameters up to date. */
zt_status zt_zero_after_step(zt_zero *z);
/* Every rank's parameters in full (stage 3 gathers them; call zt_zero_after_load to let go). */
zt_status zt_zero_gather_all(zt_zero *z);

/* Checkpoints at stage 3 (zt_zero_params_sharded): each rank saves and loads its own slice of the
 * parameters, and a consolidated model is written a layer at a time, never the whole model on a
 * rank. */
bool zt_zero_params_sharded(const zt_zero *z);
/* This rank's parameters [own_lo + first, own_lo + first + count) as fp32 into host memory dst
 * (widened from 16 bits in mixed precision, read from the offload file where they live there). */
zt_status zt_zero_read_own(zt_zero *z, size_t first, float *dst, size_t count);
/* Collective: every rank has the layer's parameters (layer -1: the outer tensors) in the model's
 * fp32 buffer until zt_zero_release_layer; its peak counts in zt_zero_take_memory. */
zt_status zt_zero_gather_layer(zt_zero *z, int layer);
void zt_zero_release_layer(zt_zero *z, int layer);
/* Fills the model's fp32 parameters from read (which supplies flat elements [lo, lo + n) into
 * host memory), asking only for what this rank keeps (at stage 3 with several ranks or
 * offloaded parameters: its slice and the tensors kept whole; else everything), then takes them
 * as zt_zero_after_load does. */
typedef zt_status (*zt_zero_param_reader)(void *ctx, size_t lo, float *dst, size_t n);
zt_status zt_zero_load_params(zt_zero *z, zt_zero_param_reader read, void *ctx);

/* The first failure of a hook or of the communication thread, or ZT_OK. */
zt_status zt_zero_status(zt_zero *z);

/* The bytes held since the last call (maxima), and resets the maxima to what is held now.
 * optimizer_bytes: the optimizer's own state in memory (the store's is added here). */
zt_engine_memory zt_zero_take_memory(zt_zero *z, size_t optimizer_bytes);

#endif
