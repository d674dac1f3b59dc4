"""The Llama family's forward and backward against Hugging Face transformers (float64, eager
attention): logits, loss and every parameter gradient of tiny models of each variant, relative
error under 1e-5 — GQA 4:1 and 1:1, tied and untied heads, q/k/v (and o) biases, head_dim apart
from n_embd / n_head, llama3 and linear rope scaling, Mistral's sliding window shorter than the
sequence, Qwen2 — and bf16 activations within the tolerance their rounding allows. The weights
reach ztrain through the model.safetensors that transformers' save_pretrained writes. The
parameter count that admission and ZeRO start from (`ztrain estimate`) is transformers' own."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from llama_ref import base_config, hf_model, spec_of  # noqa: E402
from ztref import Checker, rel_err, run, st_read, tool, write_job  # noqa: E402

torch.set_num_threads(2)
BLOCK = 16
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

# (what, family, config, B, T)
CASES = [
    ("llama GQA 4:1 untied", "llama", base_config(), 2, BLOCK),
    ("llama 1:1 tied, T < block_size", "llama",
     base_config(num_key_value_heads=8, tie_word_embeddings=True), 3, 11),
    ("llama3 rope scaling, head_dim 16 != n_embd/n_head", "llama",
     base_config(head_dim=16, rope_scaling=LLAMA3, rope_theta=500000.0), 2, BLOCK),
    ("llama linear rope scaling, attention_bias (q, k, v and o)", "llama",
     base_config(rope_scaling={"type": "linear", "factor": 4.0}, attention_bias=True), 2, BLOCK),
    ("mistral sliding window 5 < T", "mistral", base_config(sliding_window=5), 2, BLOCK),
    ("qwen2 q/k/v biases, tied", "qwen2",
     base_config(num_key_value_heads=4, tie_word_embeddings=True, use_sliding_window=False), 2,
     BLOCK),
]


def ztrain_run(d, family, model, B, T, inputs, targets, act="f32"):
    """Saves the model as transformers does, runs zt_model_check on it, returns its outputs."""
    model.save_pretrained(d, safe_serialization=True)
    write_job(f"{d}/job.json", {"model": spec_of(family, model.config, BLOCK, "model.safetensors"),
                                "data": {"train": "unused.bin"},
                                "deepspeed": {"train_micro_batch_size_per_gpu": B}})
    with open(f"{d}/batch.i32", "wb") as f:
        f.write(inputs.numpy().tobytes() + targets.numpy().tobytes())
    run([tool("zt_model_check"), f"{d}/job.json", f"{d}/batch.i32", d, B, T, act])
    estimate = json.loads(run([tool("ztrain"), "estimate", f"{d}/job.json", "--json"]).stdout)
    n = sum(p.numel() for p in model.parameters())
    ck.check(estimate["params"] == n,
             f"{family}: the estimate's {estimate['params']} parameters are transformers' {n}")
    logits = None
    if act == "f32":
        logits = torch.from_numpy(np.fromfile(f"{d}/logits.f32", dtype="float32"))
    loss = float(open(f"{d}/loss.txt").read())
    grads, _ = st_read(f"{d}/grads.safetensors")
    return logits, loss, grads


def reference(model, inputs, targets):
    """Logits, loss and gradients by name of the model in float64."""
    ref = model.double()
    ref.zero_grad()
    logits = ref(input_ids=inputs.long()).logits
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.long().reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
    return logits.detach(), loss.item(), grads


def batch(seed, B, T, V):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, V, (B, T), generator=g, dtype=torch.int32),
            torch.randint(0, V, (B, T), generator=g, dtype=torch.int32))


ck = Checker()
for i, (what, family, config, B, T) in enumerate(CASES):
    model = hf_model(family, 10 + i, **config)
    V = model.config.vocab_size
    inputs, targets = batch(100 + i, B, T, V)
    with tempfile.TemporaryDirectory() as d:
        got_logits, got_loss, got_grads = ztrain_run(d, family, model, B, T, inputs, targets)
    want_logits, want_loss, want_grads = reference(model, inputs, targets)
    e = rel_err(got_logits.view(B, T, V), want_logits)
    ck.check(e < 1e-5, f"{what}: logits rel err {e:.2e}")
    e = abs(got_loss - want_loss) / abs(want_loss)
    ck.check(e < 1e-5, f"{what}: loss {got_loss:.7f} vs transformers {want_loss:.7f} (rel {e:.1e})")
    ck.check(set(got_grads) == set(want_grads),
             f"{what}: gradient names are the parameters' ({len(want_grads)})")
    worst = (0.0, "")
    for n in set(got_grads) & set(want_grads):
        e = rel_err(got_grads[n], want_grads[n])
        worst = max(worst, (e, n))
        if e >= 1e-5:
            ck.check(False, f"{what}: grad {n} rel err {e:.2e}")
    ck.check(worst[0] < 1e-5, f"{what}: every gradient, worst {worst[1]} rel err {worst[0]:.2e}")

# The window matters: the same Mistral without it gives other logits, so the case above tested a
# mask that transformers (4.46, eager) applies.
config = dict(CASES[4][2])
mistral = hf_model("mistral", 14, **config)
inputs, _ = batch(104, 2, BLOCK, 97)
with torch.no_grad():
    windowed = mistral.double()(input_ids=inputs.long()).logits
    mistral.config.sliding_window = None
    full = mistral(input_ids=inputs.long()).logits
ck.check(rel_err(windowed, full) > 1e-2,
         f"the sliding window changes transformers' logits (rel {rel_err(windowed, full):.2e})")
# Likewise llama3 scaling: the same weights without it give other logits.
config = dict(CASES[2][2])
scaled = hf_model("llama", 12, **config)
plain = hf_model("llama", 12, **dict(config, rope_scaling=None))
with torch.no_grad():
    a = scaled.double()(input_ids=inputs.long()).logits
    b = plain.double()(input_ids=inputs.long()).logits
ck.check(rel_err(a, b) > 1e-3, f"llama3 scaling changes the logits (rel {rel_err(a, b):.2e})")

# bf16 activations, on weights that bf16 holds exactly (as mixed precision keeps them): every held
# activation is rounded to 8 significant bits, a relative error of at most 2^-9 ≈ 2e-3 each, and
# about twenty of them lie between the input and a gradient of this two-layer model. Errors that
# add up independently give some sqrt(20)·2^-9 ≈ 1e-2 of norm-relative error; the bound is 3e-2
# for gradients and the loss within 1e-2, and ztrain must differ from fp32 by more than 1e-4
# (the rounding did happen).
what, family, config, B, T = CASES[0]
model = hf_model(family, 20, **config)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(p.bfloat16().float())
inputs, targets = batch(120, B, T, model.config.vocab_size)
with tempfile.TemporaryDirectory() as d:
    _, loss16, grads16 = ztrain_run(d, family, model, B, T, inputs, targets, act="bf16")
with tempfile.TemporaryDirectory() as d:
    _, loss32, grads32 = ztrain_run(d, family, model, B, T, inputs, targets)
_, want_loss, want_grads = reference(model, inputs, targets)
e = abs(loss16 - want_loss) / want_loss
ck.check(e < 1e-2, f"bf16: loss {loss16:.5f} vs transformers {want_loss:.5f} (rel {e:.1e})")
worst = max((rel_err(grads16[n], want_grads[n]), n) for n in want_grads)
ck.check(worst[0] < 3e-2, f"bf16: every gradient within 3e-2, worst {worst[1]} {worst[0]:.2e}")
moved = max(rel_err(grads16[n], grads32[n]) for n in want_grads)
ck.check(moved > 1e-4, f"bf16 activations are rounded: gradients differ from fp32 by {moved:.1e}")
ck.done()
