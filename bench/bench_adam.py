"""CPU AdamW in one run: ztrain's kernel against torch.optim.AdamW(foreach=True) and against the
memory bandwidth it could use, and the fused mixed-precision step against the engine's four-pass
path.

    /usr/bin/python3 bench/bench_adam.py [--build build] [--n 50000000] [--threads 2]
                                         [--reps 5] [--rounds 3]

ztrain's side is `zt_optim_dump --bench-json` (OMP_NUM_THREADS = --threads), which times in turn
the fp32 AdamW update of n parameters (through zt_optimizer_step), the fused mixed update with bf16
gradients in and bf16 parameters out (adam_update_mixed), the engine's four-pass equivalent
(from_half, scale, adam_update, to_half through a 64K-float buffer, as zt_zero_update_half does),
a memcpy of 14 bytes a parameter, and a loop with Adam's access pattern (read p, g, m, v; write p,
m, v) and no real arithmetic. torch's side is torch.optim.AdamW(foreach=True) on one flat fp32
parameter of n elements (torch.set_num_threads(--threads)), same hyperparameters, and for context
torch's CPU default (foreach=False, the single-tensor loop). Each round runs all of them; every
figure is the median over all rounds' repetitions.

Bytes per parameter: fp32 Adam reads p, g, m, v and writes p, m, v: 28 B. The mixed step reads a
bf16 gradient and p, m, v and writes p, m, v and a bf16 parameter: 28 B as well. The memcpy moves
14 B read + 14 B written per parameter, so its GB/s (read + written over time) is the copy
roofline; the access-pattern loop's GB/s is the ceiling for exactly Adam's streams.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch

LR, WD = 1e-3, 0.01
BYTES_PER_PARAM = 28


def ztrain_round(tool, cfg, n, reps, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([tool, "--bench-json", cfg, str(n), str(reps)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def torch_round(opt, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--n", type=int, default=50_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tool = os.path.join(os.path.abspath(args.build), "zt_optim_dump")
    n = args.n
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "adamw.json")
        with open(cfg, "w") as f:
            json.dump({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
                       "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}}}, f)
        g = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(n, generator=g) * 0.5)
        p.grad = torch.randn(n, generator=g) * 1e-3
        opt = torch.optim.AdamW([p], lr=LR, weight_decay=WD, foreach=True)
        opt_default = torch.optim.AdamW([p], lr=LR, weight_decay=WD)
        opt.step()  # allocates and faults in the state
        opt_default.step()
        zt = {k: [] for k in ("adam_fp32_s", "mixed_fused_bf16_s", "mixed_4pass_bf16_s",
                              "copy_s", "stream_s")}
        torch_s, torch_default_s = [], []
        isa = None
        for _ in range(args.rounds):
            r = ztrain_round(tool, cfg, n, args.reps, args.threads)
            isa = r["isa"]
            for k in zt:
                zt[k].append(r[k])
            torch_s += torch_round(opt, args.reps)
            torch_default_s += torch_round(opt_default, args.reps)
        med = {k: statistics.median(v) for k, v in zt.items()}
        t_torch = statistics.median(torch_s)
        t_torch_default = statistics.median(torch_default_s)

    copy_bw = 28.0 * n / med["copy_s"] / 1e9
    stream_bw = 28.0 * n / med["stream_s"] / 1e9
    print(f"CPU AdamW, n = {n:,} fp32 parameters, {args.threads} threads, ztrain path {isa}, "
          f"{args.rounds} rounds x {args.reps} reps (medians); {os.cpu_count()} CPUs")
    print(f"copy roofline (memcpy, 14 B read + 14 B written per param): {copy_bw:.1f} GB/s; "
          f"Adam-pattern stream (read p,g,m,v, write p,m,v): {stream_bw:.1f} GB/s")
    print(f"{'kernel':<44} {'ms/step':>8} {'M params/s':>11} {'GB/s':>6} {'vs torch':>9} "
          f"{'of copy':>8} {'of stream':>10}")
    rows = [("ztrain AdamW fp32", med["adam_fp32_s"]),
            ("torch.optim.AdamW(foreach=True) fp32", t_torch),
            ("torch.optim.AdamW() fp32 (CPU default)", t_torch_default),
            ("ztrain mixed bf16, fused (adam_update_mixed)", med["mixed_fused_bf16_s"]),
            ("ztrain mixed bf16, 4-pass (zero.c today)", med["mixed_4pass_bf16_s"])]
    for name, s in rows:
        bw = BYTES_PER_PARAM * n / s / 1e9
        print(f"{name:<44} {s * 1e3:>8.1f} {n / s / 1e6:>11.0f} {bw:>6.1f} {t_torch / s:>8.2f}x "
              f"{bw / copy_bw:>7.0%} {bw / stream_bw:>10.0%}")
    print(f"ztrain/torch: {t_torch / med['adam_fp32_s']:.2f}x (bar 2.5x); fused mixed vs 4-pass: "
          f"{med['mixed_4pass_bf16_s'] / med['mixed_fused_bf16_s']:.2f}x")


if __name__ == "__main__":
    main()
