/* Admission (ztrain/admission.h): one rank's memory estimated from a job spec, the ZeRO paper's
 * model-state terms and what this engine's ZeRO, offload and model hold besides, and the check of
 * a job against the host's memory and configured limits. Every figure is 64-bit and saturates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device_estimate.h"
#include "ztrain/pipe_engine.h"
#include "ztrain/size_math.h"
#include "ztrain/zero.h"
#include "ztrain/admission.h"
#include "ztrain/model.h"
#include "ztrain/optimizer.h"

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* The offload store's tile, as zt_offload_create picks it for a slice of n elements. */
static uint64_t offload_tile(int64_t sub_group_size, uint64_t n) {
    uint64_t tile = sub_group_size > 0 ? (uint64_t)sub_group_size : ZT_OFFLOAD_MAX_TILE;
    tile = min_u64(tile, ZT_OFFLOAD_MAX_TILE) / ZT_OFFLOAD_ALIGN * ZT_OFFLOAD_ALIGN;
    tile = max_u64(tile, ZT_OFFLOAD_ALIGN);
    bool ov = false;
    return min_u64(tile, zt_u64_round_up(n ? n : 1, ZT_OFFLOAD_ALIGN, &ov));
}

static uint64_t offload_slots(int buffer_count) {
    return buffer_count < 1 ? 1 : buffer_count > ZT_OFFLOAD_MAX_SLOTS ? ZT_OFFLOAD_MAX_SLOTS
                                                                     : (uint64_t)buffer_count;
}

/* Host memory of the offload store for a slice of n elements with `streams` fp32 state streams
 * (masters and moments) and, when params_in_file, the parameter stream (param_size bytes each) in
 * a file: zt_offload_create's host state, partial-offload remainder, I/O buffers and bounce
 * buffer. */
static uint64_t offload_host_bytes(const zt_zero_config *z, uint64_t n, int streams,
                                   bool params_in_file, int param_size, bool *ov) {
    const zt_offload_device od = z->offload_optimizer.device;
    if (od == ZT_OFFLOAD_CPU && !params_in_file)
        return zt_u64_mul(zt_u64_mul(n, 4, ov), (uint64_t)streams, ov);
    const uint64_t tile = offload_tile(z->sub_group_size, n);
    const bool state_in_file = od == ZT_OFFLOAD_NVME && streams > 0;
    const uint64_t slots =
        offload_slots(state_in_file ? z->offload_optimizer.buffer_count
                                    : z->offload_param.buffer_count);
    uint64_t state_file_n = 0;
    if (state_in_file) {
        state_file_n = n;
        if (z->offload_optimizer.ratio < 1.0) {
            uint64_t tiles = zt_u64_div_up(n, tile);
            state_file_n = min_u64(n, (uint64_t)(z->offload_optimizer.ratio * (double)tiles) * tile);
        }
    }
    /* State that is not in a file is in host memory (cpu offload, or ratio's remainder). */
    uint64_t host = od == ZT_OFFLOAD_NONE ? 0 : zt_u64_mul(zt_u64_mul(n - state_file_n, 4, ov),
                                                            (uint64_t)streams, ov);
    uint64_t buffers = 0;
    if (state_in_file && state_file_n > 0)
        buffers = zt_u64_mul(slots * tile * 4, (uint64_t)streams, ov);
    if (params_in_file)
        buffers = zt_u64_add(buffers, slots * tile * (uint64_t)param_size, ov);
    if (buffers > 0)
        buffers = zt_u64_add(buffers, (uint64_t)1 << 20, ov);
    return zt_u64_add(host, buffers, ov);
}

/* What the engine holds beyond ZeRO's terms at once, in fp32 elements of the model's working
 * buffers (device_estimate.h). */
uint64_t zt_admission_working_set(const zt_job_spec *job, const zt_model_estimate *m,
                                  uint64_t padded, uint64_t N, uint64_t *params_tmp, bool *ov) {
    const zt_ds_config *ds = &job->ds;
    const zt_zero_config *z = &ds->zero;
    const bool half = ds->bf16.enabled || ds->fp16.enabled;
    const int stage = z->stage;
    const uint64_t part = padded / N;
    /* At start the whole fp32 model is written (initialised or loaded, a tensor at a time
     * through a staging buffer) before it is rounded to 16 bits and partitioned. */
    const uint64_t layer = m->layer_params, outer = m->outer_params;
    const uint64_t largest = max_u64(layer, outer);
    uint64_t at_start = padded;
    if (!half)
        at_start -= stage == 3 ? part : padded;
    if (job->model.init_from)
        at_start = zt_u64_add(at_start, largest, ov);
    /* In training: the layers in use (and the next, prefetched at stage 3 with overlap_comm) with
     * the outer tensors, the small tensors stage 3 keeps whole in fp32, and the gradients of up to
     * two reduce buckets (one in flight, one filling) at stages 2 and 3, or of the layer in use
     * in mixed precision below that. */
    const bool prefetch = stage == 3 && N > 1 && z->overlap_comm &&
                          z->stage3_prefetch_bucket_size > 0;
    const uint64_t in_use = zt_u64_add(outer, zt_u64_mul(prefetch ? 2 : 1, layer, ov), ov);
    uint64_t ptmp = 0, grads_tmp = 0;
    if (half)
        ptmp = min_u64(padded, in_use);
    else if (stage == 3)
        ptmp = min_u64(padded, zt_u64_add(in_use, m->persistent_params, ov));
    const uint64_t bucket = z->reduce_bucket_size > 0 ? (uint64_t)z->reduce_bucket_size : 1;
    if (stage >= 2)
        grads_tmp = min_u64(padded, zt_u64_add(zt_u64_mul(2, zt_u64_add(bucket, layer, ov), ov),
                                               outer, ov));
    else if (half)
        grads_tmp = min_u64(padded, zt_u64_add(outer, layer, ov));
    uint64_t in_training = zt_u64_add(ptmp, grads_tmp, ov);
    *params_tmp = ptmp;
    return max_u64(at_start, in_training);
}

/* A type:REGEX partition is compiled and matched against the model's layer types here, as each
 * rank does when it builds its stage, so that `ztrain validate`, `run` and ztraind's admission
 * refuse it rather than the first worker that starts. The message is the key error's form. */
static zt_status check_partition(const zt_job_spec *job, const char *source) {
    if (zt_pipe_check_partition(job) == ZT_OK)
        return ZT_OK;
    static const char prefix[] = "pipeline.partition ";
    char why[1024];
    const char *err = zt_last_error();
    snprintf(why, sizeof why, "%s", strncmp(err, prefix, sizeof prefix - 1) == 0
                                        ? err + sizeof prefix - 1 : err);
    return zt_error_field(zt_error(ZT_ERR_INVALID, "%s: key 'pipeline.partition' %s", source,
                                   why),
                          "pipeline.partition");
}

zt_status zt_memory_estimate_job(const zt_job_spec *job, const char *source,
                                 zt_memory_estimate *out) {
    ZT_TRY(check_partition(job, source));
    const zt_ds_config *ds = &job->ds;
    const zt_zero_config *z = &ds->zero;
    const bool half = ds->bf16.enabled || ds->fp16.enabled;
    const int stage = z->stage;
    /* Under tensor parallelism a rank holds one shard of tp, and ZeRO partitions that shard
     * over the ranks holding the same one (tp.h: the data-parallel group), not over the world. */
    const int tp = ds->tp_size > 1 ? ds->tp_size : 1;
    const uint64_t world = (uint64_t)job->world_size, N = world / (uint64_t)tp;
    zt_model_estimate m;
    zt_model_estimate_args args = {
        .micro_batch = ds->train_micro_batch_size_per_gpu,
        .act_size = sizeof(float),
        .persistence_threshold = (uint64_t)z->stage3_param_persistence_threshold,
        .tp_size = tp,
        /* the CUDA backend's attention keeps row statistics (kernels/cuda/attention/) */
        .attn_lse = job->device == ZT_DEVICE_CUDA,
    };
    ZT_TRY(zt_model_estimate_spec(&job->model, &args, source, &m));

    bool ov = false;
    memset(out, 0, sizeof *out);
    out->params = m.params;
    out->padded = zt_u64_round_up(m.params, 16 * N, &ov);
    out->stage = stage;
    out->world_size = job->world_size;
    out->tp_size = tp;
    out->zero_size = (int)N;
    out->micro_batch = ds->train_micro_batch_size_per_gpu;
    const uint64_t padded = out->padded, part = padded / N;
    const uint64_t P = half ? 2 : 4;
    const int n_state = ds->has_optimizer ? zt_optimizer_state_count(&ds->optimizer) : 0;
    /* bf16_optimizer_states: the moments in 2 bytes and no fp32 masters (zero.h). */
    const bool states16 = ds->bf16.enabled && ds->bf16.master_weights_and_grads &&
                          ds->bf16.optimizer_states;
    const int streams = n_state + (half && !states16 ? 1 : 0);
    const uint64_t state_elem = states16 ? 2 : 4;
    out->param_size = (int)P;
    out->state_size = (int)state_elem * streams;

    /* The ZeRO paper's terms. */
    const bool params_in_file = stage == 3 && z->offload_param.device == ZT_OFFLOAD_NVME;
    const uint64_t state_n = stage == 0 ? padded : part;
    out->param_bytes = params_in_file ? 0 : zt_u64_mul(P, stage == 3 ? part : padded, &ov);
    out->grad_bytes = zt_u64_mul(P, stage >= 2 ? part : padded, &ov);
    /* grad_accum_dtype "fp32" in mixed precision: the micro-steps add up in an fp32 copy beside
     * the 16-bit gradients (zero.h, accum32). */
    if (half && zt_ds_grad_accum_dtype(ds) == ZT_F32)
        out->grad_bytes = zt_u64_add(out->grad_bytes,
                                     zt_u64_mul(4, stage >= 2 ? part : padded, &ov), &ov);
    if (z->offload_optimizer.device == ZT_OFFLOAD_NONE)
        out->optimizer_bytes = zt_u64_mul(zt_u64_mul(state_n, state_elem, &ov), (uint64_t)streams,
                                          &ov);
    if (z->offload_optimizer.device != ZT_OFFLOAD_NONE || params_in_file)
        out->offload_bytes = offload_host_bytes(z, state_n, z->offload_optimizer.device ==
                                                ZT_OFFLOAD_NONE ? 0 : streams, params_in_file,
                                                (int)P, &ov);

    uint64_t params_tmp = 0;
    out->workspace_bytes = zt_u64_mul(zt_admission_working_set(job, &m, padded, N, &params_tmp,
                                                               &ov), sizeof(float), &ov);
    /* Stage 3 in mixed precision gathers the layers in use as 16-bit parameters, the copy the
     * products read (zt_param16), and widens them into the fp32 ones: 2 bytes more each. At
     * stages 0-2 that copy is the 16-bit parameters themselves (param_bytes). */
    if (half && stage == 3 && (N > 1 || params_in_file))
        out->workspace_bytes = zt_u64_add(out->workspace_bytes, zt_u64_mul(params_tmp, 2, &ov),
                                          &ov);
    if (half)
        out->workspace_bytes = zt_u64_add(out->workspace_bytes, ZT_ZERO_CHUNK * sizeof(float), &ov);
    if (states16)
        out->workspace_bytes = zt_u64_add(out->workspace_bytes,
                                          4 * ZT_OPTIMIZER_PIECE16 * sizeof(float), &ov);

    out->activation_bytes = m.activation_bytes;
    /* The tables: the model's, ZeRO's per tensor and per layer, and the batch of tokens. */
    const uint64_t tokens = (uint64_t)args.micro_batch * (uint64_t)job->model.block_size;
    uint64_t tables = m.host_bytes + m.n_tensors * sizeof(bool) +
                      ((uint64_t)m.n_layer + 1) * (sizeof(zt_zero_segment) + sizeof(uint64_t)) +
                      tokens * 2 * sizeof(int32_t);
    out->overhead_bytes = zt_u64_add(ZT_RANK_BASELINE_BYTES, tables, &ov);

    uint64_t sum = 0;
    const uint64_t parts[] = {out->param_bytes, out->grad_bytes, out->optimizer_bytes,
                              out->offload_bytes, out->workspace_bytes, out->activation_bytes,
                              out->overhead_bytes};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        sum = zt_u64_add(sum, parts[i], &ov);
    out->rank_bytes = sum;
    out->ranks_per_host = (int)zt_u64_div_up(world, (uint64_t)(job->nodes > 0 ? job->nodes : 1));
    /* A saturated term saturates the sums (zt_u64_* return UINT64_MAX), so ov needs no more. */
    out->host_bytes = zt_u64_mul(sum, (uint64_t)out->ranks_per_host, &ov);
    out->job_bytes = zt_u64_mul(sum, world, &ov);
    if (job->device == ZT_DEVICE_CUDA) {
        out->has_device = true;
        ZT_TRY(zt_device_estimate_job(job, source, &out->device));
    }
    return ZT_OK;
}

void zt_format_bytes(uint64_t bytes, char *buf, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, size, "%.1f %s", v, units[u]);
}

/* A count of parameters for people: "832 K", "51.5 G". */
static void format_count(uint64_t n, char *buf, size_t size) {
    static const char *const units[] = {"", " K", " M", " G", " T", " P", " E"};
    double v = (double)n;
    int u = 0;
    while (v >= 1000.0 && u < 6) {
        v /= 1000.0;
        u++;
    }
    snprintf(buf, size, u ? "%.1f%s" : "%.0f%s", v, units[u]);
}

void zt_memory_estimate_describe(const zt_memory_estimate *e, char *buf, size_t size) {
    char rank[32], p[32], g[32], o[32], a[32], h[32], n[32], off[64] = "", w[64] = "";
    char shard[96] = "";
    zt_format_bytes(e->rank_bytes, rank, sizeof rank);
    zt_format_bytes(e->param_bytes, p, sizeof p);
    zt_format_bytes(e->grad_bytes, g, sizeof g);
    zt_format_bytes(e->optimizer_bytes, o, sizeof o);
    zt_format_bytes(e->activation_bytes, a, sizeof a);
    zt_format_bytes(e->overhead_bytes, h, sizeof h);
    format_count(e->params, n, sizeof n);
    /* Terms that are 0 for most jobs are left out. */
    if (e->offload_bytes) {
        char b[32];
        zt_format_bytes(e->offload_bytes, b, sizeof b);
        snprintf(off, sizeof off, ", offload %s", b);
    }
    if (e->workspace_bytes) {
        char b[32];
        zt_format_bytes(e->workspace_bytes, b, sizeof b);
        snprintf(w, sizeof w, ", working buffers %s", b);
    }
    if (e->tp_size > 1)
        snprintf(shard, sizeof shard, " (a tensor-parallel shard of %d, partitioned over %d "
                 "replica%s)", e->tp_size, e->zero_size, e->zero_size == 1 ? "" : "s");
    snprintf(buf, size,
             "%s per rank for %s parameters at ZeRO stage %d over %d rank%s%s, %s (parameters "
             "%s, gradients %s, optimizer state %s%s%s, activations %s for a micro-batch of %d, "
             "process and tables %s)",
             rank, n, e->stage, e->world_size, e->world_size == 1 ? "" : "s", shard,
             e->param_size == 2 ? "16-bit" : "fp32", p, g, o, off, w, a, e->micro_batch, h);
}

/* The refusal: the estimate, what was compared and the limit. */
static zt_status refuse(const zt_memory_estimate *e, const char *source, const char *what,
                        uint64_t need, const char *limit_name, uint64_t limit) {
    char desc[768], need_s[64], limit_s[64];
    zt_memory_estimate_describe(e, desc, sizeof desc);
    zt_format_bytes(need, need_s, sizeof need_s);
    zt_format_bytes(limit, limit_s, sizeof limit_s);
    /* Close figures that round alike are told apart by their bytes. */
    if (strcmp(need_s, limit_s) == 0) {
        snprintf(need_s + strlen(need_s), sizeof need_s - strlen(need_s), " (%llu B)",
                 (unsigned long long)need);
        snprintf(limit_s + strlen(limit_s), sizeof limit_s - strlen(limit_s), " (%llu B)",
                 (unsigned long long)limit);
    }
    return zt_error(ZT_ERR_INVALID, "%s: the job does not fit: it needs an estimated %s; %s need "
                    "%s, above %s, %s", source, desc, what, need_s, limit_name, limit_s);
}

/* The device refusal: the estimate, the limit (with the reserve when it is a GPU's total) and
 * the single changes that would fit. */
static zt_status refuse_device(const zt_job_spec *job, const zt_memory_estimate *e,
                               const char *source, uint64_t reserve, const char *limit_name,
                               uint64_t limit) {
    char desc[512], limit_s[32], res[96] = "", advice[512];
    zt_device_estimate_describe(&e->device, desc, sizeof desc);
    zt_format_bytes(limit, limit_s, sizeof limit_s);
    if (reserve) {
        char r[32];
        zt_format_bytes(reserve, r, sizeof r);
        snprintf(res, sizeof res, ", and %s for the CUDA context, NCCL and cuDNN,", r);
    }
    zt_device_estimate_advice(job, limit > reserve ? limit - reserve : 0, advice, sizeof advice);
    return zt_error(ZT_ERR_INVALID, "%s: the job does not fit on the GPU: it needs an estimated "
                    "%s%s above %s, %s; %s", source, desc, res,
                    limit_name, limit_s, advice);
}

zt_status zt_admission_check(const zt_job_spec *job, const zt_admission_limits *lim,
                             const char *source, zt_memory_estimate *est) {
    zt_memory_estimate local;
    zt_memory_estimate *e = est ? est : &local;
    ZT_TRY(zt_memory_estimate_job(job, source, e));
    char what[96];
    if (e->has_device) {
        /* NCCL puts each rank of a host on a GPU of its own (two ranks on one GPU is an NCCL
         * error): asked for by name, it must find one per rank. "auto" would stage through
         * host memory instead (zt_comm_choose). */
        if (job->comm == ZT_COMM_NCCL && lim->gpus > 0 && e->ranks_per_host > lim->gpus)
            return zt_error(ZT_ERR_INVALID,
                            "%s: key 'comm' is \"nccl\", which needs a GPU of its own for each "
                            "rank, but the %d ranks on one host would share %d GPU(s): set "
                            "\"comm\" to \"auto\" (ranks sharing a GPU then reduce through host "
                            "memory), or run at most %d rank(s) per host",
                            source, e->ranks_per_host, lim->gpus, lim->gpus);
        const uint64_t need = e->device.total_bytes;
        if (lim->device_bytes && need > lim->device_bytes)
            return refuse_device(job, e, source, 0, lim->device_name, lim->device_bytes);
        /* Ranks sharing a GPU (more ranks on a host than GPUs) each hold their own memory and
         * their own CUDA context on it: each must fit its share. */
        const uint64_t sharing =
            lim->gpus > 0 && e->ranks_per_host > lim->gpus
                ? zt_u64_div_up((uint64_t)e->ranks_per_host, (uint64_t)lim->gpus) : 1;
        const uint64_t share = lim->gpu_bytes / sharing;
        if (lim->gpu_bytes && (need > share || share - need < ZT_DEVICE_RESERVE_BYTES)) {
            char name[400];
            if (sharing > 1)
                snprintf(name, sizeof name, "a 1/%llu share of %s, which %llu ranks share",
                         (unsigned long long)sharing, lim->gpu_name ? lim->gpu_name : "the GPU",
                         (unsigned long long)sharing);
            else
                snprintf(name, sizeof name, "%s", lim->gpu_name ? lim->gpu_name : "the GPU");
            return refuse_device(job, e, source, ZT_DEVICE_RESERVE_BYTES, name, share);
        }
    }
    if (lim->rank_bytes && e->rank_bytes > lim->rank_bytes)
        return refuse(e, source, "one rank would", e->rank_bytes, lim->rank_name, lim->rank_bytes);
    snprintf(what, sizeof what, "its %d rank%s together would", e->world_size,
             e->world_size == 1 ? "" : "s");
    if (lim->job_bytes && e->job_bytes > lim->job_bytes)
        return refuse(e, source, what, e->job_bytes, lim->job_name, lim->job_bytes);
    snprintf(what, sizeof what, "the %d rank%s on one host would", e->ranks_per_host,
             e->ranks_per_host == 1 ? "" : "s");
    if (lim->host_bytes && e->host_bytes > lim->host_bytes)
        return refuse(e, source, what, e->host_bytes, lim->host_name, lim->host_bytes);
    return ZT_OK;
}

zt_status zt_parse_bytes(const char *text, const char *what, uint64_t *out) {
    static const struct {
        const char *suffix;
        int shift;
    } units[] = {{"", 0},    {"B", 0},    {"K", 10},  {"KB", 10}, {"KiB", 10}, {"M", 20},
                 {"MB", 20}, {"MiB", 20}, {"G", 30},  {"GB", 30}, {"GiB", 30}, {"T", 40},
                 {"TB", 40}, {"TiB", 40}};
    char *end;
    double v = text && *text ? strtod(text, &end) : -1.0;
    if (text && *text) {
        while (*end == ' ')
            end++;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
            if (strcasecmp(end, units[i].suffix) != 0)
                continue;
            double bytes = v * (double)((uint64_t)1 << units[i].shift);
            /* 2^64 is the first double past UINT64_MAX. */
            if (v > 0 && bytes < 18446744073709551616.0) {
                *out = (uint64_t)bytes;
                return ZT_OK;
            }
        }
    }
    return zt_error(ZT_ERR_INVALID, "%s expects a positive size such as 512M, 64G or 1.5TiB (units "
                    "of 1024), got '%s'", what, text ? text : "");
}
