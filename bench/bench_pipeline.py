"""Pipeline parallelism on the CPU: throughput and the measured bubble fraction of DeepSpeed's 1F1B
schedule against its ideal (S - 1)/(M + S - 1), for S = 1, 2, 4 stages (data parallel 1) and
M = 2, 4, 8, 16 micro-batches, one GPT-2 size, fp32 AdamW.

    /usr/bin/python3 bench/bench_pipeline.py [--build build] [--steps 6] [--threads 1]

The measured bubble is perf/pipeline_bubble (the share of a stage's schedule time outside
forward and backward, averaged over the stages), over the timed steps (the first 2 are
warmup). Each rank gets --threads CPU threads; with more ranks than cores the stages share the
cores and wait for each other's compute as well as for the schedule, so the measured bubble is
only comparable with the ideal where S × threads fits the machine. tok/s is the global rate.
"""
import argparse
import json
import os
import subprocess
import tempfile

L, C, NH, V, T, MICRO = 8, 128, 4, 256, 64, 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    z = os.path.join(os.path.abspath(args.build), "ztrain")
    print(f"GPT-2 n_layer {L}, n_embd {C}, block {T}, micro batch {MICRO}; {os.cpu_count()} CPUs, "
          f"{args.threads} thread(s) per rank")
    print(f"{'S':>2} {'M':>3} {'tok/s':>9} {'step ms':>9} {'bubble':>7} {'ideal':>7}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/train.txt", "wb") as f:
            f.write(os.urandom(400000))
        for stages in (1, 2, 4):
            for m in (2, 4, 8, 16):
                job = {"name": "pb", "world_size": stages,
                       "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C,
                                 "vocab_size": V, "block_size": T},
                       "data": {"train": "train.txt", "shuffle": False},
                       "train": {"max_steps": args.steps, "log_interval": 1, "warmup_steps": 2},
                       "deepspeed": {"train_micro_batch_size_per_gpu": MICRO,
                                     "gradient_accumulation_steps": m,
                                     "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}}
                if stages > 1:
                    job["pipeline"] = {"stages": stages, "partition": "uniform"}
                with open(f"{d}/job.json", "w") as f:
                    json.dump(job, f)
                out = f"{d}/out{stages}-{m}"
                subprocess.run([z, "run", f"{d}/job.json", "--out", out, "--threads",
                                str(args.threads)], check=True, stdout=subprocess.DEVNULL,
                               env=env)
                recs = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
                timed = [r for r in recs if "perf/tokens_per_second" in r]
                ms = sum(r["perf/step_time_ms"] for r in timed) / len(timed)
                tok_s = MICRO * m * T / (ms / 1e3)
                bubble = (sum(r.get("perf/pipeline_bubble", 0.0) for r in timed) / len(timed))
                ideal = (stages - 1) / (m + stages - 1)
                print(f"{stages:>2} {m:>3} {tok_s:>9.0f} {ms:>9.1f} {bubble:>7.3f} {ideal:>7.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
