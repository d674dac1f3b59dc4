"""Tensor parallelism on the CPU: throughput, per-rank memory and the share of the step spent in
communication (the TP all-reduces, which dominate it with dp 1) at tp 1, 2 and 4 on the same
GPT-2, fp32 AdamW, ZeRO 0, the same global batch.

    /usr/bin/python3 bench/bench_tp.py [--build build] [--steps 8] [--threads 1]

Each rank gets --threads CPU threads. tok/s is the global rate over the timed steps (the first 3
are warmup); the memory columns are rank 0's model state (parameters, gradients, Adam's two
moments: each a 1/tp shard of the split tensors plus the whole small ones) and its peak RSS;
comm is perf/rank0/comm_ms over perf/rank0/step_time_ms, the time rank 0 spent inside
collectives (waiting for the other shards included). On a machine with fewer cores than
ranks the shards share the cores, so tp > 1 cannot be faster there; the memory columns and the
communication share are what the figures show.
"""
import argparse
import json
import os
import subprocess
import tempfile

L, C, NH, V, T, MICRO = 4, 256, 8, 512, 128, 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    z = os.path.join(os.path.abspath(args.build), "ztrain")
    print(f"GPT-2 n_layer {L}, n_embd {C}, n_head {NH}, vocab {V}, block {T}, batch {MICRO}; "
          f"{os.cpu_count()} CPUs, {args.threads} thread(s) per rank")
    print(f"{'tp':>2} {'tok/s':>8} {'step ms':>8} {'comm':>6} {'params MiB':>10} "
          f"{'grads MiB':>9} {'optim MiB':>9} {'peak RSS MiB':>12}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/train.txt", "wb") as f:
            f.write(os.urandom(400000))
        for tp in (1, 2, 4):
            ds = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
            if tp > 1:
                ds["tensor_parallel"] = {"autotp_size": tp}
            job = {"name": "tpb", "world_size": tp,
                   "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C,
                             "vocab_size": V, "block_size": T},
                   "data": {"train": "train.txt", "shuffle": False},
                   "train": {"max_steps": args.steps, "log_interval": 1, "warmup_steps": 3},
                   "deepspeed": ds}
            with open(f"{d}/job.json", "w") as f:
                json.dump(job, f)
            out = f"{d}/out{tp}"
            subprocess.run([z, "run", f"{d}/job.json", "--out", out, "--threads",
                            str(args.threads)], check=True, stdout=subprocess.DEVNULL, env=env)
            recs = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
            timed = [r for r in recs if "perf/tokens_per_second" in r]
            ms = sum(r["perf/step_time_ms"] for r in timed) / len(timed)
            comm = sum(r["perf/rank0/comm_ms"] / r["perf/rank0/step_time_ms"]
                       for r in timed) / len(timed)
            last = [r for r in recs if "memory/rank0/params_bytes" in r][-1]
            mib = lambda k: last[f"memory/rank0/{k}"] / 2**20  # noqa: E731
            print(f"{tp:>2} {MICRO * T / (ms / 1e3):>8.0f} {ms:>8.1f} {comm:>6.1%} "
                  f"{mib('params_bytes'):>10.2f} {mib('grads_bytes'):>9.2f} "
                  f"{mib('optimizer_bytes'):>9.2f} {mib('peak_rss_bytes'):>12.1f}", flush=True)


if __name__ == "__main__":
    main()
