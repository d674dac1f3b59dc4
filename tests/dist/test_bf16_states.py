"""bf16.bf16_master_weights_and_grads with bf16.bf16_optimizer_states, 2 ranks:
  a. the optimizer state each rank holds, as the engine measures it (resident pages of the state
     buffers, metrics.jsonl), is 2 bytes × 2 moments × its partition for Adam (2 × 1 for SGD with
     momentum) at ZeRO stages 1, 2 and 3, with no fp32 masters — against 12 bytes a parameter of
     the partition when the flags are left out (fp32 masters and moments), so a run that ignored
     them fails;
  b. the checkpoint holds the moments as bf16 values (widened to fp32 exactly) and no
     fp32_master, and resuming from it continues bit-identically to the uninterrupted run;
  c. the combinations DeepSpeed allows only with ZeRO-Offload and DeepSpeedCPUAdam are refused
     naming the key: 16-bit masters with fp32 states, fp16 masters, bf16 masters with offload."""
import math
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, gpt2_shapes, read_metrics, run, st_read, tool, write_job  # noqa: E402

L, C, V, T = 2, 64, 256, 32
WORLD = 2
PSI = sum(int(math.prod(s)) for s in gpt2_shapes(L, C, V, T).values())
PART = PSI / WORLD
PAD = 2 * 16 * WORLD + 2 * 4096  # slice padding and page granularity, for each buffer

ADAM = {"type": "AdamW", "params": {"lr": 1e-3}}
SGD = {"type": "SGD", "params": {"lr": 1e-2, "momentum": 0.9}}
FLAGS = {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


def job(name, stage, bf16, optimizer=ADAM, zero=None, steps=4, resume=False, bench=0):
    return {"name": name, "world_size": WORLD,
            "model": {"type": "gpt2", "n_layer": L, "n_head": 4, "n_embd": C, "vocab_size": V,
                      "block_size": T},
            "data": {"train": "train.txt"},
            "train": {"max_steps": steps, "log_interval": 1, "checkpoint_interval": 2,
                      "checkpoint_dir": f"ck-{name}", "resume": resume, "bench_steps": bench},
            "deepspeed": {"train_micro_batch_size_per_gpu": 2, "optimizer": optimizer,
                          "bf16": dict({"enabled": True}, **bf16),
                          "zero_optimization": dict({"stage": stage}, **(zero or {})),
                          # torch.optim.SGD is not among ZeRO's tested optimizers.
                          "zero_allow_untested_optimizer": optimizer["type"] == "SGD"}}


def train(d, name, spec, check=True):
    write_job(f"{d}/{name}.json", spec)
    return run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/out-{name}"], check=check)


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 5) % 256 for i in range(20000)))

    # a: the memory of 16-bit optimizer states.
    for stage, optimizer, moments in [(1, ADAM, 2), (2, ADAM, 2), (3, ADAM, 2), (2, SGD, 1)]:
        name = f"s{stage}{optimizer['type']}"
        train(d, name, job(name, stage, FLAGS, optimizer))
        rec = read_metrics(f"{d}/out-{name}/metrics.jsonl")[-1]
        want = 2 * moments * PART
        for r in range(WORLD):
            got = rec[f"memory/rank{r}/optimizer_bytes"]
            ck.check(want * 0.95 - PAD <= got <= want * 1.05 + moments * PAD,
                     f"stage {stage} {optimizer['type']}, rank {r}: optimizer state {got / 1e3:.1f} kB "
                     f"= 2 bytes × {moments} × partition ({want / 1e3:.1f} kB); with fp32 masters "
                     f"and state {(4 + 4 * moments) * PART / 1e3:.1f} kB")
    name = "s2plain"
    train(d, name, job(name, 2, {}))
    got = read_metrics(f"{d}/out-{name}/metrics.jsonl")[-1]["memory/rank0/optimizer_bytes"]
    ck.check(got > 2 * 2 * PART * 1.05 + 2 * PAD,
             f"without the flags the state is fp32 with masters ({got / 1e3:.1f} kB): the bound "
             f"above would catch it")

    # b: the checkpoint, and resuming from it.
    tag = f"{d}/ck-s2AdamW/global_step4"
    part, _ = st_read(f"{tag}/optim_rank_00000.safetensors")
    ck.check("fp32_master" not in part and {"exp_avg", "exp_avg_sq"} <= set(part),
             "the checkpoint has the moments and no fp32 masters")
    ck.check(all(torch.equal(part[k].bfloat16().float(), part[k]) for k in ("exp_avg", "exp_avg_sq")),
             "the saved moments are bf16 values")
    train(d, "split", job("split", 2, FLAGS, bench=2))
    p = train(d, "split", job("split", 2, FLAGS, resume=True))
    full = [m["train/loss"] for m in read_metrics(f"{d}/out-s2AdamW/metrics.jsonl")]
    split = [m["train/loss"] for m in read_metrics(f"{d}/out-split/metrics.jsonl")]
    ck.check("resumed from" in p.stdout and full == split,
             f"resumed at step 2, the losses are bit-identical to the uninterrupted run: {split}")

    # c: refusals.
    for what, spec, needle in [
            ("bf16 masters without bf16 states", job("r1", 2, {"bf16_master_weights_and_grads": True}),
             "bf16.bf16_master_weights_and_grads without bf16_optimizer_states: Master weights "
             "feature requires ZeRO-Offload with DeepSpeedCPUAdam"),
            ("bf16 masters and states with offload",
             job("r2", 2, FLAGS, zero={"offload_optimizer": {"device": "cpu"}}),
             "bf16.bf16_master_weights_and_grads with zero_optimization.offload_optimizer is not "
             "supported yet"),
            ("fp16 masters", dict(job("r3", 3, {}), deepspeed=dict(
                job("r3", 3, {})["deepspeed"], bf16={"enabled": False},
                fp16={"enabled": True, "fp16_master_weights_and_grads": True})),
             "fp16.fp16_master_weights_and_grads: Master weights feature requires ZeRO-3 Offload "
             "with DeepSpeedCPUAdam"),
            ("bf16 states at stage 0", job("r4", 0, FLAGS),
             "Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3.")]:
        p = train(d, what.replace(" ", "_"), spec, check=False)
        ck.check(p.returncode != 0 and needle in p.stderr,
                 f"{what}: refused ({p.stderr.strip().splitlines()[-1][:150] if p.stderr.strip() else 'no message'})")
ck.done()
