/* Admission: whether a job can fit in memory, judged from its spec before any rank starts.
 *
 * ztraind refuses a job at SubmitJob, and `ztrain run` before it starts a rank, when the memory
 * the job needs is more than the host has or a configured limit allows, or, for a "cuda" job,
 * when one rank's device memory is more than a configured limit or the GPU it would take has
 * (zt_device_estimate: the terms the CUDA backend really holds, docs/gpu.md "Admission against
 * the GPU"). One rank's host estimate is
 * the ZeRO paper's model-state accounting for the job's stage, precision and optimizer (fp32
 * Adam: 4 bytes of parameters, 4 of gradients and 8 of optimizer state per parameter Ψ, so 16Ψ
 * at stage 0, 8Ψ + 8Ψ/N at stage 1, 4Ψ + 12Ψ/N at stage 2, 16Ψ/N at stage 3; bf16/fp16: 2 + 2
 * + 12, the 12 being fp32 masters and moments), with offload moving the optimizer state (and at
 * stage 3 the parameters) out of device memory; plus what this engine holds beyond the formula
 * (the fp32 model as it is initialised, stage 3's gathered layers, stage 2/3's reduce buckets,
 * mixed precision's fp32 working copy), one micro-batch's activations (the model family's
 * estimate, ztrain/model.h), and the process itself. The ranks of a job on one host add up.
 * With tensor parallelism every term is a shard's (1/tp of the split tensors, the whole of the
 * others; its activations at its heads, MLP width and vocabulary rows) and N is the
 * data-parallel size, world_size / tp, over which ZeRO partitions each shard. */
#ifndef ZTRAIN_ADMISSION_H
#define ZTRAIN_ADMISSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ztrain/job_spec.h"
#include "ztrain/status.h"

/* What the process takes whatever the model: program, libraries, thread stacks and BLAS buffers,
 * and a rank's share of the communicator's shared-memory segment. */
#define ZT_RANK_BASELINE_BYTES ((uint64_t)64 << 20)

/* Device memory one rank of a "cuda" job holds on the CUDA backend, by what holds it: the
 * backend's own count (memory/rank<r>/device_peak_bytes, docs/gpu.md "Device memory"), term by
 * term from the buffers the engine and the backend allocate. Ψ is the rank's parameters (its
 * shard's under tensor parallelism) padded to 16 × N, N the data-parallel size. */
typedef struct {
    /* The ZeRO paper's model state on the device during a step: 16-bit (bf16/fp16) parameters,
     * all or, at stage 3, the granules of the rank's slice and of the layers gathered beside it,
     * or fp32 ones, all or, at stage 3, the granules of the rank's slice and the buffer of the
     * tensors kept whole (stage3_param_persistence_threshold); gradients, all or a slice from stage 2; the optimizer's
     * moments and mixed precision's fp32 masters, all or a slice from stage 1, 0 when
     * offload_optimizer moves them to the host (bf16_optimizer_states: 16-bit moments, no
     * masters). Each allocation as the backend holds it: from ZT_CUDA_VMM_MIN_BYTES in whole
     * granules. */
    uint64_t param_bytes, grad_bytes, optimizer_bytes;
    /* The model's fp32 parameters and gradients a step holds beyond those: in mixed precision
     * the gradients the backward writes (one layer's below stage 2, two buckets' from stage 2;
     * the CUDA backend's ops read the 16-bit parameters, so there is no fp32 working copy), in
     * fp32 from stage 2 the buckets' gradients (and stage 3's gathered blocks), each range
     * rounded out to whole granules. ZeRO releases the rest, which the backend gives back in
     * whole granules; a buffer under ZT_CUDA_VMM_MIN_BYTES keeps all of its bytes. */
    uint64_t fp32_copy_bytes;
    /* What the rank holds only before its first step, beyond the step's terms: the model made in
     * fp32 (parameters whole, gradients reserved and committed as written) before ZeRO
     * partitions it, and ZeRO's start, which
     * gives back what a step holds of them only per layer (mixed precision: all of the fp32
     * parameters, once rounded into the 16-bit ones; stage 3: those outside the slice) before
     * its buffers and the optimizer's are allocated. Usually 0: the step holds more, unless
     * ZeRO spreads the model state over many ranks (docs/gpu.md, "Device memory"). */
    uint64_t setup_bytes;
    /* One micro-batch's activations as the model carves them on the CUDA backend (16-bit
     * elements in mixed precision; flash attention's row statistics, no T×T matrix; with
     * activation checkpointing the kept group inputs and one group's blocks). */
    uint64_t activation_bytes;
    uint64_t cublas_bytes;      /* cuBLASLt's workspace (ZT_CUDA_CUBLAS_WORKSPACE_BYTES) */
    /* The backend's and the engine's fixed and per-batch workspaces: the two-pass sums, the
     * grown scratch buffers (tokens, embedding buckets, per-channel partials), ZeRO's
     * conversion chunk and bf16 staging, the step's read-back slots, LAMB's per-tensor sums,
     * packed documents' positions and rotary tables. */
    uint64_t workspace_bytes;
    uint64_t total_bytes;       /* the sum: the peak the rank's backend should reach */
} zt_device_estimate;

/* What the backend does not count but a GPU's memory must also hold for a rank: the CUDA
 * context, NCCL's buffers and cuDNN's attention workspace (sized by cuDNN when it builds its
 * plan). Admission adds it when it compares an estimate with a GPU's total memory. */
#define ZT_DEVICE_RESERVE_BYTES ((uint64_t)1 << 30)

/* Bytes one rank needs, by what they hold. Every figure saturates at UINT64_MAX (which no limit
 * admits) rather than wrap. On the CPU every figure is host memory; the split says what a GPU
 * backend would hold in device memory (all but offload_bytes and overhead_bytes). */
typedef struct {
    uint64_t params;            /* Ψ: the parameters a rank's model holds (with tensor
                                   parallelism its shard's) */
    uint64_t padded;            /* Ψ padded as the engine pads it, to a multiple of 16 × N */
    int stage;                  /* ZeRO stage */
    int world_size;             /* every rank of the job */
    int tp_size;                /* tensor_parallel.autotp_size, 1 without */
    int zero_size;              /* N, the ranks ZeRO partitions over: world_size / tp_size */
    int param_size;             /* bytes per parameter and gradient: 4, or 2 in bf16/fp16 */
    int state_size;             /* bytes of optimizer state per parameter (K): 8 for Adam,
                                   4 for SGD with momentum, 0 without, + 4 for mixed precision's
                                   master weights; half that and no masters with
                                   bf16_optimizer_states (bf16 moments, bf16 masters) */
    uint64_t param_bytes;       /* the parameters a rank keeps: all, or a 1/N slice at stage 3
                                   (0 when offload_param puts the slice on NVMe) */
    uint64_t grad_bytes;        /* gradients: all, or a 1/N slice from stage 2 */
    uint64_t optimizer_bytes;   /* state in device memory: all, or a 1/N slice from stage 1; 0
                                   when offload_optimizer moves it */
    uint64_t offload_bytes;     /* host memory of offload: the state that "cpu" moves there, the
                                   part of "nvme" state that ratio keeps there, and the buffers
                                   the files stream through */
    /* The most that is held beyond those at any one time: at start, the fp32 model as it is
     * initialised or loaded, before it is converted to 16 bits and partitioned; in training,
     * stage 3's gathered layers (the one in use, the one prefetched and the small tensors kept
     * whole), stage 2/3's reduce buckets and mixed precision's fp32 working copy. */
    uint64_t workspace_bytes;
    uint64_t activation_bytes;  /* one micro-batch's activations (zt_model_estimate) */
    int micro_batch;            /* train_micro_batch_size_per_gpu */
    /* ZT_RANK_BASELINE_BYTES, the model's and ZeRO's tables and the batch buffers. */
    uint64_t overhead_bytes;
    uint64_t rank_bytes;        /* the sum: one rank */
    int ranks_per_host;         /* ceil(world_size / nodes) */
    uint64_t host_bytes;        /* rank_bytes × ranks_per_host: one host */
    uint64_t job_bytes;         /* rank_bytes × world_size: the whole job */
    bool has_device;            /* a "cuda" job: device holds its device memory */
    zt_device_estimate device;
} zt_memory_estimate;

/* The device memory of one rank of a "cuda" job (any job's spec: a "cpu" one is sized as if it
 * ran on the CUDA backend). Fails as zt_memory_estimate_job. */
zt_status zt_device_estimate_job(const zt_job_spec *job, const char *source,
                                 zt_device_estimate *out);

/* Writes a device estimate for people: "40.6 MiB per rank on the GPU (parameters 3.2 MiB,
 * gradients ..., cuBLASLt workspace 32.0 MiB, workspaces 0.4 MiB)". */
void zt_device_estimate_describe(const zt_device_estimate *d, char *buf, size_t size);

/* Estimates a parsed job's memory. Fails as zt_model_estimate_spec does (a spec whose sizes
 * overflow, which zt_job_spec_parse has already refused), and on a pipeline.partition the
 * workers would refuse (zt_pipe_check_partition: "job.json: key 'pipeline.partition' \"type:xyz\":
 * matches no layer; ...", the field recorded), which the parser leaves to it; messages start with
 * `source`. `ztrain validate`, `run` (through zt_admission_check) and ztraind all call it. */
zt_status zt_memory_estimate_job(const zt_job_spec *job, const char *source,
                                 zt_memory_estimate *out);

/* Writes the estimate for people: "54.2 MiB per rank for 0.83 M parameters at ZeRO stage 2,
 * fp32 (parameters 3.2 MiB, gradients ..., activations 1.9 MiB for a micro-batch of 2, ...)". */
void zt_memory_estimate_describe(const zt_memory_estimate *e, char *buf, size_t size);

/* The limits a job is admitted against; a 0 is no limit. The names are how messages call each
 * one: "--max-rank-memory", "this host's memory (MemTotal)". */
typedef struct {
    uint64_t rank_bytes;        /* the most one rank may need */
    const char *rank_name;
    uint64_t job_bytes;         /* the most all the job's ranks together may need */
    const char *job_name;
    uint64_t host_bytes;        /* the memory the ranks on one host share */
    const char *host_name;
    /* "cuda" jobs: the most one rank's device memory may be (a configured limit, compared with
     * the estimate alone), and the total memory of the smallest GPU a rank would use (compared
     * with the estimate plus ZT_DEVICE_RESERVE_BYTES). Both are ignored for "cpu" jobs. */
    uint64_t device_bytes;
    const char *device_name;    /* "--max-device-memory" */
    uint64_t gpu_bytes;
    const char *gpu_name;       /* "GPU 0 (NVIDIA H100 80GB HBM3)" */
    /* The GPUs the ranks on one host take in turn (rank r the (r mod gpus)-th): with fewer GPUs
     * than ranks, ranks share one, and each must fit its share of gpu_bytes with its reserve.
     * 0: a GPU per rank. */
    int gpus;
} zt_admission_limits;

/* Estimates the job and checks it against every limit: a "cuda" job's device memory first
 * (the limit, then the GPU), then host memory. A job that cannot fit is ZT_ERR_INVALID
 * with the estimate, its breakdown and the limit it exceeds: "spec: the job does not fit: it
 * needs an estimated 823.9 GiB per rank (...); 1 rank on one host need 823.9 GiB, above this
 * host's memory (MemTotal), 23.5 GiB"; on the device, "spec: the job does not fit on the GPU:
 * it needs an estimated 96.4 GiB per rank on the GPU (...), and 1.0 GiB for the CUDA context,
 * NCCL and cuDNN, above GPU 0 (NVIDIA H100 80GB HBM3), 79.6 GiB; each of these alone would fit:
 * ZeRO stage 3 (...)" (against "a 1/k share of GPU 0 (...), which k ranks share" when k ranks
 * share it). A job whose "comm" is "nccl" is refused naming the key when the ranks on a host
 * outnumber lim->gpus (NCCL needs a GPU per rank). est may be
 * NULL; when not, it holds the estimate whatever the verdict (unless the estimate itself
 * failed). */
zt_status zt_admission_check(const zt_job_spec *job, const zt_admission_limits *lim,
                             const char *source, zt_memory_estimate *est);

/* The host's memory: /proc/meminfo's MemTotal and MemAvailable, each lowered to what the
 * process's memory cgroup allows (cgroup v2 memory.max, v1 memory.limit_in_bytes, at its own
 * level or any above it; available as the limit less the usage that is not reclaimable page
 * cache). ZT_ERR_IO when /proc/meminfo cannot be read. */
typedef struct {
    uint64_t total;
    uint64_t available;
    bool cgroup_limited;        /* a cgroup limit is lower than MemTotal */
} zt_host_memory;

zt_status zt_host_memory_read(zt_host_memory *out);

/* Reads a size: bytes, or a number (fractions allowed) with a binary unit K, M, G or T, also
 * written KiB, MiB, GiB, TiB or KB, MB, GB, TB (all powers of 1024, as memory is sold): "64G",
 * "1.5TiB", "512M", "1000000". `what` names it in the message. */
zt_status zt_parse_bytes(const char *text, const char *what, uint64_t *out);

/* Writes bytes with a binary unit and one decimal ("23.5 GiB", "512 B"). */
void zt_format_bytes(uint64_t bytes, char *buf, size_t size);

#endif
