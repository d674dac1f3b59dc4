/* The DeepSpeed JSON config, read as DeepSpeed 0.19 reads it.
 *
 * A user's ds_config.json works unchanged: the same keys, defaults, inference rules and error texts
 * (see shared/reference/deepspeed.md). Every key ztrain knows is in one table (zt_ds_keys) with its
 * fate: honoured, warned as without effect when set away from DeepSpeed's default, or refused with
 * ZT_ERR_UNSUPPORTED. Unknown keys inside any section are an error naming the key; unknown
 * top-level keys are warnings (DeepSpeed ignores them silently). A job's training_args fill the
 * "auto" values a script or the Hugging Face Trainer would fill (zt_job_spec_parse); "auto" left
 * over means the default. Warnings are collected in the parsed config, one line each, for the
 * caller to print once per job. */
#ifndef ZTRAIN_DS_CONFIG_H
#define ZTRAIN_DS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ztrain/dtype.h"
#include "ztrain/status.h"

typedef enum {
    ZT_OPTIM_ADAM, /* "Adam"/"AdamW" (and lower-case): decoupled decay when adam_w_mode */
    ZT_OPTIM_SGD,  /* "SGD": torch.optim.SGD semantics (L2 weight decay, momentum, nesterov) */
    ZT_OPTIM_LAMB, /* "Lamb" (any case): DeepSpeed's FusedLamb, one trust ratio per tensor */
} zt_optimizer_type;

typedef struct {
    zt_optimizer_type type;
    char name[32];         /* the type as written in the config */
    double lr;             /* default 1e-3 */
    double beta1, beta2;   /* default 0.9, 0.999 ("betas") */
    bool betas_given;      /* "betas" was in the config (the step line prints DeepSpeed's list) */
    double eps;            /* default 1e-8 */
    double weight_decay;   /* default 0 (FusedAdam); 0.01 for AdamW with torch_adam: true */
    bool adam_w_mode;      /* effective mode: type is adamw OR params.adam_w_mode (default true) */
    bool bias_correction;  /* default true */
    /* torch_adam: DeepSpeed builds torch.optim.Adam(W) instead of FusedAdam or DeepSpeedCPUAdam;
     * the math is the same, but each class takes its own params (bias_correction and
     * set_grad_none only without torch_adam, foreach/fused/maximize only with it) and the
     * parser refuses another class's as DeepSpeed's TypeError would. fp32_optimizer_states,
     * which only DeepSpeedCPUAdam reads, is accepted on every Adam path: its moments take the
     * dtype of the fp32 masters it is given in every combination ztrain runs, so ztrain's fp32
     * moments (bf16 ones with bf16_optimizer_states) are what DeepSpeed keeps either way. */
    bool torch_adam;
    double momentum;       /* SGD, default 0 */
    double dampening;      /* SGD, default 0 */
    bool nesterov;         /* SGD, default false */
    bool maximize; /* SGD, and Adam with torch_adam: torch's maximize, the gradient negated first */
    double max_coeff;      /* LAMB: upper clamp of the trust ratio, default 10.0 */
    double min_coeff;      /* LAMB: lower clamp of the trust ratio, default 0.01 */
    bool eps_inside_sqrt;  /* LAMB: sqrt(v + eps) rather than sqrt(v) + eps, default false */
} zt_optimizer_config;

typedef enum {
    ZT_SCHED_NONE = 0, /* constant lr */
    ZT_SCHED_WARMUP_LR,
    ZT_SCHED_WARMUP_DECAY_LR,
    ZT_SCHED_WARMUP_COSINE_LR,
    ZT_SCHED_ONE_CYCLE,
    ZT_SCHED_LR_RANGE_TEST,
} zt_schedule_type;

typedef struct {
    zt_schedule_type type;
    /* WarmupLR, WarmupDecayLR, WarmupCosineLR */
    double warmup_min_lr;        /* default 0 */
    double warmup_max_lr;        /* WarmupLR: the optimizer lr when absent; WarmupDecayLR: 1e-3 */
    /* The step counts are 64-bit, as DeepSpeed's Python ints are unbounded (a Trainer's warmup
     * can exceed 2^31 steps); the parser takes them up to 2^53, where a JSON number stops
     * holding every integer. */
    int64_t warmup_num_steps;    /* default 1000; a JSON int (DeepSpeed's isinstance check) */
    bool warmup_linear;          /* warmup_type "linear"; "log" (the default) otherwise */
    double total_num_steps;      /* WarmupDecayLR, WarmupCosineLR: required; any number, as
                                  * DeepSpeed only computes with it (6.5 is valid) */
    double warmup_min_ratio;     /* WarmupCosineLR, default 0 */
    double cos_min_ratio;        /* WarmupCosineLR, default 1e-4 */
    /* OneCycle */
    double cycle_min_lr, cycle_max_lr; /* required */
    double decay_lr_rate;              /* default 0 */
    double cycle_first_step_size;      /* default 2000; > 0, fractional allowed (float()) */
    double cycle_second_step_size;     /* default: first; >= 0 (0: no descending half) */
    int64_t cycle_first_stair_count;   /* default 0 */
    int64_t cycle_second_stair_count;  /* default: first */
    int64_t decay_step_size;           /* default 0 */
    bool cycle_momentum;               /* default true */
    double cycle_min_mom, cycle_max_mom; /* default 0.8, 0.9 */
    double decay_mom_rate;             /* default 0 */
    /* LRRangeTest */
    double lr_range_test_min_lr;    /* default 1e-3 */
    int64_t lr_range_test_step_size; /* default 2000; a JSON int (DeepSpeed's isinstance check) */
    double lr_range_test_step_rate; /* default 1.0 */
    bool lr_range_test_staircase;   /* default false */
} zt_schedule_config;

typedef struct {
    bool enabled;
    double loss_scale; /* 0: dynamic */
    int initial_scale_power;
    int loss_scale_window;
    int hysteresis;
    bool consecutive_hysteresis;
    double min_loss_scale;
    bool master_weights_and_grads; /* fp16_master_weights_and_grads: refused (DeepSpeed needs
                                      ZeRO-Offload with DeepSpeedCPUAdam; ztrain's offloaded
                                      optimizer keeps fp32 masters) */
} zt_fp16_config;

typedef struct {
    bool enabled;
    bool check_grad_overflow; /* default true (DeepSpeed >= 0.19) */
    /* bf16_master_weights_and_grads with bf16_optimizer_states (ZeRO 1-3, no optimizer offload):
     * no fp32 masters — the bf16 parameters of the partition are the masters — and the optimizer
     * state in bf16, updated in fp32 and rounded to nearest even on store. The other
     * combinations DeepSpeed allows only with ZeRO-Offload and are refused (ds_config_zero.c). */
    bool master_weights_and_grads;
    bool optimizer_states;
} zt_bf16_config;

typedef enum { ZT_OFFLOAD_NONE = 0, ZT_OFFLOAD_CPU, ZT_OFFLOAD_NVME } zt_offload_device;

typedef struct {
    zt_offload_device device;
    char nvme_path[512];
    int buffer_count;
    bool pin_memory;
    bool pipeline_read, pipeline_write;
    double ratio;        /* offload_optimizer only */
    int64_t buffer_size; /* offload_param only */
    int64_t max_in_cpu;  /* offload_param only */
} zt_offload_config;

typedef struct {
    int stage;                   /* 0..3 */
    bool contiguous_gradients;   /* default true */
    bool reduce_scatter;         /* default true */
    int64_t reduce_bucket_size;  /* default 5e8 elements */
    int64_t allgather_bucket_size;
    bool allgather_partitions;
    bool overlap_comm;           /* default: true for stage 3, false otherwise */
    int64_t sub_group_size;
    int64_t stage3_prefetch_bucket_size;
    int64_t stage3_param_persistence_threshold;
    int64_t stage3_max_live_parameters;
    int64_t stage3_max_reuse_distance;
    bool gather_16bit_weights_on_model_save; /* stage 3: a consolidated model with each checkpoint
                                                (also stage3_gather_16bit_/_fp16_weights_...) */
    zt_offload_config offload_optimizer;
    zt_offload_config offload_param;
} zt_zero_config;

/* A file monitor ("tensorboard", "csv_monitor"): rank 0 writes under `dir`, which is
 * os.path.join(output_path, job_name) as DeepSpeed forms it (defaults "" and "DeepSpeedJobName");
 * the job spec anchors a relative dir at the job file's directory. */
typedef struct {
    bool enabled;
    char dir[1024];
} zt_monitor_output;

typedef struct {
    zt_monitor_output tensorboard; /* TensorBoard event files */
    zt_monitor_output csv;         /* one CSV file per tag */
    bool wandb, comet;             /* enabled: warned (no network), nothing written */
} zt_monitor_config;

typedef struct {
    /* The batch triple after DeepSpeed's inference; world_size is the data-parallel size. */
    int train_batch_size;
    int train_micro_batch_size_per_gpu;
    int gradient_accumulation_steps;
    int world_size;
    /* tensor_parallel.autotp_size (or its tp.tp_size), 1 without tensor parallelism. The
     * world_size given to the parser counts the ranks outside the pipeline (dp × tp); the field
     * above is then the data-parallel size, world_size / tp_size, as DeepSpeed's batch arithmetic
     * takes mpu.get_data_parallel_world_size(). */
    int tp_size;

    bool has_optimizer; /* false: no "optimizer" section (the engine then refuses to step) */
    bool zero_allow_untested_optimizer; /* default false: LAMB at ZeRO stage >= 1 is refused */
    zt_optimizer_config optimizer;
    zt_schedule_config scheduler;

    double gradient_clipping;  /* default 1.0 (DeepSpeed >= 0.19); <= 0 disables */
    int steps_per_print;       /* 0 (DeepSpeed's None): never; a negative -n given is stored as n */
    bool wall_clock_breakdown;
    bool dataloader_drop_last;
    bool prescale_gradients;
    double gradient_predivide_factor;
    char communication_data_type[8]; /* "" (derived from precision), "fp32", "fp16", "bf16" */
    char grad_accum_dtype[8];        /* data_types.grad_accum_dtype: "" (the training type),
                                        "fp32", "fp16", "bf16" */

    zt_fp16_config fp16;
    zt_bf16_config bf16;
    zt_zero_config zero;
    zt_monitor_config monitor;
    /* activation_checkpointing.cpu_checkpointing (default false): a job that checkpoints
     * activations keeps the checkpointed block inputs in pinned host memory. */
    bool cpu_checkpointing;

    /* The parse's warnings, each "ztrain: warning: SOURCE: ...\n", in order, without repeats;
     * "" when there were none. Full beyond the buffer: the last line says how many were lost. */
    char warnings[8192];
    int warnings_lost;
    /* Each value the job's script supplied (zt_ds_config_from_script): every "auto" resolved and
     * every missing key filled, one line each ("ztrain: SOURCE: \"auto\" KEY = VALUE (FROM)\n"). */
    char resolved[4096];
} zt_ds_config;

/* What a DeepSpeed user's training script, or the Hugging Face Trainer, supplies besides the
 * config: the job spec's "training_args" section, with TrainingArguments' names and defaults. */
typedef struct {
    double learning_rate;            /* 5e-5 */
    double weight_decay;             /* 0 */
    double adam_beta1, adam_beta2;   /* 0.9, 0.999 */
    double adam_epsilon;             /* 1e-8 */
    double max_grad_norm;            /* 1.0; <= 0: no clipping, as in the Trainer */
    int per_device_train_batch_size; /* 8 */
    int gradient_accumulation_steps; /* 1 */
    /* 0. A number >= 1: that many steps (transformers 5 truncates a fraction, int(2.5) = 2); a
     * float in (0, 1): transformers 5's ratio of the training steps, ceil(max_steps * it);
     * 0: warmup_ratio decides (transformers 4's rule; 5 has no warmup_ratio). */
    double warmup_steps;
    double warmup_ratio;             /* 0; transformers 4 */
    char lr_scheduler_type[24];      /* "" (the config's scheduler, or none), "constant",
                                      * "constant_with_warmup", "linear" */
    bool bf16, fp16;                 /* false */
    bool gradient_checkpointing;     /* false; true turns on activation checkpointing */
    unsigned given;                  /* ZT_ARG_* bits: the arguments the job set itself */
} zt_training_args;

/* The arguments whose value, when the job sets it, must match a DeepSpeed value that is not
 * "auto" (HF's fill_match): a mismatch is an error with HF's text. */
#define ZT_ARG_LEARNING_RATE 1u
#define ZT_ARG_WEIGHT_DECAY 2u
#define ZT_ARG_ADAM_BETAS 4u
#define ZT_ARG_ADAM_EPSILON 8u
#define ZT_ARG_MAX_GRAD_NORM 16u
#define ZT_ARG_PER_DEVICE_TRAIN_BATCH_SIZE 32u
#define ZT_ARG_GRADIENT_ACCUMULATION_STEPS 64u
#define ZT_ARG_WARMUP 128u
#define ZT_ARG_BF16 256u
#define ZT_ARG_FP16 512u

void zt_training_args_defaults(zt_training_args *a);

/* What else the resolution needs from the job. */
typedef struct {
    int world_size;    /* ranks per pipeline stage; "auto" uses them over the TP size */
    int hidden_size;   /* the model's width: HF's "auto" ZeRO bucket sizes derive from it */
    int64_t max_steps; /* the Trainer's num_training_steps; 0 when the job runs by epochs */
} zt_ds_auto_context;

/* Parses DeepSpeed config JSON text. `source` names it in messages (a file path, or "job.json:
 * deepspeed"). `world_size` is the data-parallel size used by the batch inference. On failure *cfg
 * is unspecified and zt_last_error() says what is wrong, e.g. "ds.json: line 3, column 7: ..." or
 * DeepSpeed's own assertion text for an inconsistent batch triple. */
zt_status zt_ds_config_parse(zt_ds_config *cfg, const char *json_text, const char *source,
                             int world_size);

/* The TP size of an inline DeepSpeed config that has been parsed before (tensor_parallel's
 * autotp_size, else its TPConfig tp_size; 1 without), for readers of a stored job spec. */
struct cJSON;
int zt_ds_tp_size_of(const struct cJSON *ds);

/* The training precision: bf16, fp16 or fp32. */
zt_dtype zt_ds_train_dtype(const zt_ds_config *cfg);

/* The type gradients are communicated in: communication_data_type, or by default the training
 * precision (DeepSpeed communicates 16-bit gradients in 16 bits). */
zt_dtype zt_ds_comm_dtype(const zt_ds_config *cfg);

/* The type gradients add up in over a step's micro-steps: data_types.grad_accum_dtype, or by
 * default the training type (DeepSpeed's get_data_types). A parsed config holds fp32 with any
 * training type at ZeRO stages 1-3, or else the training type itself. */
zt_dtype zt_ds_grad_accum_dtype(const zt_ds_config *cfg);

/* Reads and parses a DeepSpeed config file. */
zt_status zt_ds_config_load(zt_ds_config *cfg, const char *path, int world_size);

/* Fills *cfg with DeepSpeed's defaults for every key (the batch triple left at 0). */
void zt_ds_config_defaults(zt_ds_config *cfg);

/* Prints cfg->warnings to f. Callers print them once per job: the process that validates a job
 * before its ranks start (`ztrain run`, ztraind), or rank 0 of ranks started by another launcher. */
void zt_ds_config_print_warnings(const zt_ds_config *cfg, FILE *f);

/* A double as Python's repr(float) writes it, as DeepSpeed's messages and log lines print
 * numbers: the shortest text that reads back to it, fixed with a ".0" when integral ("0.0006",
 * "1.0", "2.5") for exponents -4 to 15, else "1e-05", "1.5e+16"; "nan", "inf", "-inf". */
void zt_ds_py_float(double v, char *buf, size_t n);

/* ---- The key table ---------------------------------------------------------------------------
 * One row per key path ("zero_optimization.offload_param.buffer_size"). A key that is not in the
 * table is refused inside a section (ZT_ERR_INVALID naming the key and the section) and warned at
 * the top level. What happens to a present key is its fate, applied when its value differs from
 * DeepSpeed's default (`dflt`; null and "auto" never differ): */
typedef enum {
    ZT_DS_KEY_HONOURED = 0, /* acted on as DeepSpeed does; with `stages`, only at those ZeRO stages
                             * and warned as without effect at the others */
    ZT_DS_KEY_WARNED = 1,   /* accepted with one warning line: "<path> has no effect: <note>" */
    ZT_DS_KEY_REFUSED = 2,  /* ZT_ERR_UNSUPPORTED naming the key (the note says which values) */
} zt_ds_key_fate;

#define ZT_DS_KEY_FATE_MASK 3u
#define ZT_DS_KEY_SECTION 4u   /* an object whose keys are rows of their own */
#define ZT_DS_KEY_OPAQUE 8u    /* a section whose contents are not listed: a warned one warns when
                                * it holds a key that is not a row */
#define ZT_DS_KEY_BY_HAND 16u  /* the fate is applied by the section's parser, with its own text */
#define ZT_DS_KEY_PRESENCE 32u /* any value counts as set (no default to compare with) */
#define ZT_DS_KEY_REMOVED 64u  /* a feature DeepSpeed 0.19 removed: it refuses the key whatever its
                                * value (null too), before reading anything else */

typedef struct {
    const char *path;  /* dotted key path */
    unsigned flags;    /* the fate (ZT_DS_KEY_FATE_MASK) and ZT_DS_KEY_* flags */
    unsigned stages;   /* honoured keys: bit s set for each ZeRO stage s that acts on it; 0: all */
    const char *dflt;  /* DeepSpeed's default as JSON text, or NULL (any value counts as set) */
    const char *note;  /* one line: what is honoured, or why there is no effect or no support */
} zt_ds_key;

/* The table, in section order; static storage. */
const zt_ds_key *zt_ds_keys(size_t *n);
zt_ds_key_fate zt_ds_key_fate_of(const zt_ds_key *k);

#endif
