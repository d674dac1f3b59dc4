"""NVMe offload on the CPU: tokens/s, optimizer-step time and peak RSS of in-memory training
against ZeRO-Offload / ZeRO-Infinity, for one GPT-2 size, side by side in one run.

    /usr/bin/python3 bench/bench_offload.py [--build build] [--steps 6] [--rounds 3]
                                            [--layers 6] [--embd 512] [--threads 2]
                                            [--nvme-path DIR]

Every configuration trains the same model (fp32, AdamW, byte vocabulary, block 128, micro batch
2, one rank with --threads OpenMP threads, ZeRO stage 2, or 3 where parameters are offloaded) on
the same data for --steps steps; the first 2 are warmup. Each round runs every configuration in
turn; the figures are medians over all rounds' timed steps, so a burst of load elsewhere on the
machine moves them less. tokens/s is per step; "step ms" is DeepSpeed's step timer
(wall_clock_breakdown): the optimizer update, which is where the offloaded state is read and
written. Peak RSS is the rank's getrusage maximum; "optim MB" is
ztrain's own optimizer-bytes metric (state in memory plus offload buffers); "in files MB" is the state
that lives under nvme_path by the formula (8 bytes a parameter for Adam's moments, 12 with the
fp32 masters, plus the 16-bit parameters at stage 3), not a measurement of the directory. --nvme-path defaults to a directory under /tmp; /dev/shm (tmpfs) is also
measured when it exists, to tell the cost of the mechanism from the cost of the device.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

T, MICRO, V = 128, 2, 256


def psi(L, C):
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def train(z, d, name, L, C, stage, threads, steps, optimizer=None, param=None):
    zero = {"stage": stage, "reduce_bucket_size": 50000000, "sub_group_size": 1 << 20}
    if optimizer:
        zero["offload_optimizer"] = optimizer
    if param:
        zero["offload_param"] = param
    job = {"name": name, "world_size": 1,
           "model": {"type": "gpt2", "n_layer": L, "n_head": C // 64, "n_embd": C,
                     "vocab_size": V, "block_size": T},
           "data": {"train": "train.txt", "shuffle": False},
           "train": {"max_steps": steps, "log_interval": 1, "warmup_steps": 2},
           "deepspeed": {"train_micro_batch_size_per_gpu": MICRO, "wall_clock_breakdown": True,
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                         "zero_optimization": zero}}
    with open(f"{d}/{name}.json", "w") as f:
        json.dump(job, f)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run([z, "run", f"{d}/{name}.json", "--out", f"{d}/{name}", "--threads",
                        str(threads)], check=True, capture_output=True, text=True, env=env)
    recs = [json.loads(line) for line in open(f"{d}/{name}/metrics.jsonl")]
    how = re.search(r"\[ztrain\] offload: (.*)", p.stdout)
    last = recs[-1]
    return {"step_s": [r["perf/step_time_ms"] / 1e3 for r in recs if "perf/tokens_per_second" in r],
            "opt_ms": [float(m) for m in re.findall(r"step: ([0-9.]+)", p.stdout)][2:],
            "rss": last["memory/rank0/peak_rss_bytes"], "optim": last["memory/rank0/optimizer_bytes"],
            "how": how.group(1) if how else "in memory", "loss": last["train/loss"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nvme-path", default=None)
    args = ap.parse_args()
    z = os.path.join(os.path.abspath(args.build), "ztrain")
    L, C = args.layers, args.embd
    P = psi(L, C)
    print(f"GPT-2 n_layer {L}, n_embd {C}, block {T}, vocab {V}: Ψ = {P / 1e6:.1f}M parameters; "
          f"1 rank, {args.threads} threads, micro batch {MICRO}, fp32 AdamW; {args.steps} steps "
          f"(2 warmup) x {args.rounds} rounds; medians")
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/train.txt", "wb") as f:
            f.write(os.urandom(2000000))
        disk = args.nvme_path or f"{d}/nvme"
        os.makedirs(disk, exist_ok=True)
        paths = [("disk", disk)]
        if os.path.isdir("/dev/shm") and not args.nvme_path:
            paths.append(("tmpfs", tempfile.mkdtemp(prefix="ztrain-bench-", dir="/dev/shm")))
        runs = [("in memory, stage 2", 2, None, None, 0),
                ("offload_optimizer cpu, stage 2", 2, {"device": "cpu"}, None, 0)]
        for label, path in paths:
            nv = {"device": "nvme", "nvme_path": path}
            pipelined = dict(nv, pipeline_read=True, pipeline_write=True)
            runs += [(f"offload_optimizer nvme ({label}), stage 2", 2, nv, None, 8 * P),
                     ("  same, pipeline_read/write", 2, pipelined, None, 8 * P),
                     (f"optimizer + params nvme ({label}), stage 3", 3, pipelined, nv, 12 * P)]
        results = [[] for _ in runs]
        try:
            # A first run that is not reported: page cache, CPU frequency and allocator warm up.
            train(z, d, "warm", L, C, 2, args.threads, min(args.steps, 3))
            for _ in range(args.rounds):
                for i, (label, stage, opt, par, files) in enumerate(runs):
                    results[i].append(train(z, d, f"r{i}", L, C, stage, args.threads, args.steps,
                                            opt, par))
        finally:
            if len(paths) > 1:
                os.rmdir(paths[1][1])
    print(f"{'configuration':<44} {'tok/s':>7} {'vs mem':>7} {'step ms':>8} "
          f"{'peak RSS MB':>12} {'optim MB':>9} {'in files MB':>12}")
    base = None
    for (label, stage, opt, par, files), rs in zip(runs, results):
        tok_s = MICRO * T / statistics.median(s for r in rs for s in r["step_s"])
        opt_ms = statistics.median(m for r in rs for m in r["opt_ms"])
        rss = max(r["rss"] for r in rs)
        base = base or (tok_s, rs[0]["loss"])
        same = "" if all(r["loss"] == base[1] for r in rs) else "  (loss differs!)"
        print(f"{label:<44} {tok_s:>7.0f} {tok_s / base[0]:>6.2f}x {opt_ms:>8.0f} "
              f"{rss / 1e6:>12.0f} {rs[0]['optim'] / 1e6:>9.1f} {files / 1e6:>12.0f}{same}")
        if opt and opt.get("device") == "nvme" and not label.startswith(" "):
            print(f"{'':<4}({rs[0]['how']})")


if __name__ == "__main__":
    main()
