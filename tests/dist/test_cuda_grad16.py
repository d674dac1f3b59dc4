"""The CUDA backend's 16-bit gradients (issue 28, item 3) on the emulated device
(ZTRAIN_CUDA_EMU=1): in a bf16/fp16 job every op that accumulates a parameter gradient adds into
16-bit gradients (ops.h zt_grad16, backend.h writes_grad16) instead of into fp32 gradients that
ZeRO then rounded: at ZeRO 0-1 into its 16-bit gradients (before: added in layer by layer,
accumulate_half), from ZeRO 2 into a 16-bit buffer that each bucket is reduce-scattered from
(before: the fp32 bucket rounded into 16 bits a chunk at a time, then reduced). Each op's
contribution is rounded once either way, so for a model whose every gradient one op writes
(Llama with an untied head) the losses must equal, bit for bit over four steps, those of the
same job under ZTRAIN_CUDA_GRADS=f32 (the fp32 route), with gradient accumulation too; a tied
embedding (GPT-2) is written by two ops and rounded twice, so its losses stay within 0.1% of the
fp32 route's. An fp32 communication_data_type keeps the fp32 route from ZeRO 2 (the reduction
adds fp32 gradients). Every run maps each buffer through the VMM in 4 KiB granules under
ZTRAIN_CUDA_VMM=check (a write into released memory fails the job), and ZeRO's fp32 working
memory (memory/rank<r>/fp32_workspace_bytes: the fp32 parameters and gradients it holds) must be
0 with 16-bit gradients and not 0 on the fp32 route."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))

from ztref import BUILD, Checker, read_metrics, run, tool, write_job  # noqa: E402

STEPS = 4
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 32}
LLAMA = {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 16,
         "tie_word_embeddings": False}
ADAMW = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}}
VMM = {"ZTRAIN_CUDA_EMU": "1", "ZTRAIN_CUDA_VMM": "check", "ZTRAIN_CUDA_VMM_MIN_BYTES": "0",
       "ZTRAIN_CUDA_EMU_VMM_GRANULE": "4096"}

if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
    print("SKIPPED: this build has no emulated CUDA device (-DZT_CUDA_EMU=OFF or no CUDA headers)")
    sys.exit(0)


def job(name, world=1, micro=8, stage=0, model=LLAMA, precision="bf16", accumulate=1,
        zero=None, comm=None, tp=1):
    # A small bucket, so that stages 2-3 reduce several in a backward.
    ds = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accumulate,
          "optimizer": ADAMW, "gradient_clipping": 1.0,
          "zero_optimization": dict({"stage": stage, "reduce_bucket_size": 3000}, **(zero or {})),
          precision: {"enabled": True}}
    if comm:
        ds["communication_data_type"] = comm
    if tp > 1:
        ds["tensor_parallel"] = {"autotp_size": tp}
    if precision == "fp16":
        ds["fp16"]["initial_scale_power"] = 12
    return {"name": name, "world_size": world, "device": "cuda", "model": model,
            "data": {"train": "train.txt"},
            "train": {"max_steps": STEPS, "log_interval": 1, "seed": 5}, "deepspeed": ds}


def train(d, spec, grads):
    """(losses, gradient norms, each rank's most fp32 workspace) of spec run with
    ZTRAIN_CUDA_GRADS=grads."""
    name = f"{spec['name']}-{grads}"
    write_job(f"{d}/{name}.json", dict(spec, name=name))
    env = dict(os.environ, ZTRAIN_CUDA_GRADS=grads, **VMM)
    run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], env=env, cwd=d)
    records = read_metrics(f"{d}/{name}/metrics.jsonl")
    work = [max(m.get(f"memory/rank{r}/fp32_workspace_bytes", 0) for m in records)
            for r in range(spec["world_size"])]
    return ([m["train/loss"] for m in records if "train/loss" in m],
            [m["train/grad_norm"] for m in records if "train/grad_norm" in m], work)


def compare(ck, what, spec, d, exact=True, half16=True, gathers=False):
    half, half_norms, half_work = train(d, spec, "half")
    ref, ref_norms, ref_work = train(d, spec, "f32")
    if exact:
        ck.check(len(half) == STEPS and half == ref and half_norms == ref_norms,
                 f"{what}: the losses and gradient norms with 16-bit gradients are the fp32 "
                 f"route's, bit for bit ({half} vs {ref}; {half_norms} vs {ref_norms})")
    else:
        def near(x, y, tol):
            return len(x) == STEPS == len(y) and all(
                abs(a - b) <= tol * abs(b) for a, b in zip(x, y))
        ck.check(near(half, ref, 1e-3) and near(half_norms, ref_norms, 1e-2),
                 f"{what}: the losses with 16-bit gradients are within 0.1% of the fp32 "
                 f"route's, the gradient norms within 1% ({half} vs {ref}; {half_norms} vs "
                 f"{ref_norms})")
    if gathers:
        # Stage 3 counts the 16-bit parameters it gathers as working memory too.
        ck.check(all(h < r for h, r in zip(half_work, ref_work)),
                 f"{what}: less working memory with 16-bit gradients ({half_work} bytes a rank: "
                 f"the gathered 16-bit parameters) than on the fp32 route ({ref_work})")
    elif half16:
        ck.check(all(w == 0 for w in half_work) and all(w > 0 for w in ref_work),
                 f"{what}: ZeRO holds no fp32 working memory with 16-bit gradients "
                 f"({half_work} bytes a rank), and some on the fp32 route ({ref_work})")
    else:
        ck.check(all(w > 0 for w in half_work),
                 f"{what}: the gradients stay fp32 ({half_work} bytes of fp32 working memory a "
                 f"rank)")
    return half


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    losses = compare(ck, "Llama bf16, ZeRO 0", job("llama"), d)
    ck.check(len(losses) == STEPS and losses[-1] < losses[0],
             f"the bf16 loss falls over the steps ({losses})")
    compare(ck, "Llama bf16, ZeRO 0, two micro-steps a step (16-bit accumulation)",
            job("llama-acc", micro=4, accumulate=2), d)
    compare(ck, "Llama fp16, ZeRO 1 on 2 ranks",
            job("llama-z1", world=2, micro=4, stage=1, precision="fp16"), d)
    compare(ck, "Llama bf16, ZeRO 2 on 2 ranks, buckets reduced from the 16-bit gradients",
            job("llama-z2", world=2, micro=4, stage=2, accumulate=2), d)
    compare(ck, "Llama bf16, ZeRO 3 on 2 ranks, with overlap_comm's thread",
            job("llama-z3", world=2, micro=4, stage=3, zero={"overlap_comm": True}), d,
            gathers=True)
    compare(ck, "Llama bf16, ZeRO 2 on 2 ranks, communication_data_type fp32",
            job("llama-z2-f32", world=2, micro=4, stage=2, comm="fp32"), d, half16=False)
    # Each kv head on two of the four TP ranks: their k and v gradients are summed in 16 bits
    # (tp_layers.c), the fp32 route sums them in fp32, so not bit for bit.
    compare(ck, "Llama bf16 at tp 4 (each kv head on 2 ranks), ZeRO 1",
            job("llama-tp4", world=4, stage=1, tp=4), d, exact=False)
    compare(ck, "GPT-2 bf16, ZeRO 1 (a tied embedding, two ops' roundings)",
            job("gpt2", model=GPT2, stage=1), d, exact=False)
    # What the variable does not understand is refused by name.
    write_job(f"{d}/bad.json", job("bad"))
    p = run([tool("ztrain"), "run", f"{d}/bad.json", "--out", f"{d}/bad"], check=False,
            env=dict(os.environ, ZTRAIN_CUDA_EMU="1", ZTRAIN_CUDA_GRADS="fp8"), cwd=d)
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0 and "ZTRAIN_CUDA_GRADS" in out and "fp8" in out,
             f"ZTRAIN_CUDA_GRADS=fp8 is refused naming the variable (exit {p.returncode})")
ck.done()
