"""Training checks of the engine on a GPU, run by scripts/gpu-check.sh (issue 15, item 6): each
check trains tiny models with `ztrain run` and compares what the runs log (metrics.jsonl) with an
independent run, never with an earlier output of its own:

  gpt2, llama  the first steps on the GPU against the same job on the CPU backend (fp32; the
               losses within --step-tol relative: cuBLASLt's fp32 sums in another order)
  curve        20 fp32 GPT-2 steps on the GPU against the CPU engine's curve (every loss within
               1%: cuBLASLt's sums in another order drift apart a little over 20 updates)
  bf16         20 bf16 steps on the GPU against the fp32 curve of the same job on the GPU (every
               loss within 5%, the last within 2%)
  zero         ZeRO stages 1, 2 and 3 with 2 ranks sharing one GPU (the shm transport staging
               device buffers through host memory) against 1 rank (losses within 1e-4)
  resume       a run stopped at a checkpoint and resumed gives the uninterrupted run's losses
               bit for bit
  nccl         with two GPUs or more: ZeRO 2 with 2 ranks over NCCL against 1 rank
  memory       GPT-2 on 2 ranks sharing the GPU, ZeRO 0-3 in fp32 and bf16 and fp32 with
               activation checkpointing, one step each: each rank's device peak
               (memory/rank<r>/device_peak_bytes) within 10% of device_memory.py's formula,
               the check tests/dist/test_cuda_device_memory.py makes on the emulated device

--device cpu runs the same checks with the CPU backend standing in for the GPU (the build's own
test, tests/cli/test_gpu_scripts.py: the checks' plumbing on a machine without a GPU). Prints
one "ok"/"FAIL" line per check and "FIGURE name value" lines the script gathers; the exit status
is the number of failed checks (capped at 100)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_memory  # noqa: E402

GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256,
        "block_size": 64}
LLAMA = {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64,
         "intermediate_size": 96, "vocab_size": 256, "block_size": 64,
         "tie_word_embeddings": False}

failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    failures += not ok


def figure(name, value):
    print(f"FIGURE {name} {json.dumps(value)}", flush=True)


def job(name, device, model, steps, world=1, stage=0, dtype="fp32", ckpt=None, resume=False,
        bench_steps=0):
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8 // world,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
          "zero_optimization": {"stage": stage, "reduce_bucket_size": 20000}}
    if dtype == "bf16":
        ds["bf16"] = {"enabled": True}
    train = {"max_steps": steps, "log_interval": 1, "warmup_steps": 0, "seed": 7,
             "bench_steps": bench_steps}
    if ckpt:
        train.update(checkpoint_dir=ckpt, resume=resume)
    return {"name": name, "world_size": world, "device": device, "model": model,
            "data": {"train": "train.txt"}, "train": train, "deepspeed": ds}


def train(ctx, name, spec, env=None, records=False):
    """Runs a job; its losses by step (its records with records=True), or None (the failure
    printed) when it failed."""
    path = os.path.join(ctx.dir, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = os.path.join(ctx.dir, "out-" + name)
    try:
        p = subprocess.run([os.path.join(ctx.bin, "ztrain"), "run", path, "--out", out],
                           capture_output=True, text=True, timeout=ctx.timeout,
                           env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        return failed(ctx, name, f"no result within --timeout {ctx.timeout:g} s")
    except OSError as e:
        return failed(ctx, name, str(e))
    if p.returncode != 0:
        print(f"  {name}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        last = (p.stderr.strip() or p.stdout.strip() or "no output").splitlines()[-1]
        return failed(ctx, name, f"exit {p.returncode}: {last[:300]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if records:
        return recs
    return [r["train/loss"] for r in recs if "train/loss" in r]


def failed(ctx, name, why):
    """A run that gave no losses: printed, and kept for the FAIL line of its check (the line
    scripts/gpu-check.sh puts in the JSON)."""
    print(f"  {name}: {why}")
    ctx.failures.append(f"{name}: {why}")
    return None


def worst_rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def compare(ctx, what, got, ref, tol, n):
    if got is None or ref is None or len(got) != n or len(ref) != n:
        why = f" ({'; '.join(ctx.failures)})" if ctx.failures else ""
        check(False, f"{what}: both runs give {n} losses{why}")
        ctx.failures.clear()
        return None
    err = worst_rel(got, ref)
    check(err <= tol, f"{what}: worst relative loss difference {err:.2e} <= {tol:g}")
    return err


def check_family(ctx, family, model):
    steps = 3
    ref = train(ctx, f"{family}-cpu", job(f"{family}-cpu", "cpu", model, steps))
    got = train(ctx, f"{family}-dev", job(f"{family}-dev", ctx.device, model, steps))
    err = compare(ctx, f"{family}: {steps} fp32 steps on {ctx.device} against the CPU engine",
                  got, ref, ctx.step_tol, steps)
    figure(f"{family}_step_rel_err", err)


def check_curve(ctx):
    steps = 20
    ref = train(ctx, "curve-cpu", job("curve-cpu", "cpu", GPT2, steps))
    got = train(ctx, "curve-dev", job("curve-dev", ctx.device, GPT2, steps))
    err = compare(ctx, f"curve: {steps} fp32 GPT-2 steps on {ctx.device} against the CPU's "
                  "curve", got, ref, 1e-2, steps)
    figure("curve_rel_err", err)
    if got:
        figure("curve_final_loss", got[-1])


def check_bf16(ctx):
    steps = 20
    f32 = train(ctx, "curve-fp32", job("curve-fp32", ctx.device, GPT2, steps))
    b16 = train(ctx, "curve-bf16", job("curve-bf16", ctx.device, GPT2, steps, dtype="bf16"))
    err = compare(ctx, f"bf16: {steps} bf16 steps against the fp32 curve", b16, f32, 0.05, steps)
    if err is not None:
        last = abs(b16[-1] - f32[-1]) / f32[-1]
        check(last <= 0.02, f"bf16: the last loss within {last:.2e} <= 2% of fp32's")
        check(b16[-1] < b16[0], f"bf16: the loss falls ({b16[0]:.3f} -> {b16[-1]:.3f})")
        figure("bf16_curve_rel_err", err)
        figure("bf16_final_loss", b16[-1])
        figure("fp32_final_loss", f32[-1])


def check_zero(ctx, transport="shm", stages=(1, 2, 3)):
    steps = 5
    one = train(ctx, f"zero-one-{transport}", job("zero-one", ctx.device, GPT2, steps))
    for stage in stages:
        name = f"zero{stage}-two-{transport}"
        two = train(ctx, name, job(name, ctx.device, GPT2, steps, world=2, stage=stage),
                    env={"ZTRAIN_COMM": transport})
        err = compare(ctx, f"zero: stage {stage}, 2 ranks over {transport} against 1 rank", two,
                      one, 1e-4, steps)
        figure(f"zero{stage}_{transport}_rel_err", err)


def check_resume(ctx):
    steps = 6
    ck_full, ck_split = os.path.join(ctx.dir, "ck-full"), os.path.join(ctx.dir, "ck-split")
    full = train(ctx, "resume-full", job("resume-full", ctx.device, GPT2, steps, ckpt=ck_full))
    # bench_steps stops the first half after 3 steps with a checkpoint; the second resumes.
    a = train(ctx, "resume-a", job("resume-a", ctx.device, GPT2, steps, ckpt=ck_split,
                                   bench_steps=3))
    b = train(ctx, "resume-b", job("resume-b", ctx.device, GPT2, steps, ckpt=ck_split,
                                   resume=True))
    ok = full is not None and a is not None and b is not None
    check(ok and len(a) == 3 and a + b[-3:] == full if ok else False,
          f"resume: 3 steps, a checkpoint, 3 more give the uninterrupted losses bit for bit "
          f"({full} vs {a} + {b})")


MEMORY_GPT2 = {"type": "gpt2", "n_layer": 4, "n_head": 3, "n_embd": 192, "vocab_size": 768,
               "block_size": 64}


def check_memory(ctx):
    """Each rank's device peak against the formula (device_memory.py); on another backend than
    cuda the records have no device figures, which is itself checked."""
    B, world = 4, 2
    # Three of dist/test_cuda_device_memory's nine runs (which cover every stage on the emulated
    # device), to spend little of a GPU session: both precisions, a partitioned optimizer, the
    # released ranges of stage 3.
    for stage, dtype, every in ((0, "fp32", 0), (1, "bf16", 0), (3, "bf16", 0)):
        name = f"mem-s{stage}-{dtype}" + (f"-ck{every}" if every else "")
        spec = job(name, ctx.device, MEMORY_GPT2, 1, world=world, stage=stage, dtype=dtype)
        spec["deepspeed"].update(train_batch_size=B * world, train_micro_batch_size_per_gpu=B)
        if every:
            spec["train"].update(activation_checkpointing=True,
                                 activation_checkpoint_interval=every)
        recs = train(ctx, name, spec, records=True)
        rec = recs[-1] if recs else {}
        terms = device_memory.formula(MEMORY_GPT2, B, world, stage, dtype == "bf16", every)
        want = sum(terms.values())
        peaks = [rec.get(f"memory/rank{r}/device_peak_bytes") for r in range(world)]
        if ctx.device != "cuda":
            check(bool(rec) and peaks == [None] * world,
                  f"memory: {name} on {ctx.device} records no device figures")
            continue
        if None in peaks:
            check(False, f"memory: {name}: every rank records its device peak ({peaks})")
            continue
        worst = max(abs(p / want - 1) for p in peaks)
        check(worst <= 0.10, f"memory: {name}: device peaks "
              f"{', '.join(f'{p / device_memory.MIB:.2f}' for p in peaks)} MiB, formula "
              f"{want / device_memory.MIB:.2f} MiB = {device_memory.describe(terms)} "
              f"(worst {worst * 100:.2f}%)")
        # Admission's device estimate of the same job (engine/train/device_estimate.c), shown
        # beside the peak: on a GPU cuDNN's attention workspace, which admission leaves to its
        # 1 GiB reserve, may put the peak above it, so this is a figure, not a check.
        est = subprocess.run([os.path.join(ctx.bin, "ztrain"), "estimate", "--json",
                              os.path.join(ctx.dir, name + ".json")], capture_output=True,
                             text=True, timeout=60)
        device_bytes = (json.loads(est.stdout).get("device_bytes") if est.returncode == 0
                        else None)
        if device_bytes:
            print(f"  {name}: admission's device estimate {device_bytes / device_memory.MIB:.2f} "
                  f"MiB, estimate/peak {device_bytes / max(peaks):.4f}")
        figure(f"memory_{name.replace('-', '_')}", {"peak_bytes": max(peaks),
                                                     "formula_bytes": want,
                                                     "estimate_bytes": device_bytes})


def gpu_count():
    try:
        p = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True,
                           timeout=30)
        return len([line for line in p.stdout.splitlines() if line.startswith("GPU ")])
    except (OSError, subprocess.SubprocessError):
        return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="directory holding ztrain and ztrain-worker")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--checks", default="gpt2,llama,curve,bf16,zero,resume,nccl,memory")
    ap.add_argument("--step-tol", type=float, default=2e-3)
    ap.add_argument("--zero-stages", default="1,2,3", help="the stages the zero check runs")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ctx = ap.parse_args(argv)
    ctx.failures = []  # the failed runs not yet named by a check
    known = {"gpt2", "llama", "curve", "bf16", "zero", "resume", "nccl", "memory"}
    wanted = [c for c in ctx.checks.split(",") if c]
    bad = [c for c in wanted if c not in known]
    if bad:
        ap.error(f"--checks: unknown {', '.join(bad)} (known: {', '.join(sorted(known))})")
    with tempfile.TemporaryDirectory(prefix="ztrain-gpu-train-") as tmp:
        ctx.dir = ctx.dir or tmp
        os.makedirs(ctx.dir, exist_ok=True)
        with open(os.path.join(ctx.dir, "train.txt"), "wb") as f:
            f.write(bytes((i * 7 + i // 13) % 251 for i in range(60000)))
        for c in wanted:
            ctx.failures.clear()
            if c == "gpt2":
                check_family(ctx, "gpt2", GPT2)
            elif c == "llama":
                check_family(ctx, "llama", LLAMA)
            elif c == "curve":
                check_curve(ctx)
            elif c == "bf16":
                check_bf16(ctx)
            elif c == "zero":
                check_zero(ctx, stages=[int(x) for x in ctx.zero_stages.split(",") if x])
            elif c == "resume":
                check_resume(ctx)
            elif c == "memory":
                check_memory(ctx)
            elif c == "nccl":
                if ctx.device == "cuda" and gpu_count() >= 2:
                    check_zero(ctx, "nccl", stages=(2,))
                else:
                    print("skip  nccl: needs two GPUs")
    return min(failures, 100)


if __name__ == "__main__":
    sys.exit(main())
