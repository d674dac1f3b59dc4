"""The CUDA backend's 16-bit working weights (issue 28, item 3) on the emulated device
(ZTRAIN_CUDA_EMU=1): in a bf16/fp16 job the products read ZeRO's 16-bit parameters (the twin of
the fp32 working copy, ops.h zt_param16) instead of rounding each weight at each product. The
twin holds the same values as that rounding as long as it is refreshed wherever the parameters
change, so every run here is compared bit for bit, loss by loss over four steps, with the same
job under ZTRAIN_CUDA_WEIGHTS=round (every weight rounded from the fp32 copy at every product,
as before the twin existed): a twin left stale by an optimizer step, a gather or a load changes
the losses from step 2 on. Each run's first record must also say that no product rounded its
weight (kernels/weights_rounded 0), and the rounding run that they did, so the comparison is
between the two paths. Jobs: GPT-2 bf16 at ZeRO 0 (AdamW), fp16 at ZeRO 1 and bf16 at ZeRO 3
(16-bit gathers) on two ranks, SGD at ZeRO 2 and LAMB at ZeRO 1, ZeRO 3 with parameters and
optimizer on NVMe (the twin read from the file), a resumed run (the twin from a checkpoint),
and Llama bf16 (no biases, torch.nn.Linear layout); and at ZeRO 3 each rank's measured model
state (with the gathered layers' 16-bit parameters) against the admission estimate."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))

from ztref import BUILD, Checker, read_metrics, run, tool, write_job  # noqa: E402

STEPS = 4
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 32}
LLAMA = {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 16,
         "tie_word_embeddings": False}
ADAMW = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}}

if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
    print("SKIPPED: this build has no emulated CUDA device (-DZT_CUDA_EMU=OFF or no CUDA headers)")
    sys.exit(0)


def job(name, world=1, micro=8, stage=0, model=GPT2, precision="bf16", optimizer=ADAMW,
        zero=None, train_opts=None):
    ds = {"train_micro_batch_size_per_gpu": micro, "optimizer": optimizer,
          "gradient_clipping": 1.0, "zero_optimization": dict({"stage": stage}, **(zero or {})),
          precision: {"enabled": True}}
    if optimizer is not ADAMW:
        ds["zero_allow_untested_optimizer"] = True
    if precision == "fp16":
        ds["fp16"]["initial_scale_power"] = 12
    train_spec = dict({"max_steps": STEPS, "log_interval": 1, "seed": 5}, **(train_opts or {}))
    return {"name": name, "world_size": world, "device": "cuda", "model": model,
            "data": {"train": "train.txt"}, "train": train_spec, "deepspeed": ds}


def train(d, spec, weights, tag):
    """(losses, kernels/weights_rounded of the first record) of spec run with
    ZTRAIN_CUDA_WEIGHTS=weights."""
    name = f"{spec['name']}-{tag}"
    write_job(f"{d}/{name}.json", dict(spec, name=name))
    env = dict(os.environ, ZTRAIN_CUDA_EMU="1", ZTRAIN_CUDA_WEIGHTS=weights)
    run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], env=env, cwd=d)
    records = read_metrics(f"{d}/{name}/metrics.jsonl")
    rounded = [m["kernels/weights_rounded"] for m in records if "kernels/weights_rounded" in m]
    return [m["train/loss"] for m in records if "train/loss" in m], rounded


def same(ck, what, spec, d):
    twin, twin_rounded = train(d, spec, "twin", "twin")
    ref, ref_rounded = train(d, spec, "round", "round")
    ck.check(len(twin) == STEPS and twin == ref,
             f"{what}: the products reading the 16-bit twin give the losses of rounding every "
             f"weight at every product, bit for bit ({twin} vs {ref})")
    ck.check(twin_rounded == [0] and len(ref_rounded) == 1 and ref_rounded[0] > 0,
             f"{what}: no product rounded its weight with the twin ({twin_rounded}), the "
             f"rounding run's did ({ref_rounded})")
    return twin


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    losses = same(ck, "GPT-2 bf16, ZeRO 0, AdamW", job("z0"), d)
    ck.check(len(losses) == STEPS and losses[-1] < losses[0],
             f"the bf16 loss falls over the steps ({losses})")
    same(ck, "GPT-2 fp16, ZeRO 1 on 2 ranks (the twin all-gathered after each step)",
         job("z1-fp16", world=2, micro=4, stage=1, precision="fp16"), d)
    same(ck, "GPT-2 bf16, ZeRO 3 on 2 ranks (layers gathered in 16 bits)",
         job("z3", world=2, micro=4, stage=3), d)
    same(ck, "GPT-2 bf16, ZeRO 2 on 2 ranks, SGD with momentum",
         job("z2-sgd", world=2, micro=4, stage=2,
             optimizer={"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}), d)
    same(ck, "GPT-2 bf16, ZeRO 1 on 2 ranks, LAMB",
         job("z1-lamb", world=2, micro=4, stage=1,
             optimizer={"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01}}), d)
    os.makedirs(f"{d}/nvme")
    nvme = {"device": "nvme", "nvme_path": f"{d}/nvme"}
    same(ck, "GPT-2 bf16, ZeRO 3 with parameters and optimizer on NVMe",
         job("z3-nvme", stage=3, zero={"offload_param": nvme, "offload_optimizer": nvme}), d)
    # A resume: the twin of the second run comes from the checkpoint's weights.
    for mode in ("twin", "round"):
        ckpt = {"checkpoint_dir": f"{d}/ckpt-{mode}"}
        train(d, job("resume", train_opts=dict(ckpt, bench_steps=2)), mode, f"first-{mode}")
    twin, _ = train(d, job("resume", train_opts={"checkpoint_dir": f"{d}/ckpt-twin",
                                                 "resume": True}), "twin", "twin")
    ref, _ = train(d, job("resume", train_opts={"checkpoint_dir": f"{d}/ckpt-round",
                                                "resume": True}), "round", "round")
    ck.check(len(twin) == STEPS - 2 and twin == ref,
             f"GPT-2 bf16 resumed after step 2: the twin's losses are the rounding run's, bit "
             f"for bit ({twin} vs {ref})")
    same(ck, "Llama bf16, ZeRO 0", job("llama", model=LLAMA), d)
    # Memory: at ZeRO 3 the gathered layers' 16-bit parameters are held beside their fp32
    # working copy. Each rank's measured model state (as dist/test_admission_estimate reads it)
    # must lie under the admission estimate, which counts them, and within 1.5 times it.
    big = dict(GPT2, n_layer=4, n_embd=128, block_size=64)
    spec = job("memory", world=2, micro=1, stage=3, model=big,
               zero={"reduce_bucket_size": 50000, "stage3_param_persistence_threshold": 1000})
    write_job(f"{d}/memory.json", spec)
    est = json.loads(run([tool("ztrain"), "estimate", "--json", f"{d}/memory.json"],
                         env=dict(os.environ, ZTRAIN_CUDA_EMU="1")).stdout)
    run([tool("ztrain"), "run", f"{d}/memory.json", "--out", f"{d}/memory"],
        env=dict(os.environ, ZTRAIN_CUDA_EMU="1"), cwd=d)
    rec = read_metrics(f"{d}/memory/metrics.jsonl")[-1]
    state = sum(est[k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes", "offload_bytes",
                                 "workspace_bytes"))
    for r in range(2):
        measured = sum(rec.get(f"memory/rank{r}/{k}", 0) for k in
                       ("params_bytes", "grads_bytes", "optimizer_bytes", "fp32_workspace_bytes"))
        ck.check(measured <= state <= 1.5 * measured,
                 f"GPT-2 bf16 ZeRO 3 on cuda, rank {r}: model state measured "
                 f"{measured / 1e6:.3f} MB, estimated {state / 1e6:.3f} MB")
    # What the variable does not understand is refused by name.
    write_job(f"{d}/bad.json", job("bad"))
    p = run([tool("ztrain"), "run", f"{d}/bad.json", "--out", f"{d}/bad"], check=False,
            env=dict(os.environ, ZTRAIN_CUDA_EMU="1", ZTRAIN_CUDA_WEIGHTS="sometimes"), cwd=d)
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0 and "ZTRAIN_CUDA_WEIGHTS" in out and "sometimes" in out,
             f"ZTRAIN_CUDA_WEIGHTS=sometimes is refused naming the variable (exit {p.returncode})")
    # So is the CUDA backend's other knob, when the backend is created: before any step runs.
    p = run([tool("ztrain"), "run", f"{d}/bad.json", "--out", f"{d}/bad-attn"], check=False,
            env=dict(os.environ, ZTRAIN_CUDA_EMU="1", ZTRAIN_ATTENTION="fast"), cwd=d)
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0 and "ZTRAIN_ATTENTION" in out and "fast" in out and
             not os.path.exists(f"{d}/bad-attn/metrics.jsonl"),
             f"ZTRAIN_ATTENTION=fast is refused naming the variable, with no step run "
             f"(exit {p.returncode}: {out.strip()[-160:]!r})")
ck.done()
