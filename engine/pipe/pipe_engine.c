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
    /* The step's and the evaluation's agreement: every stage of every replica (of this rank's
     * TP shard). stage_comm with dp 1, world without TP, else agree_group, a group of its own. */
    zt_comm *agree_comm, *agree_group;
    zt_comm *tied_comm;  /* first and last stage of the replica, when the model ties a tensor */
    /* With tensor parallelism: the stage's TP shards of this replica, and every rank of this
     * replica (its stages × its shards), over which the gradient norm is summed. */
    zt_comm *tp_comm, *mp_comm;
    zt_grid grid;
    zt_model_stage ms;
    int *parts;          /* [stages + 1]: every stage's first layer of the layer list (zt_pipe_parts) */
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
     * compared between the stages in the step's agreement. */
    double *batch_sum;
    size_t act_bytes; /* one activation buffer */
    pipe_buffer *buf;
    int nbuf;
    zt_pipe_cmd *train;
    size_t n_train;
    size_t tied_off, tied_n; /* the tied tensor in this stage's flat buffer (tied_comm) */
    /* The batch in flight, and its result as every rank agrees on it (agree_after_read). */
    double tokens, compute_ms, sched_ms;
    zt_pipe_batch_result result;
    /* The step's agreement (agree_enqueue), a block of agree_n values a replica: [micro_batches]
     * the last stage's summed token losses (its forwards sum into them on the device), as many
     * trained targets and loss shares, the tokens, the stages' shares of the bubble, then each
     * stage's hashes of the micro-batches (a row a stage). A rank fills its own replica's block
     * (only the last stage the losses, counts, shares and tokens; each stage its own row) and
     * zeros elsewhere, so a sum over agree_comm is every replica's block, exactly. Summed on the
     * device when agree_comm reads device memory (NCCL) and read back with the step's one
     * synchronisation, otherwise summed by one host collective after it. Device memory and the
     * pinned read-back (a block a replica), and the pinned values a rank uploads (one block). */
    double *agree_dev, *agree_out, *agree_in;
    size_t agree_n;
    size_t agree_checks; /* where a block's rows of hashes start */
    /* Evaluation's agreement, laid out as the training step's (agree_eval), a block a replica of
     * eval_block() values: each stage's hash of the micro-batches it drew (a row a stage), the
     * last stage's sums of each micro-batch's token losses (its forwards write them) and their
     * counts of trained targets; eval_cap micro-batches, grown to the evaluation's length.
     * eval_in, the pinned values a rank uploads: its hash, then (the last stage) the counts. */
    double *eval_dev, *eval_in, *eval_out;
    int eval_cap;
    size_t eval_own; /* this rank's replica's block in them, for the evaluation in flight */
    uint64_t eval_hash;
    bool warned_untrained_eval; /* agree_eval has said the validation set trains nothing */
    bool agree_native; /* agree_comm sums device memory itself */
    /* stage_comm, mp_comm, agree_group have the backend attached */
    bool stage_attached, mp_attached, agree_attached;
    int64_t kill_step; /* ZTRAIN_INJECT_PIPE_KILL (tests): die in this step's schedule */
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

zt_engine *zt_pipe_engine(zt_pipe *p) { return p->e; }
zt_pipe_info zt_pipe_get_info(const zt_pipe *p) { return p->info; }

const int *zt_pipe_parts(const zt_pipe *p) { return p->parts; }

/* This rank's stage of the model and, from the same one partition, every stage's first layer,
 * which a checkpoint records (ckpt_pipeline.h). */
static zt_status stage_plans(zt_pipe *p, const zt_job_spec *job, zt_device device) {
    const int stages = p->info.stages, L = job->model.n_layer;
    zt_model_stage *plans = calloc((size_t)stages, sizeof *plans);
    p->parts = calloc((size_t)stages + 1, sizeof *p->parts);
    zt_status s = plans && p->parts ? zt_pipe_stage_plans(job, device, plans)
                                    : zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
    if (s == ZT_OK) {
        p->ms = plans[p->info.stage];
        /* The layer list is embed, L blocks, head: a later stage starts at its first block, or
         * at the head when it holds no block. */
        for (int st = 1; st < stages; st++)
            p->parts[st] = plans[st].first_layer + 1;
        p->parts[stages] = L + 2;
    }
    free(plans);
    return s;
}

zt_comm_dev_stats zt_pipe_dev_counts(const zt_pipe *p) {
    zt_comm *const all[] = {p->world,   p->dp_comm, p->stage_comm, p->tied_comm,
                            p->tp_comm, p->mp_comm, p->agree_group};
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
 * shard), the agreement's (every stage of every replica, of its own TP shard), and with TP its
 * stage's shards and the whole replica. */
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
    /* A group of those ranks exists already, except with data and tensor parallelism both. */
    p->agree_comm = in->dp == 1 ? p->stage_comm : g->tp == 1 ? p->world : NULL;
    if (!p->agree_comm) {
        for (int r = 0; r < in->dp; r++)
            for (int s = 0; s < in->stages; s++)
                ranks[r * in->stages + s] = grid_rank(p, s, r);
        ZT_TRY(zt_comm_create_group(&p->agree_group, p->world, ranks, in->dp * in->stages));
        p->agree_comm = p->agree_group;
    }
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

/* The step's agreement: agree_dev and agree_out, a block a replica, and agree_in, one, zeroed:
 * a stage writes only its own row of hashes in agree_in, and only the last stage its counts and
 * shares, so the rest stays 0. */
static zt_status alloc_agreement(zt_pipe *p) {
    const size_t gas = (size_t)p->info.micro_batches, checks = p->info.stages * gas;
    p->agree_checks = 3 * gas + 2;
    p->agree_n = p->agree_checks + checks;
    p->batch_sum = calloc(gas, sizeof *p->batch_sum);
    if (!p->batch_sum)
        return zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
    size_t bytes = p->agree_n * sizeof(double), all = (size_t)p->info.dp * bytes;
    p->agree_dev = zt_backend_alloc(p->be, ZT_MEM_DEVICE, all);
    p->agree_out = zt_backend_alloc(p->be, ZT_MEM_PINNED, all);
    p->agree_in = zt_backend_alloc(p->be, ZT_MEM_PINNED, bytes);
    if (!p->agree_dev || !p->agree_in || !p->agree_out)
        return zt_error(ZT_ERR_NOMEM, "pipeline: cannot allocate the step's %zu scalars on %s",
                        (size_t)p->info.dp * p->agree_n, p->be->name);
    memset(p->agree_in, 0, bytes);
    memset(p->agree_out, 0, all);
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
static void eval_free(zt_pipe *p);

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
    zt_status s = stage_plans(p, job, base->device);
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
     * replica's ranks) and the agreement's read device memory when the transport can (NCCL):
     * the sums then run on the device before the step's one read, where a host collective
     * after it would be a wait and a read-back of its own. */
    if (s == ZT_OK && (s = zt_comm_attach_backend(p->stage_comm, p->be)) == ZT_OK)
        p->stage_attached = true;
    if (s == ZT_OK && p->mp_comm && (s = zt_comm_attach_backend(p->mp_comm, p->be)) == ZT_OK)
        p->mp_attached = true;
    if (s == ZT_OK && p->agree_group &&
        (s = zt_comm_attach_backend(p->agree_group, p->be)) == ZT_OK)
        p->agree_attached = true;
    if (s == ZT_OK)
        p->agree_native = zt_comm_dev_native(p->agree_comm);
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
    free(p->parts);
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
    if (p->be) {
        size_t bytes = p->agree_n * sizeof(double), all = (size_t)p->info.dp * bytes;
        zt_backend_free(p->be, ZT_MEM_DEVICE, p->agree_dev, all);
        zt_backend_free(p->be, ZT_MEM_PINNED, p->agree_out, all);
        zt_backend_free(p->be, ZT_MEM_PINNED, p->agree_in, bytes);
        eval_free(p);
    }
    /* Detached before the backend goes with the engine. */
    if (p->attached)
        zt_comm_attach_backend(p->world, NULL);
    if (p->tied_attached)
        zt_comm_attach_backend(p->tied_comm, NULL);
    if (p->stage_attached)
        zt_comm_attach_backend(p->stage_comm, NULL);
    if (p->mp_attached)
        zt_comm_attach_backend(p->mp_comm, NULL);
    if (p->agree_attached)
        zt_comm_attach_backend(p->agree_group, NULL);
    zt_engine_destroy(p->e);
    zt_comm_destroy(p->tied_comm);
    zt_comm_destroy(p->agree_group);
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
 * micro-batch `micro` (zt_engine_step_batch: with loss-masked data the step is drawn whole and
 * its trained targets counted over the replicas, in the steady state under the last step's
 * wait); in evaluation the next of `from`.
 * The stage notes its hash for the stages' agreement. */
static zt_status load(zt_pipe *p, pipe_buffer *x, int micro, zt_loader *from) {
    zt_batch b;
    if (from) {
        b = (zt_batch){x->tokens, x->targets, 0, p->T, NULL};
        b.B = zt_loader_next_docs(from, x->tokens, x->targets, x->doc_pos);
        if (b.B < 0)
            return ZT_ERR_IO;
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
        p->m->loss_out = p->agree_dev + (size_t)p->info.replica * p->agree_n + micro;
        p->agree_in[gas + micro] = x->counted;
        p->agree_in[2 * gas + micro] = share;
    } else if (last_stage(p)) {
        p->m->loss_out = p->eval_dev + p->eval_own + p->info.stages + micro;
        p->eval_in[1 + micro] = x->counted;
    }
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

/* Queued before the optimizer step, whose one synchronisation covers it. Into this rank's
 * replica's block of the agreement (the other blocks 0, zeroed at the step's start after a
 * device sum): the last stage's micro-batch counts and shares and the tokens (its forwards
 * summed the losses there already), this stage's share of the bubble and its hashes of the
 * micro-batches in its own row, zeros elsewhere. Where agree_comm reads device memory, the
 * blocks are summed over every stage of every replica there, a sum in which each value has one
 * rank's term that is not 0 (the bubble's shares excepted) and so comes through exactly, and
 * copied back into pinned memory, which does not wait; otherwise only the last stage reads its
 * block back, for its losses (agree_after_read sums the rest on the host). A second read-back
 * beside the engine's under the same wait: the engine's scalars are its own (step_readback.h). */
static zt_status agree_enqueue(zt_pipe *p) {
    const size_t gas = (size_t)p->info.micro_batches, n = p->agree_n;
    const size_t own = (size_t)p->info.replica * n, all = (size_t)p->info.dp * n;
    double *in = p->agree_in;
    in[3 * gas] = p->tokens;
    in[3 * gas + 1] = p->sched_ms > 0.0 ? (1.0 - p->compute_ms / p->sched_ms) / p->info.stages
                                        : 0.0;
    memcpy(in + p->agree_checks + (size_t)p->info.stage * gas, p->batch_sum, gas * sizeof *in);
    const size_t lo = last_stage(p) ? gas : 0;
    zt_backend_copy(p->be, p->agree_dev + own + lo, in + lo, (n - lo) * sizeof *in, ZT_COPY_H2D,
                    ZT_STREAM_COMPUTE);
    if (p->agree_native) {
        ZT_TRY(zt_comm_dev_all_reduce(p->agree_comm, p->agree_dev, all, ZT_F64,
                                      ZT_REDUCE_SUM));
        zt_backend_copy(p->be, p->agree_out, p->agree_dev, all * sizeof(double), ZT_COPY_D2H,
                        ZT_STREAM_COMPUTE);
    } else if (last_stage(p)) {
        zt_backend_copy(p->be, p->agree_out + own, p->agree_dev + own, n * sizeof(double),
                        ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    }
    return ZT_OK;
}

/* A replica's loss from its block of the agreement: each micro-batch's mean over its trained
 * targets times its share, as zt_engine_forward's deferred loss is computed, summed over the
 * micro-batches. */
static double replica_loss(const double *block, int gas) {
    double loss = 0.0;
    for (int i = 0; i < gas; i++) {
        float mean = block[gas + i] > 0.0 ? (float)(block[i] / block[gas + i]) : 0.0f;
        loss += (float)((double)mean * block[2 * gas + i]);
    }
    return loss;
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

/* Each stage's hashes of what it drew, one row of per_stage per stage (the step's micro-batches,
 * or one for a whole evaluation), must be the same at every stage of a replica; otherwise the
 * stages' loaders drew other data (another data file, sampler or seed), and a stage trains or
 * evaluates the wrong tokens, targets or positions on the right activations. Every rank holds
 * every replica's rows, so each fails alike, naming the first micro-batch and the first pair of
 * neighbouring stages that differ, and with data parallelism their replica. */
static zt_status check_batches(const zt_pipe *p, int replica, const double *rows, int per_stage,
                               bool eval) {
    for (int i = 0; i < per_stage; i++)
        for (int st = 1; st < p->info.stages; st++) {
            double a = rows[(size_t)(st - 1) * per_stage + i], b = rows[(size_t)st * per_stage + i];
            if (a == b)
                continue;
            char what[64], where[32] = "";
            if (eval)
                snprintf(what, sizeof what, "the evaluation's micro-batches have");
            else
                snprintf(what, sizeof what, "micro-batch %d of the step has", i);
            if (p->info.dp > 1)
                snprintf(where, sizeof where, " of replica %d", replica);
            return zt_error(ZT_ERR_INVALID, "pipeline: %s other tokens, targets or document "
                            "boundaries at stage %d than at stage %d%s (hashes %013llx and "
                            "%013llx: the stages' loaders disagree)", what, st, st - 1, where,
                            (unsigned long long)b, (unsigned long long)a);
        }
    return ZT_OK;
}

/* Where agree_comm cannot sum device memory, the blocks of `all` (`block` values a replica) are
 * summed by one host collective: this rank's replica's block holds `own` (what the rank
 * uploaded, or, at the last stage, read back), every other block zeros. */
static zt_status sum_on_host(zt_pipe *p, double *all, size_t block, const double *own) {
    const size_t at = (size_t)p->info.replica * block, n = (size_t)p->info.dp * block;
    if (own != all + at)
        memcpy(all + at, own, block * sizeof *all);
    memset(all, 0, at * sizeof *all);
    memset(all + at + block, 0, (n - at - block) * sizeof *all);
    return zt_comm_all_reduce(p->agree_comm, all, n, ZT_F64, ZT_REDUCE_SUM);
}

/* The values of a replica's evaluation block for `steps` micro-batches: a hash a stage, then
 * the loss sums and the trained targets' counts of each micro-batch. */
static size_t eval_block(const zt_pipe *p, int steps) {
    return (size_t)p->info.stages + 2 * (size_t)steps;
}

/* The end of an evaluation of `steps` micro-batches, on every rank, as a training step's
 * agreement: each stage's hash of the micro-batches it drew goes into its row of its replica's
 * block of eval_dev, beside the last stage's loss sums and its counts of trained targets;
 * where agree_comm reads device memory (NCCL) the blocks are summed over every stage of every
 * replica there and every rank reads them back with the evaluation's one wait; otherwise the
 * last stage reads its block back (its one wait; a stage that set documents waits too, so the
 * next step's sets find every slot free) and one host collective sums them. The loss is the
 * mean over the trained targets of every micro-batch of every replica (each micro-batch's mean,
 * as a forward that read its losses would take it, weighted by its count), as the trainer's
 * evaluation without a pipeline: NaN, with a warning, when there are none. Stages
 * whose hashes differ fail alike, on every rank. */
static zt_status agree_eval(zt_pipe *p, int steps, double *loss) {
    const int stages = p->info.stages, dp = p->info.dp;
    const size_t block = eval_block(p, steps), own = p->eval_own;
    p->eval_in[0] = hash_value(p->eval_hash);
    zt_backend_copy(p->be, p->eval_dev + own + p->info.stage, p->eval_in, sizeof(double),
                    ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    if (last_stage(p))
        zt_backend_copy(p->be, p->eval_dev + own + stages + steps, p->eval_in + 1,
                        (size_t)steps * sizeof(double), ZT_COPY_H2D, ZT_STREAM_COMPUTE);
    if (p->agree_native) {
        ZT_TRY(zt_comm_dev_all_reduce(p->agree_comm, p->eval_dev, (size_t)dp * block, ZT_F64,
                                      ZT_REDUCE_SUM));
        zt_backend_copy(p->be, p->eval_out, p->eval_dev, (size_t)dp * block * sizeof(double),
                        ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    } else if (last_stage(p)) {
        zt_backend_copy(p->be, p->eval_out + own, p->eval_dev + own, block * sizeof(double),
                        ZT_COPY_D2H, ZT_STREAM_COMPUTE);
    }
    if (p->agree_native || last_stage(p) || (p->docs && p->doc_sets > 0)) {
        ZT_TRY(zt_backend_sync(p->be));
        p->doc_sets = 0;
    }
    if (!p->agree_native) {
        /* A stage other than the last has its hash only: its row, zeros elsewhere. */
        if (!last_stage(p)) {
            memset(p->eval_out + own, 0, block * sizeof(double));
            p->eval_out[own + p->info.stage] = p->eval_in[0];
        }
        ZT_TRY(sum_on_host(p, p->eval_out, block, p->eval_out + own));
    }
    double sum = 0.0, trained = 0.0;
    for (int r = 0; r < dp; r++) {
        const double *b = p->eval_out + (size_t)r * block, *sums = b + stages,
                     *counts = sums + steps;
        ZT_TRY(check_batches(p, r, b, 1, true));
        for (int i = 0; i < steps; i++)
            if (counts[i] > 0.0) {
                sum += (double)(float)(sums[i] / counts[i]) * counts[i];
                trained += counts[i];
            }
    }
    *loss = trained > 0.0 ? sum / trained : NAN;
    if (steps > 0 && trained == 0.0 && p->info.stage == 0 && p->info.replica == 0 &&
        p->grid.tp_rank == 0 && !p->warned_untrained_eval) {
        fprintf(stderr, "ztrain: warning: data.val: the %d validation micro-batch(es) evaluated "
                "hold no trained target (every target is masked): eval loss is NaN\n", steps);
        p->warned_untrained_eval = true;
    }
    return ZT_OK;
}

static void eval_free(zt_pipe *p) {
    const size_t all = (size_t)p->info.dp * eval_block(p, p->eval_cap) * sizeof(double);
    zt_backend_free(p->be, ZT_MEM_DEVICE, p->eval_dev, all);
    zt_backend_free(p->be, ZT_MEM_PINNED, p->eval_out, all);
    zt_backend_free(p->be, ZT_MEM_PINNED, p->eval_in, (1 + (size_t)p->eval_cap) * sizeof(double));
    p->eval_dev = p->eval_out = p->eval_in = NULL;
    p->eval_cap = 0;
}

/* The evaluation's agreement (agree_eval) for `steps` micro-batches, zeroed on the device: a
 * stage other than the last contributes zeros for the loss sums and counts, and each rank zeros
 * for the other stages' rows and the other replicas' blocks. Made for the job's eval_steps at
 * creation, grown when an evaluation is longer. */
static zt_status eval_reserve(zt_pipe *p, int steps) {
    const size_t block = eval_block(p, steps), dp = (size_t)p->info.dp;
    if (steps > p->eval_cap) {
        eval_free(p);
        p->eval_dev = zt_backend_alloc(p->be, ZT_MEM_DEVICE, dp * block * sizeof(double));
        p->eval_out = zt_backend_alloc(p->be, ZT_MEM_PINNED, dp * block * sizeof(double));
        p->eval_in = zt_backend_alloc(p->be, ZT_MEM_PINNED, (1 + (size_t)steps) * sizeof(double));
        p->eval_cap = steps; /* what eval_free gives back, made or not */
        if (!p->eval_dev || !p->eval_out || !p->eval_in)
            return zt_error(ZT_ERR_NOMEM, "pipeline: cannot allocate the evaluation's %d "
                            "losses on %s", steps, p->be->name);
    }
    p->eval_own = (size_t)p->info.replica * block;
    zt_backend_zero(p->be, p->eval_dev, dp * block * sizeof(double), ZT_STREAM_COMPUTE);
    return ZT_OK;
}

/* The engine's step check (zt_engine_set_step_check), right after the step's one
 * synchronisation and before its update: every rank agrees on the step, and a step in which a
 * replica's stages trained on other micro-batches fails before it is applied, on every rank.
 * Where agree_comm summed the agreement on the device (agree_enqueue), every rank has read
 * every replica's block with that synchronisation; otherwise one host collective sums them. The
 * step's loss, DeepSpeed's: each replica's mean over its micro-batches, averaged over the
 * replicas; the tokens summed over them; the bubble, replica 0's stages' shares summed. */
static zt_status agree_after_read(void *ctx) {
    zt_pipe *p = ctx;
    const int gas = p->info.micro_batches, dp = p->info.dp;
    const size_t n = p->agree_n;
    if (!p->agree_native)
        ZT_TRY(sum_on_host(p, p->agree_out, n,
                           last_stage(p) ? p->agree_out + (size_t)p->info.replica * n
                                         : p->agree_in));
    double loss = 0.0, tokens = 0.0;
    for (int r = 0; r < dp; r++) {
        const double *b = p->agree_out + (size_t)r * n;
        ZT_TRY(check_batches(p, r, b + p->agree_checks, gas, false));
        loss += replica_loss(b, gas) / gas;
        tokens += b[3 * gas];
    }
    p->result = (zt_pipe_batch_result){.loss = loss / dp, .tokens = tokens,
                                       .bubble = p->agree_out[3 * gas + 1]};
    return ZT_OK;
}

zt_status zt_pipe_train_batch(zt_pipe *p, zt_pipe_batch_result *res) {
    p->tokens = p->compute_ms = p->sched_ms = 0.0;
    for (int b = 0; b < p->nbuf; b++)
        p->buf[b].micro = -1;
    memset(p->batch_sum, 0, (size_t)p->info.micro_batches * sizeof *p->batch_sum);
    /* The other replicas' blocks of the agreement, which the last step's device sum filled,
     * back to 0 (this replica's own block is rewritten whole by its forwards and upload). */
    if (p->agree_native && p->info.dp > 1)
        zt_backend_zero(p->be, p->agree_dev, (size_t)p->info.dp * p->agree_n * sizeof(double),
                        ZT_STREAM_COMPUTE);
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
    *res = p->result;
    return ZT_OK;
}

zt_status zt_pipe_eval(zt_pipe *p, zt_loader *val, int steps, double *loss) {
    size_t n = zt_pipe_inference_schedule(p->info.stages, p->info.stage, steps, NULL, 0);
    zt_pipe_cmd *cmds = malloc(n * sizeof *cmds);
    if (!cmds)
        return zt_error(ZT_ERR_NOMEM, "pipeline: out of memory");
    zt_pipe_inference_schedule(p->info.stages, p->info.stage, steps, cmds, n);
    p->tokens = p->compute_ms = 0.0;
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
