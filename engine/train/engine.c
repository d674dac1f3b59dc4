/* The engine: DeepSpeed's forward / backward / step loop over one model, optimizer and schedule,
 * with ZeRO stages 0-3 (zero.c), mixed precision and offload (offload.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ztrain/fault_inject.h"
#include "ztrain/zero.h"
#include "ztrain/comm.h"
#include "ztrain/engine.h"
#include "ztrain/gpu.h"
#include "ztrain/loss_scaler.h"

#include "loss_norm.h"
#include "step_readback.h"
#include "step_report.h"

struct zt_engine {
    zt_ds_config ds;
    zt_engine_options opts;
    zt_backend *be;             /* where the model, gradients and optimizer state live */
    zt_model *model;
    zt_optimizer opt;
    zt_zero zero;
    int world;
    zt_dtype dtype;             /* ZT_F32, or the 16-bit type of bf16/fp16 training */
    zt_loss_scaler scaler;
    int64_t inject_nan_step;    /* ZTRAIN_INJECT_NAN_GRAD (tests): poison this optimizer step */
    zt_lr_schedule sched;
    zt_loader loader;
    bool has_loader;
    /* Pinned host memory, [gas][batch_bytes] each: micro-batch m of a step is drawn into slot m,
     * so a batch is not overwritten while the device may still be copying an earlier one (the
     * step's one synchronisation frees them all). */
    int32_t *batch_inputs, *batch_targets;
    size_t batch_bytes;
    zt_step_readback rb; /* the step's scalars and their one read */
    int64_t global_steps, micro_steps, skipped_steps;
    /* Samples of the steps taken, a running total as DeepSpeed's: each step adds the
     * train_batch_size it ran with, so a resume with another batch size keeps the count. */
    int64_t global_samples;
    /* Micro-batches of the current step already stepped: a step's boundary is counted from its
     * own first micro-batch, not from micro_steps, which a resume with another
     * gradient_accumulation_steps would leave mid-step (DeepSpeed restores no micro count). */
    int step_micro;
    double grad_norm;
    bool step_applied;
    bool forward_pending; /* a training forward whose backward has not run */
    zt_engine_timers timers, current;
    zt_engine_timers micro; /* the current micro-step's own (DeepSpeed's *_microstep timers) */
    double step_comm0;    /* zt_comm_thread_ms() when the optimizer step began */
    zt_engine_step_gate gate;   /* decides a step's update before it is applied; NULL: none */
    void *gate_ctx;
    zt_engine_step_check check; /* may fail a step after its read, before all else; NULL: none */
    void *check_ctx;
    /* Loss-masked data: the loss is the mean over the global batch's trained targets
     * (loss_norm.h), so each step's micro-batches are drawn ahead into norm, in the steady state
     * at the end of the step before (count_ahead). */
    bool masked;
    zt_loss_norm norm;
    bool docs_on; /* the model holds a batch's document positions */
    int drawn;    /* micro-batches of the step handed out (zt_engine_step_batch) */
    zt_comm *table_comm; /* the step table's ranks (zt_engine_set_step_table); NULL: one */
};

/* Whether a dataset (or any file of a glob or mixture) carries a loss mask. */
static bool has_masks(const zt_dataset *d) {
    if (d->mask)
        return true;
    for (int i = 0; i < d->n_parts; i++)
        if (has_masks(&d->parts[i]))
            return true;
    return false;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The offload store, once the optimizer exists. A rank that cannot create its files (no room, a
 * path it cannot write) fails here, and so does every other rank, naming it, rather than waiting
 * for it in the first collective. */
static zt_status start_offload(zt_engine *e) {
    zt_status s = zt_zero_init_offload(&e->zero, &e->ds.zero,
                                       e->ds.has_optimizer ? &e->opt : NULL, e->opts.job_name);
    if (!e->zero.off && s == ZT_OK)
        return ZT_OK;
    ZT_TRY(zt_zero_agree(&e->zero, s, "set up its offload files"));
    if (e->opts.log && e->opts.rank == 0) {
        static const char *const dev[] = {"none", "cpu", "nvme"};
        fprintf(e->opts.log, "[ztrain] offload: optimizer %s, params %s (%s)\n",
                dev[e->ds.zero.offload_optimizer.device],
                e->zero.param_file ? "nvme" : "in memory", zt_offload_describe(e->zero.off));
    }
    return ZT_OK;
}

/* LAMB takes one trust ratio per parameter tensor, so its optimizer learns where the model's
 * tensors lie in the slice it updates. */
static zt_status setup_lamb(zt_engine *e) {
    const zt_model *m = e->model;
    const zt_ops *op = e->be->ops;
    if (!op->lamb_moments_to || !op->lamb_steps || !op->lamb_apply)
        return zt_error(ZT_ERR_UNSUPPORTED, "engine: optimizer %s (LAMB) has no kernel on the %s "
                        "backend", e->ds.optimizer.name, e->be->name);
    size_t *starts = malloc((size_t)m->n_tensors * sizeof *starts);
    if (!starts)
        return zt_error(ZT_ERR_NOMEM, "engine: out of memory");
    size_t end = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        starts[i] = m->tensors[i].offset;
        size_t hi = m->tensors[i].offset + m->tensors[i].numel;
        end = hi > end ? hi : end;
    }
    zt_status s = zt_optimizer_set_tensors(&e->opt, starts, m->n_tensors, end, m->n_padded,
                                           e->ds.zero.stage == 0 ? 0 : e->zero.own_lo);
    free(starts);
    return s;
}

zt_status zt_engine_create(zt_engine **out, const zt_ds_config *ds, const zt_model_spec *spec,
                           const zt_dataset *train_data, const zt_engine_options *opts) {
    zt_engine *e = calloc(1, sizeof *e);
    if (!e)
        return zt_error(ZT_ERR_NOMEM, "engine: out of memory");
    e->ds = *ds;
    e->opts = *opts;
    e->grad_norm = NAN;
    e->world = opts->comm ? zt_comm_world_size(opts->comm) : 1;
    e->dtype = zt_ds_train_dtype(ds);
    /* ZTRAIN_INJECT_NAN_GRAD="STEP[:RANK]" makes job rank RANK's local gradients of optimizer
     * step STEP not finite: how tests reach the overflow paths on purpose. */
    e->inject_nan_step = zt_inject_step("ZTRAIN_INJECT_NAN_GRAD", opts->job_rank);
    zt_loss_scaler_init(&e->scaler, ds);
    zt_backend_options bo = {.threads = opts->threads};
    /* A GPU rank takes the GPU of its LOCAL_RANK (ztrain/gpu.h), as the NCCL transport does. */
    zt_dist_info local;
    if (opts->device == ZT_DEVICE_CUDA && zt_dist_from_env(&local) == ZT_OK &&
        zt_gpu_count() > 0)
        bo.device_index = zt_gpu_for_rank(local.local_rank, zt_gpu_count());
    zt_status s = zt_backend_create(&e->be, opts->device, &bo);
    /* ZeRO's collectives take the backend's device memory (comm.h: zt_comm_dev_*). */
    if (s == ZT_OK && opts->comm)
        s = zt_comm_attach_backend(opts->comm, e->be);
    if (s == ZT_OK && e->world != ds->world_size)
        s = zt_error(ZT_ERR_INVALID, "engine: the job has %d ranks but the config was read for %d",
                     e->world, ds->world_size);
    /* The tensor-parallel activations' all-reduces take the backend's device memory too. */
    if (s == ZT_OK && opts->tp_comm)
        s = zt_comm_attach_backend(opts->tp_comm, e->be);
    /* The share of the model this rank holds: a pipeline stage or the whole, and with tensor
     * parallelism its shard of that. */
    zt_model_stage stage = opts->stage ? *opts->stage : zt_model_full_stage(spec->n_layer);
    stage.tp_size = opts->tp_size > 1 ? opts->tp_size : 1;
    stage.tp_rank = opts->tp_size > 1 ? opts->tp_rank : 0;
    /* Equal slices, each a multiple of 16 floats so every rank's slice stays 64-byte aligned. */
    if (s == ZT_OK)
        s = zt_model_create_stage(&e->model, spec, e->be, e->dtype,
                                  ds->train_micro_batch_size_per_gpu, 16 * (size_t)e->world,
                                  &stage);
    if (s == ZT_OK)
        s = zt_model_set_tp_comm(e->model, opts->tp_comm);
    if (s == ZT_OK) {
        if (spec->init_from)
            s = zt_model_load_safetensors(e->model, spec->init_from);
        else
            s = e->model->ops->init_weights(e->model, opts->seed);
    }
    bool offload_optimizer = ds->zero.offload_optimizer.device != ZT_OFFLOAD_NONE;
    /* ZeRO's communication thread talks to the data-parallel group while the training thread
     * runs the TP group's all-reduces: both are groups of the job's communicator, which only
     * some transports let two threads use at once. */
    bool overlap = ds->zero.overlap_comm;
    if (overlap && opts->tp_comm && opts->comm && !zt_comm_pairs_concurrent(opts->tp_comm)) {
        overlap = false;
        if (opts->log && opts->rank == 0 && opts->tp_rank == 0)
            fputs("[ztrain] zero_optimization.overlap_comm: ZeRO's collectives run on the "
                  "training thread: with tensor parallelism this transport lets one thread at a "
                  "time use the job's communicator\n", opts->log);
    }
    if (s == ZT_OK)
        s = zt_zero_init(&e->zero, e->model, opts->comm, ds->zero.stage,
                         (size_t)ds->zero.reduce_bucket_size,
                         (size_t)ds->zero.stage3_param_persistence_threshold,
                         overlap, (size_t)ds->zero.stage3_prefetch_bucket_size,
                         e->dtype, zt_ds_comm_dtype(ds), zt_ds_grad_accum_dtype(ds),
                         offload_optimizer);
    e->zero.job_rank = opts->job_rank;
    if (s == ZT_OK && opts->stage)
        zt_zero_set_pipeline(&e->zero, opts->stage_comm);
    if (s == ZT_OK && stage.tp_size > 1)
        s = zt_zero_set_tensor_parallel(&e->zero,
                                        opts->norm_comm ? opts->norm_comm : opts->tp_comm);
    /* bf16 masters and optimizer states (ds_config.h): ZeRO keeps the state, in 16 bits. */
    bool states16 = e->dtype == ZT_BF16 && ds->bf16.master_weights_and_grads &&
                    ds->bf16.optimizer_states;
    if (s == ZT_OK && ds->has_optimizer) {
        size_t n = ds->zero.stage == 0 ? e->model->n_padded : e->zero.part;
        /* Offloaded, the state belongs to the store (zero.h), which streams it to the kernel. */
        if (offload_optimizer || states16)
            zt_optimizer_init_external(&e->opt, &ds->optimizer, e->be, n);
        else
            s = zt_optimizer_init(&e->opt, &ds->optimizer, e->be, n);
    }
    if (s == ZT_OK && ds->has_optimizer && ds->optimizer.type == ZT_OPTIM_LAMB)
        s = setup_lamb(e);
    if (s == ZT_OK && states16)
        s = zt_zero_use_states16(&e->zero, ds->has_optimizer ? &e->opt : NULL);
    if (s == ZT_OK)
        s = start_offload(e);
    if (s == ZT_OK)
        s = zt_zero_after_init(&e->zero);
    if (s == ZT_OK && train_data && has_masks(train_data)) {
        e->masked = true;
        /* A step's packed micro-batches each keep their document tables until its one wait. */
        e->model->upload_slots = ds->gradient_accumulation_steps;
        s = zt_loss_norm_init(&e->norm, ds->gradient_accumulation_steps,
                              ds->train_micro_batch_size_per_gpu, spec->block_size);
    }
    if (s == ZT_OK && train_data) {
        s = zt_loader_init(&e->loader, train_data, ds->train_micro_batch_size_per_gpu,
                           spec->block_size, opts->rank, e->world, opts->shuffle,
                           ds->dataloader_drop_last, opts->seed);
        e->has_loader = s == ZT_OK;
    }
    if (s == ZT_OK) {
        /* Pinned, so a GPU reads a batch's tokens with an asynchronous copy (or in place). */
        e->batch_bytes = (size_t)ds->train_micro_batch_size_per_gpu * spec->block_size *
                         sizeof(int32_t);
        size_t all = e->batch_bytes * (size_t)ds->gradient_accumulation_steps;
        e->batch_inputs = zt_backend_alloc(e->be, ZT_MEM_PINNED, all);
        e->batch_targets = zt_backend_alloc(e->be, ZT_MEM_PINNED, all);
        if (!e->batch_inputs || !e->batch_targets)
            s = zt_error(ZT_ERR_NOMEM, "engine: out of memory");
    }
    if (s == ZT_OK)
        s = zt_step_readback_init(&e->rb, e->be, ds->gradient_accumulation_steps,
                                  zt_zero_norm_parts(&e->zero), e->world, e->zero.rank, 0);
    if (s != ZT_OK) {
        zt_engine_destroy(e);
        return s;
    }
    double beta1 = ds->optimizer.type == ZT_OPTIM_SGD ? ds->optimizer.momentum : ds->optimizer.beta1;
    zt_lr_schedule_init(&e->sched, &ds->scheduler, ds->optimizer.lr, beta1);
    *out = e;
    return ZT_OK;
}

void zt_engine_destroy(zt_engine *e) {
    if (!e)
        return;
    zt_zero_free(&e->zero);
    zt_model_destroy(e->model);
    if (e->ds.has_optimizer)
        zt_optimizer_free(&e->opt);
    if (e->has_loader)
        zt_loader_free(&e->loader);
    zt_loss_norm_free(&e->norm);
    if (e->be) {
        size_t all = e->batch_bytes * (size_t)e->ds.gradient_accumulation_steps;
        zt_backend_free(e->be, ZT_MEM_PINNED, e->batch_inputs, all);
        zt_backend_free(e->be, ZT_MEM_PINNED, e->batch_targets, all);
        zt_step_readback_free(&e->rb);
    }
    /* The communicator outlives the engine: it lets go of the backend and its staging first. */
    if (e->opts.comm && e->be)
        zt_comm_attach_backend(e->opts.comm, NULL);
    if (e->opts.tp_comm && e->be)
        zt_comm_attach_backend(e->opts.tp_comm, NULL);
    zt_backend_destroy(e->be);
    free(e);
}

zt_status zt_engine_next_batch(zt_engine *e, zt_batch *b) {
    return zt_engine_step_batch(e, e->step_micro, b);
}

zt_status zt_engine_step_batch(zt_engine *e, int micro, zt_batch *b) {
    if (!e->has_loader)
        return zt_error(ZT_ERR_INVALID, "engine: no training data was given to the engine");
    /* Unmasked micro-batches are independent draws; masked ones are the step's, drawn ahead. */
    if (micro < 0 || micro >= e->ds.gradient_accumulation_steps ||
        (e->masked && micro > 0 && micro != e->drawn))
        return zt_error(ZT_ERR_INVALID, "engine: micro-batch %d of a step of %d asked for after "
                        "micro-batch %d", micro, e->ds.gradient_accumulation_steps, e->drawn - 1);
    e->drawn = micro + 1;
    const size_t slot = (size_t)micro * (e->batch_bytes / sizeof(int32_t));
    int32_t *inputs = e->batch_inputs + slot, *targets = e->batch_targets + slot;
    if (e->masked) {
        /* Drawn ahead and counted under the last step's wait (read_step), or else now. */
        if (micro == 0 && zt_loss_norm_has_ahead(&e->norm))
            ZT_TRY(zt_loss_norm_take_ahead(&e->norm, e->global_steps + 1));
        else if (micro == 0)
            ZT_TRY(zt_loss_norm_fill(&e->norm, &e->loader, e->opts.comm, e->global_steps + 1));
        const zt_loss_draw *w = zt_loss_norm_step(&e->norm);
        size_t each = (size_t)e->norm.B * (size_t)e->norm.T;
        memcpy(inputs, w->inputs + micro * each, e->batch_bytes);
        memcpy(targets, w->targets + micro * each, e->batch_bytes);
        b->B = w->rows[micro];
        b->doc_pos = w->doc_pos + micro * each;
    } else {
        b->B = zt_loader_next(&e->loader, inputs, targets);
        b->doc_pos = NULL;
        if (b->B < 0)
            return ZT_ERR_IO;
    }
    b->T = e->model->spec.block_size;
    b->inputs = inputs;
    b->targets = targets;
    return ZT_OK;
}

/* Hands the batch's packed documents to the model (or none); a model that was given documents
 * is told when a batch has none. */
static zt_status set_documents(zt_engine *e, const zt_batch *b) {
    if (!b->doc_pos && !e->docs_on)
        return ZT_OK;
    if (!e->model->ops->set_doc_pos)
        return zt_error(ZT_ERR_UNSUPPORTED, "engine: model type \"%s\" does not support packed "
                        "documents", e->model->spec.type);
    ZT_TRY(e->model->ops->set_doc_pos(e->model, b->doc_pos, b->B, b->T));
    e->docs_on = b->doc_pos != NULL;
    return ZT_OK;
}

static zt_status check_batch(const zt_engine *e, const zt_batch *b) {
    if (b->B < 1 || b->B > e->model->max_batch || b->T < 1 || b->T > e->model->spec.block_size)
        return zt_error(ZT_ERR_INVALID,
                        "engine: batch of %d×%d tokens does not fit micro batch %d × block_size %d",
                        b->B, b->T, e->model->max_batch, e->model->spec.block_size);
    const int V = e->model->spec.vocab_size;
    for (int i = 0; i < b->B * b->T; i++) {
        if (b->inputs[i] < 0 || b->inputs[i] >= V || b->targets[i] >= V)
            return zt_error(ZT_ERR_INVALID, "engine: token at batch position %d is outside vocab_size %d",
                            i, V);
    }
    return ZT_OK;
}

zt_status zt_engine_forward(zt_engine *e, const zt_batch *b, float *loss) {
    ZT_TRY(check_batch(e, b));
    ZT_TRY(set_documents(e, b));
    double t0 = now_ms(), c0 = zt_comm_thread_ms();
    if (e->step_micro == 0)
        memset(&e->current, 0, sizeof e->current);
    memset(&e->micro, 0, sizeof e->micro);
    int counted = 0;
    for (int i = 0; i < b->B * b->T; i++)
        counted += b->targets[i] >= 0;
    double share;
    float grad_scale = zt_engine_grad_scale(e, counted, &share);
    const int micro = e->step_micro;
    /* Deferred, the loss stays on the device until the step's one synchronisation. A batch of
     * packed documents is too when the model keeps a step's micro-batches' document tables
     * apart (upload_slots; else it rewrites pinned tables that only a wait keeps from being
     * overwritten in flight). A tensor-parallel loss too: its shards combine it on the device. */
    const bool defer = !loss &&
                       (!b->doc_pos || e->model->upload_slots >= e->ds.gradient_accumulation_steps);
    if (defer)
        e->model->loss_out = zt_step_readback_defer(&e->rb, micro, counted, share);
    float l = e->model->ops->forward(e->model, b->inputs, b->targets, b->B, b->T, grad_scale);
    e->model->loss_out = NULL;
    e->forward_pending = grad_scale != 0.0f;
    e->micro.forward_ms += now_ms() - t0;
    e->micro.forward_comm_ms += zt_comm_thread_ms() - c0;
    e->current.forward_ms += now_ms() - t0;
    e->current.forward_comm_ms += zt_comm_thread_ms() - c0;
    if (!defer) {
        l = (float)((double)l * share);
        zt_step_readback_known(&e->rb, micro, l);
        if (loss)
            *loss = l;
        /* The loss has been waited for, so the device is idle up to here: its first error, if
         * an op, copy or launch failed (a GPU records it rather than returning it), ends the
         * step with the device's message instead of training on stale numbers. */
        ZT_TRY(zt_backend_sync(e->be));
    }
    ZT_TRY(zt_model_tp_status(e->model));
    return zt_zero_status(&e->zero);
}

float zt_engine_grad_scale(const zt_engine *e, int counted, double *loss_share) {
    const double scale = zt_loss_scaler_scale(&e->scaler);
    const int gas = e->ds.gradient_accumulation_steps;
    /* Loss-masked data: this micro-batch's summed token losses over the global batch's trained
     * targets, times the world size that the gradient average divides out (loss_norm.h), and
     * its loss reported so that the mean over micro-batches and ranks is the global mean. A
     * micro-batch without trained targets still runs its backward, whose gradients are 0. */
    const double global = e->masked ? e->norm.trained : 0.0;
    if (global > 0) {
        if (loss_share)
            *loss_share = (double)counted * gas * e->world / global;
        return (float)(scale * e->world / global);
    }
    if (loss_share)
        *loss_share = 1.0;
    /* fp16 scales the loss (DeepSpeed's loss scaler); the gradients are unscaled at the step. */
    return counted ? (float)(scale / ((double)counted * gas)) : 0.0f;
}

zt_status zt_engine_backward(zt_engine *e) {
    if (!e->forward_pending)
        return zt_error(ZT_ERR_INVALID, "engine: backward() without a preceding training forward()");
    double t0 = now_ms(), c0 = zt_comm_thread_ms();
    e->model->ops->backward(e->model);
    e->forward_pending = false;
    e->micro.backward_ms += now_ms() - t0;
    e->micro.backward_comm_ms += zt_comm_thread_ms() - c0;
    e->current.backward_ms += now_ms() - t0;
    e->current.backward_comm_ms += zt_comm_thread_ms() - c0;
    ZT_TRY(zt_model_tp_status(e->model));
    return zt_zero_status(&e->zero);
}

zt_status zt_engine_eval_loss(zt_engine *e, const zt_batch *b, float *loss) {
    ZT_TRY(check_batch(e, b));
    ZT_TRY(set_documents(e, b));
    *loss = e->model->ops->forward(e->model, b->inputs, b->targets, b->B, b->T, 0.0f);
    e->forward_pending = false;
    ZT_TRY(zt_model_tp_status(e->model));
    return zt_zero_status(&e->zero);
}

bool zt_engine_is_gradient_accumulation_boundary(const zt_engine *e) {
    return e->step_micro + 1 >= e->ds.gradient_accumulation_steps;
}

/* Clipping as DeepSpeed's fp32 path: scale by max_norm / (norm + 1e-6) when below 1. */
static void clip_gradients(zt_engine *e, float *g, size_t count, double norm) {
    if (e->ds.gradient_clipping <= 0.0)
        return;
    double coef = e->ds.gradient_clipping / (norm + 1e-6);
    if (coef < 1.0)
        e->be->ops->scale(&e->model->ctx, g, count, (float)coef);
}

/* DeepSpeed's two wall_clock_breakdown lines (engine.py step(), utils/timer.py log), printed by
 * rank 0 as print_dist prints them: after every micro-step its own times, and at the boundary
 * those summed over the step's micro-steps. */
static void log_timers(FILE *log, const zt_engine_timers *t, const char *suffix) {
    fprintf(log, "[Rank 0] time (ms) | fwd%s: %.2f | bwd%s: %.2f | bwd_inner%s: %.2f | "
            "bwd_allreduce%s: %.2f | step%s: %.2f\n", suffix, t->forward_ms, suffix,
            t->backward_ms, suffix, t->backward_ms - t->backward_comm_ms, suffix,
            t->backward_comm_ms, suffix, t->step_ms);
}

static void log_micro_timers(zt_engine *e, double step_ms) {
    if (!e->opts.log || e->opts.rank != 0 || !e->ds.wall_clock_breakdown)
        return;
    e->micro.step_ms = step_ms;
    log_timers(e->opts.log, &e->micro, "_microstep");
    memset(&e->micro, 0, sizeof e->micro);
}

static void log_step(zt_engine *e) {
    FILE *log = e->opts.log;
    if (!log || e->opts.rank != 0)
        return;
    if (e->ds.steps_per_print > 0 && e->global_steps % e->ds.steps_per_print == 0)
        zt_step_report_print(log, (long long)e->global_steps, (long long)e->skipped_steps,
                             zt_lr_schedule_lr(&e->sched), zt_lr_schedule_momentum(&e->sched),
                             e->ds.scheduler.type == ZT_SCHED_ONE_CYCLE &&
                                 e->ds.scheduler.cycle_momentum,
                             &e->ds.optimizer);
    log_micro_timers(e, e->timers.step_ms);
    if (e->ds.wall_clock_breakdown)
        log_timers(log, &e->timers, "");
}

static void finish_step(zt_engine *e, double t0, bool applied) {
    if (applied)
        zt_lr_schedule_step(&e->sched);
    else
        e->skipped_steps++;
    e->global_steps++;
    e->global_samples += e->ds.train_batch_size;
    e->micro_steps++;
    e->step_micro = 0;
    e->step_applied = applied;
    e->current.step_ms = now_ms() - t0;
    e->current.step_comm_ms = zt_comm_thread_ms() - e->step_comm0;
    e->timers = e->current;
    log_step(e);
}

/* What the gate (zt_engine_set_step_gate) says of this step; without one, nothing is held. */
static bool gate_holds(zt_engine *e, double norm, bool overflow) {
    return e->gate && e->gate(e->gate_ctx, e->global_steps + 1, norm, overflow);
}

/* A step whose update the gate held back: the gradients are dropped and the step counts as
 * skipped, as an overflow's does. */
/* A step the gate held (an anomaly policy's skip or stop): its update is left out, but its own
 * gradient norm is the one reported, as the value an investigation of the anomaly needs. */
static zt_status hold_step(zt_engine *e, double t0, double norm) {
    e->grad_norm = norm;
    ZT_TRY(zt_zero_after_step(&e->zero));
    finish_step(e, t0, false);
    return ZT_OK;
}

/* Loss-masked data: the next step's micro-batches are drawn now, when this step drew its own
 * (zt_engine_step_batch), and their counts of targets summed over the ranks (loss_norm.h): on
 * the device where the transport reads device memory (NCCL), under the step's one wait, with
 * *device_sums then the counts to fill from its read-back; else on the host, which waits for
 * nothing on the device (shm, gloo; no communicator on one rank). ZeRO's communication thread
 * is done with the communicator here: the gradients have been reduced. */
static zt_status count_ahead(zt_engine *e, double **device_sums) {
    if (!e->masked || e->drawn != e->ds.gradient_accumulation_steps)
        return ZT_OK;
    e->drawn = 0;
    double *counts = zt_loss_norm_draw_ahead(&e->norm, &e->loader);
    zt_comm *c = e->opts.comm;
    if (c && zt_comm_dev_native(c)) {
        ZT_TRY(zt_comm_dev_all_reduce(c, zt_step_readback_ahead(&e->rb, counts), 2, ZT_F64,
                                      ZT_REDUCE_SUM));
        *device_sums = counts;
    } else if (c) {
        ZT_TRY(zt_comm_all_reduce(c, counts, 2, ZT_F64, ZT_REDUCE_SUM));
    }
    return ZT_OK;
}

/* The step's one synchronisation (step_readback.h): the sums of squares of the gradient slice
 * (fp32 g, or else the 16-bit g16) are queued behind its reduction, then they and the step's
 * deferred losses come back together (over NCCL with their total already summed over the
 * ranks on the device, zt_zero_norm_enqueue); the step's check (zt_engine_set_step_check)
 * runs; *norm2 is the squared global norm, summed over the ranks.
 * A device error surfaces here, naming the device, before anything is decided on its numbers. */
static zt_status read_step(zt_engine *e, const float *g, const uint16_t *g16, size_t count,
                           double *norm2) {
    int parts;
    double *ahead = NULL;
    ZT_TRY(count_ahead(e, &ahead));
    ZT_TRY(zt_zero_norm_enqueue(&e->zero, g, g16, count, zt_step_readback_norm_slots(&e->rb),
                                &parts));
    zt_comm *over = e->table_comm;
    if (e->rb.values > 0 && over && zt_comm_dev_native(over))
        ZT_TRY(zt_step_readback_table_gather(&e->rb, over));
    ZT_TRY(zt_step_readback_sync(&e->rb, e->ds.gradient_accumulation_steps, parts));
    if (ahead)
        memcpy(ahead, zt_step_readback_ahead_sums(&e->rb), 2 * sizeof *ahead);
    if (e->rb.values > 0)
        ZT_TRY(zt_step_readback_table_finish(&e->rb, over));
    if (e->check)
        ZT_TRY(e->check(e->check_ctx));
    return zt_zero_norm_combine(&e->zero, count, zt_step_readback_norm_parts(&e->rb), norm2);
}

/* The mixed-precision step: the (loss-scaled) 16-bit gradients are checked for overflow — every
 * rank sees the same global norm, so every rank skips the same step — then unscaled and clipped
 * in one multiply (as DeepSpeed's ZeRO optimizer does) on their way into the fp32 masters. */
static zt_status step_half(zt_engine *e, double t0) {
    uint16_t *g;
    size_t count;
    double norm2, scale = zt_loss_scaler_scale(&e->scaler);
    ZT_TRY(zt_zero_reduce_gradients_half(&e->zero, &g, &count));
    ZT_TRY(read_step(e, NULL, g, count, &norm2));
    bool overflow = !isfinite(norm2);
    bool checked = e->ds.fp16.enabled || e->ds.bf16.check_grad_overflow;
    FILE *log = e->opts.rank == 0 ? e->opts.log : NULL;
    double norm = overflow ? NAN : sqrt(norm2) / scale;
    bool held = gate_holds(e, norm, overflow && checked);
    if (held && !(overflow && checked))
        return hold_step(e, t0, norm);
    if (overflow && !checked)
        return zt_error(ZT_ERR_NUMERIC,
                        "engine: bf16 gradients are not finite at step %lld and "
                        "bf16.check_grad_overflow is false: training diverged",
                        (long long)e->global_steps + 1);
    if (overflow) {
        ZT_TRY(zt_zero_after_step(&e->zero)); /* zeroes the gradients */
        if (e->ds.bf16.enabled && log)
            fprintf(log, "[ztrain] bf16 gradient overflow at step %lld: skipping the step\n",
                    (long long)e->global_steps + 1);
        /* A gate that stops the run here keeps the scale as it is: the ZeRO rule would end
         * the run at min_loss_scale before the checkpoint is written. */
        zt_status s = held ? ZT_OK : zt_loss_scaler_update(&e->scaler, true, log);
        finish_step(e, t0, false);
        return s;
    }
    e->grad_norm = norm;
    double combined = scale;
    if (e->ds.gradient_clipping > 0.0) {
        double clip = (norm + 1e-6) / e->ds.gradient_clipping;
        if (clip > 1.0)
            combined *= clip;
    }
    zt_optimizer_begin_step(&e->opt);
    ZT_TRY(zt_zero_update_half(&e->zero, &e->opt, g, count, (float)(1.0 / combined),
                               zt_lr_schedule_lr(&e->sched), zt_lr_schedule_momentum(&e->sched)));
    ZT_TRY(zt_zero_after_step(&e->zero));
    ZT_TRY(zt_loss_scaler_update(&e->scaler, false, log));
    finish_step(e, t0, true);
    return ZT_OK;
}

static zt_status step_apply(zt_engine *e);

/* A step waits for the device once, at its boundary, before it decides on the numbers it read
 * (read_step): an error of the forward or backward fails that step. The update it then queues is
 * not waited for: an error there surfaces at the next step's synchronisation (or at
 * zt_engine_sync), before anything is computed from its results. When the step fails, a device
 * error wins over the step's own, which it may have caused (a NaN norm from stale numbers). */
zt_status zt_engine_step(zt_engine *e) {
    zt_status s = step_apply(e);
    if (s == ZT_OK)
        return ZT_OK;
    zt_status d = zt_backend_sync(e->be);
    return d != ZT_OK ? d : s;
}

zt_status zt_engine_sync(zt_engine *e) { return zt_backend_sync(e->be); }

const float *zt_engine_step_losses(const zt_engine *e) { return e->rb.loss; }

zt_status zt_engine_set_step_table(zt_engine *e, int values, zt_comm *over) {
    if (values < 1 || e->micro_steps > 0)
        return zt_error(ZT_ERR_INVALID, "engine: a step table of %d values asked for %s", values,
                        values < 1 ? "(at least 1)" : "after the first micro-step");
    e->table_comm = over;
    zt_step_readback_free(&e->rb);
    return zt_step_readback_init(&e->rb, e->be, e->ds.gradient_accumulation_steps,
                                 zt_zero_norm_parts(&e->zero),
                                 over ? zt_comm_world_size(over) : 1,
                                 over ? zt_comm_rank(over) : 0, values);
}

double *zt_engine_step_table_in(zt_engine *e) { return zt_step_readback_table_in(&e->rb); }

const double *zt_engine_step_table(const zt_engine *e) {
    return e->rb.values > 0 ? e->rb.table : NULL;
}

static zt_status step_apply(zt_engine *e) {
    if (e->forward_pending)
        return zt_error(ZT_ERR_INVALID, "engine: step() after forward() without backward()");
    e->step_applied = false;
    if (!zt_engine_is_gradient_accumulation_boundary(e)) {
        double t0 = now_ms();
        e->micro_steps++;
        e->step_micro++;
        log_micro_timers(e, now_ms() - t0);
        return ZT_OK;
    }
    if (!e->ds.has_optimizer)
        return zt_error(ZT_ERR_INVALID, "engine: the DeepSpeed config has no \"optimizer\" section");
    double t0 = now_ms();
    e->step_comm0 = zt_comm_thread_ms();
    if (e->inject_nan_step == e->global_steps + 1)
        e->zero.poison_next = true;
    if (e->dtype != ZT_F32)
        return step_half(e, t0);
    float *g, *p;
    size_t count;
    double norm2;
    ZT_TRY(zt_zero_reduce_gradients(&e->zero, &g, &p, &count));
    ZT_TRY(read_step(e, g, NULL, count, &norm2));
    double norm = sqrt(norm2);
    if (gate_holds(e, norm, false))
        return hold_step(e, t0, norm);
    /* Every rank sees the same norm, so they all stop here together. */
    if (!isfinite(norm))
        return zt_error(ZT_ERR_NUMERIC,
                        "engine: gradient norm is %g at step %lld: training diverged (lower the lr "
                        "or enable gradient_clipping)",
                        norm, (long long)e->global_steps + 1);
    e->grad_norm = norm;
    clip_gradients(e, g, count, norm);
    zt_optimizer_begin_step(&e->opt);
    ZT_TRY(zt_zero_update(&e->zero, &e->opt, p, g, count, zt_lr_schedule_lr(&e->sched),
                          zt_lr_schedule_momentum(&e->sched)));
    ZT_TRY(zt_zero_after_step(&e->zero));
    finish_step(e, t0, true);
    return ZT_OK;
}

void zt_engine_set_step_gate(zt_engine *e, zt_engine_step_gate gate, void *ctx) {
    e->gate = gate;
    e->gate_ctx = ctx;
}

void zt_engine_set_step_check(zt_engine *e, zt_engine_step_check check, void *ctx) {
    e->check = check;
    e->check_ctx = ctx;
}

bool zt_engine_was_step_applied(const zt_engine *e) { return e->step_applied; }
int64_t zt_engine_global_steps(const zt_engine *e) { return e->global_steps; }
int64_t zt_engine_global_samples(const zt_engine *e) { return e->global_samples; }
int64_t zt_engine_micro_steps(const zt_engine *e) { return e->micro_steps; }
int64_t zt_engine_skipped_steps(const zt_engine *e) { return e->skipped_steps; }
double zt_engine_get_lr(const zt_engine *e) { return zt_lr_schedule_lr(&e->sched); }
double zt_engine_get_momentum(const zt_engine *e) { return zt_lr_schedule_momentum(&e->sched); }
double zt_engine_global_grad_norm(const zt_engine *e) { return e->grad_norm; }
zt_engine_timers zt_engine_get_timers(const zt_engine *e) { return e->timers; }
zt_model *zt_engine_model(zt_engine *e) { return e->model; }
void *zt_engine_local_grads(zt_engine *e, zt_dtype *dtype) {
    ZT_ASSERT(e->zero.stage < 2);
    *dtype = e->zero.half ? e->dtype : ZT_F32;
    return e->zero.half ? (void *)e->zero.g16 : (void *)e->model->grads;
}
int zt_engine_rank(const zt_engine *e) { return e->zero.rank; }
int zt_engine_job_rank(const zt_engine *e) { return e->zero.job_rank; }
int zt_engine_world_size(const zt_engine *e) { return e->world; }

double zt_engine_trained_tokens(const zt_engine *e, double *all) {
    if (all)
        *all = e->masked ? e->norm.tokens : 0.0;
    return e->masked ? e->norm.trained : 0.0;
}
zt_comm *zt_engine_comm(zt_engine *e) { return e->zero.comm; }

void zt_engine_partition(const zt_engine *e, size_t *own_lo, size_t *part) {
    *own_lo = e->zero.own_lo;
    *part = e->zero.part;
}

zt_status zt_engine_gather_params(zt_engine *e) { return zt_zero_gather_all(&e->zero); }
void zt_engine_release_unowned(zt_engine *e) { zt_zero_release_gathered(&e->zero); }
zt_status zt_engine_params_loaded(zt_engine *e) { return zt_zero_after_load(&e->zero); }
bool zt_engine_params_sharded(const zt_engine *e) { return zt_zero_params_sharded(&e->zero); }
zt_status zt_engine_read_own_params(zt_engine *e, size_t first, float *dst, size_t count) {
    return zt_zero_read_own(&e->zero, first, dst, count);
}
zt_status zt_engine_gather_layer(zt_engine *e, int layer) {
    return zt_zero_gather_layer(&e->zero, layer);
}
void zt_engine_release_layer(zt_engine *e, int layer) { zt_zero_release_layer(&e->zero, layer); }
zt_status zt_engine_load_params(zt_engine *e, zt_engine_param_reader read, void *ctx) {
    return zt_zero_load_params(&e->zero, read, ctx);
}
double zt_engine_loss_scale(const zt_engine *e) { return zt_loss_scaler_scale(&e->scaler); }
zt_loss_scaler *zt_engine_loss_scaler(zt_engine *e) { return &e->scaler; }
bool zt_engine_mixed_precision(const zt_engine *e) { return e->dtype != ZT_F32; }

zt_engine_memory zt_engine_take_memory(zt_engine *e) {
    size_t opt = 0;
    if (e->ds.has_optimizer)
        opt = e->opt.n * sizeof(float) * ((e->opt.m ? 1 : 0) + (e->opt.v ? 1 : 0));
    return zt_zero_take_memory(&e->zero, opt);
}

static int state_stream(zt_state_kind kind) {
    return kind == ZT_STATE_MASTER ? ZT_OFFLOAD_MASTER
           : kind == ZT_STATE_EXP_AVG ? ZT_OFFLOAD_EXP_AVG : ZT_OFFLOAD_EXP_AVG_SQ;
}

bool zt_engine_has_state(const zt_engine *e, zt_state_kind kind) {
    return e->ds.has_optimizer && zt_zero_has_state(&e->zero, &e->opt, state_stream(kind));
}

zt_status zt_engine_read_state(zt_engine *e, zt_state_kind kind, size_t first, float *dst,
                               size_t count) {
    return zt_zero_state_copy(&e->zero, &e->opt, state_stream(kind), false, first, dst, count);
}

zt_status zt_engine_write_state(zt_engine *e, zt_state_kind kind, size_t first, const float *src,
                                size_t count) {
    return zt_zero_state_copy(&e->zero, &e->opt, state_stream(kind), true, first, (float *)src,
                              count);
}
const zt_ds_config *zt_engine_config(const zt_engine *e) { return &e->ds; }
zt_loader *zt_engine_loader(zt_engine *e) { return e->has_loader ? &e->loader : NULL; }

void zt_engine_data_position(const zt_engine *e, int64_t *epoch, int64_t *pos) {
    /* Past a step drawn ahead, the loader is a step further than the steps taken. */
    if (e->masked && zt_loss_norm_has_ahead(&e->norm)) {
        *epoch = zt_loss_norm_step(&e->norm)->epoch;
        *pos = zt_loss_norm_step(&e->norm)->pos;
    } else {
        *epoch = e->loader.epoch;
        *pos = e->loader.pos;
    }
}

void zt_engine_seek_data(zt_engine *e, int64_t epoch, int64_t pos) {
    zt_loader_seek(&e->loader, epoch, pos);
    zt_loss_norm_drop_ahead(&e->norm);
    e->drawn = 0;
}
zt_optimizer *zt_engine_optimizer(zt_engine *e) { return e->ds.has_optimizer ? &e->opt : NULL; }
zt_lr_schedule *zt_engine_schedule(zt_engine *e) { return &e->sched; }

void zt_engine_set_counters(zt_engine *e, int64_t global_steps, int64_t global_samples,
                            int64_t micro_steps, int64_t skipped_steps) {
    e->global_steps = global_steps;
    e->global_samples = global_samples;
    e->micro_steps = micro_steps;
    e->skipped_steps = skipped_steps;
    e->step_micro = 0;
}
