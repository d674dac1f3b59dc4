"""DeepSpeed configs as users have them (issue 20): the corpus in tests/configs/, modelled on the
Hugging Face integration templates, DeepSpeedExamples and DeepSpeed-Chat, each run for two steps
on a tiny GPT-2 or validated only (where running adds nothing), with

- the effective config (RUN_DIR/ds_config.effective.json) checked against the values transformers'
  own HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize give for the same
  config and arguments (its code, driven here with a plain namespace as TrainingArguments);
- every warning expected appearing exactly once, also with two ranks, and no other warning;
- the refusals naming the key, and an unknown key in every section of the key table refused;
- lr_scheduler_type "linear" against transformers' get_linear_schedule_with_warmup (torch), run
  as DeepSpeed runs its schedules: one step later.
"""
import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig  # noqa: E402
from transformers.training_args import TrainingArguments  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, ZTRAIN, Checks  # noqa: E402
CHECK_TOOL = os.path.join(BUILD, "zt_job_check")
CONFIGS = os.path.join(SRC, "tests", "configs")
N_EMBD = 32
MAX_STEPS = 2
sys.stdout.reconfigure(line_buffering=True)
ck = Checks()
check = ck.check


# The Trainer's arguments the corpus uses, all given (so HF compares every one, as ztrain does for
# arguments a job sets).
ARGS = {"learning_rate": 3e-4, "weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.95,
        "adam_epsilon": 1e-6, "max_grad_norm": 0.5, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2, "warmup_ratio": 0.5, "bf16": False, "fp16": False}

W_ALLGATHER = "zero_optimization.allgather_bucket_size has no effect"
W_NO_OPT = "no \"optimizer\" section: training with the Trainer's default AdamW"
W_PERSIST_16 = "stage3_param_persistence_threshold has no effect in bf16/fp16 training yet"

# name: (world, mode, training_args overrides or None for none, expected warnings, error or None)
CORPUS = {
    "hf_zero2_auto": (2, "run", {}, [W_ALLGATHER], None),
    "hf_zero3_auto": (2, "run", {}, [], None),
    "hf_no_optimizer": (1, "run", {"bf16": True}, [W_NO_OPT], None),
    "hf_no_batch_keys": (1, "run", {"max_grad_norm": 1.0},
                         [W_NO_OPT, "zero_optimization.overlap_comm has no effect with one rank"], None),
    "hf_bf16_zero3": (2, "check", {"bf16": True},
                      [W_PERSIST_16], None),
    "hf_mismatch": (1, "check", {}, [], "- ds train_micro_batch_size_per_gpu=4 vs hf "
                    "per_device_train_batch_size=2\n- ds optimizer.params.lr=0.0001 vs hf learning_rate=0.0003"),
    "dsexamples_cifar_stage0": (1, "run", None,
                                [W_ALLGATHER, "Config parameter cpu_offload is deprecated",
                                 "zero_optimization.reduce_bucket_size has no effect at ZeRO stage 0",
                                 "zero_optimization.overlap_comm has no effect at ZeRO stage 0"], None),
    "dschat_step1_zero2": (2, "run", None,
                           [W_NO_OPT, "zero_optimization.stage3_param_persistence_threshold has no "
                            "effect at ZeRO stage 2",
                            "zero_optimization.stage3_max_live_parameters has no effect",
                            "zero_optimization.stage3_prefetch_bucket_size has no effect at ZeRO stage 2",
                            "zero_optimization.memory_efficient_linear has no effect"], None),
    "dschat_step3_zero3_offload": (2, "check", None,
                                   [W_NO_OPT, W_PERSIST_16,
                                    "zero_optimization.stage3_max_live_parameters has no effect",
                                    "zero_optimization.memory_efficient_linear has no effect"], None),
    "data_efficiency_all_off": (1, "run", None, [], None),
    "data_efficiency_curriculum": (1, "check", None, [],
                                   "data_efficiency.data_sampling.curriculum_learning.enabled is not "
                                   "supported by ztrain"),
    "partition_activations": (2, "run", None,
                              ["activation_checkpointing.partition_activations has no effect: ztrain "
                               "keeps each rank's checkpointed block inputs whole, tensor-parallel "
                               "or not"], None),
    "monitors_off": (1, "check", None, [], None),
    "offload_nvme_stage3": (1, "check", None, [], None),
    "zero1_stage_knobs": (1, "check", None,
                          ["zero_optimization.reduce_bucket_size has no effect at ZeRO stage 1",
                           "zero_optimization.overlap_comm has no effect at ZeRO stage 1",
                           "zero_optimization.stage3_prefetch_bucket_size has no effect at ZeRO stage 1"],
                          None),
    "sections_without_effect": (1, "check", None,
                                ["checkpoint.tag_validation has no effect", "timers.throughput.enabled has "
                                 "no effect", "log_level has no effect", "pipeline has no effect",
                                 "weight_quantization has no effect",
                                 "zero_optimization.contiguous_gradients has no effect",
                                 "zero_optimization.round_robin_gradients has no effect"], None),
    "legacy_zero_bool": (1, "check", None, ["\"zero_optimization\": true is deprecated",
                                            "You are using ZeRO with an untested optimizer"], None),
    "refused_zenflow": (1, "check", None, [], "zero_optimization.zenflow is not supported by ztrain"),
    "refused_deepcompile": (1, "check", None, [], "compile.deepcompile is not supported by ztrain"),
    "refused_autotp": (1, "check", None, [], "tensor_parallel.autotp_size 2 does not divide the "
                       "job's 1 ranks"),
    "autotp_zero1": (4, "run", None, [], None),
    "refused_torch_autocast": (1, "check", None, [], "torch_autocast.enabled is not supported by ztrain"),
    "refused_progressive_layer_drop": (1, "check", None, [],
                                       "progressive_layer_drop: removed from DeepSpeed 0.19"),
    "refused_autotuning": (1, "check", None, [], "autotuning.enabled is not supported by ztrain"),
    "autotuning_off": (1, "check", None, [], None),
}


class RefConfig(HfTrainerDeepSpeedConfig):
    """transformers' resolution over a plain dict; the node lookups are accelerate's (absent from
    this environment), which walk the dotted path the same way."""

    def __init__(self, config):
        self.config = config
        self._dtype = None
        self.mismatches = []

    def find_config_node(self, ds_key_long):
        config = self.config
        nodes = ds_key_long.split(".")
        ds_key = nodes.pop()
        for node in nodes:
            config = config.get(node)
            if config is None:
                return None, ds_key
        return config, ds_key

    def get_value(self, ds_key_long, default=None):
        config, ds_key = self.find_config_node(ds_key_long)
        return default if config is None else config.get(ds_key, default)

    def is_true(self, key):
        value = self.get_value(key)
        return False if value is None else bool(value)

    def is_false(self, key):
        value = self.get_value(key)
        return False if value is None else not bool(value)

    def is_zero3(self):
        return self.get_value("zero_optimization.stage") == 3


def hf_resolve(ds, args, world):
    """What the Trainer makes of ds: (resolved dict, mismatch error text or None)."""
    ns = types.SimpleNamespace(world_size=world, fp16_full_eval=False, bf16_full_eval=False,
                               fp16_backend="auto", fp16_opt_level="O1", save_on_each_node=False,
                               warmup_steps=0, **args)
    ns.get_warmup_steps = lambda n: TrainingArguments.get_warmup_steps(ns, n)
    ref = RefConfig(copy.deepcopy(ds))
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=N_EMBD))
    try:
        ref.trainer_config_process(ns)
        ref.trainer_config_finalize(ns, model, MAX_STEPS)
    except ValueError as e:
        return ref.config, str(e)
    return ref.config, None


def autos(tree, prefix=""):
    """The dotted paths of every "auto" value."""
    out = []
    for k, v in tree.items():
        path = prefix + k
        if isinstance(v, dict):
            out += autos(v, path + ".")
        elif v == "auto":
            out.append(path)
    return out


def get(tree, path):
    for part in path.split("."):
        tree = tree[part]
    return tree


def write_job(tmp, name, ds, world, args):
    job = {"name": name, "world_size": world,
           "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": N_EMBD, "vocab_size": 256,
                     "block_size": 16},
           "data": {"train": "train.txt"},
           "train": {"max_steps": MAX_STEPS, "log_interval": 1, "warmup_steps": 0},
           "deepspeed": ds}
    if args is not None:
        job["training_args"] = args
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def warning_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("ztrain: warning:")]


def check_config(tmp, name, spec):
    world, mode, overrides, want_warnings, want_error = spec
    with open(os.path.join(CONFIGS, name + ".json")) as f:
        ds = json.load(f)
    args = None if overrides is None else dict(ARGS, **overrides)
    job = write_job(tmp, name, ds, world, args)
    # An nvme offload's directory must exist before the ranks start (the job's file checks).
    os.makedirs(os.path.join(tmp, "nvme"), exist_ok=True)
    run_dir = os.path.join(tmp, "runs", name)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if mode == "run":
        cmd = [ZTRAIN, "run", job, "--out", run_dir]
    else:
        cmd = [CHECK_TOOL, job, run_dir]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if want_error:
        check(p.returncode != 0 and want_error in p.stderr,
              f"{name}: refused with '{want_error}' (got rc {p.returncode}: {p.stderr.strip()[-300:]})")
        if name == "hf_mismatch":
            _, hf_error = hf_resolve(ds, args, world)
            mine = p.stderr.strip().split(": deepspeed: ", 1)[-1]
            check(hf_error == mine, f"{name}: the same error as transformers' ({hf_error!r} vs {mine!r})")
        return
    check(p.returncode == 0, f"{name}: {mode} succeeds (rc {p.returncode}: {p.stderr.strip()[-400:]})")
    if p.returncode != 0:
        return
    lines = warning_lines(p.stderr)
    for w in want_warnings:
        n = sum(w in l for l in lines)
        check(n == 1, f"{name}: warning '{w}' appears exactly once (seen {n} times)")
    unexpected = [l for l in lines if not any(w in l for w in want_warnings)]
    check(not unexpected, f"{name}: no other warning ({unexpected})")
    with open(os.path.join(run_dir, "ds_config.effective.json")) as f:
        eff = json.load(f)
    # DeepSpeed's batch world is the data-parallel size: the ranks over the tensor-parallel ones.
    dp = world // max(1, ds.get("tensor_parallel", {}).get("autotp_size", 1))
    check(eff["train_batch_size"] == eff["train_micro_batch_size_per_gpu"] *
          eff["gradient_accumulation_steps"] * dp, f"{name}: effective batch triple is consistent")
    if args is None:
        return
    # Hugging Face's resolution of the same config, with the config's missing pieces as the
    # Trainer supplies them: its own AdamW (from the arguments) and the DataLoader's batch size.
    hf, hf_error = hf_resolve(ds, args, world)
    check(hf_error is None, f"{name}: transformers accepts it ({hf_error})")
    for path in autos(ds):
        try:
            want = get(hf, path)
        except KeyError:
            continue
        if want == "auto":
            continue  # HF leaves it (stage-3 keys below stage 3): ztrain's default applies
        got = get(eff, path)
        same = (isinstance(want, list) and got == want) or (
            not isinstance(want, list) and math.isclose(float(got), float(want), rel_tol=1e-12))
        check(same, f"{name}: {path} = {got}, transformers says {want}")
    if "optimizer" not in ds:
        p_ = eff["optimizer"]["params"]
        check(eff["optimizer"]["type"] == "AdamW" and p_["lr"] == args["learning_rate"] and
              p_["betas"] == [args["adam_beta1"], args["adam_beta2"]] and
              p_["eps"] == args["adam_epsilon"] and p_["weight_decay"] == args["weight_decay"],
              f"{name}: no optimizer: the Trainer's AdamW from the arguments ({p_})")
    if "train_batch_size" not in ds and "train_micro_batch_size_per_gpu" not in ds:
        check(eff["train_micro_batch_size_per_gpu"] == args["per_device_train_batch_size"] and
              eff["gradient_accumulation_steps"] == args["gradient_accumulation_steps"],
              f"{name}: missing batch keys from the DataLoader's batch size and the accumulation")
    if "warmup_num_steps" in autos(ds.get("scheduler", {}).get("params", {})):
        check(eff["scheduler"]["params"]["warmup_num_steps"] == math.ceil(MAX_STEPS * args["warmup_ratio"]),
              f"{name}: warmup_num_steps = ceil(max_steps * warmup_ratio)")


def check_linear_schedule(tmp):
    """lr_scheduler_type "linear" without a scheduler: transformers' get_linear_schedule_with_warmup,
    run as a DeepSpeed schedule, one step later (DeepSpeed's first step is at lr 0)."""
    import torch
    from transformers import get_linear_schedule_with_warmup
    steps, warmup, lr = 6, 2, 1e-3
    job = write_job(tmp, "linear", {"zero_optimization": {"stage": 0}}, 1,
                    {"learning_rate": lr, "warmup_steps": warmup, "lr_scheduler_type": "linear",
                     "per_device_train_batch_size": 2})
    with open(job) as f:
        spec = json.load(f)
    spec["train"]["max_steps"] = steps
    with open(job, "w") as f:
        json.dump(spec, f)
    out = os.path.join(tmp, "runs", "linear")
    p = subprocess.run([ZTRAIN, "run", job, "--out", out], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    check(p.returncode == 0, f"linear schedule: the run succeeds ({p.stderr.strip()[-300:]})")
    if p.returncode != 0:
        return
    with open(os.path.join(out, "metrics.jsonl")) as f:
        got = [json.loads(l)["train/learning_rate"] for l in f]
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_linear_schedule_with_warmup(opt, warmup, steps)
    hf = []
    for _ in range(steps):
        hf.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    want = [0.0] + hf[:-1]
    check(len(got) == steps and all(math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-12)
                                    for g, w in zip(got, want)),
          f"linear schedule: lr per step {got} = transformers' {hf} one step later")


def check_unknown_keys(tmp):
    """An unknown key in every section of the key table is refused naming the key and section."""
    table = subprocess.run([ZTRAIN, "config-keys"], capture_output=True, text=True).stdout
    rows = re.findall(r"^\| `([^`]+)`( \(contents not listed\))? \|", table, re.M)
    paths = [p for p, _ in rows]
    sections = {p for p in paths if any(q.startswith(p + ".") for q in paths)}
    opaque = {p for p, o in rows if o}
    n = 0
    for sec in sorted(sections - opaque):
        if any(sec.startswith(o + ".") for o in opaque):
            continue
        ds = {"train_batch_size": 8}
        node = ds
        for part in sec.split("."):
            node = node.setdefault(part, {})
        node["no_such_knob"] = 1
        job = write_job(tmp, "unknown", ds, 1, None)
        p = subprocess.run([CHECK_TOOL, job], capture_output=True, text=True, timeout=30)
        ok = p.returncode == 1 and f"unknown key 'no_such_knob' in {sec}" in p.stderr
        check(ok, f"unknown key in {sec} refused naming it ({p.stderr.strip()[:160]})")
        n += 1
    check(n >= 15, f"{n} sections checked for unknown keys")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "train.txt"), "wb") as f:
            f.write(b"It was the best of times, it was the worst of times. " * 200)
        names = sorted(n[:-5] for n in os.listdir(CONFIGS) if n.endswith(".json"))
        check(sorted(CORPUS) == names, f"every corpus file has its expectations ({len(names)} files)")
        for name in names:
            if name in CORPUS:
                check_config(tmp, name, CORPUS[name])
        check_linear_schedule(tmp)
        check_unknown_keys(tmp)
    ck.finish()


if __name__ == "__main__":
    main()
