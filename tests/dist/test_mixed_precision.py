"""bf16 and fp16 training (fp32 masters, 16-bit parameters, gradients and activations) on 2 ranks
for ZeRO stages 0-3:
- 50 steps stay within 2e-2 (relative) of the fp32 PyTorch loss curve of the same model and data;
- at every checkpoint the 16-bit parameters equal the fp32 master weights rounded to nearest even
  (checked with PyTorch's own cast);
- fp16 starting at a loss scale of 2^32 overflows: those steps are skipped on every rank together,
  counted in train/skipped_steps, the lr schedule does not move, the scale comes down by
  DeepSpeed's rule, and training recovers;
- each rank's model-state bytes follow the ZeRO formula in 16 bits (2Ψ + 2Ψ + 12Ψ with the stage's
  divisions) within 5% plus padding."""
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
import torch  # noqa: E402

from ztref import (Checker, gpt2_forward, gpt2_random_params, gpt2_shapes, read_metrics, run,  # noqa: E402
                   st_read, st_write, tool, write_job)

torch.set_num_threads(1)
L, NH, C, V, T = 2, 2, 32, 256, 32
WORLD, MICRO, STEPS, LR = 2, 4, 50, 3e-3
PSI = sum(math.prod(s) for s in gpt2_shapes(L, C, V, T).values())


def job(precision, stage, ckpt, extra=None, steps=STEPS):
    ds = {"train_micro_batch_size_per_gpu": MICRO,
          "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
          "gradient_clipping": 1.0,
          "zero_optimization": {"stage": stage, "reduce_bucket_size": 4000}}
    if precision != "fp32":
        ds[precision] = {"enabled": True}
    if extra:
        ds[precision].update(extra)
    return {"name": f"{precision}-{stage}", "world_size": WORLD,
            "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
                      "block_size": T, "init_from": "init.safetensors"},
            "data": {"train": "train.txt", "shuffle": False},
            "train": {"max_steps": steps, "log_interval": 1, "checkpoint_dir": ckpt,
                      "checkpoint_interval": 10},
            "deepspeed": ds}


def torch_fp32_curve(params, data):
    ref = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.AdamW(list(ref.values()), lr=LR, weight_decay=0.0)
    losses, n = [], WORLD * MICRO
    for step in range(STEPS):
        starts = [(step * n + i) * T for i in range(n)]
        x = torch.stack([data[s:s + T] for s in starts])
        y = torch.stack([data[s + 1:s + T + 1] for s in starts])
        loss = torch.nn.functional.cross_entropy(gpt2_forward(ref, x, L, NH).reshape(-1, V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(ref.values()), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    raw = bytes((i * 7 + i // 13) % 251 for i in range(60000))
    with open(f"{d}/train.txt", "wb") as f:
        f.write(raw)
    data = torch.tensor(list(raw), dtype=torch.long)
    params = gpt2_random_params(L, C, V, T, seed=9)
    st_write(f"{d}/init.safetensors", params)
    ref = torch_fp32_curve(params, data)
    ck.check(ref[-1] < ref[0] * 0.7, f"the fp32 PyTorch loss falls ({ref[0]:.3f} -> {ref[-1]:.3f})")

    for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for stage in (0, 1, 2, 3):
            name = f"{precision}-s{stage}"
            write_job(f"{d}/{name}.json", job(precision, stage, f"ck-{name}"))
            run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"])
            recs = read_metrics(f"{d}/{name}/metrics.jsonl")
            losses = [r["train/loss"] for r in recs]
            worst = max(abs(a - b) / b for a, b in zip(losses, ref))
            ck.check(len(losses) == STEPS and worst < 2e-2,
                     f"{name}: {len(losses)} losses within {worst:.1e} of fp32 PyTorch")
            # Every checkpoint: 16-bit parameters == round-to-nearest-even(fp32 masters).
            exact = True
            for step in range(10, STEPS + 1, 10):
                tag = f"{d}/ck-{name}/global_step{step}"
                # Stage 3 saves each rank's slice of the parameters, the others the whole model.
                if stage < 3:
                    weights, _ = st_read(f"{tag}/model.safetensors")
                    flat = torch.cat([weights[k].reshape(-1) for k in gpt2_shapes(L, C, V, T)])
                for r in range(WORLD):
                    part, meta = st_read(f"{tag}/optim_rank_{r:05d}.safetensors")
                    off = int(meta["partition_offset"])
                    master = part["fp32_master"]
                    if stage < 3:
                        mine = flat[off:off + master.numel()]
                    else:
                        mine = st_read(f"{tag}/model_rank_{r:05d}.safetensors")[0]["params"]
                    exact &= torch.equal(master.to(dtype).float(), mine)
            ck.check(exact, f"{name}: at steps 10..50 the 16-bit weights are the masters rounded to nearest even")
            if True:
                mem = recs[-1]
                for r in range(WORLD):
                    n = WORLD
                    want = {"params_bytes": 2 * PSI if stage < 3 else 2 * PSI / n,
                            "grads_bytes": 2 * PSI if stage < 2 else 2 * PSI / n,
                            "optimizer_bytes": 12 * PSI if stage == 0 else 12 * PSI / n}
                    for key, base in want.items():
                        got = mem[f"memory/rank{r}/{key}"]
                        pad = 2 * 16 * n + 8 * 4096
                        ck.check(base * 0.95 - pad <= got <= base * 1.05 + pad,
                                 f"{name} rank {r}: {key} {got / 1e3:.1f} kB vs {base / 1e3:.1f} kB")

    # Overflow: fp16 at 2^32 overflows until the scale has come down.
    for stage in (0, 2):
        name = f"overflow-s{stage}"
        spec = job("fp16", stage, f"ck-{name}", {"initial_scale_power": 32, "hysteresis": 2}, steps=30)
        spec["deepspeed"]["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": 10,
                                                                          "warmup_min_lr": 1e-4,
                                                                          "warmup_type": "linear"}}
        write_job(f"{d}/{name}.json", spec)
        p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"])
        recs = read_metrics(f"{d}/{name}/metrics.jsonl")
        skipped = recs[-1]["train/skipped_steps"]
        ck.check(skipped >= 5, f"{name}: {skipped} steps skipped at the start")
        lrs = [r["train/learning_rate"] for r in recs[:int(skipped)]]
        ck.check(len(set(lrs)) == 1, f"{name}: the lr did not move while steps were skipped ({lrs[0]})")
        s0 = int(skipped)
        ck.check(recs[s0]["train/learning_rate"] == lrs[0] and recs[s0 + 3]["train/learning_rate"] > lrs[0],
                 f"{name}: the schedule starts moving only with the first applied step")
        scales = [r["train/loss_scale"] for r in recs]
        ck.check(scales[-1] < 2.0 ** 32, f"{name}: scale came down from 2^32 to {scales[-1]:g}")
        ck.check(recs[-1]["train/loss"] < recs[int(skipped)]["train/loss"], f"{name}: training recovers")
        marker = "OVERFLOW! Rank 0 Skipping step." if stage else "Grad overflow on iteration"
        ck.check(marker in p.stdout + p.stderr, f"{name}: DeepSpeed's overflow line is logged ('{marker}')")
    # One rank's gradients become NaN at step 5 (fault injection): every rank skips that step.
    # With tensor parallelism (nan-tp) rank 1 is shard 1 of the one replica (data-parallel rank
    # 0): the fault goes by the job's rank, and the shard's NaN reaches the other through the
    # gradient norm summed over the TP group.
    for precision in ("bf16", "fp16", "tp"):
        name = f"nan-{precision}"
        spec = job("bf16" if precision == "tp" else precision, 2, f"ck-{name}", steps=12)
        if precision == "tp":
            spec["deepspeed"]["tensor_parallel"] = {"autotp_size": 2}
        write_job(f"{d}/{name}.json", spec)
        env = dict(os.environ, ZTRAIN_INJECT_NAN_GRAD="5:1")
        p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], env=env)
        recs = read_metrics(f"{d}/{name}/metrics.jsonl")
        skipped = [r["train/skipped_steps"] for r in recs]
        ck.check(skipped == [0] * 4 + [1] * 8, f"{name}: exactly step 5 was skipped ({skipped})")
        ck.check(recs[-1]["train/loss"] < recs[0]["train/loss"], f"{name}: training goes on")
        line = ("OVERFLOW! Rank 0 Skipping step." if precision == "fp16"
                else "bf16 gradient overflow at step 5: skipping the step")
        ck.check(line in p.stdout, f"{name}: logged '{line}'")
    # bf16 with check_grad_overflow false, and fp32: a NaN is never applied silently.
    for precision in ("bf16", "fp32"):
        name = f"nan-unchecked-{precision}"
        spec = job(precision, 1, f"ck-{name}", steps=8)
        if precision == "bf16":
            spec["deepspeed"]["bf16"]["check_grad_overflow"] = False
        write_job(f"{d}/{name}.json", spec)
        env = dict(os.environ, ZTRAIN_INJECT_NAN_GRAD="3:0")
        p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], env=env, check=False)
        ck.check(p.returncode == 1 and "step 3" in p.stderr and "diverged" in p.stderr,
                 f"{name}: the run fails at step 3 with a message ({p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''})")
ck.done()
