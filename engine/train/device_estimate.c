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
#include "ztrain/pipe_engine.h"
#include "ztrain/size_math.h"
#include "ztrain/zero.h"

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* The physical bytes the CUDA backend holds for an allocation of `bytes`: large ones are
 * reserved ranges of whole granules (CUDA VMM, backend.h), smaller ones cudaMalloc's. */
static uint64_t held(uint64_t bytes, bool *ov) {
    return bytes >= ZT_CUDA_VMM_MIN_BYTES ? zt_u64_round_up(bytes, ZT_CUDA_VMM_GRANULE_BYTES, ov)
                                          : bytes;
}

/* The granules a large flat buffer of `es`-byte elements holds while `n` of its elements, in
 * `ranges` separate ranges, are in use and the rest is released: each range rounded out to whole
 * granules, at most the buffer's own; a small buffer keeps all of its bytes, released or not. */
static uint64_t held_in_use(uint64_t n, uint64_t es, int ranges, uint64_t whole, bool *ov) {
    if (whole < ZT_CUDA_VMM_MIN_BYTES)
        return whole;
    const uint64_t in_use =
        zt_u64_add(zt_u64_round_up(zt_u64_mul(n, es, ov), ZT_CUDA_VMM_GRANULE_BYTES, ov),
                   zt_u64_mul((uint64_t)ranges, ZT_CUDA_VMM_GRANULE_BYTES, ov), ov);
    return min_u64(in_use, held(whole, ov));
}

/* The model state of one rank on the CUDA backend in its three moments: the model made in fp32
 * (the parameters whole; the gradients reserved, holding nothing until ZeRO commits what it
 * writes, unless a small allocation in fp32), ZeRO's setup (what a step holds of the fp32 buffers only per
 * layer given back first: the gradients where ZeRO holds them per layer, stage 3's parameters
 * outside the slice, and in mixed precision the whole fp32 parameters once the 16-bit ones are
 * made from them; then its buffers and the optimizer's allocated), and a step (the fp32 layers
 * in use). The estimate's terms are the step's; setup_bytes is what either earlier moment holds
 * beyond it. A released range of a small allocation stays allocated; a large one gives back its
 * whole granules (backend.h). */
static void model_state(const zt_job_spec *job, const zt_model_estimate *m, uint64_t padded,
                        uint64_t N, zt_device_estimate *out, bool *ov) {
    const zt_ds_config *ds = &job->ds;
    const zt_zero_config *z = &ds->zero;
    const bool half = ds->bf16.enabled || ds->fp16.enabled;
    const int stage = z->stage;
    const uint64_t part = padded / N, state_n = stage == 0 ? padded : part;
    const int n_state = ds->has_optimizer ? zt_optimizer_state_count(&ds->optimizer) : 0;
    const bool offloaded = z->offload_optimizer.device != ZT_OFFLOAD_NONE;
    const bool states16 = ds->bf16.enabled && ds->bf16.master_weights_and_grads &&
                          ds->bf16.optimizer_states;
    const uint64_t f32 = zt_u64_mul(4, padded, ov); /* the model's fp32 parameters, gradients */

    /* The optimizer: each state array one allocation of the share (stage 0: everything). */
    const uint64_t state = held(zt_u64_mul(4, state_n, ov), ov);
    if (states16)
        /* The fp32 masters are taken at ZeRO's start and freed for the 16-bit moments. */
        out->optimizer_bytes = max_u64(held(zt_u64_mul(4, part, ov), ov),
                                       zt_u64_mul(held(zt_u64_mul(2, part, ov), ov),
                                                  (uint64_t)n_state, ov));
    else if (!offloaded)
        out->optimizer_bytes = zt_u64_mul(state, (uint64_t)n_state + (half ? 1 : 0), ov);

    /* The fp32 layers a step holds: the outer tensors and the block in use (and the next,
     * prefetched at stage 3 with overlap_comm), three ranges of the flat buffer; the gradients
     * the backward writes, the outer tensors' and the blocks of the bucket being filled and of
     * the one reduced before it (all of them when a bucket holds the model), three ranges too. */
    const uint64_t layer = m->layer_params, outer = m->outer_params;
    const bool prefetch = stage == 3 && N > 1 && z->overlap_comm &&
                          z->stage3_prefetch_bucket_size > 0;
    const uint64_t params_live = zt_u64_add(outer, zt_u64_mul(prefetch ? 2 : 1, layer, ov), ov);
    const uint64_t bucket = z->reduce_bucket_size > 0 ? (uint64_t)z->reduce_bucket_size : 1;
    const uint64_t bucket_blocks = layer ? zt_u64_div_up(bucket, layer) + 1 : 1;
    const uint64_t grads_live =
        bucket >= padded ? padded
                         : zt_u64_add(zt_u64_mul(min_u64(bucket_blocks, (uint64_t)m->n_layer),
                                                 layer, ov), outer, ov);
    const uint64_t grads_step = held_in_use(min_u64(grads_live, padded), 4, 3, f32, ov);

    /* The model's fp32 gradients: in mixed precision reserved at any size, holding nothing until
     * committed (zt_backend_reserve: the ops write 16-bit gradients, model.c); in fp32 released,
     * a small allocation holding all of its bytes. */
    const uint64_t grads_made = !half && f32 < ZT_CUDA_VMM_MIN_BYTES ? f32 : 0;
    uint64_t model_made = zt_u64_add(held(f32, ov), grads_made, ov);
    uint64_t setup, step_fp32;
    if (half) {
        /* The 16-bit parameters whole, or at stage 3 the slice and the layers gathered beside
         * it (each range rounded out to whole granules), and the gradients (a slice from stage
         * 2); the fp32 copy is the gradients the backward writes from stage 2 (the buckets',
         * below): the CUDA backend's ops read the 16-bit parameters, so a step fills no fp32
         * working copy (backend.h, reads_param16), and below stage 2 they accumulate into the
         * 16-bit gradients, so a step holds no fp32 gradient either (writes_grad16; neither
         * under ZTRAIN_CUDA_WEIGHTS=round or ZTRAIN_CUDA_GRADS=f32, diagnostic settings this
         * estimate does not count). A buffer under the VMM's threshold keeps all of its bytes,
         * filled or not. */
        const uint64_t p16 = held(zt_u64_mul(2, padded, ov), ov);
        /* The ops write 16-bit gradients (backend.h, writes_grad16), from stage 2 into a
         * reserved buffer held per bucket, where they are reduced in their own type. */
        const uint64_t g16 = zt_u64_mul(2, padded, ov);
        /* grad_accum_dtype "fp32": fp32 gradients (zero.h, accum32), summed whole at stage 1,
         * into an fp32 slice from stage 2. */
        const bool accum32 = zt_ds_grad_accum_dtype(ds) == ZT_F32;
        const bool grads16 =
            !accum32 && (stage < 2 || zt_ds_comm_dtype(ds) == zt_ds_train_dtype(ds));
        out->param_bytes =
            stage == 3 && N > 1
                ? min_u64(p16, zt_u64_add(held(zt_u64_mul(2, part, ov), ov),
                                          zt_u64_add(zt_u64_round_up(zt_u64_mul(2, params_live, ov),
                                                                     ZT_CUDA_VMM_GRANULE_BYTES, ov),
                                                     3 * ZT_CUDA_VMM_GRANULE_BYTES, ov),
                                          ov))
                : p16;
        /* The 16-bit gradients, whole or (from stage 2) the slice's accumulator, and from stage
         * 2 the blocks the backward writes, held until their bucket is reduced, as fp32 ones are
         * in fp32: the bucket being filled and the one reduced before it. They are the 16-bit
         * buffer's where the ops write 16 bits, else the fp32 gradients' (which are otherwise
         * held nowhere: reserved at any size, their ranges take whole granules when
         * committed). */
        out->grad_bytes = held(zt_u64_mul(2, stage >= 2 ? part : padded, ov), ov);
        if (stage >= 2 && grads16)
            out->grad_bytes = zt_u64_add(
                out->grad_bytes, held_in_use(min_u64(grads_live, padded), 2, 3, g16, ov), ov);
        if (accum32)
            out->grad_bytes = zt_u64_add(
                out->grad_bytes, held(zt_u64_mul(4, stage >= 2 ? part : padded, ov), ov), ov);
        /* The fp32 parameters, given back once rounded: none of a large buffer, all of a small
         * one. */
        step_fp32 = held_in_use(0, 4, 0, f32, ov);
        if (stage >= 2 && !grads16)
            step_fp32 = zt_u64_add(step_fp32, min_u64(
                zt_u64_add(zt_u64_round_up(zt_u64_mul(min_u64(grads_live, padded), 4, ov),
                                           ZT_CUDA_VMM_GRANULE_BYTES, ov),
                           3 * ZT_CUDA_VMM_GRANULE_BYTES, ov),
                zt_u64_round_up(f32, ZT_CUDA_VMM_GRANULE_BYTES, ov)), ov);
        /* ZeRO's start: the fp32 parameters beside the 16-bit ones it rounds them into (whole,
         * or at stage 3 the slice's granules, the rest never held), and small 16-bit gradients
         * from stage 2, which are not given back (the fp32 ones hold nothing). */
        const uint64_t p16_made =
            stage == 3 && N > 1 && zt_u64_mul(2, padded, ov) >= ZT_CUDA_VMM_MIN_BYTES
                ? min_u64(p16, zt_u64_add(zt_u64_round_up(zt_u64_mul(2, part, ov),
                                                          ZT_CUDA_VMM_GRANULE_BYTES, ov),
                                          ZT_CUDA_VMM_GRANULE_BYTES, ov))
                : p16;
        setup = zt_u64_add(zt_u64_add(held(f32, ov), p16_made, ov),
                           stage >= 2 && grads16 && g16 < ZT_CUDA_VMM_MIN_BYTES ? g16 : 0, ov);
    } else {
        /* Stage 3 gives back the fp32 parameters outside the slice; the tensors kept whole
         * (stage3_param_persistence_threshold) hold their values in a buffer of their own. */
        const bool slice = stage == 3 && f32 >= ZT_CUDA_VMM_MIN_BYTES;
        out->param_bytes =
            slice ? held_in_use(part, 4, 1, f32, ov) : held(f32, ov);
        if (stage == 3)
            out->param_bytes = zt_u64_add(out->param_bytes,
                                          held(zt_u64_mul(4, m->persistent_params, ov), ov), ov);
        /* Stages 2-3 accumulate the slice's gradients apart and give the flat buffer back but
         * for the layers the backward writes; below, the model's gradients are whole. */
        out->grad_bytes = stage >= 2 ? held(zt_u64_mul(4, part, ov), ov) : held(f32, ov);
        step_fp32 = stage >= 2 ? grads_step : 0;
        if (slice)
            step_fp32 = zt_u64_add(step_fp32, held_in_use(params_live, 4, 3, f32, ov), ov);
        /* Small fp32 gradients are not given back at stages 2-3. */
        setup = stage >= 2 && f32 < ZT_CUDA_VMM_MIN_BYTES ? f32 : 0;
        /* Stage 3 makes the buffer of the tensors kept whole before the parameters outside
         * the slice go. */
        if (stage == 3)
            model_made = zt_u64_add(model_made, held(zt_u64_mul(4, m->persistent_params, ov), ov),
                                    ov);
    }
    out->fp32_copy_bytes = step_fp32;
    /* What the earliest moments hold beyond the step's terms. */
    const uint64_t zero_terms =
        zt_u64_add(zt_u64_add(out->param_bytes, out->grad_bytes, ov), out->optimizer_bytes, ov);
    const uint64_t step_total = zt_u64_add(zero_terms, step_fp32, ov);
    /* Mixed precision's start holds none of ZeRO's other buffers yet; fp32's holds them all. */
    const uint64_t setup_total = half ? setup : zt_u64_add(zero_terms, setup, ov);
    const uint64_t highest = max_u64(model_made, setup_total);
    out->setup_bytes = highest > step_total ? highest - step_total : 0;
}

/* The per-channel sums' row tiles for n rows (kernels/cuda/channel_sums.cuh): rows per tile
 * ceil(n / tiles at most) but at least min_rows (ZT_CUDA_CHANNEL_MIN_ROWS for the two passes of
 * the bias gradients, ZT_CUDA_CHANNEL_FUSED_MIN_ROWS in the norms' fused backward), then as many tiles as those rows need. */
static uint64_t channel_tiles(uint64_t n, uint64_t min_rows) {
    if (n == 0)
        return 0;
    uint64_t rows = max_u64(zt_u64_div_up(n, ZT_CUDA_CHANNEL_TILES), min_rows);
    return zt_u64_div_up(n, rows);
}

/* One rank's estimate, holding the share `stage` of the model spec (NULL: the whole) with
 * ZeRO over N ranks. */
static zt_status estimate_share(const zt_job_spec *job, const zt_model_spec *spec,
                                const zt_model_stage *stage, uint64_t N, const char *source,
                                zt_device_estimate *out) {
    const zt_ds_config *ds = &job->ds;
    const zt_zero_config *z = &ds->zero;
    const bool half = ds->bf16.enabled || ds->fp16.enabled;
    const int tp = ds->tp_size > 1 ? ds->tp_size : 1;
    /* The CUDA backend stores activations in their 16-bit type and its attention keeps a
     * statistic per row (flash attention), never the T×T probabilities. */
    zt_model_estimate m;
    zt_model_estimate_args args = {
        .micro_batch = ds->train_micro_batch_size_per_gpu,
        .act_size = half ? 2 : sizeof(float),
        .persistence_threshold = (uint64_t)z->stage3_param_persistence_threshold,
        .tp_size = tp,
        .attn_lse = true,
        .stage = stage,
    };
    ZT_TRY(zt_model_estimate_spec(spec, &args, source, &m));

    bool ov = false;
    memset(out, 0, sizeof *out);
    const uint64_t padded = zt_u64_round_up(m.params, 16 * N, &ov);
    const bool states16 = ds->bf16.enabled && ds->bf16.master_weights_and_grads &&
                          ds->bf16.optimizer_states;
    model_state(job, &m, padded, N, out, &ov);
    out->activation_bytes = held(m.activation_bytes, &ov);
    if (stage) {
        /* The pipeline engine's buffers per activation set: the input and output activations
         * and their gradients, of B·T·n_embd elements each (pipe_engine.c). */
        const uint64_t one = zt_u64_mul(zt_u64_mul((uint64_t)args.micro_batch,
                                                   (uint64_t)spec->block_size, &ov),
                                        zt_u64_mul((uint64_t)spec->n_embd, args.act_size, &ov),
                                        &ov);
        out->activation_bytes =
            zt_u64_add(out->activation_bytes,
                       zt_u64_mul(held(one, &ov), 4 * (uint64_t)stage->buffers, &ov), &ov);
    }
    out->cublas_bytes = ZT_CUDA_CUBLAS_WORKSPACE_BYTES;

    /* The workspaces: the backend's sums and scratch for B·T rows (and one bias gradient),
     * ZeRO's conversion chunk and bf16 staging, the step's read-back slots (one per micro-batch
     * and per norm piece, no more pieces than tensors), LAMB's per-tensor sums and steps, and
     * with packed documents their positions and each token's rotary angles (head_dim floats). */
    const uint64_t rows = (uint64_t)args.micro_batch * (uint64_t)spec->block_size;
    uint64_t w = ZT_CUDA_SUMS_BYTES;
    w = zt_u64_add(w, zt_cuda_scratch_bytes(zt_u64_mul(rows, 4, &ov)), &ov);
    w = zt_u64_add(w, zt_cuda_scratch_bytes(zt_u64_mul(zt_u64_add(zt_u64_mul(3, rows, &ov), 2,
                                                                  &ov), 4, &ov)), &ov);
    /* The channel partials' scratch holds the larger of the widest sum over the two passes'
     * tiles and a norm's over the fused backward's (at most one a row). */
    const uint64_t two_pass = channel_tiles(rows, ZT_CUDA_CHANNEL_MIN_ROWS);
    const uint64_t partials =
        max_u64(zt_u64_mul(two_pass, m.channel_sum_floats, &ov),
                zt_u64_mul(channel_tiles(rows, ZT_CUDA_CHANNEL_FUSED_MIN_ROWS), m.norm_sum_floats,
                           &ov));
    w = zt_u64_add(w, zt_cuda_scratch_bytes(zt_u64_mul(partials, 4, &ov)), &ov);
    /* The bias gradient cuBLASLt's epilogue writes before it is added (one bias's floats, no
     * wider than the widest channel sum). */
    w = zt_u64_add(w, zt_cuda_scratch_bytes(zt_u64_mul(m.channel_sum_floats, 4, &ov)), &ov);
    if (half)
        w = zt_u64_add(w, ZT_ZERO_CHUNK * sizeof(float), &ov);
    if (states16)
        w = zt_u64_add(w, 4 * ZT_OPTIMIZER_PIECE16 * sizeof(float), &ov);
    const uint64_t gas = (uint64_t)(ds->gradient_accumulation_steps > 0
                                        ? ds->gradient_accumulation_steps : 1);
    /* The step's read-back block (step_readback.h): the losses, the next step's two counts of
     * targets, the norm's parts (at most one a tensor, and the total) and the trainer's step
     * table: every rank of the job's 4·gas entries and its values, the gate's 3 (a pipeline's
     * one, its stop requests: trainer.c). */
    w = zt_u64_add(w, zt_u64_mul(gas + 2 + 2 + m.n_tensors, sizeof(double), &ov), &ov);
    const uint64_t ranks = (uint64_t)(job->world_size > 0 ? job->world_size : 1);
    w = zt_u64_add(w, zt_u64_mul(zt_u64_mul(ranks, 4 * gas + (stage ? 1 : 3), &ov),
                                 sizeof(double), &ov), &ov);
    if (ds->has_optimizer && ds->optimizer.type == ZT_OPTIM_LAMB)
        w = zt_u64_add(w, zt_u64_mul(m.n_tensors + 1, 2 * sizeof(double) + sizeof(float), &ov),
                       &ov);
    if (job->data.format == ZT_DATA_FORMAT_MASKED && job->data.packing == ZT_DATA_PACKED) {
        const uint64_t hd = spec->head_dim > 0
                                ? (uint64_t)spec->head_dim
                                : (uint64_t)spec->n_embd / (uint64_t)spec->n_head;
        w = zt_u64_add(w, zt_u64_mul(rows, (1 + hd) * sizeof(float), &ov), &ov);
    }
    out->workspace_bytes = w;

    const uint64_t terms[] = {out->param_bytes,      out->grad_bytes,     out->optimizer_bytes,
                              out->fp32_copy_bytes,  out->setup_bytes,    out->activation_bytes,
                              out->cublas_bytes,     out->workspace_bytes};
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof terms / sizeof terms[0]; i++)
        sum = zt_u64_add(sum, terms[i], &ov);
    /* A saturated term saturates the sum (zt_u64_* return UINT64_MAX), so ov needs no more. */
    out->total_bytes = sum;
    return ZT_OK;
}

zt_status zt_device_estimate_job(const zt_job_spec *job, const char *source,
                                 zt_device_estimate *out) {
    const int tp = job->ds.tp_size > 1 ? job->ds.tp_size : 1;
    const int stages = job->pipeline.stages > 1 ? job->pipeline.stages : 1;
    /* ZeRO partitions over the data-parallel ranks: of a stage's shard under pipelining. */
    uint64_t N = (uint64_t)job->world_size / (uint64_t)tp / (uint64_t)stages;
    N = N ? N : 1;
    if (stages == 1)
        return estimate_share(job, &job->model, NULL, N, source, out);
    /* Each stage holds its own blocks (the first the embedding, the last the head and a copy of
     * a tied embedding) and as many activation sets as its 1F1B schedule keeps in flight, as
     * the pipeline engine builds it (pipe_engine.c); the estimate is the largest stage's. */
    zt_model_spec spec = job->model;
    if (job->pipeline.activation_checkpoint_interval > 0)
        spec.checkpoint_interval = job->pipeline.activation_checkpoint_interval;
    /* One partition for all the stages: measuring the layer list builds small models. */
    zt_model_stage plans[stages];
    ZT_TRY(zt_pipe_stage_plans(job, ZT_DEVICE_CPU, plans));
    for (int s = 0; s < stages; s++) {
        zt_model_stage st = plans[s];
        zt_device_estimate d;
        st.buffers = zt_pipe_train_buffers(stages, s, job->ds.gradient_accumulation_steps);
        st.tp_size = tp;
        ZT_TRY(estimate_share(job, &spec, &st, N, source, &d));
        if (s == 0 || d.total_bytes > out->total_bytes)
            *out = d;
    }
    return ZT_OK;
}

void zt_device_estimate_describe(const zt_device_estimate *d, char *buf, size_t size) {
    const struct {
        const char *name;
        uint64_t bytes;
    } terms[] = {{"parameters", d->param_bytes},
                 {"gradients", d->grad_bytes},
                 {"optimizer state", d->optimizer_bytes},
                 {"fp32 layers in use", d->fp32_copy_bytes},
                 {"held only while setting up", d->setup_bytes},
                 {"activations", d->activation_bytes},
                 {"cuBLASLt workspace", d->cublas_bytes},
                 {"workspaces", d->workspace_bytes}};
    char total[32];
    zt_format_bytes(d->total_bytes, total, sizeof total);
    size_t at = (size_t)snprintf(buf, size, "%s per rank on the GPU (", total);
    bool first = true;
    for (size_t i = 0; i < sizeof terms / sizeof terms[0] && at < size; i++) {
        /* Terms that are 0 for this job (no fp32 layers in use in fp32 below stage 2, nothing
         * held only at setup) are left out; the ZeRO terms are always named. */
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
