"""bench/perf_model.py (issue 28, item 6) against formulas it does not use, and bench/README.md
against the script.

- The FLOPs of its kernels, summed over a step, equal the standard count worked out here from
  the dimensions: the matrix multiplies 6·N·tokens, N counting every weight matrix a token is
  multiplied by (GPT-2: 12·C² a block and the tied LM head V·C; Llama: q, k, v, o, gate, up,
  down and the untied head), and causal attention 6·L·C·T·tokens (QKᵀ and PV, 2·T·C each per
  token and layer, halved by the mask, the backward twice the forward); the parameter counts
  equal GPT-2 124M's published 124,475,904 (padded vocabulary) and TinyLlama's 1,100,048,384.
- MFU, tokens/s and step time agree with each other and with the peaks the issue states (989
  TFLOP/s both; 3.35 and 4.8 TB/s); the H200 is never slower than the H100, and a
  compute-bound kernel takes the same time on both.
- Each GEMM's FLOPs are 2·M·K·N a call and its bytes at least its operands once in 16 bits,
  and every kernel's time is its roofline at the stated fractions, so no kernel is predicted
  faster than its arithmetic or its memory allows; every kernel's op is an entry of ops.h.
- bench/README.md's generated section is the script's output (`--check`), and the script fills
  the measured column from a profile in the shape `ztrain run --profile` writes, matched by
  model, batch and device."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("ZTRAIN_SOURCE", os.path.join(HERE, "..", ".."))
SCRIPT = os.path.join(SOURCE, "bench", "perf_model.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import perf_model  # noqa: E402

failed = 0


def check(ok, what):
    global failed
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    failed += 0 if ok else 1


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


# The standard count, from the dimensions alone.
GPT2 = dict(L=12, C=768, H=12, V=50304, T=1024, B=16)
LLAMA = dict(L=22, C=2048, H=32, KV=4, F=5632, V=32000, T=2048, B=8)


def gpt2_matmul_params(L, C, V, **_):
    return L * 12 * C * C + V * C


def llama_matmul_params(L, C, H, KV, F, V, **_):
    kv = C // H * KV
    return L * (C * C + 2 * C * kv + C * C + 3 * C * F) + V * C


for name, dims, n_matmul, n_all in (
        ("GPT-2 124M", GPT2, gpt2_matmul_params(**GPT2), 124475904),
        ("Llama 1.1B", LLAMA, llama_matmul_params(**LLAMA), 1100048384)):
    m = next(x for x in perf_model.MODELS if x["L"] == dims["L"] and x["C"] == dims["C"])
    check(all(m[k] == v for k, v in dims.items()),
          f"{name}: the script's dimensions {dict((k, m[k]) for k in dims)} are {dims}")
    r = perf_model.predict(m)
    tokens = dims["B"] * dims["T"]
    check(r["params"] == n_all, f"{name}: {r['params']:,} parameters, published {n_all:,}")
    gemm = sum(k["flops"] for k in r["kernels"] if k["class"] == "gemm")
    attn = sum(k["flops"] for k in r["kernels"] if k["class"] == "attention")
    want_gemm = 6 * n_matmul * tokens
    want_attn = 6 * dims["L"] * dims["C"] * dims["T"] * tokens
    check(gemm == want_gemm, f"{name}: matrix-multiply FLOPs {gemm:,} = 6·N·tokens {want_gemm:,}")
    check(attn == want_attn, f"{name}: attention FLOPs {attn:,} = 6·L·C·T·tokens {want_attn:,}")
    check(r["model_flops"] == want_gemm + want_attn,
          f"{name}: the step's model FLOPs {r['model_flops']:,} are their sum")
    # Forward GEMMs are a third of the GEMM FLOPs (backward: dinp and dW, one forward's each).
    fwd = sum(k["flops"] for k in r["kernels"]
              if k["op"] in ("linear_forward", "linear_gelu_forward"))
    check(3 * fwd == gemm, f"{name}: forward {fwd:,} is a third of the linear FLOPs")
    for dev, peak, bw in (("H100 SXM", 989e12, 3.35e12), ("H200", 989e12, 4.8e12)):
        check(perf_model.DEVICES[dev] == {"flops": peak, "bw": bw},
              f"{dev}: peaks {perf_model.DEVICES[dev]}")
        d = r["devices"][dev]
        step = sum(k["ms"][dev] for k in r["kernels"])
        check(close(d["step_ms"], step), f"{name} on {dev}: the step is its kernels' sum")
        check(close(d["tokens_per_s"], tokens / (step / 1e3)) and
              close(d["mfu"], (want_gemm + want_attn) / (step / 1e3) / peak),
              f"{name} on {dev}: {d['tokens_per_s']:,.0f} tokens/s, MFU {d['mfu']:.3f} from "
              f"the step time {step:.3f} ms")
        for k in r["kernels"]:
            f = perf_model.FRACTIONS[k["class"]]
            floor = max(k["flops"] / (peak * f) if k["class"] != "memory" else 0,
                        k["bytes"] / (bw * perf_model.FRACTIONS["memory"]))
            if not close(k["ms"][dev], 1e3 * floor):
                check(False, f"{name} on {dev}: {k['kernel']} {k['ms'][dev]} ms is not its "
                      f"roofline {1e3 * floor} ms")
    for k in r["kernels"]:
        if k["ms"]["H200"] > k["ms"]["H100 SXM"] * (1 + 1e-12):
            check(False, f"{name}: {k['kernel']} is slower on the H200")
        if k["bound"]["H100 SXM"] == "compute" and not close(k["ms"]["H200"],
                                                              k["ms"]["H100 SXM"]):
            check(False, f"{name}: compute-bound {k['kernel']} differs between the GPUs")
        if k["class"] == "gemm":
            M, K, N = k["shape"]
            check(k["flops"] == 2 * M * K * N * k["calls"] and
                  k["bytes"] >= 2 * (M * K + K * N + M * N) * k["calls"],
                  f"{name}: {k['kernel']} ({M}×{K}·{K}×{N}, {k['calls']} calls): "
                  f"{k['flops']:,} FLOPs, {k['bytes']:,} bytes, at least its operands once")
    with open(os.path.join(SOURCE, "kernels", "include", "ztrain", "ops.h")) as f:
        ops_h = f.read()
    ops = sorted({k["op"] for k in r["kernels"]})
    check(all(f"(*{op})(" in ops_h for op in ops),
          f"{name}: every kernel's op is an entry of ops.h ({ops})")

p = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True)
check(p.returncode == 0, f"bench/README.md's section is perf_model.py's output: {p.stderr.strip()}")

# The measured column: a profile as `ztrain run --profile` writes it, on an "H200".
with tempfile.TemporaryDirectory() as d:
    prof = {"format": "ztrain-op-profile", "version": 1, "device": "cuda",
            "device_name": "NVIDIA H200", "clock": "cudaEvent", "model_type": "gpt2",
            "n_layer": 12, "n_embd": 768, "micro_batch": 16, "seq_len": 1024,
            "mean": {"steps": 3, "step_ms": 50.5, "ops_ms": 40.0,
                     "ops": {"linear_backward": {"calls": 49, "ms": 23.456, "share": 0.46},
                             "to_half": {"calls": 98, "ms": 3.25, "share": 0.06}}}}
    with open(os.path.join(d, "2026-12-05-h200-profile-gpt2.json"), "w") as f:
        json.dump(prof, f)
    emulated = dict(prof, device_name="NVIDIA H100 80GB HBM3 (ztrain emulated device)")
    with open(os.path.join(d, "emu-profile-gpt2.json"), "w") as f:
        json.dump(emulated, f)
    other = dict(prof, n_layer=2)
    with open(os.path.join(d, "small-profile-gpt2.json"), "w") as f:
        json.dump(other, f)
    p = subprocess.run([sys.executable, SCRIPT, "--gpu-dir", d], capture_output=True, text=True)
    gpt2 = p.stdout.split("#### Llama")[0]
    row = [line for line in gpt2.splitlines() if line.startswith("| `linear_backward` |")]
    check(len(row) == 1 and row[0].rstrip(" |").endswith("23.456") and "| — |" in row[0],
          f"the H200 profile fills its column, the H100's stays empty: {row}")
    check("2026-12-05-h200-profile-gpt2.json" in gpt2 and "small-profile" not in p.stdout and
          "emu-profile" not in p.stdout,
          "the measured table names its file; a profile of another shape, or of the emulated "
          "device, is not used")
    row = [line for line in gpt2.splitlines() if line.startswith("| `to_half`")]
    check(len(row) == 1 and "no kernel in the model" in row[0] and
          row[0].rstrip(" |").endswith("3.250"),
          f"an op measured but not in the model gets a row of its own: {row}")
    llama = p.stdout.split("#### Llama")[1]
    check("Measured: not yet" in llama, "the Llama's column stays empty")

print("test_perf_model:", "FAILED" if failed else "ok")
sys.exit(1 if failed else 0)
