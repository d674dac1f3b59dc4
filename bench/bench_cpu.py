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

With --side-by-side it runs, in rounds (--repeat), ztrain with each matrix library of --gemm
(ZTRAIN_GEMM: openblas, onednn; onednn:bf16 adds native bf16 products) and PyTorch eager, plus
torch.compile with --compile (PyTorch 2), in fp32 and/or (--precision fp32,bf16) ztrain's
DeepSpeed bf16 against PyTorch's CPU autocast to bfloat16, and prints every round, the medians and
the ratios. Run it with the Python whose PyTorch is
to be compared (bench/README.md: a PyTorch 2 venv made apart from the test venv).
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


def bench_torch(L, C, NH, data, steps, warmup, threads, compiled=False, bf16=False):
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = GPT2(L, C, NH, VOCAB, SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    fwd = torch.compile(model) if compiled else model
    times = []
    for step in range(warmup + steps):
        off = step * BATCH * SEQ
        chunk = data[off:off + BATCH * SEQ + 1]
        x, y = chunk[:-1].view(BATCH, SEQ), chunk[1:].view(BATCH, SEQ)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    timed = times[warmup:]
    return BATCH * SEQ * len(timed) / sum(timed)


def bench_ztrain(build, L, C, NH, data_path, steps, warmup, threads, workdir, gemm=None,
                 bf16=False):
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
    if bf16:
        job["deepspeed"]["bf16"] = {"enabled": True}
    job_path = os.path.join(workdir, f"job-{L}x{C}.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    out = os.path.join(workdir, f"run-{L}x{C}")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if gemm:
        env["ZTRAIN_GEMM"] = gemm.split(":")[0]
        if gemm.endswith(":bf16"):
            env["ZTRAIN_GEMM_BF16"] = "on"
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
    # Written without numpy, which a PyTorch 2 venv made for these benchmarks may lack.
    with open(data_path, "wb") as f:
        f.write(bytes(data.to(torch.uint8).tolist()))
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


def side_by_side(build, args):
    """ztrain (per matrix library, per precision) and PyTorch (eager, compiled) in rounds."""
    precisions = args.precision.split(",")
    print(f"GPT-2 training on the CPU, {'/'.join(precisions)}, AdamW, batch {BATCH} x seq {SEQ}, "
          f"vocab {VOCAB}, {args.threads} threads, {args.steps} timed steps after {args.warmup} "
          f"warmup, {args.repeat} rounds; PyTorch {torch.__version__}")
    # (name, ztrain matrix library or None for PyTorch, bf16, compiled); a library written
    # "onednn:bf16" also sets ZTRAIN_GEMM_BF16=on (native bf16 products in bf16 jobs).
    sides = []
    for prec in precisions:
        bf16 = prec == "bf16"
        for g in args.gemm.split(","):
            if g.endswith(":bf16") and not bf16:
                continue
            sides.append((f"ztrain {g} {prec}", g, bf16, False))
        if bf16 and args.no_torch_bf16:
            continue
        sides.append((f"torch eager {prec}", None, bf16, False))
        if args.compile:
            sides.append((f"torch compile {prec}", None, bf16, True))
    with tempfile.TemporaryDirectory() as d:
        data, data_path = make_data(d, args)
        for L, C, NH in CONFIGS:
            got = {name: [] for name, *_ in sides}
            for _ in range(args.repeat):
                for name, gemm, bf16, compiled in sides:
                    if gemm:
                        v = bench_ztrain(build, L, C, NH, data_path, args.steps, args.warmup,
                                         args.threads, d, gemm=gemm, bf16=bf16)
                    else:
                        v = bench_torch(L, C, NH, data, args.steps, args.warmup, args.threads,
                                        compiled=compiled, bf16=bf16)
                    got[name].append(v)
                print(f"L{L} C{C} H{NH} round: " +
                      ", ".join(f"{n} {got[n][-1]:.0f}" for n, *_ in sides))
                sys.stdout.flush()
            med = {n: sorted(v)[len(v) // 2] for n, v in got.items()}
            print(f"L{L} C{C} H{NH} medians tok/s: " +
                  ", ".join(f"{n} {med[n]:.0f}" for n, *_ in sides))
            for prec in precisions:
                best = max([v for n, v in med.items() if n.startswith("torch") and
                            n.endswith(prec)] or [math.nan])
                for n, gemm, *_ in sides:
                    if gemm and n.endswith(prec):
                        line = f"{n} / fastest PyTorch {prec} = {med[n] / best:.2f}x"
                        fp32 = f"ztrain {gemm.split(':')[0]} fp32"
                        if prec == "bf16" and fp32 in med:
                            line += f"; / {fp32} = {med[n] / med[fp32]:.2f}x"
                        print(f"L{L} C{C} H{NH}: {line}")
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
    ap.add_argument("--side-by-side", action="store_true",
                    help="ztrain per --gemm library against PyTorch eager (and --compile), in rounds")
    ap.add_argument("--gemm", default="onednn,openblas",
                    help="ZTRAIN_GEMM values for --side-by-side (comma-separated; onednn:bf16 "
                         "also forces native bf16 products in bf16 runs)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (PyTorch 2)")
    ap.add_argument("--precision", default="fp32",
                    help="--side-by-side: fp32, bf16 or fp32,bf16; bf16 is ztrain's DeepSpeed bf16 "
                         "vs PyTorch's CPU autocast")
    ap.add_argument("--no-torch-bf16", action="store_true",
                    help="--side-by-side: leave out PyTorch's bf16 autocast (Debian's PyTorch 1.13 "
                         "has no fast CPU bf16 kernels and takes minutes per step)")
    args = ap.parse_args()
    if args.model:
        CONFIGS[:] = [tuple(int(x) for x in m.split(",")) for m in args.model]
    build = os.path.abspath(args.build)
    if args.baseline:
        compare_builds(build, os.path.abspath(args.baseline), args)
        return
    if args.side_by_side:
        side_by_side(build, args)
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
