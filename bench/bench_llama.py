"""ztrain vs PyTorch: Llama-style training throughput on the CPU, fp32 and bf16, side by side in
one run.

The model is a Llama 3-style decoder of about 21M parameters (6 layers, width 576, 9 query heads
over 3 key/value heads of 64, SwiGLU width 1536, rotary embeddings, RMSNorm, untied head, byte
vocabulary). Both sides train it with the same batch, sequence, AdamW and clipping, with the same
thread count; each is timed over the same number of steps after the same warmup.
- fp32: everything in fp32 on both sides.
- bf16: ztrain's bf16 mixed precision (DeepSpeed's "bf16": fp32 master weights and Adam state,
  16-bit parameters, gradients and activations) against PyTorch's CPU autocast to bfloat16 with
  fp32 parameters, the mixed precision torch offers on the CPU.
Prints tokens/s of each and the ratio ztrain / PyTorch.

    /usr/bin/python3 bench/bench_llama.py [--build build] [--threads 2] [--steps 10] [--warmup 2]
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

L, C, NH, KV, HD, I, V = 6, 576, 9, 3, 64, 1536, 256
SEQ, BATCH, THETA = 256, 8, 500000.0


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
        self.q_proj = nn.Linear(C, NH * HD, bias=False)
        self.k_proj = nn.Linear(C, KV * HD, bias=False)
        self.v_proj = nn.Linear(C, KV * HD, bias=False)
        self.o_proj = nn.Linear(NH * HD, C, bias=False)
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, NH, HD).transpose(1, 2)
        k = self.k_proj(h).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(h).view(B, T, KV, HD).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // KV, dim=1), v.repeat_interleave(NH // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(B, T, NH * HD))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block() for _ in range(L))
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        inv_freq = 1.0 / THETA ** (torch.arange(0, HD, 2).float() / HD)
        ang = torch.outer(torch.arange(SEQ).float(), inv_freq)
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", ~torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)))

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for b in self.layers:
            x = b(x, cos, sin, self.mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


def n_params():
    return sum(p.numel() for p in Llama().parameters())


def bench_torch(precision, data, steps, warmup, threads):
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = Llama()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    times = []
    for step in range(warmup + steps):
        off = step * BATCH * SEQ
        chunk = data[off:off + BATCH * SEQ + 1]
        x, y = chunk[:-1].view(BATCH, SEQ), chunk[1:].view(BATCH, SEQ)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    timed = times[warmup:]
    return BATCH * SEQ * len(timed) / sum(timed)


def bench_ztrain(build, precision, data_path, steps, warmup, threads, workdir):
    ds = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
          "gradient_clipping": 1.0}
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    job = {
        "name": f"bench-llama-{precision}",
        "model": {"type": "llama", "n_layer": L, "n_head": NH, "n_kv_head": KV, "n_embd": C,
                  "head_dim": HD, "intermediate_size": I, "vocab_size": V, "block_size": SEQ,
                  "rms_norm_eps": 1e-5, "rope_theta": THETA},
        "data": {"train": data_path, "shuffle": False},
        "train": {"max_steps": warmup + steps, "log_interval": 1, "warmup_steps": warmup},
        "deepspeed": ds,
    }
    job_path = os.path.join(workdir, f"job-{precision}.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    out = os.path.join(workdir, f"run-{precision}")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run([os.path.join(build, "ztrain"), "run", job_path, "--out", out,
                    "--threads", str(threads)], check=True, stdout=subprocess.DEVNULL, env=env)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    timed = [r["perf/step_time_ms"] for r in recs if "perf/tokens_per_second" in r]
    return BATCH * SEQ * len(timed) / (sum(timed) / 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", action="append", choices=["fp32", "bf16"],
                    help="run only these (repeatable; default both)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    print(f"Llama-style training on the CPU ({n_params() / 1e6:.1f}M parameters: L{L} C{C} "
          f"H{NH}/KV{KV}x{HD} I{I} V{V}), AdamW, batch {BATCH} x seq {SEQ}, {args.threads} threads, "
          f"{args.steps} timed steps after {args.warmup} warmup")
    print(f"PyTorch {torch.__version__}, {os.cpu_count()} CPUs")
    print(f"{'precision':>10} {'ztrain tok/s':>14} {'PyTorch tok/s':>14} {'ratio':>7}")
    n = (args.warmup + args.steps) * BATCH * SEQ + 1
    data = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as d:
        data_path = os.path.join(d, "data.txt")
        # Written without numpy, which a PyTorch 2 venv made for these benchmarks may lack.
        with open(data_path, "wb") as f:
            f.write(bytes(data.to(torch.uint8).tolist()))
        for precision in args.precision or ["fp32", "bf16"]:
            z = bench_ztrain(build, precision, data_path, args.steps, args.warmup, args.threads, d)
            t = bench_torch(precision, data, args.steps, args.warmup, args.threads)
            print(f"{precision:>10} {z:14.0f} {t:14.0f} {z / t:6.2f}x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
