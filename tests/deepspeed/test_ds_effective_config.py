"""The effective config (`ztrain validate -o json`'s effective_config, the run directory's
ds_config.effective.json) read back by DeepSpeed 0.19 and by ztrain.

Every case's effective config must be taken by DeepSpeedConfig as it stands, with the offload
devices DeepSpeed reads from the original (the deprecated cpu_offload switches among them).

For each optimizer config, the effective optimizer.params go through DeepSpeed's own choice of the
class (engine.py: adam_w_mode popped, then DeepSpeedEngine.get_optimizer_configuration on a stub
engine for Adam/AdamW; FusedLamb for Lamb; torch.optim.SGD for SGD), and must bind to that class's
constructor signature: a key the class does not take is DeepSpeed's TypeError. Keys the class takes
and the config left out must be written with the class's own defaults (Lamb's max_coeff, ...).
The same effective config must then validate in ztrain again, giving the same optimizer section.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_effective_optimizer.py
(make test-deepspeed)
"""
import inspect
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsref  # noqa: E402,F401  (re-executes under .venv-ds)

import torch  # noqa: E402
from deepspeed.ops.lamb import FusedLamb  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from ztref import Checker, tool  # noqa: E402

CASES = {
    "AdamW": {"type": "AdamW", "params": {"lr": 0.01}},
    "Adam adam_w_mode false": {"type": "Adam", "params": {"lr": 0.01, "adam_w_mode": False,
                                                          "weight_decay": 0.1}},
    "AdamW torch_adam": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    "Adam torch_adam adam_w_mode false": {"type": "Adam", "params": {
        "lr": 0.01, "torch_adam": True, "adam_w_mode": False}},
    "Adam torch_adam decoupled_weight_decay": {"type": "Adam", "params": {
        "lr": 0.01, "torch_adam": True, "adam_w_mode": False, "decoupled_weight_decay": True,
        "weight_decay": 0.1}},
    "Lamb": {"type": "Lamb", "params": {"lr": 0.01}},
    "Lamb coefficients": {"type": "Lamb", "params": {"lr": 0.01, "max_coeff": 5.0,
                                                     "min_coeff": 0.1, "eps_inside_sqrt": True}},
    "SGD": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9, "nesterov": True}},
}

ZERO_CASES = {
    "cpu_offload": {"stage": 2, "cpu_offload": True},
    "cpu_offload false": {"stage": 0, "cpu_offload": False},
    "cpu_offload_param": {"stage": 3, "cpu_offload_param": True, "cpu_offload_use_pin_memory": True},
}


class StubEngine:
    """What get_optimizer_configuration asks of the engine: no optimizer offload here."""
    zenflow = False

    def zero_use_cpu_optimizer(self):
        return False

    def bf16_optimizer_states(self):
        return False


def deepspeed_class(opt):
    """(class, kwargs DeepSpeed adds, params it passes) as engine.py _configure_basic_optimizer."""
    params = dict(opt.get("params") or {})
    name = opt["type"].lower()
    if name in ("adam", "adamw"):
        adam_w_mode = params.pop("adam_w_mode", True)
        cls, kwargs = DeepSpeedEngine.get_optimizer_configuration(
            StubEngine(), params, name == "adamw" or adam_w_mode)
        return cls, kwargs, params
    if name == "lamb":
        return FusedLamb, {}, params
    return getattr(torch.optim, opt["type"]), {}, params


def validate(tmp, deepspeed):
    """ztrain validate's effective config for a job with this DeepSpeed config."""
    with open(os.path.join(tmp, "train.txt"), "w") as f:
        f.write("ztrain " * 400)
    job = {"name": "eff", "world_size": 1, "device": "cpu",
           "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                     "block_size": 16},
           "data": {"train": "train.txt"}, "train": {"max_steps": 2},
           "deepspeed": deepspeed}
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    p = subprocess.run([tool("ztrain"), "validate", path, "-o", "json"], capture_output=True,
                       text=True, timeout=60)
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError:
        return None, p.stdout + p.stderr
    if not out.get("valid"):
        return None, "; ".join(out.get("errors") or [p.stderr])
    return out["effective_config"], ""


def config(optimizer=None, zero=None):
    ds = {"train_batch_size": 2, "zero_allow_untested_optimizer": True,
          "optimizer": optimizer or {"type": "AdamW", "params": {"lr": 0.01}}}
    if zero:
        ds["zero_optimization"] = zero
    return ds


def deepspeed_reads(cfg):
    """DeepSpeedConfig of cfg, or the exception it raised."""
    try:
        return DeepSpeedConfig(cfg)
    except Exception as e:  # its pydantic or assertion error
        return e


def class_defaults(cls):
    return {k: v.default for k, v in inspect.signature(cls).parameters.items()
            if v.default is not inspect.Parameter.empty}


ck = Checker()
with tempfile.TemporaryDirectory() as tmp:
    for name, opt in CASES.items():
        full, err = validate(tmp, config(optimizer=opt))
        if not ck.check(full is not None, f"{name}: ztrain accepts the config ({err})"):
            continue
        eff = full["optimizer"]
        cls, kwargs, params = deepspeed_class(eff)
        try:
            inspect.signature(cls).bind(None, **params, **kwargs)
            bound = ""
        except TypeError as e:
            bound = str(e)
        ck.check(not bound, f"{name}: the effective params {sorted(params)} bind to "
                 f"{cls.__name__} as DeepSpeed builds it ({bound or 'ok'})")
        defaults = class_defaults(cls)
        for key in ("max_coeff", "min_coeff", "eps_inside_sqrt", "bias_correction", "maximize",
                    "dampening", "nesterov"):
            if key in defaults and key not in opt["params"]:
                ck.check(eff["params"].get(key) == defaults[key],
                         f"{name}: {key} written as {cls.__name__}'s default {defaults[key]} "
                         f"(effective: {eff['params'].get(key)})")
        again, err = validate(tmp, full)
        ck.check(again is not None and again["optimizer"] == eff,
                 f"{name}: the effective config validates again to the same optimizer section "
                 f"({err or again['optimizer']})")
    for name, zero in ZERO_CASES.items():
        full, err = validate(tmp, config(zero=zero))
        if not ck.check(full is not None, f"{name}: ztrain accepts the config ({err})"):
            continue
        want, got = deepspeed_reads(config(zero=zero)), deepspeed_reads(full)
        if not ck.check(not isinstance(got, Exception),
                        f"{name}: DeepSpeedConfig reads the effective config ({got})"):
            continue
        for section in ("offload_optimizer", "offload_param"):
            w, g = getattr(want.zero_config, section), getattr(got.zero_config, section)
            ck.check((w and w.device) in (None, "none") and (g and g.device) in (None, "none")
                     or (w and g and w.device == g.device and w.pin_memory == g.pin_memory),
                     f"{name}: {section} as DeepSpeed reads the original ({w} / {g})")
        again, err = validate(tmp, full)
        ck.check(again == full, f"{name}: the effective config validates again to itself ({err})")
ck.done()
