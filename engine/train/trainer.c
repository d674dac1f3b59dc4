/* The training loop of a job: forward/backward/step over the engine, metrics every log_interval
 * steps, evaluation, checkpoints, and a progress display. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ztrain/ckpt_dir.h"
#include "ztrain/ckpt_pipeline.h"
#include "eval_sample.h"
#include "ztrain/fsutil.h"
#include "ztrain/pipe_engine.h"
#include "ztrain/rank_stats.h"
#include "trainer_events.h"
#include "trainer_profile.h"
#include "ztrain/checkpoint.h"
#include "ztrain/ckpt_tp.h"
#include "ztrain/engine.h"
#include "ztrain/gpu.h"
#include "ztrain/metrics.h"
#include "ztrain/monitor.h"
#include "ztrain/tp.h"
#include "ztrain/stop_signals.h"
#include "ztrain/trainer.h"

enum { STEP_METRICS = 18 };

typedef struct {
    const zt_job_spec *job;
    const zt_train_options *opts;
    zt_engine *e;
    zt_dataset train, val;
    bool has_train, has_val;
    zt_loader val_loader;
    bool has_val_loader;
    int32_t *val_inputs, *val_targets;
    int32_t *val_pos; /* loss-masked data: the validation batch's document positions */
    zt_eval_sampler sampler; /* rank 0's text sample at evaluation (data.sample_tokens), drawn
                              * by its TP group together */
    bool has_sampler;
    zt_metrics_writer metrics;
    int64_t max_steps;
    int64_t first_step;         /* global step when this run started (after resume) */
    bool attention_recorded;    /* the CUDA attention's choice is in a record (record_attention) */
    char resume_tag[256];       /* the checkpoint to resume from; "" for step 0 */
    int64_t saved_step;         /* the step of the last checkpoint this run wrote; -1: none */
    double timed_ms;            /* summed step time after warmup */
    double timed_tokens;
    int64_t timed_steps;
    double start_ms;
    bool tty;
    int rank, world;
    zt_comm *comm;      /* NULL for one rank */
    zt_rank_stats stats; /* the per-rank memory, step breakdown and system metrics */
    zt_metric *record;   /* [STEP_METRICS + the rank figures' most]: a logged step's record */
    zt_monitor *monitor; /* rank 0's DeepSpeed monitors (tensorboard, csv_monitor); NULL: none */
    zt_pipe *pipe;       /* a pipelined job's stage (it owns e); NULL otherwise */
    int data_rank, data_world; /* the data-parallel rank and size: the replica and dp, piped
                                  or tensor-parallel */
    int tp;                    /* tensor_parallel.autotp_size, 1 without */
    zt_grid grid;              /* this rank's coordinates in dp × pp × tp */
    /* Checkpoints in the tensor-parallel layout (ckpt_tp.h) in tp_dir (checkpoint_dir, or a
     * pipeline stage's directory in it): a TP job's, or any job's whose directory already holds
     * one (it resumes resharded and saves alike). */
    bool tp_ckpt;
    char tp_dir[4200];
    zt_tp_groups groups;       /* with tp > 1: this rank's TP and data-parallel groups */
    bool comm_attached;        /* tp > 1: comm takes the engine's device memory (step table) */
    char ckpt_dir[4200];       /* train.checkpoint_dir, or a pipeline stage's part of it */
    zt_trainer_events events; /* the job's anomaly rules and this step's loss (trainer_events.c) */
    zt_trainer_profile prof;  /* --profile's op timings (trainer_profile.c) */
    bool profiling;
    bool warned_untrained_val; /* evaluate() has said the validation set trains nothing */
} trainer;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void format_duration(char *buf, size_t size, double seconds) {
    if (!isfinite(seconds) || seconds < 0)
        snprintf(buf, size, "?");
    else if (seconds < 60)
        snprintf(buf, size, "%.0fs", seconds);
    else if (seconds < 3600)
        snprintf(buf, size, "%dm%02ds", (int)seconds / 60, (int)seconds % 60);
    else
        snprintf(buf, size, "%dh%02dm", (int)seconds / 3600, ((int)seconds % 3600) / 60);
}

/* The first token file of d (a file, a glob's or a mixture's) with a loss mask beside it, or
 * NULL: `ztrain prepare --format chat` writes one beside every shard. */
static const char *file_with_mask(const zt_dataset *d) {
    if (!d->parts) {
        char mask[4200];
        snprintf(mask, sizeof mask, "%s.mask", d->path ? d->path : "");
        return d->path && access(mask, F_OK) == 0 ? d->path : NULL;
    }
    for (int i = 0; i < d->n_parts; i++) {
        const char *p = file_with_mask(&d->parts[i]);
        if (p)
            return p;
    }
    return NULL;
}

static zt_status open_data(trainer *t) {
    const zt_job_spec *job = t->job;
    ZT_TRY(zt_dataset_open_train(&t->train, &job->data, job->model.vocab_size));
    t->has_train = true;
    /* Masks that the job's format leaves unread would train every token of a conversation, the
     * user's turns and the template's too, without a word. */
    const char *masked = job->data.format == ZT_DATA_FORMAT_TOKENS && t->rank == 0
                             ? file_with_mask(&t->train)
                             : NULL;
    if (masked)
        fprintf(stderr,
                "ztrain: warning: data.train: %s has a loss mask beside it (%s.mask) that "
                "data.format \"tokens\" ignores: every token is trained; set data.format to "
                "\"masked\" to train only the tokens the mask marks\n",
                masked, masked);
    if (job->data.val && job->train.eval_interval > 0) {
        ZT_TRY(zt_dataset_open_val(&t->val, &job->data, job->model.vocab_size));
        t->has_val = true;
        const zt_ds_config *ds = &job->ds;
        ZT_TRY(zt_loader_init(&t->val_loader, &t->val, ds->train_micro_batch_size_per_gpu,
                              job->model.block_size, t->data_rank, t->data_world, false, false,
                              job->train.seed));
        t->has_val_loader = true;
        size_t n = (size_t)ds->train_micro_batch_size_per_gpu * job->model.block_size;
        t->val_inputs = malloc(n * sizeof(int32_t));
        t->val_targets = malloc(n * sizeof(int32_t));
        t->val_pos = malloc(n * sizeof(int32_t));
        if (!t->val_inputs || !t->val_targets || !t->val_pos)
            return zt_error(ZT_ERR_NOMEM, "out of memory");
        /* With tensor parallelism the sample is computed by rank 0's TP group together
         * (sampler.h); rank 0 prints it. */
        if (t->grid.replica == 0 && t->grid.stage == 0 && job->data.sample_tokens > 0) {
            ZT_TRY(zt_eval_sampler_init(&t->sampler, job));
            t->has_sampler = true;
        }
    }
    return ZT_OK;
}

/* The loss over eval_steps validation batches, always the same ones (from the start of the
 * validation set), so successive evaluations are comparable. It is the mean over every trained
 * target of those batches on every data-parallel rank, each batch's mean weighted by its count of
 * trained targets: a batch whose targets are all masked adds nothing (not a 0), and a short last
 * batch counts for its size, as transformers' Trainer weights batches by their samples. With no
 * trained target at all the loss is NaN, as transformers' cross-entropy gives, with a warning. */
static zt_status evaluate(trainer *t, double *loss) {
    zt_loader_seek(&t->val_loader, 0, 0);
    int steps = t->job->train.eval_steps;
    int64_t per_epoch = zt_loader_batches_per_epoch(&t->val_loader);
    if (steps > per_epoch)
        steps = (int)per_epoch;
    /* The last step's update has not been waited for (zt_engine_step): its device error, if it
     * met one, ends the run here rather than in a loss computed from it. */
    ZT_TRY(zt_engine_sync(t->e));
    if (t->pipe)
        return zt_pipe_eval(t->pipe, &t->val_loader, steps, loss);
    double sums[2] = {0.0, 0.0}; /* the loss summed over trained targets, and their count */
    for (int i = 0; i < steps; i++) {
        bool masked = t->job->data.format == ZT_DATA_FORMAT_MASKED;
        zt_batch b = {t->val_inputs, t->val_targets, 0, t->job->model.block_size,
                      masked ? t->val_pos : NULL};
        b.B = zt_loader_next_docs(&t->val_loader, t->val_inputs, t->val_targets,
                                  masked ? t->val_pos : NULL);
        if (b.B < 0)
            return ZT_ERR_IO;
        float l;
        ZT_TRY(zt_engine_eval_loss(t->e, &b, &l));
        int64_t trained = 0;
        for (int64_t k = 0; k < (int64_t)b.B * b.T; k++)
            trained += t->val_targets[k] >= 0;
        sums[0] += (double)l * (double)trained;
        sums[1] += (double)trained;
    }
    if (t->comm)
        ZT_TRY(zt_comm_all_reduce(t->comm, sums, 2, ZT_F64, ZT_REDUCE_SUM));
    *loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
    if (steps > 0 && sums[1] == 0 && t->rank == 0 && !t->warned_untrained_val) {
        fprintf(stderr,
                "ztrain: warning: data.val (%s): the %d validation batch(es) evaluated hold no "
                "trained target (every target is masked): eval loss is NaN\n",
                t->job->data.val, steps);
        t->warned_untrained_val = true;
    }
    return ZT_OK;
}

static int64_t plan_steps(const trainer *t) {
    const zt_job_spec *job = t->job;
    int64_t steps = job->train.max_steps;
    if (steps <= 0) {
        int64_t batches = zt_loader_batches_per_epoch(zt_engine_loader(t->e));
        int64_t per_epoch = batches / job->ds.gradient_accumulation_steps;
        steps = (per_epoch > 0 ? per_epoch : 1) * (job->train.epochs > 0 ? job->train.epochs : 1);
    }
    if (job->train.bench_steps > 0 && t->first_step + job->train.bench_steps < steps)
        steps = t->first_step + job->train.bench_steps;
    return steps;
}

static void show_progress(trainer *t, int64_t step, double loss, double lr, double tok_s,
                          bool final) {
    FILE *out = t->opts->progress;
    if (!out)
        return;
    double per_step = t->timed_steps ? t->timed_ms / t->timed_steps
                                     : (now_ms() - t->start_ms) / (double)(step - t->first_step);
    char eta[32];
    format_duration(eta, sizeof eta, per_step * (double)(t->max_steps - step) / 1e3);
    char speed[32];
    if (isfinite(tok_s))
        snprintf(speed, sizeof speed, "%.1fk tok/s", tok_s / 1e3);
    else
        snprintf(speed, sizeof speed, "warmup");
    if (t->tty) {
        int width = 24, done = (int)(width * step / (t->max_steps ? t->max_steps : 1));
        char bar[32];
        for (int i = 0; i < width; i++)
            bar[i] = i < done ? '#' : '.';
        bar[width] = '\0';
        fprintf(out, "\r[%s] step %lld/%lld | loss %.4f | lr %.2e | %s | ETA %s\033[K", bar,
                (long long)step, (long long)t->max_steps, loss, lr, speed, eta);
        if (final)
            fputc('\n', out);
    } else {
        fprintf(out, "step %lld/%lld | loss %.4f | lr %.2e | %s | ETA %s\n", (long long)step,
                (long long)t->max_steps, loss, lr, speed, eta);
    }
    fflush(out);
}

/* The engine prints DeepSpeed's steps_per_print and wall_clock_breakdown lines during a step; on
 * a terminal they must not be appended to the progress bar. */
static void clear_bar_before_engine_log(trainer *t) {
    const zt_ds_config *ds = &t->job->ds;
    int64_t next = zt_engine_global_steps(t->e) + 1;
    if (t->tty && (ds->wall_clock_breakdown ||
                   (ds->steps_per_print > 0 && next % ds->steps_per_print == 0))) {
        fputs("\r\033[K", t->opts->progress);
        fflush(t->opts->progress);
    }
}

static void print_line(trainer *t, const char *fmt, double v) {
    FILE *out = t->opts->progress;
    if (!out)
        return;
    if (t->tty)
        fputs("\r\033[K", out);
    fprintf(out, fmt, v);
    fflush(out);
}

/* A stop right after an interval checkpoint would save the same step again: the checkpoint this
 * run has just written is the one it would write. */
static zt_status save_checkpoint(trainer *t) {
    int64_t step = zt_engine_global_steps(t->e);
    if (!t->job->train.checkpoint_dir || step == t->saved_step)
        return ZT_OK;
    /* No checkpoint of an update the device failed (zt_engine_step does not wait for it). */
    ZT_TRY(zt_engine_sync(t->e));
    /* A pipeline's stages save as data-parallel jobs of their own (ckpt_pipeline.h), and so do
     * a tensor-parallel job's shards (ckpt_tp.h). */
    if (t->pipe && t->rank == 0)
        ZT_TRY(zt_ckpt_write_pipeline(t->job->train.checkpoint_dir, t->job->pipeline.stages,
                                      t->job->pipeline.partition, zt_pipe_parts(t->pipe)));
    if (t->tp_ckpt && t->grid.replica == 0 && t->grid.tp_rank == 0)
        ZT_TRY(zt_ckpt_write_tp(t->tp_dir, zt_engine_model(t->e)));
    ZT_TRY(t->tp_ckpt ? zt_ckpt_save_tp_shard(t->e, t->job, t->ckpt_dir)
                      : zt_ckpt_save(t->e, t->job, t->ckpt_dir, NULL));
    /* Each stage saves among its replicas only: the step's checkpoint is whole once all are. */
    if ((t->pipe || t->tp_ckpt) && t->comm)
        ZT_TRY(zt_comm_barrier(t->comm));
    t->saved_step = step;
    return ZT_OK;
}

/* The directory whose meta.json tells the run the job continues. A tensor-parallel checkpoint's
 * shards share their tags: shard 0's (it exists at every TP size, which a resharding job's own
 * shard need not). A directory without tp.json holds, if anything, a checkpoint saved
 * without tensor parallelism, which every shard reads whole (zt_ckpt_tp_load); the job's own
 * saves then go to shard directories beside it. */
static const char *resume_dir(const trainer *t, char *shard0, size_t size) {
    if (t->tp_ckpt && zt_ckpt_tp_size(t->tp_dir) > 0) {
        zt_ckpt_tp_shard_dir(shard0, size, t->tp_dir, 0);
        return shard0;
    }
    return t->tp_ckpt ? t->tp_dir : t->ckpt_dir;
}

/* The checkpoint a directory saved without a pipeline would resume ("latest names
 * global_step4"), or false when it holds none. */
static bool plain_checkpoint(const char *dir, char *what, size_t size) {
    zt_ckpt_list l;
    zt_ckpt_list_dir(dir, &l);
    const char *newest = NULL;
    for (int i = 0; i < l.n; i++)
        if (l.items[i].complete)
            newest = l.items[i].tag;
    if (l.latest)
        snprintf(what, size, "its latest names %s", l.latest);
    else if (newest)
        snprintf(what, size, "its newest complete checkpoint is %s", newest);
    bool found = l.latest || newest;
    zt_ckpt_list_free(&l);
    return found;
}

/* A resume in another pipeline layout than the checkpoint's is refused, naming the key, before
 * anything is made: a pipelined job would look for its stages beside a plain checkpoint, start
 * over and hide it (its pipeline.json sends every reader to the stages), and a job of another
 * stage count, or none, would read the stages' tags where they are not. A job that does not
 * resume still saves there, over a checkpoint of its own layout as DeepSpeed does, but one
 * layout beside the other hides the plain checkpoint, the old one or its own new ones. Every
 * rank decides the same from the same files. */
static zt_status check_pipeline_layout(const trainer *t, const char *dir) {
    const int stages = t->job->pipeline.stages > 1 ? t->job->pipeline.stages : 1;
    const bool resume = t->job->train.resume;
    zt_ckpt_pipeline saved;
    int saved_stages = zt_ckpt_pipeline_read(dir, &saved);
    const char *method = saved.partition[0] ? saved.partition : "not recorded";
    char what[512];
    const bool on_plain = saved_stages == 0 && stages > 1 &&
                          plain_checkpoint(dir, what, sizeof what);
    const bool on_pipeline = saved_stages > 0 && stages == 1;
    zt_status s = ZT_OK;
    if (on_plain && !resume)
        s = zt_error(ZT_ERR_INVALID,
                     "%s holds a checkpoint saved without a pipeline (%s): this job "
                     "(pipeline.stages %d, train.resume false) would save its stages beside it, "
                     "and their pipeline.json would hide it from every reader. Give this job "
                     "another checkpoint_dir, or remove that checkpoint first",
                     dir, what, stages);
    else if (on_pipeline && !resume)
        s = zt_error(ZT_ERR_INVALID,
                     "%s holds the checkpoint of a pipeline of %d stages (pipeline.json): this job "
                     "(no \"pipeline\" section, train.resume false) would save beside it, where "
                     "every reader looks for the stages and would not find its checkpoints. Give "
                     "this job another checkpoint_dir, or remove that checkpoint first",
                     dir, saved_stages);
    else if (on_plain)
        s = zt_error(ZT_ERR_INVALID,
                     "%s holds a checkpoint saved without a pipeline (%s), which a job with "
                     "pipeline.stages %d cannot resume: it would start from step 0 beside it and "
                     "hide it. Resume it without the \"pipeline\" section, or give this job "
                     "another checkpoint_dir (`ztrain export %s` writes its weights as one model, "
                     "which model.init_from starts from)",
                     dir, what, stages, dir);
    else if (on_pipeline)
        s = zt_error(ZT_ERR_INVALID,
                     "%s holds the checkpoint of a pipeline of %d stages (pipeline.json, partition "
                     "\"%s\"), which a job without a \"pipeline\" section cannot resume: set "
                     "pipeline.stages to %d to resume it, or give this job another checkpoint_dir "
                     "(`ztrain export %s` writes its weights as one model, which model.init_from "
                     "starts from)",
                     dir, saved_stages, method, saved_stages, dir);
    else if (resume && saved_stages > 0 && saved_stages != stages)
        s = zt_error(ZT_ERR_INVALID,
                     "%s/pipeline.json: pipeline.stages is %d, but the checkpoint was saved by a "
                     "pipeline of %d stages (partition \"%s\"): a resume needs the same stages; "
                     "set pipeline.stages to %d, or give this job another checkpoint_dir",
                     dir, stages, saved_stages, method, saved_stages);
    zt_ckpt_pipeline_free(&saved);
    return s;
}

/* With the stages built: the layers each stage holds must be those its checkpoint saved. A
 * partition method of another name that cuts alike resumes; a marker written before the
 * boundaries were recorded is taken at its word. */
static zt_status check_pipeline_partition(const trainer *t) {
    const char *dir = t->job->train.checkpoint_dir;
    zt_ckpt_pipeline saved;
    zt_status s = ZT_OK;
    const int stages = t->job->pipeline.stages, *parts = zt_pipe_parts(t->pipe);
    if (zt_ckpt_pipeline_read(dir, &saved) == stages && saved.parts &&
        memcmp(saved.parts, parts, sizeof *parts * ((size_t)stages + 1)) != 0) {
        char want[256], got[256];
        zt_ckpt_pipeline_describe_parts(saved.parts, stages, got, sizeof got);
        zt_ckpt_pipeline_describe_parts(parts, stages, want, sizeof want);
        s = zt_error(ZT_ERR_INVALID,
                     "%s/pipeline.json: pipeline.partition \"%s\" cuts the layers (embed, %d "
                     "blocks, head) into stages at %s, but the checkpoint's stages were cut at %s "
                     "(partition \"%s\"): each stage resumes the layers it saved; set "
                     "pipeline.partition to \"%s\", or give this job another checkpoint_dir",
                     dir, t->job->pipeline.partition, t->job->model.n_layer, want, got,
                     saved.partition, saved.partition);
    }
    zt_ckpt_pipeline_free(&saved);
    return s;
}

/* Decides, before anything is created, what a resumable job starts from (zt_ckpt_find_resume),
 * so that a checkpoint_dir whose `latest` leads nowhere neither fails late nor starts over
 * silently. Rank 0 prints the notice, if any. */
static zt_status choose_resume(trainer *t) {
    char note[4096];
    /* The whole checkpoint_dir, so that every stage and shard resumes from a tag all have. */
    const char *dir = t->job->train.checkpoint_dir;
    t->resume_tag[0] = '\0';
    if (!dir || !dir[0])
        return ZT_OK;
    /* Resuming, a damaged layout marker is named before the layout it should say is compared. */
    if (t->job->train.resume)
        ZT_TRY(zt_ckpt_find_resume(dir, t->resume_tag, sizeof t->resume_tag, note, sizeof note));
    ZT_TRY(check_pipeline_layout(t, t->job->train.checkpoint_dir));
    if (!t->job->train.resume)
        return ZT_OK;
    if (note[0] && t->opts->progress) {
        fprintf(t->opts->progress, "%s\n", note);
        fflush(t->opts->progress);
    }
    return ZT_OK;
}

/* The stages of a pipeline resume from the same step, or not at all: a save killed after some
 * stages had finished leaves them apart. */
static zt_status agree_on_resume(trainer *t) {
    const char *digits = strpbrk(t->resume_tag, "0123456789");
    double step[2] = {digits ? atof(digits) : 0.0, 0.0};
    step[1] = -step[0];
    ZT_TRY(zt_comm_all_reduce(t->comm, step, 2, ZT_F64, ZT_REDUCE_MAX));
    if (step[0] != -step[1])
        return zt_error(ZT_ERR_FORMAT, "%s: the pipeline's stages would resume from different "
                        "steps (%g to %g): a save did not finish on every stage; delete the "
                        "newer stage checkpoints",
                        t->job->train.checkpoint_dir, -step[1], step[0]);
    return ZT_OK;
}

static zt_status maybe_resume(trainer *t) {
    const char *dir = t->ckpt_dir;
    if (t->pipe && t->job->train.resume && t->job->train.checkpoint_dir) {
        ZT_TRY(check_pipeline_partition(t));
        ZT_TRY(agree_on_resume(t));
    }
    if (!t->resume_tag[0])
        return ZT_OK;
    if (t->tp_ckpt)
        ZT_TRY(zt_ckpt_tp_load(t->e, t->tp_dir, t->resume_tag));
    else
        ZT_TRY(zt_ckpt_load(t->e, dir, t->resume_tag));
    if (t->opts->progress)
        fprintf(t->opts->progress, "resumed from %s/%s at step %lld\n",
                t->tp_ckpt ? t->tp_dir : dir, t->resume_tag,
                (long long)zt_engine_global_steps(t->e));
    if (t->rank == 0) {
        char shard0[4200];
        zt_ckpt_warn_changes(resume_dir(t, shard0, sizeof shard0), t->resume_tag, t->job,
                             stderr);
    }
    return ZT_OK;
}

/* The attention implementation the CUDA backend chose (kernels/cuda/attention/attention.c:
 * cuDNN's fused attention or ztrain's flash kernel), as a record's kernels/attention_cudnn (1 or
 * 0), and the bias gradient's way (kernels/bias_grad_epilogue), once a run: facts of the run
 * that the records keep beside the figures they explain. Adds to m[n]. */
static int record_attention(trainer *t, zt_metric *m, int n) {
    if (t->attention_recorded || t->job->device != ZT_DEVICE_CUDA)
        return n;
    const char *(*choice)(void) = NULL;
    *(void **)&choice = zt_backend_cuda_symbol("zt_cuda_attention_choice");
    const char *c = choice ? choice() : NULL;
    if (!c)
        return n;
    t->attention_recorded = true;
    m[n++] = (zt_metric){"kernels/attention_cudnn", strcmp(c, "cudnn") == 0 ? 1.0 : 0.0};
    /* How the linear layers' bias gradient was taken (linear.cu): 1 from cuBLASLt's epilogue on
     * the weight-gradient GEMM, 0 from the row-tile sums; absent in a model without biases. */
    const char *(*bias_grad)(void) = NULL;
    *(void **)&bias_grad = zt_backend_cuda_symbol("zt_cuda_bias_grad_choice");
    const char *b = bias_grad ? bias_grad() : NULL;
    if (b)
        m[n++] = (zt_metric){"kernels/bias_grad_epilogue",
                             strcmp(b, "epilogue") == 0 ? 1.0 : 0.0};
    /* Beside it, the products so far that rounded their weight from fp32 rather than read its
     * 16-bit twin (linear.cu): 0 in a mixed-precision job whose products read the twin. */
    unsigned long long (*rounded)(zt_backend *) = NULL;
    *(void **)&rounded = zt_backend_cuda_symbol("zt_cuda_weights_rounded");
    if (rounded && t->e)
        m[n++] = (zt_metric){"kernels/weights_rounded", (double)rounded(zt_engine_model(t->e)->ctx.be)};
    return n;
}

/* Metrics are written by rank 0 only. */
static zt_status write_metrics(trainer *t, const zt_metric *m, int n) {
    return t->rank == 0 ? zt_metrics_write(&t->metrics, m, n) : ZT_OK;
}

/* A stop request on any rank stops every rank before the same step: several ranks' requests
 * came with the last step's sums, in the engine's step table under its one wait (the gate's,
 * trainer_events.h; a pipeline's, the one value of its table); one rank reads its own. */
static bool stop_agreed(const trainer *t) {
    if (!t->comm)
        return zt_stop_is_requested(t->opts->stop_requested);
    if (!t->pipe)
        return zt_trainer_events_stop_requested(&t->events);
    const double *table = zt_engine_step_table(t->e);
    const int cols = t->job->ds.gradient_accumulation_steps + 1;
    for (int r = 0; table && r < t->world; r++)
        if (table[(size_t)r * (size_t)cols + cols - 1] > 0.0)
            return true;
    return false;
}

/* The host's time blocked waiting for a CUDA device so far (NaN on the CPU). */
static double device_wait_ms(const trainer *t) {
    zt_cuda_waits w;
    if (t->job->device != ZT_DEVICE_CUDA ||
        zt_backend_cuda_waits(zt_engine_model(t->e)->ctx.be, &w) != ZT_OK)
        return NAN;
    return w.wait_ms;
}

/* This rank's memory at a logged step (zt_rank_memory). The device's counts are filled even when
 * its free and total cannot be read (backend.h): a failing device is the step's sync's to
 * report, and a rank that returned here would leave the others waiting in the collective. */
static zt_rank_memory rank_memory(trainer *t) {
    zt_rank_memory m = {.model = zt_engine_take_memory(t->e)};
    if (t->job->device == ZT_DEVICE_CUDA)
        (void)zt_backend_cuda_memory(zt_engine_model(t->e)->ctx.be, &m.device);
    return m;
}

/* What DeepSpeed's engine.step() hands its monitors at each optimizer step (engine.py), at the
 * global sample count: the lr the next step uses, and with fp16 the loss scale after this step;
 * with wall_clock_breakdown the step's phase times. Also the step's loss as train_loss, which
 * DeepSpeed's pipeline engine (and its base engine before 0.19) writes: the mean over the ranks. */
static zt_status write_monitor(trainer *t, double loss) {
    if (!t->monitor)
        return ZT_OK;
    const zt_ds_config *ds = &t->job->ds;
    zt_monitor_event ev[8] = {{"Train/Samples/train_loss", loss},
                              {"Train/Samples/lr", zt_engine_get_lr(t->e)}};
    int n = 2;
    if (ds->fp16.enabled)
        ev[n++] = (zt_monitor_event){"Train/Samples/loss_scale", zt_engine_loss_scale(t->e)};
    if (ds->wall_clock_breakdown) {
        zt_engine_timers tm = zt_engine_get_timers(t->e);
        ev[n++] = (zt_monitor_event){"Train/Samples/elapsed_time_ms_forward", tm.forward_ms};
        ev[n++] = (zt_monitor_event){"Train/Samples/elapsed_time_ms_backward", tm.backward_ms};
        ev[n++] = (zt_monitor_event){"Train/Samples/elapsed_time_ms_backward_inner",
                                     tm.backward_ms - tm.backward_comm_ms};
        ev[n++] = (zt_monitor_event){"Train/Samples/elapsed_time_ms_backward_allreduce",
                                     tm.backward_comm_ms};
        ev[n++] = (zt_monitor_event){"Train/Samples/elapsed_time_ms_step", tm.step_ms};
    }
    return zt_monitor_write(t->monitor, ev, n, zt_engine_global_samples(t->e));
}

/* An event whose policy is checkpoint_and_stop: the step's update was not applied, the weights
 * are those before it, and they are saved before the run ends with the event as its error. */
static zt_status stop_for_event(trainer *t, int64_t step) {
    char why[512];
    zt_trainer_events_stop_reason(&t->events, why, sizeof why);
    ZT_TRY(save_checkpoint(t));
    if (t->job->train.checkpoint_dir)
        return zt_error(ZT_ERR_NUMERIC, "stopped at step %lld by %s; checkpoint written to %s",
                        (long long)step, why, t->job->train.checkpoint_dir);
    return zt_error(ZT_ERR_NUMERIC, "stopped at step %lld by %s (the job has no checkpoint_dir: "
                    "no checkpoint written)", (long long)step, why);
}

static zt_status train_loop(trainer *t, zt_train_result *res) {
    const zt_job_spec *job = t->job;
    const int gas = job->ds.gradient_accumulation_steps;
    double flops_per_token = zt_engine_model(t->e)->ops->flops_per_token(zt_engine_model(t->e));
    /* A stage's model counts its own layers: the whole model's are the stages' sum (over every
     * rank, divided by the replicas). */
    if (t->pipe || t->tp > 1) {
        ZT_TRY(zt_comm_all_reduce(t->comm, &flops_per_token, 1, ZT_F64, ZT_REDUCE_SUM));
        flops_per_token /= t->data_world;
    }
    /* perf/mfu: the achieved FLOP/s over the dense bf16 peak of every rank's GPU (ztrain/gpu.h's
     * table); no peak, and no MFU, on the CPU. */
    const zt_backend *be = zt_engine_model(t->e)->ctx.be;
    const double peak = be->device == ZT_DEVICE_CUDA ? zt_gpu_peak_of(be->device_index, NULL) : 0;
    double last_loss = NAN;
    t->start_ms = now_ms();
    while (zt_engine_global_steps(t->e) < t->max_steps) {
        if (stop_agreed(t)) {
            res->stopped = true;
            break;
        }
        double lr = zt_engine_get_lr(t->e);
        clear_bar_before_engine_log(t);
        double t0 = now_ms(), tokens = 0.0;
        zt_rank_step rs = {.comm = zt_comm_thread_ms(), .device_wait = device_wait_ms(t)};
        zt_pipe_batch_result piped = {0};
        if (t->profiling)
            zt_trainer_profile_begin(&t->prof);
        if (t->pipe) {
            double *stop_in = zt_engine_step_table_in(t->e);
            if (stop_in)
                *stop_in = zt_stop_is_requested(t->opts->stop_requested) ? 1.0 : 0.0;
            ZT_TRY(zt_pipe_train_batch(t->pipe, &piped));
            tokens = piped.tokens;
        } else {
            zt_trainer_events_begin_step(&t->events);
        }
        for (int micro = 0; micro < gas && !t->pipe; micro++) {
            zt_batch b;
            double d0 = now_ms();
            ZT_TRY(zt_engine_next_batch(t->e, &b));
            zt_rank_stats_inject_delay(&t->stats);
            rs.data += now_ms() - d0;
            /* The loss is not waited for: the engine reads the step's losses back at its one
             * synchronisation, before the gate judges them (zt_engine_step_losses). */
            ZT_TRY(zt_engine_forward(t->e, &b, NULL));
            ZT_TRY(zt_engine_backward(t->e));
            zt_trainer_events_add_micro(&t->events, (double)b.B * b.T);
            ZT_TRY(zt_engine_step(t->e));
        }
        /* The step's loss and tokens over all ranks (each rank's mean counts equally, as
         * DeepSpeed averages the ranks' gradients), summed by the gate before the update; a
         * pipeline's come from its last stage. */
        double sums[2] = {0.0, tokens};
        if (!t->pipe)
            ZT_TRY(zt_trainer_events_step_sums(&t->events, sums));
        /* A replica's TP ranks read the same tokens: each counts them once. */
        tokens = t->pipe ? sums[1] : sums[1] / t->tp;
        if (t->profiling)
            ZT_TRY(zt_trainer_profile_wait(&t->prof));
        double step_ms = now_ms() - t0;
        rs.step_time = step_ms;
        rs.comm = zt_comm_thread_ms() - rs.comm;
        rs.device_wait = device_wait_ms(t) - rs.device_wait;
        rs.engine = zt_engine_get_timers(t->e);
        zt_rank_stats_step(&t->stats, &rs);
        int64_t step = zt_engine_global_steps(t->e);
        last_loss = t->pipe ? piped.loss : sums[0] / t->world;
        if (!t->pipe && zt_trainer_events_stop(&t->events))
            return stop_for_event(t, step);
        if (!isfinite(last_loss) && (t->pipe || !zt_trainer_events_held(&t->events)))
            return zt_error(ZT_ERR_NUMERIC, "training diverged: loss is %g at step %lld",
                            last_loss, (long long)step);
        ZT_TRY(write_monitor(t, last_loss));
        bool timed = step - t->first_step > job->train.warmup_steps;
        if (t->profiling)
            ZT_TRY(zt_trainer_profile_end(&t->prof, step, step_ms, timed));
        double tok_s = NAN, tflops = NAN;
        if (timed) {
            t->timed_ms += step_ms;
            t->timed_tokens += tokens;
            t->timed_steps++;
            tok_s = tokens / (step_ms / 1e3);
            tflops = tok_s * flops_per_token / 1e12;
        }
        bool last = step == t->max_steps;
        bool logged = step % job->train.log_interval == 0 || last;
        if (t->tty && !logged)
            show_progress(t, step, last_loss, lr, tok_s, false);
        if (logged) {
            zt_loader *l = zt_engine_loader(t->e);
            int64_t ep, pos;
            zt_engine_data_position(t->e, &ep, &pos);
            double epoch = (double)ep + (double)pos / (double)(l->per_rank ? l->per_rank : 1);
            zt_metric m[STEP_METRICS] = {
                {"train/global_step", (double)step},
                {"train/loss", last_loss},
                {"train/learning_rate", lr},
                {"train/grad_norm", zt_engine_global_grad_norm(t->e)},
                {"train/epoch", epoch},
                {"train/samples", (double)zt_engine_global_samples(t->e)},
                {"train/skipped_steps", (double)zt_engine_skipped_steps(t->e)},
                {"perf/step_time_ms", step_ms},
                {"perf/tokens_per_second", tok_s},
                {"perf/tflops", tflops},
            };
            /* Warmup steps carry no perf figures: they are left out of timing. */
            int n = timed ? 10 : 8;
            if (timed && peak > 0)
                m[n++] = (zt_metric){"perf/mfu", tflops * 1e12 / (peak * t->world)};
            if (job->ds.fp16.enabled)
                m[n++] = (zt_metric){"train/loss_scale", zt_engine_loss_scale(t->e)};
            /* Loss-masked data: the loss's divisor beside all the step's targets. */
            if (job->data.format == ZT_DATA_FORMAT_MASKED) {
                double all;
                m[n++] = (zt_metric){"train/trained_tokens", zt_engine_trained_tokens(t->e, &all)};
                m[n++] = (zt_metric){"train/tokens", all};
            }
            /* A pipeline's measured bubble: idle time over the schedule's time. */
            if (t->pipe)
                m[n++] = (zt_metric){"perf/pipeline_bubble", piped.bubble};
            n = record_attention(t, m, n);
            memcpy(t->record, m, sizeof(zt_metric) * n);
            zt_rank_memory mem = rank_memory(t);
            int n_ranks;
            ZT_TRY(zt_rank_stats_collect(&t->stats, t->comm, &mem, t->record + n, &n_ranks));
            ZT_TRY(write_metrics(t, t->record, n + n_ranks));
            show_progress(t, step, last_loss, lr, tok_s, last);
        }
        if (t->has_val && step % job->train.eval_interval == 0) {
            double eval_loss;
            ZT_TRY(evaluate(t, &eval_loss));
            zt_metric m[] = {{"train/global_step", (double)step}, {"eval/loss", eval_loss}};
            ZT_TRY(write_metrics(t, m, 2));
            res->final_eval_loss = eval_loss;
            char fmt[64];
            snprintf(fmt, sizeof fmt, "step %lld | eval loss %%.4f\n", (long long)step);
            print_line(t, fmt, eval_loss);
            FILE *shown = t->rank == 0 ? t->opts->progress : NULL;
            if (t->has_sampler && (shown || t->tp > 1)) {
                if (t->tty && shown)
                    fputs("\r\033[K", shown);
                ZT_TRY(zt_eval_sampler_run(&t->sampler, zt_engine_model(t->e), step, shown));
            }
        }
        if (job->train.checkpoint_interval > 0 && step % job->train.checkpoint_interval == 0 &&
            !last)
            ZT_TRY(save_checkpoint(t));
    }
    /* The last update has not been waited for: a device error it met fails the run. */
    ZT_TRY(zt_engine_sync(t->e));
    res->steps = zt_engine_global_steps(t->e);
    res->first_step = t->first_step;
    res->max_steps = t->max_steps;
    res->max_steps_from_epochs = job->train.max_steps <= 0;
    res->final_loss = last_loss;
    res->tokens_per_second = t->timed_steps ? t->timed_tokens / (t->timed_ms / 1e3) : NAN;
    res->tflops = res->tokens_per_second * flops_per_token / 1e12;
    if (t->profiling) {
        if (t->tty && t->opts->progress)
            fputs("\r\033[K", t->opts->progress);
        zt_trainer_profile_print(&t->prof, t->opts->progress);
    }
    return save_checkpoint(t);
}

/* Refuses what would only fail after training had run for a while. */
static zt_status check_job(const zt_job_spec *job, int world) {
    if (job->world_size != world)
        return zt_error(ZT_ERR_INVALID,
                        "world_size is %d but %d rank(s) were started (run multi-rank jobs with "
                        "`ztrain run`, or a launcher that sets WORLD_SIZE)",
                        job->world_size, world);
    if (!job->ds.has_optimizer)
        return zt_error(ZT_ERR_INVALID,
                        "deepspeed: the config has no \"optimizer\" section, which training "
                        "needs");
    /* A sample is generated by rank 0 alone, which at stage 3 holds only its part of the
     * weights. */
    if (job->data.sample_tokens > 0 && job->ds.zero.stage == 3 && world > 1)
        return zt_error(ZT_ERR_UNSUPPORTED,
                        "data.sample_tokens: samples at evaluation need the whole model on rank "
                        "0, which ZeRO stage 3 on %d ranks partitions",
                        world);
    if (job->data.sample_tokens > 0 && job->pipeline.stages > 1)
        return zt_error(ZT_ERR_UNSUPPORTED,
                        "data.sample_tokens: samples at evaluation need the whole model on rank "
                        "0, which pipeline.stages %d splits", job->pipeline.stages);
    if (job->train.checkpoint_dir)
        return zt_mkdirs(job->train.checkpoint_dir);
    return ZT_OK;
}

zt_status zt_train_run(const zt_job_spec *job, const zt_train_options *opts, zt_train_result *res) {
    trainer t = {.job = job, .opts = opts, .saved_step = -1};
    memset(res, 0, sizeof *res);
    res->final_eval_loss = NAN;
    res->final_loss = NAN;
    t.tty = opts->progress && isatty(fileno(opts->progress));

    t.rank = opts->dist ? opts->dist->rank : 0;
    t.world = opts->dist ? opts->dist->world_size : 1;
    t.comm = t.world > 1 ? opts->comm : NULL;
    /* The data-parallel rank is the replica in the grid dp × pp × tp, tp innermost (tp.h; with
     * tp 1 DeepSpeed's pipeline grid). */
    bool grid = job->pipeline.stages > 1;
    t.tp = job->ds.tp_size > 1 ? job->ds.tp_size : 1;
    zt_grid tpg;
    zt_status gs = zt_grid_of(t.rank, t.world, job->pipeline.stages > 1 ? job->pipeline.stages : 1,
                              t.tp, &tpg);
    t.data_world = tpg.dp;
    t.data_rank = tpg.replica;
    t.grid = tpg;
    /* A pipeline's stages save in directories of their own, and a TP job's shards in theirs
     * below (a pipeline's stage directory is then a TP checkpoint directory). */
    if (job->train.checkpoint_dir && grid)
        zt_ckpt_stage_dir(t.tp_dir, sizeof t.tp_dir, job->train.checkpoint_dir, tpg.stage);
    else if (job->train.checkpoint_dir)
        snprintf(t.tp_dir, sizeof t.tp_dir, "%s", job->train.checkpoint_dir);
    t.tp_ckpt = job->train.checkpoint_dir && (t.tp > 1 || zt_ckpt_tp_size(t.tp_dir) > 0);
    if (t.tp_ckpt)
        zt_ckpt_tp_shard_dir(t.ckpt_dir, sizeof t.ckpt_dir, t.tp_dir, tpg.tp_rank);
    else if (job->train.checkpoint_dir)
        snprintf(t.ckpt_dir, sizeof t.ckpt_dir, "%s", t.tp_dir);
    /* The first collective: ranks started with different jobs fail here, naming the key. */
    zt_status s = gs;
    if (s == ZT_OK && t.comm)
        s = zt_train_check_agreement(job, t.comm);
    if (s == ZT_OK)
        s = choose_resume(&t);
    if (s == ZT_OK)
        s = check_job(job, t.world);
    if (s == ZT_OK && t.world > 1 && !t.comm)
        s = zt_error(ZT_ERR_INVALID, "rank %d of %d has no communicator", t.rank, t.world);
    if (s == ZT_OK)
        s = open_data(&t);
    if (s == ZT_OK) {
        zt_engine_options eo = {.seed = job->train.seed, .shuffle = job->data.shuffle,
                                .rank = t.rank, .job_rank = t.rank, .comm = t.comm,
                                .device = job->device, .threads = opts->threads,
                                .log = t.rank == 0 ? opts->progress : NULL,
                                .job_name = job->name};
        if (job->pipeline.stages > 1) {
            s = zt_pipe_create(&t.pipe, job, &t.train, t.comm, &eo);
            t.e = s == ZT_OK ? zt_pipe_engine(t.pipe) : NULL;
        } else if (t.tp > 1) {
            s = zt_tp_groups_create(&t.groups, t.comm, &tpg);
            eo.comm = t.groups.dp;
            eo.rank = tpg.replica;
            eo.tp_size = t.tp;
            eo.tp_rank = tpg.tp_rank;
            eo.tp_comm = t.groups.tp;
            if (s == ZT_OK)
                s = zt_engine_create(&t.e, &job->ds, &job->model, &t.train, &eo);
            /* The step table (trainer_events.h) spans every rank of the job, whose
             * communicator then takes device memory too. */
            if (s == ZT_OK && t.comm) {
                s = zt_comm_attach_backend(t.comm, zt_engine_model(t.e)->ctx.be);
                t.comm_attached = s == ZT_OK;
            }
        } else {
            s = zt_engine_create(&t.e, &job->ds, &job->model, &t.train, &eo);
        }
    }
    if (s == ZT_OK)
        s = zt_rank_stats_init(&t.stats, t.rank, t.world, opts->dist ? opts->dist->local_rank : 0,
                               job->device, zt_engine_mixed_precision(t.e), opts->progress);
    if (s == ZT_OK) {
        t.record = calloc(STEP_METRICS + (size_t)zt_rank_stats_max_metrics(&t.stats),
                          sizeof *t.record);
        if (!t.record)
            s = zt_error(ZT_ERR_NOMEM, "out of memory for the metric record of %d ranks", t.world);
    }
    if (s == ZT_OK && !t.pipe) /* pipelines take no anomaly rules (job_pipeline.c) */
        s = zt_trainer_events_init(&t.events, job, t.e, t.comm, t.rank, t.world,
                                   opts->stop_requested);
    /* A pipeline's ranks share only their stop requests, in the stage engines' step table over
     * the job's communicator (which the pipeline gives device memory). */
    if (s == ZT_OK && t.pipe && t.comm)
        s = zt_engine_set_step_table(t.e, 1, t.comm);
    if (s == ZT_OK && t.rank == 0)
        s = zt_monitor_open(&t.monitor, &job->ds.monitor);
    if (s == ZT_OK)
        s = maybe_resume(&t);
    if (s == ZT_OK && opts->out_dir && t.rank == 0) {
        char path[4200];
        s = zt_mkdirs(opts->out_dir);
        /* The run directory records what the DeepSpeed config came to, "auto" values resolved. */
        if (s == ZT_OK)
            s = zt_job_spec_write_effective(job, opts->out_dir);
        snprintf(path, sizeof path, "%s/metrics.jsonl", opts->out_dir);
        /* A resumable job's records are appended, also when it starts from step 0: an earlier
         * run's metrics.jsonl in the same directory is never truncated. */
        if (s == ZT_OK)
            s = zt_metrics_open(&t.metrics, path,
                                job->train.resume || zt_engine_global_steps(t.e) > 0);
        /* The same records as TensorBoard event files, a new file per run as SummaryWriter
         * makes: a resumed run's steps continue in it. */
        snprintf(path, sizeof path, "%s/%s", opts->out_dir, ZT_METRICS_TB_DIR);
        if (s == ZT_OK)
            s = zt_metrics_tensorboard(&t.metrics, path);
    } else if (s == ZT_OK) {
        s = zt_metrics_open(&t.metrics, "/dev/null", true);
    }
    /* Last before the loop: the ops of initialisation and resuming are not a step's. */
    if (s == ZT_OK && opts->profile) {
        s = zt_trainer_profile_init(&t.prof, job, zt_engine_model(t.e)->ctx.be, t.rank,
                                    opts->out_dir);
        t.profiling = s == ZT_OK;
    }
    if (s == ZT_OK) {
        t.first_step = zt_engine_global_steps(t.e);
        t.max_steps = plan_steps(&t);
        if (!t.pipe)
            zt_trainer_events_report_to(&t.events, &t.metrics, opts->progress, opts->out_dir);
        if (t.rank == 0 && opts->metrics_fd > 0) {
            zt_metrics_mirror(&t.metrics, opts->metrics_fd);
            zt_metrics_event(&t.metrics, "running", (long long)t.first_step,
                             (long long)t.max_steps);
        }
        s = train_loop(&t, res);
    }
    if (t.profiling)
        zt_trainer_profile_free(&t.prof);
    if (t.metrics.f)
        zt_metrics_close(&t.metrics);
    zt_monitor_close(t.monitor);
    if (t.comm_attached)
        zt_comm_attach_backend(t.comm, NULL);
    if (t.pipe) {
        zt_pipe_destroy(t.pipe);
    } else {
        zt_trainer_events_free(&t.events);
        zt_engine_destroy(t.e);
    }
    zt_tp_groups_destroy(&t.groups);
    free(t.record);
    zt_rank_stats_free(&t.stats);
    if (t.has_val_loader)
        zt_loader_free(&t.val_loader);
    free(t.val_inputs);
    free(t.val_targets);
    free(t.val_pos);
    if (t.has_sampler)
        zt_eval_sampler_free(&t.sampler);
    if (t.has_val)
        zt_dataset_close(&t.val);
    if (t.has_train)
        zt_dataset_close(&t.train);
    return s;
}

void zt_train_result_print(const zt_train_result *res, FILE *f) {
    if (res->steps == res->first_step && res->first_step >= res->max_steps) {
        fprintf(f, "done: nothing to train: the checkpoint is at step %lld, at or past %s %lld\n",
                res->first_step, res->max_steps_from_epochs ? "the last step of train.epochs"
                                                            : "train.max_steps",
                res->max_steps);
        return;
    }
    fprintf(f, "done: %lld steps", res->steps);
    if (res->final_loss == res->final_loss)
        fprintf(f, ", final loss %.4f", res->final_loss);
    if (res->final_eval_loss == res->final_eval_loss)
        fprintf(f, ", eval loss %.4f", res->final_eval_loss);
    if (res->tokens_per_second == res->tokens_per_second)
        fprintf(f, ", %.0f tokens/s, %.3f TFLOPS", res->tokens_per_second, res->tflops);
    fprintf(f, "\n");
}
