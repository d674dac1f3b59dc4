"""Which optimizer params and config values real DeepSpeed 0.19 accepts, against ztrain's reading
of the same configs.

DeepSpeed (the .venv-ds environment, its CPU accelerator, one gloo rank) judges each case in a
child process: an optimizer case by deepspeed.initialize on a two-layer torch model and two
training steps (so the optimizer class DeepSpeed builds takes the params: FusedAdam, its
DeepSpeedCPUAdam with offload_optimizer, or torch.optim.AdamW/Adam with torch_adam); a value case
by DeepSpeedConfig (the pydantic models that convert "2" to 2). ztrain judges the same DeepSpeed
config in a job through zt_job_check. Pass conditions, per case:
  - DeepSpeed accepts: ztrain accepts, or the case is one ztrain refuses on purpose (docs/
    deepspeed.md: amsgrad with torch_adam, not implemented; torch.optim's checks of lr, eps,
    betas on FusedAdam's path too) and its error names the key;
  - DeepSpeed raises (TypeError from the constructor, "does not support the AMSGrad variant."):
    ztrain refuses, naming the key.

Run: make test-deepspeed, or ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_config_accept.py
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv(".venv-ds", "scripts/install-deps.sh deepspeed")

sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from ztref import Checker, tool  # noqa: E402
from ports import free_port  # noqa: E402

BASE = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000000}
OFFLOAD = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def opt(kind, extra=None, **params):
    cfg = dict(BASE, optimizer={"type": kind, "params": dict(lr=0.01, **params)})
    cfg.update(extra or {})
    return cfg


# name, DeepSpeed config, the key the case is about, "init" (deepspeed.initialize) or "config"
# (DeepSpeedConfig), and whether ztrain refuses it on purpose where DeepSpeed accepts it.
CASES = [
    ("FusedAdam bias_correction", opt("Adam", bias_correction=False), "bias_correction", "init", False),
    ("FusedAdam set_grad_none", opt("Adam", set_grad_none=False), "set_grad_none", "init", False),
    ("FusedAdam fused", opt("Adam", fused=True), "fused", "init", False),
    ("FusedAdam foreach", opt("AdamW", foreach=False), "foreach", "init", False),
    ("FusedAdam fp32_optimizer_states", opt("Adam", fp32_optimizer_states=False),
     "fp32_optimizer_states", "init", False),
    ("FusedAdam amsgrad", opt("Adam", amsgrad=True), "amsgrad", "init", False),
    ("AdamW bias_correction", opt("AdamW", torch_adam=True, bias_correction=False),
     "bias_correction", "init", False),
    ("AdamW set_grad_none", opt("AdamW", torch_adam=True, set_grad_none=True), "set_grad_none",
     "init", False),
    ("AdamW foreach", opt("AdamW", torch_adam=True, foreach=True), "foreach", "init", False),
    ("AdamW fused and foreach", opt("AdamW", torch_adam=True, foreach=True, fused=True), "fused",
     "init", False),
    ("AdamW decoupled_weight_decay", opt("AdamW", torch_adam=True, decoupled_weight_decay=True),
     "decoupled_weight_decay", "init", False),
    ("Adam decoupled_weight_decay", opt("Adam", torch_adam=True, adam_w_mode=False,
                                        decoupled_weight_decay=True),
     "decoupled_weight_decay", "init", False),
    ("AdamW fp32_optimizer_states", opt("AdamW", torch_adam=True, fp32_optimizer_states=True),
     "fp32_optimizer_states", "init", False),
    ("AdamW amsgrad", opt("AdamW", torch_adam=True, amsgrad=True), "amsgrad", "init", True),
    ("AdamW maximize", opt("AdamW", torch_adam=True, maximize=True), "maximize", "init", False),
    # torch.optim's checks, with the key named; FusedAdam has none, refused on purpose.
    ("AdamW lr < 0", dict(BASE, optimizer={"type": "AdamW", "params": {
        "torch_adam": True, "lr": -0.01}}), "lr", "init", False),
    ("AdamW betas >= 1", opt("AdamW", torch_adam=True, betas=[0.9, 1.0]), "betas", "init", False),
    ("FusedAdam betas >= 1", opt("Adam", betas=[0.9, 1.5]), "betas", "init", True),
    ("FusedAdam eps < 0", opt("Adam", eps=-1e-8), "eps", "init", True),
    ("SGD nesterov without momentum", opt("SGD", nesterov=True), "nesterov", "init", False),
    # The engine's (step + 1) % steps_per_print after the first step.
    ("steps_per_print 0", opt("Adam", {"steps_per_print": 0}), "steps_per_print", "init", False),
    ("SGD maximize", opt("SGD", maximize=True, momentum=0.9), "maximize", "init", False),
    ("CPUAdam set_grad_none", opt("Adam", OFFLOAD, set_grad_none=True), "set_grad_none", "init",
     False),
    ("CPUAdam amsgrad", opt("Adam", OFFLOAD, amsgrad=True), "amsgrad", "init", False),
    ("CPUAdam fp32_optimizer_states", opt("Adam", OFFLOAD, fp32_optimizer_states=False),
     "fp32_optimizer_states", "init", False),
    ("OneBitAdam", opt("OneBitAdam", freeze_step=2), "optimizer.type", "init", False),
    ("ZeroOneAdam", opt("ZeroOneAdam"), "optimizer.type", "init", False),
    ("onebitlamb", opt("onebitlamb"), "optimizer.type", "init", False),
    ("Adam lr null", dict(BASE, optimizer={"type": "Adam", "params": {"lr": None}}), "lr", "init",
     False),
    ("Adam betas null", opt("Adam", betas=None), "betas", "init", False),
    ("AdamW weight_decay null", opt("AdamW", torch_adam=True, weight_decay=None), "weight_decay",
     "init", False),
    ("SGD momentum null", opt("SGD", momentum=None), "momentum", "init", False),
    # DeepSpeed runs these, reading None as false where the key left out means true.
    ("Adam bias_correction null", opt("Adam", bias_correction=None), "bias_correction", "init",
     True),
    ("Adam adam_w_mode null", opt("Adam", adam_w_mode=None), "adam_w_mode", "init", True),
    ("Adam torch_adam null", opt("Adam", torch_adam=None), "torch_adam", "init", False),
    ("gradient_clipping -1", opt("SGD", {"gradient_clipping": -1}), "gradient_clipping", "init",
     False),
    ("gradient_clipping \"2\"", opt("SGD", {"gradient_clipping": "2"}), "gradient_clipping",
     "init", False),
    ("steps_per_print -5", dict(BASE, steps_per_print=-5), "steps_per_print", "config", False),
    ("zero strings", dict(BASE, zero_optimization={"stage": "2", "reduce_bucket_size": "500",
                                                   "overlap_comm": "off"}),
     "stage", "config", False),
    ("zero allgather_bucket_size 0", opt("Adam", {"zero_optimization": {
        "stage": 2, "allgather_bucket_size": 0}}), "allgather_bucket_size", "init", False),
    ("zero allgather_bucket_size -2", dict(BASE, zero_optimization={
        "stage": 1, "allgather_bucket_size": -2}), "allgather_bucket_size", "config", False),
    ("zero stage \"2.5\"", dict(BASE, zero_optimization={"stage": "2.5"}), "stage", "config",
     False),
    ("fp16 strings", dict(BASE, fp16={"enabled": "yes", "loss_scale": "128",
                                      "loss_scale_window": " 1_000 "}),
     "loss_scale", "config", False),
    ("fp16 min_loss_scale \"2.0\"", dict(BASE, fp16={"enabled": True, "min_loss_scale": "2.0"}),
     "min_loss_scale", "config", False),
    ("fp16 min_loss_scale 2^37", dict(BASE, fp16={"enabled": True,
                                                  "min_loss_scale": 137438953472}),
     "min_loss_scale", "config", False),
    ("fp16 loss_scale_window true", dict(BASE, fp16={"enabled": True, "loss_scale_window": True}),
     "loss_scale_window", "config", False),
    ("fp16 loss_scale_window false, fp16 off", dict(BASE, fp16={"loss_scale_window": False}),
     "loss_scale_window", "config", False),
    ("fp16 hysteresis true", dict(BASE, fp16={"enabled": True, "hysteresis": True}),
     "hysteresis", "config", False),
    ("fp16 hysteresis 0, stage 0", dict(BASE, fp16={"enabled": True, "hysteresis": 0}),
     "hysteresis", "config", False),
    ("checkpoint tag_validation \"Strict\"", dict(BASE, checkpoint={"tag_validation": "Strict"}),
     "tag_validation", "config", False),
    ("checkpoint tag_validation null", dict(BASE, checkpoint={"tag_validation": None}),
     "tag_validation", "config", False),
    ("checkpoint tag_validation \"fail\"", dict(BASE, checkpoint={"tag_validation": "fail"}),
     "tag_validation", "config", False),
    ("checkpoint pipeline_stage \"true\"", dict(BASE, checkpoint={
        "parallel_write": {"pipeline_stage": "true"}}), "pipeline_stage", "config", False),
    ("checkpoint pipeline_stage 1", dict(BASE, checkpoint={"parallel_write": {"pipeline_stage": 1}}),
     "pipeline_stage", "config", False),
    ("checkpoint writer type \"torch\"", dict(BASE, checkpoint={"writer": {"type": "torch"}}),
     "writer.type", "config", False),
    ("checkpoint writer \"python\", \"machine\"", dict(BASE, checkpoint={
        "writer": {"type": "python", "data_parallel": "machine"}}), "writer", "config", False),
    ("checkpoint writer data_parallel \"node\"", dict(BASE, checkpoint={
        "writer": {"data_parallel": "node"}}), "data_parallel", "config", False),
    ("bf16 enabled \"true\"", dict(BASE, bf16={"enabled": "true"}), "enabled", "config", False),
    ("tensor_parallel strings", dict(BASE, tensor_parallel={
        "autotp_size": "1", "tp_overlap_comm": "off", "tp": {"tp_size": " 1 "}}),
     "autotp_size", "config", False),
    ("tensor_parallel autotp_size \"x\"", dict(BASE, tensor_parallel={"autotp_size": "x"}),
     "autotp_size", "config", False),
    # A step count above 2^31 - 1: a Python int to DeepSpeed (tests/unit/test_ds_config.c checks
    # the lr at such a step against lr_schedules.py's formula).
    ("WarmupLR warmup_num_steps 3e9", opt("SGD", {"scheduler": {
        "type": "WarmupLR", "params": {"warmup_num_steps": 3000000000}}}), "warmup_num_steps",
     "init", False),
    ("OneCycle decay_step_size 3e9", opt("SGD", {"scheduler": {
        "type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
                                       "decay_step_size": 3000000000}}}), "decay_step_size",
     "init", False),
    # timers: get_timers_config looks "throughput" up in the value, then builds the pydantic
    # DeepSpeedThroughputTimerConfig from it by ** (two bools, converted in lax mode).
    ("timers strings", dict(BASE, timers={"throughput": {"enabled": "yes", "synchronized": 1}}),
     "timers", "config", False),
    ("timers enabled \"maybe\"", dict(BASE, timers={"throughput": {"enabled": "maybe"}}),
     "timers.throughput.enabled", "config", False),
    ("timers synchronized 2", dict(BASE, timers={"throughput": {"synchronized": 2}}),
     "timers.throughput.synchronized", "config", False),
    ("timers enabled null", dict(BASE, timers={"throughput": {"enabled": None}}),
     "timers.throughput.enabled", "config", False),
    ("timers throughput null", dict(BASE, timers={"throughput": None}), "timers.throughput",
     "config", False),
    ("timers throughput []", dict(BASE, timers={"throughput": []}), "timers.throughput",
     "config", False),
    ("timers 5", dict(BASE, timers=5), "timers", "config", False),
    ("timers \"abc\"", dict(BASE, timers="abc"), "timers", "config", False),
    ("timers [\"throughput\"]", dict(BASE, timers=["throughput"]), "timers", "config", False),
    # data_types.keep_in_fp32_modules: "auto" or a list of name patterns; null too is refused.
    ("keep_in_fp32_modules \"auto\"", dict(BASE, data_types={"keep_in_fp32_modules": "auto"}),
     "keep_in_fp32_modules", "config", False),
    ("keep_in_fp32_modules []", dict(BASE, data_types={"keep_in_fp32_modules": []}),
     "keep_in_fp32_modules", "config", False),
    ("keep_in_fp32_modules patterns", dict(BASE, data_types={"keep_in_fp32_modules": ["a*", "b"]}),
     "keep_in_fp32_modules", "config", False),
    ("keep_in_fp32_modules null", dict(BASE, data_types={"keep_in_fp32_modules": None}),
     "keep_in_fp32_modules", "config", False),
    ("keep_in_fp32_modules \"x\"", dict(BASE, data_types={"keep_in_fp32_modules": "x"}),
     "keep_in_fp32_modules", "config", False),
    ("keep_in_fp32_modules [1]", dict(BASE, data_types={"keep_in_fp32_modules": [1]}),
     "keep_in_fp32_modules", "config", False),
    # data_types.grad_accum_dtype against the training type and the ZeRO stage
    # (_do_optimizer_sanity_check): the training type always; fp32 under bf16/fp16 with ZeRO; any
    # other mix without ZeRO is NotImplementedError. bf16 under fp16 (and the reverse) DeepSpeed
    # runs at stages 1-3; ztrain refuses it on purpose.
    *[(f"grad_accum_dtype {a} in {p} at stage {z}",
       opt("AdamW", dict({p: {"enabled": True}} if p != "fp32" else {},
                         zero_optimization={"stage": z}, data_types={"grad_accum_dtype": a})),
       "grad_accum_dtype", "init", (p, a) == ("bf16", "fp16"))
      for p, a, z in [("bf16", "fp32", 0), ("bf16", "fp32", 1), ("bf16", "fp32", 2),
                      ("bf16", "fp32", 3), ("bf16", "bf16", 0), ("bf16", "bf16", 2),
                      ("bf16", "fp16", 1), ("fp32", "bf16", 0), ("fp32", "fp32", 0)]],
]

# Switches: what DeepSpeed makes of a value (an expression over its DeepSpeedConfig `c`, tested
# for truth), for the sections it reads through pydantic (1, "yes" and "off" converted, "maybe"
# refused) and those it reads with dict.get (the value itself tested later, so "no" is on).
# ztrain must refuse, naming the key, every switch of a feature it lacks that DeepSpeed turns on
# or refuses, accept it where DeepSpeed leaves it off, and write what DeepSpeed decided into
# the effective config for the monitors it honours.
SWITCH_SECTIONS = [
    ("flops_profiler", "enabled", "c.flops_profiler_config.enabled", [1, 0, "no", "", 0.5, None]),
    ("autotuning", "enabled", "c.autotuning_config.enabled", [1, 0, "off"]),
    ("torch_autocast", "enabled", "c.torch_autocast_enabled", ["no", 0, []]),
    ("expert_parallel", "enabled", "c.expert_parallel_config.enabled", [1, 0.0]),
    # The model's value: DeepSpeed 0.19's logger starts on the section's presence alone
    # (ds_config_switches.c says why ztrain follows "enabled").
    ("comms_logger", "enabled", "c.comms_config.comms_logger.enabled", ["yes", "off", 1, "maybe"]),
    ("hybrid_engine", "enabled", "c.hybrid_engine.enabled", ["on", 0, "F"]),
    ("compile", "deepcompile", "c.compile_config.deepcompile", ["true", "0"]),
    ("tensorboard", "enabled", "c.monitor_config.tensorboard.enabled", [1, "off", "Yes"]),
    ("csv_monitor", "enabled", "c.monitor_config.csv_monitor.enabled", ["t", 0]),
]
HONOURED = ("tensorboard", "csv_monitor")
SWITCHES = [(f"{sec}.{key} {json.dumps(v)}", dict(BASE, **{sec: {key: v}}), f"{sec}.{key}",
             "value:" + expr) for sec, key, expr, values in SWITCH_SECTIONS for v in values]
SWITCHES += [(f"datastates_ckpt {json.dumps(v)}", dict(BASE, datastates_ckpt=v), "datastates_ckpt",
              "value:c.datastates_config.enabled") for v in ({}, False, {"path": "x"})]

# The DeepSpeed side, run in a child so that one process holds its distributed state.
DS_CHILD = r"""
import json, logging, os, sys
import deepspeed, torch
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.utils import logger
deepspeed.init_distributed(dist_backend="gloo", verbose=False)
logger.setLevel(logging.ERROR)
cases, out = json.load(open(sys.argv[1])), {}
for name, cfg, how in cases:
    try:
        if how.startswith("value:"):
            c = DeepSpeedConfig(cfg)
            out[name] = "ON" if eval(how[len("value:"):]) else "OFF"
            continue
        if how == "config":
            DeepSpeedConfig(cfg)
        else:
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
            eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(),
                                                config=cfg)
            dtype = next(eng.module.parameters()).dtype
            for _ in range(2):
                eng.backward(eng(torch.randn(2, 4, dtype=dtype)).sum())
                eng.step()
        out[name] = "OK"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}".replace("\n", " | ")[:300]
json.dump(out, open(sys.argv[2], "w"), indent=1)
"""


def deepspeed_verdicts(tmp):
    with open(f"{tmp}/cases.json", "w") as f:
        json.dump([(name, cfg, how) for name, cfg, _, how, _ in CASES] +
                  [(name, cfg, how) for name, cfg, _, how in SWITCHES], f)
    with open(f"{tmp}/child.py", "w") as f:
        f.write(DS_CHILD)
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    p = subprocess.run([sys.executable, f"{tmp}/child.py", f"{tmp}/cases.json", f"{tmp}/ds.json"],
                       capture_output=True, text=True, env=env, timeout=1200)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit("FAIL: the DeepSpeed child failed")
    with open(f"{tmp}/ds.json") as f:
        return json.load(f)


def ztrain_verdict(tmp, cfg, run_dir=None):
    job = {"model": {"type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 8, "vocab_size": 256,
                     "block_size": 8},
           "data": {"train": "train.txt"}, "deepspeed": cfg}
    with open(f"{tmp}/job.json", "w") as f:
        json.dump(job, f)
    p = subprocess.run([tool("zt_job_check"), f"{tmp}/job.json"] + ([run_dir] if run_dir else []),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr.strip()


def main():
    ck = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/train.txt", "wb").write(b"x" * 4096)
        ds = deepspeed_verdicts(tmp)
        for name, cfg, key, _, on_purpose in CASES:
            rc, err = ztrain_verdict(tmp, cfg)
            verdict = ds[name]
            if verdict == "OK" and not on_purpose:
                ck.check(rc == 0, f"{name}: DeepSpeed accepts it, so does ztrain ({err[-200:]})")
            else:
                ck.check(rc != 0 and key in err,
                         f"{name}: DeepSpeed says {verdict[:120]!r}; ztrain refuses naming "
                         f"{key} ({err[-200:]})")
        for name, cfg, key, _ in SWITCHES:
            verdict, section = ds[name], key.split(".")[0]
            run_dir = f"{tmp}/run-{len(name)}-{abs(hash(name))}"
            os.makedirs(run_dir)
            rc, err = ztrain_verdict(tmp, cfg, run_dir)
            if section in HONOURED and verdict in ("ON", "OFF"):
                with open(f"{run_dir}/ds_config.effective.json") as f:
                    enabled = json.load(f)[section]["enabled"]
                ck.check(rc == 0 and enabled == (verdict == "ON"),
                         f"{name}: DeepSpeed turns it {verdict}; ztrain's effective config says "
                         f"enabled {enabled} ({err[-200:]})")
            elif verdict == "OFF":
                ck.check(rc == 0, f"{name}: DeepSpeed leaves it off; ztrain accepts it ({err[-200:]})")
            else:
                ck.check(rc != 0 and key in err,
                         f"{name}: DeepSpeed says {verdict[:120]!r}; ztrain refuses naming {key} "
                         f"({err[-200:]})")
    ck.done()


if __name__ == "__main__":
    main()
