"""ztrain vs PyTorch: GPT-2 training throughput on the CPU, side by side in one run.

Both train the same configuration (same model, batch, sequence, AdamW, fp32) with the same thread
count on the same machine; each is timed over the same number of steps after the same warmup.
Prints tokens/s of each and the ratio ztrain / PyTorch.

With --baseline DIR (the build directory of another ztrain, e.g. an earlier commit) it compares
two ztrain builds instead: the two are run alternately --repeat times per model (A B A B ...), so
that a slow phase of the machine hits both, and it prints each run, the medians, the ratio of
medians and each side's spread (max/min - 1), which is the noise a difference must exceed.

    /usr/bin/python3 bench/bench_cpu.py [--build build] [--threads 2] [--steps 20] [--warmup 3]
    /usr/bin/python3 bench/bench_cpu.py --build build --baseline ../old/build --repeat 5
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = [  # (n_layer, n_embd, n_head)
    (4, 256, 4),
    (6, 384, 6),
]
SEQ, BATCH, VOCAB = 256, 8, 256


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, NH, V, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", ~torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def bench_torch(L, C, NH, data, steps, warmup, threads):
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = GPT2(L, C, NH, VOCAB, SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    times = []
    for step in range(warmup + steps):
        off = step * BATCH * SEQ
        chunk = data[off:off + BATCH * SEQ + 1]
        x, y = chunk[:-1].view(BATCH, SEQ), chunk[1:].view(BATCH, SEQ)
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    timed = times[warmup:]
    return BATCH * SEQ * len(timed) / sum(timed)


def bench_ztrain(build, L, C, NH, data_path, steps, warmup, threads, workdir):
    job = {
        "name": f"bench-{L}x{C}",
        "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C,
                  "vocab_size": VOCAB, "block_size": SEQ},
        "data": {"train": data_path, "shuffle": False},
        "train": {"max_steps": warmup + steps, "log_interval": 1, "warmup_steps": warmup},
        "deepspeed": {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
                      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
                      "gradient_clipping": 1.0},
    }
    job_path = os.path.join(workdir, f"job-{L}x{C}.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    out = os.path.join(workdir, f"run-{L}x{C}")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run([os.path.join(build, "ztrain"), "run", job_path, "--out", out,
                    "--threads", str(threads)], check=True, stdout=subprocess.DEVNULL, env=env)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f]
    timed = [r["perf/step_time_ms"] for r in recs if "perf/tokens_per_second" in r]
    return BATCH * SEQ * len(timed) / (sum(timed) / 1e3)


def make_data(d, args):
    """Random bytes for every step, as a tensor and as a file in d that ztrain reads."""
    n = (args.warmup + args.steps) * BATCH * SEQ + 1
    data = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(1))
    data_path = os.path.join(d, "data.txt")
    data.to(torch.uint8).numpy().tofile(data_path)
    return data, data_path


def compare_builds(build, baseline, args):
    """ztrain against another ztrain build, alternating runs; ratios of medians."""
    print(f"ztrain {build} vs baseline {baseline}: GPT-2 on the CPU, fp32, AdamW, batch {BATCH} x "
          f"seq {SEQ}, {args.threads} threads, {args.steps} timed steps after {args.warmup} warmup, "
          f"{args.repeat} alternating runs each")
    with tempfile.TemporaryDirectory() as d:
        _, data_path = make_data(d, args)
        for L, C, NH in CONFIGS:
            new, old = [], []
            for _ in range(args.repeat):
                old.append(bench_ztrain(baseline, L, C, NH, data_path, args.steps, args.warmup,
                                        args.threads, d))
                new.append(bench_ztrain(build, L, C, NH, data_path, args.steps, args.warmup,
                                        args.threads, d))
            med = lambda v: sorted(v)[len(v) // 2]
            spread = lambda v: max(v) / min(v) - 1
            print(f"L{L} C{C} H{NH}: baseline tok/s {' '.join(f'{x:.0f}' for x in old)}")
            print(f"L{L} C{C} H{NH}: this     tok/s {' '.join(f'{x:.0f}' for x in new)}")
            print(f"L{L} C{C} H{NH}: median {med(new):.0f} vs {med(old):.0f}, ratio "
                  f"{med(new) / med(old):.3f}; spread this {spread(new):.1%}, baseline "
                  f"{spread(old):.1%}")
            sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--baseline", help="another ztrain build directory to compare against")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--model", action="append", metavar="L,C,H",
                    help="n_layer,n_embd,n_head to run instead of the default models (repeatable)")
    args = ap.parse_args()
    if args.model:
        CONFIGS[:] = [tuple(int(x) for x in m.split(",")) for m in args.model]
    build = os.path.abspath(args.build)
    if args.baseline:
        compare_builds(build, os.path.abspath(args.baseline), args)
        return
    print(f"GPT-2 training on the CPU, fp32, AdamW, batch {BATCH} x seq {SEQ}, vocab {VOCAB}, "
          f"{args.threads} threads, {args.steps} timed steps after {args.warmup} warmup")
    print(f"PyTorch {torch.__version__}, {os.cpu_count()} CPUs")
    print(f"{'model':>18} {'ztrain tok/s':>14} {'PyTorch tok/s':>14} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as d:
        data, data_path = make_data(d, args)
        for L, C, NH in CONFIGS:
            z = bench_ztrain(build, L, C, NH, data_path, args.steps, args.warmup, args.threads, d)
            t = bench_torch(L, C, NH, data, args.steps, args.warmup, args.threads)
            print(f"{f'L{L} C{C} H{NH}':>18} {z:14.0f} {t:14.0f} {z / t:6.2f}x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
