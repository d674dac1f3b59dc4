"""ztrain vs PyTorch on one NVIDIA GPU (issue 15, item 7), side by side in one run.

GPT-2 124M (12 layers, 768 wide, 12 heads, sequence 1024, vocabulary 50257 padded to 50304), bf16,
AdamW, trained by
- ztrain (`ztrain run`, "device": "cuda", DeepSpeed's bf16: fp32 masters, 16-bit weights,
  gradients and activations),
- PyTorch eager and torch.compile: bf16 autocast over fp32 weights, fused AdamW,
  scaled_dot_product_attention (causal),
- llm.c (`train_gpt2cu` built from github.com/karpathy/llm.c by `scripts/gpu-check.sh prepare`,
  given with --llmc-bin): its own GPT-2 124M (`-e d12`, random initialisation) in bf16 with fp32
  master weights and its defaults (GELU recomputed in the backward, cuDNN's attention where the
  build has it), on the same random tokens; its step time is its own cudaEvent timing of the
  training section, tokens/s the micro-batch's tokens over the median step after --warmup,
each at the largest micro-batch that fits (tried from --micro-batch down by halves) for --steps
steps after --warmup. Prints tokens/s, MFU and peak GPU memory of each and the ratios ztrain /
PyTorch and llm.c, and exits 1 naming the runs that gave no figure. MFU = tokens/s × FLOPs per
token / the dense bf16 peak of the device, FLOPs per token by llm.c's count (flops_per_token:
6 per weight, less an untied input embedding, and 6·layers·width·sequence), the peak
from ztrain/gpu.h's table (H100 SXM and H200 989 TFLOPS, H100 NVL and H200 NVL 835, A100 312),
stated with the result.

Then a Llama-style model of about 1.1B parameters (TinyLlama's shape: 22 layers, 2048 wide, 32
heads over 4 key/value heads, SwiGLU 5632, vocabulary 32000, sequence 2048), trained by ztrain with
ZeRO stage 2 as it is and with "offload_optimizer": "cpu", and by PyTorch eager, to show what one
GPU holds with and without offload.

The device is the first GPU nvidia-smi lists; PyTorch is imported only for its own runs, and
without a CUDA device of its own only they fail: ztrain's and llm.c's figures do not depend on
it. --dry-run prints the plan (the models' parameter counts, the peaks, the runs, the job specs)
as JSON without touching a GPU or importing torch: what the CPU-only tests check. The figures go to
--out as JSON; bench/README.md keeps only figures from a GPU run, with the device named."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

PEAKS = {"H100 SXM": 989e12, "H200": 989e12, "H100 NVL": 835e12, "H200 NVL": 835e12,
         "H100 PCIe": 756e12, "A100": 312e12}
GPT2 = {"type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304,
        "block_size": 1024}
LLAMA = {"type": "llama", "n_layer": 22, "n_head": 32, "n_kv_head": 4, "n_embd": 2048,
         "intermediate_size": 5632, "vocab_size": 32000, "block_size": 2048,
         "tie_word_embeddings": False}
REAL_VOCAB = {"gpt2": 50257, "llama": 32000}
RUNS = ["ztrain", "torch_eager", "torch_compile", "llmc"]


def gpt2_params(m):
    C, L, V, T = m["n_embd"], m["n_layer"], m["vocab_size"], m["block_size"]
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def llama_params(m):
    C, L, H, KV = m["n_embd"], m["n_layer"], m["n_head"], m["n_kv_head"]
    FF, V = m["intermediate_size"], m["vocab_size"]
    kv = C // H * KV
    return 2 * V * C + L * (2 * C * C + 2 * C * kv + 3 * C * FF + 2 * C) + C


def flops_per_token(m, params):
    """llm.c's count, the one its reported MFU uses and bench/perf_model.py's model FLOPs
    follow: 6 per weight and token, the weights being every parameter less an untied input
    embedding (a lookup, no product), and 6·L·C·T for attention's two T×T products under the
    causal mask. ztrain's own perf/tflops counts as DeepSpeedExamples does (12·L·C·T, the input
    embedding in), about 7% more for GPT-2 124M: the MFU here is computed from tokens/s alike
    for every run, so runs compare with one another and with the model."""
    weights = params
    if m["type"] == "llama" and not m.get("tie_word_embeddings", False):
        weights -= m["vocab_size"] * m["n_embd"]
    return 6 * weights + 6 * m["n_layer"] * m["n_embd"] * m["block_size"]


def peak_of(name):
    """The dense bf16 peak of a device by name, as ztrain/gpu.h's table has it."""
    for key in ("H200 NVL", "H100 NVL", "H200", "H100 PCIe", "A100"):
        if key in name:
            return key, PEAKS[key]
    if "H100" in name:
        return "H100 SXM", PEAKS["H100 SXM"]
    return "unknown", 0.0


def ztrain_job(model, micro, steps, warmup, stage=0, offload=False, data="tokens.bin"):
    ds = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
          "bf16": {"enabled": True}, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}},
          "zero_optimization": {"stage": stage}}
    if offload:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {"name": f"bench-{model['type']}", "world_size": 1, "device": "cuda", "model": model,
            "data": {"train": data},
            "train": {"max_steps": steps + warmup, "log_interval": 1, "warmup_steps": warmup},
            "deepspeed": ds}


# ---- ztrain ---------------------------------------------------------------------------------

def write_tokens(path, vocab, n):
    """An llm.c token file of n random tokens (256 int32 header: magic, version, count)."""
    import random
    rng = random.Random(0)
    header = [20240520, 1, n] + [0] * 253
    with open(path, "wb") as f:
        f.write(b"".join(x.to_bytes(4, "little") for x in header))
        f.write(b"".join(rng.randrange(vocab).to_bytes(2, "little") for _ in range(n)))


class MemoryWatch:
    """Peak GPU memory in use while a child process runs, polled from nvidia-smi."""

    def __init__(self):
        self.peak, self.stop = 0, False
        self.t = threading.Thread(target=self.poll, daemon=True)

    def poll(self):
        while not self.stop:
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits", "-i", "0"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.peak = max(self.peak, int(out.split()[0]) << 20)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass
            time.sleep(0.25)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.t.join()


def run_ztrain(args, work, model, micro, stage=0, offload=False):
    job = ztrain_job(model, micro, args.steps, args.warmup, stage, offload)
    path = os.path.join(work, f"job-{model['type']}-{micro}-{int(offload)}.json")
    with open(path, "w") as f:
        json.dump(job, f)
    out = path[:-5]
    try:
        with MemoryWatch() as mw:
            p = subprocess.run([os.path.join(args.ztrain_bin, "ztrain"), "run", path, "--out",
                                out] + (["--profile"] if args.profile else []),
                               capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ztrain run micro-batch {micro}: no result within --timeout "
                f"{args.timeout:g} s", "timeout": True}
    except OSError as e:
        return {"error": f"ztrain run: {e}"}
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-400:]}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    tps = sorted(r["perf/tokens_per_second"] for r in recs if "perf/tokens_per_second" in r)
    # How long the host waited for the GPU in a step, beside the step: near the step's time the
    # GPU was the bottleneck; near 0 the host's issuing was (what a CUDA graph would help).
    waits = sorted((r["perf/rank0/device_wait_ms"], r["perf/rank0/step_time_ms"]) for r in recs
                   if "perf/rank0/device_wait_ms" in r and "perf/rank0/step_time_ms" in r)
    if args.profile:  # the op profile of this run (docs/profiling.md), where --profile asks
        shutil.copyfile(os.path.join(out, "profile.json"), args.profile)
    wait = waits[len(waits) // 2] if waits else (None, None)
    return {"tokens_per_s": tps[len(tps) // 2] if tps else None, "peak_memory": mw.peak,
            "device_wait_ms": wait[0], "step_time_ms": wait[1]}


# ---- llm.c -------------------------------------------------------------------------------------

def llmc_command(binary, data, micro, steps, warmup, T=1024):
    """train_gpt2cu's arguments: GPT-2 124M from scratch (-e d12) on `data` for warmup + steps
    steps of one micro-batch each (the total batch is B·T, no accumulation); validation only at
    the first and last step, one batch (-v, -m: outside its timed section), no sampling (-s 0),
    no checkpoints (no -o)."""
    return [binary, "-i", data, "-j", data, "-e", "d12", "-b", str(micro), "-t", str(T),
            "-x", str(warmup + steps), "-v", str(1 << 30), "-m", "1", "-s", "0"]


def llmc_steps(text):
    """llm.c's per-step lines ("step    3/25 | loss ... | 123.45 ms | ...") as {step: ms}."""
    import re
    steps = {}
    for m in re.finditer(r"^step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \|", text, re.M):
        steps[int(m.group(1))] = float(m.group(2))
    return steps


def llmc_tokens_per_s(text, micro, warmup, T=1024):
    """The micro-batch's tokens over the median step time after warmup, or None."""
    ms = sorted(v for k, v in llmc_steps(text).items() if k > warmup)
    return micro * T * 1000.0 / ms[len(ms) // 2] if ms else None


def run_llmc(args, data, micro):
    """llm.c at one micro-batch: the first of the --llmc-bin builds that runs (its cuDNN build,
    then the one without cuDNN, which scripts/gpu-check.sh gives in that order)."""
    if not args.llmc_bin:
        return {"error": "no llm.c binary: --llmc-bin (scripts/gpu-check.sh prepare builds "
                "train_gpt2cu from LLMC_SRC)"}
    errors = []
    for binary in args.llmc_bin:
        r = run_llmc_build(args, binary, data, micro)
        if "error" not in r or r.get("timeout") or "managed memory" in r["error"]:
            return dict(r, build=os.path.basename(binary), **({"failed_builds": errors}
                                                               if errors else {}))
        errors.append(f"{os.path.basename(binary)}: {r['error']}")
    return {"error": "; ".join(errors)}


def run_llmc_build(args, binary, data, micro):
    cmd = llmc_command(binary, data, micro, args.steps, args.warmup)
    try:
        with MemoryWatch() as mw:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                               cwd=os.path.dirname(data))
    except subprocess.TimeoutExpired:
        return {"error": f"llm.c micro-batch {micro}: no result within --timeout "
                f"{args.timeout:g} s", "timeout": True}
    except OSError as e:
        return {"error": f"llm.c: {e}"}
    tps = llmc_tokens_per_s(p.stdout, micro, args.warmup)
    if p.returncode != 0 or tps is None:
        return {"error": f"llm.c exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}
    # Past the device's memory llm.c keeps its optimizer state in managed memory, slower, and
    # says so ("WARNING: Fell back to cudaMallocManaged ..."): not a size that fits.
    if "Fell back to cudaMallocManaged" in p.stdout:
        return {"error": f"llm.c micro-batch {micro}: its optimizer state fell back to managed "
                "memory (the device is full)"}
    return {"tokens_per_s": tps, "peak_memory": mw.peak}


# ---- PyTorch ----------------------------------------------------------------------------------

def torch_models(torch):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, C, H):
            super().__init__()
            self.H = H
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self, m):
            super().__init__()
            C = m["n_embd"]
            self.wte, self.wpe = nn.Embedding(m["vocab_size"], C), nn.Embedding(m["block_size"], C)
            self.h = nn.ModuleList(Block(C, m["n_head"]) for _ in range(m["n_layer"]))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    class LlamaBlock(nn.Module):
        def __init__(self, m):
            super().__init__()
            C, self.H, self.KV = m["n_embd"], m["n_head"], m["n_kv_head"]
            D = C // self.H
            self.n1, self.n2 = nn.RMSNorm(C), nn.RMSNorm(C)
            self.q, self.kv = nn.Linear(C, C, bias=False), nn.Linear(C, 2 * self.KV * D, bias=False)
            self.o = nn.Linear(C, C, bias=False)
            self.gate_up = nn.Linear(C, 2 * m["intermediate_size"], bias=False)
            self.down = nn.Linear(m["intermediate_size"], C, bias=False)

        def forward(self, x, cos, sin):
            B, T, C = x.shape
            D = C // self.H
            h = self.n1(x)
            q = self.q(h).view(B, T, self.H, D).transpose(1, 2)
            k, v = self.kv(h).view(B, T, 2, self.KV, D).permute(2, 0, 3, 1, 4)

            def rope(t):
                a, b = t[..., : D // 2], t[..., D // 2:]
                return t * cos + torch.cat((-b, a), dim=-1) * sin
            y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True,
                                               enable_gqa=True)
            x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
            g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    class Llama(nn.Module):
        def __init__(self, m):
            super().__init__()
            C, D, T = m["n_embd"], m["n_embd"] // m["n_head"], m["block_size"]
            self.emb = nn.Embedding(m["vocab_size"], C)
            self.layers = nn.ModuleList(LlamaBlock(m) for _ in range(m["n_layer"]))
            self.norm, self.head = nn.RMSNorm(C), nn.Linear(C, m["vocab_size"], bias=False)
            inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
            ang = torch.outer(torch.arange(T).float(), inv).repeat(1, 2)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)

        def forward(self, idx, targets):
            x = self.emb(idx)
            T = idx.shape[1]
            for layer in self.layers:
                x = layer(x, self.cos[:T], self.sin[:T])
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    return {"gpt2": GPT2, "llama": Llama}


def run_torch(args, torch, family, model, micro, compiled):
    """tokens/s and peak memory of PyTorch at one micro-batch, or an "error" (out of memory)."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    net = None
    try:
        net = torch_models(torch)[family](model).cuda()
        opt = torch.optim.AdamW(net.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
        step_fn = torch.compile(net) if compiled else net
        T = model["block_size"]
        idx = torch.randint(0, REAL_VOCAB[family], (micro, T + 1), device="cuda")
        x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
        t0 = None
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        return {"tokens_per_s": args.steps * micro * T / dt,
                "peak_memory": torch.cuda.max_memory_allocated()}
    except torch.cuda.OutOfMemoryError:
        return {"error": "out of memory"}
    except Exception as e:  # torch.compile's backends (Inductor, Triton, the host compiler)
        # fail in their own ways, not all of them RuntimeErrors: one failed run must not end
        # the benchmark and the runs after it
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    finally:
        del net
        torch.cuda.empty_cache()


# What each run says when a micro-batch does not fit: ztrain's admission ("does not fit on the
# GPU") and its allocations ("out of memory", "cannot allocate"), PyTorch's OutOfMemoryError
# ("out of memory"), llm.c's fall-back to managed memory.
MEMORY_ERRORS = ("out of memory", "does not fit", "cannot allocate", "managed memory")


def out_of_memory(result):
    return any(m in result.get("error", "").lower() for m in MEMORY_ERRORS)


def gpu_name():
    """The first GPU's name as nvidia-smi gives it (CUDA's name for it too), or None: asked
    without PyTorch, which ztrain's and llm.c's runs do not need."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i",
                              "0"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.strip().splitlines() or [""])[0].strip() or None


def load_torch():
    """PyTorch with a CUDA device, or None and why not: then only the PyTorch runs fail."""
    try:
        import torch
    except ImportError as e:
        return None, f"import torch failed: {e}"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__}: torch.cuda.is_available() is False"
    # No TF32 flag: under bf16 autocast every product is bf16 already, and the flag's API moved
    # in 2.9 (fp32_precision), where setting the new one alone makes Inductor, which reads the
    # legacy one, fail every torch.compile ("mix of the legacy and new APIs",
    # github.com/pytorch/pytorch/issues/166387) and the legacy one warns.
    return torch, None


def largest(run, start, exact=False):
    """The first micro-batch from start down by halves that runs, and its result. Only a
    micro-batch that did not fit is retried smaller: any other failure (a crash, a compiler
    error, a timeout) would fail again at every size, each try costing the GPU's minutes."""
    micro, last = start, None
    while micro >= (start if exact else 1):
        last = run(micro)
        if "error" not in last:
            return dict(last, micro_batch=micro)
        if not out_of_memory(last):
            break
        micro //= 2
    return dict(last or {"error": "nothing ran"}, micro_batch=0)


def plan(args):
    runs = [r for r in args.runs.split(",") if r]
    return {"gpt2": {"model": GPT2, "params": gpt2_params(GPT2),
                     "flops_per_token": flops_per_token(GPT2, gpt2_params(GPT2))},
            "llama": {"model": LLAMA, "params": llama_params(LLAMA),
                      "flops_per_token": flops_per_token(LLAMA, llama_params(LLAMA)),
                      "ztrain": ["zero stage 2", "zero stage 2 + offload_optimizer cpu"]},
            "peak": PEAKS, "runs": runs, "steps": args.steps, "warmup": args.warmup,
            "micro_batch_start": args.micro_batch,
            "ztrain_job": ztrain_job(GPT2, args.micro_batch, args.steps, args.warmup),
            "llmc_command": llmc_command((args.llmc_bin or ["train_gpt2cu"])[0], "tokens.bin",
                                         args.micro_batch, args.steps, args.warmup)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--micro-batch", type=int, default=32,
                    help="the first micro-batch tried (then halves until one fits)")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--ztrain-bin", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--llmc-bin", action="append",
                    help="llm.c's train_gpt2cu, for the llmc run (GPT-2 only); again for a "
                    "build to try when the one before fails")
    ap.add_argument("--out", help="write the figures here as JSON")
    ap.add_argument("--dry-run", action="store_true", help="print the plan as JSON and stop")
    ap.add_argument("--profile", metavar="PATH",
                    help="run ztrain with --profile and copy its profile.json here (the last "
                    "ztrain run's)")
    ap.add_argument("--exact-batch", action="store_true",
                    help="only --micro-batch, never smaller (the performance model's shape)")
    args = ap.parse_args(argv)
    if args.micro_batch < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--micro-batch and --steps must be at least 1, --warmup at least 0")
    bad = [r for r in args.runs.split(",") if r and r not in RUNS]
    if bad:
        ap.error(f"--runs: unknown {', '.join(bad)} (known: {', '.join(RUNS)})")
    if args.dry_run:
        print(json.dumps(plan(args), indent=2))
        return 0
    device = gpu_name()
    if device is None:
        print("bench_gpu: needs a CUDA GPU: nvidia-smi lists none", file=sys.stderr)
        return 1
    peak_name, peak = peak_of(device)
    runs = [r for r in args.runs.split(",") if r]
    torch, torch_error = load_torch() if {"torch_eager", "torch_compile"} & set(runs) else \
        (None, "not asked for")
    res = {"device": device, "peak": {"name": peak_name, "flops": peak},
           "torch": torch.__version__ if torch else torch_error}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as work:
        for family in [m for m in args.models.split(",") if m]:
            model = GPT2 if family == "gpt2" else LLAMA
            params = gpt2_params(model) if family == "gpt2" else llama_params(model)
            fpt = flops_per_token(model, params)
            data = os.path.join(work, "tokens.bin")
            write_tokens(data, REAL_VOCAB[family], 1 << 20)
            res[family] = out = {"params": params}

            def record(name, result):
                """A run's result with its MFU and the ratios so far, and the JSON rewritten:
                a run cut short (the caller's time limit) still leaves the runs before it."""
                out[name] = result
                if result.get("tokens_per_s"):
                    result["mfu"] = result["tokens_per_s"] * fpt / peak if peak else None
                z = out.get("ztrain", {}).get("tokens_per_s")
                for r in ("torch_eager", "torch_compile", "llmc"):
                    t = out.get(r, {}).get("tokens_per_s")
                    if z and t:
                        out[f"ratio_ztrain_over_{r}"] = z / t
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(res, f, indent=2)

            # The 1.1B model's activations are 16 times GPT-2's per sample: start lower.
            start = args.micro_batch if family == "gpt2" else max(1, args.micro_batch // 4)
            if "ztrain" in runs:
                record("ztrain", largest(lambda mb: run_ztrain(args, work, model, mb,
                                                               stage=2 if family == "llama"
                                                               else 0),
                                         start, args.exact_batch))
                if family == "llama":
                    record("ztrain_offload", largest(
                        lambda mb: run_ztrain(args, work, model, mb, stage=2, offload=True),
                        start))
            if "llmc" in runs and family == "gpt2":
                record("llmc", largest(lambda mb: run_llmc(args, data, mb), start,
                                       args.exact_batch))
            # PyTorch last: it runs in this process, with no --timeout of its own, so a
            # torch.compile that hangs leaves the runs before it recorded.
            for r, compiled in (("torch_eager", False), ("torch_compile", True)):
                if r in runs and not (family == "llama" and compiled):
                    record(r, largest(lambda mb: run_torch(args, torch, family, model, mb,
                                                           compiled), start)
                           if torch else {"error": f"PyTorch: {torch_error}", "micro_batch": 0})
            print(f"{family} ({params / 1e6:.0f}M parameters) on {device}, MFU against "
                  f"{peak_name} {peak / 1e12:.0f} TFLOPS dense bf16:")
            for r, v in out.items():
                if isinstance(v, dict):
                    if "error" in v:
                        print(f"  {r:15s} failed: {v['error']}")
                    else:
                        mfu = f"{100 * v['mfu']:.1f}%" if v.get("mfu") else "-"
                        print(f"  {r:15s} {v['tokens_per_s']:12,.0f} tokens/s  MFU {mfu:>6s}  "
                              f"micro-batch {v['micro_batch']:3d}  peak memory "
                              f"{v.get('peak_memory', 0) / 2**30:.1f} GiB")
                elif r.startswith("ratio"):
                    print(f"  {r}: {v:.2f}")
    # A run that gave no figure fails the benchmark (and the phase of scripts/gpu-check.sh that
    # ran it), naming it; the others' figures are in --out all the same.
    failed = [f"{family} {r}" for family, out in res.items() if isinstance(out, dict)
              for r, v in out.items() if isinstance(v, dict) and "error" in v]
    if failed:
        print(f"bench_gpu: no figure from {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
