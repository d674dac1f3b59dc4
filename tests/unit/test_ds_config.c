/* DeepSpeed config parsing: batch inference with DeepSpeed's assertion texts, defaults, optimizer
 * and scheduler params, malformed JSON positions, duplicate and unknown keys, and the gates.
 * Expected values come from deepspeed.md §1 (DeepSpeed 0.19's config.py, engine.py,
 * lr_schedules.py), not from this parser's earlier output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "ztrain/ds_config.h"
#include "ztrain/lr_schedule.h"

#define CHECK_NEAR(a, b) CHECK(fabs((double)(a) - (double)(b)) <= 1e-12 * (1 + fabs((double)(b))))

/* Parses json expecting success; prints the message when it fails. */
static bool ok_at(int line, const char *json, int world, zt_ds_config *cfg) {
    zt_status s = zt_ds_config_parse(cfg, json, "ds.json", world);
    return check_at(__FILE__, line, s == ZT_OK, "expected success, got %s: %s\n  config: %s",
                    zt_status_name(s), zt_last_error(), json);
}
#define OK(json, world, cfg) ok_at(__LINE__, json, world, cfg)

/* Parses json expecting status `want` and a message equal to `msg` (or starting with it when
 * `prefix_only`). */
static void err_at(int line, const char *json, int world, zt_status want, const char *msg,
                   bool prefix_only) {
    zt_ds_config cfg;
    zt_status s = zt_ds_config_parse(&cfg, json, "ds.json", world);
    check_error_is(__FILE__, line, "config", json, s, want, msg, prefix_only);
}
#define ERR(json, world, want, msg) err_at(__LINE__, json, world, want, msg, false)
#define ERR_PREFIX(json, world, want, msg) err_at(__LINE__, json, world, want, msg, true)

static void check_triple(int line, const char *json, int world, int t, int m, int g) {
    zt_ds_config cfg;
    if (!ok_at(line, json, world, &cfg))
        return;
    check_at(__FILE__, line,
             cfg.train_batch_size == t && cfg.train_micro_batch_size_per_gpu == m &&
                 cfg.gradient_accumulation_steps == g && cfg.world_size == world,
             "%s W=%d: want (%d,%d,%d), got (%d,%d,%d) W=%d", json, world, t, m, g,
             cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
             cfg.gradient_accumulation_steps, cfg.world_size);
}
#define TRIPLE(json, world, t, m, g) check_triple(__LINE__, json, world, t, m, g)

#define MISMATCH "ds.json: Check batch related parameters. train_batch_size is not equal to " \
                 "micro_batch_per_gpu * gradient_acc_step * world_size "

static void test_batch(void) {
    /* DeepSpeed's TestBatchConfig cases (num_ranks, batch, micro, gas). */
    TRIPLE("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 16, "
           "\"gradient_accumulation_steps\": 1}", 2, 32, 16, 1);
    TRIPLE("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 8, "
           "\"gradient_accumulation_steps\": 2}", 2, 32, 8, 2);
    ERR("{\"train_batch_size\": 33, \"train_micro_batch_size_per_gpu\": 17, "
        "\"gradient_accumulation_steps\": 2}", 2, ZT_ERR_INVALID, MISMATCH "33 != 17 * 2 * 2");
    ERR("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 18, "
        "\"gradient_accumulation_steps\": 1}", 2, ZT_ERR_INVALID, MISMATCH "32 != 18 * 1 * 2");
    /* Rule 1, the issue-report example. */
    ERR("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4, "
        "\"gradient_accumulation_steps\": 8}", 1, ZT_ERR_INVALID, MISMATCH "64 != 4 * 8 * 1");
    /* Rule 2: train + micro, gas = train // micro // W. */
    TRIPLE("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4}", 2, 32, 4, 4);
    ERR("{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 4}", 1, ZT_ERR_INVALID,
        MISMATCH "30 != 4 * 7 * 1");
    ERR("{\"train_batch_size\": 33, \"train_micro_batch_size_per_gpu\": 17}", 2, ZT_ERR_INVALID,
        "ds.json: Gradient accumulation steps: 0 has to be greater than 0");
    /* Rule 3: train + gas, micro = train // W // gas. */
    TRIPLE("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 4}", 2, 32, 4, 4);
    ERR("{\"train_batch_size\": 30, \"gradient_accumulation_steps\": 4}", 2, ZT_ERR_INVALID,
        MISMATCH "30 != 3 * 4 * 2");
    /* Rule 4: micro + gas. */
    TRIPLE("{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2}", 3, 24, 4, 2);
    /* Rule 5: only train. */
    TRIPLE("{\"train_batch_size\": 32}", 4, 32, 8, 1);
    ERR("{\"train_batch_size\": 33}", 2, ZT_ERR_INVALID, MISMATCH "33 != 16 * 1 * 2");
    /* Rule 6: only micro. */
    TRIPLE("{\"train_micro_batch_size_per_gpu\": 4}", 3, 12, 4, 1);
    /* Rule 7: nothing, or only gas. */
    ERR("{}", 1, ZT_ERR_INVALID,
        "ds.json: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
    ERR("{\"gradient_accumulation_steps\": 4}", 1, ZT_ERR_INVALID,
        "ds.json: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
    /* The three > 0 assertions, in DeepSpeed's order. */
    ERR("{\"train_batch_size\": 0, \"train_micro_batch_size_per_gpu\": 4}", 1, ZT_ERR_INVALID,
        "ds.json: Train batch size: 0 has to be greater than 0");
    ERR("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": -2, "
        "\"gradient_accumulation_steps\": 1}", 1, ZT_ERR_INVALID,
        "ds.json: Micro batch size per gpu: -2 has to be greater than 0");
    ERR("{\"train_batch_size\": 8, \"gradient_accumulation_steps\": 0}", 1, ZT_ERR_INVALID,
        "ds.json: Gradient accumulation steps: 0 has to be greater than 0");
    ERR("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 0}", 1, ZT_ERR_INVALID,
        "ds.json: Micro batch size per gpu: 0 has to be greater than 0");
    /* Python floors: 8 // -3 == -3, not -2. */
    ERR("{\"train_batch_size\": 8, \"gradient_accumulation_steps\": -3}", 1, ZT_ERR_INVALID,
        "ds.json: Micro batch size per gpu: -3 has to be greater than 0");
    /* "auto" and null are absent. */
    TRIPLE("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": 4, "
           "\"gradient_accumulation_steps\": null}", 2, 8, 4, 1);
    ERR("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\"}", 1,
        ZT_ERR_INVALID,
        "ds.json: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
    /* Types. */
    ERR("{\"train_batch_size\": \"32\"}", 1, ZT_ERR_INVALID,
        "ds.json: key 'train_batch_size' must be an integer, got \"32\"");
    ERR("{\"train_batch_size\": 32.5}", 1, ZT_ERR_INVALID,
        "ds.json: key 'train_batch_size' must be an integer, got 32.5");
    TRIPLE("{\"train_batch_size\": 3.2e1}", 1, 32, 32, 1);
    ERR("{\"train_batch_size\": 8}", 0, ZT_ERR_INVALID, "ds.json: world_size must be >= 1, got 0");
}

static void test_defaults(void) {
    zt_ds_config cfg;
    if (!OK("{\"train_batch_size\": 8}", 1, &cfg))
        return;
    CHECK(!cfg.has_optimizer);
    CHECK(cfg.scheduler.type == ZT_SCHED_NONE);
    CHECK_NEAR(cfg.gradient_clipping, 1.0);
    CHECK(cfg.steps_per_print == 0);
    CHECK(!cfg.wall_clock_breakdown && !cfg.dataloader_drop_last && !cfg.prescale_gradients);
    CHECK_NEAR(cfg.gradient_predivide_factor, 1.0);
    CHECK(cfg.communication_data_type[0] == '\0');
    CHECK(!cfg.fp16.enabled && cfg.fp16.loss_scale == 0 && cfg.fp16.initial_scale_power == 16);
    CHECK(cfg.fp16.loss_scale_window == 1000 && cfg.fp16.hysteresis == 2);
    CHECK(!cfg.fp16.consecutive_hysteresis && cfg.fp16.min_loss_scale == 1);
    CHECK(!cfg.bf16.enabled && cfg.bf16.check_grad_overflow);
    CHECK(cfg.zero.stage == 0 && cfg.zero.contiguous_gradients && cfg.zero.reduce_scatter);
    CHECK(cfg.zero.reduce_bucket_size == 500000000 && cfg.zero.allgather_bucket_size == 500000000);
    CHECK(cfg.zero.allgather_partitions && !cfg.zero.overlap_comm);
    CHECK(cfg.zero.sub_group_size == 1000000000);
    CHECK(cfg.zero.stage3_prefetch_bucket_size == 50000000);
    CHECK(cfg.zero.stage3_param_persistence_threshold == 100000);
    CHECK(cfg.zero.stage3_max_live_parameters == 1000000000);
    CHECK(cfg.zero.stage3_max_reuse_distance == 1000000000);
    CHECK(cfg.zero.offload_optimizer.device == ZT_OFFLOAD_NONE);
    CHECK(cfg.zero.offload_optimizer.buffer_count == 4 && cfg.zero.offload_optimizer.pin_memory);
    CHECK_NEAR(cfg.zero.offload_optimizer.ratio, 1.0);
    CHECK(cfg.zero.offload_param.buffer_count == 5 && cfg.zero.offload_param.pin_memory);
    CHECK(cfg.zero.offload_param.buffer_size == 100000000);
    CHECK(cfg.zero.offload_param.max_in_cpu == 1000000000);

    /* Values set explicitly to their defaults, and the 5e8 number form. */
    if (OK("{\"train_batch_size\": 8, \"steps_per_print\": null}", 1, &cfg))
        CHECK(cfg.steps_per_print == 0);
    /* DeepSpeed's engine computes (step + 1) % steps_per_print: ZeroDivisionError. */
    ERR("{\"train_batch_size\": 8, \"steps_per_print\": 0}", 1, ZT_ERR_INVALID,
        "ds.json: key 'steps_per_print' must not be 0: DeepSpeed's (step + 1) % steps_per_print is "
        "ZeroDivisionError at the first step (leave it out or null for no step line)");
    if (OK("{\"train_batch_size\": 8, \"steps_per_print\": 50, \"gradient_clipping\": 0.5, "
           "\"fp16\": {\"enabled\": false, \"loss_scale\": 0}, \"bf16\": {\"enabled\": false}, "
           "\"zero_optimization\": {\"stage\": 0, \"reduce_bucket_size\": 2e8, "
           "\"offload_optimizer\": {\"device\": \"none\"}}, \"wall_clock_breakdown\": true, "
           "\"dataloader_drop_last\": true, \"communication_data_type\": \"FP32\"}", 1, &cfg)) {
        CHECK(cfg.steps_per_print == 50);
        CHECK_NEAR(cfg.gradient_clipping, 0.5);
        CHECK(cfg.zero.reduce_bucket_size == 200000000);
        CHECK(cfg.wall_clock_breakdown && cfg.dataloader_drop_last);
        CHECK(strcmp(cfg.communication_data_type, "fp32") == 0);
    }
    /* "auto" at a key the Hugging Face Trainer fills, left unfilled (no script here), means the
     * default; so does DeepSpeed's own pipeline.stages "auto". */
    if (OK("{\"train_batch_size\": 16, \"gradient_clipping\": \"auto\", "
           "\"pipeline\": {\"stages\": \"auto\"}, "
           "\"zero_optimization\": {\"reduce_bucket_size\": \"auto\", "
           "\"stage3_prefetch_bucket_size\": \"auto\"}, \"fp16\": {\"enabled\": \"auto\"}, "
           "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\", "
           "\"weight_decay\": \"auto\"}}, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
           "{\"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\"}}}", 1, &cfg)) {
        CHECK_NEAR(cfg.gradient_clipping, 1.0);
        CHECK(cfg.zero.stage == 0 && cfg.zero.reduce_bucket_size == 500000000 && !cfg.zero.overlap_comm);
        CHECK(!cfg.fp16.enabled);
        CHECK_NEAR(cfg.optimizer.lr, 1e-3);
        CHECK_NEAR(cfg.optimizer.beta2, 0.999);
        CHECK_NEAR(cfg.optimizer.weight_decay, 0.0);
        CHECK_NEAR(cfg.scheduler.warmup_max_lr, 1e-3);
        CHECK(cfg.scheduler.warmup_num_steps == 1000);
    }
    /* Anywhere else "auto" is refused by key: DeepSpeed's own config classes take no "auto"
     * there either (a ZeRO stage is an enum, steps_per_print an int). */
    ERR("{\"train_batch_size\": 16, \"steps_per_print\": \"auto\"}", 1, ZT_ERR_INVALID,
        "ds.json: key 'steps_per_print' is \"auto\", which only the keys the Hugging Face "
        "Trainer fills may be (docs/deepspeed.md): give a value");
    ERR("{\"train_batch_size\": 16, \"zero_optimization\": {\"stage\": 1, "
        "\"overlap_comm\": \"auto\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.overlap_comm' is \"auto\", which only the keys the "
        "Hugging Face Trainer fills may be (docs/deepspeed.md): give a value");
    /* A number beyond a double's range is refused by key, not trained with as an infinity. */
    ERR("{\"train_batch_size\": 16, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
        "{\"lr\": 1e999}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'optimizer.params.lr' is not a finite number (it overflows a double)");
    ERR("{\"train_batch_size\": 16, \"gradient_clipping\": -1e400}", 1, ZT_ERR_INVALID,
        "ds.json: key 'gradient_clipping' is not a finite number (it overflows a double)");
    /* The refused keys of the tensor_parallel section, nested ones too, are refused by name
     * (docs/deepspeed.md's table), never taken in silence. */
    ERR_PREFIX("{\"train_batch_size\": 16, \"tensor_parallel\": {\"tp_overlap_comm\": true}}", 1,
               ZT_ERR_UNSUPPORTED, "ds.json: tensor_parallel.tp_overlap_comm true is not supported");
    ERR_PREFIX("{\"train_batch_size\": 16, \"tensor_parallel\": {\"vocab_parallel_ce_backend\": "
               "\"liger\"}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: tensor_parallel.vocab_parallel_ce_backend \"liger\" is not supported");
    ERR_PREFIX("{\"train_batch_size\": 16, \"tensor_parallel\": {\"tp\": {\"mpu\": 1}}}", 1,
               ZT_ERR_UNSUPPORTED, "ds.json: tensor_parallel.tp.mpu 1 is not supported");
    ERR_PREFIX("{\"train_batch_size\": 16, \"tensor_parallel\": {\"partition_config\": {}}}", 1,
               ZT_ERR_UNSUPPORTED, "ds.json: tensor_parallel.partition_config {} is not supported");
    OK("{\"train_batch_size\": 16, \"tensor_parallel\": {\"tp_overlap_comm\": false, "
       "\"vocab_parallel_ce_backend\": \"torch\", \"tp\": {\"tp_grain_size\": 1}}}", 1, &cfg);
    /* An unknown top-level key is a warning only, as in DeepSpeed. */
    OK("{\"train_batch_size\": 8, \"seed\": 42}", 1, &cfg);

    zt_ds_config d;
    zt_ds_config_defaults(&d);
    CHECK(d.train_batch_size == 0 && d.train_micro_batch_size_per_gpu == 0 &&
          d.gradient_accumulation_steps == 0);
    CHECK_NEAR(d.gradient_clipping, 1.0);
    CHECK(d.bf16.check_grad_overflow);
}

#define B "\"train_batch_size\": 8, "

static void test_optimizer(void) {
    zt_ds_config c;
    if (OK("{" B "\"optimizer\": {\"type\": \"Adam\"}}", 1, &c)) {
        CHECK(c.has_optimizer && c.optimizer.type == ZT_OPTIM_ADAM);
        CHECK(strcmp(c.optimizer.name, "Adam") == 0);
        CHECK_NEAR(c.optimizer.lr, 1e-3);
        CHECK_NEAR(c.optimizer.beta1, 0.9);
        CHECK_NEAR(c.optimizer.beta2, 0.999);
        CHECK_NEAR(c.optimizer.eps, 1e-8);
        CHECK_NEAR(c.optimizer.weight_decay, 0.0);
        CHECK(c.optimizer.bias_correction && !c.optimizer.torch_adam);
        CHECK(c.optimizer.adam_w_mode); /* "Adam" is decoupled unless adam_w_mode is false */
    }
    if (OK("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false, "
           "\"weight_decay\": 0.1, \"lr\": 6e-4, \"betas\": [0.8, 0.95], \"eps\": 1e-6, "
           "\"bias_correction\": false}}}", 1, &c)) {
        CHECK(!c.optimizer.adam_w_mode); /* L2: decay added to the gradient */
        CHECK_NEAR(c.optimizer.weight_decay, 0.1);
        CHECK_NEAR(c.optimizer.lr, 6e-4);
        CHECK_NEAR(c.optimizer.beta1, 0.8);
        CHECK_NEAR(c.optimizer.beta2, 0.95);
        CHECK_NEAR(c.optimizer.eps, 1e-6);
        CHECK(!c.optimizer.bias_correction);
    }
    if (OK("{" B "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"adam_w_mode\": false}}}", 1, &c))
        CHECK(c.optimizer.adam_w_mode); /* AdamW is always decoupled */
    if (OK("{" B "\"optimizer\": {\"type\": \"ADAMW\", \"legacy_fusion\": false}}", 1, &c))
        CHECK(c.optimizer.type == ZT_OPTIM_ADAM && c.optimizer.adam_w_mode);
    /* torch_adam + decoupled mode builds torch.optim.AdamW, whose default decay is 0.01. */
    if (OK("{" B "\"optimizer\": {\"type\": \"adamw\", \"params\": {\"torch_adam\": true}}}", 1, &c))
        CHECK(c.optimizer.torch_adam && fabs(c.optimizer.weight_decay - 0.01) < 1e-15);
    if (OK("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": true, "
           "\"adam_w_mode\": false}}}", 1, &c))
        CHECK_NEAR(c.optimizer.weight_decay, 0.0);
    if (OK("{" B "\"optimizer\": {\"type\": \"SGD\"}}", 1, &c)) {
        CHECK(c.optimizer.type == ZT_OPTIM_SGD);
        CHECK_NEAR(c.optimizer.lr, 1e-3);
        CHECK(c.optimizer.momentum == 0 && c.optimizer.dampening == 0 && !c.optimizer.nesterov);
        CHECK(c.optimizer.weight_decay == 0);
    }
    if (OK("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"momentum\": 0.9, "
           "\"nesterov\": true, \"weight_decay\": 1e-4}}}", 1, &c)) {
        CHECK_NEAR(c.optimizer.lr, 0.1);
        CHECK_NEAR(c.optimizer.momentum, 0.9);
        CHECK(c.optimizer.nesterov);
        CHECK_NEAR(c.optimizer.weight_decay, 1e-4);
    }
    ERR("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"nesterov\": true}}}", 1,
        ZT_ERR_INVALID, "ds.json: optimizer.params.nesterov: Nesterov momentum requires a momentum and zero dampening");
    ERR("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"momentum\": 0.9, \"dampening\": 0.1, "
        "\"nesterov\": true}}}", 1, ZT_ERR_INVALID,
        "ds.json: optimizer.params.nesterov: Nesterov momentum requires a momentum and zero dampening");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3, \"max_grad_norm\": 1.0}}}",
        1, ZT_ERR_INVALID,
        "ds.json: 'max_grad_norm' is not supported as an optimizer parameter, please switch to using "
        "the deepspeed parameter 'gradient_clipping' see: "
        "https://www.deepspeed.ai/docs/config-json/#gradient-clipping for more details");
    ERR("{" B "\"optimizer\": {\"type\": \"RMSprop\"}}", 1, ZT_ERR_UNSUPPORTED,
        "ds.json: optimizer type 'RMSprop' is not supported by ztrain (supported: Adam, AdamW, SGD, "
        "Lamb)");
    ERR_PREFIX("{" B "\"optimizer\": {\"type\": \"sgd\"}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown optimizer type 'sgd' (");
    ERR_PREFIX("{" B "\"optimizer\": {\"type\": \"Frobnicate\"}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown optimizer type 'Frobnicate'");
    ERR("{" B "\"optimizer\": {\"params\": {\"lr\": 1e-3}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'optimizer.type' is required");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3, \"beta1\": 0.9}}}", 1,
        ZT_ERR_INVALID,
        "ds.json: unknown key 'beta1' in optimizer.params (did you mean 'betas'?); allowed keys: lr, "
        "betas, eps, weight_decay, bias_correction, amsgrad, set_grad_none, torch_adam, adam_w_mode, "
        "fp32_optimizer_states");
    ERR_PREFIX("{" B "\"optimizer\": {\"type\": \"Adam\", \"param\": {}}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown key 'param' in optimizer (did you mean 'params'?)");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": \"abc\"}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'optimizer.params.lr' must be a number, got \"abc\"");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9]}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'optimizer.params.betas' must be a list of two numbers, got [0.9]");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 1.0]}}}", 1,
        ZT_ERR_INVALID, "ds.json: optimizer.params.betas: Invalid beta parameter at index 1: 1");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": -0.001}}}", 1, ZT_ERR_INVALID,
        "ds.json: optimizer.params.lr: Invalid learning rate: -0.001");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": true}}}", 1,
        ZT_ERR_INVALID, "ds.json: optimizer.params.amsgrad: FusedAdam does not support the AMSGrad "
        "variant.");
    OK("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": false}}}", 1, &c);
}

#define OFFLOAD "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}, "
#define TYPE_ERROR(key, cls, why)                                                                  \
    "ds.json: key 'optimizer.params." key "' is not a parameter of " cls ", which DeepSpeed "   \
    "builds " why " (TypeError: unexpected keyword argument '" key "')"

/* Each Adam path takes the keyword arguments of the class DeepSpeed builds for it
 * (engine.py get_optimizer_configuration): FusedAdam(lr, bias_correction, betas, eps,
 * adam_w_mode, weight_decay, amsgrad, set_grad_none); DeepSpeedCPUAdam (offload_optimizer on cpu
 * or nvme) the same without set_grad_none; torch.optim.AdamW / Adam (torch_adam) lr, betas, eps,
 * weight_decay, amsgrad, foreach, maximize, capturable, differentiable, fused, and Adam
 * decoupled_weight_decay. torch_adam, adam_w_mode and fp32_optimizer_states are popped first on
 * every path. */
static void test_adam_classes(void) {
    zt_ds_config c;
    /* FusedAdam */
    OK("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"set_grad_none\": true, "
       "\"bias_correction\": true, \"fp32_optimizer_states\": false}}}", 1, &c);
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"fused\": true}}}", 1, ZT_ERR_INVALID,
        TYPE_ERROR("fused", "FusedAdam", "without torch_adam or offload_optimizer"));
    ERR("{" B "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"foreach\": false}}}", 1,
        ZT_ERR_INVALID, TYPE_ERROR("foreach", "FusedAdam", "without torch_adam or offload_optimizer"));
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"maximize\": false}}}", 1,
        ZT_ERR_INVALID, TYPE_ERROR("maximize", "FusedAdam", "without torch_adam or offload_optimizer"));
    /* torch.optim.AdamW: no bias_correction (it always corrects), no set_grad_none. */
    ERR("{" B "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, "
        "\"bias_correction\": false}}}", 1, ZT_ERR_INVALID,
        TYPE_ERROR("bias_correction", "torch.optim.AdamW", "with torch_adam: true"));
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": true, "
        "\"set_grad_none\": true}}}", 1, ZT_ERR_INVALID,
        TYPE_ERROR("set_grad_none", "torch.optim.AdamW", "with torch_adam: true"));
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": true, "
        "\"decoupled_weight_decay\": true}}}", 1, ZT_ERR_INVALID,
        TYPE_ERROR("decoupled_weight_decay", "torch.optim.AdamW", "with torch_adam: true"));
    if (OK("{" B "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, "
           "\"foreach\": true, \"capturable\": false, \"differentiable\": false, "
           "\"fp32_optimizer_states\": true, \"maximize\": false, \"amsgrad\": false}}}", 1, &c))
        CHECK(c.optimizer.torch_adam && c.optimizer.adam_w_mode && c.optimizer.bias_correction);
    ERR("{" B "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, "
        "\"foreach\": true, \"fused\": true}}}", 1, ZT_ERR_INVALID,
        "ds.json: optimizer.params.fused: `fused` and `foreach` cannot be `True` together.");
    ERR("{" B "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, "
        "\"amsgrad\": true}}}", 1, ZT_ERR_UNSUPPORTED,
        "ds.json: optimizer.params.amsgrad: true is not supported: DeepSpeed builds "
        "torch.optim.AdamW here, which has the AMSGrad variant, and ztrain's Adam does not "
        "implement it");
    /* torch.optim.AdamW's maximize, taken (reference/test_optimizer checks the update). */
    if (OK("{" B "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, "
           "\"maximize\": true}}}", 1, &c))
        CHECK(c.optimizer.maximize && c.optimizer.type == ZT_OPTIM_ADAM);
    /* torch.optim.Adam with decoupled_weight_decay is AdamW's update, with Adam's default decay. */
    if (OK("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": true, "
           "\"adam_w_mode\": false, \"decoupled_weight_decay\": true}}}", 1, &c))
        CHECK(c.optimizer.adam_w_mode && c.optimizer.weight_decay == 0.0);
    if (OK("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": true, "
           "\"adam_w_mode\": false}}}", 1, &c))
        CHECK(!c.optimizer.adam_w_mode);
    /* DeepSpeedCPUAdam, whatever the stage's wrapper. */
    if (OK("{" B OFFLOAD "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"bias_correction\": "
           "false, \"fp32_optimizer_states\": false}}}", 1, &c))
        CHECK(!c.optimizer.bias_correction);
    ERR("{" B OFFLOAD "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"set_grad_none\": true}}}",
        1, ZT_ERR_INVALID,
        TYPE_ERROR("set_grad_none", "DeepSpeedCPUAdam", "with zero_optimization.offload_optimizer"));
    ERR("{" B OFFLOAD "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": true}}}", 1,
        ZT_ERR_INVALID, "ds.json: optimizer.params.amsgrad: DeepSpeedCPUAdam does not support the "
        "AMSGrad variant.");
    /* torch_adam wins over offload. */
    ERR("{" B OFFLOAD "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": true, "
        "\"bias_correction\": true}}}", 1, ZT_ERR_INVALID,
        TYPE_ERROR("bias_correction", "torch.optim.AdamW", "with torch_adam: true"));
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"fp32_optimizer_states\": 1}}}",
        1, ZT_ERR_INVALID, "ds.json: key 'optimizer.params.fp32_optimizer_states' must be true or false, got 1");
    /* torch.optim.SGD's maximize negates the gradient (the kernels' tests check the update). */
    if (OK("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"maximize\": true, "
           "\"differentiable\": false, \"foreach\": true}}}", 1, &c))
        CHECK(c.optimizer.maximize);
    if (OK("{" B "\"optimizer\": {\"type\": \"SGD\"}}", 1, &c))
        CHECK(!c.optimizer.maximize);
    ERR("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"fused\": true, "
        "\"differentiable\": true}}}", 1, ZT_ERR_INVALID,
        "ds.json: optimizer.params.fused: `fused` does not support `differentiable`");
}

#define ADAM6 "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 6e-4}}, "

/* LAMB with FusedLamb's defaults and DeepSpeed's assertions around it (engine.py), and the 1-bit
 * family, which DeepSpeed 0.19 no longer has: its engine asserts "<type> is not a supported
 * DeepSpeed Optimizer" for any case of the names and any params. */
static void test_lamb_family(void) {
    zt_ds_config c;
    if (OK("{" B "\"optimizer\": {\"type\": \"LAMB\"}}", 1, &c)) {
        CHECK(c.optimizer.type == ZT_OPTIM_LAMB);
        CHECK_NEAR(c.optimizer.lr, 1e-3);
        CHECK_NEAR(c.optimizer.beta1, 0.9);
        CHECK_NEAR(c.optimizer.beta2, 0.999);
        CHECK_NEAR(c.optimizer.eps, 1e-8);
        CHECK_NEAR(c.optimizer.weight_decay, 0.0);
        CHECK_NEAR(c.optimizer.max_coeff, 10.0);
        CHECK_NEAR(c.optimizer.min_coeff, 0.01);
        CHECK(c.optimizer.bias_correction && !c.optimizer.eps_inside_sqrt);
    }
    if (OK("{" B "\"optimizer\": {\"type\": \"lamb\", \"params\": {\"lr\": 2e-3, \"betas\": [0.8, "
           "0.99], \"eps\": 1e-6, \"weight_decay\": 0.01, \"bias_correction\": false, "
           "\"eps_inside_sqrt\": true, \"max_coeff\": 5, \"min_coeff\": 0.1}}}", 1, &c)) {
        CHECK(c.optimizer.type == ZT_OPTIM_LAMB);
        CHECK_NEAR(c.optimizer.lr, 2e-3);
        CHECK_NEAR(c.optimizer.beta1, 0.8);
        CHECK_NEAR(c.optimizer.beta2, 0.99);
        CHECK_NEAR(c.optimizer.eps, 1e-6);
        CHECK_NEAR(c.optimizer.weight_decay, 0.01);
        CHECK_NEAR(c.optimizer.max_coeff, 5.0);
        CHECK_NEAR(c.optimizer.min_coeff, 0.1);
        CHECK(!c.optimizer.bias_correction && c.optimizer.eps_inside_sqrt);
    }
    ERR_PREFIX("{" B "\"optimizer\": {\"type\": \"Lamb\", \"params\": {\"freeze_step\": 10}}}", 1,
               ZT_ERR_INVALID, "ds.json: unknown key 'freeze_step' in optimizer.params");
    ERR("{" B "\"optimizer\": {\"type\": \"Lamb\", \"params\": {\"amsgrad\": true}}}", 1,
        ZT_ERR_INVALID, "ds.json: optimizer.params.amsgrad: FusedLamb does not support the AMSGrad "
        "variant.");
    ERR("{" B "\"fp16\": {\"enabled\": true, \"loss_scale\": 128}, \"optimizer\": {\"type\": "
        "\"Lamb\"}}", 1, ZT_ERR_INVALID,
        "ds.json: DeepSpeed lamb optimizer requires dynamic loss scaling (fp16.loss_scale must be 0)");
    ERR("{" B "\"zero_optimization\": {\"stage\": 1}, \"optimizer\": {\"type\": \"Lamb\"}}", 1,
        ZT_ERR_INVALID, "ds.json: You are using an untested ZeRO Optimizer. Please add "
        "<\"zero_allow_untested_optimizer\": true> in the configuration file to use it.");
    if (OK("{" B "\"zero_optimization\": {\"stage\": 2}, \"zero_allow_untested_optimizer\": true, "
           "\"optimizer\": {\"type\": \"Lamb\"}}", 1, &c))
        CHECK(c.optimizer.type == ZT_OPTIM_LAMB && c.zero_allow_untested_optimizer);
    /* torch.optim.SGD is not among ZeRO's tested optimizers either; stage 0 needs nothing. */
    ERR("{" B "\"zero_optimization\": {\"stage\": 1}, \"optimizer\": {\"type\": \"SGD\", "
        "\"params\": {\"lr\": 0.1}}}", 1, ZT_ERR_INVALID,
        "ds.json: You are using an untested ZeRO Optimizer. Please add "
        "<\"zero_allow_untested_optimizer\": true> in the configuration file to use it.");
    if (OK("{" B "\"zero_optimization\": {\"stage\": 3}, \"zero_allow_untested_optimizer\": true, "
           "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}}", 1, &c))
        CHECK(c.optimizer.type == ZT_OPTIM_SGD);
    if (OK("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}}", 1, &c))
        CHECK(c.optimizer.type == ZT_OPTIM_SGD);
    ERR_PREFIX("{" B "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
               "\"cpu\"}}, \"zero_allow_untested_optimizer\": true, \"optimizer\": {\"type\": "
               "\"Lamb\"}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: optimizer Lamb with zero_optimization.offload_optimizer is not supported");

    ERR("{" B "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 4e-4, "
        "\"freeze_step\": 23000}}}", 1, ZT_ERR_INVALID,
        "ds.json: optimizer.type 'OneBitAdam' was removed from DeepSpeed 0.19 with the 1-bit "
        "optimizers' compressed communication, and DeepSpeed fails on it (\"OneBitAdam is not a "
        "supported DeepSpeed Optimizer\"); use \"AdamW\", the same math uncompressed");
    ERR_PREFIX("{" B "\"optimizer\": {\"type\": \"zerooneadam\"}}", 1, ZT_ERR_INVALID,
               "ds.json: optimizer.type 'zerooneadam' was removed from DeepSpeed 0.19");
    ERR_PREFIX("{" B "\"zero_optimization\": {\"stage\": 3}, \"optimizer\": {\"type\": "
               "\"OneBitLamb\", \"params\": {\"coeff_beta\": 0.9}}}", 1, ZT_ERR_INVALID,
               "ds.json: optimizer.type 'OneBitLamb' was removed from DeepSpeed 0.19");
}

/* The monitor sections: where DeepSpeed's monitors would write (os.path.join(output_path,
 * job_name)), their defaults, and their pydantic validation. */
static void test_monitor(void) {
    zt_ds_config c;
    if (OK("{\"train_batch_size\": 8}", 1, &c)) {
        CHECK(!c.monitor.tensorboard.enabled && !c.monitor.csv.enabled);
        CHECK(!c.monitor.wandb && !c.monitor.comet);
    }
    if (OK("{" B "\"tensorboard\": {\"enabled\": true}, \"csv_monitor\": {\"enabled\": true, "
           "\"output_path\": \"logs/\", \"job_name\": \"run1\"}}", 1, &c)) {
        CHECK(c.monitor.tensorboard.enabled && strcmp(c.monitor.tensorboard.dir, "DeepSpeedJobName") == 0);
        CHECK(c.monitor.csv.enabled && strcmp(c.monitor.csv.dir, "logs/run1") == 0);
    }
    if (OK("{" B "\"tensorboard\": {\"enabled\": true, \"output_path\": \"/tmp/tb\", \"job_name\": "
           "\"x\"}, \"csv_monitor\": {\"output_path\": \"/a\", \"job_name\": \"/b/c\"}}", 1, &c)) {
        CHECK(strcmp(c.monitor.tensorboard.dir, "/tmp/tb/x") == 0);
        CHECK(!c.monitor.csv.enabled && strcmp(c.monitor.csv.dir, "/b/c") == 0);
    }
    if (OK("{" B "\"wandb\": {\"enabled\": true, \"project\": \"p\", \"team\": null, \"group\": \"g\"}, "
           "\"comet\": {\"enabled\": true, \"samples_log_interval\": 50, \"online\": false, "
           "\"api_key\": null, \"mode\": \"get_or_create\"}}", 1, &c))
        CHECK(c.monitor.wandb && c.monitor.comet);
    ERR_PREFIX("{" B "\"tensorboard\": {\"enabled\": true, \"path\": \"tb\"}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown key 'path' in tensorboard");
    /* pydantic's lax bool, as DeepSpeed's CSVConfig reads it (tests/deepspeed compares). */
    if (OK("{" B "\"csv_monitor\": {\"enabled\": \"yes\"}}", 1, &c))
        CHECK(c.monitor.csv.enabled);
    ERR_PREFIX("{" B "\"csv_monitor\": {\"enabled\": \"maybe\"}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'csv_monitor.enabled' must be");
    ERR("{" B "\"wandb\": {\"project\": 3}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'wandb.project' must be a string, got 3");
    ERR_PREFIX("{" B "\"comet\": {\"samples_log_interval\": 1.5}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'comet.samples_log_interval' must be");
    /* Switches of features ztrain lacks, read as DeepSpeed 0.19 reads each (ds_config_switches.c;
     * make test-deepspeed asks DeepSpeed itself): Python's truth, pydantic's bool, bool | value. */
    ERR_PREFIX("{" B "\"torch_autocast\": {\"enabled\": \"no\"}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: torch_autocast.enabled is not supported");
    ERR_PREFIX("{" B "\"expert_parallel\": {\"enabled\": 1}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: expert_parallel.enabled is not supported");
    OK("{" B "\"autotuning\": {\"enabled\": 0}}", 1, &c);
    ERR_PREFIX("{" B "\"comms_logger\": {\"enabled\": \"on\"}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: comms_logger.enabled is not supported");
    OK("{" B "\"comms_logger\": {\"enabled\": \"off\"}}", 1, &c);
    ERR_PREFIX("{" B "\"hybrid_engine\": {\"enabled\": \"maybe\"}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'hybrid_engine.enabled' must be true or false");
    ERR_PREFIX("{" B "\"flops_profiler\": {\"enabled\": \"\"}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'flops_profiler.enabled' must be true or false");
    OK("{" B "\"flops_profiler\": {\"enabled\": 0}}", 1, &c);
    ERR_PREFIX("{" B "\"compile\": {\"deepcompile\": \"true\"}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: compile.deepcompile is not supported");
    ERR_PREFIX("{" B "\"datastates_ckpt\": {}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: datastates_ckpt is not supported");
    OK("{" B "\"datastates_ckpt\": false}", 1, &c);
    /* timers as DeepSpeed 0.19's get_timers_config reads it (utils/config.py): `"throughput" in
     * timers`, then DeepSpeedThroughputTimerConfig(**timers["throughput"]), two pydantic bools
     * (make test-deepspeed asks DeepSpeed itself). Converted to true, nothing is set away from
     * the default, so nothing is warned; false is warned, the rest refused by key. */
    if (OK("{" B "\"timers\": {\"throughput\": {\"enabled\": \"yes\", \"synchronized\": 1}}}",
           1, &c))
        CHECK(!strstr(c.warnings, "timers"), "%s", c.warnings);
    if (OK("{" B "\"timers\": {\"throughput\": {\"enabled\": \"off\"}}}", 1, &c))
        CHECK(strstr(c.warnings, "timers.throughput.enabled has no effect"), "%s", c.warnings);
    OK("{" B "\"timers\": \"abc\"}", 1, &c);
    OK("{" B "\"timers\": [1]}", 1, &c);
    ERR("{" B "\"timers\": {\"throughput\": {\"enabled\": \"maybe\"}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'timers.throughput.enabled' must be true or false (DeepSpeed's pydantic "
        "model also takes 1/0, \"yes\"/\"no\" and \"on\"/\"off\"), got \"maybe\"");
    ERR_PREFIX("{" B "\"timers\": {\"throughput\": {\"synchronized\": 2}}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'timers.throughput.synchronized' must be true or false");
    ERR_PREFIX("{" B "\"timers\": {\"throughput\": {\"enabled\": null}}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'timers.throughput.enabled' must be true or false");
    ERR("{" B "\"timers\": {\"throughput\": null}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'timers.throughput' must be an object, got null (DeepSpeed passes it by ** "
        "to DeepSpeedThroughputTimerConfig, which needs a mapping)");
    ERR_PREFIX("{" B "\"timers\": {\"throughput\": []}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'timers.throughput' must be an object, got []");
    ERR_PREFIX("{" B "\"timers\": 5}", 1, ZT_ERR_INVALID, "ds.json: key 'timers' must be an object");
    ERR_PREFIX("{" B "\"timers\": \"xthroughputx\"}", 1, ZT_ERR_INVALID,
               "ds.json: key 'timers' must be an object");
    ERR_PREFIX("{" B "\"timers\": [\"throughput\"]}", 1, ZT_ERR_INVALID,
               "ds.json: key 'timers' must be an object");
    /* tensor_parallel is a pydantic model too (TPTrainingConfig, TPConfig): "2" is 2, for the
     * parser and for zt_ds_tp_size_of, which reads a stored spec as written. */
    if (OK("{\"train_batch_size\": 4, \"tensor_parallel\": {\"autotp_size\": \"2\", "
           "\"tp_overlap_comm\": \"off\"}}", 2, &c))
        CHECK(c.tp_size == 2 && c.world_size == 1);
    if (OK("{\"train_batch_size\": 4, \"tensor_parallel\": {\"tp\": {\"tp_size\": \" 2 \"}}}", 2,
           &c))
        CHECK(c.tp_size == 2);
    static const char *const written[] = {"{\"tensor_parallel\": {\"autotp_size\": \"2\"}}",
                                          "{\"tensor_parallel\": {\"tp\": {\"tp_size\": \"4.0\"}}}",
                                          "{\"tensor_parallel\": {\"autotp_size\": \"x\"}}"};
    const int sizes[] = {2, 4, 1};
    for (int i = 0; i < 3; i++) {
        cJSON *j = cJSON_Parse(written[i]);
        CHECK(zt_ds_tp_size_of(j) == sizes[i], "%s", written[i]);
        cJSON_Delete(j);
    }
    ERR_PREFIX("{\"train_batch_size\": 4, \"tensor_parallel\": {\"autotp_size\": \"x\"}}", 2,
               ZT_ERR_INVALID, "ds.json: key 'tensor_parallel.autotp_size' must be an integer");
}

/* The lr after k optimizer updates of the schedule in json (the schedule's state is DeepSpeed's
 * last_batch_iteration, so it is set to k rather than stepped 2^31 times); NAN when the config is
 * refused. */
static double lr_at(int line, const char *json, int64_t k) {
    zt_ds_config c;
    if (!ok_at(line, json, 1, &c))
        return NAN;
    zt_lr_schedule s;
    zt_lr_schedule_init(&s, &c.scheduler, c.optimizer.lr, c.optimizer.beta1);
    s.last_batch_iteration = k;
    return zt_lr_schedule_lr(&s);
}

/* Step counts above 2^31 - 1, which DeepSpeed's Python ints take: parsed whole, and the lr at a
 * step past 2^31 is lr_schedules.py's formula, computed here. */
static void test_long_schedules(void) {
    zt_ds_config c;
    const int64_t n = 3000000000, k = 2147483748; /* 2^31 + 100, inside the warmup */
#define SCHED(type, params) "{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": " \
    "1e-3}}, \"scheduler\": {\"type\": \"" type "\", \"params\": {" params "}}}"
    const char *warm = SCHED("WarmupLR", "\"warmup_max_lr\": 1e-3, \"warmup_num_steps\": 3000000000");
    if (OK(warm, 1, &c))
        CHECK(c.scheduler.warmup_num_steps == n, "%lld", (long long)c.scheduler.warmup_num_steps);
    /* WarmupLR, log: min + (max - min) * (1 / ln N) * ln(k + 1). */
    CHECK_NEAR(lr_at(__LINE__, warm, k), 1e-3 * ((1.0 / log((double)n)) * log((double)(k + 1))));
    /* Linear: k / N. */
    CHECK_NEAR(lr_at(__LINE__, SCHED("WarmupLR", "\"warmup_max_lr\": 1e-3, \"warmup_num_steps\": "
                                     "5000000000, \"warmup_type\": \"linear\""), 4000000000),
               1e-3 * (4000000000.0 / 5000000000.0));
    /* WarmupDecayLR past a 4e9-step warmup: (total - k) / max(1, total - N). */
    CHECK_NEAR(lr_at(__LINE__, SCHED("WarmupDecayLR", "\"warmup_max_lr\": 1e-3, \"warmup_num_steps\": "
                                     "4000000000, \"total_num_steps\": 6000000000"), 5000000000),
               1e-3 * ((6000000000.0 - 5000000000.0) / (6000000000.0 - 4000000000.0)));
    /* LRRangeTest: min_lr * (1 + rate * (k + 1) / step_size). */
    CHECK_NEAR(lr_at(__LINE__, SCHED("LRRangeTest", "\"lr_range_test_min_lr\": 1e-4, "
                                     "\"lr_range_test_step_size\": 3000000000"), 5999999999),
               1e-4 * (1.0 + 1.0 * (6000000000.0 / 3000000000.0)));
    /* OneCycle after its 20-step cycle: min_lr / (1 + rate * d / decay_step_size), d = k - 20 + 1. */
    CHECK_NEAR(lr_at(__LINE__, SCHED("OneCycle", "\"cycle_min_lr\": 1e-4, \"cycle_max_lr\": 1e-3, "
                                     "\"cycle_first_step_size\": 10, \"decay_lr_rate\": 0.5, "
                                     "\"decay_step_size\": 3000000000, \"cycle_momentum\": false"),
                     3000000019),
               1e-4 / (1.0 + 0.5 * (3000000000.0 / 3000000000.0)));
    if (OK(SCHED("OneCycle", "\"cycle_min_lr\": 1e-4, \"cycle_max_lr\": 1e-3, "
                 "\"cycle_first_stair_count\": 4000000000"), 1, &c))
        CHECK(c.scheduler.cycle_first_stair_count == 4000000000 &&
              c.scheduler.cycle_second_stair_count == 4000000000);
    /* Beyond 2^53 a JSON number no longer holds every integer. */
    ERR(SCHED("WarmupLR", "\"warmup_num_steps\": 18014398509481984"), 1, ZT_ERR_INVALID,
        "ds.json: scheduler.params: warmup_num_steps must be at most 2^53 (9007199254740992), "
        "got 18014398509481984");
    /* ... and the value is named as written, not as the double it was rounded to
     * (12345678901234567168). */
    ERR(SCHED("WarmupLR", "\"warmup_num_steps\": 12345678901234567891"), 1, ZT_ERR_INVALID,
        "ds.json: scheduler.params: warmup_num_steps must be at most 2^53 (9007199254740992), "
        "got 12345678901234567891");
#undef SCHED
}

static void test_scheduler(void) {
    zt_ds_config c;
    zt_schedule_config *s = &c.scheduler;
    /* WarmupLR: warmup_max_lr falls back to the optimizer's lr. */
    if (OK("{" B ADAM6 "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {}}}", 1, &c)) {
        CHECK(s->type == ZT_SCHED_WARMUP_LR);
        CHECK_NEAR(s->warmup_max_lr, 6e-4);
        CHECK(s->warmup_min_lr == 0 && s->warmup_num_steps == 1000 && !s->warmup_linear);
    }
    if (OK("{" B ADAM6 "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 1e-5, "
           "\"warmup_max_lr\": 1e-3, \"warmup_num_steps\": 1, \"warmup_type\": \"linear\", "
           "\"last_batch_iteration\": -1}}}", 1, &c)) {
        CHECK_NEAR(s->warmup_min_lr, 1e-5);
        CHECK_NEAR(s->warmup_max_lr, 1e-3);
        CHECK(s->warmup_num_steps == 1); /* stored as given; the schedule uses max(2, n) */
        CHECK(s->warmup_linear);
    }
    /* An unknown warmup_type falls back to log with a warning, as in DeepSpeed. */
    if (OK("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_type\": \"cosine\"}}}",
           1, &c))
        CHECK(!s->warmup_linear);
    ERR("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 0}}}", 1,
        ZT_ERR_INVALID, "ds.json: scheduler.params: warmup_num_steps must be a positive integer, got 0");
    ERR("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 1.5}}}", 1,
        ZT_ERR_INVALID, "ds.json: scheduler.params: warmup_num_steps must be a positive integer, got 1.5");
    ERR_PREFIX("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"total_num_steps\": 10}}}",
               1, ZT_ERR_INVALID, "ds.json: unknown key 'total_num_steps' in scheduler.params");
    /* WarmupDecayLR: total_num_steps required; warmup_max_lr defaults to 0.001 whatever the lr. */
    ERR("{" B "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'scheduler.params.total_num_steps' is required");
    if (OK("{" B ADAM6 "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
           "{\"total_num_steps\": 5000, \"warmup_num_steps\": 100}}}", 1, &c)) {
        CHECK(s->type == ZT_SCHED_WARMUP_DECAY_LR);
        CHECK(s->total_num_steps == 5000 && s->warmup_num_steps == 100);
        CHECK_NEAR(s->warmup_max_lr, 1e-3);
        CHECK(s->warmup_min_lr == 0);
    }
    ERR("{" B "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10}}}",
        1, ZT_ERR_INVALID, "ds.json: key 'scheduler.params.total_num_steps' is required");
    if (OK("{" B ADAM6 "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": "
           "500, \"warmup_min_ratio\": 0.1, \"cos_min_ratio\": 0.01, \"warmup_num_steps\": 10}}}", 1, &c)) {
        CHECK(s->type == ZT_SCHED_WARMUP_COSINE_LR);
        CHECK(s->total_num_steps == 500 && s->warmup_num_steps == 10);
        CHECK_NEAR(s->warmup_min_ratio, 0.1);
        CHECK_NEAR(s->cos_min_ratio, 0.01);
    }
    if (OK("{" B "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 10}}}",
           1, &c)) {
        CHECK(s->warmup_min_ratio == 0 && s->warmup_num_steps == 1000);
        CHECK_NEAR(s->cos_min_ratio, 1e-4);
    }
    /* OneCycle: second step size and stair count default to the first ones; with Adam, DeepSpeed
     * writes (mom, 0.99) into betas. */
    ERR("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_max_lr\": 1e-3}}}", 1,
        ZT_ERR_INVALID, "ds.json: key 'scheduler.params.cycle_min_lr' is required");
    if (OK("{" B ADAM6 "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 1e-4, "
           "\"cycle_max_lr\": 1e-3, \"cycle_first_step_size\": 100, \"cycle_first_stair_count\": 3, "
           "\"decay_step_size\": 10, \"decay_lr_rate\": 0.5, \"decay_mom_rate\": 0.1, "
           "\"cycle_min_mom\": 0.85, \"cycle_max_mom\": 0.95}}}", 1, &c)) {
        CHECK(s->type == ZT_SCHED_ONE_CYCLE);
        CHECK_NEAR(s->cycle_min_lr, 1e-4);
        CHECK_NEAR(s->cycle_max_lr, 1e-3);
        CHECK(s->cycle_first_step_size == 100 && s->cycle_second_step_size == 100);
        CHECK(s->cycle_first_stair_count == 3 && s->cycle_second_stair_count == 3);
        CHECK(s->decay_step_size == 10);
        CHECK_NEAR(s->decay_lr_rate, 0.5);
        CHECK_NEAR(s->decay_mom_rate, 0.1);
        CHECK_NEAR(s->cycle_min_mom, 0.85);
        CHECK_NEAR(s->cycle_max_mom, 0.95);
        CHECK(s->cycle_momentum);
        CHECK_NEAR(c.optimizer.beta2, 0.99);
    }
    if (OK("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0, "
           "\"cycle_max_lr\": 1}}}", 1, &c)) {
        CHECK(s->cycle_first_step_size == 2000 && s->cycle_second_step_size == 2000);
        CHECK(s->cycle_first_stair_count == 0 && s->cycle_second_stair_count == 0);
        CHECK(s->decay_step_size == 0 && s->decay_lr_rate == 0 && s->decay_mom_rate == 0);
        CHECK_NEAR(s->cycle_min_mom, 0.8);
        CHECK_NEAR(s->cycle_max_mom, 0.9);
    }
    if (OK("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"momentum\": 0.9}}, \"scheduler\": "
           "{\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0.01, \"cycle_max_lr\": 0.1, "
           "\"cycle_second_step_size\": 50}}}", 1, &c)) {
        CHECK(!s->cycle_momentum); /* torch SGD has no betas: DeepSpeed disables it */
        CHECK(s->cycle_second_step_size == 50);
    }
    /* OneCycle takes float() of its step sizes: the first must be > 0, the second >= 0. */
    ERR("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0, "
        "\"cycle_max_lr\": 1, \"cycle_first_step_size\": 0}}}", 1, ZT_ERR_INVALID,
        "ds.json: scheduler.params: cycle_first_step_size must be positive, got 0.0");
    ERR("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0, "
        "\"cycle_max_lr\": 1, \"cycle_second_step_size\": -1}}}", 1, ZT_ERR_INVALID,
        "ds.json: scheduler.params: cycle_second_step_size must be non-negative, got -1.0");
    if (OK("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0, "
           "\"cycle_max_lr\": 1, \"cycle_first_step_size\": 2.5, \"cycle_second_step_size\": 0}}}",
           1, &c))
        CHECK(s->cycle_first_step_size == 2.5 && s->cycle_second_step_size == 0);
    if (OK("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0, "
           "\"cycle_max_lr\": 1, \"cycle_first_step_size\": 2.5}}}", 1, &c))
        CHECK(s->cycle_second_step_size == 2.5);
    /* total_num_steps only enters the arithmetic: fractions and values below the warmup run. */
    if (OK("{" B "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": "
           "6.5, \"warmup_num_steps\": 2}}}", 1, &c))
        CHECK(s->total_num_steps == 6.5);
    if (OK("{" B "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": "
           "0, \"warmup_num_steps\": 2}}}", 1, &c))
        CHECK(s->total_num_steps == 0);
    /* isinstance(v, int): a number written as a float is refused even when whole, true is 1. */
    ERR("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 3.0}}}", 1,
        ZT_ERR_INVALID, "ds.json: scheduler.params: warmup_num_steps must be a positive integer, got 3.0");
    ERR("{" B "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 9, "
        "\"warmup_num_steps\": 1e1}}}", 1, ZT_ERR_INVALID,
        "ds.json: scheduler.params: warmup_num_steps must be a positive integer, got 10.0");
    ERR("{" B "\"scheduler\": {\"type\": \"LRRangeTest\", \"params\": {\"lr_range_test_step_size\": "
        "2.0}}}", 1, ZT_ERR_INVALID,
        "ds.json: scheduler.params: lr_range_test_step_size must be a positive integer, got 2.0");
    ERR("{" B "\"scheduler\": {\"type\": \"LRRangeTest\", \"params\": {\"lr_range_test_step_size\": "
        "\"5\"}}}", 1, ZT_ERR_INVALID,
        "ds.json: scheduler.params: lr_range_test_step_size must be a positive integer, got 5");
    if (OK("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": true}}}",
           1, &c))
        CHECK(s->warmup_num_steps == 1);
    /* Without params (or with null) DeepSpeed's Class(optimizer, **params) is a TypeError. */
    ERR_PREFIX("{" B "\"scheduler\": {\"type\": \"LRRangeTest\"}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'scheduler.params' is required for scheduler LRRangeTest");
    ERR_PREFIX("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": null}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'scheduler.params' is required for scheduler WarmupLR");
    if (OK("{" B "\"scheduler\": {\"type\": \"LRRangeTest\", \"params\": {}}}", 1, &c)) {
        CHECK(s->type == ZT_SCHED_LR_RANGE_TEST);
        CHECK_NEAR(s->lr_range_test_min_lr, 1e-3);
        CHECK(s->lr_range_test_step_size == 2000 && !s->lr_range_test_staircase);
        CHECK_NEAR(s->lr_range_test_step_rate, 1.0);
    }
    if (OK("{" B "\"scheduler\": {\"type\": \"LRRangeTest\", \"params\": {\"lr_range_test_min_lr\": "
           "1e-5, \"lr_range_test_step_size\": 10, \"lr_range_test_step_rate\": 2.5, "
           "\"lr_range_test_staircase\": true}}}", 1, &c)) {
        CHECK_NEAR(s->lr_range_test_min_lr, 1e-5);
        CHECK(s->lr_range_test_step_size == 10 && s->lr_range_test_staircase);
        CHECK_NEAR(s->lr_range_test_step_rate, 2.5);
    }
    ERR("{" B "\"scheduler\": {\"type\": \"warmuplr\", \"params\": {}}}", 1, ZT_ERR_INVALID,
        "ds.json: unknown scheduler type 'warmuplr'; did you mean 'WarmupLR'? (names are case-sensitive)");
    ERR_PREFIX("{" B "\"scheduler\": {\"type\": \"StepLR\"}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: scheduler type 'StepLR' (torch.optim.lr_scheduler) is not supported");
    ERR_PREFIX("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"last_batch_iteration\": 5}}}",
               1, ZT_ERR_UNSUPPORTED, "ds.json: key 'scheduler.params.last_batch_iteration' 5 is not supported");
}

/* The keys of features DeepSpeed 0.19 removed are refused whatever their value, null and a
 * disabled section too, before anything else is read (its _reject_removed_config_keys); the
 * zero_optimization ones only when that section is an object. */
static void test_removed_keys(void) {
    zt_ds_config c;
    static const char *const top[] = {"amp", "nebula", "elasticity", "sparse_attention",
                                      "progressive_layer_drop", "curriculum_learning",
                                      "compression_training", "quantize_training", "eigenvalue",
                                      "sparse_gradients", "graph_harvesting"};
    static const char *const values[] = {"null", "{}", "{\"enabled\": false}", "false"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            char json[256], want[128];
            /* An impossible batch size: the removed key is refused before the batch is read. */
            snprintf(json, sizeof json, "{\"train_batch_size\": -1, \"%s\": %s}", top[i],
                     values[v]);
            snprintf(want, sizeof want, "ds.json: %s: removed from DeepSpeed 0.19", top[i]);
            ERR_PREFIX(json, 1, ZT_ERR_INVALID, want);
            CHECK(strcmp(zt_last_error_field(), top[i]) == 0, "%s", zt_last_error_field());
        }
    static const char *const zero[] = {"mics_shard_size", "mics_hierarchical_params_gather",
                                       "zeropp_loco_param"};
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++) {
        char json[256], want[128], field[96];
        snprintf(json, sizeof json, "{" B "\"zero_optimization\": {\"stage\": 1, \"%s\": null}}",
                 zero[i]);
        snprintf(want, sizeof want, "ds.json: zero_optimization.%s: removed from DeepSpeed 0.19",
                 zero[i]);
        snprintf(field, sizeof field, "zero_optimization.%s", zero[i]);
        ERR_PREFIX(json, 1, ZT_ERR_INVALID, want);
        CHECK(strcmp(zt_last_error_field(), field) == 0, "%s", zt_last_error_field());
    }
    OK("{" B "\"zero_optimization\": true}", 1, &c);
}

/* JSON null as DeepSpeed 0.19 reads it (DeepSpeedConfig, its pydantic models, and the engine's
 * Class(optimizer, **params) for the schedule, each run on these configs): where DeepSpeed fails,
 * the key is refused by name; where it reads None as its default, the default applies. */
static void test_nulls(void) {
    zt_ds_config c;
    static const char *const crash[] = {"optimizer", "scheduler", "fp16", "zero_optimization",
                                        "activation_checkpointing", "tensorboard",
                                        "gradient_clipping", "wall_clock_breakdown", "bfloat16",
                                        "pipeline", "data_types", "gradient_allreduce_op"};
    for (size_t i = 0; i < sizeof crash / sizeof crash[0]; i++) {
        char json[256], want[128];
        snprintf(json, sizeof json, "{" B "\"%s\": null}", crash[i]);
        snprintf(want, sizeof want, "ds.json: key '%s' must not be null (", crash[i]);
        ERR_PREFIX(json, 1, ZT_ERR_INVALID, want);
        CHECK(strcmp(zt_last_error_field(), crash[i]) == 0);
    }
    /* Inside a section: checkpoint.parallel_write, read with .get. */
    ERR("{" B "\"checkpoint\": {\"parallel_write\": null}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'checkpoint.parallel_write' must not be null (DeepSpeedConfig fails: "
        "'NoneType' object has no attribute 'get')");
    CHECK(strcmp(zt_last_error_field(), "checkpoint.parallel_write") == 0, "%s",
          zt_last_error_field());
    /* The pydantic models refuse None except at their Optional fields. */
    ERR_PREFIX("{" B "\"fp16\": {\"enabled\": true, \"loss_scale_window\": null}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'fp16.loss_scale_window' must not be null (DeepSpeed's DeepSpeedFP16Config");
    ERR_PREFIX("{" B "\"zero_optimization\": {\"stage\": null}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'zero_optimization.stage' must not be null");
    ERR_PREFIX("{" B "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": null}}}",
               1, ZT_ERR_INVALID, "ds.json: key 'zero_optimization.offload_optimizer.device' must not be null");
    OK("{" B "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": null, \"overlap_comm\": null}}",
       1, &c);
    /* Read as absent by DeepSpeed too: the batch keys, steps_per_print, bf16, optimizer.params. */
    TRIPLE("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": null}", 2, 8, 4, 1);
    if (OK("{" B "\"bf16\": null, \"steps_per_print\": null, \"optimizer\": {\"type\": \"AdamW\", "
           "\"params\": null}}", 1, &c))
        CHECK(!c.bf16.enabled && c.steps_per_print == 0 && c.has_optimizer);
    /* Optimizer parameters go to the constructor as None: a number fails there or at the first
     * step (FusedAdam, torch.optim.SGD, DeepSpeedCPUAdam); bias_correction and adam_w_mode,
     * true when left out, are tested for truth and so turn off; the switches that default to
     * false (torch_adam, amsgrad, nesterov) read None as their default. */
    static const char *const numbers[] = {"lr", "betas", "eps", "weight_decay"};
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        char json[256], want[160];
        snprintf(json, sizeof json, "{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": "
                 "{\"%s\": null}}}", numbers[i]);
        snprintf(want, sizeof want, "ds.json: key 'optimizer.params.%s' must not be null "
                 "(DeepSpeed hands None to the optimizer, which fails on it", numbers[i]);
        ERR_PREFIX(json, 1, ZT_ERR_INVALID, want);
    }
    ERR_PREFIX("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, "
               "\"momentum\": null}}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'optimizer.params.momentum' must not be null");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"bias_correction\": null}}}", 1,
        ZT_ERR_INVALID, "ds.json: key 'optimizer.params.bias_correction' must not be null "
        "(DeepSpeed reads None there as false, and the key left out as true: write false or true)");
    ERR_PREFIX("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": null}}}",
               1, ZT_ERR_INVALID, "ds.json: key 'optimizer.params.adam_w_mode' must not be null");
    if (OK("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": null, "
           "\"amsgrad\": null}}}", 1, &c))
        CHECK(!c.optimizer.torch_adam && c.optimizer.adam_w_mode && c.optimizer.bias_correction);
    /* A null scheduler type is DeepSpeed's "no scheduler". */
    if (OK("{" B "\"scheduler\": {\"type\": null, \"params\": {}}}", 1, &c))
        CHECK(c.scheduler.type == ZT_SCHED_NONE);
    /* Scheduler parameters: None fails in the constructors' checks and arithmetic, except where
     * None is the default or only tested for truth. */
    ERR_PREFIX("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": null}}}", 1,
               ZT_ERR_INVALID, "ds.json: key 'scheduler.params.warmup_num_steps' must not be null");
    ERR_PREFIX("{" B "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": null}}}",
               1, ZT_ERR_INVALID, "ds.json: key 'scheduler.params.total_num_steps' must not be null");
    if (OK("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0.001, "
           "\"cycle_max_lr\": 0.01, \"cycle_first_step_size\": 2, \"cycle_second_step_size\": null, "
           "\"cycle_momentum\": null}}}", 1, &c))
        CHECK(c.scheduler.cycle_second_step_size == 2 && !c.scheduler.cycle_momentum);
    /* WarmupDecayLR hands a null warmup_max_lr to WarmupLR, which takes the optimizer's lr. */
    if (OK("{" B ADAM6 "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": "
           "10, \"warmup_max_lr\": null}}}", 1, &c))
        CHECK_NEAR(c.scheduler.warmup_max_lr, 6e-4);
}

/* The field a refusal is about (zt_last_error_field), which the service hands on as the
 * BadRequest field: the exact key path, also where the text is DeepSpeed's own. */
static void field_at(int line, const char *json, const char *want) {
    zt_ds_config cfg;
    zt_status s = zt_ds_config_parse(&cfg, json, "ds.json", 1);
    check_at(__FILE__, line, s != ZT_OK && strcmp(zt_last_error_field(), want) == 0,
             "field '%s', want '%s' (%s)", zt_last_error_field(), want, zt_last_error());
}
#define FIELD(json, want) field_at(__LINE__, json, want)

static void test_error_fields(void) {
    zt_ds_config c;
    FIELD("{" B "\"timers\": {\"throughput\": {\"synchronized\": \"x\"}}}",
          "timers.throughput.synchronized");
    FIELD("{" B "\"optimizer\": {\"type\": \"OneBitLamb\"}}", "optimizer.type");
    FIELD("{" B "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 0}}}",
          "scheduler.params.warmup_num_steps");
    FIELD("{" B "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0, "
          "\"cycle_max_lr\": 1, \"cycle_first_step_size\": -1}}}", "scheduler.params.cycle_first_step_size");
    FIELD("{" B "\"scheduler\": {\"type\": \"WarmLR\", \"params\": {}}}", "scheduler.type");
    FIELD("{" B "\"fp16\": {\"enabled\": true, \"min_loss_scale\": 0}}", "fp16.min_loss_scale");
    /* Refused at ZeRO stages 1-3 only (at stage 0 DeepSpeed's FP16_Optimizer does not read it). */
    FIELD("{" B "\"zero_optimization\": {\"stage\": 1}, \"fp16\": {\"enabled\": true, "
          "\"hysteresis\": 0}}", "fp16.hysteresis");
    FIELD("{" B "\"fp16\": {\"enabled\": true, \"loss_scale_window\": 0}}", "fp16.loss_scale_window");
    /* DeepSpeed's loss * 2**64 (a Python int) is torch's OverflowError at the first backward;
     * 2**63 converts, as does any power with a static scale or fp16 off. As a double 2**1024 is
     * inf, which halving never lowers: every step would be skipped. */
    FIELD("{" B "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 1024}}",
          "fp16.initial_scale_power");
    ERR("{" B "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 64}}", 1, ZT_ERR_INVALID,
        "ds.json: fp16.initial_scale_power must be at most 63, got 64 (DeepSpeed's loss * 2**64 "
        "fails at the first backward: OverflowError: int too big to convert)");
    if (OK("{" B "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 63}}", 1, &c))
        CHECK(c.fp16.initial_scale_power == 63);
    if (OK("{" B "\"fp16\": {\"enabled\": true, \"loss_scale\": 8, \"initial_scale_power\": 1024}}",
           1, &c))
        CHECK(c.fp16.loss_scale == 8);
    FIELD("{" B "\"fp16\": {\"enabled\": true, \"loss_scale\": -1}}", "fp16.loss_scale");
    FIELD("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 1.5]}}}",
          "optimizer.params.betas");
    FIELD("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": -1}}}", "optimizer.params.lr");
    FIELD("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"eps\": -1}}}", "optimizer.params.eps");
    FIELD("{" B "\"optimizer\": {\"type\": \"Adamm\", \"params\": {}}}", "optimizer.type");
    FIELD("{" B "\"optimizer\": {\"type\": \"Adadelta\", \"params\": {}}}", "optimizer.type");
    FIELD("{" B "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"nesterov\": true}}}",
          "optimizer.params.nesterov");
    FIELD("{" B "\"optimizer\": {\"type\": \"Lamb\", \"params\": {}}, \"zero_optimization\": "
          "{\"stage\": 1}}", "zero_allow_untested_optimizer");
}

static void test_malformed(void) {
    ERR("{\n  \"train_batch_size\": 8\n  \"gradient_accumulation_steps\": 1\n}", 1, ZT_ERR_FORMAT,
        "ds.json: line 3, column 3: Expecting ',' delimiter");
    ERR("{\"train_batch_size\": 8,}", 1, ZT_ERR_FORMAT,
        "ds.json: line 1, column 23: Illegal trailing comma before end of object");
    ERR("{\"a\": [1, 2,\n   ]}", 1, ZT_ERR_FORMAT,
        "ds.json: line 1, column 12: Illegal trailing comma before end of array");
    ERR("{\n  // the batch\n  \"train_batch_size\": 8\n}", 1, ZT_ERR_FORMAT,
        "ds.json: line 2, column 3: Expecting property name enclosed in double quotes (comments are "
        "not allowed in JSON)");
    ERR("{'train_batch_size': 8}", 1, ZT_ERR_FORMAT,
        "ds.json: line 1, column 2: Expecting property name enclosed in double quotes (JSON strings "
        "take double quotes)");
    ERR("", 1, ZT_ERR_FORMAT, "ds.json: line 1, column 1: Expecting value (the text ends here)");
    ERR("{\"train_batch_size\": 8", 1, ZT_ERR_FORMAT,
        "ds.json: line 1, column 23: Expecting ',' delimiter (the text ends here)");
    /* Columns count characters: "é" is one column though two bytes. */
    ERR("{\"\xc3\xa9\": 1 x}", 1, ZT_ERR_FORMAT, "ds.json: line 1, column 9: Expecting ',' delimiter");
    ERR("{\"a\": 01}", 1, ZT_ERR_FORMAT,
        "ds.json: line 1, column 7: Invalid number (leading zeros are not allowed)");
    ERR("{\"a\": tru}", 1, ZT_ERR_FORMAT, "ds.json: line 1, column 7: Expecting value");
    ERR("{\"a\": \"x\ny\"}", 1, ZT_ERR_FORMAT, "ds.json: line 1, column 9: Invalid control character in string");
    ERR("{\"a\": \"abc}", 1, ZT_ERR_FORMAT, "ds.json: line 1, column 7: Unterminated string starting here");
    ERR("{\"a\" 1}", 1, ZT_ERR_FORMAT, "ds.json: line 1, column 6: Expecting ':' delimiter");
    ERR("{\"train_batch_size\": 8} {}", 1, ZT_ERR_FORMAT,
        "ds.json: line 1, column 25: Extra data after the JSON value");
    ERR("[1, 2]", 1, ZT_ERR_INVALID, "ds.json: a DeepSpeed config must be a JSON object, got [1,2]");
}

static void test_keys_and_types(void) {
    ERR("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3, "
        "\"lr\": 2e-3}}}", 1, ZT_ERR_INVALID,
        "ds.json: Duplicate keys in DeepSpeed config: ['lr'] (in optimizer.params)");
    ERR("{\"train_batch_size\": 8, \"train_batch_size\": 16}", 1, ZT_ERR_INVALID,
        "ds.json: Duplicate keys in DeepSpeed config: ['train_batch_size'] (in the top-level object)");
    ERR_PREFIX("{" B "\"zero_optimization\": {\"stag\": 1}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown key 'stag' in zero_optimization (did you mean 'stage'?); allowed keys: "
               "stage, reduce_bucket_size,");
    ERR_PREFIX("{" B "\"zero_optimization\": {\"offload_optimizer\": {\"devices\": \"cpu\"}}}", 1,
               ZT_ERR_INVALID,
               "ds.json: unknown key 'devices' in zero_optimization.offload_optimizer (did you mean 'device'?)");
    ERR_PREFIX("{" B "\"fp16\": {\"enabled\": false, \"loss_scal\": 0}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown key 'loss_scal' in fp16 (did you mean 'loss_scale'?); allowed keys: enabled,");
    ERR_PREFIX("{" B "\"bf16\": {\"enable\": true}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown key 'enable' in bf16 (did you mean 'enabled'?)");
    ERR("{" B "\"zero_optimization\": {\"stage\": 4}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.stage' must be 0, 1, 2 or 3, got 4");
    ERR("{" B "\"zero_optimization\": {\"stage\": \"2.5\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.stage' must be an integer, got \"2.5\"");
    ERR("{" B "\"zero_optimization\": {\"overlap_comm\": 2}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.overlap_comm' must be true or false, got 2");
    ERR("{" B "\"zero_optimization\": {\"reduce_bucket_size\": -1}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.reduce_bucket_size' must be >= 1, got -1");
    ERR("{" B "\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"gpu\"}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.offload_optimizer.device' must be \"none\", \"cpu\" or \"nvme\", "
        "got \"gpu\"");
    ERR("{" B "\"zero_optimization\": {\"offload_optimizer\": {\"ratio\": 1.5}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.offload_optimizer.ratio' must be between 0 and 1, got 1.5");
    ERR("{" B "\"zero_optimization\": {\"offload_optimizer\": {\"ratio\": 0.5}}}", 1, ZT_ERR_INVALID,
        "ds.json: Partial offloading only supported for ZeRO Stage 3.");
    ERR("{" B "\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.offload_optimizer.nvme_path' is required when device is \"nvme\"");
    ERR("{" B "\"zero_optimization\": {\"cpu_offload\": true, \"offload_optimizer\": {\"device\": \"cpu\"}}}",
        1, ZT_ERR_INVALID,
        "ds.json: Cannot provide deprecated parameter 'cpu_offload' and replacing parameter "
        "'offload_optimizer' together");
    ERR("{" B "\"zero_optimization\": 3}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization' must be an object, got 3");
    ERR("{" B "\"gradient_clipping\": \"1.0\"}", 1, ZT_ERR_INVALID,
        "ds.json: key 'gradient_clipping' must be a number, got \"1.0\"");
    ERR("{" B "\"steps_per_print\": \"5\"}", 1, ZT_ERR_INVALID,
        "ds.json: key 'steps_per_print' must be an integer, got \"5\"");
    ERR("{" B "\"fp16\": {\"enabled\": \"maybe\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'fp16.enabled' must be true or false, got \"maybe\"");
    ERR("{" B "\"fp16\": {\"loss_scale\": -2}}", 1, ZT_ERR_INVALID,
        "ds.json: fp16.loss_scale must be >= 0 (0 enables dynamic loss scaling)");
    ERR("{" B "\"communication_data_type\": \"fp8\"}", 1, ZT_ERR_INVALID,
        "ds.json: Invalid communication_data_type. Supported data types: ['fp16', 'bf16', 'fp32']. Got: fp8");
    ERR("{" B "\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", 1, ZT_ERR_INVALID,
        "ds.json: bfloat16 and fp16 modes cannot be simultaneously enabled");
    ERR("{" B "\"fp16\": {\"enabled\": true}, \"bfloat16\": {\"enabled\": true}}", 1, ZT_ERR_INVALID,
        "ds.json: bfloat16 and fp16 modes cannot be simultaneously enabled");
    ERR("{" B "\"fp16\": {\"fp16_master_weights_and_grads\": true}}", 1, ZT_ERR_INVALID,
        "ds.json: Fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3.");
    ERR_PREFIX("{" B "\"data_types\": {\"grad_accum_dtype\": \"fp64\"}}", 1, ZT_ERR_INVALID,
               "ds.json: key 'data_types.grad_accum_dtype' must be");
    /* keep_in_fp32_modules: "auto" or a list of name patterns, as DeepSpeed 0.19's
     * DeepSpeedConfig checks it (null is refused there too: it is not the "auto" default). */
    zt_ds_config c;
    OK("{" B "\"data_types\": {\"keep_in_fp32_modules\": \"auto\"}}", 1, &c);
    OK("{" B "\"data_types\": {\"keep_in_fp32_modules\": []}}", 1, &c);
    OK("{" B "\"data_types\": {\"keep_in_fp32_modules\": [\"*.bias\", \"e_score\"]}}", 1, &c);
    const char *bad_keep[] = {"null", "\"x\"", "[1]", "{}", "true", "[\"a\", null]"};
    for (size_t i = 0; i < sizeof bad_keep / sizeof *bad_keep; i++) {
        char json[256];
        snprintf(json, sizeof json, "{" B "\"data_types\": {\"keep_in_fp32_modules\": %s}}",
                 bad_keep[i]);
        ERR_PREFIX(json, 1, ZT_ERR_INVALID, "ds.json: key 'data_types.keep_in_fp32_modules' must "
                   "be \"auto\" or a list of name patterns");
    }
}

/* Values DeepSpeed 0.19 takes as they are: gradient_clipping and steps_per_print are read with
 * dict.get (config.py get_scalar_param) and used as `clip > 0` (every optimizer) and
 * `(step + 1) % steps_per_print == 0`; fp16.min_loss_scale is a Python int. The pydantic
 * models (zero_optimization, fp16, bf16) convert strings and 0/1 as pydantic's lax mode does
 * (int "2", " 3 ", "2_000", "2.0"; float "128", "1e3"; bool "true", "yes", "off", 1, 0), except
 * where DeepSpeed's own validators call int()/float() first; dict.get keys convert nothing. */
static void test_lax_values(void) {
    zt_ds_config c;
    if (OK("{" B "\"gradient_clipping\": -1, \"steps_per_print\": -5}", 1, &c))
        CHECK(c.gradient_clipping == -1 && c.steps_per_print == 5);
    if (OK("{" B "\"fp16\": {\"enabled\": true, \"min_loss_scale\": 137438953472}}", 1, &c))
        CHECK(c.fp16.min_loss_scale == 137438953472.0);
    if (OK("{" B "\"zero_optimization\": {\"stage\": \"2\", \"reduce_bucket_size\": \"500\", "
           "\"allgather_bucket_size\": \" 2_000 \", \"overlap_comm\": \"off\", "
           "\"contiguous_gradients\": 1}, "
           "\"fp16\": {\"enabled\": \"yes\", \"loss_scale\": \"128\"}}", 1, &c)) {
        CHECK(c.zero.stage == 2 && c.zero.reduce_bucket_size == 500);
        CHECK(c.zero.allgather_bucket_size == 2000 && !c.zero.overlap_comm);
        CHECK(c.zero.contiguous_gradients);
        CHECK(c.fp16.enabled && c.fp16.loss_scale == 128);
    }
    if (OK("{" B "\"zero_optimization\": {\"stage\": \"3.0\", \"offload_optimizer\": "
           "{\"device\": \"cpu\", \"pin_memory\": \"False\"}}, \"bf16\": {\"enabled\": \"t\"}}",
           1, &c)) {
        CHECK(c.zero.stage == 3 && !c.zero.offload_optimizer.pin_memory);
        CHECK(c.bf16.enabled);
    }
    if (OK("{" B "\"fp16\": {\"enabled\": true, \"loss_scale\": \" 1e3 \", "
           "\"loss_scale_window\": \"100\"}}", 1, &c))
        CHECK(c.fp16.loss_scale == 1000 && c.fp16.loss_scale_window == 100);
    ERR("{" B "\"zero_optimization\": {\"stage\": \"2_\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.stage' must be an integer, got \"2_\"");
    ERR("{" B "\"zero_optimization\": {\"reduce_bucket_size\": \"0x10\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.reduce_bucket_size' must be an integer, got \"0x10\"");
    /* DeepSpeed's validators: int(v) refuses "2.0", float(v) a bool, and no inf. */
    ERR("{" B "\"fp16\": {\"enabled\": true, \"min_loss_scale\": \"2.0\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'fp16.min_loss_scale' must be an integer, got \"2.0\"");
    ERR("{" B "\"fp16\": {\"loss_scale\": \"inf\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'fp16.loss_scale' must be a number, got \"inf\"");
    ERR("{" B "\"fp16\": {\"loss_scale\": true}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'fp16.loss_scale' must be a number, got true");
    /* _reject_non_integer_scale_params refuses a bool for loss_scale_window as for
     * min_loss_scale, with fp16 on or off, where pydantic alone would take true as 1; hysteresis
     * has no such validator, so true is 1 there. */
    ERR("{" B "\"fp16\": {\"enabled\": true, \"loss_scale_window\": true}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'fp16.loss_scale_window' must be an integer, got true");
    ERR("{" B "\"fp16\": {\"loss_scale_window\": false}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'fp16.loss_scale_window' must be an integer, got false");
    ERR("{" B "\"fp16\": {\"enabled\": true, \"min_loss_scale\": true}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'fp16.min_loss_scale' must be an integer, got true");
    if (OK("{" B "\"fp16\": {\"enabled\": true, \"hysteresis\": true, "
           "\"loss_scale_window\": \" 1_0 \"}}", 1, &c))
        CHECK(c.fp16.hysteresis == 1 && c.fp16.loss_scale_window == 10);
    /* Read with dict.get: a string stays a string, which DeepSpeed compares with a number. */
    ERR("{" B "\"gradient_clipping\": \"2\"}", 1, ZT_ERR_INVALID,
        "ds.json: key 'gradient_clipping' must be a number, got \"2\"");
    ERR("{" B "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": \"0.1\"}}}", 1,
        ZT_ERR_INVALID, "ds.json: key 'optimizer.params.lr' must be a number, got \"0.1\"");
}

static void test_gates(void) {
    zt_ds_config c;
    OK("{" B "\"zero_optimization\": {\"stage\": 2}}", 1, &c);
    CHECK(c.zero.stage == 2);
    OK("{" B "\"zero_optimization\": true}", 1, &c);
    CHECK(c.zero.stage == 1);
    ERR("{" B "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 0}}", 1,
        ZT_ERR_INVALID, "ds.json: key 'zero_optimization.reduce_bucket_size' must be >= 1, got 0");
    /* DeepSpeedZeroConfig: reduce_bucket_size gt=0, allgather_bucket_size ge=0. */
    if (OK("{" B "\"zero_optimization\": {\"stage\": 2, \"allgather_bucket_size\": 0}}", 1, &c))
        CHECK(c.zero.allgather_bucket_size == 0);
    ERR("{" B "\"zero_optimization\": {\"stage\": 1, \"allgather_bucket_size\": -2}}", 1,
        ZT_ERR_INVALID, "ds.json: key 'zero_optimization.allgather_bucket_size' must be >= 0, got -2");
    OK("{" B "\"zero_optimization\": false}", 1, &c);
    OK("{" B "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}}", 1, &c);
    CHECK(c.fp16.enabled && c.fp16.initial_scale_power == 8 && c.fp16.hysteresis == 2 &&
          c.fp16.loss_scale_window == 1000);
    /* Only the ZeRO scaler (DynamicLossScaler) reads hysteresis; FP16_Optimizer does not. */
    if (OK("{" B "\"fp16\": {\"enabled\": true, \"hysteresis\": 0}}", 1, &c))
        CHECK(c.fp16.hysteresis == 0);
    ERR("{" B "\"zero_optimization\": {\"stage\": 2}, \"fp16\": {\"enabled\": true, "
        "\"hysteresis\": 0}}", 1, ZT_ERR_INVALID,
        "ds.json: fp16.hysteresis must be greater than 0 at ZeRO stage 2, got 0 (DeepSpeed accepts "
        "it, but its dynamic loss scaler would then never lower the scale, and every step after "
        "an overflow would be skipped)");
    OK("{" B "\"bf16\": {\"enabled\": true}}", 1, &c);
    CHECK(c.bf16.enabled && c.bf16.check_grad_overflow);
    OK("{" B "\"bfloat16\": {\"enabled\": true}}", 1, &c);
    CHECK(c.bf16.enabled);
    /* Offload runs: the sections are read as DeepSpeed reads them. */
    OK("{" B "\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}}",
       1, &c);
    CHECK(c.zero.offload_optimizer.device == ZT_OFFLOAD_CPU && c.zero.offload_optimizer.pin_memory);
    OK("{" B "\"zero_optimization\": {\"cpu_offload\": true}}", 1, &c);
    CHECK(c.zero.offload_optimizer.device == ZT_OFFLOAD_CPU);
    OK("{" B "\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 65536, "
       "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/local_nvme\", "
       "\"buffer_count\": 2, \"pipeline_read\": true, \"pipeline_write\": true, \"ratio\": 0.5}, "
       "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/p\", \"max_in_cpu\": 1e9}}}",
       1, &c);
    CHECK(c.zero.offload_optimizer.device == ZT_OFFLOAD_NVME && c.zero.offload_param.device == ZT_OFFLOAD_NVME);
    CHECK(strcmp(c.zero.offload_optimizer.nvme_path, "/local_nvme") == 0);
    CHECK(strcmp(c.zero.offload_param.nvme_path, "/p") == 0);
    CHECK(c.zero.offload_optimizer.buffer_count == 2 && c.zero.offload_optimizer.pipeline_read &&
          c.zero.offload_optimizer.pipeline_write && c.zero.sub_group_size == 65536);
    CHECK_NEAR(c.zero.offload_optimizer.ratio, 0.5);
    ERR("{" B "\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\", "
        "\"nvme_path\": \"/x\", \"buffer_count\": 0}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'zero_optimization.offload_optimizer.buffer_count' must be at least 1 when "
        "device is \"nvme\", got 0");
    /* sub_group_size is the offloaded update's tile, from host memory as from files: warned
     * only where nothing is offloaded. */
    OK("{" B "\"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 4096, "
       "\"offload_optimizer\": {\"device\": \"cpu\"}}}", 1, &c);
    CHECK(c.zero.sub_group_size == 4096 && strcmp(c.warnings, "") == 0, "%s", c.warnings);
    OK("{" B "\"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 4096}}", 1, &c);
    CHECK(strcmp(c.warnings, "ztrain: warning: ds.json: zero_optimization.sub_group_size has no "
                 "effect without offload_optimizer or offload_param\n") == 0, "%s", c.warnings);
    /* data_types.grad_accum_dtype as DeepSpeed's _do_optimizer_sanity_check takes it (engine.py):
     * the training type always (its default); fp32 under bf16/fp16 with ZeRO, added up in fp32
     * without a warning; without ZeRO any other mix is its NotImplementedError, refused by name. */
    OK("{" B "\"data_types\": {\"grad_accum_dtype\": \"fp32\"}}", 1, &c);
    CHECK(strcmp(c.warnings, "") == 0 && zt_ds_grad_accum_dtype(&c) == ZT_F32, "%s", c.warnings);
    OK("{" B "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, "
       "\"data_types\": {\"grad_accum_dtype\": \"float32\"}}", 1, &c);
    CHECK(strcmp(c.warnings, "") == 0 && zt_ds_grad_accum_dtype(&c) == ZT_F32, "%s", c.warnings);
    OK("{" B "\"fp16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3}, "
       "\"data_types\": {\"grad_accum_dtype\": \"fp32\"}}", 1, &c);
    CHECK(zt_ds_grad_accum_dtype(&c) == ZT_F32);
    OK("{" B "\"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": \"bf16\"}}",
       1, &c);
    CHECK(zt_ds_grad_accum_dtype(&c) == ZT_BF16);
    OK("{" B "\"fp16\": {\"enabled\": true}}", 1, &c);
    CHECK(zt_ds_grad_accum_dtype(&c) == ZT_F16);
    ERR_PREFIX("{" B "\"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": "
               "\"fp32\"}}", 1, ZT_ERR_INVALID,
               "ds.json: data_types.grad_accum_dtype \"fp32\" with bf16 training needs ZeRO stage "
               "1-3 (DeepSpeed: unsupported mix of model_dtype=torch.bfloat16 and "
               "grad_accum_dtype=torch.float32)");
    ERR_PREFIX("{" B "\"data_types\": {\"grad_accum_dtype\": \"fp16\"}}", 1, ZT_ERR_INVALID,
               "ds.json: data_types.grad_accum_dtype \"fp16\" with fp32 training needs ZeRO");
    ERR_PREFIX("{" B "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}, "
               "\"data_types\": {\"grad_accum_dtype\": \"fp16\"}}", 1, ZT_ERR_UNSUPPORTED,
               "ds.json: data_types.grad_accum_dtype \"fp16\" with bf16 training is not supported");
    OK("{" B "\"communication_data_type\": \"bf16\"}", 1, &c);
    CHECK(strcmp(c.communication_data_type, "bf16") == 0);
    ERR_PREFIX("{" B "\"amp\": {\"enabled\": true}}", 1, ZT_ERR_INVALID,
               "ds.json: amp: removed from DeepSpeed 0.19, which refuses the key whatever its value: "
               "its Apex AMP integration");
    /* DeepSpeed's checkpointing.py splits each checkpointed activation into mp_size pieces (the
     * tensor-parallel group's size, 1 without one); ztrain keeps each rank's block inputs whole.
     * The one warning line gives that reason, which holds with and without tensor parallelism. */
    static const char *const pa_json[] = {
        "{" B "\"activation_checkpointing\": {\"partition_activations\": true}}",
        "{\"train_batch_size\": 4, \"tensor_parallel\": {\"autotp_size\": 2}, "
        "\"activation_checkpointing\": {\"partition_activations\": true}}"};
    for (int i = 0; i < 2; i++) {
        OK(pa_json[i], 1 + i, &c);
        CHECK(strcmp(c.warnings, "ztrain: warning: ds.json: activation_checkpointing."
                     "partition_activations has no effect: ztrain keeps each rank's checkpointed "
                     "block inputs whole, tensor-parallel or not, where DeepSpeed splits them "
                     "across the tensor-parallel ranks (without tensor parallelism it does "
                     "nothing in DeepSpeed either)\n") == 0, "%s", c.warnings);
        CHECK(!strstr(c.warnings, "has no effect: without tensor parallelism"), "%s", c.warnings);
    }
    OK("{\"train_batch_size\": 4, \"tensor_parallel\": {\"autotp_size\": 2}, "
       "\"activation_checkpointing\": {\"number_checkpoints\": 4}}", 2, &c);
    CHECK(strstr(c.warnings, "number_checkpoints has no effect") &&
          !strstr(c.warnings, "need tensor parallelism"), "%s", c.warnings);
    /* Accepted sections at their defaults, and the stage-3 default of overlap_comm is computed
     * before the gate refuses stage 3. */
    OK("{" B "\"tensorboard\": {\"enabled\": false}, \"wandb\": {\"enabled\": false}, "
       "\"activation_checkpointing\": {\"partition_activations\": false, \"number_checkpoints\": null}, "
       "\"checkpoint\": {\"tag_validation\": \"Warn\"}, \"flops_profiler\": {\"enabled\": false}, "
       "\"zero_allow_untested_optimizer\": true, \"data_types\": {\"grad_accum_dtype\": \"fp32\"}}", 1, &c);
    /* A validation error is reported before the "not supported yet" gate. */
    ERR_PREFIX("{" B "\"zero_optimization\": {\"stage\": 2, \"bogus\": 1}}", 1, ZT_ERR_INVALID,
               "ds.json: unknown key 'bogus' in zero_optimization");
}

static void test_files(void) {
    zt_ds_config c;
    zt_status s = zt_ds_config_load(&c, "no/such/dir/ds.json", 1);
    CHECK(s == ZT_ERR_IO);
    CHECK(strcmp(zt_last_error(), "no/such/dir/ds.json: cannot open: No such file or directory") == 0);

    char path[] = "/tmp/zt_ds_config_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    const char *text = "{\n  \"train_micro_batch_size_per_gpu\": 4,\n  \"gradient_accumulation_steps\": 2\n}\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    if (zt_ds_config_load(&c, path, 2) == ZT_OK)
        CHECK(c.train_batch_size == 16 && c.train_micro_batch_size_per_gpu == 4);
    else
        CHECK(!"loading a valid file failed");
    unlink(path);
}

/* The checkpoint section has no effect in ztrain, but DeepSpeedConfig checks some of its values
 * (config.py get_checkpoint_tag_validation_mode, get_checkpoint_parallel_write_pipeline;
 * model_checkpointing/config.py): tag_validation upper-cased in WARN/IGNORE/FAIL, a string (null
 * fails at .upper()); parallel_write an object whose pipeline_stage is `in [True, False]` (so 1
 * and 0.0 pass); writer.type in MOCK/PYTHON/FAST and writer.data_parallel in
 * REPLICA/SOCKET/MACHINE, any case, null skipped. */
static void test_checkpoint_values(void) {
    zt_ds_config c;
    OK("{" B "\"checkpoint\": {\"tag_validation\": \"fail\", \"parallel_write\": "
       "{\"pipeline_stage\": 1}, \"writer\": {\"type\": \"Python\", \"data_parallel\": null}}}", 1,
       &c);
    OK("{" B "\"checkpoint\": {\"tag_validation\": \"IGNORE\", \"parallel_write\": "
       "{\"pipeline_stage\": 0.0}, \"writer\": null}}", 1, &c);
    OK("{" B "\"checkpoint\": {\"writer\": {\"type\": null, \"data_parallel\": \"socket\"}}}", 1,
       &c);
    ERR("{" B "\"checkpoint\": {\"tag_validation\": \"Strict\"}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'checkpoint.tag_validation' must be one of 'WARN', 'IGNORE', 'FAIL' (any "
        "case), got \"Strict\"");
    ERR("{" B "\"checkpoint\": {\"tag_validation\": null}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'checkpoint.tag_validation' must be one of 'WARN', 'IGNORE', 'FAIL' (any "
        "case), got null (DeepSpeed fails calling .upper() on it)");
    ERR("{" B "\"checkpoint\": {\"parallel_write\": {\"pipeline_stage\": \"true\"}}}", 1,
        ZT_ERR_INVALID, "ds.json: key 'checkpoint.parallel_write.pipeline_stage' must be true or "
        "false, got \"true\" (DeepSpeed: checkpoint::parallel_write::pipeline_stage value is "
        "invalid)");
    ERR("{" B "\"checkpoint\": {\"parallel_write\": {\"pipeline_stage\": 2}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'checkpoint.parallel_write.pipeline_stage' must be true or false, got 2 "
        "(DeepSpeed: checkpoint::parallel_write::pipeline_stage value is invalid)");
    ERR("{" B "\"checkpoint\": {\"writer\": {\"type\": \"torch\"}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'checkpoint.writer.type' must be one of 'MOCK', 'PYTHON', 'FAST' (any case), "
        "got \"torch\"");
    ERR("{" B "\"checkpoint\": {\"writer\": {\"data_parallel\": \"node\"}}}", 1, ZT_ERR_INVALID,
        "ds.json: key 'checkpoint.writer.data_parallel' must be one of 'REPLICA', 'SOCKET', "
        "'MACHINE' (any case), got \"node\"");
    FIELD("{" B "\"checkpoint\": {\"tag_validation\": \"x\"}}", "checkpoint.tag_validation");
}

int main(void) {
    test_batch();
    test_defaults();
    test_optimizer();
    test_adam_classes();
    test_lax_values();
    test_lamb_family();
    test_monitor();
    test_scheduler();
    test_long_schedules();
    test_nulls();
    test_removed_keys();
    test_error_fields();
    test_malformed();
    test_keys_and_types();
    test_gates();
    test_checkpoint_values();
    test_files();
    return check_summary("test_ds_config");
}
