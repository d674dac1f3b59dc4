#!/usr/bin/python3
"""ztrain's LR schedules against DeepSpeed's formulas.

For each DeepSpeed schedule (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest, and no
scheduler) this writes a DeepSpeed config, runs $ZTRAIN_BUILD/zt_lr_dump on it, and compares the lr
and momentum of every update with the schedule computed here in plain Python from the formulas in
shared/reference/deepspeed.md section 1.4 (not from ztrain's C code). A value passes when its
relative error is at most 1e-12, or its absolute error at most 1e-15 where the reference is ~0.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
from fractions import Fraction

REL_TOL = 1e-12
ABS_TOL = 1e-15

BUILD = os.environ.get("ZTRAIN_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TOOL = os.path.join(BUILD, "zt_lr_dump")


# ---- DeepSpeed's schedules, written from deepspeed.md 1.4 -------------------------------------
# Each function gives (lr, momentum) for the update made while last_batch_iteration == k.
# k = -1 before the first scheduler.step(), so update n (1-based) runs at k = n - 2.


def log_or_linear(k, n_warmup, warmup_type):
    n = max(2, n_warmup)
    if warmup_type == "linear":
        return k / n
    return math.log(k + 1) / math.log(n)


def warmup_lr(p, opt, k):
    lo = p.get("warmup_min_lr", 0.0)
    hi = p.get("warmup_max_lr", opt["lr"])  # WarmupLR: the optimizer's lr when omitted
    n = max(2, p.get("warmup_num_steps", 1000))
    if k < 0:
        return lo
    gamma = log_or_linear(k, n, p.get("warmup_type", "log")) if k < n else 1.0
    return lo + (hi - lo) * gamma


def warmup_decay_lr(p, opt, k):
    lo = p.get("warmup_min_lr", 0.0)
    hi = p.get("warmup_max_lr", 0.001)  # WarmupDecayLR's own default
    n = max(2, p.get("warmup_num_steps", 1000))
    total = p["total_num_steps"]
    if k < 0:
        return lo
    if k < n:
        gamma = log_or_linear(k, n, p.get("warmup_type", "log"))
    else:
        gamma = max(0.0, (total - k) / max(1, total - n))
    return lo + (hi - lo) * gamma


def warmup_cosine_lr(p, opt, k):
    if k < 0:
        return 0.0
    wmr = p.get("warmup_min_ratio", 0.0)
    cmr = p.get("cos_min_ratio", 1e-4)
    n = max(2, p.get("warmup_num_steps", 1000))
    total = p["total_num_steps"]
    if k < n:
        ratio = wmr + (1 - wmr) * log_or_linear(k, n, p.get("warmup_type", "log"))
    else:
        progress = min(1.0, (k - n + 1) / max(1, total - n))
        ratio = max(0.0, cmr + (1 - cmr) * (1 + math.cos(math.pi * progress)) / 2)
    return opt["lr"] * ratio


def lr_range_test_lr(p, opt, k):
    lo = p.get("lr_range_test_min_lr", 1e-3)
    if k < 0:
        return lo
    size = p.get("lr_range_test_step_size", 2000)
    rate = p.get("lr_range_test_step_rate", 1.0)
    interval = (k + 1) / size
    if p.get("lr_range_test_staircase", False):
        interval = math.floor(interval)
    return lo * (1 + rate * interval)


def one_cycle_scale(p, k):
    first = p.get("cycle_first_step_size", 2000)
    second = p.get("cycle_second_step_size", first)
    stairs1 = p.get("cycle_first_stair_count", 0)
    stairs2 = p.get("cycle_second_stair_count", stairs1)
    total = first + second
    i = k + 1
    if stairs1 or stairs2:
        # The staircase is a floor of the exact position in the cycle. Fractions keep the
        # position exact, so a stair edge is never missed by a rounding error.
        c = i % total
        if c <= first:
            s, stairs = Fraction(c, first), stairs1
        else:
            s, stairs = Fraction(total - c, second), stairs2
        if stairs > 0:
            return float(Fraction(math.floor(s * stairs), stairs))
    r = first / total
    x = 1 + i / total - math.floor(1 + i / total)
    return x / r if x <= r else (x - 1) / (r - 1)


def one_cycle(p, opt, k):
    """(lr, momentum) for OneCycle; momentum is None when it is not cycled."""
    lo, hi = p["cycle_min_lr"], p["cycle_max_lr"]
    mlo, mhi = p.get("cycle_min_mom", 0.8), p.get("cycle_max_mom", 0.9)
    cycling = p.get("cycle_momentum", True)
    first = p.get("cycle_first_step_size", 2000)
    total = first + p.get("cycle_second_step_size", first)
    decay_size = p.get("decay_step_size", 0)
    lr_rate, mom_rate = p.get("decay_lr_rate", 0.0), p.get("decay_mom_rate", 0.0)
    if k < 0:
        # The constructor sets lr to cycle_min_lr and beta1 to cycle_min_mom
        # (lr_schedules.py OneCycle._initialize_lr / _initialize_momentum).
        return lo, (mlo if cycling else None)
    if k < total:
        s = one_cycle_scale(p, k)
        return lo + (hi - lo) * s, (mhi - (mhi - mlo) * s if cycling else None)
    d = k - total + 1
    lr = lo if decay_size == 0 or lr_rate == 0 else lo / (1 + lr_rate * d / decay_size)
    mom = mhi if decay_size == 0 or mom_rate == 0 else mhi * (1 + mom_rate * d / decay_size)
    return lr, (mom if cycling else None)


def reference(config, k):
    opt = config["optimizer"]["params"]
    base_mom = opt.get("momentum", 0.0) if config["optimizer"]["type"] == "SGD" else opt.get(
        "betas", [0.9, 0.999])[0]
    sched = config.get("scheduler")
    if sched is None:
        return opt["lr"], base_mom
    kind, p = sched["type"], sched["params"]
    if kind == "OneCycle":
        lr, mom = one_cycle(p, opt, k)
        return lr, (base_mom if mom is None else mom)
    fn = {"WarmupLR": warmup_lr, "WarmupDecayLR": warmup_decay_lr,
          "WarmupCosineLR": warmup_cosine_lr, "LRRangeTest": lr_range_test_lr}[kind]
    return fn(p, opt, k), base_mom


# ---- cases ------------------------------------------------------------------------------------

ADAM = {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}
SGD = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}

CASES = [
    ("no_scheduler", ADAM, None, 5),
    ("warmup_lr_log", ADAM, {"type": "WarmupLR", "params": {
        "warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 20}}, 40),
    ("warmup_lr_linear_default_max", ADAM, {"type": "WarmupLR", "params": {
        "warmup_num_steps": 10, "warmup_type": "linear"}}, 20),
    ("warmup_lr_one_step_clamped", ADAM, {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.1, "warmup_max_lr": 0.3, "warmup_num_steps": 1}}, 6),
    ("warmup_lr_sgd_momentum", SGD, {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 0.05, "warmup_num_steps": 8,
        "warmup_type": "linear"}}, 12),
    ("warmup_decay_lr_linear_past_total", ADAM, {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 50, "warmup_min_lr": 1e-6, "warmup_max_lr": 5e-4,
        "warmup_num_steps": 10, "warmup_type": "linear"}}, 70),
    ("warmup_decay_lr_log", ADAM, {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 100, "warmup_num_steps": 25}}, 110),
    ("warmup_cosine_lr_log", ADAM, {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 40, "warmup_num_steps": 8, "warmup_min_ratio": 0.1,
        "cos_min_ratio": 1e-3}}, 50),
    ("warmup_cosine_lr_linear_defaults", ADAM, {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 30, "warmup_num_steps": 6, "warmup_type": "linear"}}, 35),
    ("one_cycle_decay_and_momentum", ADAM, {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10,
        "cycle_second_step_size": 14, "decay_lr_rate": 0.5, "decay_step_size": 4,
        "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}}, 45),
    ("one_cycle_stairs", ADAM, {"type": "OneCycle", "params": {
        "cycle_min_lr": 2e-4, "cycle_max_lr": 2e-3, "cycle_first_step_size": 12,
        "cycle_second_step_size": 8, "cycle_first_stair_count": 4,
        "cycle_second_stair_count": 2}}, 30),
    ("one_cycle_stairs_symmetric_defaults", ADAM, {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 9,
        "cycle_first_stair_count": 3, "decay_lr_rate": 0.1, "decay_step_size": 2}}, 30),
    ("one_cycle_asymmetric_peak", ADAM, {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 3,
        "cycle_second_step_size": 7}}, 14),
    ("one_cycle_no_momentum", ADAM, {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 5,
        "cycle_momentum": False, "decay_lr_rate": 1.0, "decay_step_size": 3}}, 20),
    # DeepSpeed takes float() of OneCycle's step sizes and only computes with total_num_steps:
    # a fractional half cycle, no descending half, and a decay that ends between two steps run.
    ("one_cycle_fractional_first", ADAM, {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 2.5}}, 10),
    ("one_cycle_no_second_half", ADAM, {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 3,
        "cycle_second_step_size": 0, "decay_lr_rate": 0.5, "decay_step_size": 2,
        "decay_mom_rate": 0.01}}, 10),
    ("warmup_decay_lr_fractional_total", ADAM, {"type": "WarmupDecayLR", "params": {
        "total_num_steps": 6.5, "warmup_num_steps": 2, "warmup_type": "linear"}}, 10),
    ("warmup_cosine_lr_fractional_total", ADAM, {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 6.5, "warmup_num_steps": 2}}, 10),
    ("lr_range_test", ADAM, {"type": "LRRangeTest", "params": {
        "lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 5,
        "lr_range_test_step_rate": 2.0}}, 20),
    ("lr_range_test_staircase", ADAM, {"type": "LRRangeTest", "params": {
        "lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 4,
        "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": True}}, 20),
]


def close(got, want):
    err = abs(got - want)
    return err <= ABS_TOL or err <= REL_TOL * abs(want)


def rel(got, want):
    return abs(got - want) / abs(want) if want != 0 else abs(got)


def run_case(tmp, name, optimizer, scheduler, steps):
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
              "optimizer": optimizer}
    if scheduler is not None:
        config["scheduler"] = scheduler
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    proc = subprocess.run([TOOL, path, str(steps)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        print(f"FAIL {name}: zt_lr_dump exited {proc.returncode}: {proc.stderr.strip()}")
        return False
    lines = proc.stdout.split("\n")[:-1]
    if len(lines) != steps:
        print(f"FAIL {name}: expected {steps} lines, got {len(lines)}")
        return False
    ok, worst, first_bad = True, 0.0, None
    for line in lines:
        step, lr, mom = line.split()
        step, lr, mom = int(step), float(lr), float(mom)
        want_lr, want_mom = reference(config, step - 2)
        for what, got, want in (("lr", lr, want_lr), ("momentum", mom, want_mom)):
            if not close(got, want):
                ok = False
                if first_bad is None:
                    first_bad = f"update {step} {what}: got {got!r}, want {want!r}"
            elif abs(got - want) > ABS_TOL:
                worst = max(worst, rel(got, want))
    if ok:
        print(f"PASS {name}: {steps} updates, max rel err {worst:.2e}")
    else:
        print(f"FAIL {name}: {first_bad}")
    return ok


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"FAIL: {TOOL} not built (set ZTRAIN_BUILD to the build directory)")
        return 1
    failed = 0
    with tempfile.TemporaryDirectory(prefix="zt_lr_") as tmp:
        for case in CASES:
            failed += not run_case(tmp, *case)
    print(f"{len(CASES) - failed}/{len(CASES)} schedule cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
