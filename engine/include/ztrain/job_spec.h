/* The job spec: what to train, on what data, for how long, with which DeepSpeed config.
 *
 * The same fields as JobSpec in proto/ztrain.proto, read from a JSON file by the CLI (see
 * DESIGN.md §3). Relative paths resolve against the job file's directory. Unknown keys in any
 * section are an error naming the key. */
#ifndef ZTRAIN_JOB_SPEC_H
#define ZTRAIN_JOB_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "ztrain/backend.h"
#include "ztrain/ds_config.h"
#include "ztrain/status.h"

/* The model section: the fields of every family in one plain struct. Which of them a family
 * reads, with what defaults and bounds, is its field table's business (zt_model_family in
 * ztrain/model.h); the comments here only say what each member is. */
typedef struct {
    char type[16];     /* the family: "gpt2" */
    int n_layer;
    int n_head;
    int n_embd;        /* must be divisible by n_head */
    int vocab_size;
    int block_size;    /* maximum sequence length, also the training sequence length */
    char *init_from;   /* safetensors path with the family's Hugging Face names, or NULL */
} zt_model_spec;

/* One source of a training mixture. */
typedef struct {
    char *path;        /* a token file or a glob of them */
    double weight;     /* > 0; the mixture draws source i with probability weight_i / sum */
} zt_data_source;

typedef struct zt_data_spec_s {
    char *train;       /* llm.c token file (.bin), a glob of them, or any other file read as bytes
                          (vocab 256); NULL when train_mix is set: open the training data with
                          zt_dataset_open_train (ztrain/data.h), which takes either */
    zt_data_source *train_mix; /* data.train given as [{"path", "weight"}, ...]; else NULL */
    int n_train_mix;
    char *val;         /* optional, a file or glob as train; NULL when absent */
    bool shuffle;      /* DistributedSampler shuffle, default true */
    char *tokenizer;   /* optional tokenizer.json: `ztrain sample --prompt` encodes with it */
    int sample_tokens; /* > 0: at each evaluation rank 0 logs a sample of this many tokens
                          (needs tokenizer); default 0 */
    char *sample_prompt; /* the sample's prompt; NULL: start from BOS / end-of-text */
} zt_data_spec;

typedef struct {
    int64_t max_steps;        /* optimizer steps; 0: run `epochs` epochs */
    int epochs;               /* default 1; used when max_steps is 0 */
    int log_interval;         /* optimizer steps between metric records, default 10 */
    int eval_interval;        /* 0: no evaluation */
    int eval_steps;           /* validation micro-batches per evaluation, default 20 */
    char *checkpoint_dir;     /* NULL: no checkpoints */
    int checkpoint_interval;  /* optimizer steps between checkpoints; 0: only at the end */
    bool resume;              /* continue from checkpoint_dir (zt_ckpt_find_resume says from what) */
    int bench_steps;          /* > 0: stop after this many steps (benchmark runs) */
    int warmup_steps;         /* steps left out of the timing metrics, default 5 */
    uint64_t seed;            /* default 1234 */
} zt_train_spec;

/* The longest job name, in bytes. A name is printable UTF-8 (no control, bidirectional or line
 * separator characters); a spec with any other is refused, naming the byte at fault. */
#define ZT_JOB_NAME_MAX 128

typedef struct {
    char *name;               /* see ZT_JOB_NAME_MAX */
    int world_size;           /* default 1 */
    int nodes;                /* hosts the ranks are spread over, 1..world_size, default 1 */
    zt_device device;
    zt_model_spec model;
    zt_data_spec data;
    zt_train_spec train;
    zt_ds_config ds;          /* parsed with world_size as the data-parallel size */
    char *ds_json;            /* the DeepSpeed config as JSON text, kept for checkpoints */
    char *base_dir;           /* directory that relative paths were resolved against */
} zt_job_spec;

/* Reads a job file. Strings in *job are heap-owned; release them with zt_job_spec_free(). On
 * failure nothing needs freeing and zt_last_error() names the file and the key or value at fault
 * ("job.json: model.n_embd (250) must be divisible by model.n_head (4)"). */
zt_status zt_job_spec_load(zt_job_spec *job, const char *path);

/* Parses job JSON text; `source` names it in messages and `base_dir` anchors relative paths. */
zt_status zt_job_spec_parse(zt_job_spec *job, const char *json_text, const char *source,
                            const char *base_dir);

void zt_job_spec_free(zt_job_spec *job);

/* Checks a model spec against its family (engine/model_registry.c): a known type, every field
 * within its bound, then the family's own cross-field checks (GPT-2: n_embd % n_head == 0).
 * Messages start with `source`. */
zt_status zt_model_spec_validate(const zt_model_spec *m, const char *source);

#endif
