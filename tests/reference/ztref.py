"""Shared pieces of the PyTorch reference tests: locating the build, a safetensors reader and
writer written from the format description, and a GPT-2 in plain PyTorch (Hugging Face names and
Conv1D layouts) that ztrain is compared against."""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

BUILD = os.environ.get("ZTRAIN_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
SOURCE = os.environ.get("ZTRAIN_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))


def tool(name):
    return os.path.join(BUILD, name)


def run(args, check=True, **kw):
    """Runs a program, returning the CompletedProcess; on unexpected failure prints its output."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"FAIL: {args[0]} exited with {p.returncode}")
    return p


# ---- safetensors -----------------------------------------------------------------------------

_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
           "F64": (torch.float64, 8), "I32": (torch.int32, 4), "I64": (torch.int64, 8)}


def st_write(path, tensors, metadata=None):
    """tensors: dict name -> torch tensor (written in insertion order)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        code = next(k for k, (dt, _) in _DTYPES.items() if dt == t.dtype)
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_read(path):
    """Returns (dict name -> torch tensor, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        dtype, size = _DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + e])
        t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out, meta


# ---- GPT-2 ----------------------------------------------------------------------------------

def gpt2_shapes(L, C, V, T):
    s = {"wte.weight": (V, C), "wpe.weight": (T, C)}
    for l in range(L):
        p = f"h.{l}."
        s.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
                  p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
                  p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                  p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                  p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
                  p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
    s.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    return s


def gpt2_random_params(L, C, V, T, seed=0):
    """Random weights with non-trivial norms and biases, so every gradient path is exercised."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in gpt2_shapes(L, C, V, T).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.02 * torch.randn(shape, generator=g)
        else:
            t = 0.05 * torch.randn(shape, generator=g)
        params[name] = t.float()
    return params


def gpt2_forward(params, idx, n_layer, n_head):
    """Logits [B,T,V] of the GPT-2 defined by `params` (HF names) on token ids idx [B,T]."""
    wte, wpe = params["wte.weight"], params["wpe.weight"]
    B, T = idx.shape
    C = wte.shape[1]
    hs = C // n_head
    x = wte[idx] + wpe[:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(n_layer):
        p = lambda n: params[f"h.{l}.{n}"]
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), 1e-5)
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), 1e-5)
        h = F.gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), params["ln_f.weight"], params["ln_f.bias"], 1e-5)
    return x @ wte.t()


def rel_err(a, b):
    """Norm-wise relative error ||a-b|| / ||b||."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def worst_loss_err(ref, got):
    """The largest relative difference of two equally long loss series (1.0 when their lengths
    differ or they are empty)."""
    if len(got) != len(ref) or not got:
        return 1.0
    return max(abs(a - b) / abs(b) for a, b in zip(got, ref))


def check_losses(ck, what, ref, got, tol, steps):
    """Checks that `got` holds `steps` losses, each within relative tol of ref's."""
    worst = worst_loss_err(ref, got)
    ck.check(len(got) == steps and worst <= tol,
             f"{what}: {len(got)} losses, worst rel err {worst:.1e} (tolerance {tol:.0e})")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checker import Checker  # noqa: E402,F401  (the tests' one check)


# ---- data and jobs --------------------------------------------------------------------------

def write_llmc_tokens(path, tokens):
    """An llm.c token file: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def read_masked_shard(prefix):
    """The tokens of prefix.bin (uint16 under llm.c's magic 20240520, else uint32) and the mask
    bytes of prefix.bin.mask, as `ztrain prepare --format chat|prompt-completion` writes them."""
    data = open(prefix + ".bin", "rb").read()
    magic, _, n = struct.unpack("<3i", data[:12])
    fmt = "H" if magic == 20240520 else "I"
    ids = list(struct.unpack(f"<{n}{fmt}", data[1024:1024 + n * struct.calcsize(fmt)]))
    return ids, list(open(prefix + ".bin.mask", "rb").read()[1024:])


def prepare_chat(d, rows, config):
    """`ztrain prepare --format chat` of rows (JSONL objects) with d/tokenizer.json and config
    written as d/tokenizer_config.json: (the finished process, (ids, mask bytes) of its train
    shard or None when it failed)."""
    json.dump(config, open(f"{d}/tokenizer_config.json", "w"))
    with open(f"{d}/chat.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    out = tempfile.mkdtemp(dir=d)
    p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json", "--out",
                        out, "--format", "chat", f"{d}/chat.jsonl"],
                       capture_output=True, text=True)
    return p, (read_masked_shard(f"{out}/data_train_000000") if p.returncode == 0 else None)


def write_job(path, job):
    with open(path, "w") as f:
        json.dump(job, f, indent=1)


def model_check_logits(d, init_from, inputs, tail=None):
    """zt_model_check's float32 logits, flat, of a job in directory d whose model section is
    only init_from (a path relative to d) and block_size, on inputs (batch x block, int32):
    (logits, "") or (None, its stderr stripped, the last `tail` characters when given)."""
    import numpy as np
    batch, block = inputs.shape
    write_job(f"{d}/check.json", {"model": {"init_from": init_from, "block_size": block},
                                  "data": {"train": "unused.bin"},
                                  "deepspeed": {"train_micro_batch_size_per_gpu": batch}})
    with open(f"{d}/batch.i32", "wb") as f:
        f.write(inputs.numpy().tobytes() * 2)
    out = tempfile.mkdtemp(dir=d)
    p = run([tool("zt_model_check"), f"{d}/check.json", f"{d}/batch.i32", out, batch, block],
            check=False)
    if p.returncode != 0:
        err = p.stderr.strip()
        return None, err[-tail:] if tail else err
    return torch.from_numpy(np.fromfile(f"{out}/logits.f32", dtype="float32")), ""


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def first_loss_from_hf(d, hf_dir, tokens, B, T):
    """One ztrain step (lr 0) on a model initialised from the Hugging Face directory d/hf_dir,
    over tokens (a list, written to d/train.bin; the checkpoint goes to d/ckpt): (the step's
    train/loss or NaN, the completed process)."""
    write_llmc_tokens(f"{d}/train.bin", tokens)
    write_job(f"{d}/job.json", {
        "model": {"init_from": hf_dir, "block_size": T},
        "data": {"train": "train.bin", "shuffle": False},
        "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0, "checkpoint_dir": "ckpt"},
        "deepspeed": {"train_micro_batch_size_per_gpu": B,
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.0,
                                                                "weight_decay": 0.0}}}})
    p = run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"], check=False)
    m = read_metrics(f"{d}/run/metrics.jsonl") if p.returncode == 0 else []
    return (m[0]["train/loss"] if m else float("nan")), p


def warmup_decay_lr(n, min_lr, max_lr, warmup, total, linear):
    """The lr DeepSpeed's WarmupDecayLR gives the n-th optimizer update (n from 1): the value set
    at construction (min_lr) for the first, then f(k) with k = n - 2 after each scheduler step."""
    k = n - 2
    if k < 0:
        return min_lr
    N = max(2, warmup)
    if k < N:
        gamma = k / N if linear else math.log(k + 1) / math.log(N)
    else:
        gamma = max(0.0, (total - k) / max(1.0, total - N))
    return min_lr + (max_lr - min_lr) * gamma


# ---- Unicode ----------------------------------------------------------------------------------

# Planes 4-13 are unassigned and 15-16 private use: no code point there has a case mapping, is
# cased or case-ignorable, or is printable, so a sample of them stands for the rest.
UNIFORM_PLANES = frozenset(range(4, 14)) | {15, 16}


def code_points(stride=97):
    """The code points a test over "every code point" takes: all but U+0000 (a JSON string in
    cJSON cannot hold it) and the surrogates (not UTF-8), except that of UNIFORM_PLANES only one
    in `stride` and each plane's last two. Stops the test if this Python's unicodedata assigns
    anything there (a newer Unicode), which would need each of them checked again."""
    import unicodedata
    odd = next((c for c in range(0x40000, 0x110000) if c >> 16 in UNIFORM_PLANES
                and unicodedata.category(chr(c)) not in ("Cn", "Co")), None)
    if odd is not None:
        raise SystemExit(f"FAIL: U+{odd:04X} is {unicodedata.category(chr(odd))} in Unicode "
                         f"{unicodedata.unidata_version}: planes {sorted(UNIFORM_PLANES)} are no "
                         "longer uniform, so code_points() must take all of them")
    return [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF and
            (c >> 16 not in UNIFORM_PLANES or c % stride == 0 or c & 0xFFFF >= 0xFFFE)]


# ---- CPU kernels ------------------------------------------------------------------------------

def cpu_paths():
    """The SIMD paths the CPU kernels can take on this machine, as kernels/cpu/isa.c decides them
    ("avx2" needs AVX2, FMA and F16C; "avx512" also AVX-512 F and BW), narrowest first. Tests force
    each one with ZTRAIN_CAST_ISA / ZTRAIN_OPTIM_ISA."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    paths = ["portable"]
    if {"avx2", "fma", "f16c"} <= flags:
        paths.append("avx2")
        if {"avx512f", "avx512bw"} <= flags:
            paths.append("avx512")
    return paths
