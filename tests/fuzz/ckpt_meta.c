/* Fuzz target: a checkpoint's meta.json, as `ztrain sample`/`export` (zt_ckpt_read_model_spec)
 * and a resuming job (zt_ckpt_load) read it. At start a tiny GPT-2 engine is built and saved
 * once, so that its checkpoint has real weights and optimizer state; each input then replaces
 * that checkpoint's meta.json, which is read three ways (the spec, export's tensor reader, a
 * load), and after a load that succeeds the engine trains one step from what it restored, as a
 * resumed job does. A load may refuse the
 * file, but must neither crash nor leave the engine with values it cannot compute with. */
#include <limits.h>

#include "fuzz_util.h"
#include "ztrain/checkpoint.h"
#include "ztrain/engine.h"
#include "ztrain/job_spec.h"

static const char job_json[] =
    "{\"name\": \"fuzz\", \"model\": {\"type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, "
    "\"n_embd\": 8, \"vocab_size\": 256, \"block_size\": 8},"
    " \"data\": {\"train\": \"train.txt\"}, \"train\": {\"max_steps\": 1},"
    " \"deepspeed\": {\"train_batch_size\": 2, \"train_micro_batch_size_per_gpu\": 2,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
    " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10}}}}";

static zt_job_spec job;
static zt_dataset train;
static zt_engine *engine;
static char ckpt_dir[PATH_MAX], meta_path[PATH_MAX + 64];

static zt_status train_step(void) {
    zt_batch b;
    float loss;
    ZT_TRY(zt_engine_next_batch(engine, &b));
    ZT_TRY(zt_engine_forward(engine, &b, &loss));
    ZT_TRY(zt_engine_backward(engine));
    return zt_engine_step(engine);
}

/* Builds the engine, takes one optimizer step (so that the state is not all zero) and saves it
 * as ckpt/global_step1. */
static void make_checkpoint(void) {
    const char *tmp = fuzz_tmpdir();
    char path[PATH_MAX + 64];
    unsigned char bytes[4096];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)("the quick brown fox jumps over the lazy dog "[i % 44]);
    snprintf(path, sizeof path, "%s/train.txt", tmp);
    fuzz_write_file(path, bytes, sizeof bytes);
    FUZZ_CHECK(zt_job_spec_parse(&job, job_json, "fuzz job", tmp) == ZT_OK, "job: %s",
               zt_last_error());
    FUZZ_CHECK(zt_dataset_open(&train, job.data.train, job.model.vocab_size) == ZT_OK, "data: %s",
               zt_last_error());
    zt_engine_options opts = {.seed = 1, .shuffle = true, .threads = 1, .device = job.device};
    FUZZ_CHECK(zt_engine_create(&engine, &job.ds, &job.model, &train, &opts) == ZT_OK,
               "engine: %s", zt_last_error());
    FUZZ_CHECK(train_step() == ZT_OK, "step: %s", zt_last_error());
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", tmp);
    FUZZ_CHECK(zt_ckpt_save(engine, &job, ckpt_dir, NULL) == ZT_OK, "save: %s", zt_last_error());
    snprintf(meta_path, sizeof meta_path, "%s/global_step1/meta.json", ckpt_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!engine)
        make_checkpoint();
    fuzz_write_file(meta_path, data, size);
    zt_model_spec spec;
    if (zt_ckpt_read_model_spec(ckpt_dir, NULL, &spec) == ZT_OK) {
        /* Sample and export build a model of this spec next, whose creation validates it
         * (fields may be missing from the file, so the spec may be invalid here). */
        zt_model_spec_validate(&spec, "meta.json");
        free(spec.init_from);
    }
    /* Export's reader: every tensor's first and last values. */
    zt_ckpt_weights *w;
    if (zt_ckpt_weights_open(&w, ckpt_dir, NULL, ZT_CKPT_MASTER, &spec) == ZT_OK) {
        for (int i = 0; i < zt_ckpt_weights_count(w); i++) {
            const zt_ckpt_tensor *t = zt_ckpt_weights_tensor(w, i);
            float v[2];
            if (t->numel)
                zt_ckpt_weights_read(w, i, t->numel - 1, v, 1);
            zt_ckpt_weights_read(w, i, 0, v, t->numel < 2 ? t->numel : 2);
        }
        zt_ckpt_weights_close(w);
    }
    /* A resumed job's next move: one more step from the restored counters, schedule, loss
     * scale and data position. */
    if (zt_ckpt_load(engine, ckpt_dir, NULL) == ZT_OK)
        train_step();
    return 0;
}
