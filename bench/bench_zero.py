"""ZeRO on the CPU: per-rank model-state memory against the ZeRO paper's formula, peak RSS, and
throughput, for one GPT-2 size at N = 1, 2, 4 ranks and stages 0-3 (fp32, AdamW).

    /usr/bin/python3 bench/bench_zero.py [--build build] [--steps 6]

Memory figures are ztrain's own measurements (resident pages of its flat buffers, the optimizer
state's size; metrics memory/rank0/*) beside 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N. tokens/s is the
global rate over the timed steps (the first 2 are warmup). With more ranks than cores the ranks
share the cores, so tokens/s compares stages at one N, not N against N.
"""
import argparse
import json
import math
import os
import subprocess
import tempfile

L, C, NH, V, T, MICRO = 4, 256, 4, 256, 128, 4


def psi():
    per_layer = 12 * C * C + 13 * C
    return V * C + T * C + L * per_layer + 2 * C


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    z = os.path.join(os.path.abspath(args.build), "ztrain")
    P = psi()
    print(f"GPT-2 n_layer {L}, n_embd {C}, block {T}, vocab {V}: Ψ = {P} parameters "
          f"({4 * P / 1e6:.1f} MB fp32); micro batch {MICRO} per rank; {os.cpu_count()} CPUs")
    print(f"{'N':>2} {'stage':>5} {'params MB':>10} {'grads MB':>9} {'optim MB':>9} "
          f"{'state MB':>9} {'formula MB':>11} {'ratio':>6} {'peak RSS MB':>12} {'tok/s':>8}")
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/train.txt", "wb") as f:
            f.write(os.urandom(400000))
        for n in (1, 2, 4):
            for stage in (0, 1, 2, 3):
                job = {"name": "zb", "world_size": n,
                       "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C,
                                 "vocab_size": V, "block_size": T},
                       "data": {"train": "train.txt", "shuffle": False},
                       "train": {"max_steps": args.steps, "log_interval": 1, "warmup_steps": 2},
                       "deepspeed": {"train_micro_batch_size_per_gpu": MICRO,
                                     "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                                     "zero_optimization": {"stage": stage,
                                                           "reduce_bucket_size": 500000,
                                                           "stage3_param_persistence_threshold": 10000}}}
                with open(f"{d}/job.json", "w") as f:
                    json.dump(job, f)
                out = f"{d}/out{n}{stage}"
                subprocess.run([z, "run", f"{d}/job.json", "--out", out], check=True,
                               stdout=subprocess.DEVNULL)
                recs = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
                last = recs[-1]
                timed = [r for r in recs if "perf/tokens_per_second" in r]
                tok_s = sum(MICRO * n * T for _ in timed) / (sum(r["perf/step_time_ms"] for r in timed) / 1e3)
                p, g, o = (last[f"memory/rank0/{k}"] for k in ("params_bytes", "grads_bytes", "optimizer_bytes"))
                formula = {0: 16 * P, 1: 8 * P + 8 * P / n, 2: 4 * P + 12 * P / n, 3: 16 * P / n}[stage]
                rss = max(last[f"memory/rank{r}/peak_rss_bytes"] for r in range(n))
                print(f"{n:>2} {stage:>5} {p / 1e6:>10.2f} {g / 1e6:>9.2f} {o / 1e6:>9.2f} "
                      f"{(p + g + o) / 1e6:>9.2f} {formula / 1e6:>11.2f} {(p + g + o) / formula:>6.2f} "
                      f"{rss / 1e6:>12.1f} {tok_s:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
