"""The batch keys of a job's DeepSpeed config, "auto" among them, against transformers'
HfTrainerDeepSpeedConfig.trainer_config_process and DeepSpeedConfig themselves (.venv-ds).

For every combination of train_batch_size, train_micro_batch_size_per_gpu and
gradient_accumulation_steps, each absent, "auto" or one of a few numbers (0 and values that do
not divide included), on data-parallel sizes 1, 2 and 3, `ztrain validate` of a job holding that
config must end as the Trainer and DeepSpeed end it: the same batch triple, or a refusal.

- A job that sets per_device_train_batch_size and gradient_accumulation_steps: the Trainer with
  those arguments (its mismatch error included).
- A job that sets neither: ztrain compares no argument left at its default (docs/deepspeed.md),
  so the reference is the Trainer given the arguments the config fixes (a whole micro batch or
  accumulation >= 1, else the default 8 and 1), mismatches ignored; "auto" train_batch_size
  beside a fixed micro batch 16 is 16 per rank, not the default 8 that DeepSpeed would refuse as
  0 accumulation steps.
In both, a config left with neither train_batch_size nor the micro batch gets the micro batch (and
a missing accumulation) from the arguments, as ztrain documents (DeepSpeed alone refuses it).
A refusal about the batch after "auto" was filled quotes what was filled, by key and value.

max_grad_norm 1, 0.5, 0 and -1 with "gradient_clipping": "auto": ztrain accepts each and hands
DeepSpeed's engine the gradient_clipping the Trainer fills (at or below 0, no clipping in both: the
Trainer and DeepSpeed clip only above 0).

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_batch_auto.py (make test-deepspeed)
"""
import copy
import inspect
import itertools
import json
import logging
import os
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dsref import tool  # noqa: E402  (re-executes under .venv-ds)

import deepspeed.runtime.config as dsc  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig  # noqa: E402
from ztref import Checker, run  # noqa: E402

KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
VALUES = (None, "auto", 0, 2, 4, 16)
WORLDS = (1, 2, 3)
GIVEN = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}

dsc.logger.setLevel(logging.ERROR)
dsc.dist.get_rank = lambda: 0


class Mpu:
    def __init__(self, n):
        self.n = n

    def get_data_parallel_world_size(self):
        return self.n


class TrainerConfig(HfTrainerDeepSpeedConfig):
    """transformers' resolution over a plain dict; the node lookups it inherits are accelerate's
    (absent from .venv-ds), which walk the dotted path as these do."""

    def __init__(self, config):
        self.config, self._dtype, self.mismatches = config, None, []

    def find_config_node(self, ds_key_long):
        *nodes, ds_key = ds_key_long.split(".")
        config = self.config
        for node in nodes:
            config = config.get(node)
            if config is None:
                return None, ds_key
        return config, ds_key

    def is_true(self, ds_key_long):
        config, ds_key = self.find_config_node(ds_key_long)
        return bool(config and config.get(ds_key))


def fixed(v):
    return isinstance(v, int) and v >= 1


def trainer_args(world, batch, max_grad_norm=1.0):
    return types.SimpleNamespace(
        world_size=world, per_device_train_batch_size=batch["per_device_train_batch_size"],
        gradient_accumulation_steps=batch["gradient_accumulation_steps"],
        max_grad_norm=max_grad_norm,
        learning_rate=5e-5, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        weight_decay=0.0, save_on_each_node=False, fp16=False, fp16_full_eval=False, bf16=False,
        bf16_full_eval=False)


def reference(ds, world, given):
    """("ok", [train, micro, gas]) or ("refused", why)."""
    if given:
        batch = GIVEN
    else:
        batch = {"per_device_train_batch_size": ds["train_micro_batch_size_per_gpu"]
                 if fixed(ds.get("train_micro_batch_size_per_gpu")) else 8,
                 "gradient_accumulation_steps": ds["gradient_accumulation_steps"]
                 if fixed(ds.get("gradient_accumulation_steps")) else 1}
    hf = TrainerConfig(copy.deepcopy(ds))
    hf.trainer_config_process(trainer_args(world, batch))
    if given and hf.mismatches:
        return "refused", "mismatch: " + "; ".join(hf.mismatches)
    cfg = hf.config
    if "train_batch_size" not in cfg and "train_micro_batch_size_per_gpu" not in cfg:
        cfg["train_micro_batch_size_per_gpu"] = batch["per_device_train_batch_size"]
        cfg.setdefault("gradient_accumulation_steps", batch["gradient_accumulation_steps"])
    try:
        c = dsc.DeepSpeedConfig(cfg, mpu=Mpu(world))
    except (AssertionError, ZeroDivisionError) as e:
        return "refused", f"{type(e).__name__}: {e}"
    return "ok", [c.train_batch_size, c.train_micro_batch_size_per_gpu,
                  c.gradient_accumulation_steps]


def job(ds, world, given):
    spec = {"name": "b", "world_size": world, "device": "cpu",
            "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256,
                      "block_size": 8},
            "data": {"train": "train.txt"}, "train": {"max_steps": 4}, "deepspeed": ds}
    if given:
        spec["training_args"] = dict(GIVEN)
    return spec


def ztrain_validate(tmp, spec):
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    p = run([tool("ztrain"), "validate", path, "--json"], check=False, cwd=tmp, timeout=60)
    out = json.loads(p.stdout)
    if not out["valid"]:
        return "refused", " ".join(out["errors"])
    eff = out["effective_config"]
    return "ok", [eff[k] for k in KEYS]


ck = Checker()
counts = {"ok": 0, "refused": 0}
failures = []
with tempfile.TemporaryDirectory(prefix="ztrain-batch-auto-") as tmp:
    with open(os.path.join(tmp, "train.txt"), "w") as f:
        f.write("some bytes to train on\n" * 200)
    for world, given, vals in itertools.product(WORLDS, (True, False),
                                                itertools.product(VALUES, repeat=3)):
        ds = {k: v for k, v in zip(KEYS, vals) if v is not None}
        want, zt = reference(ds, world, given), ztrain_validate(tmp, job(ds, world, given))
        counts[want[0]] += 1
        where = f"{ds} on {world} ranks, training_args {'set' if given else 'not set'}"
        if want[0] != zt[0] or (want[0] == "ok" and want[1] != zt[1]):
            failures.append(f"{where}: the Trainer and DeepSpeed: {want}, ztrain: {zt}")
        elif zt[0] == "refused" and "auto" in vals and "has to be greater" in zt[1] and \
                '"auto" ' not in zt[1]:
            failures.append(f"{where}: the refusal does not quote the \"auto\" filled: {zt[1]}")

def clipping_reference(max_grad_norm):
    """gradient_clipping "auto" as the Trainer fills it and DeepSpeedConfig reads it, and whether
    DeepSpeed then clips (its engine clips only above 0)."""
    hf = TrainerConfig({"train_batch_size": 8, "gradient_clipping": "auto"})
    hf.trainer_config_process(trainer_args(1, DEFAULTS, max_grad_norm))
    clip = dsc.DeepSpeedConfig(hf.config, mpu=Mpu(1)).gradient_clipping
    return clip, clip > 0.0


# max_grad_norm at or below 0 is the Trainer's "no clipping" (it clips only when > 0); ztrain
# takes it as DeepSpeed gets it. DeepSpeed's rule, read from its engine's source: it clips only
# when gradient_clipping > 0, as ztrain's engine does (engine.c, clip_gradients).
rule = inspect.getsource(DeepSpeedEngine._take_model_step)
ck.check("if self.gradient_clipping() > 0.0:" in rule,
         "DeepSpeed's engine clips only when gradient_clipping > 0")
with tempfile.TemporaryDirectory(prefix="ztrain-clip-auto-") as tmp:
    with open(os.path.join(tmp, "train.txt"), "w") as f:
        f.write("some bytes to train on\n" * 200)
    for mgn in (1.0, 0.5, 0.0, -1.0):
        clip, clips = clipping_reference(mgn)
        spec = job({"train_batch_size": 8, "gradient_clipping": "auto"}, 1, False)
        spec["training_args"] = {"max_grad_norm": mgn}
        path = os.path.join(tmp, "job.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        p = run([tool("ztrain"), "validate", path, "--json"], check=False, cwd=tmp, timeout=60)
        out = json.loads(p.stdout)
        got = out["effective_config"].get("gradient_clipping") if out["valid"] else None
        ck.check(out["valid"] and got == clip,
                 f"max_grad_norm {mgn}: DeepSpeed gets gradient_clipping {clip} (clips: {clips}), "
                 f"ztrain {got if out['valid'] else out['errors']}")

for f in failures[:30]:
    print("FAIL:", f)
ck.check(not failures, f"{counts['ok'] + counts['refused']} jobs: the Trainer and DeepSpeed accept "
         f"{counts['ok']}, refuse {counts['refused']}; {len(failures)} disagreements with ztrain")
ck.done()
