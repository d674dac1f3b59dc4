/* Host round trips of a pipelined step on the emulated CUDA device (issue 28): two ranks, each a
 * process with an emulated GPU of its own, are the two stages of one pipeline, then four ranks
 * two replicas of it (GPT-2 tiny, fp32 and bf16, four micro-batches a step, so that the 1F1B
 * schedule interleaves forwards and backwards; and GPT-2 and Llama tiny on loss-masked packed
 * documents), on the nccl transport (the emulated device's NCCL, which reads device memory
 * itself) and on shm (which stages every device buffer through host memory) for comparison. Per
 * step, from the second on, each stage counts inside the emulated runtime (zt_emu_sync_counts)
 * the host's waits, the device-to-host copies and the uploads from pageable memory, less the
 * staging copies the transport made (zt_pipe_dev_counts: one wait and one read-back for each
 * copy to host memory, one pageable upload for each copy back), as test_cuda_emu_syncs_dp.c does
 * for data parallelism. What is left is the stage's own, bounded by the case's allowance (the
 * table below says where each remaining wait comes from; docs/gpu.md, "Pipeline stages on
 * NCCL"). Every count is printed. Every run's losses match the same job on the CPU
 * within the tolerance of another summation order (fp32) or of roundings between (bf16): with
 * packed documents that also shows that no document table was rewritten while the device still
 * had to copy it (the emulated device runs queued copies late, so a reused pinned slot moves the
 * loss). After the steps, an evaluation of EVAL_STEPS micro-batches is counted the same way
 * (one wait at most) and its loss compared with the CPU's. Stages whose loaders draw other
 * documents or other tokens fail, before the step's update, with an error naming both, and so
 * does an evaluation; with two replicas, where one replica's stages disagree, every rank fails
 * naming that replica. */
#include <math.h>
#include <sys/wait.h>

#include "check.h"
#include "emu_ranks.h"
#include "tiny_models.h"
#include "ztrain/backend.h"
#include "ztrain/comm.h"
#include "ztrain/data.h"
#include "ztrain/job_spec.h"
#include "ztrain/loss_mask.h"
#include "ztrain/pipe_engine.h"

enum { STEPS = 4, GAS = 4, STAGES = 2, MAX_WORLD = 4, NTOK = 8192, EVAL_STEPS = 6 };

typedef void (*counts_fn)(unsigned long long out[3]);

#define BF16 "\"bf16\": {\"enabled\": true}, "

typedef struct {
    const char *name;
    const char *model;     /* TINY_GPT2 or TINY_LLAMA */
    bool masked;           /* the loss-masked packed documents of train.bin */
    const char *precision; /* BF16 or "" */
    const char *comm;      /* the device run's transport */
    int dp;                /* replicas of the two stages */
    int waits;             /* the stage's own waits per step allowed */
    int reads[2];          /* and read-backs, at the first and at the last stage */
} run_case;

/* Each stage's step waits once: the optimizer step's one synchronisation, which also surfaces
 * the device's first error. Under it, two copies into pinned memory: the engine's scalars (the
 * norm's parts, on nccl their total summed over the stages on the device) and the pipe's
 * agreement on the step's loss (the last stage's summed token losses, their counts, the tokens
 * and the bubble, on nccl summed over the stages on the device; on shm only the last stage
 * reads it, and the stages sum it with a host collective, out of device memory). On nccl, one
 * read-back more per message received (GAS activations at the last stage, GAS gradients at the
 * first): the message's header (count and dtype), copied into pinned memory behind the receive
 * and checked when its event has fired, never waited for, so that a count the sender did not
 * send fails at once naming both ranks. Before (issue 28): 8 waits and 8 read-backs at the
 * first stage and 16 and 19 at the last on nccl (a host message with each activation's
 * sequence count, a wait per micro-batch at both ends; the loss read at every forward of the
 * last stage; the norm summed over the stages and the loss broadcast and the bubble averaged by
 * three host collectives after the step's read, which NCCL stages through device memory), and
 * 1 / 1 and 5 / 5 on shm. With packed documents, before: a wait before every set of the
 * documents (eight a step) and each activation's positions as a host message, 13 / 6 and 17 / 14
 * on nccl, 9 / 1 and 9 / 2 on shm. */
static const run_case cases[] = {
    {"shm gpt2 fp32 2 stages", TINY_GPT2, false, "", "shm", 1, 1, {1, 2}},
    {"shm gpt2 bf16 2 stages", TINY_GPT2, false, BF16, "shm", 1, 1, {1, 2}},
    {"nccl gpt2 fp32 2 stages", TINY_GPT2, false, "", "nccl", 1, 1, {2 + GAS, 2 + GAS}},
    {"nccl gpt2 bf16 2 stages", TINY_GPT2, false, BF16, "nccl", 1, 1, {2 + GAS, 2 + GAS}},
    /* Packed documents: the same allowances. Each micro-batch's document tables (the model's
     * positions, Llama's rotary rows for them) are set before its forward and again before its
     * backward, each set in a pinned slot of its own until the step's wait, and every stage
     * draws the positions itself instead of receiving them with the activation; the stages'
     * checksums of them ride in the agreement, which adds no copy. */
    {"shm gpt2 fp32 2 stages docs", TINY_GPT2, true, "", "shm", 1, 1, {1, 2}},
    {"shm llama bf16 2 stages docs", TINY_LLAMA, true, BF16, "shm", 1, 1, {1, 2}},
    {"nccl gpt2 fp32 2 stages docs", TINY_GPT2, true, "", "nccl", 1, 1, {2 + GAS, 2 + GAS}},
    {"nccl gpt2 bf16 2 stages docs", TINY_GPT2, true, BF16, "nccl", 1, 1, {2 + GAS, 2 + GAS}},
    {"nccl llama fp32 2 stages docs", TINY_LLAMA, true, "", "nccl", 1, 1, {2 + GAS, 2 + GAS}},
    {"nccl llama bf16 2 stages docs", TINY_LLAMA, true, BF16, "nccl", 1, 1, {2 + GAS, 2 + GAS}},
    /* Two replicas of the two stages (four ranks): the same allowances. The replicas' losses
     * and tokens ride in the agreement too, a block a replica summed over all four ranks (on
     * nccl on the device, on shm by the one host collective); before, one host collective more
     * over the replicas after the step's read (and after an evaluation's), which NCCL stages
     * through device memory: a wait and a read-back a step. Loss-masked data sums every
     * rank's count of trained targets over the replicas too (the global batch's count, which
     * transformers' Trainer divides each micro-batch's loss by, num_items_in_batch): the next
     * step's, drawn ahead, on the device under the step's wait (loss_norm.h); before, the
     * step's own at its first micro-batch, a host collective that NCCL staged through device
     * memory, one wait and one read-back more. */
    {"shm gpt2 fp32 2 stages x dp 2", TINY_GPT2, false, "", "shm", 2, 1, {1, 2}},
    {"nccl gpt2 bf16 2 stages x dp 2", TINY_GPT2, false, BF16, "nccl", 2, 1, {2 + GAS, 2 + GAS}},
    {"shm llama bf16 2 stages x dp 2 docs", TINY_LLAMA, true, BF16, "shm", 2, 1, {1, 2}},
    {"nccl llama fp32 2 stages x dp 2 docs", TINY_LLAMA, true, "", "nccl", 2, 1,
     {2 + GAS, 2 + GAS}},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* Per step, and for the evaluation after the last: the runtime's waits, read-backs and pageable
 * uploads less the transport's staging, and the staging's waits. */
typedef struct {
    unsigned long long own[STEPS][3], staged[STEPS];
    unsigned long long eval_own[3], eval_staged;
} measured;

/* The TCP ports of the rendezvous, one a run, one for the dead stage's and one for each of the
 * disagreeing loaders' runs on nccl, found free by the parent (shm ignores them). */
enum { PORT_DEAD = 2 * NCASES, PORT_DISAGREE, PORT_DISAGREE_PLAIN, PORT_DISAGREE_REPLICA, NPORTS };
static int ports[NPORTS];

static zt_comm *join(const char *what, int rank, int world, const char *transport, int port) {
    return emu_join("syncs-pipe", what, rank, world, transport, port);
}

/* Runs f(p, arg) between two readings of the counters: into own, what the runtime counted less
 * the transport's staging (a staging copy to the host is one wait and one read-back; its copy
 * back one upload), into *staged the staging's waits. */
static zt_status counted_call(zt_pipe *p, counts_fn counts, zt_status (*f)(zt_pipe *, void *),
                              void *arg, unsigned long long own[3], unsigned long long *staged) {
    unsigned long long before[3] = {0}, after[3] = {0};
    zt_comm_dev_stats cb = zt_pipe_dev_counts(p);
    if (counts)
        counts(before);
    zt_status s = f(p, arg);
    if (counts)
        counts(after);
    zt_comm_dev_stats ca = zt_pipe_dev_counts(p);
    unsigned long long waits = ca.staged_waits - cb.staged_waits,
                       uploads = ca.staged_uploads - cb.staged_uploads;
    own[0] = after[0] - before[0] - waits;
    own[1] = after[1] - before[1] - waits;
    own[2] = after[2] - before[2] - uploads;
    *staged = waits;
    return s;
}

static zt_status train_step(zt_pipe *p, void *res) {
    return zt_pipe_train_batch(p, res);
}

typedef struct {
    zt_loader *val;
    double loss;
} eval_call;

static zt_status evaluate(zt_pipe *p, void *arg) {
    eval_call *e = arg;
    return zt_pipe_eval(p, e->val, EVAL_STEPS, &e->loss);
}

/* Trains the case's job on one rank (its stage) and fills losses[STEPS] (the step's loss as
 * every stage reports it), then evaluates EVAL_STEPS micro-batches of the training data from its
 * start into *eval_loss; with counts, what it measured. */
static bool train(int ci, int rank, zt_device device, counts_fn counts, double *losses,
                  double *eval_loss, measured *out) {
    const run_case *c = &cases[ci];
    char json[2048];
    snprintf(json, sizeof json,
             "{\"name\": \"syncs-pipe\", \"world_size\": %d, \"model\": %s, \"data\": "
             "{\"train\": \"%s\"%s}, \"train\": {\"max_steps\": %d}, "
             "\"pipeline\": {\"stages\": %d}, \"deepspeed\": "
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": %d, "
             "%s\"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": 0}, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
             "\"weight_decay\": 0.1, \"eps\": 1e-4}}}}",
             STAGES * c->dp, c->model, c->masked ? "train.bin" : "train.txt",
             c->masked ? ", \"format\": \"masked\"" : "", STEPS, STAGES, GAS, c->precision);
    const bool cpu = device == ZT_DEVICE_CPU;
    char tag[64];
    snprintf(tag, sizeof tag, "%d-%s", ci, cpu ? "cpu" : "cuda");
    zt_comm *comm = join(tag, rank, STAGES * c->dp, cpu ? "shm" : c->comm, ports[2 * ci + !cpu]);
    if (!comm)
        return false;
    zt_job_spec job;
    zt_dataset data;
    zt_pipe *p = NULL;
    zt_engine_options opts = {.seed = 5, .shuffle = true, .threads = 1, .device = device,
                              .job_name = tag};
    if (zt_job_spec_parse(&job, json, "job", check_tmpdir) != ZT_OK ||
        zt_dataset_open_train(&data, &job.data, job.model.vocab_size) != ZT_OK ||
        zt_pipe_create(&p, &job, &data, comm, &opts) != ZT_OK) {
        CHECK(false, "rank %d, setup of %s: %s", rank, json, zt_last_error());
        zt_comm_destroy(comm);
        return false;
    }
    bool ok = true;
    measured scratch;
    if (!out)
        out = &scratch;
    for (int s = 0; s < STEPS && ok; s++) {
        zt_pipe_batch_result res;
        ok = check_at(__FILE__, __LINE__,
                      counted_call(p, counts, train_step, &res, out->own[s], &out->staged[s]) ==
                          ZT_OK,
                      "%s, rank %d step %d: %s", c->name, rank, s + 1, zt_last_error());
        losses[s] = res.loss;
    }
    ok = check_at(__FILE__, __LINE__, zt_engine_sync(zt_pipe_engine(p)) == ZT_OK, "%s",
                  zt_last_error()) && ok;
    zt_loader val;
    eval_call e = {&val, NAN};
    if (ok && check_at(__FILE__, __LINE__,
                       zt_loader_init(&val, &data, 2, job.model.block_size, 0, 1, false, false,
                                      5) == ZT_OK, "%s", zt_last_error())) {
        ok = check_at(__FILE__, __LINE__,
                      counted_call(p, counts, evaluate, &e, out->eval_own, &out->eval_staged) ==
                          ZT_OK,
                      "%s, rank %d, evaluation: %s", c->name, rank, zt_last_error());
        zt_loader_free(&val);
    }
    *eval_loss = e.loss;
    zt_pipe_destroy(p);
    zt_dataset_close(&data);
    zt_job_spec_free(&job);
    zt_comm_destroy(comm);
    return ok;
}

/* The pipeline of json on comm for the one-off checks below; false (what failed recorded, comm
 * destroyed) when it cannot be set up. */
static bool open_pipe(const char *what, int rank, const char *json, zt_comm *comm,
                      const zt_engine_options *opts, zt_job_spec *job, zt_dataset *data,
                      zt_pipe **p) {
    if (comm && zt_job_spec_parse(job, json, "job", check_tmpdir) == ZT_OK) {
        if (zt_dataset_open_train(data, &job->data, job->model.vocab_size) == ZT_OK) {
            if (zt_pipe_create(p, job, data, comm, opts) == ZT_OK)
                return true;
            zt_dataset_close(data);
        }
        zt_job_spec_free(job);
    }
    CHECK(false, "rank %d, setup of %s: %s", rank, what, zt_last_error());
    zt_comm_destroy(comm);
    return false;
}

static void close_pipe(zt_pipe *p, zt_job_spec *job, zt_dataset *data, zt_comm *comm) {
    zt_pipe_destroy(p);
    zt_dataset_close(data);
    zt_job_spec_free(job);
    zt_comm_destroy(comm);
}

/* The last stage dies after the first step, on nccl: the first stage, whose activations are
 * posted and whose micro-batch counts no longer travel as host messages, must still end its
 * next step in an error naming the dead rank (its first host wait, the step's, is watched),
 * never a hang. */
static void check_dead_stage(int rank) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"name\": \"dead-stage\", \"world_size\": %d, \"model\": %s, \"data\": "
             "{\"train\": \"train.txt\"}, \"train\": {\"max_steps\": %d}, "
             "\"pipeline\": {\"stages\": 2}, \"deepspeed\": "
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": %d, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}}",
             STAGES, TINY_GPT2, STEPS, GAS);
    zt_comm *comm = join("dead", rank, STAGES, "nccl", ports[PORT_DEAD]);
    zt_job_spec job;
    zt_dataset data;
    zt_pipe *p = NULL;
    zt_engine_options opts = {.seed = 5, .threads = 1, .device = ZT_DEVICE_CUDA,
                              .job_name = "dead"};
    if (!open_pipe("the dead stage's job", rank, json, comm, &opts, &job, &data, &p))
        return;
    zt_pipe_batch_result res;
    CHECK(zt_pipe_train_batch(p, &res) == ZT_OK, "rank %d, step 1: %s", rank, zt_last_error());
    if (rank == 1) {
        fflush(stdout);
        _exit(check_summary("test_cuda_emu_syncs_pipe stage 1"));
    }
    zt_status s = zt_pipe_train_batch(p, &res);
    if (s == ZT_OK)
        s = zt_engine_sync(zt_pipe_engine(p));
    CHECK(s != ZT_OK && strstr(zt_last_error(), "rank 1"),
          "stage 0, the step after stage 1 died: status %d, %s", s,
          s == ZT_OK ? "success" : zt_last_error());
    printf("stage 0, the step after stage 1 died: %s\n", zt_last_error());
    fflush(stdout);
    close_pipe(p, &job, &data, comm);
}

/* The model's parameters as the host reads them (every queued update done). */
static float *read_params(zt_pipe *p) {
    zt_model *m = zt_engine_model(zt_pipe_engine(p));
    const size_t bytes = m->n_params * sizeof(float);
    float *h = malloc(bytes);
    if (h && (zt_backend_sync(m->ctx.be) != ZT_OK ||
              (zt_backend_copy(m->ctx.be, h, m->params, bytes, ZT_COPY_D2H, ZT_STREAM_COMPUTE),
               zt_backend_sync(m->ctx.be) != ZT_OK))) {
        free(h);
        return NULL;
    }
    return h;
}

/* The stages' loaders disagree, as stages given another data file (on another host), sampler or
 * seed would: with packed documents (masked) the last stage reads other.bin, the same tokens and
 * trained targets as train.bin with other document boundaries; without, shifted.txt, train.txt's
 * bytes one place on. With dp 2, only the last replica's last stage reads shifted.txt: every
 * rank, the other replica's too, must fail alike, naming that replica. The micro-batches no longer travel with the activations in training, so
 * the stages compare a checksum of each micro-batch (its tokens, targets and positions) in the
 * step's agreement (on nccl summed on the device and read with the step's one wait; on shm in
 * the stages' host sum after it), before the step's update: both stages must fail the step with
 * an error that names the micro-batch and both stages, neither may hang, and neither may have
 * applied the step (no optimizer step counted, every parameter as it was). An evaluation before
 * it, each stage drawing from its own file, fails alike at its end. On the CPU (shm) and on the
 * emulated device (nccl). */
static void check_disagreeing_loaders(int rank, int dp, zt_device device, bool masked) {
    const bool cpu = device == ZT_DEVICE_CPU, odd = rank == STAGES * dp - 1;
    char json[1024];
    const char *file = masked ? (odd ? "other.bin" : "train.bin")
                              : (odd ? "shifted.txt" : "train.txt");
    snprintf(json, sizeof json,
             "{\"name\": \"disagree\", \"world_size\": %d, \"model\": %s, \"data\": "
             "{\"train\": \"%s\"%s}, \"train\": {\"max_steps\": %d}, "
             "\"pipeline\": {\"stages\": 2}, \"deepspeed\": "
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": %d, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}}",
             STAGES * dp, TINY_GPT2, file, masked ? ", \"format\": \"masked\"" : "", STEPS,
             GAS);
    char tag[64], replica[32] = "";
    snprintf(tag, sizeof tag, "disagree-%s-dp%d-%s", masked ? "docs" : "plain", dp,
             cpu ? "cpu" : "cuda");
    if (dp > 1)
        snprintf(replica, sizeof replica, " of replica %d", dp - 1);
    zt_comm *comm = join(tag, rank, STAGES * dp, cpu ? "shm" : "nccl",
                         ports[dp > 1 ? PORT_DISAGREE_REPLICA
                                      : masked ? PORT_DISAGREE : PORT_DISAGREE_PLAIN]);
    zt_job_spec job;
    zt_dataset data;
    zt_pipe *p = NULL;
    zt_engine_options opts = {.seed = 5, .threads = 1, .device = device, .job_name = tag};
    if (!open_pipe("the disagreeing loaders' job", rank, json, comm, &opts, &job, &data, &p))
        return;
    /* An evaluation first: it fails at its end, on both stages, naming them. */
    zt_loader val;
    if (zt_loader_init(&val, &data, 2, job.model.block_size, 0, 1, false, false, 5) == ZT_OK) {
        double loss;
        zt_status es = zt_pipe_eval(p, &val, EVAL_STEPS, &loss);
        const char *em = es == ZT_OK ? "success" : zt_last_error();
        CHECK(es == ZT_ERR_INVALID && strstr(em, "evaluation's micro-batches") &&
                  strstr(em, "at stage 1 than at stage 0") && strstr(em, replica) &&
                  strstr(em, "loaders disagree"),
              "%s, rank %d, evaluation: status %d, %s; wanted the disagreement of stages 0 "
              "and 1%s", tag, rank, es, em, replica);
        printf("%s, rank %d, evaluation: %s\n", tag, rank, em);
        zt_loader_free(&val);
    }
    float *before = read_params(p);
    zt_pipe_batch_result res;
    zt_status s = zt_pipe_train_batch(p, &res);
    const char *msg = s == ZT_OK ? "success" : zt_last_error();
    CHECK(s == ZT_ERR_INVALID && strstr(msg, "micro-batch 0 ") && strstr(msg, "stage 0") &&
              strstr(msg, "stage 1") && strstr(msg, replica) && strstr(msg, "loaders disagree"),
          "%s, rank %d: status %d, %s; wanted the disagreement of micro-batch 0 between "
          "stages 0 and 1%s", tag, rank, s, msg, replica);
    printf("%s, rank %d: %s\n", tag, rank, msg);
    fflush(stdout);
    zt_engine *e = zt_pipe_engine(p);
    float *after = read_params(p);
    const size_t n = zt_engine_model(e)->n_params;
    size_t changed = 0;
    for (size_t i = 0; before && after && i < n; i++)
        changed += memcmp(&before[i], &after[i], sizeof *after) != 0;
    CHECK(before && after && changed == 0 && zt_engine_global_steps(e) == 0,
          "%s, rank %d: the failed step was applied: %lld optimizer steps, %zu of %zu "
          "parameters changed", tag, rank, (long long)zt_engine_global_steps(e), changed, n);
    free(before);
    free(after);
    close_pipe(p, &job, &data, comm);
}

/* One rank of `world`, a stage of one replica: every case of that many ranks on the CPU and on
 * the emulated device, then the one-off checks. */
static int rank_main(int rank, int world) {
    counts_fn counts = (counts_fn)zt_backend_cuda_symbol("zt_emu_sync_counts");
    if (!counts) {
        fprintf(stderr, "rank %d: the emulated module has no zt_emu_sync_counts\n", rank);
        return 2;
    }
    const int dp = world / STAGES, stage = rank / dp;
    for (int i = 0; i < NCASES; i++) {
        const run_case *c = &cases[i];
        if (c->dp != dp)
            continue;
        double cpu[STEPS], cuda[STEPS], cpu_eval, cuda_eval;
        measured m = {0};
        if (!train(i, rank, ZT_DEVICE_CPU, NULL, cpu, &cpu_eval, NULL) ||
            !train(i, rank, ZT_DEVICE_CUDA, counts, cuda, &cuda_eval, &m))
            continue;
        printf("%-36s rank %d (stage %d), per step: own waits/D2H/pageable H2D + staged waits:",
               c->name, rank, stage);
        for (int s = 0; s < STEPS; s++)
            printf(" %llu/%llu/%llu+%llu", m.own[s][0], m.own[s][1], m.own[s][2], m.staged[s]);
        printf("; evaluation of %d: %llu/%llu/%llu+%llu\n", EVAL_STEPS, m.eval_own[0],
               m.eval_own[1], m.eval_own[2], m.eval_staged);
        fflush(stdout);
        for (int s = 1; s < STEPS; s++)
            CHECK(m.own[s][0] <= (unsigned)c->waits &&
                      m.own[s][1] <= (unsigned)c->reads[stage] && m.own[s][2] == 0,
                  "%s, rank %d step %d: %llu host waits, %llu device-to-host copies and %llu "
                  "pageable uploads besides the transport's staging; at most %d, %d and 0 "
                  "allowed", c->name, rank, s + 1, m.own[s][0], m.own[s][1], m.own[s][2],
                  c->waits, c->reads[stage]);
        /* NCCL reads device memory itself: nothing is staged. */
        for (int s = 0; strcmp(c->comm, "nccl") == 0 && s < STEPS; s++)
            CHECK(m.staged[s] == 0, "%s, rank %d step %d: %llu copies staged through the "
                  "host on nccl", c->name, rank, s + 1, m.staged[s]);
        /* The evaluation waits once, at its end, and reads its agreement back once: on nccl
         * every stage (summed over the stages on the device: the loss sums and the stages'
         * hashes), and the last stage each received activation's header too; on shm the last
         * stage its loss sums (the first waits only with documents, for its slots). Before: the
         * last stage waited for its loss at every forward, and each activation's count and
         * positions travelled as host messages: waits/read-backs at the first and last stage
         * 0/0 and 6/6 on shm, 7/1 and 19/24 on nccl; with documents 1/0 and 7/6 on shm, 14/1
         * and 32/36 on nccl. */
        const bool nccl = strcmp(c->comm, "nccl") == 0;
        const bool last = stage == STAGES - 1;
        const unsigned eval_reads = (nccl || last) + (nccl && last ? EVAL_STEPS : 0);
        CHECK(m.eval_own[0] <= 1 && m.eval_own[1] <= eval_reads && m.eval_own[2] == 0,
              "%s, rank %d, evaluation of %d micro-batches: %llu host waits, %llu "
              "device-to-host copies and %llu pageable uploads besides the transport's staging; "
              "at most 1, %u and 0 allowed", c->name, rank, EVAL_STEPS, m.eval_own[0],
              m.eval_own[1], m.eval_own[2], eval_reads);
        const double tol = c->precision[0] ? 2e-3 : 1e-4;
        for (int s = 0; s < STEPS; s++)
            CHECK(isfinite(cuda[s]) && fabs(cuda[s] - cpu[s]) <= tol * fabs(cpu[s]),
                  "%s, rank %d step %d: loss %.7g on cuda, %.7g on cpu", c->name, rank, s + 1,
                  cuda[s], cpu[s]);
        CHECK(isfinite(cuda_eval) && fabs(cuda_eval - cpu_eval) <= tol * fabs(cpu_eval),
              "%s, rank %d, evaluation: loss %.7g on cuda, %.7g on cpu", c->name, rank,
              cuda_eval, cpu_eval);
    }
    for (int masked = 0; masked < 2 - (dp > 1); masked++) {
        check_disagreeing_loaders(rank, dp, ZT_DEVICE_CPU, masked);
        check_disagreeing_loaders(rank, dp, ZT_DEVICE_CUDA, masked);
    }
    if (dp == 1)
        check_dead_stage(rank);
    char name[64];
    snprintf(name, sizeof name, "test_cuda_emu_syncs_pipe rank %d of %d", rank, world);
    return check_summary(name);
}

/* The data: train.txt's bytes as tokens; shifted.txt, the same bytes one place on; train.bin,
 * the same tokens with a loss mask training 60% of the targets and a document starting every 2
 * to 11 tokens; other.bin, the same tokens and trained targets in documents of 5 tokens. */
static void write_data(void) {
    char text[NTOK];
    uint16_t tokens[NTOK];
    uint8_t flags[NTOK], other[NTOK];
    unsigned rng = 7, next_doc = 0;
    for (size_t i = 0; i < NTOK; i++) {
        text[i] = (char)((i * 7 + i / 13) % 251);
        tokens[i] = (uint16_t)(unsigned char)text[i];
        rng = rng * 1103515245u + 12345u;
        uint8_t trained = (rng >> 16) % 10 < 6 ? ZT_LOSS_MASK_TRAINED : 0;
        flags[i] = (uint8_t)(trained | (i == next_doc ? ZT_LOSS_MASK_DOC_START : 0));
        other[i] = (uint8_t)(trained | (i % 5 == 0 ? ZT_LOSS_MASK_DOC_START : 0));
        if (i == next_doc)
            next_doc += 2 + (rng >> 8) % 10;
    }
    check_write_file(check_tmp_path("train.txt"), text, sizeof text);
    check_write_file(check_tmp_path("shifted.txt"), text + 1, sizeof text - 1);
    if (zt_dataset_write_tokens(check_tmp_path("train.bin"), tokens, NTOK) != ZT_OK ||
        zt_loss_mask_write(check_tmp_path("train.bin.mask"), flags, NTOK) != ZT_OK ||
        zt_dataset_write_tokens(check_tmp_path("other.bin"), tokens, NTOK) != ZT_OK ||
        zt_loss_mask_write(check_tmp_path("other.bin.mask"), other, NTOK) != ZT_OK) {
        fprintf(stderr, "cannot write the masked data: %s\n", zt_last_error());
        exit(2);
    }
}

int main(void) {
    if (!emu_devices("test_cuda_emu_syncs_pipe", 4))
        return 0;
    /* Free ports for every run's rendezvous (the nccl runs' store; shm ignores it). */
    if (!free_ports(ports, NPORTS))
        return 2;
    check_tmpdir_create("zt_syncs_pipe");
    write_data();
    /* The two stages alone, then two replicas of them. */
    for (int world = STAGES; world <= MAX_WORLD; world += STAGES)
        emu_run_ranks(world, rank_main);
    check_tmpdir_remove();
    return check_summary("test_cuda_emu_syncs_pipe");
}
