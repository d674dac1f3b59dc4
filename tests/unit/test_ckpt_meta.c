/* A checkpoint's meta.json with counters no save writes (found by fuzzing, tests/fuzz/ckpt_meta.c):
 * numbers beyond what the engine's integers hold (converting them was undefined behaviour),
 * negative or fractional positions (a negative epoch aborted in the loader's assertion). Each is
 * refused by zt_ckpt_load with ZT_ERR_FORMAT naming meta.json and the key, and the engine's
 * counters keep what the untouched checkpoint restored. The untouched file itself loads and
 * restores the counters it holds.
 * A key every save has written that is missing or not a number, a missing lr_schedule or data
 * section, and a version this build does not read are refused the same way, naming the key (a
 * default would resume silently from step 0 or from the data's start); a checkpoint as the first
 * versions wrote it, without the loss_scaler section and data.global_position, still loads. */
#include <cjson/cJSON.h>

#include "check.h"
#include "ztrain/checkpoint.h"
#include "ztrain/engine.h"
#include "ztrain/job_spec.h"

static const char job_json[] =
    "{\"name\": \"meta\", \"model\": {\"type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, "
    "\"n_embd\": 8, \"vocab_size\": 256, \"block_size\": 8},"
    " \"data\": {\"train\": \"train.txt\"}, \"train\": {\"max_steps\": 1},"
    " \"deepspeed\": {\"train_batch_size\": 2, \"optimizer\": {\"type\": \"AdamW\"}}}";

/* meta.json as the save wrote it, with `from` replaced by `to` (which must occur once). */
static void write_meta(const char *saved, const char *path, const char *from, const char *to) {
    const char *at = strstr(saved, from);
    if (!at || strstr(at + 1, from)) {
        fprintf(stderr, "'%s' is not in the saved meta.json exactly once\n", from);
        exit(2);
    }
    size_t n = strlen(saved) + strlen(to) + 1;
    char *text = malloc(n);
    snprintf(text, n, "%.*s%s%s", (int)(at - saved), saved, to, at + strlen(from));
    check_write_file(path, text, strlen(text));
    free(text);
}

/* meta.json as the save wrote it, without `key` of `section` (NULL: the top level), or with the
 * whole section removed when key is NULL. */
static void write_meta_without(const char *saved, const char *path, const char *section,
                               const char *key) {
    cJSON *m = cJSON_Parse(saved);
    cJSON *o = section && key ? cJSON_GetObjectItemCaseSensitive(m, section) : m;
    if (!o || !cJSON_GetObjectItemCaseSensitive(o, key ? key : section)) {
        fprintf(stderr, "'%s' '%s' is not in the saved meta.json\n", section ? section : "",
                key ? key : "");
        exit(2);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(o, key ? key : section);
    char *text = cJSON_Print(m);
    check_write_file(path, text, strlen(text));
    free(text);
    cJSON_Delete(m);
}

static void step(zt_engine *e) {
    zt_batch b;
    float loss;
    CHECK(zt_engine_next_batch(e, &b) == ZT_OK && zt_engine_forward(e, &b, &loss) == ZT_OK &&
              zt_engine_backward(e) == ZT_OK && zt_engine_step(e) == ZT_OK,
          "%s", zt_last_error());
}

int main(void) {
    const char *tmp = check_tmpdir_create("zt_ckpt_meta");
    char text[4096];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = "pack my box with five dozen liquor jugs "[i % 40];
    check_write_file(check_tmp_path("train.txt"), text, sizeof text);
    zt_job_spec job;
    zt_dataset data;
    zt_engine *e = NULL;
    zt_engine_options opts = {.seed = 3, .shuffle = true, .threads = 1};
    if (zt_job_spec_parse(&job, job_json, "job", tmp) != ZT_OK ||
        zt_dataset_open(&data, job.data.train, job.model.vocab_size) != ZT_OK ||
        zt_engine_create(&e, &job.ds, &job.model, &data, &opts) != ZT_OK) {
        fprintf(stderr, "setup: %s\n", zt_last_error());
        return 2;
    }
    step(e);
    step(e);
    const char *dir = check_tmp_path("ckpt");
    CHECK(zt_ckpt_save(e, &job, dir, NULL) == ZT_OK, "%s", zt_last_error());
    const char *meta_path = check_tmp_path("ckpt/global_step2/meta.json");
    FILE *f = fopen(meta_path, "rb");
    char saved[8192];
    size_t n = f ? fread(saved, 1, sizeof saved - 1, f) : 0;
    if (f)
        fclose(f);
    saved[n] = '\0';

    /* The file as saved, with the counters set to values this test chose. */
    write_meta(saved, meta_path, "\"global_steps\":\t2", "\"global_steps\": 7");
    CHECK(zt_ckpt_load(e, dir, NULL) == ZT_OK, "%s", zt_last_error());
    CHECK(zt_engine_global_steps(e) == 7, "global steps %lld", (long long)zt_engine_global_steps(e));
    CHECK(zt_engine_micro_steps(e) == 2, "micro steps %lld", (long long)zt_engine_micro_steps(e));
    /* The samples are restored as saved (2 steps of train_batch_size 2), not recomputed from
     * global_steps. */
    CHECK(zt_engine_global_samples(e) == 4, "global samples %lld",
          (long long)zt_engine_global_samples(e));
    step(e);

    static const struct {
        const char *from, *to, *key;
    } bad[] = {
        {"\"world_size\":\t1", "\"world_size\": 1e300", "world_size"},
        {"\"world_size\":\t1", "\"world_size\": 0", "world_size"},
        {"\"global_steps\":\t2", "\"global_steps\": 1e300", "global_steps"},
        {"\"micro_steps\":\t2", "\"micro_steps\": -1e19", "micro_steps"},
        {"\"global_samples\":\t4", "\"global_samples\": -4", "global_samples"},
        {"\"skipped_steps\":\t0", "\"skipped_steps\": 0.5", "skipped_steps"},
        {"\"optimizer_step\":\t2", "\"optimizer_step\": 1e400", "optimizer_step"},
        {"\"last_batch_iteration\":\t1", "\"last_batch_iteration\": -2", "last_batch_iteration"},
        {"\"epoch\":\t0", "\"epoch\": -1", "data.epoch"},
        {"\"global_position\":\t4", "\"global_position\": 1e300", "data.global_position"},
        {"\"position\":\t4", "\"position\": -3", "data.position"},
        {"\"global_steps\":\t2", "\"global_steps\": \"abc\"", "global_steps"},
        {"\"micro_steps\":\t2", "\"micro_steps\": null", "micro_steps"},
        {"\"epoch\":\t0", "\"epoch\": \"0\"", "data.epoch"},
        {"\"global_position\":\t4", "\"global_position\": true", "data.global_position"},
        {"\"last_batch_iteration\":\t1", "\"last_batch_iteration\": [1]",
         "lr_schedule.last_batch_iteration"},
        {"\"version\":\t1", "\"version\": 99", "version 99 is not one this build reads (it "
         "reads version 1)"},
        {"\"version\":\t1", "\"version\": \"1\"", "version \"1\" is not one"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_meta(saved, meta_path, bad[i].from, bad[i].to);
        zt_status s = zt_ckpt_load(e, dir, NULL);
        const char *msg = zt_last_error();
        CHECK(s == ZT_ERR_FORMAT, "%s: status %d (%s)", bad[i].to, (int)s, msg);
        CHECK(strstr(msg, "meta.json") && strstr(msg, bad[i].key), "%s: message '%s'", bad[i].to,
              msg);
        CHECK(zt_engine_global_steps(e) == 8, "%s: global steps now %lld", bad[i].to,
              (long long)zt_engine_global_steps(e));
    }

    /* Keys and sections every save has written, deleted. */
    static const struct {
        const char *section, *key, *named;
    } missing[] = {
        {NULL, "global_steps", "global_steps is missing"},
        {NULL, "global_samples", "global_samples is missing"},
        {NULL, "micro_steps", "micro_steps is missing"},
        {NULL, "skipped_steps", "skipped_steps is missing"},
        {NULL, "world_size", "world_size is missing"},
        {NULL, "optimizer_step", "optimizer_step is missing"},
        {NULL, "version", "version (missing) is not one this build reads"},
        {"lr_schedule", NULL, "the lr_schedule section is missing"},
        {"lr_schedule", "last_batch_iteration", "lr_schedule.last_batch_iteration is missing"},
        {"data", NULL, "the data section is missing"},
        {"data", "epoch", "data.epoch is missing"},
        {"data", "position", "data.position is missing"},
    };
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        write_meta_without(saved, meta_path, missing[i].section, missing[i].key);
        zt_status s = zt_ckpt_load(e, dir, NULL);
        const char *msg = zt_last_error();
        CHECK(s == ZT_ERR_FORMAT, "without %s: status %d (%s)", missing[i].named, (int)s, msg);
        CHECK(strstr(msg, "global_step2/meta.json") && strstr(msg, missing[i].named),
              "without %s: message '%s'", missing[i].named, msg);
        CHECK(zt_engine_global_steps(e) == 8, "without %s: global steps now %lld",
              missing[i].named, (long long)zt_engine_global_steps(e));
    }

    /* The first checkpoints had no loss_scaler section and no data.global_position: they load,
     * the position counted from data.position and the saved world size. */
    cJSON *old = cJSON_Parse(saved);
    cJSON_DeleteItemFromObjectCaseSensitive(old, "loss_scaler");
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(old, "data"),
                                            "global_position");
    char *old_text = cJSON_Print(old);
    check_write_file(meta_path, old_text, strlen(old_text));
    free(old_text);
    cJSON_Delete(old);
    CHECK(zt_ckpt_load(e, dir, NULL) == ZT_OK, "an older checkpoint: %s", zt_last_error());
    CHECK(zt_engine_global_steps(e) == 2, "an older checkpoint: global steps %lld",
          (long long)zt_engine_global_steps(e));
    int64_t epoch = -1, pos = -1;
    zt_engine_data_position(e, &epoch, &pos);
    CHECK(epoch == 0 && pos == 4, "an older checkpoint: data at epoch %lld position %lld",
          (long long)epoch, (long long)pos);

    zt_engine_destroy(e);
    zt_dataset_close(&data);
    zt_job_spec_free(&job);
    check_tmpdir_remove();
    return check_summary("test_ckpt_meta");
}
