/* Host round trips of the whole training loop (zt_train_run, what `ztrain run` and ztraind's
 * ranks run) on the emulated CUDA device over the emulated NCCL (issue 28, item 5): two ranks,
 * each a process with an emulated GPU of its own. test_cuda_emu_syncs_dp counts the engine's
 * step alone; the loop around it adds its own agreements every step: the ranks' stop requests,
 * and the step gate's sums of the loss, the tokens and each rank's work time (the anomaly
 * rules', trainer_events.h). On a transport that reads device memory, a host collective is
 * staged through the device with a wait of its own, so before they travelled in the engine's
 * step table (zt_engine_set_step_table) the loop waited three times a step (measured with this
 * test: 3 waits and 3 read-backs a step in each of the four data-parallel cases below and in the
 * TP case; 2 and 5 in the pipeline's, which has no gate).
 *
 * Each case trains twice, 2 and 6 steps (evaluation off, the last step the only one logged, so
 * the two runs differ by four steady steps and nothing else), counting inside the emulated
 * runtime (zt_emu_sync_counts) the host's waits, device-to-host copies and uploads from pageable
 * memory of each run; the difference over four is what a step costs, which must be the step's
 * one wait and one read-back, nothing from pageable memory. Every count is printed. That the
 * table brings the losses the host all-reduce brought, bit for bit, dist/test_nccl_emu_training
 * checks through `ztrain run` (nccl against shm); that the stop request stops every rank at the
 * same step, unit/test_stop_signals.
 *
 * A logged step (train.log_interval) gathers every rank's memory, step breakdown and system
 * figures to rank 0 on top: the first two cases train LONG steps once more with every step logged,
 * and the difference over the LONG - 1 steps that run logs besides the last is what logging a step
 * costs: one collective, so one wait and one read-back. Measured with this test before the memory
 * figures joined the others' collective (rank_stats.h): 2 waits and 2 read-backs. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "emu_ranks.h"
#include "tiny_models.h"
#include "ztrain/backend.h"
#include "ztrain/job_spec.h"
#include "ztrain/trainer.h"

enum { WORLD = 2, SHORT = 2, LONG = 6, NTOK = 8192, LOGGED_CASES = 2 };

typedef void (*counts_fn)(unsigned long long out[3]);

typedef struct {
    const char *name, *model, *extra; /* extra: more of the deepspeed object, or "" */
    int stage;
    bool masked;
    const char *job_extra;            /* more of the job, or "" */
    int waits, reads;                 /* waits and read-backs a step allowed */
} run_case;

#define TP2 "\"tensor_parallel\": {\"autotp_size\": 2}, "
#define PP2 ", \"pipeline\": {\"stages\": 2}"

static const run_case cases[] = {
    {"gpt2 fp32 ZeRO 1", TINY_GPT2, "", 1, false, "", 1, 1},
    {"gpt2 bf16 ZeRO 2", TINY_GPT2, "\"bf16\": {\"enabled\": true}, ", 2, false, "", 1, 1},
    {"gpt2 fp32 ZeRO 3", TINY_GPT2, "", 3, false, "", 1, 1},
    /* Packed documents: the next step's counts of trained targets ride the step's wait too. */
    {"llama fp32 ZeRO 2 masked docs", TINY_LLAMA, "", 2, true, "", 1, 1},
    /* With tensor parallelism the table spans the job's ranks, not the engine's data-parallel
     * group (here none): the job's communicator takes the engine's device memory. */
    {"gpt2 fp32 tp 2 ZeRO 1", TINY_GPT2, TP2, 1, false, "", 1, 1},
    /* A pipeline takes no anomaly rules: its stage engines' table carries the stop requests
     * alone. Its step reads back, besides its scalars and agreement, each received message's
     * header (test_cuda_emu_syncs_pipe): 2 at either stage here. */
    {"gpt2 fp32 2 stages", TINY_GPT2, "", 0, false, PP2, 1, 4},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static int ports[3 * NCASES];
static counts_fn counts;

/* Trains the case for `steps` on nccl, logging every log_interval-th step and the last, and adds
 * the run's waits, read-backs and pageable uploads to got[3]; port: the run's rendezvous. */
static bool train(int c, int rank, int steps, int log_interval, int port,
                  unsigned long long got[3]) {
    const run_case *k = &cases[c];
    char json[2048], what[32], out[4200];
    snprintf(json, sizeof json,
             "{\"name\": \"loop\", \"world_size\": %d, \"device\": \"cuda\", \"comm\": \"nccl\", "
             "\"model\": %s, \"data\": {\"train\": \"%s\"%s}, \"train\": {\"max_steps\": %d, "
             "\"log_interval\": %d, \"seed\": 5}, \"deepspeed\": "
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2, %s"
             "\"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": %d}, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}%s}",
             WORLD, k->model, k->masked ? "train.bin" : "train.txt",
             k->masked ? ", \"format\": \"masked\"" : "", steps, log_interval, k->extra, k->stage,
             k->job_extra);
    snprintf(what, sizeof what, "%d-%d-%d", c, steps, log_interval);
    snprintf(out, sizeof out, "%s/run-%s", check_tmpdir, what);
    zt_comm *comm = emu_join("syncs-loop", what, rank, WORLD, "nccl", port);
    if (!comm)
        return false;
    zt_dist_info d = {.rank = rank, .world_size = WORLD, .local_rank = rank,
                      .local_world_size = WORLD};
    zt_job_spec job;
    zt_train_result res;
    unsigned long long before[3], after[3];
    bool ok = check_at(__FILE__, __LINE__,
                       zt_job_spec_parse(&job, json, "job", check_tmpdir) == ZT_OK,
                       "rank %d, %s: %s", rank, json, zt_last_error());
    if (ok) {
        zt_train_options o = {.out_dir = rank == 0 ? out : NULL, .threads = 1, .dist = &d,
                              .comm = comm};
        counts(before);
        ok = check_at(__FILE__, __LINE__, zt_train_run(&job, &o, &res) == ZT_OK &&
                                              res.steps == steps,
                      "rank %d, %s, %d steps: %s", rank, k->name, steps, zt_last_error());
        counts(after);
        for (int i = 0; i < 3; i++)
            got[i] += after[i] - before[i];
        zt_job_spec_free(&job);
    }
    zt_comm_destroy(comm);
    return ok;
}

static int rank_main(int rank, int world) {
    (void)world;
    counts = (counts_fn)zt_backend_cuda_symbol("zt_emu_sync_counts");
    if (!counts) {
        fprintf(stderr, "rank %d: the emulated module has no zt_emu_sync_counts\n", rank);
        return 2;
    }
    for (int c = 0; c < NCASES; c++) {
        unsigned long long shorter[3] = {0}, longer[3] = {0};
        if (!train(c, rank, SHORT, 1000, ports[3 * c], shorter) ||
            !train(c, rank, LONG, 1000, ports[3 * c + 1], longer))
            continue;
        unsigned long long step[3];
        bool whole = true;
        for (int i = 0; i < 3; i++) {
            step[i] = (longer[i] - shorter[i]) / (LONG - SHORT);
            whole = whole && longer[i] >= shorter[i] &&
                    (longer[i] - shorter[i]) % (LONG - SHORT) == 0;
        }
        printf("%-32s rank %d: %d steps %llu/%llu/%llu, %d steps %llu/%llu/%llu waits/D2H/pageable "
               "H2D; a step: %llu/%llu/%llu\n", cases[c].name, rank, SHORT, shorter[0],
               shorter[1], shorter[2], LONG, longer[0], longer[1], longer[2], step[0], step[1],
               step[2]);
        fflush(stdout);
        const unsigned long long allowed = (unsigned long long)cases[c].waits,
                                 reads = (unsigned long long)cases[c].reads;
        CHECK(whole && step[0] <= allowed && step[1] <= reads && step[2] == 0,
              "%s, rank %d: the training loop's steady step waits %llu times, reads back %llu "
              "times and uploads %llu times from pageable memory (%s); at most %llu, %llu and 0 "
              "allowed", cases[c].name, rank, step[0], step[1], step[2],
              whole ? "every step alike" : "steps unlike each other", allowed, reads);
        unsigned long long logged[3] = {0};
        if (c >= LOGGED_CASES || !train(c, rank, LONG, 1, ports[3 * c + 2], logged))
            continue;
        unsigned long long extra[3];
        whole = true;
        for (int i = 0; i < 3; i++) {
            extra[i] = (logged[i] - longer[i]) / (LONG - 1);
            whole = whole && logged[i] >= longer[i] && (logged[i] - longer[i]) % (LONG - 1) == 0;
        }
        printf("%-32s rank %d: every step logged %llu/%llu/%llu; logging a step: %llu/%llu/%llu\n",
               cases[c].name, rank, logged[0], logged[1], logged[2], extra[0], extra[1],
               extra[2]);
        fflush(stdout);
        CHECK(whole && extra[0] <= 1 && extra[1] <= 1 && extra[2] == 0,
              "%s, rank %d: logging a step waits %llu more times, reads back %llu more times and "
              "uploads %llu times from pageable memory (%s); at most 1, 1 and 0 allowed (one "
              "gather of the ranks' figures)", cases[c].name, rank, extra[0], extra[1], extra[2],
              whole ? "every logged step alike" : "logged steps unlike each other");
    }
    return check_summary(rank ? "test_cuda_emu_syncs_trainer rank 1"
                              : "test_cuda_emu_syncs_trainer rank 0");
}

int main(void) {
    if (!emu_devices("test_cuda_emu_syncs_trainer", 2))
        return 0;
    if (!free_ports(ports, 3 * NCASES))
        return 2;
    check_tmpdir_create("zt_syncs_loop");
    emu_write_data(NTOK);
    emu_run_ranks(WORLD, rank_main);
    check_tmpdir_remove();
    return check_summary("test_cuda_emu_syncs_trainer");
}
