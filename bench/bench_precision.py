"""Mixed precision on the CPU: fp32 vs bf16 vs fp16 training throughput and per-rank model-state
memory for one GPT-2 size, on 1 and 2 ranks (ZeRO stage 0 and 2), in one run.

    /usr/bin/python3 bench/bench_precision.py [--build build] [--steps 6]

On the CPU the 16-bit path stores parameters and gradients in 16 bits and computes in fp32, with
every activation rounded to 16-bit precision, so it measures the cost of that emulation, not the
speed-up a GPU's 16-bit tensor cores give. Memory is rank 0's measured model state beside the
ZeRO formula (fp32: 16Ψ / 4Ψ+12Ψ/N; 16-bit: 16Ψ / 2Ψ+14Ψ/N).
"""
import argparse
import json
import os
import subprocess
import tempfile

L, C, NH, V, T, MICRO = 4, 256, 4, 256, 128, 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    z = os.path.join(os.path.abspath(args.build), "ztrain")
    P = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    print(f"GPT-2 n_layer {L}, n_embd {C}, block {T}: Ψ = {P}; micro batch {MICRO} per rank; "
          f"{os.cpu_count()} CPUs")
    print(f"{'precision':>9} {'N':>2} {'stage':>5} {'tok/s':>8} {'vs fp32':>8} {'params MB':>10} "
          f"{'grads MB':>9} {'optim MB':>9} {'state MB':>9} {'formula MB':>11} {'fp32 work MB':>13}")
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/train.txt", "wb") as f:
            f.write(os.urandom(400000))
        for n, stage in ((1, 0), (2, 2)):
            base = None
            for precision in ("fp32", "bf16", "fp16"):
                ds = {"train_micro_batch_size_per_gpu": MICRO,
                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                      "zero_optimization": {"stage": stage, "reduce_bucket_size": 500000}}
                if precision != "fp32":
                    ds[precision] = {"enabled": True}
                job = {"name": "pb", "world_size": n,
                       "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C,
                                 "vocab_size": V, "block_size": T},
                       "data": {"train": "train.txt", "shuffle": False},
                       "train": {"max_steps": args.steps, "log_interval": 1, "warmup_steps": 2},
                       "deepspeed": ds}
                with open(f"{d}/job.json", "w") as f:
                    json.dump(job, f)
                out = f"{d}/{precision}{n}"
                subprocess.run([z, "run", f"{d}/job.json", "--out", out], check=True,
                               stdout=subprocess.DEVNULL)
                recs = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
                timed = [r for r in recs if "perf/tokens_per_second" in r]
                tok_s = MICRO * n * T * len(timed) / (sum(r["perf/step_time_ms"] for r in timed) / 1e3)
                base = base or tok_s
                last = recs[-1]
                p, g, o = (last[f"memory/rank0/{k}"] for k in ("params_bytes", "grads_bytes", "optimizer_bytes"))
                w = last.get("memory/rank0/fp32_workspace_bytes", 0)
                if precision == "fp32":
                    formula = 16 * P if stage == 0 else 4 * P + 12 * P / n
                else:
                    formula = 16 * P if stage == 0 else 2 * P + 14 * P / n
                print(f"{precision:>9} {n:>2} {stage:>5} {tok_s:>8.0f} {tok_s / base:>7.2f}x "
                      f"{p / 1e6:>10.2f} {g / 1e6:>9.2f} {o / 1e6:>9.2f} {(p + g + o) / 1e6:>9.2f} "
                      f"{formula / 1e6:>11.2f} {w / 1e6:>13.2f}", flush=True)


if __name__ == "__main__":
    main()
