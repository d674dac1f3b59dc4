"""20 optimizer steps of `ztrain run` on a Llama-family model (grouped-query attention, untied
head, llama3 rope scaling) against the same training of Hugging Face's LlamaForCausalLM in
float64: AdamW, DeepSpeed's WarmupDecayLR, gradient clipping that really clips, gradient
accumulation, an llm.c token file. Every step's loss must agree within 1e-4 relative; the lr and
the gradient norm are compared too."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402

from llama_ref import base_config, hf_model, spec_of  # noqa: E402
from ztref import (Checker, read_metrics, run, tool, warmup_decay_lr, write_job,  # noqa: E402
                   write_llmc_tokens)

torch.set_num_threads(2)
T, MICRO, GAS, STEPS = 16, 4, 2, 20
LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-8, 0.1, 0.5
WARMUP, TOTAL, MIN_LR = 5, STEPS, 1e-4
CONFIG = base_config(rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8})

ck = Checker()
model = hf_model("llama", 5, **CONFIG)
V = model.config.vocab_size
with tempfile.TemporaryDirectory() as d:
    g = torch.Generator().manual_seed(7)
    # A learnable stream (a noisy repeating pattern) so the loss visibly falls.
    pattern = torch.randint(0, V, (40,), generator=g)
    tokens = pattern.repeat(90)
    noise = torch.rand(tokens.shape, generator=g) < 0.1
    tokens[noise] = torch.randint(0, V, (int(noise.sum()),), generator=g)
    write_llmc_tokens(f"{d}/train.bin", tokens.tolist())
    model.save_pretrained(d, safe_serialization=True)
    write_job(f"{d}/job.json", {
        "name": "llama-parity",
        "model": spec_of("llama", model.config, T, "model.safetensors"),
        "data": {"train": "train.bin", "shuffle": False},
        "train": {"max_steps": STEPS, "log_interval": 1, "warmup_steps": 0},
        "deepspeed": {
            "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                      "weight_decay": WD}},
            "scheduler": {"type": "WarmupDecayLR",
                          "params": {"warmup_min_lr": MIN_LR, "warmup_max_lr": LR,
                                     "warmup_num_steps": WARMUP, "total_num_steps": TOTAL,
                                     "warmup_type": "linear"}},
            "gradient_clipping": CLIP}})
    run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run", "--threads", "2"])
    got = read_metrics(f"{d}/run/metrics.jsonl")

# The same training in transformers, float64.
ref = model.double()
params = list(ref.parameters())
opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
sample = 0
clipped = 0
for step in range(1, STEPS + 1):
    lr = warmup_decay_lr(step, MIN_LR, LR, WARMUP, TOTAL, linear=True)
    for group in opt.param_groups:
        group["lr"] = lr
    total = 0.0
    for micro in range(GAS):
        starts = [(sample + i) * T for i in range(MICRO)]
        sample += MICRO
        x = torch.stack([tokens[s:s + T] for s in starts])
        y = torch.stack([tokens[s + 1:s + T + 1] for s in starts])
        logits = ref(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        (loss / GAS).backward()
        total += loss.item() / GAS
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params)).item()
    coef = CLIP / (norm + 1e-6)
    if coef < 1:
        clipped += 1
        for p in params:
            p.grad.mul_(coef)
    opt.step()
    opt.zero_grad()
    m = got[step - 1]
    ck.check(m["train/global_step"] == step, f"step {step}: record present")
    e = abs(m["train/loss"] - total) / total
    ck.check(e < 1e-4, f"step {step}: loss {m['train/loss']:.6f} vs transformers {total:.6f} (rel {e:.1e})")
    e = abs(m["train/learning_rate"] - lr) / lr
    ck.check(e < 1e-8, f"step {step}: lr {m['train/learning_rate']:.6g} vs formula {lr:.6g}")
    e = abs(m["train/grad_norm"] - norm) / norm
    ck.check(e < 1e-3, f"step {step}: grad norm {m['train/grad_norm']:.5f} vs transformers {norm:.5f}")
ck.check(clipped >= 5, f"clipping was active in {clipped} of {STEPS} steps")
ck.check(got[-1]["train/loss"] < got[0]["train/loss"] * 0.8, "the loss falls")
ck.done()
