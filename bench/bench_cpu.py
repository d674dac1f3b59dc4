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

With --llama the model is a Llama (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head),
by default the one of issue 33 (--model L,C,H,KV,I,V = 4,256,8,2,688,512), and the PyTorch side is
Hugging Face transformers' LlamaForCausalLM with SDPA attention. Both sides start from the same
weights: the HF model is saved once and ztrain loads it (model.init_from), and both read the same
uint16 token file, so their first losses must agree (printed, and checked: the run stops if they
differ by more than --loss-tol) and the ratio compares the same computation.

    /tmp/ci/.venv-ds/bin/python bench/bench_cpu.py --build build --side-by-side --llama \
        --steps 6 --warmup 2 --repeat 3 --threads 2 --precision fp32,bf16 --gemm onednn --compile
"""
import argparse
import json
import math
import os
import struct
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
LLAMA = (4, 256, 8, 2, 688, 512)  # issue 33's Llama: n_layer, n_embd, heads, kv heads, SwiGLU, vocab


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


def llama_hf_dir(d, cfg):
    """Saves a randomly initialised LlamaForCausalLM of cfg to d/hf (config.json, safetensors):
    the weights both sides start from. Its directory."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.disable_progress_bar()
    L, C, NH, KV, I, V = cfg
    torch.manual_seed(0)
    conf = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=I, num_hidden_layers=L,
                       num_attention_heads=NH, num_key_value_heads=KV,
                       max_position_embeddings=SEQ, rms_norm_eps=1e-5, tie_word_embeddings=False)
    path = os.path.join(d, f"hf-{'x'.join(map(str, cfg))}")
    LlamaForCausalLM(conf).save_pretrained(path)
    return path


def torch_model(cfg, hf_dir):
    """The PyTorch side's model and its loss function (idx, targets) -> loss."""
    if hf_dir is None:
        L, C, NH = cfg
        model = GPT2(L, C, NH, VOCAB, SEQ)
        return model, model
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa").float().train()

    def loss(idx, targets):
        logits = model(input_ids=idx).logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
    return model, loss


def bench_torch(cfg, data, steps, warmup, threads, compiled=False, bf16=False, hf_dir=None):
    """PyTorch's tokens/s over the timed steps and its first step's loss."""
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model, loss_fn = torch_model(cfg, hf_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    fwd = torch.compile(loss_fn) if compiled else loss_fn
    times, first = [], None
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
        if first is None:
            first = loss.item()
    timed = times[warmup:]
    return BATCH * SEQ * len(timed) / sum(timed), first


def bench_ztrain(build, cfg, data_path, steps, warmup, threads, workdir, gemm=None,
                 bf16=False, hf_dir=None):
    """ztrain's tokens/s over the timed steps and its first step's loss."""
    if hf_dir is None:
        L, C, NH = cfg
        model = {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": VOCAB,
                 "block_size": SEQ}
    else:
        model = {"init_from": hf_dir, "block_size": SEQ}
    tag = "x".join(map(str, cfg))
    job = {
        "name": f"bench-{tag}",
        "model": model,
        "data": {"train": data_path, "shuffle": False},
        "train": {"max_steps": warmup + steps, "log_interval": 1, "warmup_steps": warmup},
        "deepspeed": {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
                      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
                      "gradient_clipping": 1.0},
    }
    if bf16:
        job["deepspeed"]["bf16"] = {"enabled": True}
    job_path = os.path.join(workdir, f"job-{tag}.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    out = os.path.join(workdir, f"run-{tag}")
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
    first = next((r["train/loss"] for r in recs if "train/loss" in r), math.nan)
    return BATCH * SEQ * len(timed) / (sum(timed) / 1e3), first


def make_data(d, args, vocab=VOCAB):
    """Random tokens for every step, as a tensor and as a file in d that ztrain reads: bytes for
    a vocabulary of 256, else an llm.c uint16 token file."""
    n = (args.warmup + args.steps) * BATCH * SEQ + 1
    data = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(1))
    # Written without numpy, which a PyTorch 2 venv made for these benchmarks may lack.
    if vocab == 256:
        data_path = os.path.join(d, "data.txt")
        with open(data_path, "wb") as f:
            f.write(bytes(data.to(torch.uint8).tolist()))
    else:
        data_path = os.path.join(d, "data.bin")
        header = [0] * 256
        header[0], header[1], header[2] = 20240520, 1, n
        with open(data_path, "wb") as f:
            f.write(struct.pack("<256i", *header))
            f.write(struct.pack(f"<{n}H", *data.tolist()))
    return data, data_path


def models(d, args):
    """(label, cfg, hf_dir or None, data tensor, data file) per model of the run; a Llama's
    weights are saved to d once, for both sides and every round."""
    if args.llama:
        for cfg in CONFIGS:
            L, C, NH, KV, I, V = cfg
            data, data_path = make_data(d, args, vocab=V)
            yield (f"Llama L{L} C{C} H{NH}/{KV} I{I} V{V}", cfg, llama_hf_dir(d, cfg), data,
                   data_path)
        return
    data, data_path = make_data(d, args)
    for cfg in CONFIGS:
        L, C, NH = cfg
        yield f"GPT-2 L{L} C{C} H{NH}", cfg, None, data, data_path


def load():
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def compare_builds(build, baseline, args):
    """ztrain against another ztrain build, alternating runs; ratios of medians."""
    print(f"ztrain {build} vs baseline {baseline}: {'Llama' if args.llama else 'GPT-2'} on the "
          f"CPU, fp32, AdamW, batch {BATCH} x seq {SEQ}, {args.threads} threads, {args.steps} timed "
          f"steps after {args.warmup} warmup, {args.repeat} alternating runs each")
    with tempfile.TemporaryDirectory() as d:
        for label, cfg, hf_dir, _, data_path in models(d, args):
            new, old = [], []
            for _ in range(args.repeat):
                old.append(bench_ztrain(baseline, cfg, data_path, args.steps, args.warmup,
                                        args.threads, d, hf_dir=hf_dir)[0])
                new.append(bench_ztrain(build, cfg, data_path, args.steps, args.warmup,
                                        args.threads, d, hf_dir=hf_dir)[0])
                print(f"{label}: round: baseline {old[-1]:.0f}, this {new[-1]:.0f} ({load()})")
            med = lambda v: sorted(v)[len(v) // 2]
            spread = lambda v: max(v) / min(v) - 1
            print(f"{label}: baseline tok/s {' '.join(f'{x:.0f}' for x in old)}")
            print(f"{label}: this     tok/s {' '.join(f'{x:.0f}' for x in new)}")
            print(f"{label}: median {med(new):.0f} vs {med(old):.0f}, ratio "
                  f"{med(new) / med(old):.3f}; spread this {spread(new):.1%}, baseline "
                  f"{spread(old):.1%}")
            sys.stdout.flush()


def check_first_losses(label, losses, sides, tol):
    """Both sides start from the same weights and data (Llama), so each precision's first losses
    must agree: within tol[prec] relative. Stops the run otherwise: the ratio would compare
    different computations."""
    for prec, t in tol.items():
        got = {n: losses[n] for n, _, bf16, _ in sides if (prec == "bf16") == bf16}
        if not got:
            continue
        ref = next(iter(got.values()))
        bad = {n: v for n, v in got.items() if not abs(v - ref) <= t * abs(ref)}
        print(f"{label} first losses {prec}: " + ", ".join(f"{n} {v:.6f}" for n, v in got.items())
              + f" (agree within {t:g} relative: {'yes' if not bad else 'NO'})")
        if bad:
            sys.exit(f"{label}: the first losses of {', '.join(bad)} differ from {ref:.6f} by more "
                     f"than {t:g} relative; the sides do not compute the same thing")


def side_by_side(build, args):
    """ztrain (per matrix library, per precision) and PyTorch (eager, compiled) in rounds."""
    precisions = args.precision.split(",")
    print(f"{'Llama (transformers LlamaForCausalLM, SDPA)' if args.llama else 'GPT-2'} training on "
          f"the CPU, {'/'.join(precisions)}, AdamW, batch {BATCH} x seq {SEQ}, {args.threads} "
          f"threads, {args.steps} timed steps after {args.warmup} warmup, {args.repeat} rounds; "
          f"PyTorch {torch.__version__}; {load()}")
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
        for label, cfg, hf_dir, data, data_path in models(d, args):
            got = {name: [] for name, *_ in sides}
            for r in range(args.repeat):
                losses = {}
                for name, gemm, bf16, compiled in sides:
                    if gemm:
                        v, losses[name] = bench_ztrain(build, cfg, data_path, args.steps,
                                                       args.warmup, args.threads, d, gemm=gemm,
                                                       bf16=bf16, hf_dir=hf_dir)
                    else:
                        v, losses[name] = bench_torch(cfg, data, args.steps, args.warmup,
                                                      args.threads, compiled=compiled, bf16=bf16,
                                                      hf_dir=hf_dir)
                    got[name].append(v)
                if hf_dir and r == 0:
                    check_first_losses(label, losses, sides,
                                       {"fp32": args.loss_tol, "bf16": args.loss_tol_bf16})
                print(f"{label} round: " + ", ".join(f"{n} {got[n][-1]:.0f}" for n, *_ in sides)
                      + f" ({load()})")
                sys.stdout.flush()
            med = {n: sorted(v)[len(v) // 2] for n, v in got.items()}
            print(f"{label} medians tok/s: " + ", ".join(f"{n} {med[n]:.0f}" for n, *_ in sides))
            for prec in precisions:
                best = max([v for n, v in med.items() if n.startswith("torch") and
                            n.endswith(prec)] or [math.nan])
                for n, gemm, *_ in sides:
                    if gemm and n.endswith(prec):
                        line = f"{n} / fastest PyTorch {prec} = {med[n] / best:.2f}x"
                        fp32 = f"ztrain {gemm.split(':')[0]} fp32"
                        if prec == "bf16" and fp32 in med:
                            line += f"; / {fp32} = {med[n] / med[fp32]:.2f}x"
                        print(f"{label}: {line}")
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
                    help="n_layer,n_embd,n_head to run instead of the default models (repeatable); "
                         "with --llama n_layer,n_embd,heads,kv_heads,intermediate,vocab")
    ap.add_argument("--llama", action="store_true",
                    help="a Llama (default issue 33's 4,256,8,2,688,512) against transformers' "
                         "LlamaForCausalLM (SDPA), both from the same weights")
    ap.add_argument("--loss-tol", type=float, default=1e-4,
                    help="--llama: relative agreement of the fp32 sides' first losses")
    ap.add_argument("--loss-tol-bf16", type=float, default=2e-2,
                    help="--llama: relative agreement of the bf16 sides' first losses")
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
    if args.llama:
        CONFIGS[:] = [LLAMA]
    if args.model:
        CONFIGS[:] = [tuple(int(x) for x in m.split(",")) for m in args.model]
        n = 6 if args.llama else 3
        if any(len(c) != n for c in CONFIGS):
            ap.error(f"--model takes {n} comma-separated integers"
                     f"{' with --llama' if args.llama else ''}")
    build = os.path.abspath(args.build)
    if args.baseline:
        compare_builds(build, os.path.abspath(args.baseline), args)
        return
    if args.side_by_side:
        side_by_side(build, args)
        return
    print(f"{'Llama' if args.llama else 'GPT-2'} training on the CPU, fp32, AdamW, batch "
          f"{BATCH} x seq {SEQ}, {args.threads} threads, {args.steps} timed steps after "
          f"{args.warmup} warmup")
    print(f"PyTorch {torch.__version__}, {os.cpu_count()} CPUs, {load()}")
    print(f"{'model':>32} {'ztrain tok/s':>14} {'PyTorch tok/s':>14} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as d:
        for label, cfg, hf_dir, data, data_path in models(d, args):
            z = bench_ztrain(build, cfg, data_path, args.steps, args.warmup, args.threads, d,
                             hf_dir=hf_dir)[0]
            t = bench_torch(cfg, data, args.steps, args.warmup, args.threads, hf_dir=hf_dir)[0]
            print(f"{label:>32} {z:14.0f} {t:14.0f} {z / t:6.2f}x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
