"""What the tensor-parallel tests share (test_tp_parity, test_tp_zero, test_tp_masked): the small
GPT-2 and Llama they train, a job spec of a dp x pp x tp grid for the same global batch, a run
through `ztrain run` whose checkpoint is exported as one whole model, and the comparisons against
the single-rank run (the reference: the same model and batch on one rank, no TP)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import BUILD, read_metrics, rel_err, run, st_read, tool, write_job  # noqa: E402


def tp_join(d, shard_tensors):
    """The whole tensors of the tensor-parallel checkpoint directory d, from shard_tensors(t)
    (shard t's {name: tensor}), joined by d/tp.json as ckpt_tp.h lays them out: dimension `dim`
    of each whole tensor is `groups` groups, each the shards' pieces in shard order; a tensor
    with dim < 0 is whole in every shard (shard 0's is taken)."""
    import json

    import torch
    with open(f"{d}/tp.json") as f:
        layout = json.load(f)
    shards = [shard_tensors(t) for t in range(layout["tp"])]
    out = {}
    for name, dim, groups, shape, *_ in layout["tensors"]:
        if dim < 0:
            out[name] = shards[0][name]
            continue
        pieces = [s[name].chunk(groups, dim) for s in shards]
        out[name] = torch.cat([torch.cat([p[g] for p in pieces], dim) for g in range(groups)], dim)
        assert list(out[name].shape) == shape, (name, list(out[name].shape), shape)
    return out


def skip_without_emulator():
    """Ends a test that needs the emulated CUDA device when this build has none."""
    if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
        print("SKIPPED: this build has no emulated CUDA device (-DZT_CUDA_EMU=OFF or no CUDA "
              "headers)")
        sys.exit(0)


GLOBAL, STEPS = 16, 10
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 256,
        "block_size": 16}
LLAMA = {"type": "llama", "n_layer": 2, "n_head": 8, "n_kv_head": 4, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 16,
         "tie_word_embeddings": False}


def write_text(d):
    """The training data every job reads: 20000 bytes of a simple pattern, as a text file."""
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))


def job(model, tp, dp, ckpt, zero=0, precision=None, steps=STEPS, pp=1, zero_extra=None,
        data=None):
    """A job of dp replicas of tp shards (and pp stages) for a global batch of GLOBAL sequences."""
    gas = 4 if pp > 1 else 1
    ds = {"train_micro_batch_size_per_gpu": GLOBAL // (dp * gas), "gradient_accumulation_steps": gas,
          # eps 1e-4: near-zero gradients are rounding noise Adam with eps 1e-8 would magnify.
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
          "gradient_clipping": 0.5, "zero_optimization": dict({"stage": zero}, **(zero_extra or {}))}
    if tp > 1:
        ds["tensor_parallel"] = {"autotp_size": tp}
    if precision:
        ds[precision] = {"enabled": True}
    spec = {"name": f"tp{tp}x{dp}x{pp}", "world_size": tp * dp * pp, "model": model,
            "data": data or {"train": "train.txt", "shuffle": True},
            "train": {"max_steps": steps, "log_interval": 1, "checkpoint_dir": ckpt, "seed": 5,
                      "resume": True},
            "deepspeed": ds}
    if pp > 1:
        spec["pipeline"] = {"stages": pp, "partition": "uniform"}
    return spec


def train(d, name, spec, export=True, env=None):
    """Runs spec; (losses, gradient norms, exported weights or None, the run's output)."""
    write_job(f"{d}/{name}.json", spec)
    p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"],
            env=dict(os.environ, **(env or {})))
    params = None
    if export:
        run([tool("ztrain"), "export", f"{d}/{spec['train']['checkpoint_dir']}", "--out",
             f"{d}/{name}.safetensors"])
        params, _ = st_read(f"{d}/{name}.safetensors")
    metrics = [m for m in read_metrics(f"{d}/{name}/metrics.jsonl") if "train/loss" in m]
    return ([m["train/loss"] for m in metrics], [m["train/grad_norm"] for m in metrics], params,
            p.stdout + p.stderr)


def compare(ck, what, ref, got, loss_tol=1e-6, tol=1e-5):
    """got's steps against the same steps of ref (a resumed run has ref's last ones)."""
    n = len(got[0])
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[0], ref[0][-n:]))
    ck.check(n in (STEPS, STEPS // 2) and worst < loss_tol,
             f"{what}: {n} losses, worst rel err {worst:.1e}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[1], ref[1][-n:]))
    ck.check(worst < tol, f"{what}: gradient norms, worst rel err {worst:.1e}")
    ck.check(sorted(got[2]) == sorted(ref[2]),
             f"{what}: the exported model has the single-rank tensors "
             f"(extra {sorted(set(got[2]) - set(ref[2]))}, "
             f"missing {sorted(set(ref[2]) - set(got[2]))})")
    common = [k for k in ref[2] if k in got[2]]
    err, name = max((rel_err(got[2][k], ref[2][k]), k) for k in common)
    ck.check(err < tol, f"{what}: final parameters, worst tensor {name} rel err {err:.1e}")


def identical(ck, what, ref, got):
    ck.check(got[0] == ref[0][-len(got[0]):] and got[1] == ref[1][-len(got[1]):],
             f"{what}: losses and gradient norms bit-identical ({len(got[0])} steps)")
    ck.check(sorted(got[2]) == sorted(ref[2]) and
             all((got[2][k] == ref[2][k]).all() for k in ref[2]),
             f"{what}: final weights bit-identical")


def refused(ck, d, name, spec, text):
    write_job(f"{d}/{name}.json", spec)
    p = run([tool("zt_job_check"), f"{d}/{name}.json"], check=False)
    ck.check(p.returncode != 0 and text in p.stderr,
             f"{name}: refused naming {text!r} ({p.stderr.strip()[-200:]})")
