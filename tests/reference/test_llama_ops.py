#!/usr/bin/python3
"""The CPU backend's Llama-family ops against Hugging Face transformers' own code for them.

$ZTRAIN_BUILD/zt_llama_ops runs rmsnorm, rope, silu_mul and attention (forward, then backward from
a random dout) at fp32 over raw files. The references are transformers' LlamaRMSNorm, its
LlamaRotaryEmbedding (whose cos/sin tables, default and llama3-scaled, ztrain is given in its
[T, head_dim/2] form) with apply_rotary_pos_emb's rotate_half, the MLP's ACT2FN[hidden_act], and
eager attention as Llama and Mistral compute it: repeat_kv for grouped-query heads and Mistral's
own causal mask with its sliding window. Gradients come from torch.autograd through those
functions, at fp32.

Pass condition: every output and gradient within 1e-5 of the reference, norm-relative
(||ztrain - ref|| / ||ref||): both sides compute in fp32, so they differ by rounding alone, a few
1e-7 at these sizes; a wrong pairing, mask, scale or group mapping is off by tens of percent.
The finite-difference checks of the same ops are in test_ops (tests/unit/ops/).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, MistralConfig  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb, repeat_kv)
from transformers.models.mistral.modeling_mistral import MistralModel  # noqa: E402

from ztref import Checker, rel_err, run, tool  # noqa: E402

TOOL = tool("zt_llama_ops")
TOL = 1e-5
torch.manual_seed(20241125)
chk = Checker()


def zt(args, inputs, outputs):
    """Writes inputs (name -> tensor) to a directory, runs the tool there and reads outputs
    (name -> shape) back."""
    with tempfile.TemporaryDirectory() as d:
        for name, t in inputs.items():
            t.detach().contiguous().float().numpy().tofile(os.path.join(d, name + ".f32"))
        run([TOOL] + [str(a) for a in args] + [d])
        return {name: torch.from_numpy(np.fromfile(os.path.join(d, name + ".f32"),
                                                   dtype=np.float32)).reshape(shape)
                for name, shape in outputs.items()}


def compare(what, got, want):
    for name, ref in want.items():
        e = rel_err(got[name], ref.detach())
        chk.check(e <= TOL, f"{what}: {name} rel err {e:.2e}")


def leaf(t):
    return t.clone().requires_grad_(True)


def rmsnorm(N, C, eps):
    inp, w, dout = leaf(torch.randn(N, C) * 2 + 0.5), 1 + 0.3 * torch.randn(C), torch.randn(N, C)
    norm = LlamaRMSNorm(C, eps=eps)
    norm.weight = torch.nn.Parameter(w.clone())
    out = norm(inp)
    (out * dout).sum().backward()
    rstd = torch.rsqrt(inp.detach().pow(2).mean(-1) + eps)
    got = zt(["rmsnorm", N, C, repr(eps)], {"inp": inp, "w": w, "dout": dout},
             {"out": (N, C), "rstd": (N,), "dinp": (N, C), "dw": (C,)})
    compare(f"rmsnorm N={N} C={C} eps={eps}", got,
            {"out": out, "rstd": rstd, "dinp": inp.grad, "dw": norm.weight.grad})


def rope(B, T, H, hd, theta, scaling):
    config = LlamaConfig(hidden_size=H * hd, num_attention_heads=H, num_key_value_heads=H,
                         head_dim=hd, rope_theta=theta, rope_scaling=scaling,
                         max_position_embeddings=max(T, 16))
    x, dout = torch.randn(B, H, T, hd), torch.randn(B, H, T, hd)
    q = leaf(x)
    cos, sin = LlamaRotaryEmbedding(config=config)(q, torch.arange(T)[None].expand(B, T))
    # ztrain's tables hold each frequency once; Hugging Face's repeat them over both halves.
    half = hd // 2
    same = (torch.equal(cos[..., :half], cos[..., half:])
            and torch.equal(sin[..., :half], sin[..., half:]))
    chk.check(same, f"rope hd={hd}: Hugging Face's cos/sin repeat over the two halves")
    out, _ = apply_rotary_pos_emb(q, q.detach(), cos, sin)
    (out * dout).sum().backward()
    rows = lambda t: t.transpose(1, 2).reshape(B, T, H * hd)  # noqa: E731
    got = zt(["rope", B, T, H, hd],
             {"x": rows(x), "cos": cos[0, :, :half], "sin": sin[0, :, :half], "dout": rows(dout)},
             {"out": (B, T, H * hd), "dx": (B, T, H * hd)})
    kind = scaling["rope_type"] if scaling else "default"
    compare(f"rope B={B} T={T} H={H} hd={hd} theta={theta} {kind}", got,
            {"out": rows(out), "dx": rows(q.grad)})


def silu_mul(n):
    gate, up, dout = leaf(4 * torch.randn(n)), leaf(torch.randn(n)), torch.randn(n)
    out = ACT2FN[LlamaConfig().hidden_act](gate) * up
    (out * dout).sum().backward()
    got = zt(["silu_mul", n], {"gate": gate, "up": up, "dout": dout},
             {"out": (n,), "dgate": (n,), "dup": (n,)})
    compare(f"silu_mul n={n}", got, {"out": out, "dgate": gate.grad, "dup": up.grad})


def attention(B, T, NH, KVH, hd, window):
    q = leaf(torch.randn(B, NH, T, hd))
    k, v = leaf(torch.randn(B, KVH, T, hd)), leaf(torch.randn(B, KVH, T, hd))
    dout = torch.randn(B, T, NH * hd)
    config = MistralConfig(sliding_window=window or None)
    mask = MistralModel._prepare_4d_causal_attention_mask_with_cache_position(
        None, T, T, torch.float32, "cpu", torch.arange(T), B, config, None)
    scores = q @ repeat_kv(k, NH // KVH).transpose(2, 3) / hd ** 0.5 + mask
    att = torch.softmax(scores, dim=-1, dtype=torch.float32)
    out = (att @ repeat_kv(v, NH // KVH)).transpose(1, 2).reshape(B, T, NH * hd)
    (out * dout).sum().backward()
    rows = lambda t: t.transpose(1, 2).reshape(B, T, -1)  # noqa: E731
    got = zt(["attention", B, T, NH, KVH, hd, window],
             {"q": rows(q), "k": rows(k), "v": rows(v), "dout": dout},
             {"out": (B, T, NH * hd), "att": (B, NH, T, T), "dq": (B, T, NH * hd),
              "dk": (B, T, KVH * hd), "dv": (B, T, KVH * hd)})
    compare(f"attention B={B} T={T} heads={NH}/{KVH} hd={hd} window={window}", got,
            {"out": out, "att": att, "dq": rows(q.grad), "dk": rows(k.grad), "dv": rows(v.grad)})


def main():
    rmsnorm(10, 48, 1e-6)
    rmsnorm(3, 7, 1e-5)
    rope(2, 12, 3, 16, 10000.0, None)
    rope(1, 40, 2, 8, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    rope(2, 9, 2, 6, 10000.0, {"rope_type": "linear", "factor": 2.0})
    silu_mul(1000)
    attention(2, 16, 4, 1, 8, 0)
    attention(2, 16, 4, 4, 6, 0)
    attention(1, 37, 6, 2, 10, 5)
    attention(1, 70, 2, 1, 4, 66)
    chk.done()


if __name__ == "__main__":
    main()
