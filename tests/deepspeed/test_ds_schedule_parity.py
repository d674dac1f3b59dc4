"""The scheduler section against DeepSpeed 0.19 itself (.venv-ds): for each config, DeepSpeedConfig
reads it and the schedule is built as the engine builds it (getattr(lr_schedules, type)(optimizer,
**params), deepspeed/runtime/engine.py _scheduler_from_config) on a torch AdamW with the config's
lr. Where DeepSpeed fails, zt_lr_dump (the same parser as `ztrain run`) must refuse; where it runs,
ztrain must accept, and the lr (and OneCycle's beta1) of each of the first updates must equal
DeepSpeed's param_groups within 1e-12: whole-number floats where DeepSpeed wants an int, fractional
OneCycle step sizes and total_num_steps, a zero second half, true as an int, and null.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_schedule_parity.py (make test-deepspeed)
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dsref import zt_lr_dump  # noqa: E402  (re-executes under .venv-ds)

import torch  # noqa: E402
from deepspeed.runtime import lr_schedules  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from ztref import Checker  # noqa: E402

UPDATES = 9
LR = 0.01


def config(scheduler):
    return {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": LR}},
            "scheduler": scheduler}


OC = {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2}
CASES = {
    "warmup_num_steps 3.0": {"type": "WarmupLR", "params": {"warmup_num_steps": 3.0}},
    "warmup_num_steps 3": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
    "warmup_num_steps true": {"type": "WarmupLR", "params": {"warmup_num_steps": True}},
    "warmup_num_steps null": {"type": "WarmupLR", "params": {"warmup_num_steps": None}},
    "lr_range_test_step_size 2.0": {"type": "LRRangeTest",
                                    "params": {"lr_range_test_step_size": 2.0}},
    "lr_range_test_step_size 2": {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 2}},
    "OneCycle second half 0": {"type": "OneCycle", "params": dict(
        OC, cycle_first_step_size=3, cycle_second_step_size=0, decay_lr_rate=0.5,
        decay_step_size=2)},
    "OneCycle first 2.5": {"type": "OneCycle", "params": dict(OC, cycle_first_step_size=2.5)},
    "OneCycle second null": {"type": "OneCycle", "params": dict(
        OC, cycle_first_step_size=2, cycle_second_step_size=None)},
    "OneCycle cycle_momentum null": {"type": "OneCycle", "params": dict(
        OC, cycle_first_step_size=2, cycle_momentum=None)},
    "OneCycle first 0": {"type": "OneCycle", "params": dict(OC, cycle_first_step_size=0)},
    "OneCycle decay_step_size null": {"type": "OneCycle", "params": dict(OC, decay_step_size=None)},
    "WarmupDecayLR total 6.5": {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 6.5, "warmup_num_steps": 2, "warmup_type": "linear"}},
    "WarmupDecayLR total 0": {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 0, "warmup_num_steps": 2}},
    "WarmupDecayLR total null": {"type": "WarmupDecayLR", "params": {"total_num_steps": None}},
    "WarmupDecayLR warmup_max_lr null": {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 8, "warmup_num_steps": 3, "warmup_max_lr": None}},
    "WarmupCosineLR total 6.5": {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 6.5, "warmup_num_steps": 2}},
    "WarmupLR without params": {"type": "WarmupLR"},
    "WarmupLR params null": {"type": "WarmupLR", "params": None},
    "type null": {"type": None, "params": {}},
}


def deepspeed_run(cfg):
    """[(lr, beta1)] per update, or the exception DeepSpeed raised."""
    try:
        c = DeepSpeedConfig(cfg)
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        sch = (getattr(lr_schedules, c.scheduler_name)(opt, **c.scheduler_params)
               if c.scheduler_name else None)
        out = []
        for _ in range(UPDATES):
            g = opt.param_groups[0]
            out.append((g["lr"], g["betas"][0]))
            if sch:
                sch.step()
        return out
    except Exception as e:  # DeepSpeed's refusal (ValueError) or crash (TypeError, ...)
        return e


def ztrain_run(tmp, cfg):
    p = zt_lr_dump(tmp, cfg, UPDATES)
    if p.returncode != 0:
        return p.stderr.strip()
    return [tuple(float(v) for v in line.split()[1:]) for line in p.stdout.splitlines()]


def close(a, b):
    return abs(a - b) <= 1e-12 * max(abs(b), 1e-12)


ck = Checker()
with tempfile.TemporaryDirectory() as tmp:
    for name, sched in CASES.items():
        cfg = config(sched)
        ds, zt = deepspeed_run(cfg), ztrain_run(tmp, cfg)
        if isinstance(ds, Exception):
            ck.check(isinstance(zt, str), f"{name}: DeepSpeed fails ({type(ds).__name__}: "
                     f"{str(ds)[:90]}), ztrain refuses: {zt if isinstance(zt, str) else 'accepted'}")
            continue
        if isinstance(zt, str):
            ck.check(False, f"{name}: DeepSpeed runs it, ztrain refuses: {zt}")
            continue
        one_cycle = sched.get("type") == "OneCycle"
        ok = len(zt) == len(ds) and all(
            close(z[0], d[0]) and (not one_cycle or close(z[1], d[1])) for z, d in zip(zt, ds))
        ck.check(ok, f"{name}: the lr{' and beta1' if one_cycle else ''} of {UPDATES} updates "
                 f"equal DeepSpeed's: {[round(z[0], 8) for z in zt]} vs {[round(d[0], 8) for d in ds]}")
ck.done()
