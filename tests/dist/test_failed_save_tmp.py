"""A checkpoint save that fails before its DONE leaves no temporary directory behind
(docs/job-spec.md: "A save that fails before its DONE ... removes its own .tmp directory at
once"), whichever rank fails and wherever. Two ranks, a checkpoint every 5 of 10 steps, and step
10's save made to fail:

  a. ZeRO stage 1 in bf16, rank 0's widening of the parameters for model.safetensors fails
     (ZTRAIN_INJECT_CKPT_FAIL=10:gather:0, as running out of memory there would). Before, that
     failure returned at once and left .global_step10.tmp until the next save.
  b. The same on rank 1 (10:gather:1): rank 0 learns of it and says which rank failed.
  c. ZeRO stage 3, rank 1 SIGKILLed as it starts writing its part
     (ZTRAIN_INJECT_CKPT_KILL=10:parts:1): rank 0 fails waiting for it.

Each time: the run fails (naming rank 1 in b and c), the checkpoint directory holds no .tmp
entry, and `latest` still names global_step5, whose DONE is there."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, run, tool, write_job  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 16}
CASES = [("a", 1, True, {"ZTRAIN_INJECT_CKPT_FAIL": "10:gather:0"}, "rank 0"),
         ("b", 1, True, {"ZTRAIN_INJECT_CKPT_FAIL": "10:gather:1"}, "failed on rank 1"),
         ("c", 3, False, {"ZTRAIN_INJECT_CKPT_KILL": "10:parts:1"}, "rank 1")]


def job(stage, bf16, ckpt):
    return {"name": "failed-save", "world_size": 2, "model": GPT2,
            "data": {"train": "train.txt"},
            "train": {"max_steps": 10, "log_interval": 1, "checkpoint_dir": ckpt,
                      "checkpoint_interval": 5, "seed": 3},
            "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                          "zero_optimization": {"stage": stage},
                          "bf16": {"enabled": bf16}}}


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    for case, stage, bf16, inject, names in CASES:
        ckpt = f"{d}/ck-{case}"
        write_job(f"{d}/{case}.json", job(stage, bf16, ckpt))
        p = run([tool("ztrain"), "run", f"{d}/{case}.json", "--out", f"{d}/out-{case}"],
                check=False, errors="replace", timeout=240, env=dict(os.environ, **inject))
        err = p.stderr.strip()
        ck.check(p.returncode != 0 and names in err,
                 f"{case}: the run fails, saying '{names}': {err[-600:]}")
        entries = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
        ck.check(not [e for e in entries if e.endswith(".tmp")],
                 f"{case}: no temporary directory is left: {entries}")
        latest = open(f"{ckpt}/latest").read().strip() if "latest" in entries else None
        ck.check(latest == "global_step5" and os.path.exists(f"{ckpt}/global_step5/DONE"),
                 f"{case}: latest still names the complete global_step5: {latest}")
ck.done()
