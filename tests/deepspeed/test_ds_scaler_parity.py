"""The fp16 loss scaler against DeepSpeed 0.19's own objects (.venv-ds), where
tests/reference/test_loss_scaler.py checks the rules as written out from the reference notes.

Each case is a DeepSpeed config (an fp16 section, a ZeRO stage) and a seeded pattern of overflow
('o') and clean ('.') steps. DeepSpeedConfig reads the config; the scaler is built as the engine
builds it: at ZeRO stages 1-3 CreateLossScaler(torch.half, loss_scale, dynamic,
dynamic_loss_scale_args()) and its update_scale (DynamicLossScaler: hysteresis, consecutive
hysteresis, the "already at minimum" exception); at stage 0 FP16_Optimizer._update_scale on a
LossScaleConfig of the fused profile (no hysteresis, no exception); a static loss_scale too.
zt_scaler_dump reads the same config file and runs ztrain's scaler over the pattern. Every step's
scale before and after must be equal, and ztrain must fail at the step where DeepSpeed raises.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_scaler_parity.py (make test-deepspeed)
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsref  # noqa: E402,F401  (re-executes under .venv-ds)

import torch  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer  # noqa: E402
from deepspeed.runtime.fp16.loss_scaler import (CreateLossScaler, LossScaleConfig,  # noqa: E402
                                                LossScaleProfile)
from ztref import Checker, tool  # noqa: E402

# DynamicLossScaler logs on rank 0 only and asks the rank; no process group is needed here.
dist.get_rank = lambda *args, **kwargs: 0

STEPS = 24


def deepspeed_scales(cfg, pattern):
    """[(before, after)] per step, and the exception's text if DeepSpeed raised (else None)."""
    f = DeepSpeedConfig(cfg).float16_config
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    dynamic = f.enabled and f.loss_scale == 0
    out = []
    if stage > 0:
        scaler = CreateLossScaler(torch.half, f.loss_scale, dynamic, f.dynamic_loss_scale_args())
        for step in pattern:
            before = scaler.cur_scale
            try:
                scaler.update_scale(step == "o")
            except Exception as e:  # the "already at minimum" exception
                return out, str(e)
            out.append((float(before), float(scaler.cur_scale)))
        return out, None
    lsc = LossScaleConfig(low_precision_dtype=torch.half, dynamic_loss_scale=dynamic,
                          static_loss_scale=f.loss_scale,
                          dynamic_loss_args=f.dynamic_loss_scale_args(),
                          profile=LossScaleProfile.FUSED,
                          initial_dynamic_scale=2**f.initial_scale_power)
    opt = types.SimpleNamespace(loss_scale_config=lsc, verbose=False)
    for step in pattern:
        before = lsc.cur_scale
        FP16_Optimizer._update_scale(opt, step == "o")
        out.append((float(before), float(lsc.cur_scale)))
    return out, None


def ztrain_scales(tmp, cfg, pattern):
    path = os.path.join(tmp, "ds.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = subprocess.run([tool("zt_scaler_dump"), path, pattern], capture_output=True, text=True,
                       timeout=60)
    rows = [(float(line.split()[2]), float(line.split()[3])) for line in p.stdout.splitlines()]
    err = p.stderr.strip().splitlines()[-1] if p.returncode != 0 and p.stderr.strip() else None
    return rows, err, p.returncode


def cases():
    rng = random.Random(5)
    for stage in (0, 1, 2, 3):
        for power, window, hysteresis, consecutive, min_scale in (
                (3, 1, 1, False, 1), (3, 2, 2, False, 1), (4, 3, 3, True, 2), (2, 2, 2, True, 1),
                (16, 5, 2, False, 4), (1, 1, 3, False, 2), (0, 2, 1, True, 1)):
            fp16 = {"enabled": True, "initial_scale_power": power, "loss_scale_window": window,
                    "hysteresis": hysteresis, "consecutive_hysteresis": consecutive,
                    "min_loss_scale": min_scale}
            for _ in range(3):
                pattern = "".join(rng.choice("oo..." if power < 4 else "o..") for _ in range(STEPS))
                yield stage, fp16, pattern
        yield stage, {"enabled": True, "loss_scale": 128}, "o..o.o" * 4


def deepspeed_backward_error(cfg):
    """What the scaler's first backward raises (loss * the scale, a Python int 2**power), or
    None."""
    f = DeepSpeedConfig(cfg).float16_config
    scaler = CreateLossScaler(torch.half, f.loss_scale, True, f.dynamic_loss_scale_args())
    x = torch.tensor(1.0, requires_grad=True)
    try:
        scaler.backward(x * 2)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


ck = Checker()
with tempfile.TemporaryDirectory() as tmp:
    # The initial scale's range: DeepSpeed fails at the first backward from 2**64 on; ztrain
    # refuses the config there, naming the key, and runs 2**63.
    for stage, power in ((0, 63), (1, 63), (0, 64), (2, 64), (1, 1024)):
        cfg = {"train_batch_size": 2, "zero_optimization": {"stage": stage},
               "fp16": {"enabled": True, "initial_scale_power": power}}
        ds_err = deepspeed_backward_error(cfg)
        zt, zt_err, rc = ztrain_scales(tmp, cfg, "o.")
        ck.check((rc not in (0, 3)) == (ds_err is not None) and
                 (ds_err is None or "initial_scale_power" in (zt_err or "")),
                 f"stage {stage}, initial_scale_power {power}: DeepSpeed's first backward "
                 f"{ds_err or 'runs'}; ztrain {zt_err or 'runs'}")
    for stage, fp16, pattern in cases():
        cfg = {"train_batch_size": 2, "fp16": fp16, "zero_optimization": {"stage": stage}}
        ds, ds_err = deepspeed_scales(cfg, pattern)
        zt, zt_err, rc = ztrain_scales(tmp, cfg, pattern)
        name = f"stage {stage} {json.dumps(fp16)} {pattern}"
        ck.check(rc in (0, 3) and zt == ds,
                 f"{name}: the scale before and after each step equals DeepSpeed's "
                 f"({len(zt)} steps vs {len(ds)}, rc {rc}, first difference at "
                 f"{next((i for i, (a, b) in enumerate(zip(zt, ds)) if a != b), min(len(zt), len(ds)))})")
        ck.check((rc == 3) == (ds_err is not None) and (ds_err is None or ds_err in (zt_err or "")),
                 f"{name}: fails where DeepSpeed raises ({ds_err!r} vs {zt_err!r})")
ck.done()
