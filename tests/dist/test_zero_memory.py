"""Per-rank model-state memory follows the ZeRO paper's accounting (fp32, Adam: 4 bytes of
parameters, 4 of gradients, 8 of optimizer state per parameter Ψ):
  stage 0: 16Ψ    stage 1: 8Ψ + 8Ψ/N    stage 2: 4Ψ + 12Ψ/N    stage 3: 16Ψ/N + gathered layers
for N = 2 and 4. The figures are the engine's measurements (resident pages of the flat buffers,
the optimizer state's size), read from metrics.jsonl; each part must lie within 5% of its term of
the formula plus padding, plus, where the formula allows it, the transient gathered layer (stage
3 parameters) and reduce bucket (stage 2/3 gradients, which also hold the tied embedding until the
end of the backward)."""
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, gpt2_shapes, read_metrics, run, tool, write_job  # noqa: E402

L, C, V, T = 4, 128, 256, 64
BUCKET = 50000
shapes = gpt2_shapes(L, C, V, T)
PSI = sum(int(math.prod(s)) for s in shapes.values())
LAYER = sum(int(math.prod(s)) for k, s in shapes.items() if k.startswith("h.0."))
OUTER = PSI - L * LAYER
# Tensors under stage3_param_persistence_threshold (1000 here: the norms and small biases) stay
# whole on every rank.
SMALL = sum(int(math.prod(s)) for s in shapes.values() if math.prod(s) < 1000)
PAGE = 4096

ck = Checker()
print(f"Ψ = {PSI} parameters, largest layer {LAYER}, embeddings and final norm {OUTER}")
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 3 + i // 7) % 256 for i in range(30000)))
    for world in (2, 4):
        for stage in (0, 1, 2, 3):
            write_job(f"{d}/j.json", {
                "name": "mem", "world_size": world,
                "model": {"type": "gpt2", "n_layer": L, "n_head": 4, "n_embd": C, "vocab_size": V,
                          "block_size": T},
                "data": {"train": "train.txt"},
                "train": {"max_steps": 3, "log_interval": 1},
                "deepspeed": {"train_micro_batch_size_per_gpu": 1,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                              "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET,
                                                    "stage3_param_persistence_threshold": 1000}}})
            out = f"{d}/s{stage}n{world}"
            run([tool("ztrain"), "run", f"{d}/j.json", "--out", out])
            rec = read_metrics(f"{out}/metrics.jsonl")[-1]
            pad = 4 * 16 * world + 8 * PAGE  # slice padding and page granularity
            n = world
            want = {
                # Stage 3 holds the layer in use and, with overlap_comm (its default), the next
                # one being prefetched; stages 2/3 hold the bucket being reduced and the one filling.
                "params_bytes": (4 * PSI if stage < 3 else 4 * PSI / n,
                                 0 if stage < 3 else 4 * (OUTER + 2 * LAYER + SMALL)),
                "grads_bytes": (4 * PSI if stage < 2 else 4 * PSI / n,
                                0 if stage < 2 else 4 * (2 * (BUCKET + LAYER) + OUTER)),
                "optimizer_bytes": (8 * PSI if stage == 0 else 8 * PSI / n, 0),
            }
            for r in range(world):
                total = 0
                for key, (base, transient) in want.items():
                    got = rec[f"memory/rank{r}/{key}"]
                    total += got
                    ok = base * 0.95 - pad <= got <= base * 1.05 + pad + transient
                    ck.check(ok, f"stage {stage}, N={n}, rank {r}: {key} {got / 1e6:.3f} MB, "
                                 f"formula {base / 1e6:.3f} MB" + (f" + up to {transient / 1e6:.3f} MB transient" if transient else ""))
                formula = {0: 16 * PSI, 1: 8 * PSI + 8 * PSI / n, 2: 4 * PSI + 12 * PSI / n,
                           3: 16 * PSI / n}[stage]
                print(f"      stage {stage}, N={n}, rank {r}: model state {total / 1e6:.3f} MB vs "
                      f"formula {formula / 1e6:.3f} MB; peak RSS {rec[f'memory/rank{r}/peak_rss_bytes'] / 1e6:.1f} MB")
ck.done()
