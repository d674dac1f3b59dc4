"""Loss-masked, packed data (data.format "masked") through pipeline stages gives the single-rank
trajectory for the same global batch of 16 sequences: GPT-2 in 2 stages x dp 1 (4 micro-batches,
with evaluation), 2 stages x dp 2 (2 micro-batches each) and 4 stages x dp 1 (8 micro-batches,
two middle stages that load no data and see the documents only as they travel with the
activations), and Llama (rotary positions restarting per document) in 2 stages x dp 2 with
ZeRO 1; and GPT-2 in 2 stages on the emulated CUDA device (within 1e-4, as the other emulated
runs), where the positions reach the attention kernels in device memory. The 10 losses within 1e-5 relative, the gradient norms within 1e-4, the final weights
(exported from the per-stage checkpoint) within 1e-4 per tensor, the eval losses within 1e-5, and
every step's train/trained_tokens and train/tokens equal to the single rank's.

Every micro-batch holds a different number of trained targets (60% of the tokens, documents of 2
to 11 tokens), so a pipeline that took DeepSpeed's mean of per-micro-batch means, or the mean over
one replica's tokens, would be off by far more than 1e-5; and one whose middle stages attended
across document boundaries would be too. The single rank's masked loss is itself checked against
transformers by reference/test_sft_train and test_sft_loss."""
import os
import random
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import (BUILD, Checker, read_metrics, rel_err, run, st_read, tool,  # noqa: E402
                   write_job, write_llmc_tokens)

GLOBAL, STEPS, T = 16, 10, 16
GPT2 = {"type": "gpt2", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": T}
LLAMA = {"type": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": T,
         "tie_word_embeddings": False}


def write_masked(path, n, seed):
    """n tokens and their loss mask (docs/fine-tuning.md, version 1): bit 0 trained, bit 1 a
    document's first token."""
    rng = random.Random(seed)
    tokens, flags, next_doc = [], [], 0
    for i in range(n):
        start = i == next_doc
        if start:
            next_doc += rng.randrange(2, 12)
        # A document opens with a random token and continues by a rule the model can learn.
        tokens.append(rng.randrange(256) if start else (tokens[-1] * 5 + 1) % 256)
        flags.append((1 if rng.random() < 0.6 else 0) | (2 if start else 0))
    write_llmc_tokens(path, tokens)
    with open(path + ".mask", "wb") as f:
        f.write(struct.pack("<256i", 20261204, 1, n, *([0] * 253)))
        f.write(bytes(flags))


def job(model, stages, dp, gas, ckpt, zero=0, evaluate=False, device="cpu"):
    spec = {"name": f"sft{stages}x{dp}g{gas}", "world_size": stages * dp, "device": device,
            "model": model,
            "data": {"train": "train.bin", "shuffle": True, "format": "masked"},
            "train": {"max_steps": STEPS, "log_interval": 1, "checkpoint_dir": ckpt, "seed": 5},
            "deepspeed": {"train_micro_batch_size_per_gpu": GLOBAL // (dp * gas),
                          "gradient_accumulation_steps": gas,
                          "optimizer": {"type": "AdamW",
                                        "params": {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}},
                          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
                          "gradient_clipping": 0.5,
                          "zero_optimization": {"stage": zero}}}
    if stages > 1:
        spec["pipeline"] = {"stages": stages, "partition": "uniform"}
    if evaluate:
        spec["data"]["val"] = "val.bin"
        spec["train"].update(eval_interval=5, eval_steps=3)
    return spec


def train(d, name, spec):
    write_job(f"{d}/{name}.json", spec)
    env = dict(os.environ, ZTRAIN_CUDA_EMU="1") if spec["device"] == "cuda" else None
    run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], env=env)
    run([tool("ztrain"), "export", f"{d}/{spec['train']['checkpoint_dir']}", "--out",
         f"{d}/{name}.safetensors"])
    params, _ = st_read(f"{d}/{name}.safetensors")
    records = read_metrics(f"{d}/{name}/metrics.jsonl")
    steps = [m for m in records if "train/loss" in m]
    return {"loss": [m["train/loss"] for m in steps],
            "norm": [m["train/grad_norm"] for m in steps],
            "counts": [(m.get("train/trained_tokens"), m.get("train/tokens")) for m in steps],
            "eval": [m["eval/loss"] for m in records if "eval/loss" in m], "params": params}


def worst(got, ref):
    return max(abs(a - b) / abs(b) for a, b in zip(got, ref)) if got and ref else float("inf")


def compare(ck, what, ref, got, tol=1e-5):
    err = worst(got["loss"], ref["loss"])
    ck.check(len(got["loss"]) == STEPS and err < tol,
             f"{what}: {len(got['loss'])} losses, worst rel err {err:.1e}")
    err = worst(got["norm"], ref["norm"])
    ck.check(err < tol * 10, f"{what}: gradient norms, worst rel err {err:.1e}")
    ck.check(got["counts"] == ref["counts"] and all(c[0] and c[0] < c[1] for c in got["counts"]),
             f"{what}: trained/all targets every step as the single rank's: "
             f"{got['counts'][:3]}... vs {ref['counts'][:3]}...")
    ck.check(sorted(got["params"]) == sorted(ref["params"]),
             f"{what}: the exported model has the single-rank tensors")
    common = [k for k in ref["params"] if k in got["params"]]
    err, name = max((rel_err(got["params"][k], ref["params"][k]), k) for k in common)
    ck.check(err < tol * 10, f"{what}: final parameters, worst tensor {name} rel err {err:.1e}")


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_masked(f"{d}/train.bin", STEPS * GLOBAL * T + 1, 7)
    write_masked(f"{d}/val.bin", 12 * 4 * T + 1, 8)
    ref = train(d, "gpt2-single", job(GPT2, 1, 1, 4, "ck-gpt2-single", evaluate=True))
    ck.check(ref["loss"][-1] < ref["loss"][0], f"the single-rank loss falls: {ref['loss']}")
    # The micro-batches' trained targets differ, so the global-batch mean is no mean of means.
    got = train(d, "gpt2-2x1g4", job(GPT2, 2, 1, 4, "ck-gpt2-2x1g4", evaluate=True))
    compare(ck, "GPT-2, 2 stages x dp 1, 4 micro-batches", ref, got)
    err = worst(got["eval"], ref["eval"])
    ck.check(len(got["eval"]) == 2 and err < 1e-5,
             f"GPT-2, 2 stages: {len(got['eval'])} eval losses, worst rel err {err:.1e}")
    for stages, dp, gas in ((2, 2, 2), (4, 1, 8)):
        got = train(d, f"gpt2-{stages}x{dp}g{gas}",
                    job(GPT2, stages, dp, gas, f"ck-gpt2-{stages}x{dp}g{gas}"))
        compare(ck, f"GPT-2, {stages} stages x dp {dp}, {gas} micro-batches", ref, got)
    # On the emulated CUDA device the positions go to device memory for the attention kernels,
    # and the activations through staging: the same trajectory as the CPU's, within the fp32
    # rounding of other summation orders (test_cuda_emu_training's 1e-4).
    if os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
        got = train(d, "gpt2-cuda-2x1g4",
                    job(GPT2, 2, 1, 4, "ck-gpt2-cuda-2x1g4", device="cuda"))
        compare(ck, "GPT-2 on the emulated CUDA device, 2 stages x dp 1", ref, got, tol=1e-4)
    else:
        print("no emulated CUDA device in this build: the cuda case is not run")
    ref = train(d, "llama-single", job(LLAMA, 1, 1, 4, "ck-llama-single", zero=1))
    got = train(d, "llama-2x2g2", job(LLAMA, 2, 2, 2, "ck-llama-2x2g2", zero=1))
    compare(ck, "Llama, 2 stages x dp 2 with ZeRO 1, 2 micro-batches", ref, got)
ck.done()
