"""ZeRO-3 checkpoints without gathering. A 2-rank stage-3 job saves a checkpoint after every step:
  a. each rank writes only its own slice of the parameters (model_rank_<r>.safetensors, 4Ψ/N
     bytes), and the parameter memory the engine measures (resident pages of the flat buffer,
     metrics.jsonl) stays within the stage-3 formula 4Ψ/N plus one gathered layer (and the one
     prefetched, and the small tensors kept whole) also across the checkpoints, where gathering
     the whole model would need 4Ψ — the model is big enough for that to exceed the bound;
  b. with zero_optimization.stage3_gather_16bit_weights_on_model_save the consolidated model
     (written a layer at a time) is in the checkpoint, and equals `ztrain zero-to-fp32`'s output
     and a consolidation of the shards done here in torch from meta.json's layout alone;
  c. in bf16 the consolidated file is BF16 and holds exactly the shards' values (the 16-bit
     parameters, widened), zero-to-fp32 writes the fp32 masters, which round to them (as
     DeepSpeed's zero_to_fp32 reads the fp32 partitions; test_zero_to_fp32_masters checks the
     masters themselves), and the deprecated spelling gather_16bit... works too;
  d. without the flag there is no model.safetensors, and zero-to-fp32 and `ztrain sample` still
     read the shards; resuming from them is bit-identical to the uninterrupted run; a damaged
     shard is refused naming the file."""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, gpt2_shapes, read_metrics, run, st_read, tool, write_job  # noqa: E402

L, C, V, T = 8, 128, 256, 64
WORLD = 2
shapes = gpt2_shapes(L, C, V, T)
PSI = sum(int(math.prod(s)) for s in shapes.values())
LAYER = sum(int(math.prod(s)) for k, s in shapes.items() if k.startswith("h.0."))
OUTER = PSI - L * LAYER
SMALL = sum(int(math.prod(s)) for s in shapes.values() if math.prod(s) < 1000)
PAGE = 4096


def job(name, zero, precision=None, steps=3):
    ds = {"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": 1000}, **zero)}
    if precision:
        ds[precision] = {"enabled": True}
    return {"name": name, "world_size": WORLD,
            "model": {"type": "gpt2", "n_layer": L, "n_head": 4, "n_embd": C, "vocab_size": V,
                      "block_size": T},
            "data": {"train": "train.txt"},
            "train": {"max_steps": steps, "log_interval": 1, "checkpoint_interval": 1,
                      "checkpoint_dir": f"ck-{name}"},
            "deepspeed": ds}


def train(d, name, spec):
    write_job(f"{d}/{name}.json", spec)
    run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/out-{name}"])
    ckdir = f"{d}/ck-{name}"
    with open(f"{ckdir}/latest") as f:
        return ckdir, f"{ckdir}/{f.read().strip()}"


def consolidate_here(tagdir):
    """The shards put together from meta.json's layout: independent of ztrain's readers."""
    with open(f"{tagdir}/meta.json") as f:
        meta = json.load(f)
    flat = None
    for r in range(meta["model_shards"]):
        t, md = st_read(f"{tagdir}/model_rank_{r:05d}.safetensors")
        n, lo = int(md["n_params"]), int(md["partition_offset"])
        if flat is None:
            flat = torch.full((n,), float("nan"))
        flat[lo:lo + t["params"].numel()] = t["params"]
    return {name: flat[off:off + math.prod(shape)].reshape(shape) for name, off, shape in meta["params"]}


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 3 + i // 7) % 256 for i in range(30000)))

    # a, b: fp32, the consolidated model asked for.
    ckdir, tagdir = train(d, "fp32", job("fp32", {"stage3_gather_16bit_weights_on_model_save": True}))
    bound = 4 * PSI / WORLD + 4 * (OUTER + 2 * LAYER + SMALL) + 4 * 16 * WORLD + 8 * PAGE
    print(f"Ψ = {PSI}, layer {LAYER}, outer {OUTER}: stage-3 bound {bound / 1e6:.3f} MB of "
          f"parameters per rank, the whole model {4 * PSI / 1e6:.3f} MB")
    ck.check(4 * PSI > bound, "the whole model gathered would exceed the bound")
    recs = read_metrics(f"{d}/out-fp32/metrics.jsonl")
    # Steps 2 and 3 follow the checkpoints of steps 1 and 2: their records hold those peaks.
    for rec in recs[1:]:
        for r in range(WORLD):
            got = rec[f"memory/rank{r}/params_bytes"]
            ck.check(got <= bound, f"step {rec['train/global_step']:.0f}, rank {r}: parameter "
                     f"memory {got / 1e6:.3f} MB within the stage-3 bound across the checkpoint "
                     f"(peak RSS {rec[f'memory/rank{r}/peak_rss_bytes'] / 1e6:.1f} MB)")
    for r in range(WORLD):
        t, md = st_read(f"{tagdir}/model_rank_{r:05d}.safetensors")
        ck.check(t["params"].dtype == torch.float32 and abs(t["params"].numel() - PSI / WORLD) <= 16 * WORLD,
                 f"rank {r} saved only its slice: {t['params'].numel()} of {PSI} parameters")
    ck.check(not os.path.exists(f"{tagdir}/optim_rank_{WORLD:05d}.safetensors"),
             "one optimizer file per rank")

    gathered, gmeta = st_read(f"{tagdir}/model.safetensors")
    run([tool("ztrain"), "zero-to-fp32", ckdir, f"{d}/fp32.safetensors"])
    exported, emeta = st_read(f"{d}/fp32.safetensors")
    here = consolidate_here(tagdir)
    ck.check(set(gathered) == set(shapes) == set(exported) == set(here),
             "the consolidated model, zero-to-fp32 and the consolidation here name every tensor")
    ck.check(all(gathered[k].dtype == torch.float32 for k in gathered),
             "fp32 training: the consolidated model is F32")
    ck.check(all(torch.equal(gathered[k], exported[k]) for k in shapes),
             "the consolidated model equals zero-to-fp32's output, bit for bit")
    ck.check(all(torch.equal(here[k], exported[k]) for k in shapes),
             "zero-to-fp32 equals the shards consolidated here from meta.json, bit for bit")
    ck.check(all(tuple(exported[k].shape) == shapes[k] for k in shapes), "shapes are GPT-2's")
    ck.check(gmeta.get("model_type") == "gpt2" and emeta.get("n_layer") == str(L),
             "both files carry the model's metadata")

    # c: bf16, the older spelling of the flag.
    ckdir, tagdir = train(d, "bf16", job("bf16", {"gather_16bit_weights_on_model_save": True}, "bf16", 2))
    gathered, _ = st_read(f"{tagdir}/model.safetensors")
    run([tool("ztrain"), "zero-to-fp32", ckdir, f"{d}/bf16.safetensors"])
    exported, _ = st_read(f"{d}/bf16.safetensors")
    here = consolidate_here(tagdir)
    ck.check(all(gathered[k].dtype == torch.bfloat16 for k in shapes),
             "bf16 training: the consolidated model is BF16")
    ck.check(any(not torch.equal(exported[k].to(torch.bfloat16).float(), exported[k])
                 for k in shapes),
             "bf16: zero-to-fp32 writes the fp32 masters, not 16-bit values")
    ck.check(all(torch.equal(gathered[k].float(), here[k]) and
                 torch.equal(exported[k].to(torch.bfloat16).float(), here[k]) for k in shapes),
             "bf16: the consolidated model equals the shards consolidated here, and "
             "zero-to-fp32's masters rounded to bf16")

    # d: no flag.
    ckdir, tagdir = train(d, "plain", job("plain", {}, steps=1))
    ck.check(not os.path.exists(f"{tagdir}/model.safetensors"),
             "without the flag a stage-3 checkpoint has no consolidated model")
    run([tool("ztrain"), "zero-to-fp32", ckdir, f"{d}/plain.safetensors"])
    exported, _ = st_read(f"{d}/plain.safetensors")
    here = consolidate_here(tagdir)
    ck.check(all(torch.equal(here[k], exported[k]) for k in shapes),
             "zero-to-fp32 consolidates the shards without it")
    p = subprocess.run([tool("ztrain"), "sample", ckdir, "--tokens", "8"], capture_output=True)
    ck.check(p.returncode == 0 and len(p.stdout) >= 8, "ztrain sample reads the shards")
    # Resuming from the shards continues the fp32 run of a. bit for bit (same job, other flag).
    spec = job("plain", {})
    spec["train"]["resume"] = True
    write_job(f"{d}/plain.json", spec)
    p = run([tool("ztrain"), "run", f"{d}/plain.json", "--out", f"{d}/out-plain"])
    full = [m["train/loss"] for m in read_metrics(f"{d}/out-fp32/metrics.jsonl")]
    resumed = [m["train/loss"] for m in read_metrics(f"{d}/out-plain/metrics.jsonl")]
    ck.check("resumed from" in p.stdout and resumed == full,
             f"resumed from the shards at step 1, the losses are bit-identical: {resumed}")
    with open(f"{tagdir}/model_rank_00001.safetensors", "r+b") as f:
        f.truncate(100)
    p = run([tool("ztrain"), "zero-to-fp32", ckdir, f"{d}/bad.safetensors", "--tag",
             os.path.basename(tagdir)], check=False)
    ck.check(p.returncode != 0 and "model_rank_00001.safetensors" in p.stderr,
             f"a damaged shard is refused naming it: {p.stderr.strip()[:160]}")
ck.done()
