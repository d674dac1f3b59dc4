"""The slow_rank event with `ztrain run`: rank 1 of 2 sleeps 150 ms at the start of every step
(ZTRAIN_INJECT_SLOW_RANK); with slow_rank.factor 2 every step must report rank 1, its time over
the lower median of the two ranks' times (rank 0's, as the message says) at least the factor
(the sleep alone is 150 ms against steps of a few ms), the message's took / median the event's
value, in events.jsonl and the progress output, while training goes on (policy record). With the policy
checkpoint_and_stop the run must end at step 1 with the event as its error and a checkpoint of
that step. A job whose ranks run alike reports nothing.

Run: ZTRAIN_BUILD=<build dir> python3 tests/cli/test_slow_rank.py
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import ZTRAIN, Checks  # noqa: E402

TEXT = b"It was the best of times, it was the worst of times, it was the age of wisdom. " * 40
ck = Checks()
check = ck.check


def job(d, name, policy, steps=4, events=None, world=2, fp16=False):
    spec = {"name": name, "world_size": world,
            "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                      "block_size": 32},
            "data": {"train": "train.txt"},
            "train": {"max_steps": steps, "log_interval": 1, "checkpoint_dir": f"ckpt-{name}"},
            "events": events or {"slow_rank": {"factor": 2, "policy": policy}},
            "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}
    if fp16:
        spec["deepspeed"]["fp16"] = {"enabled": True, "initial_scale_power": 32}
    path = f"{d}/{name}.json"
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def run(path, out, slow):
    env = dict(os.environ)
    env.pop("ZTRAIN_INJECT_SLOW_RANK", None)
    if slow:
        env["ZTRAIN_INJECT_SLOW_RANK"] = "150:1"
    return subprocess.run([ZTRAIN, "run", path, "--out", out, "--threads", "1"], env=env,
                          capture_output=True, text=True, timeout=120)


def events(out):
    try:
        with open(f"{out}/events.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(TEXT)
    p = run(job(d, "record", "record"), f"{d}/record", slow=True)
    check(p.returncode == 0, f"the run goes on with the policy record ({p.stderr[-300:]})")
    ev = events(f"{d}/record")
    check([(e["kind"], e["train/global_step"], e["rank"]) for e in ev] ==
          [("slow_rank", s, 1) for s in range(1, 5)], f"every step names rank 1: {ev}")
    check(all(e["value"] >= 2 for e in ev), f"the ratios are at least the factor: "
          f"{[e['value'] for e in ev]}")
    check("event slow_rank: step 1: rank 1 took" in p.stdout, "the progress output says so")
    # The message names the median it compares with, the lower one of the two ranks' times
    # (rank 0's here), and its numbers are the event's ratio: took / median = value.
    parsed = [re.match(r"step \d+: rank 1 took ([0-9.]+) ms, ([0-9.]+) times the lower median "
                       r"of the 2 ranks' times, ([0-9.]+) ms \(factor 2\): recorded$",
                       e["message"]) for e in ev]
    check(ev and all(parsed), f"each message names the lower median: {[e['message'] for e in ev]}")
    def ratio_fits(m, value):
        # Each number is printed to 0.1: the ratio of the printed times brackets the value.
        took, median = float(m.group(1)), float(m.group(3))
        return (abs(float(m.group(2)) - value) <= 0.05 and
                (took - 0.05) / (median + 0.05) <= value <= (took + 0.05) / max(median - 0.05,
                                                                                1e-9))
    check(all(m and ratio_fits(m, e["value"]) for m, e in zip(parsed, ev)),
          f"took / median is the event's value: {[(e['value'], e['message']) for e in ev]}")

    p = run(job(d, "stop", "checkpoint_and_stop"), f"{d}/stop", slow=True)
    check(p.returncode != 0 and "stopped at step 1 by the slow_rank event" in p.stderr,
          f"checkpoint_and_stop ends the run at step 1: {p.stderr[-400:]}")
    latest = f"{d}/ckpt-stop/latest"
    check(os.path.exists(latest) and open(latest).read().strip() == "global_step1",
          "with a checkpoint of step 1")

    p = run(job(d, "even", "record"), f"{d}/even", slow=False)
    check(p.returncode == 0 and events(f"{d}/even") == [],
          f"ranks that run alike report nothing: {events(f'{d}/even')}")
    collapse = {"loss_scale_collapse": {"overflows": 3, "policy": "record"}}
    p = run(job(d, "scale", None, steps=8, events=collapse, world=1, fp16=True), f"{d}/scale",
            slow=False)
    ev = events(f"{d}/scale")
    check(p.returncode == 0 and [(e["kind"], e["train/global_step"], e["value"]) for e in ev] ==
          [("loss_scale_collapse", 3, 3)], f"fp16 from 2^32: one collapse event at step 3: {ev} "
          f"{p.stderr[-300:]}")
    collapse["loss_scale_collapse"]["policy"] = "checkpoint_and_stop"
    p = run(job(d, "scale-stop", None, steps=8, events=collapse, world=1, fp16=True),
            f"{d}/scale-stop", slow=False)
    check(p.returncode != 0 and "stopped at step 3 by the loss_scale_collapse event" in p.stderr,
          f"checkpoint_and_stop ends the fp16 run at step 3: {p.stderr[-300:]}")
    latest = f"{d}/ckpt-scale-stop/latest"
    check(os.path.exists(latest) and open(latest).read().strip() == "global_step3",
          "with a checkpoint of step 3")
ck.done()
