"""`--profile` (issue 28, item 6): per-op timings of every step, on the CPU (monotonic clock) and
on the emulated CUDA device (CUDA events, which the emulator times when its queue runs them).

Each run trains a few steps and reads <out>/profile.jsonl (a line a step) and profile.json. The
checks do not trust the code's own accounting: the ops a step must call are counted from the
architecture (GPT-2 block: 2 LayerNorms, 4 linears, attention, GELU; Llama block: 2 RMSNorms,
5 linears, 2 rotary calls for q and k, attention, SwiGLU; plus the embedding, the final norm, the
head and the loss, once each per micro-batch, and the same backward), so an op missing from the
profile, counted twice or timed outside the step fails; the optimizer's op must appear (fp32
AdamW: adam_update; bf16: the fused adam_update_mixed); and the op times of a step, which never
overlap, must sum to at most its measured step time. No timing threshold: only that inequality.
Then the refusals: --profile=VALUE other than ops, by the worker and by `ztrain run`."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))

from ztref import BUILD, Checker, run, tool, write_job  # noqa: E402

STEPS, WARMUP = 4, 1
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 32}
LLAMA = {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 16,
         "tie_word_embeddings": False}
EMU = os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so"))


def model_ops(model):
    """Calls per micro-batch of each forward and backward op, from the architecture."""
    L = model["n_layer"]
    if model["type"] == "gpt2":
        # The MLP's first product and its GELU are one op each way (linear_gelu_forward,
        # linear_backward_gelu), on every backend.
        return {"embedding_forward": 1, "layernorm_forward": 2 * L + 1,
                "linear_forward": 3 * L + 1, "linear_gelu_forward": L, "attention_forward": L,
                "softmax_xent": 1,
                "linear_backward": 3 * L + 1, "linear_backward_gelu": L, "attention_backward": L,
                "layernorm_backward": 2 * L + 1, "embedding_backward": 1}
    # RoPE turns q's and k's heads (adjacent in the packed row) in one call each way.
    return {"embedding_forward": 1, "rmsnorm_forward": 2 * L + 1, "linear_forward": 5 * L + 1,
            "rope_forward": L, "attention_forward": L, "silu_mul_forward": L,
            "softmax_xent": 1,
            "linear_backward": 5 * L + 1, "silu_mul_backward": L, "rope_backward": L,
            "attention_backward": L, "rmsnorm_backward": 2 * L + 1, "embedding_backward": 1}


# What else a step may call: the optimizer, the clipping norm, conversions, ZeRO's 16-bit
# copies and the sums the step reads back at its one synchronisation (sum_to: the losses and the
# norm's pieces; weighted_sum_to: their total, where NCCL reduces it on the device). Anything
# outside the model's ops and these is an op the step should not have timed.
OPTIMIZER_OPS = {"adam_update", "adam_update_mixed", "sgd_update", "lamb_moments",
                 "lamb_moments_to", "lamb_steps", "lamb_apply",
                 "sum_squares", "sum_squares_half", "scale", "to_half", "from_half", "round_to",
                 "accumulate_half", "sum_to", "weighted_sum_to"}


def job(name, device, model=GPT2, world=1, gas=1, bf16=False):
    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
          "gradient_clipping": 1.0, "zero_optimization": {"stage": 1 if world > 1 else 0}}
    if bf16:
        ds["bf16"] = {"enabled": True}
    return {"name": name, "world_size": world, "device": device, "model": model,
            "data": {"train": "train.txt"},
            "train": {"max_steps": STEPS, "log_interval": 1, "warmup_steps": WARMUP, "seed": 3},
            "deepspeed": ds}


def check_profile(ck, what, out, spec):
    gas = spec["deepspeed"]["gradient_accumulation_steps"]
    want = {op: n * gas for op, n in model_ops(spec["model"]).items()}
    clock = "cudaEvent" if spec["device"] == "cuda" else "monotonic"
    optimizer = "adam_update_mixed" if spec["deepspeed"].get("bf16") else "adam_update"
    try:
        with open(os.path.join(out, "profile.jsonl")) as f:
            steps = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(out, "profile.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        ck.check(False, f"{what}: the profile files: {e}")
        return
    ck.check([s["step"] for s in steps] == list(range(1, STEPS + 1)),
             f"{what}: one line per step 1..{STEPS}: {[s['step'] for s in steps]}")
    ck.check([s["timed"] for s in steps] == [i >= WARMUP for i in range(STEPS)],
             f"{what}: the first {WARMUP} step(s) marked warmup")
    for s in steps:
        ops = s["ops"]
        calls = {op: round(v["calls"]) for op, v in ops.items()}
        model = {op: n for op, n in calls.items() if op not in OPTIMIZER_OPS}
        ck.check(model == want, f"{what}, step {s['step']}: model ops {model}, want {want}")
        ck.check(optimizer in calls, f"{what}, step {s['step']}: {optimizer} among {sorted(calls)}")
        total = sum(v["ms"] for v in ops.values())
        ck.check(all(v["ms"] >= 0 for v in ops.values()) and total > 0,
                 f"{what}, step {s['step']}: op times {[v['ms'] for v in ops.values()]}")
        ck.check(abs(total - s["ops_ms"]) <= 1e-3 * max(1.0, total),
                 f"{what}, step {s['step']}: ops_ms {s['ops_ms']} is the ops' sum {total}")
        ck.check(total <= s["step_ms"],
                 f"{what}, step {s['step']}: the ops took {total:.3f} ms of a "
                 f"{s['step_ms']:.3f} ms step")
    mean = summary.get("mean", {})
    ck.check(summary.get("clock") == clock and summary.get("device") == spec["device"],
             f"{what}: clock {summary.get('clock')} on {summary.get('device')}, want {clock}")
    ck.check(mean.get("steps") == STEPS - WARMUP and mean.get("after_warmup") is True,
             f"{what}: the summary's mean is over {mean.get('steps')} steps after warmup")
    timed = [s for s in steps if s["timed"]]
    if timed and mean.get("ops"):
        for op, v in mean["ops"].items():
            avg = sum(s["ops"].get(op, {"ms": 0})["ms"] for s in timed) / len(timed)
            ck.check(abs(v["ms"] - avg) <= 1e-4 * max(1.0, avg),
                     f"{what}: mean {op} {v['ms']} ms, the steps' mean {avg} ms")
        ck.check(mean["ops_ms"] <= mean["step_ms"],
                 f"{what}: mean ops {mean['ops_ms']} ms over a mean step of {mean['step_ms']} ms")
    print(f"{what}: step {mean.get('step_ms', 0):.1f} ms, ops {mean.get('ops_ms', 0):.1f} ms")


def worker(d, spec, extra_env=None, profile="--profile"):
    name = spec["name"]
    write_job(f"{d}/{name}.json", spec)
    env = dict(os.environ, **(extra_env or {}))
    return run([tool("ztrain-worker"), f"{d}/{name}.json", "--out", f"{d}/{name}", profile],
               env=env, cwd=d, check=False)


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    runs = [("GPT-2 fp32 on the CPU, worker --profile", job("gpt2-cpu", "cpu"), None),
            ("Llama fp32 on the CPU, 2 micro-batches, worker --profile=ops",
             job("llama-cpu", "cpu", LLAMA, gas=2), None)]
    if EMU:
        runs += [("GPT-2 bf16 on the emulated CUDA device", job("gpt2-emu", "cuda", bf16=True),
                  {"ZTRAIN_CUDA_EMU": "1"}),
                 ("Llama fp32 on the emulated CUDA device", job("llama-emu", "cuda", LLAMA),
                  {"ZTRAIN_CUDA_EMU": "1"})]
    else:
        print("SKIPPED: the emulated CUDA device runs (this build has none)")
    for i, (what, spec, env) in enumerate(runs):
        p = worker(d, spec, env, "--profile=ops" if i == 1 else "--profile")
        ck.check(p.returncode == 0, f"{what}: exit {p.returncode}: {p.stderr.strip()[-600:]}")
        if p.returncode == 0:
            check_profile(ck, what, f"{d}/{spec['name']}", spec)
            ck.check("op profile" in p.stdout and "linear_backward" in p.stdout,
                     f"{what}: the printed table: {p.stdout[-400:]}")

    # `ztrain run --profile` of two ranks hands the flag to its workers; rank 0 writes.
    spec = job("gpt2-2ranks", "cpu", world=2)
    write_job(f"{d}/gpt2-2ranks.json", spec)
    p = run([tool("ztrain"), "run", f"{d}/gpt2-2ranks.json", "--out", f"{d}/gpt2-2ranks",
             "--profile"], cwd=d, check=False)
    ck.check(p.returncode == 0, f"ztrain run --profile, 2 ranks: exit {p.returncode}: "
             f"{p.stderr.strip()[-600:]}")
    if p.returncode == 0:
        check_profile(ck, "GPT-2 fp32, 2 ranks ZeRO 1, ztrain run --profile", f"{d}/gpt2-2ranks",
                      spec)

    # An unknown kind is refused by name, before anything runs.
    p = worker(d, job("bad", "cpu"), profile="--profile=kernels")
    ck.check(p.returncode == 2 and "--profile=kernels" in p.stderr and "ops" in p.stderr,
             f"worker --profile=kernels: exit {p.returncode}, {p.stderr.strip()}")
    p = run([tool("ztrain"), "run", f"{d}/bad.json", "--profile=nsys"], cwd=d, check=False)
    ck.check(p.returncode == 2 and "--profile=nsys" in p.stderr,
             f"ztrain run --profile=nsys: exit {p.returncode}, {p.stderr.strip()}")
    ck.check(not os.path.exists(f"{d}/bad/profile.json"), "a refused run wrote a profile")
sys.exit(ck.done())
