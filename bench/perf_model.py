"""The performance model of a training step on one GPU (issue 28, item 6): from the model's
dimensions, each kernel's FLOPs and bytes moved, the time it should take on an H100 SXM and an
H200 at stated fractions of their peaks, the predicted step time, tokens/s and MFU; and, where a
GPU run of scripts/gpu-check.sh has left an op profile in bench/gpu/, the measured time of each op
beside its prediction.

    python3 bench/perf_model.py                  the tables, as Markdown
    python3 bench/perf_model.py --write          puts them into bench/README.md's section
    python3 bench/perf_model.py --check          exit 1 when bench/README.md's section differs
    python3 bench/perf_model.py --json           the figures as JSON

The kernels are the op table's (kernels/include/ztrain/ops.h), one row per distinct shape, each
as the CUDA backend runs it today: cuBLASLt GEMMs in bf16 with fp32 accumulation, bias and
residual in their epilogues; flash attention (no T×T matrix: Q, K, V, O and dO read once, the
row statistics kept); one pass over memory for every element-wise, norm and optimizer kernel,
16-bit activations, fp32 norm statistics, masters and Adam moments, 16-bit gradients (the
weight-gradient GEMMs read and write them, beta = 1; every other op adds into them once); a
linear layer's bias gradient in its weight-gradient GEMM's epilogue (cuBLASLt's BGRADA / BGRADB,
written in fp32 and added into the gradient by a small kernel: those bytes are the GEMM row's);
the norms' weight gradients in their backward kernel (per-tile partials that a second pass adds
up). Whether a GPU's cuBLASLt has an algorithm for the bias epilogue at these shapes is
unverified (the emulated device proves the numbers only); where it has none the backend takes
the row-tile sums instead, a pass of its own over dout that this model does not count, and
`scripts/gpu-check.sh` tells which (its bias_grad_choice figure). Rows marked EXTRA would be work
the code does that issue 28's design would not; there are none left, and the step without them
is printed too. (Every op reads the 16-bit parameters, so a step fills no fp32 working copy of
them: docs/gpu.md.) A kernel's time is the larger of its FLOPs at a fraction of the dense bf16
peak and its bytes at a fraction of the memory bandwidth (a roofline with stated efficiencies),
and the step is their sum (one stream, nothing overlapped). FLOPs are model FLOPs (a
multiply-add is 2): causal attention counts the half of QKᵀ and PV that the mask keeps, and a
flash backward's recomputation of the scores is not counted (its cost is in the attention
efficiency). MFU is those FLOPs per second over the dense bf16 peak: 6·N·tokens +
6·L·C·T·tokens, N being the weights that multiply activations (every block matrix and the LM
head; not the lookups, norms and biases), which is what tests/reference/test_perf_model.py
checks the kernel sums against."""
import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "README.md")
BEGIN = "<!-- perf_model.py: generated from here; edit the script, then run it with --write -->"
END = "<!-- perf_model.py: generated up to here -->"

# Dense bf16 tensor-core peaks and HBM bandwidths (NVIDIA's data sheets; performance.md §5.1).
DEVICES = {"H100 SXM": {"flops": 989e12, "bw": 3.35e12},
           "H200": {"flops": 989e12, "bw": 4.8e12}}
# The fractions of peak a kernel of each class is assumed to reach: what cuBLASLt reaches on
# these shapes, what cuDNN's and FlashAttention-2's published H100 figures give for head_dim 64
# forward and backward together, and what a well-vectorised streaming kernel gets of HBM.
FRACTIONS = {"gemm": 0.70, "attention": 0.40, "memory": 0.75}

GPT2 = {"name": "GPT-2 124M", "type": "gpt2", "L": 12, "C": 768, "H": 12, "KV": 12, "F": 3072,
        "V": 50304, "T": 1024, "B": 16, "tied": True}
# Llama 1B class: TinyLlama 1.1B's shape, the model bench/bench_gpu.py trains.
LLAMA = {"name": "Llama 1.1B (TinyLlama)", "type": "llama", "L": 22, "C": 2048, "H": 32, "KV": 4,
         "F": 5632, "V": 32000, "T": 2048, "B": 8, "tied": False}
MODELS = [GPT2, LLAMA]

# The host's time to issue one call of each kind, in microseconds: assumed, not measured (typical
# of cudaLaunchKernel on current drivers and fast CPUs; cublasLtMatmul does host work of its own
# besides its launch; recording an event or a stream's wait for one is cheaper than a launch).
# What a step issues is counted on the emulated device (bench/launch_count.py).
HOST_US = {"kernel": 3.0, "matmul": 6.0, "copy": 3.0, "memset": 3.0, "event record": 1.5,
           "stream wait": 1.5, "nccl": 6.0}
EMU = os.path.join(HERE, "emu")

A16, S32, P32 = 2, 4, 4  # bytes: a 16-bit activation or gradient; an fp32 statistic; fp32 state

# kernels/cuda/channel_sums.cuh: rows per tile, at least 64 and at most 1024 tiles; a norm's
# fused backward takes tiles of at least 32 rows (zt_channel_fused_tile_rows).
CHANNEL_MAX_TILES, FUSED_MIN_ROWS = 1024, 32


def channel_tiles(N, min_rows):
    """Row tiles of N rows: rows per tile ceil(N / 1024), at least min_rows."""
    rows = max(min_rows, -(-N // CHANNEL_MAX_TILES))
    return -(-N // rows)


def gemm(name, op, calls, M, K, N, extra_bytes=0):
    """One GEMM of M×K by K×N in bf16, read once and written once."""
    return {"kernel": name, "op": op, "calls": calls, "flops": 2 * M * K * N,
            "bytes": A16 * (M * K + K * N + M * N) + extra_bytes, "class": "gemm",
            "shape": (M, K, N)}


def stream(name, op, calls, flops, nbytes, extra=False):
    return {"kernel": name, "op": op, "calls": calls, "flops": flops, "bytes": nbytes,
            "class": "memory", "extra": extra}


def linear(kernels, name, L, N, C, OC, bias, residual, gelu_out=False, gelu_in=False):
    """A linear layer's forward (one GEMM, bias and residual in the epilogue) and backward: dinp =
    dout·Wᵀ, dW = inpᵀ·dout accumulated into the 16-bit gradient (read and written, beta = 1),
    dbias from the dW GEMM's epilogue (BGRADA / BGRADB: dout is read once, the fp32 bias
    gradient written, then read again and added into the 16-bit gradient, which is read and
    written: kernels/cuda/linear.cu), counted in the dW GEMM's row.
    gelu_out: GELU in the forward's epilogue (linear_gelu_forward), which writes the
    pre-activation beside the output. gelu_in: the input is gelu(pre), so the backward's dinp
    GEMM applies GELU's derivative in its epilogue (linear_backward_gelu), reading pre."""
    ep = (A16 * OC if bias else 0) + (A16 * N * OC if residual else 0)
    ep += A16 * N * OC if gelu_out else 0
    kernels.append(gemm(f"{name} forward", "linear_gelu_forward" if gelu_out else "linear_forward",
                        L, N, C, OC, ep))
    bwd = "linear_backward_gelu" if gelu_in else "linear_backward"
    kernels.append(gemm(f"{name} backward dinp", bwd, L, N, OC, C, A16 * N * C if gelu_in else 0))
    dbias = (S32 + S32 + 2 * A16) * OC if bias else 0
    kernels.append(gemm(f"{name} backward dW" + (" + bias gradient (epilogue)" if bias else ""),
                        bwd, L, C, N, OC, A16 * C * OC + dbias))


def attention(kernels, L, B, T, H, KV, hd):
    """Flash attention, causal: forward QKᵀ and PV over the kept half (2 GEMMs of T×hd×T per
    head, halved), backward twice that (dV, dP, dQ, dK)."""
    N = B * T
    fwd = 2 * 2 * B * H * T * T * hd // 2
    qkv = A16 * N * (H + 2 * KV) * hd
    stats = S32 * B * H * T
    kernels.append({"kernel": "attention forward (flash)", "op": "attention_forward", "calls": L,
                    "flops": fwd, "bytes": qkv + A16 * N * H * hd + stats, "class": "attention"})
    kernels.append({"kernel": "attention backward (flash)", "op": "attention_backward",
                    "calls": L, "flops": 2 * fwd,
                    "bytes": 2 * qkv + 2 * A16 * N * H * hd + stats, "class": "attention"})


def kernels_of(m):
    """Every kernel of one training step (one micro-batch of B×T, one optimizer step)."""
    L, C, H, KV, F, V, T, B = (m[k] for k in ("L", "C", "H", "KV", "F", "V", "T", "B"))
    hd, N = C // H, B * T
    ks = []
    gpt2 = m["type"] == "gpt2"
    # Embedding: gather rows (and GPT-2's positions) into the residual stream; the backward adds
    # the gradient rows into dwte (16-bit gradients, read and written) and dwpe.
    pos = A16 * T * C if gpt2 else 0
    ks.append(stream("embedding forward", "embedding_forward", 1, N * C if gpt2 else 0,
                     A16 * N * C * 2 + pos))
    ks.append(stream("embedding backward", "embedding_backward", 1, N * C * (2 if gpt2 else 1),
                     A16 * N * C + 2 * A16 * N * C + (2 * A16 * T * C if gpt2 else 0)))
    norm = "layernorm" if gpt2 else "rmsnorm"
    nstats = 2 if gpt2 else 1
    # A norm reads its input and writes its output and statistics. The backward (one kernel
    # over row tiles) reads dout, the input, the statistics and the residual gradient it adds
    # into, and writes that back; with each row at hand it adds the weight's (and LayerNorm's
    # bias's) terms per channel and writes one partial row of each per tile, which a second pass
    # reads back and adds into the 16-bit gradients (read and written).
    for where, calls in (("blocks", 2 * L), ("final", 1)):
        ks.append(stream(f"{norm} forward ({where})", f"{norm}_forward", calls, 7 * N * C,
                         2 * A16 * N * C + nstats * S32 * N))
        tiles = channel_tiles(N, FUSED_MIN_ROWS)
        ks.append(stream(f"{norm} backward ({where}, weight gradients fused)",
                         f"{norm}_backward", calls, 12 * N * C + 2 * nstats * N * C,
                         4 * A16 * N * C + nstats * S32 * N + 2 * nstats * tiles * C * S32 +
                         2 * nstats * C * A16))
    qkv = (H + 2 * KV) * hd
    linear(ks, "qkv", L, N, C, qkv, gpt2, False)
    linear(ks, "attention out", L, N, C, C, gpt2, True)
    if gpt2:
        # GELU lives in the GEMMs' epilogues (cuBLASLt's GELU_AUX_BIAS and DGELU): no kernel
        # of its own, and its few FLOPs per element are not counted.
        linear(ks, "mlp up (fc) + GELU", L, N, C, F, True, False, gelu_out=True)
        linear(ks, "mlp down (proj)", L, N, F, C, True, True, gelu_in=True)
    else:
        linear(ks, "mlp gate", L, N, C, F, False, False)
        linear(ks, "mlp up", L, N, C, F, False, False)
        linear(ks, "mlp down", L, N, F, C, False, True)
        # q and k rotated in place, one call each per layer, forward and backward.
        for what, heads in (("q", H), ("k", KV)):
            ks.append(stream(f"rope forward ({what})", "rope_forward", L, 6 * N * heads * hd // 2,
                             2 * A16 * N * heads * hd))
            ks.append(stream(f"rope backward ({what})", "rope_backward", L,
                             6 * N * heads * hd // 2, 2 * A16 * N * heads * hd))
        ks.append(stream("silu·mul forward", "silu_mul_forward", L, 6 * N * F, 3 * A16 * N * F))
        ks.append(stream("silu·mul backward", "silu_mul_backward", L, 12 * N * F,
                         5 * A16 * N * F))
    attention(ks, L, B, T, H, KV, hd)
    linear(ks, "lm head", 1, N, C, V, False, False)
    # The classifier fused with its loss: reads the logits, writes their gradient in place.
    ks.append(stream("softmax cross-entropy (fused)", "softmax_xent", 1, 5 * N * V,
                     2 * A16 * N * V))
    n = params(m)
    # ZeRO's mixed precision at stages 0-1: the ops accumulate into the 16-bit gradients
    # (backend.h, writes_grad16), so no fp32 gradient is zero-filled or added in.
    # Clipping's norm reads the 16-bit gradients; mixed-precision AdamW reads the gradient, the
    # fp32 master and moments and writes them and the 16-bit copy: 28 bytes a parameter.
    ks.append(stream("gradient norm", "sum_squares_half", 1, 2 * n, A16 * n))
    ks.append(stream("AdamW, mixed precision", "adam_update_mixed", 1, 14 * n,
                     n * (2 * A16 + 6 * P32)))
    return ks


def params(m):
    """All parameters, as the model holds them."""
    L, C, H, KV, F, V, T = (m[k] for k in ("L", "C", "H", "KV", "F", "V", "T"))
    kv = C // H * KV
    if m["type"] == "gpt2":
        return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return (1 if m["tied"] else 2) * V * C + L * (2 * C * C + 2 * C * kv + 3 * C * F + 2 * C) + C


def matmul_params(m):
    """The weights that multiply activations: what 6·N counts."""
    L, C, H, KV, F, V = (m[k] for k in ("L", "C", "H", "KV", "F", "V"))
    kv = C // H * KV
    if m["type"] == "gpt2":
        return L * (3 * C * C + C * C + 2 * C * F) + V * C
    return L * (C * C + 2 * C * kv + C * C + 3 * C * F) + V * C


def predict(m, fractions=FRACTIONS):
    ks = kernels_of(m)
    tokens = m["B"] * m["T"]
    out = {"model": m, "params": params(m), "tokens": tokens, "kernels": [], "devices": {}}
    for k in ks:
        row = dict(k)
        row["flops"] *= k["calls"]
        row["bytes"] *= k["calls"]
        row["ms"], row["bound"] = {}, {}
        for dev, d in DEVICES.items():
            f = fractions["memory" if k["class"] == "memory" else k["class"]]
            t_flops = row["flops"] / (d["flops"] * f) if k["class"] != "memory" else 0.0
            t_bytes = row["bytes"] / (d["bw"] * fractions["memory"])
            row["ms"][dev] = 1e3 * max(t_flops, t_bytes)
            row["bound"][dev] = "compute" if t_flops >= t_bytes else "memory"
        out["kernels"].append(row)
    model_flops = sum(r["flops"] for r in out["kernels"] if r["class"] != "memory")
    out["model_flops"] = model_flops
    for dev, d in DEVICES.items():
        step = sum(r["ms"][dev] for r in out["kernels"])
        design = sum(r["ms"][dev] for r in out["kernels"] if not r.get("extra"))
        out["devices"][dev] = {"step_ms": step, "tokens_per_s": tokens / (step / 1e3),
                               "mfu": model_flops / (step / 1e3) / d["flops"],
                               "design_step_ms": design,
                               "design_tokens_per_s": tokens / (design / 1e3)}
    return out


def host_issue(m, directory=EMU):
    """The calls one step issues (bench/emu/launches-<type>.json, counted on the emulated device)
    and the host's time to issue them, or None where they have not been counted."""
    path = os.path.join(directory, f"launches-{m['type']}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        counted = json.load(f)
    ms = sum(HOST_US[c] * n for c, n in counted["classes"].items()) / 1e3
    return {"counted": counted, "path": os.path.relpath(path, os.path.dirname(HERE)), "ms": ms}


# ---- measured: the op profiles gpu-check.sh saved in bench/gpu/ -----------------------------

def measured_profiles(model, directory):
    """{device label: (file, {op: ms per step})} from bench/gpu/*profile*.json of this model."""
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, "*profile*.json"))):
        try:
            with open(path) as f:
                p = json.load(f)
        except (OSError, ValueError):
            continue
        if p.get("format") != "ztrain-op-profile" or p.get("device") != "cuda":
            continue
        if (p.get("model_type"), p.get("n_layer"), p.get("n_embd"), p.get("micro_batch"),
                p.get("seq_len")) != (model["type"], model["L"], model["C"], model["B"],
                                      model["T"]):
            continue
        # The emulated device names itself after an H100 but proves numbers, not speed.
        name = p.get("device_name", "")
        if "emulated" in name:
            continue
        dev = "H200" if "H200" in name else "H100 SXM" if "H100" in name else None
        if dev:
            ops = {op: v["ms"] for op, v in p.get("mean", {}).get("ops", {}).items()}
            root = os.path.dirname(HERE)
            shown = (os.path.relpath(path, root) if os.path.abspath(path).startswith(root + os.sep)
                     else path)
            found[dev] = (shown, ops, p.get("mean", {}).get("step_ms"))
    return found


# ---- output ----------------------------------------------------------------------------------

def fmt(x, digits=3):
    return f"{x:,.{digits}f}"


def markdown(directory):
    lines = ["Peaks: H100 SXM 989 TFLOP/s dense bf16, 3.35 TB/s HBM3; H200 989 TFLOP/s, "
             "4.8 TB/s HBM3e. Efficiencies assumed: GEMMs "
             f"{FRACTIONS['gemm']:.0%} of the bf16 peak, flash attention "
             f"{FRACTIONS['attention']:.0%}, memory-bound kernels {FRACTIONS['memory']:.0%} of "
             "the bandwidth.", "",
             "The linear layers' bias gradients are predicted in their weight-gradient GEMMs' "
             "epilogue (cuBLASLt's BGRADA / BGRADB). That a GPU's cuBLASLt has an algorithm for "
             "it at these shapes is unverified: where it has none, the backend takes the "
             "row-tile sums instead (a pass over dout of its own, not in these tables), and "
             "`scripts/gpu-check.sh` says which ran (its `bias_grad_choice` figure).", ""]
    for m in MODELS:
        r = predict(m)
        extra = (f", {m['KV']} key/value heads, SwiGLU {m['F']}, untied head" if m["type"] ==
                 "llama" else f", MLP {m['F']}, head tied to the embedding")
        lines += [f"#### {m['name']}: {m['L']} layers, width {m['C']}, {m['H']} heads{extra}, "
                  f"vocabulary {m['V']:,}, B={m['B']}, T={m['T']:,}, bf16",
                  "",
                  f"{r['params']:,} parameters ({matmul_params(m):,} in matrices that multiply "
                  f"activations), {r['tokens']:,} tokens a step, "
                  f"{r['model_flops'] / 1e12:.2f} TFLOP of model FLOPs a step.",
                  "",
                  "| kernel | op | calls | GFLOP | GB moved | H100 ms | H200 ms | bound (H100) |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for k in r["kernels"]:
            mark = " (EXTRA)" if k.get("extra") else ""
            lines.append(f"| {k['kernel']}{mark} | `{k['op']}` | {k['calls']} | "
                         f"{fmt(k['flops'] / 1e9, 1)} | {fmt(k['bytes'] / 1e9, 3)} | "
                         f"{fmt(k['ms']['H100 SXM'])} | {fmt(k['ms']['H200'])} | "
                         f"{k['bound']['H100 SXM']} |")
        h100, h200 = r["devices"]["H100 SXM"], r["devices"]["H200"]
        lines += ["",
                  "| predicted | H100 SXM | H200 |", "|---|---:|---:|",
                  f"| step time | {fmt(h100['step_ms'], 2)} ms | {fmt(h200['step_ms'], 2)} ms |",
                  f"| tokens/s | {h100['tokens_per_s']:,.0f} | {h200['tokens_per_s']:,.0f} |",
                  f"| MFU | {h100['mfu']:.1%} | {h200['mfu']:.1%} |",
                  f"| without the EXTRA rows: step time | {fmt(h100['design_step_ms'], 2)} ms | "
                  f"{fmt(h200['design_step_ms'], 2)} ms |",
                  f"| without the EXTRA rows: tokens/s | {h100['design_tokens_per_s']:,.0f} | "
                  f"{h200['design_tokens_per_s']:,.0f} |", ""]
        # Predicted beside measured, per op (the profile's unit).
        meas = measured_profiles(m, directory)
        ops = []
        for k in r["kernels"]:
            if k["op"] not in ops:
                ops.append(k["op"])
        head = "| op | predicted H100 ms | predicted H200 ms |"
        rule = "|---|---:|---:|"
        for dev in DEVICES:
            head += f" measured {dev} ms |"
            rule += "---:|"
        lines += [head, rule]
        # Ops a GPU run called that the model has no kernel for (to_half: the products read the
        # 16-bit weights the optimizer writes, so a weight is rounded per GEMM only under
        # ZTRAIN_CUDA_WEIGHTS=round): measured, predicted as nothing.
        for dev in DEVICES:
            for op in meas.get(dev, (None, {}))[1]:
                if op not in ops:
                    ops.append(op)
        for op in ops:
            cells = [sum(k["ms"][dev] for k in r["kernels"] if k["op"] == op) for dev in DEVICES]
            planned = any(k["op"] == op for k in r["kernels"])
            row = (f"| `{op}` | {fmt(cells[0])} | {fmt(cells[1])} |" if planned else
                   f"| `{op}` (no kernel in the model) | — | — |")
            for dev in DEVICES:
                got = meas.get(dev, (None, {}))[1].get(op)
                row += f" {fmt(got) if got is not None else '—'} |"
            lines.append(row)
        steps = " |".join(
            f" {fmt(meas[dev][2], 2) if dev in meas and meas[dev][2] else '—'}" for dev in DEVICES)
        lines.append(f"| step (all ops and the rest) | {fmt(h100['step_ms'], 2)} | "
                     f"{fmt(h200['step_ms'], 2)} |{steps} |")
        sources = [f"{dev}: {meas[dev][0]}" for dev in DEVICES if dev in meas]
        lines += ["", "Measured: " + ("; ".join(sources) if sources else
                                      "not yet (no GPU run of `scripts/gpu-check.sh` has left "
                                      "an op profile of this model in bench/gpu/)") + ".", ""]
        lines += host_lines(m, h100["step_ms"], r["tokens"])
    return "\n".join(lines).rstrip("\n") + "\n"


def host_lines(m, device_ms, tokens):
    """What the host issues a step against the device's predicted step: whether CUDA graphs
    could pay."""
    h = host_issue(m)
    if h is None:
        return ["Host issue: not counted (run `python3 bench/launch_count.py --write`).", ""]
    c = h["counted"]
    rows = ["| calls a step (counted) | " + " | ".join(c["classes"]) + " | all |",
            "|---|" + "---:|" * (len(c["classes"]) + 1),
            "| count | " + " | ".join(f"{n:,}" for n in c["classes"].values()) +
            f" | {c['total']:,} |",
            "| host µs each (assumed) | " + " | ".join(f"{HOST_US[k]:g}" for k in c["classes"]) +
            " | |"]
    # Device time falls with the tokens a step, the calls do not: where they meet, the GPU
    # waits for the host, and a graph (one launch for the step) starts to pay.
    meet = tokens * h["ms"] / device_ms
    return ["Host issue (item 5, CUDA graphs): one step of one micro-batch issues "
            f"{c['total']:,} calls (counted on the emulated device at this depth and two narrow "
            f"widths, {c['totals'][0]:,} and {c['totals'][1]:,}; `{h['path']}`), about "
            f"{h['ms']:.2f} ms of host time at the assumed costs, {h['ms'] / device_ms:.0%} of "
            f"the predicted H100 step ({device_ms:.1f} ms). Taking the device's time as "
            "proportional to the tokens a step (it falls slower: the optimizer's part stays), "
            f"the host stays ahead of the GPU down to about {meet:,.0f} tokens a step; below "
            "that a CUDA graph of the step would pay, above it a graph saves host time the GPU "
            "never waits for. Predicted, not measured.", "", *rows, ""]


def readme_section(text):
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        return None
    return text[a + len(BEGIN):b].strip("\n") + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite bench/README.md's section")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when bench/README.md's section is not this output")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--gpu-dir", default=os.path.join(HERE, "gpu"),
                    help="where GPU runs' op profiles are (default bench/gpu)")
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps([predict(m) for m in MODELS], indent=1))
        return 0
    md = markdown(args.gpu_dir)
    if not (args.write or args.check):
        sys.stdout.write(md)
        return 0
    with open(README) as f:
        text = f.read()
    have = readme_section(text)
    if have is None:
        print(f"perf_model: {README} has no section between\n  {BEGIN}\n  {END}",
              file=sys.stderr)
        return 1
    if args.check:
        if have != md:
            print("perf_model: bench/README.md's performance model is not this script's output: "
                  "run python3 bench/perf_model.py --write", file=sys.stderr)
            return 1
        return 0
    a, b = text.find(BEGIN), text.find(END)
    with open(README, "w") as f:
        f.write(text[:a + len(BEGIN)] + "\n\n" + md + "\n" + text[b:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
