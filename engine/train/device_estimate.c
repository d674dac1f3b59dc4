/* The device memory of one rank of a "cuda" job (ztrain/admission.h), term by term from the
 * buffers the model, ZeRO, the optimizer and the CUDA backend allocate in device memory, so that
 * admission can refuse a job that would fail at its first cudaMalloc before any rank starts;
 * and what a refused job could change to fit. */
#include <stdio.h>
#include <string.h>

#include "device_estimate.h"
#include "ztrain/backend.h"
#include "ztrain/model.h"
#include "ztrain/optimizer.h"
#include "ztrain/size_math.h"
#include "ztrain/zero.h"

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* What ZeRO releases but the CUDA backend keeps allocated: its release zeroes a range and keeps
 * the memory (backend.h, zt_backend_cuda_create). In mixed precision that is the model's whole
 * fp32 parameters and gradients (8Ψ) beyond the part the kernels need live (fp32_live, the
 * working set ZeRO has not released); in fp32 the flat gradient buffer stays whole beside the
 * reduce-scattered slice from stage 2; at stage 3 the parameters outside the rank's slice stay
 * (16-bit in mixed precision, fp32 otherwise). When the backend gives released ranges back, this
 * is the one place that changes. */
static uint64_t cuda_released_still_allocated(bool half, int stage, uint64_t padded,
                                              uint64_t part, uint64_t fp32_live, bool *ov) {
    uint64_t held = 0;
    if (half) {
        const uint64_t copy = zt_u64_mul(8, padded, ov);
        held = copy > fp32_live ? copy - fp32_live : 0;
    } else if (stage >= 2) {
        held = zt_u64_mul(4, padded, ov);
    }
    if (stage == 3)
        held = zt_u64_add(held, zt_u64_mul(half ? 2 : 4, padded - part, ov), ov);
    return held;
}

/* The per-channel sums' row tiles for n rows (kernels/cuda/channel_sums.cuh): rows per tile
 * ceil(n / tiles at most) but at least the minimum, then as many tiles as those rows need. */
static uint64_t channel_tiles(uint64_t n) {
    if (n == 0)
        return 0;
    uint64_t rows = max_u64(zt_u64_div_up(n, ZT_CUDA_CHANNEL_TILES), ZT_CUDA_CHANNEL_MIN_ROWS);
    return zt_u64_div_up(n, rows);
}

zt_status zt_device_estimate_job(const zt_job_spec *job, const char *source,
                                 zt_device_estimate *out) {
    const zt_ds_config *ds = &job->ds;
    const zt_zero_config *z = &ds->zero;
    const bool half = ds->bf16.enabled || ds->fp16.enabled;
    const int stage = z->stage;
    const int tp = ds->tp_size > 1 ? ds->tp_size : 1;
    const uint64_t N = (uint64_t)job->world_size / (uint64_t)tp;
    /* The CUDA backend stores activations in their 16-bit type and its attention keeps a
     * statistic per row (flash attention), never the T×T probabilities. */
    zt_model_estimate m;
    zt_model_estimate_args args = {
        .micro_batch = ds->train_micro_batch_size_per_gpu,
        .act_size = half ? 2 : sizeof(float),
        .persistence_threshold = (uint64_t)z->stage3_param_persistence_threshold,
        .tp_size = tp,
        .attn_lse = true,
    };
    ZT_TRY(zt_model_estimate_spec(&job->model, &args, source, &m));

    bool ov = false;
    memset(out, 0, sizeof *out);
    const uint64_t padded = zt_u64_round_up(m.params, 16 * N, &ov), part = padded / N;
    const uint64_t state_n = stage == 0 ? padded : part;
    const int n_state = ds->has_optimizer ? zt_optimizer_state_count(&ds->optimizer) : 0;
    const bool offloaded = z->offload_optimizer.device != ZT_OFFLOAD_NONE;
    const bool states16 = ds->bf16.enabled && ds->bf16.master_weights_and_grads &&
                          ds->bf16.optimizer_states;
    const uint64_t P = half ? 2 : 4;

    /* The model state (zero.c, optimizer.c): in mixed precision ZeRO's 16-bit parameters and
     * gradients (a slice of the gradients from stage 2, accumulated there) and its fp32
     * masters; in fp32 the model's own buffers are the parameters and gradients, and stages 2-3
     * accumulate the slice's gradients apart. */
    out->param_bytes = zt_u64_mul(P, stage == 3 ? part : padded, &ov);
    out->grad_bytes = zt_u64_mul(P, stage >= 2 ? part : padded, &ov);
    const uint64_t moments = zt_u64_mul(zt_u64_mul(4, state_n, &ov), (uint64_t)n_state, &ov);
    if (states16)
        /* The fp32 masters are taken at ZeRO's start and freed for the 16-bit moments. */
        out->optimizer_bytes = max_u64(zt_u64_mul(4, part, &ov),
                                       zt_u64_mul(zt_u64_mul(2, part, &ov), (uint64_t)n_state,
                                                  &ov));
    else if (!offloaded)
        out->optimizer_bytes = zt_u64_add(moments, half ? zt_u64_mul(4, state_n, &ov) : 0, &ov);
    /* Mixed precision computes in fp32 parameters and gradients beside the 16-bit ones; what
     * it needs live at once is the engine's working set, the rest ZeRO releases. */
    if (half) {
        uint64_t params_tmp;
        out->fp32_copy_bytes = zt_u64_mul(zt_admission_working_set(job, &m, padded, N,
                                                                   &params_tmp, &ov),
                                          sizeof(float), &ov);
    }
    out->released_bytes = cuda_released_still_allocated(half, stage, padded, part,
                                                        out->fp32_copy_bytes, &ov);
    out->activation_bytes = m.activation_bytes;
    out->cublas_bytes = ZT_CUDA_CUBLAS_WORKSPACE_BYTES;

    /* The workspaces: the backend's sums and scratch for B·T rows, ZeRO's conversion chunk and
     * bf16 staging, the step's read-back slots (one per micro-batch and per norm piece, no more
     * pieces than tensors), LAMB's per-tensor sums and steps, and with packed documents their
     * positions and each token's rotary angles (head_dim floats). */
    const uint64_t rows = (uint64_t)args.micro_batch * (uint64_t)job->model.block_size;
    uint64_t w = ZT_CUDA_SUMS_BYTES;
    w = zt_u64_add(w, zt_cuda_scratch_bytes(zt_u64_mul(rows, 4, &ov)), &ov);
    w = zt_u64_add(w, zt_cuda_scratch_bytes(zt_u64_mul(zt_u64_add(zt_u64_mul(3, rows, &ov), 2,
                                                                  &ov), 4, &ov)), &ov);
    w = zt_u64_add(w, zt_cuda_scratch_bytes(zt_u64_mul(zt_u64_mul(channel_tiles(rows), 4, &ov),
                                                       m.channel_sum_floats, &ov)), &ov);
    if (half)
        w = zt_u64_add(w, ZT_ZERO_CHUNK * sizeof(float), &ov);
    if (states16)
        w = zt_u64_add(w, 4 * ZT_OPTIMIZER_PIECE16 * sizeof(float), &ov);
    const uint64_t gas = (uint64_t)(ds->gradient_accumulation_steps > 0
                                        ? ds->gradient_accumulation_steps : 1);
    w = zt_u64_add(w, zt_u64_mul(gas + 2 + m.n_tensors, sizeof(double), &ov), &ov);
    if (ds->has_optimizer && ds->optimizer.type == ZT_OPTIM_LAMB)
        w = zt_u64_add(w, zt_u64_mul(m.n_tensors + 1, 2 * sizeof(double) + sizeof(float), &ov),
                       &ov);
    if (job->data.format == ZT_DATA_FORMAT_MASKED && job->data.packing == ZT_DATA_PACKED) {
        const uint64_t hd = job->model.head_dim > 0
                                ? (uint64_t)job->model.head_dim
                                : (uint64_t)job->model.n_embd / (uint64_t)job->model.n_head;
        w = zt_u64_add(w, zt_u64_mul(rows, (1 + hd) * sizeof(float), &ov), &ov);
    }
    out->workspace_bytes = w;

    const uint64_t terms[] = {out->param_bytes,      out->grad_bytes,     out->optimizer_bytes,
                              out->fp32_copy_bytes,  out->released_bytes, out->activation_bytes,
                              out->cublas_bytes,     out->workspace_bytes};
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof terms / sizeof terms[0]; i++)
        sum = zt_u64_add(sum, terms[i], &ov);
    /* A saturated term saturates the sum (zt_u64_* return UINT64_MAX), so ov needs no more. */
    out->total_bytes = sum;
    return ZT_OK;
}

void zt_device_estimate_describe(const zt_device_estimate *d, char *buf, size_t size) {
    const struct {
        const char *name;
        uint64_t bytes;
    } terms[] = {{"parameters", d->param_bytes},
                 {"gradients", d->grad_bytes},
                 {"optimizer state", d->optimizer_bytes},
                 {"fp32 working copy", d->fp32_copy_bytes},
                 {"released but still allocated", d->released_bytes},
                 {"activations", d->activation_bytes},
                 {"cuBLASLt workspace", d->cublas_bytes},
                 {"workspaces", d->workspace_bytes}};
    char total[32];
    zt_format_bytes(d->total_bytes, total, sizeof total);
    size_t at = (size_t)snprintf(buf, size, "%s per rank on the GPU (", total);
    bool first = true;
    for (size_t i = 0; i < sizeof terms / sizeof terms[0] && at < size; i++) {
        /* Terms that are 0 for this job (the working copy in fp32, the released ranges below
         * stage 2) are left out; the ZeRO terms are always named. */
        if (!terms[i].bytes && i > 2)
            continue;
        char b[32];
        zt_format_bytes(terms[i].bytes, b, sizeof b);
        at += (size_t)snprintf(buf + at, size - at, "%s%s %s", first ? "" : ", ", terms[i].name,
                               b);
        first = false;
    }
    if (at < size)
        snprintf(buf + at, size - at, ")");
}

/* One change a refused job could make, applied to a copy of its spec. The copy shares the
 * original's strings: the estimate only reads them. */
typedef struct {
    char what[96];
    zt_job_spec job;
} change;

static int changes_of(const zt_job_spec *job, change *out, int cap) {
    int n = 0;
    const int tp = job->ds.tp_size > 1 ? job->ds.tp_size : 1;
    for (int s = job->ds.zero.stage + 1; s <= 3 && n < cap && job->world_size / tp > 1; s++) {
        out[n].job = *job;
        out[n].job.ds.zero.stage = s;
        snprintf(out[n].what, sizeof out[n].what, "ZeRO stage %d", s);
        n++;
    }
    if (job->ds.zero.offload_optimizer.device == ZT_OFFLOAD_NONE && job->ds.zero.stage > 0 &&
        job->ds.has_optimizer && n < cap) {
        out[n].job = *job;
        out[n].job.ds.zero.offload_optimizer.device = ZT_OFFLOAD_CPU;
        snprintf(out[n].what, sizeof out[n].what, "offload_optimizer \"cpu\"");
        n++;
    }
    if (job->model.checkpoint_interval != 1 && n < cap) {
        out[n].job = *job;
        out[n].job.model.checkpoint_interval = 1;
        snprintf(out[n].what, sizeof out[n].what, "activation checkpointing of every block");
        n++;
    }
    for (int b = job->ds.train_micro_batch_size_per_gpu / 2; b >= 1 && n < cap; b /= 2) {
        out[n].job = *job;
        out[n].job.ds.train_micro_batch_size_per_gpu = b;
        snprintf(out[n].what, sizeof out[n].what, "train_micro_batch_size_per_gpu %d", b);
        n++;
        if (b == 1)
            break;
    }
    return n;
}

void zt_device_estimate_advice(const zt_job_spec *job, uint64_t limit, char *buf, size_t size) {
    change ch[8];
    const int n = changes_of(job, ch, (int)(sizeof ch / sizeof ch[0]));
    size_t at = 0;
    bool micro_fits = false;
    buf[0] = '\0';
    const char *lead = "each of these alone would fit: ";
    for (int i = 0; i < n && at < size; i++) {
        zt_device_estimate d;
        if (zt_device_estimate_job(&ch[i].job, "", &d) != ZT_OK || d.total_bytes > limit)
            continue;
        /* The largest micro-batch that fits is the one worth naming. */
        bool micro = strncmp(ch[i].what, "train_micro", 11) == 0;
        if (micro && micro_fits)
            continue;
        micro_fits |= micro;
        char b[32];
        zt_format_bytes(d.total_bytes, b, sizeof b);
        at += (size_t)snprintf(buf + at, size - at, "%s%s (%s)", at ? ", " : lead, ch[i].what,
                               b);
    }
    if (!at)
        snprintf(buf, size, "none of a higher ZeRO stage, offload_optimizer \"cpu\", activation "
                 "checkpointing or a smaller train_micro_batch_size_per_gpu alone would fit: "
                 "more ranks (ZeRO partitions over them), tensor parallelism or a GPU with more "
                 "memory might");
}
