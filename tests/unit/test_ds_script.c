/* The job as the training script (issue 20): the key table's own consistency, training_args'
 * checks, and the "auto" values, missing batch keys, missing optimizer and lr_scheduler_type
 * resolved as transformers' HfTrainerDeepSpeedConfig resolves them (integrations/deepspeed.py,
 * trainer_config_process / trainer_config_finalize; TrainingArguments.get_warmup_steps). Expected
 * values are those rules' formulas, computed here. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "ztrain/job_spec.h"

#define MODEL "\"model\": {\"type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 48, " \
              "\"vocab_size\": 256, \"block_size\": 16}, \"data\": {\"train\": \"t.bin\"}"

static bool parse_at(int line, const char *json, zt_job_spec *job) {
    zt_status s = zt_job_spec_parse(job, json, "job.json", "/base");
    return check_at(__FILE__, line, s == ZT_OK, "expected success, got %s: %s\n  job: %s",
                    zt_status_name(s), zt_last_error(), json);
}
#define PARSE(json, job) parse_at(__LINE__, json, job)

static void err_at(int line, const char *json, zt_status want, const char *msg) {
    zt_job_spec job;
    zt_status s = zt_job_spec_parse(&job, json, "job.json", "/base");
    check_error_is(__FILE__, line, "job", json, s, want, msg, true);
    if (s == ZT_OK)
        zt_job_spec_free(&job);
}
#define ERR(json, want, msg) err_at(__LINE__, json, want, msg)

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

static const zt_ds_key *row_of(const zt_ds_key *keys, size_t n, const char *path) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(keys[i].path, path) == 0)
            return &keys[i];
    return NULL;
}

/* One row per path; a dotted path's parent is a section row; defaults are JSON; stage sets are
 * stages; notes are single lines a markdown table can hold. */
static void test_key_table(void) {
    size_t n;
    const zt_ds_key *keys = zt_ds_keys(&n);
    CHECK(n > 200, "%zu rows", n);
    for (size_t i = 0; i < n; i++) {
        const zt_ds_key *k = &keys[i];
        CHECK(row_of(keys, n, k->path) == k, "%s is listed twice", k->path);
        char parent[256];
        snprintf(parent, sizeof parent, "%s", k->path);
        char *dot = strrchr(parent, '.');
        if (dot) {
            *dot = '\0';
            const zt_ds_key *p = row_of(keys, n, parent);
            CHECK(p && (p->flags & ZT_DS_KEY_SECTION), "%s: parent %s is not a section row", k->path,
                  parent);
        }
        if (k->dflt) {
            cJSON *d = cJSON_Parse(k->dflt);
            CHECK(d != NULL, "%s: default %s is not JSON", k->path, k->dflt);
            cJSON_Delete(d);
        }
        CHECK((k->stages & ~0xfu) == 0, "%s: stages 0x%x", k->path, k->stages);
        CHECK(k->note && k->note[0] && !strchr(k->note, '|') && !strchr(k->note, '\n'),
              "%s: a one-line note without '|'", k->path);
        CHECK(zt_ds_key_fate_of(k) <= ZT_DS_KEY_REFUSED, "%s: fate", k->path);
    }
}

static void test_training_args_checks(void) {
    ERR("{" MODEL ", \"training_args\": {\"learnin_rate\": 1e-4}, \"deepspeed\": {}}", ZT_ERR_INVALID,
        "job.json: unknown key 'learnin_rate' in training_args (did you mean 'learning_rate'?)");
    ERR("{" MODEL ", \"training_args\": {\"per_device_train_batch_size\": 0}, \"deepspeed\": {}}",
        ZT_ERR_INVALID, "job.json: key 'training_args.per_device_train_batch_size' must be >= 1, got 0");
    ERR("{" MODEL ", \"training_args\": {\"warmup_ratio\": 1.5}, \"deepspeed\": {}}", ZT_ERR_INVALID,
        "job.json: key 'training_args.warmup_ratio' must be between 0 and 1, got 1.5");
    ERR("{" MODEL ", \"training_args\": {\"bf16\": true, \"fp16\": true}, \"deepspeed\": {}}",
        ZT_ERR_INVALID, "job.json: training_args.bf16 and training_args.fp16 cannot both be true");
    ERR("{" MODEL ", \"training_args\": {\"lr_scheduler_type\": \"cosine_with_restarts\"}, "
        "\"deepspeed\": {}}", ZT_ERR_INVALID,
        "job.json: key 'training_args.lr_scheduler_type' \"cosine_with_restarts\" is not supported");
    /* The schedule's step counts need the number of training steps, which a job run by epochs
     * knows only from its data. */
    ERR("{" MODEL ", \"deepspeed\": {\"train_batch_size\": 4, \"scheduler\": {\"type\": "
        "\"WarmupDecayLR\", \"params\": {\"total_num_steps\": \"auto\"}}}}", ZT_ERR_INVALID,
        "job.json: deepspeed: scheduler.params total_num_steps / warmup_num_steps \"auto\" need the "
        "number of training steps: set train.max_steps in the job");
}

static void test_resolution(void) {
    zt_job_spec job;
    /* world 3, micro 5, accumulation 2: HF's train_batch_size is their product. Warmup from the
     * ratio: ceil(7 * 0.3) = 3. Hidden size 48: reduce_bucket_size 48^2, stage-3 prefetch
     * floor(0.9 * 48^2) = 2073, persistence 480. */
    const char *json =
        "{\"world_size\": 3, " MODEL ", \"train\": {\"max_steps\": 7},"
        " \"training_args\": {\"learning_rate\": 2e-4, \"per_device_train_batch_size\": 5,"
        "   \"gradient_accumulation_steps\": 2, \"warmup_ratio\": 0.3, \"max_grad_norm\": 0.25,"
        "   \"adam_beta1\": 0.8, \"adam_epsilon\": 1e-6, \"weight_decay\": 0.1},"
        " \"deepspeed\": {\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\","
        "   \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\","
        "   \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\","
        "     \"eps\": \"auto\", \"weight_decay\": \"auto\"}},"
        "   \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\","
        "     \"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}},"
        "   \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\","
        "     \"stage3_prefetch_bucket_size\": \"auto\", \"stage3_param_persistence_threshold\": \"auto\"}}}";
    if (PARSE(json, &job)) {
        const zt_ds_config *d = &job.ds;
        CHECK(d->train_micro_batch_size_per_gpu == 5 && d->gradient_accumulation_steps == 2 &&
              d->train_batch_size == 3 * 5 * 2, "batch %d %d %d", d->train_batch_size,
              d->train_micro_batch_size_per_gpu, d->gradient_accumulation_steps);
        CHECK(d->gradient_clipping == 0.25);
        CHECK(d->optimizer.lr == 2e-4 && d->optimizer.beta1 == 0.8 && d->optimizer.beta2 == 0.999 &&
              d->optimizer.eps == 1e-6 && d->optimizer.weight_decay == 0.1);
        CHECK(d->scheduler.warmup_min_lr == 0 && d->scheduler.warmup_max_lr == 2e-4 &&
              d->scheduler.warmup_num_steps == (int)ceil(7 * 0.3) && d->scheduler.total_num_steps == 7);
        CHECK(d->zero.reduce_bucket_size == 48 * 48 &&
              d->zero.stage3_prefetch_bucket_size == (int64_t)floor(0.9 * 48 * 48) &&
              d->zero.stage3_param_persistence_threshold == 10 * 48);
        CHECK(count(d->resolved, "\"auto\"") == 15, "%d resolved lines:\n%s",
              count(d->resolved, "\"auto\""), d->resolved);
        CHECK(count(d->resolved, "\"auto\" train_batch_size = 30 ") == 1, "%s", d->resolved);
        zt_job_spec_free(&job);
    }

    /* No optimizer, no batch keys: the Trainer's AdamW from the arguments' defaults (5e-5, 0.9,
     * 0.999, 1e-8, 0), with one warning; the DataLoader's batch (8) and accumulation (1). */
    if (PARSE("{" MODEL ", \"deepspeed\": {\"zero_optimization\": {\"stage\": 1}}}", &job)) {
        const zt_ds_config *d = &job.ds;
        CHECK(d->has_optimizer && d->optimizer.type == ZT_OPTIM_ADAM && d->optimizer.adam_w_mode &&
              d->optimizer.lr == 5e-5 && d->optimizer.beta1 == 0.9 && d->optimizer.beta2 == 0.999 &&
              d->optimizer.eps == 1e-8 && d->optimizer.weight_decay == 0);
        CHECK(count(d->warnings, "no \"optimizer\" section: training with the Trainer's default "
                                 "AdamW") == 1, "%s", d->warnings);
        CHECK(d->train_micro_batch_size_per_gpu == 8 && d->gradient_accumulation_steps == 1 &&
              d->train_batch_size == 8);
        cJSON *eff = cJSON_Parse(job.ds_effective_json);
        const cJSON *opt = cJSON_GetObjectItem(eff, "optimizer");
        CHECK(opt && strcmp(cJSON_GetObjectItem(opt, "type")->valuestring, "AdamW") == 0);
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(eff, "zero_optimization"), "stage")->valueint == 1);
        cJSON_Delete(eff);
        zt_job_spec_free(&job);
    }

    /* lr_scheduler_type "linear" without a scheduler: WarmupDecayLR with linear warmup from 0 to
     * the lr over warmup_steps, decaying to 0 at max_steps (get_linear_schedule_with_warmup). */
    if (PARSE("{" MODEL ", \"train\": {\"max_steps\": 100}, \"training_args\": {\"learning_rate\": "
              "1e-3, \"warmup_steps\": 10, \"lr_scheduler_type\": \"linear\"}, \"deepspeed\": "
              "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": "
              "{\"lr\": \"auto\"}}}}", &job)) {
        const zt_schedule_config *s = &job.ds.scheduler;
        CHECK(s->type == ZT_SCHED_WARMUP_DECAY_LR && s->warmup_linear && s->warmup_min_lr == 0 &&
              s->warmup_max_lr == 1e-3 && s->warmup_num_steps == 10 && s->total_num_steps == 100);
        zt_job_spec_free(&job);
    }

    /* A value the job gives that the config contradicts is the Trainer's error; one left at its
     * default is not compared. */
    ERR("{" MODEL ", \"training_args\": {\"max_grad_norm\": 0.5}, \"deepspeed\": "
        "{\"train_batch_size\": 8, \"gradient_clipping\": 1.0}}", ZT_ERR_INVALID,
        "job.json: deepspeed: Please correct the following DeepSpeed config values that mismatch "
        "TrainingArguments values:\n- ds gradient_clipping=1 vs hf max_grad_norm=0.5\n");
    if (PARSE("{" MODEL ", \"deepspeed\": {\"train_batch_size\": 8, \"gradient_clipping\": 1.0}}",
              &job))
        zt_job_spec_free(&job);
}

/* "auto" train_batch_size beside a micro batch or accumulation the config fixes, the job setting
 * no argument: HF's world_size * per_device_train_batch_size * gradient_accumulation_steps with
 * the values in force (an argument left at its default is not compared, so the config's stands),
 * not the default 8, from which DeepSpeed infers 16 // 8 = 0 accumulation steps (or silently 2
 * for a micro batch of 4). A batch refusal after a fill quotes the fill. */
static void test_auto_train_batch(void) {
    static const struct {
        const char *batch;
        int world, train, micro, gas;
    } cases[] = {
        {"\"train_micro_batch_size_per_gpu\": 16", 1, 16, 16, 1},
        {"\"train_micro_batch_size_per_gpu\": 4", 2, 8, 4, 1},
        {"\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 16", 3, 96, 2, 16},
        {"\"train_micro_batch_size_per_gpu\": 16, \"gradient_accumulation_steps\": \"auto\"", 2, 32,
         16, 1},
        {"\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": 4", 1, 32, 8,
         4},
        {"\"gradient_accumulation_steps\": 3", 2, 48, 8, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"world_size\": %d, " MODEL ", \"deepspeed\": "
                 "{\"train_batch_size\": \"auto\", %s}}", cases[i].world, cases[i].batch);
        zt_job_spec job;
        if (!PARSE(json, &job))
            continue;
        const zt_ds_config *d = &job.ds;
        CHECK(d->train_batch_size == cases[i].train && d->train_micro_batch_size_per_gpu ==
              cases[i].micro && d->gradient_accumulation_steps == cases[i].gas,
              "%s on %d ranks: batch %d %d %d", cases[i].batch, cases[i].world, d->train_batch_size,
              d->train_micro_batch_size_per_gpu, d->gradient_accumulation_steps);
        zt_job_spec_free(&job);
    }
    zt_job_spec job;
    if (PARSE("{" MODEL ", \"deepspeed\": {\"train_batch_size\": \"auto\", "
              "\"train_micro_batch_size_per_gpu\": 16}}", &job)) {
        CHECK(count(job.ds.resolved, "\"auto\" train_batch_size = 16 (data-parallel size 1 * "
                    "train_micro_batch_size_per_gpu 16 * training_args.gradient_accumulation_steps 1)")
              == 1, "%s", job.ds.resolved);
        zt_job_spec_free(&job);
    }
    ERR("{" MODEL ", \"deepspeed\": {\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": "
        "\"auto\"}}", ZT_ERR_INVALID,
        "job.json: deepspeed: Gradient accumulation steps: 0 has to be greater than 0 (the batch keys "
        "ztrain filled, as the Trainer does: \"auto\" train_micro_batch_size_per_gpu = 8 "
        "(training_args.per_device_train_batch_size, not set: the Trainer's default))");
    CHECK(strcmp(zt_last_error_field(), "deepspeed.gradient_accumulation_steps") == 0, "field %s",
          zt_last_error_field());
}

/* Warnings are collected once per key, in order, for the caller to print once per job. */
static void test_warnings_once(void) {
    zt_job_spec job;
    if (PARSE("{" MODEL ", \"deepspeed\": {\"train_batch_size\": 8, \"optimizer\": {\"type\": "
              "\"Adam\"}, \"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 1000, "
              "\"allgather_bucket_size\": 1000}, \"aio\": {\"queue_depth\": 4}}}", &job)) {
        const char *w = job.ds.warnings;
        CHECK(count(w, "zero_optimization.reduce_bucket_size has no effect at ZeRO stage 1") == 1, "%s", w);
        CHECK(count(w, "zero_optimization.allgather_bucket_size has no effect") == 1, "%s", w);
        CHECK(count(w, "aio.queue_depth has no effect") == 1, "%s", w);
        CHECK(count(w, "\n") == 3, "%s", w);
        zt_job_spec_free(&job);
    }
    ERR("{" MODEL ", \"deepspeed\": {\"train_batch_size\": 8, \"aio\": {\"queue_dept\": 4}}}",
        ZT_ERR_INVALID, "job.json: deepspeed: unknown key 'queue_dept' in aio (did you mean 'queue_depth'?)");
    ERR("{" MODEL ", \"deepspeed\": {\"train_batch_size\": 8, \"data_efficiency\": {\"enabled\": true, "
        "\"data_routing\": {\"enabled\": true, \"random_ltd\": {\"enabled\": true}}}}}",
        ZT_ERR_UNSUPPORTED,
        "job.json: deepspeed: data_efficiency.data_routing.random_ltd.enabled is not supported by ztrain");
}

/* warmup_num_steps "auto" as TrainingArguments.get_warmup_steps computes it: transformers 5
 * (warmup_steps: float) takes an int as steps, int() of a number >= 1, and ceil(N * w) for a w in
 * (0, 1); transformers 4's warmup_ratio applies when warmup_steps is 0; the integration fills at
 * least 1 (max(1, ...), as DeepSpeed >= 0.19.6 refuses 0). N = train.max_steps = 10. The same
 * cases run against transformers 5 itself in tests/deepspeed/test_hf5_warmup.py. */
static void warmup_case(int line, const char *args, int64_t want) {
    char json[1024];
    snprintf(json, sizeof json,
             "{" MODEL ", \"train\": {\"max_steps\": 10}, \"training_args\": {%s},"
             " \"deepspeed\": {\"train_batch_size\": 4, \"optimizer\": {\"type\": \"AdamW\","
             " \"params\": {}}, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
             "{\"warmup_num_steps\": \"auto\"}}}}", args);
    zt_job_spec job;
    if (!parse_at(line, json, &job))
        return;
    check_at(__FILE__, line, job.ds.scheduler.warmup_num_steps == want,
             "training_args {%s}: warmup_num_steps %lld, want %lld", args,
             (long long)job.ds.scheduler.warmup_num_steps, (long long)want);
    zt_job_spec_free(&job);
}
#define WARMUP(args, want) warmup_case(__LINE__, args, want)

static void test_warmup_steps(void) {
    WARMUP("\"warmup_steps\": 3", 3);
    WARMUP("\"warmup_steps\": 0.25", 3);   /* ceil(10 * 0.25) */
    WARMUP("\"warmup_steps\": 0.05", 1);   /* ceil(0.5) */
    WARMUP("\"warmup_steps\": 2.5", 2);    /* int(2.5) */
    WARMUP("\"warmup_steps\": 1.0", 1);
    WARMUP("\"warmup_ratio\": 0.3", 3);    /* transformers 4: ceil(10 * 0.3) */
    WARMUP("\"warmup_steps\": 4, \"warmup_ratio\": 0.9", 4);
    WARMUP("\"learning_rate\": 1e-3", 1);  /* no warmup: max(1, 0) */
    /* Longer than a C int: the Trainer's warmup_steps is a Python int, and so is DeepSpeed's. */
    WARMUP("\"warmup_steps\": 3000000000", 3000000000);
    ERR("{" MODEL ", \"training_args\": {\"warmup_steps\": -1}, \"deepspeed\": {}}", ZT_ERR_INVALID,
        "job.json: key 'training_args.warmup_steps' must be >= 0, got -1");
    ERR("{" MODEL ", \"training_args\": {\"warmup_steps\": \"5\"}, \"deepspeed\": {}}",
        ZT_ERR_INVALID, "job.json: key 'training_args.warmup_steps' must be a number");
}

/* max_grad_norm at or below 0: the Trainer clips only when it is > 0 (trainer.py, `if
 * args.max_grad_norm is not None and args.max_grad_norm > 0`), and gradient_clipping "auto" takes
 * it, which DeepSpeed applies only when > 0 (engine.py _take_model_step): accepted as no
 * clipping, the value handed on as it is. A string is still no number. */
static void test_max_grad_norm_off(void) {
    static const double values[] = {0.0, -1.0, -0.5};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{" MODEL ", \"training_args\": {\"max_grad_norm\": %g}, "
                 "\"deepspeed\": {\"train_batch_size\": 8, \"gradient_clipping\": \"auto\"}}",
                 values[i]);
        zt_job_spec job;
        if (PARSE(json, &job)) {
            CHECK(job.ds.gradient_clipping == values[i], "max_grad_norm %g: gradient_clipping %g",
                  values[i], job.ds.gradient_clipping);
            zt_job_spec_free(&job);
        }
    }
    ERR("{" MODEL ", \"training_args\": {\"max_grad_norm\": \"1\"}, \"deepspeed\": {}}",
        ZT_ERR_INVALID, "job.json: key 'training_args.max_grad_norm' must be a number");
}

int main(void) {
    test_key_table();
    test_training_args_checks();
    test_resolution();
    test_auto_train_batch();
    test_warmup_steps();
    test_max_grad_norm_off();
    test_warnings_once();
    return check_summary("test_ds_script");
}
