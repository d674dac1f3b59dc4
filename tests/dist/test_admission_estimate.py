"""Admission's memory estimate (`ztrain estimate --json`) against what real runs measure.

For each run, fp32 ZeRO stages 0-3 on two ranks, bf16 at stages 1 and 3 (and at 1 and 2 with
fp32 gradient accumulation, data_types.grad_accum_dtype), optimizer offload to
"cpu" at stage 2 and to NVMe (with the parameters) at stage 3, and one rank with larger
micro-batches and a larger model, and with tensor parallelism (dp 2 x tp 2 at stages 1 and 3,
tp 4 in bf16 at stage 2: a shard's state, partitioned over world / tp ranks), every rank's
measured model state (the engine's resident
parameter, gradient and optimizer bytes, and in mixed precision its fp32 working copy, from
metrics.jsonl) must lie between the estimate's model state (parameters, gradients, optimizer
state, offload and working buffers) divided by 1.5 and that estimate, and its peak RSS must lie
between the estimate without the fixed process baseline divided by 1.5 and the whole estimate:
never under the measured figure, which would admit a job that cannot fit, and never far above it,
which would refuse jobs that can."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, run, tool, write_job  # noqa: E402

BASELINE = 64 << 20  # ZT_RANK_BASELINE_BYTES
STATE = ("param_bytes", "grad_bytes", "optimizer_bytes", "offload_bytes", "workspace_bytes")
MEASURED = ("params_bytes", "grads_bytes", "optimizer_bytes", "fp32_workspace_bytes")

ck = Checker()
with tempfile.TemporaryDirectory(prefix="ztrain-estimate-") as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 3 + i // 7) % 256 for i in range(60000)))
    nvme = {"device": "nvme", "nvme_path": d}
    runs = [
        # name, world, stage, micro-batch, precision (/ data_types.grad_accum_dtype), extra zero
        # keys, (L, C, T)
        ("fp32 stage 0", 2, 0, 1, None, {}, (4, 128, 64)),
        ("fp32 stage 1", 2, 1, 1, None, {}, (4, 128, 64)),
        ("fp32 stage 2", 2, 2, 1, None, {}, (4, 128, 64)),
        ("fp32 stage 3", 2, 3, 1, None, {}, (4, 128, 64)),
        ("bf16 stage 1", 2, 1, 1, "bf16", {}, (4, 128, 64)),
        ("bf16 stage 3", 2, 3, 1, "bf16", {}, (4, 128, 64)),
        ("bf16 stage 1, fp32 accumulation", 2, 1, 1, "bf16/fp32", {}, (4, 128, 64)),
        ("bf16 stage 2, fp32 accumulation", 2, 2, 1, "bf16/fp32", {}, (4, 128, 64)),
        ("cpu offload, stage 2", 2, 2, 1, None, {"offload_optimizer": {"device": "cpu"}},
         (4, 128, 64)),
        ("NVMe offload, stage 3", 2, 3, 1, None,
         {"offload_optimizer": nvme, "offload_param": nvme}, (4, 128, 64)),
        ("one rank, micro-batch 4, n_embd 512", 1, 0, 4, None, {}, (6, 512, 128)),
        # Tensor parallelism: a shard per rank, partitioned over its data-parallel replicas.
        ("dp 2 x tp 2, fp32 stage 1", 4, 1, 1, None, {}, (4, 256, 64), 2),
        ("dp 2 x tp 2, fp32 stage 3", 4, 3, 1, None, {}, (4, 256, 64), 2),
        ("tp 4, bf16 stage 2", 4, 2, 1, "bf16", {}, (4, 256, 64), 4),
    ]
    for i, (name, world, stage, mb, precision, zero, (L, C, T), *tp) in enumerate(runs):
        z = {"stage": stage, "reduce_bucket_size": 50000, "stage3_param_persistence_threshold": 1000}
        z.update(zero)
        ds = {"train_micro_batch_size_per_gpu": mb,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": z}
        if precision:
            precision, *accum = precision.split("/")
            ds[precision] = {"enabled": True}
            if accum:
                ds["data_types"] = {"grad_accum_dtype": accum[0]}
        if tp:
            ds["tensor_parallel"] = {"autotp_size": tp[0]}
        job = f"{d}/job{i}.json"
        write_job(job, {"name": f"estimate{i}", "world_size": world,
                        "model": {"type": "gpt2", "n_layer": L, "n_head": 4, "n_embd": C,
                                  "vocab_size": 256, "block_size": T},
                        "data": {"train": "train.txt"},
                        "train": {"max_steps": 3, "log_interval": 1},
                        "deepspeed": ds})
        est = json.loads(run([tool("ztrain"), "estimate", "--json", job]).stdout)
        run([tool("ztrain"), "run", job, "--out", f"{d}/out{i}"])
        rec = read_metrics(f"{d}/out{i}/metrics.jsonl")[-1]
        state = sum(est[k] for k in STATE)
        for r in range(world):
            measured = sum(rec.get(f"memory/rank{r}/{k}", 0) for k in MEASURED)
            rss = rec[f"memory/rank{r}/peak_rss_bytes"]
            ck.check(measured <= state <= 1.5 * measured,
                     f"{name}, rank {r}: model state measured {measured / 1e6:.2f} MB, "
                     f"estimated {state / 1e6:.2f} MB")
            ck.check((est["rank_bytes"] - BASELINE) / 1.5 <= rss <= est["rank_bytes"],
                     f"{name}, rank {r}: peak RSS {rss / 1e6:.1f} MB, estimated "
                     f"{est['rank_bytes'] / 1e6:.1f} MB of which "
                     f"{(est['rank_bytes'] - BASELINE) / 1e6:.1f} MB beyond the baseline")
ck.done()
