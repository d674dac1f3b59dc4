/* The pipeline engine (pipe_engine.h): builds one rank's stage and runs its schedule's commands —
 * loading micro-batches, forward and backward through the model's stage API, activations and
 * their gradients to and from the neighbouring stages of the same replica, the tied embedding's
 * gradient summed between the first and last stage, and the optimizer step of the engine it
 * owns, whose ZeRO partitioner reduces over the stage's replicas and whose gradient norm sums
 * over the replica's stages. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ztrain/fault_inject.h"
#include "ztrain/pipe_engine.h"
#include "pipe_layers.h"
#include "ztrain/pipeline.h"
#include "ztrain/tp.h"

/* One pipe buffer: a micro-batch between its forward and its backward. */
typedef struct {
    int32_t *tokens, *targets; /* [max_B · T]: the first stage feeds tokens, the last targets */
    /* Loss-masked data, [max_B · T]: the inputs' positions in their packed documents as this
     * stage loaded them (every stage draws every micro-batch). */
    int32_t *doc_pos;
    int B;                     /* the micro-batch's sequences */
    int micro;                 /* the micro-batch loaded into it (of the step or evaluation) */
    int counted;               /* targets that count in the loss */
    void *in_act, *out_act;    /* [max_B · T · C] at activation precision */
    void *din, *dout;          /* gradients of in_act and out_act */
} pipe_buffer;

struct zt_pipe {
    zt_pipe_info info;
    const zt_job_spec *job;
    zt_comm *world;
    zt_comm *dp_comm;    /* the stage's replicas; NULL with dp 1 */
    zt_comm *stage_comm; /* the replica's stages */
    zt_comm *tied_comm;  /* first and last stage of the replica, when the model ties a tensor */
    /* With tensor parallelism: the stage's TP shards of this replica, and every rank of this
     * replica (its stages × its shards), over which the gradient norm is summed. */
    zt_comm *tp_comm, *mp_comm;
    zt_grid grid;
    zt_model_stage ms;
    zt_engine *e;
    zt_model *m;
    zt_backend *be;
    int T, C, max_B;
    /* How activations travel: the backend's storage of ctx.act (the CPU keeps 16-bit
     * activations as fp32 values rounded to 16 bits, so they travel as fp32, exactly). */
    zt_dtype wire;
    bool attached, tied_attached; /* world, tied_comm have the backend attached */
    /* Loss-masked data (data.format "masked"): every stage's attention and positions restart at
     * each document. In training every stage draws each micro-batch's positions itself; in
     * evaluation they travel with the activation (the later stages read no data). */
    bool docs;
    /* The model keeps doc_slots pinned host slots of document tables (zt_model.upload_slots:
     * a set before each micro-batch's forward and again before its backward, so two per
     * micro-batch of the step); doc_sets counts the sets since the last wait for the device,
     * which set_documents makes itself before a set that would reuse a slot still in flight
     * (only a long evaluation does). */
    int doc_slots, doc_sets;
    /* Training: each micro-batch's hash as this stage drew it (batch_hash, hash_value),
     * compared between the stages in the step's agreement; host_sum, the host collective's
     * values where stage_comm has no device path. */
    double *batch_sum, *host_sum;
    size_t act_bytes; /* one activation buffer */
    pipe_buffer *buf;
    int nbuf;
    zt_pipe_cmd *train;
    size_t n_train;
    size_t tied_off, tied_n; /* the tied tensor in this stage's flat buffer (tied_comm) */
    /* The batch in flight. */
    double loss_sum, tokens, compute_ms, sched_ms;
    /* The step's loss as the stages agree on it (agree_enqueue): [micro_batches] the last
     * stage's summed token losses (its forwards sum into them on the device), as many trained
     * targets and loss shares, the tokens and the stage's share of the bubble; summed over the
     * stages on the device when stage_comm reads device memory (NCCL), and read back with the
     * step's one synchronisation. Device memory, the pinned values uploaded into it, and the
     * pinned read-back. */
    double *agree_dev, *agree_in, *agree_out;
    /* Evaluation's agreement, laid out as the training step's (agree_eval): eval_dev holds each
     * stage's hash of the micro-batches it drew (batch_hash; a row a stage, uploaded from
     * eval_in), then the last stage's sums of each micro-batch's token losses (its forwards
     * write them; eval_cap micro-batches, grown to the evaluation's length), read back into
     * eval_out once at the end; every stage's own counts of each micro-batch's trained targets
     * in eval_counted. */
    double *eval_dev, *eval_in, *eval_out;
    int *eval_counted;
    int eval_cap;
    uint64_t eval_hash;
    size_t agree_n;
    size_t agree_checks; /* where each stage's gas checksums start (stage-major) */
    bool agree_native; /* stage_comm sums device memory itself */
    bool stage_attached, mp_attached; /* stage_comm, mp_comm have the backend attached */
    int64_t kill_step; /* ZTRAIN_INJECT_PIPE_KILL (tests): die in this step's schedule */
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

zt_engine *zt_pipe_engine(zt_pipe *p) { return p->e; }
zt_pipe_info zt_pipe_get_info(const zt_pipe *p) { return p->info; }

zt_comm_dev_stats zt_pipe_dev_counts(const zt_pipe *p) {
    zt_comm *const all[] = {p->world, p->dp_comm, p->stage_comm, p->tied_comm, p->tp_comm,
                            p->mp_comm};
    return zt_comm_dev_counts_sum(all, sizeof all / sizeof all[0]);
}

static bool first_stage(const zt_pipe *p) { return p->info.stage == 0; }
static bool last_stage(const zt_pipe *p) { return p->info.stage == p->info.stages - 1; }
/* The rank of (stage, replica) holding this rank's TP shard. */
static int grid_rank(const zt_pipe *p, int stage, int replica) {
    return zt_grid_rank(&p->grid, stage, replica, p->grid.tp_rank);
}

static int neighbour(const zt_pipe *p, int delta) {
    return grid_rank(p, p->info.stage + delta, p->info.replica);
}

/* The groups this rank belongs to: its stage's replicas and its replica's stages (of its own TP
 * shard), and with TP its stage's shards and the whole replica. */
static zt_status make_groups(zt_pipe *p) {
    const zt_pipe_info *in = &p->info;
    const zt_grid *g = &p->grid;
    int ranks[ZT_MAX_WORLD];
    if (in->dp > 1) {
        for (int r = 0; r < in->dp; r++)
            ranks[r] = grid_rank(p, in->stage, r);
        ZT_TRY(zt_comm_create_group(&p->dp_comm, p->world, ranks, in->dp));
    }
    for (int s = 0; s < in->stages; s++)
        ranks[s] = grid_rank(p, s, in->replica);
    ZT_TRY(zt_comm_create_group(&p->stage_comm, p->world, ranks, in->stages));
    if (g->tp == 1)
        return ZT_OK;
    for (int t = 0; t < g->tp; t++)
        ranks[t] = zt_grid_rank(g, in->stage, in->replica, t);
    ZT_TRY(zt_comm_create_group(&p->tp_comm, p->world, ranks, g->tp));
    for (int s = 0; s < in->stages; s++)
        for (int t = 0; t < g->tp; t++)
            ranks[s * g->tp + t] = zt_grid_rank(g, s, in->replica, t);
    return zt_comm_create_group(&p->mp_comm, p->world, ranks, in->stages * g->tp);
}

/* The last stage says whether it holds a tied copy, and of which tensor; the first and the last
 * stage then share a group for its gradient. */
static zt_status find_tied(zt_pipe *p) {
    char name[64] = "";
    if (last_stage(p))
        for (int t = 0; t < p->m->n_tensors; t++)
            if (p->m->tensors[t].tied_copy)
                snprintf(name, sizeof name, "%s", p->m->tensors[t].name);
    /* A broadcast copies bytes, so the name travels as 16-bit elements. */
    ZT_TRY(zt_comm_broadcast(p->stage_comm, name, sizeof name / 2, ZT_F16, p->info.stages - 1));
    if (!name[0] || !(first_stage(p) || last_stage(p)))
        return ZT_OK;
    const zt_tensor_info *ti = zt_model_find_tensor(p->m, name);
    if (!ti)
        return zt_error(ZT_ERR_INVALID, "pipeline: stage %d has no tensor \"%s\", which the last "
                        "stage holds a tied copy of", p->info.stage, name);
    p->tied_off = ti->offset;
    p->tied_n = ti->numel;
    int ranks[2] = {grid_rank(p, 0, p->info.replica),
                    grid_rank(p, p->info.stages - 1, p->info.replica)};
    return zt_comm_create_group(&p->tied_comm, p->world, ranks, 2);
}

/* The step's agreement (agree_dev and its pinned pair), zeroed: a stage other than the last
 * contributes zeros for the losses, which its forwards never write. */
static zt_status alloc_agreement(zt_pipe *p) {
    const size_t gas = (size_t)p->info.micro_batches, checks = p->info.stages * gas;
    p->agree_checks = 3 * gas + 2;
    p->agree_n = p->agree_checks + checks;
    p->batch_sum = calloc(gas, sizeof *p->batch_sum);
    p->host_sum = calloc(3 + checks, sizeof *p->host_sum);
    if (!p->batch_sum || !p->host_sum)
        return zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
    size_t bytes = p->agree_n * sizeof(double);
    p->agree_dev = zt_backend_alloc(p->be, ZT_MEM_DEVICE, bytes);
    p->agree_in = zt_backend_alloc(p->be, ZT_MEM_PINNED, bytes);
    p->agree_out = zt_backend_alloc(p->be, ZT_MEM_PINNED, bytes);
    if (!p->agree_dev || !p->agree_in || !p->agree_out)
        return zt_error(ZT_ERR_NOMEM, "pipeline: cannot allocate the step's %zu scalars on %s",
                        p->agree_n, p->be->name);
    memset(p->agree_in, 0, bytes);
    memset(p->agree_out, 0, bytes);
    zt_backend_zero(p->be, p->agree_dev, bytes, ZT_STREAM_COMPUTE);
    return ZT_OK;
}

static zt_status alloc_buffers(zt_pipe *p) {
    p->buf = calloc((size_t)p->nbuf, sizeof *p->buf);
    if (!p->buf)
        return zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
    size_t tok = (size_t)p->max_B * p->T * sizeof(int32_t);
    for (int b = 0; b < p->nbuf; b++) {
        pipe_buffer *x = &p->buf[b];
        x->tokens = malloc(tok);
        x->targets = malloc(tok);
        x->doc_pos = p->docs ? malloc(tok) : NULL;
        if (p->docs && !x->doc_pos)
            return zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
        void **acts[4] = {&x->in_act, &x->out_act, &x->din, &x->dout};
        for (int k = 0; k < 4; k++)
            *acts[k] = zt_backend_alloc(p->be, ZT_MEM_DEVICE, p->act_bytes);
        if (!x->tokens || !x->targets || !x->in_act || !x->out_act || !x->din || !x->dout)
            return zt_error(ZT_ERR_NOMEM, "pipeline: cannot allocate %d activation buffers of "
                            "%zu bytes on %s", p->nbuf, p->act_bytes, p->be->name);
    }
    return ZT_OK;
}

static zt_status agree_after_read(void *ctx);
static zt_status eval_reserve(zt_pipe *p, int steps);

zt_status zt_pipe_create(zt_pipe **out, const zt_job_spec *job, const zt_dataset *train_data,
                         zt_comm *world, const zt_engine_options *base) {
    *out = NULL;
    const int stages = job->pipeline.stages, ws = world ? zt_comm_world_size(world) : 1;
    const int tp = job->ds.tp_size > 1 ? job->ds.tp_size : 1;
    if (stages < 2 || ws % (stages * tp) != 0 || ws / (stages * tp) != job->ds.world_size)
        return zt_error(ZT_ERR_INVALID, "pipeline: %d ranks do not form pipeline.stages %d × "
                        "a data-parallel size of %d × tensor_parallel.autotp_size %d", ws,
                        stages, job->ds.world_size, tp);
    zt_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
    int rank = zt_comm_rank(world), dp = ws / (stages * tp);
    zt_status gs = zt_grid_of(rank, ws, stages, tp, &p->grid);
    ZT_ASSERT(gs == ZT_OK);
    p->job = job;
    p->world = world;
    /* ZTRAIN_INJECT_PIPE_KILL="STEP[:RANK]": rank RANK SIGKILLs itself after its first forward
     * of optimizer step STEP, with micro-batches in flight: how tests kill a stage. */
    p->kill_step = zt_inject_step("ZTRAIN_INJECT_PIPE_KILL", rank);
    p->info = (zt_pipe_info){.stages = stages, .stage = p->grid.stage, .dp = dp,
                             .replica = p->grid.replica, .tp = tp, .tp_rank = p->grid.tp_rank,
                             .micro_batches = job->ds.gradient_accumulation_steps};
    zt_status s = zt_pipe_stage_plan(job, base->device, p->info.stage, &p->ms);
    if (s == ZT_OK) {
        p->info.first_layer = p->ms.first_layer;
        p->info.last_layer = p->ms.last_layer;
        p->nbuf = p->ms.buffers = zt_pipe_train_buffers(stages, p->info.stage,
                                                        p->info.micro_batches);
        s = make_groups(p);
    }
    if (s == ZT_OK) {
        zt_engine_options eo = *base;
        eo.rank = p->info.replica;
        eo.comm = p->dp_comm;
        eo.stage = &p->ms;
        eo.stage_comm = p->stage_comm;
        eo.tp_size = tp;
        eo.tp_rank = p->grid.tp_rank;
        eo.tp_comm = p->tp_comm;
        eo.norm_comm = p->mp_comm;
        /* DeepSpeed's PipelineModule(activation_checkpoint_interval=k): every k-th block's
         * input is kept and the rest recomputed in the backward. */
        zt_model_spec spec = job->model;
        if (job->pipeline.activation_checkpoint_interval > 0)
            spec.checkpoint_interval = job->pipeline.activation_checkpoint_interval;
        s = zt_engine_create(&p->e, &job->ds, &spec, train_data, &eo);
    }
    if (s == ZT_OK) {
        p->m = zt_engine_model(p->e);
        p->be = p->m->ctx.be;
        size_t es = zt_backend_act_size(p->be, p->m->ctx.act);
        p->wire = es == sizeof(float) ? ZT_F32 : p->m->ctx.act;
        p->T = job->model.block_size;
        p->C = job->model.n_embd;
        p->max_B = job->ds.train_micro_batch_size_per_gpu;
        p->act_bytes = (size_t)p->max_B * p->T * p->C * es;
        p->docs = job->data.format == ZT_DATA_FORMAT_MASKED;
        if (p->docs && !p->m->ops->set_doc_pos)
            s = zt_error(ZT_ERR_UNSUPPORTED, "pipeline: model type \"%s\" does not support "
                         "packed documents (data.format \"masked\")", job->model.type);
        /* Every set between two of the step's waits in a slot of its own: the 1F1B schedule
         * sets each micro-batch's documents twice (forward, backward) before the optimizer
         * step's one synchronisation. Read at the model's first set, which comes later. */
        p->doc_slots = 2 * p->info.micro_batches;
        if (p->docs)
            p->m->upload_slots = p->doc_slots;
        if (s == ZT_OK)
            s = alloc_buffers(p);
        if (s == ZT_OK)
            s = alloc_agreement(p);
        if (s == ZT_OK)
            s = eval_reserve(p, job->train.eval_steps);
        if (s == ZT_OK)
            zt_engine_set_step_check(p->e, agree_after_read, p);
    }
    /* Activations and their gradients live in the backend's device memory: they travel between
     * stages through zt_comm_dev_send/recv, which stage them through host memory when the
     * transport cannot read the device's (shm or gloo ranks on GPUs). */
    if (s == ZT_OK && (s = zt_comm_attach_backend(world, p->be)) == ZT_OK)
        p->attached = true;
    /* The group the gradient norm is summed over (the replica's stages, or with TP all of the
     * replica's ranks) and the step's agreement (stage_comm) read device memory when the
     * transport can (NCCL): the sums then run on the device before the step's one read, where
     * a host collective after it would be a wait and a read-back of its own. */
    if (s == ZT_OK && (s = zt_comm_attach_backend(p->stage_comm, p->be)) == ZT_OK)
        p->stage_attached = true;
    if (s == ZT_OK && p->mp_comm && (s = zt_comm_attach_backend(p->mp_comm, p->be)) == ZT_OK)
        p->mp_attached = true;
    if (s == ZT_OK)
        p->agree_native = zt_comm_dev_native(p->stage_comm);
    if (s == ZT_OK)
        s = find_tied(p);
    /* The tied embedding's gradients, reduced between the first and last stages, are the
     * engine's device gradients too. */
    if (s == ZT_OK && p->tied_comm && (s = zt_comm_attach_backend(p->tied_comm, p->be)) == ZT_OK)
        p->tied_attached = true;
    if (s == ZT_OK) {
        p->n_train = zt_pipe_train_schedule(stages, p->info.stage, p->info.micro_batches, NULL, 0);
        p->train = malloc(p->n_train * sizeof *p->train);
        if (!p->train)
            s = zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
        else
            zt_pipe_train_schedule(stages, p->info.stage, p->info.micro_batches, p->train,
                                   p->n_train);
    }
    if (s != ZT_OK) {
        zt_pipe_destroy(p);
        return s;
    }
    *out = p;
    return ZT_OK;
}

void zt_pipe_destroy(zt_pipe *p) {
    if (!p)
        return;
    for (int b = 0; p->buf && b < p->nbuf; b++) {
        pipe_buffer *x = &p->buf[b];
        free(x->tokens);
        free(x->targets);
        free(x->doc_pos);
        void *acts[4] = {x->in_act, x->out_act, x->din, x->dout};
        for (int k = 0; k < 4; k++)
            zt_backend_free(p->be, ZT_MEM_DEVICE, acts[k], p->act_bytes);
    }
    free(p->buf);
    free(p->train);
    free(p->batch_sum);
    free(p->host_sum);
    if (p->be) {
        size_t bytes = p->agree_n * sizeof(double);
        zt_backend_free(p->be, ZT_MEM_DEVICE, p->agree_dev, bytes);
        zt_backend_free(p->be, ZT_MEM_PINNED, p->agree_in, bytes);
        zt_backend_free(p->be, ZT_MEM_PINNED, p->agree_out, bytes);
        bytes = ((size_t)p->info.stages + (size_t)p->eval_cap) * sizeof(double);
        zt_backend_free(p->be, ZT_MEM_DEVICE, p->eval_dev, bytes);
        zt_backend_free(p->be, ZT_MEM_PINNED, p->eval_out, bytes);
        zt_backend_free(p->be, ZT_MEM_PINNED, p->eval_in, sizeof(double));
    }
    free(p->eval_counted);
    /* Detached before the backend goes with the engine. */
    if (p->attached)
        zt_comm_attach_backend(p->world, NULL);
    if (p->tied_attached)
        zt_comm_attach_backend(p->tied_comm, NULL);
    if (p->stage_attached)
        zt_comm_attach_backend(p->stage_comm, NULL);
    if (p->mp_attached)
        zt_comm_attach_backend(p->mp_comm, NULL);
    zt_engine_destroy(p->e);
    zt_comm_destroy(p->tied_comm);
    zt_comm_destroy(p->mp_comm);
    zt_comm_destroy(p->tp_comm);
    zt_comm_destroy(p->stage_comm);
    zt_comm_destroy(p->dp_comm);
    free(p);
}

/* ---- the commands ------------------------------------------------------------------------- */

/* FNV-1a (64-bit) of n 32-bit words, continuing from h. */
static uint64_t fnv1a_words(uint64_t h, const int32_t *w, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)w[i];
        for (int k = 0; k < 4; k++, v >>= 8)
            h = (h ^ (v & 0xffu)) * 0x100000001B3ull;
    }
    return h;
}

#define FNV1A_OFFSET 0xCBF29CE484222325ull

/* A micro-batch as this stage drew it, hashed on from h: FNV-1a over its sequence count, tokens,
 * targets and, with documents, positions. Every stage draws every micro-batch itself, so stages
 * whose loaders read other data (another file on another host, another sampler or seed) differ
 * here. */
static uint64_t batch_hash(const zt_pipe *p, const pipe_buffer *x, uint64_t h) {
    const size_t n = (size_t)x->B * (size_t)p->T;
    int32_t count = x->B;
    h = fnv1a_words(h, &count, 1);
    h = fnv1a_words(h, x->tokens, n);
    h = fnv1a_words(h, x->targets, n);
    return p->docs ? fnv1a_words(h, x->doc_pos, n) : h;
}

/* A hash folded to 52 bits, as a double that a sum over the stages carries exactly (only one
 * stage's term is not 0). */
static double hash_value(uint64_t h) {
    return (double)((h ^ (h >> 52)) & ((1ull << 52) - 1));
}

/* The first stage keeps the tokens, the last the targets; every stage reads the same
 * micro-batch (a middle stage for its count and documents). In training it is the step's
 * micro-batch `micro` (zt_engine_step_batch: with loss-masked data the step is drawn at its
 * first, and its trained targets counted over the replicas); in evaluation the next of `from`.
 * The stage notes its hash for the stages' agreement. */
static zt_status load(zt_pipe *p, pipe_buffer *x, int micro, zt_loader *from) {
    zt_batch b;
    if (from) {
        b = (zt_batch){x->tokens, x->targets, 0, p->T, NULL};
        b.B = zt_loader_next_docs(from, x->tokens, x->targets, x->doc_pos);
    } else {
        ZT_TRY(zt_engine_step_batch(p->e, micro, &b));
        memcpy(x->tokens, b.inputs, (size_t)b.B * b.T * sizeof(int32_t));
        memcpy(x->targets, b.targets, (size_t)b.B * b.T * sizeof(int32_t));
        if (p->docs) {
            ZT_ASSERT(b.doc_pos);
            memcpy(x->doc_pos, b.doc_pos, (size_t)b.B * b.T * sizeof(int32_t));
        }
    }
    x->B = b.B;
    if (from)
        p->eval_hash = batch_hash(p, x, p->eval_hash);
    else
        p->batch_sum[micro] = hash_value(batch_hash(p, x, FNV1A_OFFSET));
    x->micro = micro;
    x->counted = 0;
    const int V = p->job->model.vocab_size;
    for (int i = 0; i < b.B * p->T; i++) {
        if (x->tokens[i] < 0 || x->tokens[i] >= V || x->targets[i] >= V)
            return zt_error(ZT_ERR_INVALID, "pipeline: token at batch position %d is outside "
                            "vocab_size %d", i, V);
        x->counted += x->targets[i] >= 0;
    }
    return ZT_OK;
}

static size_t act_elems(const zt_pipe *p, const pipe_buffer *x) {
    return (size_t)x->B * p->T * p->C;
}

/* An activation travels alone: every stage draws each micro-batch itself (recv_activation), so
 * the receiver knows its count and documents; a host message would be a host wait on a
 * transport that reads device memory (NCCL stages it), a wait per micro-batch for numbers the
 * receiver has. What the stages disagree on still fails: the activation's message carries its
 * element count, which the receive checks (naming both ranks), and the micro-batches' hashes
 * are compared, in training in the step's agreement before its update (check_batches), in
 * evaluation at its end (agree_eval). */
static zt_status send_activation(zt_pipe *p, pipe_buffer *x) {
    return zt_comm_dev_send(p->world, x->out_act, act_elems(p, x), p->wire, neighbour(p, +1));
}

/* The micro-batch's count and documents come from this stage's own draw of it (every stage of
 * a replica reads the replica's share as its first stage does): the last stage's, loaded at its
 * LOAD_MICRO_BATCH command just before, and a middle stage's, which loads it only for this. */
static zt_status recv_activation(zt_pipe *p, pipe_buffer *x, int micro, zt_loader *from) {
    if (x->micro != micro)
        ZT_TRY(load(p, x, micro, from));
    return zt_comm_dev_recv(p->world, x->in_act, act_elems(p, x), p->wire, neighbour(p, -1));
}

/* Gives the model the documents of buffer x's micro-batch, which this stage drew (load), before
 * its forward and again before its backward (other micro-batches run between the two).
 *
 * The model copies each set into a pinned slot of its own and uploads it from there without a
 * wait (doc_pos.h): a slot is written again doc_slots sets later, which in training is after the
 * optimizer step's synchronisation (an evaluation longer than doc_slots forwards waits here
 * once every doc_slots). Its device tables (the positions, Llama's rotary rows) are
 * one buffer each, rewritten by a copy on the compute stream, which runs after the kernels
 * queued there before it (the micro-batch before's) and before the ones queued after it. */
static zt_status set_documents(zt_pipe *p, pipe_buffer *x) {
    if (!p->docs)
        return ZT_OK;
    if (p->doc_sets >= p->doc_slots) {
        ZT_TRY(zt_backend_sync(p->be));
        p->doc_sets = 0;
    }
    p->doc_sets++;
    return p->m->ops->set_doc_pos(p->m, x->doc_pos, x->B, p->T);
}

static zt_status forward(zt_pipe *p, pipe_buffer *x, int buffer, int micro, bool train) {
    ZT_TRY(set_documents(p, x));
    /* As zt_engine_forward: the loss scale over the step's divisor, and the loss's share. */
    float grad_scale = 0.0f;
    /* The loss stays on the device, summed into its slot of the step's agreement, which comes
     * back with the step's one synchronisation (optimizer_step), or of the evaluation's, read
     * at its end (zt_pipe_eval); read here, it would be a wait per micro-batch. */
    if (train && last_stage(p)) {
        const int gas = p->info.micro_batches;
        double share;
        grad_scale = zt_engine_grad_scale(p->e, x->counted, &share);
        p->m->loss_out = p->agree_dev + micro;
        p->agree_in[gas + micro] = x->counted;
        p->agree_in[2 * gas + micro] = share;
    } else if (last_stage(p)) {
        p->m->loss_out = p->eval_dev + p->info.stages + micro;
    }
    if (!train)
        p->eval_counted[micro] = x->counted;
    double t0 = now_ms();
    p->m->ops->stage_forward(p->m, buffer, first_stage(p) ? x->tokens : NULL,
                             first_stage(p) ? NULL : x->in_act, last_stage(p) ? x->targets : NULL,
                             last_stage(p) ? NULL : x->out_act, x->B, p->T, grad_scale);
    p->m->loss_out = NULL;
    p->compute_ms += now_ms() - t0;
    if (last_stage(p))
        p->tokens += (double)x->B * p->T;
    return ZT_OK;
}

static zt_status backward(zt_pipe *p, pipe_buffer *x, int buffer) {
    ZT_TRY(set_documents(p, x));
    double t0 = now_ms();
    p->m->ops->stage_backward(p->m, buffer, last_stage(p) ? NULL : x->dout,
                              first_stage(p) ? NULL : x->din);
    p->compute_ms += now_ms() - t0;
    return ZT_OK;
}

/* DeepSpeed's ReduceTiedGrads: the first and the last stage both end with the sum of their
 * gradients of the tied tensor, so both copies take the same update. */
static zt_status reduce_tied(zt_pipe *p) {
    if (!p->tied_comm)
        return ZT_OK;
    zt_dtype t;
    unsigned char *g = zt_engine_local_grads(p->e, &t);
    return zt_comm_dev_all_reduce(p->tied_comm, g + p->tied_off * zt_dtype_size(t), p->tied_n, t,
                                  ZT_REDUCE_SUM);
}

/* Queued before the optimizer step, whose one synchronisation covers it: the last stage's
 * micro-batch counts and shares, the tokens, this stage's share of the bubble and its hashes of
 * the micro-batches in its own stage's row (the other rows 0) go into the agreement (the loss
 * sums are there already, on the last stage, and zeros elsewhere); then, where stage_comm
 * reads device memory, they are summed over the stages there, a sum in which
 * only the last stage's values are not 0 and so come through exactly; then copied back into
 * pinned memory, which does not wait. A second read-back beside the engine's under the same
 * wait: the engine's scalars are its own (step_readback.h). */
static zt_status agree_enqueue(zt_pipe *p) {
    const size_t gas = (size_t)p->info.micro_batches, n = p->agree_n;
    double *in = p->agree_in;
    if (!last_stage(p))
        memset(in, 0, 3 * gas * sizeof *in);
    in[3 * gas] = p->tokens;
    in[3 * gas + 1] = p->sched_ms > 0.0 ? (1.0 - p->compute_ms / p->sched_ms) / p->info.stages
                                        : 0.0;
    double *checks = in + p->agree_checks;
    memset(checks, 0, (n - p->agree_checks) * sizeof *in);
    memcpy(checks + (size_t)p->info.stage * gas, p->batch_sum, gas * sizeof *in);
    const size_t lo = last_stage(p) ? gas : 0;
    zt_backend_copy(p->be, p->agree_dev + lo, in + lo, (n - lo) * sizeof *in, ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
    if (p->agree_native)
        ZT_TRY(zt_comm_dev_all_reduce(p->stage_comm, p->agree_dev, n, ZT_F64, ZT_REDUCE_SUM));
    /* Summed on the host (agree_step), only the last stage's losses need reading. */
    if (p->agree_native || last_stage(p))
        zt_backend_copy(p->be, p->agree_out, p->agree_dev, n * sizeof(double), ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
    return ZT_OK;
}

/* The step's loss from the agreement read back: each micro-batch's mean over its trained
 * targets times its share, as zt_engine_forward's deferred loss is computed, then summed. */
static void agree_read(zt_pipe *p) {
    const int gas = p->info.micro_batches;
    const double *v = p->agree_out;
    p->loss_sum = 0.0;
    for (int i = 0; i < gas; i++) {
        float mean = v[gas + i] > 0.0 ? (float)(v[i] / v[gas + i]) : 0.0f;
        p->loss_sum += (float)((double)mean * v[2 * gas + i]);
    }
}

/* The optimizer step of the ordinary engine, which counts micro-steps: the batch's first
 * micro-batches only count, its last applies the update (the data-parallel reduction, the global
 * norm and the loss scaler's decision included) after its one synchronisation, which brings the
 * step's agreement back with the norm; the stages agree (agree_after_read, the engine's step
 * check) before anything is applied. */
static zt_status optimizer_step(zt_pipe *p) {
    ZT_TRY(agree_enqueue(p));
    for (int i = 0; i < p->info.micro_batches; i++)
        ZT_TRY(zt_engine_step(p->e));
    /* The last of them waited for the device: every document slot is free again. */
    p->doc_sets = 0;
    return ZT_OK;
}

static zt_status run(zt_pipe *p, const zt_pipe_cmd *c, bool train, zt_loader *from) {
    pipe_buffer *x = c->buffer >= 0 ? &p->buf[c->buffer] : NULL;
    switch (c->kind) {
    case ZT_PIPE_LOAD_MICRO_BATCH:
        /* The last stage's training micro-batch is loaded at its receive already. */
        if (x->micro == c->micro_batch)
            return ZT_OK;
        return load(p, x, c->micro_batch, from);
    case ZT_PIPE_FORWARD:
        return forward(p, x, c->buffer, c->micro_batch, train);
    case ZT_PIPE_BACKWARD:
        return backward(p, x, c->buffer);
    case ZT_PIPE_SEND_ACTIVATION:
        return send_activation(p, x);
    case ZT_PIPE_RECV_ACTIVATION:
        return recv_activation(p, x, c->micro_batch, from);
    case ZT_PIPE_SEND_GRAD:
        return zt_comm_dev_send(p->world, x->din, act_elems(p, x), p->wire, neighbour(p, -1));
    case ZT_PIPE_RECV_GRAD:
        return zt_comm_dev_recv(p->world, x->dout, act_elems(p, x), p->wire, neighbour(p, +1));
    case ZT_PIPE_REDUCE_TIED_GRADS:
        return reduce_tied(p);
    case ZT_PIPE_REDUCE_GRADS:
        return ZT_OK; /* the engine's step reduces over the stage's replicas */
    case ZT_PIPE_OPTIMIZER_STEP:
        return optimizer_step(p);
    case ZT_PIPE_CMD_KINDS:
        break;
    }
    ZT_ASSERT(!"unknown pipeline command");
    return ZT_ERR_INVALID;
}

/* The last stage's loss and tokens (v[0], v[1]) averaged and summed over the stage's replicas:
 * one host collective summing both, the loss then divided by the replicas, as shm's and gloo's
 * average divides their sum (before: an average and a sum, two collectives, each a host wait on
 * a transport that stages host messages through the device). */
static zt_status over_replicas(zt_pipe *p, double v[2]) {
    if (!p->dp_comm)
        return ZT_OK;
    ZT_TRY(zt_comm_all_reduce(p->dp_comm, v, 2, ZT_F64, ZT_REDUCE_SUM));
    v[0] /= (double)zt_comm_world_size(p->dp_comm);
    return ZT_OK;
}

/* Each stage's hashes of what it drew, one row of per_stage per stage (the step's micro-batches,
 * or one for a whole evaluation), must be the same at every stage; otherwise the stages' loaders
 * drew other data (another data file, sampler or seed), and a stage trains or evaluates the
 * wrong tokens, targets or positions on the right activations. Every stage holds every row, so
 * each fails alike, naming the first micro-batch and the first pair of neighbouring stages that
 * differ. */
static zt_status check_batches(const zt_pipe *p, const double *rows, int per_stage, bool eval) {
    for (int i = 0; i < per_stage; i++)
        for (int st = 1; st < p->info.stages; st++) {
            double a = rows[(size_t)(st - 1) * per_stage + i], b = rows[(size_t)st * per_stage + i];
            if (a == b)
                continue;
            char what[64];
            if (eval)
                snprintf(what, sizeof what, "the evaluation's micro-batches have");
            else
                snprintf(what, sizeof what, "micro-batch %d of the step has", i);
            return zt_error(ZT_ERR_INVALID, "pipeline: %s other tokens, targets or document "
                            "boundaries at stage %d than at stage %d (hashes %013llx and %013llx: "
                            "the stages' loaders disagree)", what, st, st - 1,
                            (unsigned long long)b, (unsigned long long)a);
        }
    return ZT_OK;
}

/* The end of an evaluation of `steps` micro-batches, on every stage, as a training step's
 * agreement: each stage's hash of the micro-batches it drew goes into its row of eval_dev, beside
 * the last stage's loss sums; where stage_comm reads device memory (NCCL) they are summed over
 * the stages there (only the last stage's sums and each stage's own row are not 0) and every
 * stage reads them back with the evaluation's one wait; otherwise the last stage reads its sums
 * back (its one wait; a stage that set documents waits too, so the next step's sets find every
 * slot free) and one host collective sums the loss and the rows. The loss as DeepSpeed reports
 * it: each micro-batch's mean over its trained targets, as a forward that read its losses would
 * take it (every stage counted them in its own draw), averaged over the micro-batches and over
 * the replicas. Stages whose hashes differ fail alike. */
static zt_status agree_eval(zt_pipe *p, int steps, double *loss) {
    const int stages = p->info.stages;
    const size_t n = (size_t)stages + (size_t)steps;
    p->eval_in[0] = hash_value(p->eval_hash);
    zt_backend_copy(p->be, p->eval_dev + p->info.stage, p->eval_in, sizeof(double), ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
    if (p->agree_native) {
        ZT_TRY(zt_comm_dev_all_reduce(p->stage_comm, p->eval_dev, n, ZT_F64, ZT_REDUCE_SUM));
        zt_backend_copy(p->be, p->eval_out, p->eval_dev, n * sizeof(double), ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
    } else if (last_stage(p)) {
        zt_backend_copy(p->be, p->eval_out + stages, p->eval_dev + stages,
                        (size_t)steps * sizeof(double), ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    }
    if (p->agree_native || last_stage(p) || (p->docs && p->doc_sets > 0)) {
        ZT_TRY(zt_backend_sync(p->be));
        p->doc_sets = 0;
    }
    double v[2] = {0.0, 0.0};
    if (p->agree_native || last_stage(p)) {
        for (int i = 0; i < steps; i++)
            v[0] += p->eval_counted[i] ? (float)(p->eval_out[stages + i] / p->eval_counted[i])
                                       : 0.0f;
        v[0] /= steps;
    }
    const double *rows = p->eval_out;
    if (!p->agree_native) {
        double *h = p->host_sum; /* 1 + stages of its 3 + stages · micro_batches */
        memset(h, 0, (size_t)(1 + stages) * sizeof *h);
        if (last_stage(p)) {
            ZT_TRY(over_replicas(p, v));
            h[0] = v[0];
        }
        h[1 + p->info.stage] = p->eval_in[0];
        ZT_TRY(zt_comm_all_reduce(p->stage_comm, h, (size_t)(1 + stages), ZT_F64,
                                  ZT_REDUCE_SUM));
        v[0] = h[0];
        rows = h + 1;
    }
    ZT_TRY(check_batches(p, rows, 1, true));
    /* Summed on the device, every stage has the loss: each averages over its own replicas. */
    if (p->agree_native)
        ZT_TRY(over_replicas(p, v));
    *loss = v[0];
    return ZT_OK;
}

/* The evaluation's agreement (agree_eval) for `steps` micro-batches, zeroed on the device: a
 * stage other than the last contributes zeros for the loss sums, and each stage zeros for the
 * other stages' rows. Made for the job's eval_steps at creation, grown when an evaluation is
 * longer. */
static zt_status eval_reserve(zt_pipe *p, int steps) {
    const size_t stages = (size_t)p->info.stages;
    if (steps > p->eval_cap) {
        size_t old = (stages + (size_t)p->eval_cap) * sizeof(double),
               bytes = (stages + (size_t)steps) * sizeof(double);
        zt_backend_free(p->be, ZT_MEM_DEVICE, p->eval_dev, old);
        zt_backend_free(p->be, ZT_MEM_PINNED, p->eval_out, old);
        free(p->eval_counted);
        p->eval_cap = 0;
        p->eval_dev = zt_backend_alloc(p->be, ZT_MEM_DEVICE, bytes);
        p->eval_out = zt_backend_alloc(p->be, ZT_MEM_PINNED, bytes);
        p->eval_counted = calloc((size_t)steps, sizeof *p->eval_counted);
        if (!p->eval_in)
            p->eval_in = zt_backend_alloc(p->be, ZT_MEM_PINNED, sizeof(double));
        if (!p->eval_dev || !p->eval_out || !p->eval_counted || !p->eval_in)
            return zt_error(ZT_ERR_NOMEM, "pipeline: cannot allocate the evaluation's %d "
                            "losses on %s", steps, p->be->name);
        p->eval_cap = steps;
    }
    zt_backend_zero(p->be, p->eval_dev, (stages + (size_t)steps) * sizeof(double),
                    ZT_STREAM_COMPUTE);
    return ZT_OK;
}

/* The engine's step check (zt_engine_set_step_check), right after the step's one
 * synchronisation and before its update: the stages agree on the step, and a step whose stages
 * trained on other micro-batches fails before it is applied. Where the stages summed the
 * agreement on the device (agree_enqueue), every stage has read the last stage's losses and
 * tokens, the bubble and every stage's checksums with that synchronisation. Otherwise one host
 * collective over the stages sums (loss, tokens, bubble / stages, checksums), in which only the
 * last stage's loss and tokens and each stage's own checksum row are not 0, into host_sum. */
static zt_status agree_after_read(void *ctx) {
    zt_pipe *p = ctx;
    const int gas = p->info.micro_batches;
    if (last_stage(p) || p->agree_native)
        agree_read(p);
    if (p->agree_native)
        return check_batches(p, p->agree_out + p->agree_checks, gas, false);
    double *v = p->host_sum;
    const size_t n = 3 + (p->agree_n - p->agree_checks);
    memcpy(v + 3, p->agree_in + p->agree_checks, (n - 3) * sizeof *v);
    v[0] = v[1] = 0.0;
    v[2] = p->agree_in[3 * gas + 1];
    if (last_stage(p)) {
        v[0] = p->loss_sum / gas;
        v[1] = p->tokens;
        ZT_TRY(over_replicas(p, v));
    }
    ZT_TRY(zt_comm_all_reduce(p->stage_comm, v, n, ZT_F64, ZT_REDUCE_SUM));
    return check_batches(p, v + 3, gas, false);
}

/* A training step's result on every rank, from the agreement (agree_after_read): where it was
 * summed on the device, only the replicas are left to average over (every stage with its own
 * replicas, in the same order as the last stage's). */
static zt_status agree_step(zt_pipe *p, zt_pipe_batch_result *res) {
    const int gas = p->info.micro_batches;
    if (p->agree_native) {
        double v[2] = {p->loss_sum / gas, p->agree_out[3 * gas]};
        ZT_TRY(over_replicas(p, v));
        res->loss = v[0];
        res->tokens = v[1];
        res->bubble = p->agree_out[3 * gas + 1];
        return ZT_OK;
    }
    res->loss = p->host_sum[0];
    res->tokens = p->host_sum[1];
    res->bubble = p->host_sum[2];
    return ZT_OK;
}

zt_status zt_pipe_train_batch(zt_pipe *p, zt_pipe_batch_result *res) {
    p->loss_sum = p->tokens = p->compute_ms = p->sched_ms = 0.0;
    for (int b = 0; b < p->nbuf; b++)
        p->buf[b].micro = -1;
    memset(p->batch_sum, 0, (size_t)p->info.micro_batches * sizeof *p->batch_sum);
    double t0 = now_ms();
    for (size_t i = 0; i < p->n_train; i++) {
        /* The schedule's time ends where the reductions begin. */
        if (p->train[i].kind == ZT_PIPE_REDUCE_TIED_GRADS)
            p->sched_ms = now_ms() - t0;
        ZT_TRY(run(p, &p->train[i], true, NULL));
        if (p->train[i].kind == ZT_PIPE_FORWARD && p->kill_step > 0 &&
            p->kill_step == zt_engine_global_steps(p->e) + 1) {
            fflush(NULL);
            raise(SIGKILL);
        }
    }
    return agree_step(p, res);
}

zt_status zt_pipe_eval(zt_pipe *p, zt_loader *val, int steps, double *loss) {
    size_t n = zt_pipe_inference_schedule(p->info.stages, p->info.stage, steps, NULL, 0);
    zt_pipe_cmd *cmds = malloc(n * sizeof *cmds);
    if (!cmds)
        return zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
    zt_pipe_inference_schedule(p->info.stages, p->info.stage, steps, cmds, n);
    p->loss_sum = p->tokens = p->compute_ms = 0.0;
    p->eval_hash = FNV1A_OFFSET;
    for (int b = 0; b < p->nbuf; b++)
        p->buf[b].micro = -1;
    zt_status s = eval_reserve(p, steps);
    for (size_t i = 0; i < n && s == ZT_OK; i++)
        s = run(p, &cmds[i], false, val);
    free(cmds);
    ZT_TRY(s);
    return agree_eval(p, steps, loss);
}
