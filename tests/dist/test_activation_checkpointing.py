"""Activation checkpointing through whole jobs: train.activation_checkpointing (intervals 1 and 2),
Hugging Face's training_args.gradient_checkpointing and the DeepSpeed config's cpu_checkpointing
give exactly the losses and final weights of the same job without it, on 2 ranks at ZeRO stages
0 and 3 (where the recomputation fetches each layer's gathered parameters again, with prefetch)
and in bf16 at stage 1 (where the hooks keep fp32 working copies per layer); a job that asks for
cpu_checkpointing without checkpointing is warned, and an interval without the switch refused.
And the memory: one rank's peak RSS (getrusage) with checkpointing every 1 and 3 of 6 blocks is
lower than without by the activation bytes the README's formula says are no longer kept, within
10% (the rest of the process is the same in both runs).

Pipelined (2 stages, pipeline.activation_checkpoint_interval 1, micro-batch 2 x 2): with
cpu_checkpointing the losses and weights are those of the same pipeline without checkpointing,
and no warning says it has no effect. On the emulated CUDA device it is in force: each stage's
memory/rank<r>/device_allocated_bytes is lower than without cpu_checkpointing by its kept block
inputs less the one device copy in use, (buffers x blocks - 1) x 4·B·T·C bytes, with DeepSpeed's
num_pipe_buffers max(2, min(S - s + 1, M)) and the blocks of the uniform partition."""
import copy
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))

from ztref import BUILD, Checker, read_metrics, run, st_read, tool, write_job  # noqa: E402


def job(model, stage, bf16=False):
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}},
          "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000, "overlap_comm": True,
                                "stage3_param_persistence_threshold": 100}}
    if bf16:
        ds["bf16"] = {"enabled": True}
    return {"world_size": 2, "model": model, "data": {"train": "train.txt"},
            "train": {"max_steps": 4, "log_interval": 1, "checkpoint_dir": "ck", "seed": 3},
            "deepspeed": ds}


GPT2 = {"type": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 16}
LLAMA = {"type": "llama", "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 16,
         "tie_word_embeddings": True}


def train(d, name, spec):
    spec = copy.deepcopy(spec)
    spec["name"] = name
    spec["train"]["checkpoint_dir"] = f"ck-{name}"
    write_job(f"{d}/{name}.json", spec)
    p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"])
    run([tool("ztrain"), "export", f"{d}/ck-{name}", "--out", f"{d}/{name}.safetensors"])
    params, _ = st_read(f"{d}/{name}.safetensors")
    return [m["train/loss"] for m in read_metrics(f"{d}/{name}/metrics.jsonl")], params, p


def same(ck, what, ref, got):
    ck.check(len(got[0]) == 4 and got[0] == ref[0], f"{what}: losses {got[0]} == {ref[0]}")
    bad = [k for k in ref[1] if not (ref[1][k] == got[1][k]).all()]
    ck.check(not bad and set(ref[1]) == set(got[1]), f"{what}: final weights equal (differ: {bad})")


def r64(n):
    return (n + 63) // 64 * 64


def saved_bytes(L, B, T, C, NH, every):
    """README's formula (fp32 activations): a GPT-2 block keeps ln1, atty, res2, ln2, res3 [B,T,C],
    qkv [B,T,3C], fch and fch_gelu [B,T,4C], four [B,T] statistics and att [B,NH,T,T], each
    buffer rounded to 64 bytes; checkpointing keeps min(k, L) blocks' worth and ceil(L/k) block
    inputs [B,T,C] instead of L blocks and one input."""
    BT = B * T
    block = (5 * r64(BT * C * 4) + r64(BT * 3 * C * 4) + 2 * r64(BT * 4 * C * 4) + 4 * r64(BT * 4)
             + r64(B * NH * T * T * 4))
    groups = -(-L // every)
    return (L - min(every, L)) * block - (groups - 1) * r64(BT * C * 4)


def peak_rss(d, name, every):
    L, B, T, C, NH = 6, 8, 128, 128, 4
    spec = {"name": name, "world_size": 1,
            "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": 256,
                      "block_size": T},
            "data": {"train": "train.txt"}, "train": {"max_steps": 2, "log_interval": 1},
            "deepspeed": {"train_micro_batch_size_per_gpu": B,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}
    if every:
        spec["train"].update(activation_checkpointing=True, activation_checkpoint_interval=every)
    write_job(f"{d}/{name}.json", spec)
    # Linux carries a process's peak RSS across exec, and a child spawned from this Python
    # (torch imported) would start with Python's: a shell in between forks a small process.
    run(["sh", "-c", '"$0" run "$1" --out "$2"; exit $?', tool("ztrain"), f"{d}/{name}.json",
         f"{d}/{name}"])
    rss = max(m.get("memory/rank0/peak_rss_bytes", 0)
              for m in read_metrics(f"{d}/{name}/metrics.jsonl"))
    return rss, saved_bytes(L, B, T, C, NH, every) if every else 0


PIPE_GPT2 = {"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 64, "vocab_size": 256,
             "block_size": 32}


def pipeline_job(device, ckpt, cpu):
    spec = job(PIPE_GPT2, 0)
    spec.update(device=device, pipeline={"stages": 2, "partition": "uniform",
                                         "activation_checkpoint_interval": ckpt})
    if cpu:
        spec["deepspeed"]["activation_checkpointing"] = {"cpu_checkpointing": True}
    return spec


def device_allocated(d, name):
    recs = read_metrics(f"{d}/{name}/metrics.jsonl")
    return [max(m.get(f"memory/rank{r}/device_allocated_bytes", 0) for m in recs)
            for r in range(2)]


def check_pipeline(d):
    ref = train(d, "pipe-plain", pipeline_job("cpu", 0, False))
    got = train(d, "pipe-cpu-ckpt", pipeline_job("cpu", 1, True))
    same(ck, "2 pipeline stages, checkpoint interval 1 with cpu_checkpointing", ref, got)
    out = got[2].stdout + got[2].stderr
    ck.check("cpu_checkpointing has no effect" not in out,
             f"pipelined cpu_checkpointing is not warned: {out!r}")
    if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
        print("emulated CUDA device not built: cpu_checkpointing's device memory not checked")
        return
    os.environ["ZTRAIN_CUDA_EMU"] = "1"
    try:
        dev = train(d, "pipe-cuda-ckpt", pipeline_job("cuda", 1, False))
        dev_cpu = train(d, "pipe-cuda-cpu-ckpt", pipeline_job("cuda", 1, True))
    finally:
        del os.environ["ZTRAIN_CUDA_EMU"]
    same(ck, "cuda: cpu_checkpointing against device checkpointing", dev, dev_cpu)
    # Layers embed, 4 blocks, head cut uniformly in two: 2 blocks a stage; 2 micro-batches.
    S, M, blocks, B, T, C = 2, 2, 2, 2, 32, 64
    before, after = device_allocated(d, "pipe-cuda-ckpt"), device_allocated(d, "pipe-cuda-cpu-ckpt")
    for s in range(S):
        buffers = max(2, min(S - s + 1, M))
        want = (buffers * blocks - 1) * r64(B * T * C * 4)
        ck.check(before[s] - after[s] == want,
                 f"stage {s}: cpu_checkpointing moves the kept inputs to the host: device bytes "
                 f"{before[s]} -> {after[s]}, lower by {before[s] - after[s]} (want {want})")


_cache = os.path.join(os.environ.get("ZTRAIN_BUILD", "build"), "CMakeCache.txt")
SANITIZED = os.path.exists(_cache) and "ZT_SANITIZE:BOOL=ON" in open(_cache).read()

ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(8000)))
    for model, stage, bf16 in ((GPT2, 0, False), (GPT2, 3, False), (LLAMA, 1, True)):
        tag = f"{model['type']}-z{stage}{'-bf16' if bf16 else ''}"
        base = job(model, stage, bf16)
        ref = train(d, tag, base)
        for every in (1, 2):
            spec = copy.deepcopy(base)
            spec["train"].update(activation_checkpointing=True,
                                 activation_checkpoint_interval=every)
            same(ck, f"{tag} checkpoint interval {every}", ref, train(d, f"{tag}-k{every}", spec))
        spec = copy.deepcopy(base)
        spec["training_args"] = {"gradient_checkpointing": True}
        spec["deepspeed"]["activation_checkpointing"] = {"cpu_checkpointing": True,
                                                         "partition_activations": True}
        got = train(d, f"{tag}-hf-cpu", spec)
        same(ck, f"{tag} gradient_checkpointing with cpu_checkpointing", ref, got)
        out = got[2].stdout + got[2].stderr
        ck.check("activation_checkpointing.partition_activations has no effect" in out,
                 f"{tag}: partition_activations warned")

    # AddressSanitizer's shadow memory adds an eighth to every page touched: no exact figure.
    base_rss, _ = peak_rss(d, "rss-plain", 0) if not SANITIZED else (0, 0)
    for every in (1, 3) if not SANITIZED else ():
        rss, want = peak_rss(d, f"rss-k{every}", every)
        print(f"checkpoint interval {every}: peak RSS {base_rss / 2**20:.1f} -> {rss / 2**20:.1f} "
              f"MiB, {(base_rss - rss) / 2**20:.1f} MiB lower; the formula says "
              f"{want / 2**20:.1f} MiB")
        ck.check(abs((base_rss - rss) - want) <= 0.1 * want,
                 f"interval {every}: peak RSS lower by the formula's bytes within 10%")

    check_pipeline(d)

    spec = job(GPT2, 0)
    spec["deepspeed"]["activation_checkpointing"] = {"cpu_checkpointing": True}
    spec["name"] = "warned"
    write_job(f"{d}/warned.json", spec)
    p = run([tool("ztrain"), "run", f"{d}/warned.json", "--out", f"{d}/warned"])
    ck.check("cpu_checkpointing has no effect: the job does not checkpoint activations"
             in p.stdout + p.stderr, "cpu_checkpointing without checkpointing is warned")

    spec = job(GPT2, 0)
    spec["train"]["activation_checkpoint_interval"] = 2
    spec["name"] = "refused"
    write_job(f"{d}/refused.json", spec)
    p = run([tool("ztrain"), "run", f"{d}/refused.json", "--out", f"{d}/refused"], check=False)
    ck.check(p.returncode != 0 and "train.activation_checkpoint_interval is 2 but activation "
             "checkpointing is off" in p.stderr, f"an interval alone is refused: {p.stderr!r}")
ck.done()
