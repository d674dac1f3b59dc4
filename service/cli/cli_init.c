/* `ztrain init --hf DIR` (cli_init.h). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_init.h"
#include "cli_remote.h"
#include "ztrain/job_spec.h"
#include "ztrain/json_util.h"

/* The job evaluates data.val every EVAL_INTERVAL steps; the prepare command printed after it
 * holds out VAL_FRACTION of the documents to make that split. */
enum { EVAL_INTERVAL = 100 };
#define VAL_FRACTION "0.05"

/* A DeepSpeed config as the Hugging Face Trainer's examples write it: every value the job's
 * training_args can supply is "auto". */
static const char default_ds[] =
    "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\", "
    "\"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\", "
    "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\", "
    "\"eps\": \"auto\", \"weight_decay\": \"auto\"}}, "
    "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\", "
    "\"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}}, "
    "\"zero_optimization\": {\"stage\": 2}}";

static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "ztrain: init: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    zt_cli_print_short_usage(stderr, "init");
    return 2;
}

/* `path` as the job file at `job_dir` should name it: relative to job_dir, climbing out of it
 * with "../" where path lies elsewhere, so the job and its model move together. Heap-owned;
 * NULL when path does not exist (job_dir must). */
static char *path_from(const char *job_dir, const char *path) {
    char *abs = realpath(path, NULL), *base = realpath(job_dir, NULL);
    char *out = NULL;
    if (abs && base) {
        /* The longest common leading run of whole components. */
        size_t common = 0;
        for (size_t i = 0;; i++) {
            bool end_a = abs[i] == '\0' || abs[i] == '/';
            bool end_b = base[i] == '\0' || base[i] == '/';
            if (end_a && end_b)
                common = i;
            if (abs[i] != base[i] || abs[i] == '\0')
                break;
        }
        size_t ups = 0;
        for (const char *p = base + common; *p; p++)
            ups += p[0] == '/' && p[1] != '\0';
        const char *rest = abs + common + (abs[common] == '/');
        if (ups == 0 && !*rest) {
            out = strdup(".");
        } else {
            size_t n = 3 * ups + strlen(rest) + 1;
            out = malloc(n);
            if (out) {
                out[0] = '\0';
                for (size_t i = 0; i < ups; i++)
                    strcat(out, "../");
                strcat(out, rest);
                if (!*rest)
                    out[strlen(out) - 1] = '\0';
            }
        }
    }
    free(abs);
    free(base);
    return out;
}

/* The sequence length to train at: the model's own, at most 1024 (a job may raise it). */
static int model_block_size(const char *hf_dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    cJSON *cfg = NULL;
    if (zt_json_load_file(path, &cfg) != ZT_OK)
        return -1;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(cfg, "n_positions");
    if (!cJSON_IsNumber(n))
        n = cJSON_GetObjectItemCaseSensitive(cfg, "max_position_embeddings");
    int block = cJSON_IsNumber(n) && n->valuedouble >= 1 ? (int)n->valuedouble : 1024;
    cJSON_Delete(cfg);
    return block > 1024 ? 1024 : block;
}

int zt_cli_init(int argc, char **argv) {
    const char *hf = NULL, *ds = NULL, *out = "job.json", *name = NULL;
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int kind = zt_cli_word_kind(a, &operands);
        if (kind < 0)
            continue;
        if (kind > 0)
            return usage("unexpected argument '%s'", a);
        if (!v)
            return usage(a[0] == '-' ? "%s needs a value" : "unexpected argument '%s'", a);
        if (strcmp(a, "--hf") == 0)
            hf = v;
        else if (strcmp(a, "--deepspeed") == 0)
            ds = v;
        else if (strcmp(a, "--out") == 0)
            out = v;
        else if (strcmp(a, "--name") == 0)
            name = v;
        else
            return zt_cli_unknown_option("init", a);
        i++;
    }
    if (!hf)
        return usage("%s--hf DIR is required: the Hugging Face model directory", "");

    char *job_dir = strdup(out);
    char *slash = job_dir ? strrchr(job_dir, '/') : NULL;
    if (!job_dir)
        return zt_cli_fail("out of memory");
    if (!slash)
        strcpy(job_dir, ".");
    else
        slash[slash == job_dir] = '\0'; /* "/job.json" is in "/" */
    struct stat st;
    if (stat(job_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        int rc = usage("--out %s: no such directory to write it in", out);
        free(job_dir);
        return rc;
    }
    char *init_from = path_from(job_dir, hf);
    char *ds_path = ds ? path_from(job_dir, ds) : NULL;
    char tok_file[PATH_MAX];
    snprintf(tok_file, sizeof tok_file, "%s/tokenizer.json", hf);
    char *tokenizer = access(tok_file, R_OK) == 0 ? path_from(job_dir, tok_file) : NULL;
    int block = init_from ? model_block_size(hf) : -1;
    int rc = 0;
    if (!init_from)
        rc = usage("--hf %s: no such directory", hf);
    else if (ds && !ds_path)
        rc = usage("--deepspeed %s: no such file", ds);
    else if (block < 0)
        rc = zt_cli_fail(NULL);
    if (rc) {
        free(job_dir);
        free(init_from);
        free(ds_path);
        free(tokenizer);
        return rc;
    }

    cJSON *job = cJSON_CreateObject(), *model = cJSON_CreateObject(), *data = cJSON_CreateObject();
    cJSON *train = cJSON_CreateObject(), *args = cJSON_CreateObject();
    char default_name[256];
    const char *base = strrchr(init_from, '/');
    snprintf(default_name, sizeof default_name, "finetune-%s", base ? base + 1 : init_from);
    cJSON_AddStringToObject(job, "name", name ? name : default_name);
    cJSON_AddNumberToObject(job, "world_size", 1);
    cJSON_AddStringToObject(job, "device", "cpu");
    cJSON_AddStringToObject(model, "init_from", init_from);
    cJSON_AddNumberToObject(model, "block_size", block);
    cJSON_AddItemToObject(job, "model", model);
    cJSON_AddStringToObject(data, "train", "data/data_train_*.bin");
    cJSON_AddStringToObject(data, "val", "data/data_val_*.bin");
    if (tokenizer)
        cJSON_AddStringToObject(data, "tokenizer", tokenizer);
    cJSON_AddItemToObject(job, "data", data);
    cJSON_AddNumberToObject(train, "max_steps", 1000);
    cJSON_AddNumberToObject(train, "log_interval", 10);
    cJSON_AddNumberToObject(train, "eval_interval", EVAL_INTERVAL);
    cJSON_AddNumberToObject(train, "eval_steps", 10);
    cJSON_AddStringToObject(train, "checkpoint_dir", "ckpt");
    cJSON_AddNumberToObject(train, "checkpoint_interval", 200);
    cJSON_AddBoolToObject(train, "resume", 1);
    cJSON_AddItemToObject(job, "train", train);
    /* With the user's config its own values stand: training_args set here would have to agree
     * with every one of them (as the HF Trainer demands), and its "auto" keys take the
     * TrainingArguments defaults. The default config is all "auto", filled from these. */
    if (!ds_path) {
        cJSON_AddNumberToObject(args, "learning_rate", 5e-5);
        cJSON_AddNumberToObject(args, "per_device_train_batch_size", 8);
        cJSON_AddNumberToObject(args, "warmup_ratio", 0.03);
        cJSON_AddItemToObject(job, "training_args", args);
    } else {
        cJSON_Delete(args);
    }
    if (ds_path)
        cJSON_AddStringToObject(job, "deepspeed", ds_path);
    else
        cJSON_AddItemToObject(job, "deepspeed", cJSON_Parse(default_ds));
    char *text = cJSON_Print(job);
    cJSON_Delete(job);

    /* Read back as `ztrain run` reads it (the data it names is made later, by prepare). */
    char *abs_dir = realpath(job_dir, NULL);
    zt_job_spec spec;
    zt_status s = text ? zt_job_spec_parse(&spec, text, out, abs_dir ? abs_dir : job_dir)
                       : zt_error(ZT_ERR_NOMEM, "out of memory");
    if (s == ZT_OK)
        zt_job_spec_free(&spec);
    free(abs_dir);
    if (s != ZT_OK) {
        rc = zt_cli_fail(NULL);
    } else {
        /* O_EXCL: a job file already there is the user's, never overwritten. */
        int fd = open(out, O_WRONLY | O_CREAT | O_EXCL, 0644);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f) {
            bool exists = fd < 0 && access(out, F_OK) == 0;
            fprintf(stderr, "ztrain: init: cannot create %s: %m%s\n", out,
                    exists ? " (it is kept: remove it or give --out)" : "");
            if (fd >= 0)
                close(fd);
            rc = 1;
        } else {
            fprintf(f, "%s\n", text);
            if (fclose(f) != 0) {
                fprintf(stderr, "ztrain: init: writing %s: %m\n", out);
                rc = 1;
            }
        }
    }
    if (rc == 0) {
        printf("wrote %s: fine-tunes %s%s%s\n", out, init_from, ds_path ? " with " : "",
               ds_path ? ds_path : "");
        /* The commands must make what the job reads: data.val too, which eval_interval
         * evaluates (VAL_FRACTION of the documents; each file, or each JSONL line, is one). */
        if (tokenizer)
            printf("next: make its data with the model's tokenizer, then train:\n"
                   "  ztrain prepare --tokenizer %s --out %s/data --name data --val-fraction "
                   "%s TEXT_FILES...\n"
                   "  ztrain run %s\n",
                   tok_file, job_dir, VAL_FRACTION, out);
        else
            printf("%s has no tokenizer.json: make the data with the tokenizer.json the model "
                   "was trained with (data.tokenizer in %s may name it), then train:\n"
                   "  ztrain prepare --tokenizer TOKENIZER.json --out %s/data --name data "
                   "--val-fraction %s TEXT_FILES...\n  ztrain run %s\n",
                   hf, out, job_dir, VAL_FRACTION, out);
        printf("(%s of the documents go to data.val, which the job evaluates every %d steps; "
               "each file, or each JSONL line, is a document. For chat or prompt-completion "
               "JSONL, add --format chat or --format prompt-completion to prepare and set "
               "data.format to \"masked\" in %s.)\n",
               VAL_FRACTION, EVAL_INTERVAL, out);
    }
    free(text);
    free(job_dir);
    free(init_from);
    free(ds_path);
    free(tokenizer);
    return rc;
}
