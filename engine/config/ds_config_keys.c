/* Every key of a DeepSpeed config that ztrain knows, each with its fate: honoured, warned as
 * without effect, or refused. The table is the parser's key list: every section's unknown keys
 * are judged against it, the generic fates (a warning or a refusal when a key is set away from
 * DeepSpeed's default) are applied from it, and `ztrain config-keys` prints it as the table of
 * docs/deepspeed.md. Rows are sorted by section so that branches adding keys merge row by row. */
#include <stdio.h>
#include <string.h>

#include "ds_config_internal.h"

#define H ZT_DS_KEY_HONOURED
#define W ZT_DS_KEY_WARNED
#define R ZT_DS_KEY_REFUSED
#define SEC ZT_DS_KEY_SECTION
#define OPAQUE (ZT_DS_KEY_SECTION | ZT_DS_KEY_OPAQUE)
#define HAND ZT_DS_KEY_BY_HAND
#define PRESENT ZT_DS_KEY_PRESENCE
/* A removed key is refused by zt_ds_check_removed whatever it holds; only one whose value was an
 * object in DeepSpeed (a "configuration block") is a section, the others were scalars. */
#define REMOVED_LEAF (ZT_DS_KEY_REMOVED | HAND | R)
#define REMOVED (ZT_DS_KEY_SECTION | ZT_DS_KEY_OPAQUE | REMOVED_LEAF)
#define ST123 0xe
#define ST23 0xc
#define ST3 0x8

/* The reasons shared by many rows. */
#define NO_DEVICE "the CPU backend has no device memory to pin or stream to"
#define NO_TP "ztrain has no sequence parallelism"
#define TP_NOTE "ztrain's tensor parallelism is Megatron's layers for its own model families"
#define OWN_LAYOUT "ztrain's gradients live in one flat buffer reduced in fixed chunks"
#define REMOVED_IN_019 "removed from DeepSpeed 0.19, which refuses the key whatever its value: "
#define LAYER_GATHER "ztrain holds at most the layer in use and the one prefetched"

static const zt_ds_key rows[] = {
    /* Top level: the batch triple and scalars. */
    {"train_batch_size", H, 0, NULL, "batch triple, DeepSpeed's inference and assertion"},
    {"train_micro_batch_size_per_gpu", H, 0, NULL, "batch triple"},
    {"gradient_accumulation_steps", H, 0, NULL, "batch triple"},
    {"gradient_clipping", H, 0, "1.0", "global-norm clipping (default 1.0 as in DeepSpeed 0.19)"},
    {"steps_per_print", H, 0, NULL, "DeepSpeed's step line every N steps"},
    {"wall_clock_breakdown", H, 0, "false", "DeepSpeed's timer lines"},
    {"dataloader_drop_last", H, 0, "false", "drops the last partial batch"},
    {"communication_data_type", H, 0, NULL,
     "the precision gradients travel in; a 16-bit type has no effect in fp32 training"},
    {"gradient_allreduce_op", HAND | H, 0, "\"mean\"", "\"mean\" honoured; \"sum\" refused"},
    {"data_types", SEC | H, 0, NULL, "fp32 honoured; 16-bit types refused"},
    {"data_types.grad_accum_dtype", HAND | H, 0, NULL,
     "the training type honoured; fp32 with bf16/fp16 honoured at ZeRO stages 1-3 (the "
     "micro-steps add up in fp32), refused at stage 0 as DeepSpeed refuses it; other mixes "
     "refused"},
    {"data_types.param_dtype", HAND | H, 0, NULL, "fp32 honoured; 16-bit refused"},
    {"data_types.buffer_dtype", HAND | H, 0, NULL, "fp32 honoured; 16-bit refused"},
    {"data_types.keep_in_fp32_modules", HAND | H, 0, "\"auto\"",
     "honoured: ztrain's models hold no buffers in 16 bits"},
    {"prescale_gradients", W, 0, "false", "ztrain averages gradients in fp32 during the reduction"},
    {"gradient_predivide_factor", W, 0, "1.0",
     "ztrain averages gradients in fp32 during the reduction"},
    {"managed_gradient_accumulation", HAND | R, 0, "true",
     "false refused: ztrain's training loop owns the accumulation boundary"},
    {"sequence_parallel_size", HAND | R, 0, "1", "above 1 refused: " NO_TP},
    {"data_parallel_size", HAND | R, 0, NULL, "must equal the job's world_size"},
    {"seq_parallel_communication_data_type", W, 0, "\"fp32\"", "no sequence parallelism: " NO_TP},
    {"dump_state", W, 0, "false", "DeepSpeed's debug dump of its engine state"},
    {"disable_allgather", W, 0, "false", "ztrain always all-gathers updated partitions"},
    {"sparse_gradients", REMOVED_LEAF, 0, NULL,
     REMOVED_IN_019 "sparse gradients of dense embeddings"},
    {"allgather_size", HAND | H, 0, NULL,
     "read with the legacy \"zero_optimization\": true as its allgather bucket"},
    {"zero_allow_untested_optimizer", H, 0, "false",
     "LAMB and SGD at ZeRO stages 1-3 need it, as in DeepSpeed (warned when given)"},
    {"zero_force_ds_cpu_optimizer", W, 0, "true", "ztrain always runs its own CPU optimizer"},
    {"graph_harvesting", REMOVED_LEAF, 0, NULL, REMOVED_IN_019 "graph harvesting"},
    {"memory_breakdown", W, 0, "false",
     "ztrain records each rank's memory in every metric record instead"},
    {"use_data_before_expert_parallelism", W, 0, "false", "no expert parallelism"},
    {"vocabulary_size", W, 0, NULL, "DeepSpeed only warns when it is not a multiple of 8"},
    {"log_level", W, 0, NULL, "ztrain's own messages are not levelled"},

    /* activation_checkpointing: DeepSpeed's settings for the checkpoint() calls of a model; in
     * ztrain the job turns checkpointing on (train.activation_checkpointing, or training_args'
     * gradient_checkpointing) and this section says where the kept inputs go. */
    {"activation_checkpointing", SEC | H, 0, NULL,
     "applies when the job checkpoints activations (train.activation_checkpointing)"},
    {"activation_checkpointing.partition_activations", W, 0, "false",
     "ztrain keeps each rank's checkpointed block inputs whole, tensor-parallel or not, where "
     "DeepSpeed splits them across the tensor-parallel ranks (without tensor parallelism it "
     "does nothing in DeepSpeed either)"},
    {"activation_checkpointing.cpu_checkpointing", H, 0, "false",
     "the kept block inputs live in pinned host memory; warned when the job does not checkpoint"},
    {"activation_checkpointing.contiguous_memory_optimization", W, 0, "false",
     "it packs the pieces partition_activations keeps into preallocated buffers; ztrain keeps "
     "its checkpointed block inputs whole"},
    {"activation_checkpointing.number_checkpoints", W, 0, NULL,
     "it sizes contiguous_memory_optimization's buffers, which ztrain does not make"},
    {"activation_checkpointing.synchronize_checkpoint_boundary", W, 0, "false",
     "a device synchronisation per checkpoint: ztrain's kept inputs are ordered on the compute "
     "stream"},
    {"activation_checkpointing.profile", W, 0, "false",
     "per-checkpoint timers: ztrain times whole steps (perf/* in every record)"},

    /* aio: DeepSpeed's async I/O library for NVMe offload. */
    {"aio", SEC | W, 0, NULL, "ztrain's NVMe offload sizes its own I/O (io_uring or threads)"},
    {"aio.block_size", W, 0, "1048576", "ztrain streams tiles of sub_group_size elements"},
    {"aio.queue_depth", W, 0, "8", "ztrain's I/O depth is buffer_count"},
    {"aio.intra_op_parallelism", W, 0, "1", "ztrain's I/O depth is buffer_count"},
    {"aio.thread_count", W, 0, "1", "ztrain's I/O depth is buffer_count"},
    {"aio.single_submit", W, 0, "false", "ztrain submits each tile's reads together"},
    {"aio.overlap_events", W, 0, "true", "ztrain overlaps through pipeline_read/pipeline_write"},
    {"aio.use_gds", W, 0, "false", "GPUDirect Storage: no device here"},

    {"amp", REMOVED, 0, NULL, REMOVED_IN_019 "its Apex AMP integration: use bf16 or fp16"},

    {"autotuning", OPAQUE | R, 0, NULL,
     "enabled refused: autotuning is a search run by DeepSpeed's launcher"},
    {"autotuning.enabled", HAND | R, 0, "false", "true refused"},

    /* checkpoint: the writer of DeepSpeed's own checkpoint format. */
    {"checkpoint", SEC | W, 0, NULL, "ztrain writes its own checkpoint layout"},
    {"checkpoint.tag_validation", W, 0, "\"Warn\"",
     "ztrain's tags are global_step<N> on every rank"},
    {"checkpoint.load_universal", W, 0, "false",
     "ztrain's checkpoints load on any rank count without conversion"},
    {"checkpoint.use_node_local_storage", W, 0, "false", "rank 0 writes the shared files"},
    {"checkpoint.parallel_write", OPAQUE | W, 0, NULL,
     "a pipeline's stages save their own directories"},
    {"checkpoint.checkpoint_serialization", W, 0, "true", "ztrain writes safetensors"},
    {"checkpoint.writer", OPAQUE | W, 0, NULL, "ztrain writes safetensors"},

    {"comet", OPAQUE | HAND | W, 0, NULL,
     "enabled warned: nothing is sent; metrics.jsonl and ztraind's HTTP API hold the metrics"},
    {"comet.enabled", HAND | W, 0, "false", "true warned: no network"},
    {"comms_logger", OPAQUE | R, 0, NULL, "enabled refused"},
    {"comms_logger.enabled", HAND | R, 0, "false", "true refused"},

    {"compile", OPAQUE | W, 0, NULL, "torch.compile options: ztrain's kernels are not compiled"},
    {"compile.deepcompile", HAND | R, 0, "false", "true refused: DeepCompile is not implemented"},

    {"compression_training", REMOVED, 0, NULL, REMOVED_IN_019 "its compression library"},

    /* csv_monitor, tensorboard, wandb: monitors. */
    {"csv_monitor", SEC | H, 0, NULL, "DeepSpeed's CSV files, written by rank 0"},
    {"csv_monitor.enabled", HAND | H, 0, "false", "Train_Samples_<tag>.csv per tag"},
    {"csv_monitor.output_path", HAND | H, 0, NULL, "with job_name, the directory (DeepSpeed's)"},
    {"csv_monitor.job_name", HAND | H, 0, NULL, "with output_path, the directory"},

    /* data_efficiency: refused only when a sub-feature is switched on. */
    {"curriculum_learning", REMOVED, 0, NULL,
     REMOVED_IN_019 "the top-level section: data_efficiency.data_sampling.curriculum_learning "
                    "replaces it"},
    {"data_efficiency", SEC | R, 0, NULL,
     "accepted while every sub-feature is off; a sub-feature switched on is refused"},
    {"data_efficiency.enabled", HAND | R, 0, "false",
     "true accepted while data_sampling and data_routing are off"},
    {"data_efficiency.seed", HAND | R, 0, "1234", "read only by a sub-feature, which is refused"},
    {"data_efficiency.data_sampling", SEC | R, 0, NULL, "refused when enabled with a sub-feature"},
    {"data_efficiency.data_sampling.enabled", HAND | R, 0, "false",
     "true accepted while its sub-features are off"},
    {"data_efficiency.data_sampling.num_epochs", HAND | R, 0, "1000",
     "read only by a sub-feature, which is refused"},
    {"data_efficiency.data_sampling.num_workers", HAND | R, 0, "0",
     "read only by a sub-feature, which is refused"},
    {"data_efficiency.data_sampling.pin_memory", HAND | R, 0, "false",
     "read only by a sub-feature, which is refused"},
    {"data_efficiency.data_sampling.curriculum_learning", OPAQUE | R, 0, NULL,
     "enabled refused"},
    {"data_efficiency.data_sampling.curriculum_learning.enabled", HAND | R, 0, "false",
     "true refused"},
    {"data_efficiency.data_sampling.dynamic_batching", OPAQUE | R, 0, NULL, "enabled refused"},
    {"data_efficiency.data_sampling.dynamic_batching.enabled", HAND | R, 0, "false",
     "true refused"},
    {"data_efficiency.data_routing", SEC | R, 0, NULL, "refused when enabled with random_ltd"},
    {"data_efficiency.data_routing.enabled", HAND | R, 0, "false",
     "true accepted while random_ltd is off"},
    {"data_efficiency.data_routing.random_ltd", OPAQUE | R, 0, NULL, "enabled refused"},
    {"data_efficiency.data_routing.random_ltd.enabled", HAND | R, 0, "false", "true refused"},

    {"datastates_ckpt", HAND | R, 0, "false",
     "DataStates checkpointing: any value but false refused (DeepSpeed turns it on for any)"},
    {"eigenvalue", REMOVED, 0, NULL, REMOVED_IN_019 "eigenvalue-based Mixture-of-Quantization"},
    {"elasticity", REMOVED, 0, NULL,
     REMOVED_IN_019 "elastic training: set the batch keys directly"},
    {"expert_parallel", OPAQUE | R, 0, NULL, "enabled refused: no mixture of experts"},
    {"expert_parallel.enabled", HAND | R, 0, "false", "true refused"},
    {"flops_profiler", OPAQUE | R, 0, NULL, "enabled refused: perf/tflops is in every record"},
    {"flops_profiler.enabled", HAND | R, 0, "false", "true refused"},

    /* fp16 / bf16 (deepspeed/runtime/precision_config.py). */
    {"bf16", SEC | H, 0, NULL, "bf16 parameters and gradients, fp32 masters"},
    {"bf16.enabled", H, 0, "false", "bf16 training"},
    {"bf16.check_grad_overflow", H, 0, "true", "skips non-finite steps"},
    {"bf16.immediate_grad_update", W, 0, "false",
     "ztrain accumulates bf16 gradients as the backward makes them"},
    {"bf16.bf16_master_weights_and_grads", HAND | H, ST123, "false",
     "with bf16_optimizer_states, stages 1-3, no offload: bf16 masters; other uses refused"},
    {"bf16.bf16_optimizer_states", HAND | H, ST123, "false",
     "with bf16_master_weights_and_grads: bf16 moments; other uses refused"},
    {"bfloat16", SEC | H, 0, NULL, "the old name of bf16, read when bf16 is absent"},
    {"bfloat16.enabled", H, 0, "false", "as bf16.enabled"},
    {"bfloat16.check_grad_overflow", H, 0, "true", "as bf16"},
    {"bfloat16.immediate_grad_update", W, 0, "false", "as bf16"},
    {"bfloat16.bf16_master_weights_and_grads", HAND | H, ST123, "false", "as bf16"},
    {"bfloat16.bf16_optimizer_states", HAND | H, ST123, "false", "as bf16"},
    {"fp16", SEC | H, 0, NULL, "fp16 with DeepSpeed's dynamic loss scaler"},
    {"fp16.enabled", H, 0, "false", "fp16 training"},
    {"fp16.loss_scale", H, 0, "0", "0: dynamic"},
    {"fp16.initial_scale_power", H, 0, "16",
     "dynamic scaler; above 63 refused (DeepSpeed: OverflowError at the first backward)"},
    {"fp16.loss_scale_window", H, 0, "1000", "dynamic scaler"},
    {"fp16.hysteresis", H, 0, "2", "dynamic scaler (ZeRO rule at stages 1-3)"},
    {"fp16.consecutive_hysteresis", H, 0, "false", "dynamic scaler"},
    {"fp16.min_loss_scale", H, 0, "1", "dynamic scaler"},
    {"fp16.auto_cast", W, 0, "false", "ztrain's model computes in the training precision itself"},
    {"fp16.fp16_master_weights_and_grads", HAND | R, 0, "false",
     "true refused: ztrain keeps fp32 masters in fp16 training"},

    {"hybrid_engine", OPAQUE | R, 0, NULL, "enabled refused: no inference engine"},
    {"hybrid_engine.enabled", HAND | R, 0, "false", "true refused"},
    {"nebula", REMOVED, 0, NULL, REMOVED_IN_019 "Nebula checkpointing"},

    /* optimizer: the optimizer parser validates params per type (ds_config_optim.c). */
    {"optimizer", SEC | H, 0, NULL,
     "Adam, AdamW, SGD, Lamb; absent: the job's training_args AdamW, with a warning"},
    {"optimizer.type", H, 0, NULL,
     "Adam/AdamW (any case), SGD, Lamb; OneBitAdam/ZeroOneAdam/OneBitLamb refused: DeepSpeed 0.19 "
     "no longer has them"},
    {"optimizer.legacy_fusion", W, 0, "false", "ztrain's kernels have one fusion"},
    {"optimizer.params", OPAQUE | HAND | H, 0, NULL, "checked per type by the optimizer parser"},
    {"optimizer.params.lr", H, 0, NULL, "every type"},
    {"optimizer.params.betas", H, 0, NULL, "Adam, AdamW, Lamb"},
    {"optimizer.params.eps", H, 0, NULL, "Adam, AdamW, Lamb"},
    {"optimizer.params.weight_decay", H, 0, NULL,
     "every parameter, as DeepSpeed given model.parameters()"},
    {"optimizer.params.bias_correction", H, 0, NULL,
     "Adam, AdamW (not with torch_adam: torch.optim's TypeError), Lamb"},
    {"optimizer.params.adam_w_mode", H, 0, NULL, "Adam, AdamW"},
    {"optimizer.params.torch_adam", H, 0, NULL,
     "Adam, AdamW: torch.optim's params and AdamW weight-decay default"},
    {"optimizer.params.fp32_optimizer_states", H, 0, NULL,
     "Adam, AdamW: states are fp32 (bf16 with bf16_optimizer_states) as DeepSpeedCPUAdam's"},
    {"optimizer.params.decoupled_weight_decay", H, 0, NULL,
     "Adam with torch_adam and adam_w_mode false: true is AdamW's decay"},
    {"optimizer.params.amsgrad", HAND | R, 0, NULL,
     "true refused (FusedAdam, CPUAdam have none; not implemented for torch_adam)"},
    {"optimizer.params.maximize", HAND | H, 0, NULL, "SGD, and Adam with torch_adam"},
    {"optimizer.params.set_grad_none", W, 0, "true",
     "ztrain's gradients are one flat buffer (Adam, AdamW without torch_adam or offload)"},
    {"optimizer.params.fused", W, 0, NULL,
     "ztrain has one optimizer implementation (SGD; Adam, AdamW with torch_adam)"},
    {"optimizer.params.foreach", W, 0, NULL,
     "ztrain has one optimizer implementation (SGD; Adam, AdamW with torch_adam)"},
    {"optimizer.params.capturable", W, 0, "false",
     "ztrain has no CUDA graphs (Adam, AdamW with torch_adam)"},
    {"optimizer.params.differentiable", W, 0, "false",
     "ztrain does not differentiate through the step (SGD; Adam, AdamW with torch_adam)"},
    {"optimizer.params.momentum", H, 0, NULL, "SGD"},
    {"optimizer.params.dampening", H, 0, NULL, "SGD"},
    {"optimizer.params.nesterov", H, 0, NULL, "SGD"},
    {"optimizer.params.max_coeff", H, 0, NULL, "Lamb: the trust ratio's upper clamp (10)"},
    {"optimizer.params.min_coeff", H, 0, NULL, "Lamb: the trust ratio's lower clamp (0.01)"},
    {"optimizer.params.eps_inside_sqrt", H, 0, NULL, "Lamb"},

    {"pipeline", OPAQUE | W, 0, NULL,
     "read only by a PipelineModule: ztrain's is the job spec's \"pipeline\" section"},

    {"progressive_layer_drop", REMOVED, 0, NULL, REMOVED_IN_019 "Progressive Layer Dropping"},

    {"quantize_training", REMOVED, 0, NULL, REMOVED_IN_019 "Mixture-of-Quantization"},

    /* scheduler: the scheduler parser validates params per type (ds_config_optim.c). */
    {"scheduler", SEC | H, 0, NULL,
     "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest"},
    {"scheduler.type", H, 0, NULL, "DeepSpeed's five; torch schedulers refused"},
    {"scheduler.params", OPAQUE | HAND | H, 0, NULL, "checked per type by the scheduler parser"},

    {"sparse_attention", REMOVED, 0, NULL, REMOVED_IN_019 "Sparse Attention"},

    {"tensor_parallel", SEC | H, 0, NULL, "AutoTP training: Megatron-style sharded layers"},
    {"tensor_parallel.autotp_size", HAND | H, 0, "0",
     "TP ranks per model replica; the grid is dp × pp × tp with tp innermost"},
    {"tensor_parallel.tp_overlap_comm", R, 0, "false",
     "true refused: the all-reduces run between the layers, not overlapped"},
    {"tensor_parallel.dtype", PRESENT | W, 0, NULL,
     "the precision follows the bf16 and fp16 sections"},
    {"tensor_parallel.keep_module_on_host", W, 0, "false",
     "each rank reads only its shards of a checkpoint"},
    {"tensor_parallel.vocab_parallel_lm_head", H, 0, "false",
     "the LM head and embedding are always vocabulary-parallel, with Megatron's loss"},
    {"tensor_parallel.vocab_parallel_ce_backend", R, 0, "\"torch\"", "\"liger\" refused"},
    {"tensor_parallel.injection_policy_tuple", PRESENT | R, 0, NULL, "refused: " TP_NOTE},
    {"tensor_parallel.partition_config", OPAQUE | PRESENT | R, 0, NULL, "refused: " TP_NOTE},
    {"tensor_parallel.replace_with_kernel_inject", R, 0, "false", "inference kernels: refused"},
    {"tensor_parallel.kernel_inject", R, 0, "false", "inference kernels: refused"},
    {"tensor_parallel.tensor_parallel", SEC | H, 0, NULL, "DeepSpeed's TPConfig (alias tp)"},
    {"tensor_parallel.tensor_parallel.tp_size", HAND | H, 0, "1",
     "taken when autotp_size is 0; must agree with it otherwise"},
    {"tensor_parallel.tensor_parallel.tp_grain_size", R, 0, "1", "uneven shards refused"},
    {"tensor_parallel.tensor_parallel.mpu", PRESENT | R, 0, NULL, "a Python object: refused"},
    {"tensor_parallel.tensor_parallel.tp_group", PRESENT | R, 0, NULL, "a Python object: refused"},
    {"tensor_parallel.tp", SEC | H, 0, NULL, "alias of tensor_parallel.tensor_parallel"},
    {"tensor_parallel.tp.tp_size", HAND | H, 0, "1",
     "taken when autotp_size is 0; must agree with it otherwise"},
    {"tensor_parallel.tp.tp_grain_size", R, 0, "1", "uneven shards refused"},
    {"tensor_parallel.tp.mpu", PRESENT | R, 0, NULL, "a Python object: refused"},
    {"tensor_parallel.tp.tp_group", PRESENT | R, 0, NULL, "a Python object: refused"},

    {"tensorboard", SEC | H, 0, NULL, "TensorBoard event files with DeepSpeed's tags, rank 0"},
    {"tensorboard.enabled", HAND | H, 0, "false", "one event file per run"},
    {"tensorboard.output_path", HAND | H, 0, NULL, "with job_name, the directory (DeepSpeed's)"},
    {"tensorboard.job_name", HAND | H, 0, NULL, "with output_path, the directory"},

    {"timers", SEC | W, 0, NULL, "ztrain always times steps (perf/* in the records)"},
    {"timers.throughput", SEC | W, 0, NULL, "ztrain always times steps"},
    {"timers.throughput.enabled", W, 0, "true", "ztrain always times steps"},
    {"timers.throughput.synchronized", W, 0, "true", "ztrain's step times are synchronised anyway"},

    {"torch_autocast", SEC | R, 0, NULL, "enabled refused: use the bf16 or fp16 section"},
    {"torch_autocast.enabled", HAND | R, 0, "false", "true refused: use the bf16 or fp16 section"},
    {"torch_autocast.dtype", HAND | R, 0, NULL, "read only when enabled, which is refused"},
    {"torch_autocast.lower_precision_safe_modules", HAND | R, 0, NULL,
     "read only when enabled, which is refused"},

    {"wandb", SEC | W, 0, NULL, "enabled warned: no network; use the HTTP API and dashboard"},
    {"wandb.enabled", HAND | W, 0, "false", "true warned: nothing is sent"},
    {"wandb.group", HAND | W, 0, NULL, "validated; nothing is sent"},
    {"wandb.team", HAND | W, 0, NULL, "validated; nothing is sent"},
    {"wandb.project", HAND | W, 0, NULL, "validated; nothing is sent"},

    {"weight_quantization", OPAQUE | PRESENT | W, 0, NULL,
     "ZeRO-Inference's weight quantization: ztrain trains in full"},

    /* zero_optimization (deepspeed/runtime/zero/config.py). */
    {"zero_optimization", SEC | H, 0, NULL, "stages 0-3; also the legacy true/false"},
    {"zero_optimization.stage", H, 0, "0", "0-3"},
    {"zero_optimization.reduce_bucket_size", H, ST23, "500000000",
     "gradient reduce-scatter buckets (stages 2-3)"},
    {"zero_optimization.overlap_comm", H, ST23, NULL,
     "communication thread beside the backward (stages 2-3, more than one rank)"},
    {"zero_optimization.offload_optimizer", SEC | H, 0, NULL, "ZeRO-Offload / Infinity"},
    {"zero_optimization.offload_optimizer.device", H, 0, "\"none\"", "none, cpu, nvme"},
    {"zero_optimization.offload_optimizer.nvme_path", H, 0, NULL, "nvme"},
    {"zero_optimization.offload_optimizer.buffer_count", H, 0, "4", "nvme streaming buffers"},
    {"zero_optimization.offload_optimizer.pin_memory", W, 0, "true", NO_DEVICE},
    {"zero_optimization.offload_optimizer.pipeline_read", H, 0, "false", "nvme"},
    {"zero_optimization.offload_optimizer.pipeline_write", H, 0, "false", "nvme"},
    {"zero_optimization.offload_optimizer.fast_init", W, 0, "false",
     "ztrain allocates the files in full at startup"},
    {"zero_optimization.offload_optimizer.ratio", H, ST3, "1.0",
     "partial offload (stage 3; below 1 at stages 1-2 refused as in DeepSpeed)"},
    {"zero_optimization.offload_optimizer.super_offload", HAND | R, 0, "false", "true refused"},
    {"zero_optimization.offload_optimizer.convert_grad_on_cpu", W, 0, NULL, NO_DEVICE},
    {"zero_optimization.offload_optimizer.cpuadam_cores_perc", W, 0, "0.8",
     "ztrain's CPU optimizer uses the rank's OpenMP threads"},
    {"zero_optimization.offload_param", SEC | H, ST3, NULL,
     "stage 3 (ignored with a warning at stages 1-2, as in DeepSpeed)"},
    {"zero_optimization.offload_param.device", HAND | H, ST3, "\"none\"", "none, cpu, nvme"},
    {"zero_optimization.offload_param.nvme_path", HAND | H, ST3, NULL, "nvme"},
    {"zero_optimization.offload_param.buffer_count", HAND | H, ST3, "5",
     "streaming buffers when only the parameters are on nvme"},
    {"zero_optimization.offload_param.buffer_size", W, 0, "100000000",
     "each layer's slice is read straight into its working buffer"},
    {"zero_optimization.offload_param.max_in_cpu", W, 0, "1000000000", LAYER_GATHER},
    {"zero_optimization.offload_param.pin_memory", W, 0, "true", NO_DEVICE},
    {"zero_optimization.sub_group_size", HAND | H, 0, "1000000000",
     "the offloaded update's tile (without offload: warned)"},
    {"zero_optimization.stage3_prefetch_bucket_size", H, ST3, "50000000",
     "0 turns the next layer's prefetch off; any other value prefetches one layer"},
    {"zero_optimization.prefetch_bucket_size", H, ST3, "50000000",
     "alias of stage3_prefetch_bucket_size"},
    {"zero_optimization.stage3_param_persistence_threshold", H, ST3, "100000",
     "small tensors kept whole (fp32 training; no effect yet in bf16/fp16)"},
    {"zero_optimization.param_persistence_threshold", H, ST3, "100000",
     "alias of stage3_param_persistence_threshold"},
    {"zero_optimization.contiguous_gradients", W, 0, "true", OWN_LAYOUT},
    {"zero_optimization.reduce_scatter", W, 0, "true",
     "ztrain always reduce-scatters partitioned gradients"},
    {"zero_optimization.use_multi_rank_bucket_allreduce", W, 0, "true", OWN_LAYOUT},
    {"zero_optimization.allgather_partitions", W, 0, "true",
     "ztrain always all-gathers updated partitions"},
    {"zero_optimization.allgather_bucket_size", W, 0, "500000000",
     "ztrain gathers parameters per layer (stage 3) or in fixed chunks"},
    {"zero_optimization.load_from_fp32_weights", W, 0, "true",
     "ztrain always loads the fp32 masters"},
    {"zero_optimization.elastic_checkpoint", W, 0, "false",
     "ztrain's checkpoints load on any rank count anyway"},
    {"zero_optimization.cpu_offload", H, 0, NULL, "deprecated: offload_optimizer.device cpu"},
    {"zero_optimization.cpu_offload_param", H, 0, NULL, "deprecated: offload_param.device cpu"},
    {"zero_optimization.cpu_offload_use_pin_memory", W, 0, NULL, "deprecated; " NO_DEVICE},
    {"zero_optimization.stage3_model_persistence_threshold", W, 0, NULL, LAYER_GATHER},
    {"zero_optimization.model_persistence_threshold", W, 0, NULL, LAYER_GATHER},
    {"zero_optimization.stage3_max_live_parameters", W, 0, "1000000000", LAYER_GATHER},
    {"zero_optimization.max_live_parameters", W, 0, "1000000000", LAYER_GATHER},
    {"zero_optimization.stage3_max_reuse_distance", W, 0, "1000000000", LAYER_GATHER},
    {"zero_optimization.max_reuse_distance", W, 0, "1000000000", LAYER_GATHER},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", H, ST3, "false",
     "the 16-bit model gathered layer by layer; stages 0-2 always write fp32"},
    {"zero_optimization.gather_16bit_weights_on_model_save", H, ST3, "false",
     "the 16-bit model gathered layer by layer; stages 0-2 always write fp32"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", H, ST3, "false",
     "deprecated; the 16-bit model gathered layer by layer; stages 0-2 always write fp32"},
    {"zero_optimization.stage3_module_granularity_threshold", W, 0, "0", LAYER_GATHER},
    {"zero_optimization.module_granularity_threshold", W, 0, "0", LAYER_GATHER},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", W, 0, "false",
     "ztrain gathers with all-gather"},
    {"zero_optimization.use_all_reduce_for_fetch_params", W, 0, "false",
     "ztrain gathers with all-gather"},
    {"zero_optimization.stage3_allgather_sequential", W, 0, "false", LAYER_GATHER},
    {"zero_optimization.allgather_sequential", W, 0, "false", LAYER_GATHER},
    {"zero_optimization.stage3_partition_stream_chunk_size", W, 0, NULL, LAYER_GATHER},
    {"zero_optimization.partition_stream_chunk_size", W, 0, NULL, LAYER_GATHER},
    {"zero_optimization.ignore_unused_parameters", W, 0, "true",
     "ztrain's models use every parameter"},
    {"zero_optimization.round_robin_gradients", W, 0, "false", OWN_LAYOUT},
    {"zero_optimization.memory_efficient_linear", W, 0, "true",
     "ztrain's linear layers are its own"},
    {"zero_optimization.pipeline_loading_checkpoint", W, 0, "false",
     "a pipeline's stages load their own directories"},
    {"zero_optimization.override_module_apply", W, 0, "true", "no torch modules here"},
    {"zero_optimization.log_trace_cache_warnings", W, 0, "false", "no trace cache here"},
    {"zero_optimization.enable_sanity_checks", W, 0, "false", "no trace cache here"},
    {"zero_optimization.save_muon_momentum_buffer_in_memory", W, 0, "false", "no Muon optimizer"},
    {"zero_optimization.leaf_module", OPAQUE | W, 0, NULL, "no torch modules here"},
    {"zero_optimization.legacy_stage1", HAND | R, 0, "false", "true refused"},
    {"zero_optimization.zero_hpz_partition_size", HAND | R, 0, "1", "above 1 refused (ZeRO++)"},
    {"zero_optimization.zero_quantized_weights", HAND | R, 0, "false", "true refused (ZeRO++)"},
    {"zero_optimization.zero_quantized_nontrainable_weights", HAND | R, 0, "false",
     "true refused (ZeRO++)"},
    {"zero_optimization.zero_quantized_gradients", HAND | R, 0, "false", "true refused (ZeRO++)"},
    {"zero_optimization.zeropp_loco_param", REMOVED, 0, NULL,
     REMOVED_IN_019 "LoCo-ZeRO++: without the key ZeRO++ quantizes without LoCo"},
    {"zero_optimization.mics_shard_size", REMOVED_LEAF, 0, NULL, REMOVED_IN_019 "MiCS sharding"},
    {"zero_optimization.mics_hierarchical_params_gather", REMOVED_LEAF, 0, NULL,
     REMOVED_IN_019 "MiCS sharding"},
    {"zero_optimization.zenflow", OPAQUE | HAND | R, 0, NULL,
     "refused: ZenFlow is not implemented"},
};


const zt_ds_key *zt_ds_keys(size_t *n) {
    *n = NFIELDS(rows);
    return rows;
}

zt_ds_key_fate zt_ds_key_fate_of(const zt_ds_key *k) {
    return (zt_ds_key_fate)(k->flags & ZT_DS_KEY_FATE_MASK);
}

static const zt_ds_key *find_row(const char *path) {
    for (size_t i = 0; i < NFIELDS(rows); i++)
        if (strcmp(rows[i].path, path) == 0)
            return &rows[i];
    return NULL;
}

static void child_path(const zt_json_obj *o, const char *key, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s", o->path, o->path[0] ? "." : "", key);
}

/* The keys a section may hold: the rows one level below its path. */
static size_t section_keys(const char *section, const char **names, size_t max) {
    size_t len = strlen(section), k = 0;
    for (size_t i = 0; i < NFIELDS(rows) && k + 1 < max; i++) {
        const char *p = rows[i].path;
        if (len && (strncmp(p, section, len) != 0 || p[len] != '.'))
            continue;
        const char *rest = len ? p + len + 1 : p;
        if (!strchr(rest, '.'))
            names[k++] = rest;
    }
    names[k] = NULL;
    return k;
}

zt_status zt_ds_check_known_keys(const zt_json_obj *o) {
    const char *names[160];
    section_keys(o->path, names, NFIELDS(names));
    for (const cJSON *c = o->obj->child; c; c = c->next) {
        char path[640];
        child_path(o, c->string, path, sizeof path);
        const zt_ds_key *row = find_row(path);
        if (!row && !o->path[0]) {
            /* DeepSpeed ignores unknown top-level keys; a typo still deserves a word. */
            const char *near = zt_json_suggest(c->string, names);
            char hint[128] = "";
            if (near)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            zt_ds_warn(o->source, "unknown top-level key '%s' is ignored%s", c->string, hint);
            continue;
        }
        if (!row)
            return zt_json_check_keys(o, names);
        if ((row->flags & ZT_DS_KEY_SECTION) && !(row->flags & ZT_DS_KEY_OPAQUE) &&
            cJSON_IsObject(c)) {
            zt_json_obj child;
            zt_json_obj_init(&child, c, o->source, path);
            ZT_TRY(zt_ds_check_known_keys(&child));
        }
    }
    return ZT_OK;
}

zt_status zt_ds_check_removed(const zt_json_obj *top) {
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!(rows[i].flags & ZT_DS_KEY_REMOVED))
            continue;
        const char *key = rows[i].path, *dot = strchr(key, '.');
        const cJSON *in = top->obj;
        /* DeepSpeed looks into zero_optimization only when it is an object. */
        if (dot) {
            in = cJSON_GetObjectItemCaseSensitive(in, "zero_optimization");
            key = dot + 1;
        }
        if (cJSON_IsObject(in) && cJSON_GetObjectItemCaseSensitive(in, key)) {
            zt_error(ZT_ERR_INVALID, "%s: %s: %s", top->source, rows[i].path, rows[i].note);
            return zt_error_field(ZT_ERR_INVALID, rows[i].path);
        }
    }
    return ZT_OK;
}

/* Whether a present value differs from DeepSpeed's default: null and "auto" never do. */
static bool is_set(const zt_ds_key *row, const cJSON *v) {
    if (cJSON_IsNull(v) || (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0))
        return false;
    if ((row->flags & ZT_DS_KEY_PRESENCE) || !row->dflt)
        return true;
    cJSON *d = cJSON_Parse(row->dflt);
    ZT_ASSERT(d);
    bool differs = !cJSON_Compare(v, d, true);
    cJSON_Delete(d);
    return differs;
}

/* An opaque section with a key the table does not list carries settings nobody reads. */
static bool has_unlisted(const char *path, const cJSON *sec) {
    if (!cJSON_IsObject(sec))
        return false;
    for (const cJSON *c = sec->child; c; c = c->next) {
        char p[1024];
        snprintf(p, sizeof p, "%s.%s", path, c->string);
        if (!find_row(p))
            return true;
    }
    return false;
}

zt_status zt_ds_apply_fates(const zt_ds_config *cfg, const zt_json_obj *o) {
    for (const cJSON *c = o->obj->child; c; c = c->next) {
        char path[640];
        child_path(o, c->string, path, sizeof path);
        const zt_ds_key *row = find_row(path);
        if (!row)
            continue;
        bool section = row->flags & ZT_DS_KEY_SECTION, opaque = row->flags & ZT_DS_KEY_OPAQUE;
        bool by_hand = row->flags & ZT_DS_KEY_BY_HAND;
        zt_ds_key_fate fate = zt_ds_key_fate_of(row);
        /* A refused leaf set away from its default, or a refused key that counts by its presence
         * (a section among them), is refused here; refused sections without a presence mark are
         * judged by their "enabled" switch elsewhere. */
        if (fate == ZT_DS_KEY_REFUSED && !by_hand &&
            (!section || (row->flags & ZT_DS_KEY_PRESENCE)) && is_set(row, c)) {
            char got[64];
            zt_json_repr(c, got, sizeof got);
            return zt_error(ZT_ERR_UNSUPPORTED, "%s: %s %s is not supported (%s)", o->source, path,
                            got, row->note);
        }
        if (section) {
            if (!cJSON_IsObject(c))
                continue; /* a section given as something else is its parser's business */
            if (opaque && !by_hand && fate == ZT_DS_KEY_WARNED &&
                ((row->flags & ZT_DS_KEY_PRESENCE) || has_unlisted(path, c)))
                zt_ds_warn(o->source, "%s has no effect: %s", path, row->note);
            /* The rows listed inside an opaque section still have their fates. */
            zt_json_obj child;
            zt_json_obj_init(&child, c, o->source, path);
            ZT_TRY(zt_ds_apply_fates(cfg, &child));
            continue;
        }
        if (by_hand)
            continue;
        if (!is_set(row, c))
            continue;
        int stage = cfg->zero.stage;
        if (fate == ZT_DS_KEY_WARNED)
            zt_ds_warn(o->source, "%s has no effect: %s", path, row->note);
        else if (fate == ZT_DS_KEY_HONOURED && row->stages && !(row->stages & (1u << stage)))
            zt_ds_warn(o->source, "%s has no effect at ZeRO stage %d: %s", path, stage, row->note);
    }
    return ZT_OK;
}
