/* The job spec: what to train, on what data, for how long, with which DeepSpeed config.
 *
 * The same fields as JobSpec in proto/ztrain.proto, read from a JSON file by the CLI (see
 * DESIGN.md §3). Relative paths resolve against the job file's directory. Unknown keys in any
 * section are an error naming the key. */
#ifndef ZTRAIN_JOB_SPEC_H
#define ZTRAIN_JOB_SPEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ztrain/anomaly.h"
#include "ztrain/backend.h"
#include "ztrain/comm.h"
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
    /* A safetensors file with the family's Hugging Face names, or a Hugging Face model
     * directory whose config.json fills the spec (ztrain/hf_config.h); NULL: initialise. */
    char *init_from;
    /* The Llama family (llama, mistral, qwen2), named as Hugging Face's config.json keys are
     * documented in engine/models/llama_family.c's field table. */
    int n_kv_head;                  /* key/value heads (grouped-query attention); 0: n_head */
    int head_dim;                   /* 0: n_embd / n_head */
    int intermediate_size;          /* SwiGLU width */
    double rms_norm_eps;
    double rope_theta;
    char rope_scaling[16];          /* "" (none), "linear" or "llama3" */
    double rope_factor;
    double rope_low_freq_factor;    /* llama3 scaling only */
    double rope_high_freq_factor;   /* llama3 scaling only */
    int rope_original_max_position; /* llama3 scaling only */
    int max_position_embeddings;    /* 0: block_size */
    bool tie_word_embeddings;       /* the LM head reads the token embedding */
    bool qkv_bias;                  /* biases on the q, k and v projections */
    bool o_bias;                    /* a bias on the attention's output projection */
    int sliding_window;             /* a query sees at most this many positions; 0: all */
    /* Activation checkpointing: not architecture fields (no family's table holds them, so
     * checkpoints, exports and comparisons leave them out) but how a model built from the spec
     * keeps its activations. With checkpoint_interval k > 0 a model keeps only the input of
     * every k-th of its blocks (the first of each group of k) and recomputes the others' in the
     * backward, with results bit-identical to k = 0 (everything kept). checkpoint_cpu keeps
     * those inputs in pinned host memory. The job spec sets both from train.activation_checkpointing
     * and the DeepSpeed config (README, "Activation checkpointing"). */
    int checkpoint_interval;
    bool checkpoint_cpu;
} zt_model_spec;

/* One source of a training mixture. */
typedef struct {
    char *path;        /* a token file or a glob of them */
    double weight;     /* > 0; the mixture draws source i with probability weight_i / sum */
} zt_data_source;

/* data.format: what the token files carry. */
typedef enum {
    ZT_DATA_FORMAT_TOKENS = 0, /* "tokens": every target is trained (pre-training) */
    ZT_DATA_FORMAT_MASKED,     /* "masked": each token file X has a loss mask X.mask
                                  (ztrain/loss_mask.h); the loss is the mean over the trained
                                  targets of the global batch (docs/fine-tuning.md) */
} zt_data_format;

/* data.packing, with data.format "masked": how examples become samples. */
typedef enum {
    ZT_DATA_PACKED = 0, /* "packed": windows of the token stream, documents restarting inside */
    ZT_DATA_PADDED,     /* "padded": one document per sample, cut at block_size, padded */
} zt_data_packing;

typedef struct zt_data_spec_s {
    char *train;       /* llm.c token file (.bin), a glob of them, or any other file read as bytes
                          (vocab 256); NULL when train_mix is set: open the training data with
                          zt_dataset_open_train (ztrain/data.h), which takes either */
    zt_data_source *train_mix; /* data.train given as [{"path", "weight"}, ...]; else NULL */
    int n_train_mix;
    char *val;         /* optional, a file or glob as train; NULL when absent */
    /* The files a glob of data.train / data.val matched when the job was checked (ztraind writes
     * them as "train_files" / "val_files", resolved): opened instead of expanding the glob again,
     * each re-checked at open (zt_dataset_open_files). NULL when absent. */
    char **train_files, **val_files;
    int n_train_files, n_val_files;
    bool shuffle;      /* DistributedSampler shuffle, default true */
    char *tokenizer;   /* optional tokenizer.json: `ztrain sample --prompt` encodes with it */
    int sample_tokens; /* > 0: at each evaluation rank 0 logs a sample of this many tokens
                          (needs tokenizer); default 0 */
    char *sample_prompt; /* the sample's prompt; NULL: start from BOS / end-of-text */
    zt_data_format format; /* data.format, default "tokens" */
    zt_data_packing packing; /* data.packing, default "packed" */
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
    /* Activation checkpointing (README, "Activation checkpointing"): keep only every
     * activation_checkpoint_interval-th block's input (default 1: every block's) and recompute
     * the rest in the backward. Also turned on by training_args.gradient_checkpointing; the
     * model spec's checkpoint_interval is what the model reads. */
    bool activation_checkpointing;
    int activation_checkpoint_interval;
} zt_train_spec;

/* The "pipeline" section: DeepSpeed's pipeline parallelism (engine/pipe/pipe_engine.c). stages 1 (the
 * default, section absent) is no pipeline. */
typedef struct {
    int stages;               /* pipeline stages; must divide world_size */
    char partition[128];      /* "parameters" (default), "uniform" or "type:REGEX" */
    int activation_checkpoint_interval; /* 0: off; k: keep every k-th block's inputs */
} zt_pipe_spec;

/* The longest job name, in bytes. A name is printable UTF-8 (no control, bidirectional or line
 * separator characters); a spec with any other is refused, naming the byte at fault. */
#define ZT_JOB_NAME_MAX 128

typedef struct {
    char *name;               /* see ZT_JOB_NAME_MAX */
    int world_size;           /* default 1 */
    int nodes;                /* hosts the ranks are spread over, 1..world_size, default 1 */
    zt_comm_choice comm;      /* "comm": the ranks' transport, default auto (zt_comm_choose) */
    zt_device device;
    zt_model_spec model;
    zt_data_spec data;
    zt_train_spec train;
    zt_pipe_spec pipeline;    /* "pipeline": stages, partition (stages 1 without it) */
    zt_training_args args;    /* "training_args": what the script / HF Trainer supplies */
    zt_ds_config ds;          /* parsed with world_size / pipeline.stages as the data-parallel size, "auto" values
                               * and a missing optimizer supplied from args (ds.resolved says
                               * which, ds.warnings what has no effect) */
    char *ds_json;            /* the DeepSpeed config as JSON text, kept for checkpoints */
    char *ds_effective_json;  /* the effective config (zt_job_spec_write_effective) */
    char *base_dir;           /* directory that relative paths were resolved against */
    /* What ztraind does with the job beyond running it (engine/config/job_spec_recovery.c; the worker and
     * `ztrain run` read and ignore them). "max_restarts": how many times the ranks are started
     * again from the newest complete checkpoint after they fail, default 0. "fork_from":
     * {"job": ID, "step": N}, the job and checkpoint step a forked job starts from; fork_job is
     * NULL when the spec has none (heap, freed by zt_job_spec_free). */
    int max_restarts;
    char *fork_job;
    int64_t fork_step;
    zt_events_spec events;    /* "events": anomaly rules and policies (ztrain/anomaly.h) */
    /* The ztraind job whose ranks run the spec: no key of the file, the worker sets it from
     * ZTRAIN_JOB_ID, which only ztraind gives its ranks (NULL under `ztrain run` or another
     * launcher). Each checkpoint's meta.json records it as "job_id", so that the daemon lists
     * a job's own checkpoints of a checkpoint_dir that jobs share. Heap, freed by
     * zt_job_spec_free. */
    char *service_job_id;
    /* "alerts": webhooks, which are ztraind's business (service/daemon/webhooks.h); the engine only
     * checks that it is an object. */
} zt_job_spec;

/* Reads a job file. Strings in *job are heap-owned; release them with zt_job_spec_free(). On
 * failure nothing needs freeing and zt_last_error() names the file and the key or value at fault
 * ("job.json: model.n_embd (250) must be divisible by model.n_head (4)"). */
zt_status zt_job_spec_load(zt_job_spec *job, const char *path);

/* The keys the parser accepts in one section of a job file, NULL-terminated: "" (the top
 * level), "data", "data.train[]" (an entry of a mixture), "train", "training_args", "pipeline"
 * or "fork_from"; NULL for any other. They are the tables the parser checks keys against, so
 * docs/job.schema.json (tests/tools/zt_job_schema.c) cannot name a key the parser refuses. The
 * model's keys are its family's fields (ztrain/model.h); "deepspeed", "events" and "alerts" have
 * parsers of their own. */
const char *const *zt_job_spec_keys(const char *section);

/* The JSON type of a key of those sections, which the parser checks before it reads the value
 * (a null value stands for the key's absence); ZT_JOB_KEY_UNKNOWN for a key the
 * parser does not know. docs/job.schema.json states these types. */
typedef enum {
    ZT_JOB_KEY_UNKNOWN,
    ZT_JOB_KEY_OBJECT,
    ZT_JOB_KEY_INTEGER,          /* any JSON number with an integral value (5e8, 2.0) */
    ZT_JOB_KEY_NUMBER,
    ZT_JOB_KEY_BOOLEAN,
    ZT_JOB_KEY_STRING,
    ZT_JOB_KEY_STRING_OR_LIST,   /* data.train: a path, or a mixture's list of entries */
    ZT_JOB_KEY_STRING_LIST,      /* data.train_files, val_files */
    ZT_JOB_KEY_OBJECT_OR_STRING, /* deepspeed: inline, or its file's path */
} zt_job_key_type;
zt_job_key_type zt_job_spec_key_type(const char *section, const char *key);
/* What a key means where its name does not say it all (docs/job.schema.json's description), or
 * NULL. */
const char *zt_job_spec_key_meaning(const char *section, const char *key);

/* Parses job JSON text; `source` names it in messages and `base_dir` anchors relative paths. */
zt_status zt_job_spec_parse(zt_job_spec *job, const char *json_text, const char *source,
                            const char *base_dir);

void zt_job_spec_free(zt_job_spec *job);

/* The checks that read the job's files (engine/config/job_check.c): data.train (and data.val when the job
 * evaluates) open with the model's vocabulary and hold at least one sample for rank 0's first
 * batch; model.init_from can be opened; data.tokenizer loads, with no more tokens than
 * model.vocab_size. Made before any rank starts, so a bad file is one error.
 * Messages start with `source` and name the key. */
zt_status zt_job_spec_check_files(const zt_job_spec *job, const char *source);
/* The directories the ranks make theirs in, judged where they will run (`ztrain run`,
 * `validate`, and ztraind's local launcher; a Slurm job's ranks run on hosts whose local disks the
 * daemon does not see): an "nvme" offload's nvme_path is a directory. Messages as above. */
zt_status zt_job_spec_check_rank_dirs(const zt_job_spec *job, const char *source);

/* Prints what the job's DeepSpeed config left to the script (job->ds.resolved) and its warnings,
 * once per job: by the process that validates the job before its ranks start, or by rank 0 of
 * ranks that another launcher started. */
void zt_job_spec_print_notes(const zt_job_spec *job, FILE *f);

/* Writes job->ds_effective_json as DIR/ds_config.effective.json (DIR made when missing), DIR
 * being the run directory: where metrics.jsonl goes (`ztrain run --out`, ztraind's RUNS/<id>). */
zt_status zt_job_spec_write_effective(const zt_job_spec *job, const char *dir);

/* What every rank of a job must agree on, as "key=value" lines the ranks compare when they meet
 * (zt_train_check_agreement, ztrain/trainer.h): world_size, device, pipeline, every model field
 * of the family that is not a path, the data options (the number of training sources and their
 * weights, shuffle, format, packing, sample_tokens, whether there is a validation set), every
 * train option (checkpoint_dir by presence only) and the effective DeepSpeed config
 * ("deepspeed.optimizer.params.lr=0.001"). Paths are left out (data.train, data.val,
 * data.tokenizer, model.init_from, train.checkpoint_dir's value, DeepSpeed keys ending in
 * "path"): nodes may hold the same files at different places. So are name, comm (ZTRAIN_COMM may
 * differ per node) and what only ztraind reads. Heap text, the caller frees; NULL when out of
 * memory. */
char *zt_job_spec_agreement_text(const zt_job_spec *job);

/* The first key in which two agreement texts differ (a key one of them lacks counts, its value
 * then "(absent)"), with its value in each: false when they are the same. */
bool zt_job_spec_agreement_diff(const char *a, const char *b, char *key, size_t kcap, char *va,
                                size_t vacap, char *vb, size_t vbcap);

/* Checks a model spec against its family (engine/models/model_registry.c): a known type, every field
 * within its bound, then the family's own cross-field checks (GPT-2: n_embd % n_head == 0).
 * Messages start with `source`. */
zt_status zt_model_spec_validate(const zt_model_spec *m, const char *source);

#endif
