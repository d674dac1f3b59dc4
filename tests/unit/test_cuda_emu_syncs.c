/* Host round trips of a training step on the emulated CUDA device (issue 28, item 5): the
 * emulator counts every wait of the host for device work (stream, event and device
 * synchronisations, blocking copies, queries that ran pending work), every device-to-host copy
 * and every host-to-device copy from pageable memory (zt_emu_sync_counts, counted inside the
 * emulated runtime, not by the backend that makes the calls). GPT-2 and Llama train four steps of
 * two micro-batches each, with gradient clipping, at fp32, bf16 and fp16 (the loss scaler), at
 * ZeRO stages 0-2 on one rank; from the second step on (the first sizes scratch buffers and
 * plans) a step may wait for the device once and copy back once: the read of the losses and the
 * norm, from which the overflow and clipping decisions follow; and no upload from pageable memory.
 * The backend's own cheap counters (zt_cuda_round_trips, what a GPU run can read) must agree
 * with the emulator's on every step. Each run's losses also match the
 * same run on the CPU, within the tolerance of a different summation order, so that the values
 * read back late are the right ones. Prints the counts of every step. */
#include <math.h>

#include "check.h"
#include "tiny_models.h"
#include "ztrain/backend.h"
#include "ztrain/engine.h"
#include "ztrain/job_spec.h"

enum { STEPS = 4, GAS = 2 };

typedef void (*counts_fn)(unsigned long long out[3]);
typedef void (*module_counts_fn)(zt_backend *be, unsigned long long out[2]);
static module_counts_fn module_counts;

static const char *const models[] = {TINY_GPT2, TINY_LLAMA};

typedef struct {
    int model;             /* index into models */
    const char *precision; /* the DeepSpeed section that enables it, or "" */
    int stage;
} run_case;

static const run_case cases[] = {
    {0, "", 0},
    {0, "", 1},
    {0, "", 2},
    {0, "\"bf16\": {\"enabled\": true}, ", 1},
    {0, "\"bf16\": {\"enabled\": true}, ", 2},
    {0, "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12}, ", 2},
    {1, "", 0},
    {1, "", 2},
    {1, "\"bf16\": {\"enabled\": true}, ", 1},
};

/* Trains STEPS steps and fills losses[STEPS] (each the mean of the step's micro-batch losses);
 * with counts, per step the host waits, device-to-host copies and pageable uploads. */
static bool train(const run_case *c, zt_device device, counts_fn counts, double *losses,
                  unsigned long long per_step[STEPS][3]) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"name\": \"syncs\", \"model\": %s, \"data\": {\"train\": \"train.txt\"}, "
             "\"train\": {\"max_steps\": %d}, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": "
             "4, \"gradient_accumulation_steps\": %d, %s\"gradient_clipping\": 1.0, "
             "\"zero_optimization\": {\"stage\": %d}, \"optimizer\": {\"type\": \"AdamW\", "
             "\"params\": {\"lr\": 0.01, \"weight_decay\": 0.1, \"eps\": 1e-4}}}}",
             models[c->model], STEPS, GAS, c->precision, c->stage);
    zt_job_spec job;
    zt_dataset data;
    zt_engine *e = NULL;
    zt_engine_options opts = {.seed = 5, .shuffle = true, .threads = 1, .device = device};
    if (zt_job_spec_parse(&job, json, "job", check_tmpdir) != ZT_OK ||
        zt_dataset_open(&data, job.data.train, job.model.vocab_size) != ZT_OK ||
        zt_engine_create(&e, &job.ds, &job.model, &data, &opts) != ZT_OK) {
        CHECK(false, "setup of %s: %s", json, zt_last_error());
        return false;
    }
    bool ok = true;
    zt_backend *be = zt_engine_model(e)->ctx.be;
    for (int s = 0; s < STEPS && ok; s++) {
        unsigned long long before[3] = {0}, after[3] = {0}, mb[2] = {0}, ma[2] = {0};
        if (counts) {
            counts(before);
            module_counts(be, mb);
        }
        for (int m = 0; m < GAS && ok; m++) {
            zt_batch b;
            ok = check_at(__FILE__, __LINE__, zt_engine_next_batch(e, &b) == ZT_OK &&
                           zt_engine_forward(e, &b, NULL) == ZT_OK &&
                           zt_engine_backward(e) == ZT_OK && zt_engine_step(e) == ZT_OK,
                       "step %d micro %d: %s", s + 1, m, zt_last_error());
        }
        if (counts) {
            counts(after);
            module_counts(be, ma);
            CHECK(ma[0] - mb[0] == after[0] - before[0] && ma[1] - mb[1] == after[1] - before[1],
                  "step %d: the backend counted %llu waits and %llu copies back, the emulated "
                  "runtime %llu and %llu", s + 1, ma[0] - mb[0], ma[1] - mb[1],
                  after[0] - before[0], after[1] - before[1]);
        }
        const float *l = zt_engine_step_losses(e);
        losses[s] = ((double)l[0] + l[1]) / 2;
        for (int k = 0; k < 3 && counts; k++)
            per_step[s][k] = after[k] - before[k];
    }
    ok = check_at(__FILE__, __LINE__, zt_engine_sync(e) == ZT_OK, "%s", zt_last_error()) && ok;
    zt_engine_destroy(e);
    zt_dataset_close(&data);
    zt_job_spec_free(&job);
    return ok;
}

int main(void) {
    /* The emulated device of this build, unless the environment names a module already. */
    if (!getenv("ZTRAIN_CUDA_EMU") && !getenv("ZTRAIN_CUDA_MODULE"))
        setenv("ZTRAIN_CUDA_EMU", "1", 1);
    counts_fn counts = (counts_fn)zt_backend_cuda_symbol("zt_emu_sync_counts");
    module_counts = (module_counts_fn)zt_backend_cuda_symbol("zt_cuda_round_trips");
    if (!counts || !module_counts) {
        printf("test_cuda_emu_syncs: SKIPPED: no emulated CUDA device in this build\n");
        return 0;
    }
    check_tmpdir_create("zt_syncs");
    char text[8192];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (char)((i * 7 + i / 13) % 251);
    check_write_file(check_tmp_path("train.txt"), text, sizeof text);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const run_case *c = &cases[i];
        double cpu[STEPS], cuda[STEPS];
        unsigned long long n[STEPS][3];
        if (!train(c, ZT_DEVICE_CPU, NULL, cpu, NULL) || !train(c, ZT_DEVICE_CUDA, counts, cuda, n))
            continue;
        const bool fp32 = c->precision[0] == '\0';
        const char *prec = fp32 ? "fp32" : c->precision[1] == 'b' ? "bf16" : "fp16";
        printf("%-5s %s ZeRO %d, %d micro-batches: host waits / D2H copies / pageable H2D per "
               "step:", c->model ? "llama" : "gpt2", prec, c->stage, GAS);
        for (int s = 0; s < STEPS; s++)
            printf(" %llu/%llu/%llu", n[s][0], n[s][1], n[s][2]);
        printf("\n");
        for (int s = 1; s < STEPS; s++)
            CHECK(n[s][0] <= 1 && n[s][1] <= 1 && n[s][2] == 0,
                  "%s %s ZeRO %d step %d: %llu host waits, %llu device-to-host copies and %llu "
                  "pageable uploads; at most 1, 1 and 0 allowed", c->model ? "llama" : "gpt2",
                  prec, c->stage, s + 1, n[s][0], n[s][1], n[s][2]);
        /* fp32: the same formulas in another order of summation; 16-bit: roundings between. */
        const double tol = fp32 ? 1e-4 : 2e-3;
        for (int s = 0; s < STEPS; s++)
            CHECK(isfinite(cuda[s]) && fabs(cuda[s] - cpu[s]) <= tol * fabs(cpu[s]),
                  "%s %s ZeRO %d step %d: loss %.7g on cuda, %.7g on cpu",
                  c->model ? "llama" : "gpt2", prec, c->stage, s + 1, cuda[s], cpu[s]);
    }
    check_tmpdir_remove();
    return check_summary("test_cuda_emu_syncs");
}
