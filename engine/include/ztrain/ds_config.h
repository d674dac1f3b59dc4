/* The DeepSpeed JSON config, read as DeepSpeed 0.19 reads it.
 *
 * A user's ds_config.json works unchanged: the same keys, defaults, inference rules and error texts
 * (see shared/reference/deepspeed.md). Unknown keys inside a section are an error naming the key;
 * unknown top-level keys are reported as warnings on stderr (DeepSpeed ignores them silently);
 * the string "auto" means the default. Valid options this build does not run (gradient_allreduce_op
 * "sum", 16-bit data_types, a few DeepSpeed extensions) are parsed and validated, then refused with
 * ZT_ERR_UNSUPPORTED, never silently ignored. */
#ifndef ZTRAIN_DS_CONFIG_H
#define ZTRAIN_DS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

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
    double eps;            /* default 1e-8 */
    double weight_decay;   /* default 0 (FusedAdam); 0.01 for AdamW with torch_adam: true */
    bool adam_w_mode;      /* effective mode: type is adamw OR params.adam_w_mode (default true) */
    bool bias_correction;  /* default true */
    bool torch_adam;       /* accepted; both paths run the same math here */
    double momentum;       /* SGD, default 0 */
    double dampening;      /* SGD, default 0 */
    bool nesterov;         /* SGD, default false */
    double max_coeff;      /* LAMB: upper clamp of the trust ratio, default 10.0 */
    double min_coeff;      /* LAMB: lower clamp of the trust ratio, default 0.01 */
    bool eps_inside_sqrt;  /* LAMB: sqrt(v + eps) rather than sqrt(v) + eps, default false */
    /* "OneBitAdam", "ZeroOneAdam" or "OneBitLamb": run as Adam (AdamW mode) or LAMB without
     * their compressed communication (the parser warns once); type says which. */
    bool compression_dropped;
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
    int warmup_num_steps;        /* default 1000 */
    bool warmup_linear;          /* warmup_type "linear"; "log" (the default) otherwise */
    int total_num_steps;         /* WarmupDecayLR, WarmupCosineLR: required */
    double warmup_min_ratio;     /* WarmupCosineLR, default 0 */
    double cos_min_ratio;        /* WarmupCosineLR, default 1e-4 */
    /* OneCycle */
    double cycle_min_lr, cycle_max_lr; /* required */
    double decay_lr_rate;              /* default 0 */
    int cycle_first_step_size;         /* default 2000 */
    int cycle_second_step_size;        /* default: first */
    int cycle_first_stair_count;       /* default 0 */
    int cycle_second_stair_count;      /* default: first */
    int decay_step_size;               /* default 0 */
    bool cycle_momentum;               /* default true */
    double cycle_min_mom, cycle_max_mom; /* default 0.8, 0.9 */
    double decay_mom_rate;             /* default 0 */
    /* LRRangeTest */
    double lr_range_test_min_lr;    /* default 1e-3 */
    int lr_range_test_step_size;    /* default 2000 */
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

    bool has_optimizer; /* false: no "optimizer" section (the engine then refuses to step) */
    bool zero_allow_untested_optimizer; /* default false: LAMB at ZeRO stage >= 1 is refused */
    zt_optimizer_config optimizer;
    zt_schedule_config scheduler;

    double gradient_clipping;  /* default 1.0 (DeepSpeed >= 0.19); 0 disables */
    int steps_per_print;       /* 0 (DeepSpeed's None): never */
    bool wall_clock_breakdown;
    bool dataloader_drop_last;
    bool prescale_gradients;
    double gradient_predivide_factor;
    char communication_data_type[8]; /* "" (derived from precision), "fp32", "fp16", "bf16" */

    zt_fp16_config fp16;
    zt_bf16_config bf16;
    zt_zero_config zero;
    zt_monitor_config monitor;
} zt_ds_config;

/* Parses DeepSpeed config JSON text. `source` names it in messages (a file path, or "job.json:
 * deepspeed"). `world_size` is the data-parallel size used by the batch inference. On failure *cfg
 * is unspecified and zt_last_error() says what is wrong, e.g. "ds.json: line 3, column 7: ..." or
 * DeepSpeed's own assertion text for an inconsistent batch triple. */
zt_status zt_ds_config_parse(zt_ds_config *cfg, const char *json_text, const char *source,
                             int world_size);

/* Reads and parses a DeepSpeed config file. */
zt_status zt_ds_config_load(zt_ds_config *cfg, const char *path, int world_size);

/* Fills *cfg with DeepSpeed's defaults for every key (the batch triple left at 0). */
void zt_ds_config_defaults(zt_ds_config *cfg);

#endif
