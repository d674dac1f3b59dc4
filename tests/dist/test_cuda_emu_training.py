"""Training with "device": "cuda" on the emulated CUDA device (ZTRAIN_CUDA_EMU=1, which loads
libztrain_cuda_emu.so: the CUDA backend's own kernels and module code, built by the host
compiler) against the CPU engine: GPT-2 at fp32, bf16 and fp16 on one rank, with activation
checkpointing, with the optimizer offloaded to pinned CPU memory (ZeRO 2, two ranks; in one tile
and in nine, bit for bit alike) and to NVMe
through pinned buffers (ZeRO 3), ZeRO stages 0-3 and two pipeline stages on two ranks (device
staging through shm) against one rank with the same global batch, Llama at fp32; a resume on
cuda bit for bit the uninterrupted cuda run; and a device fault injected into the optimizer kernel (ZTRAIN_CUDA_EMU_FAULT) failing the job
with the device's message instead of training on (issue 27, defect 1), and one met by the offloaded
update's wait for its first tile failing the job before that step is applied. Every cuda run checks that
nothing touches released device memory before committing it (CHECKED_VMM). Four steps each, small
models: what runs is the CUDA code path, not its speed."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))

from ztref import BUILD, Checker, check_losses, read_metrics, run, tool, write_job  # noqa: E402

STEPS = 4
# Every cuda run but one puts every allocation through CUDA VMM in granules of 4 KiB, so that each
# layer's ranges span many granules as a real model's do in 2 MiB ones, and in check mode: a
# release waits for the device and unmaps what it lets go of, so a read or write of released
# memory before its commit is a fault naming the granule, where a GPU would silently use memory
# another range holds.
CHECKED_VMM = {"ZTRAIN_CUDA_EMU": "1", "ZTRAIN_CUDA_VMM": "check",
               "ZTRAIN_CUDA_VMM_MIN_BYTES": "0",
               "ZTRAIN_CUDA_EMU_VMM_GRANULE": "4096"}
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 32}
LLAMA = {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 16,
         "tie_word_embeddings": False}

if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
    print("SKIPPED: this build has no emulated CUDA device (-DZT_CUDA_EMU=OFF or no CUDA headers)")
    sys.exit(0)


def job(name, device, world=1, micro=8, stage=0, model=GPT2, bf16=False, fp16=False,
        zero=None, train_opts=None, stages=1):
    ds = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": stages,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1,
                                                    "eps": 1e-4}},
          "gradient_clipping": 1.0, "zero_optimization": dict({"stage": stage}, **(zero or {}))}
    if bf16:
        ds["bf16"] = {"enabled": True}
    if fp16:
        ds["fp16"] = {"enabled": True, "initial_scale_power": 12}
    train_spec = dict({"max_steps": STEPS, "log_interval": 1, "seed": 5}, **(train_opts or {}))
    spec = {"name": name, "world_size": world, "device": device, "model": model,
            "data": {"train": "train.txt"}, "train": train_spec, "deepspeed": ds}
    if stages > 1:
        spec["pipeline"] = {"stages": stages}
    return spec


def train(d, spec, env_extra=None, check=True, checked=True):
    name = spec["name"]
    write_job(f"{d}/{name}.json", spec)
    env = dict(os.environ, **(CHECKED_VMM if checked else {"ZTRAIN_CUDA_EMU": "1"}),
               **(env_extra or {}))
    if not checked:  # the settings a GPU runs with: VMM from 8 MiB, release without a wait
        for k in CHECKED_VMM:
            if k != "ZTRAIN_CUDA_EMU":
                env.pop(k, None)
    p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], check=check,
            env=env, cwd=d)
    if not check:
        return p
    return [m["train/loss"] for m in read_metrics(f"{d}/{name}/metrics.jsonl")]


def close(ck, what, ref, got, tol):
    check_losses(ck, what, ref, got, tol, STEPS)


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    cpu = train(d, job("gpt2-cpu", "cpu"))
    ck.check(cpu[-1] < cpu[0], "the CPU loss falls")
    # fp32: the same formulas, the sums in another order (block reductions, cuBLASLt's k order).
    cuda = train(d, job("gpt2-cuda", "cuda"))
    # Once with the settings a GPU runs with (the resume below compares it with checked runs).
    ck.check(train(d, job("gpt2-cuda-default", "cuda"), checked=False) == cuda,
             "GPT-2 fp32 on cuda: the same losses with the default VMM settings as checked")
    # The attention implementation the CUDA backend chose is a record's field, once a run: the
    # emulated device has no cuDNN, so ztrain's flash kernel (0).
    said = [m["kernels/attention_cudnn"] for m in read_metrics(f"{d}/gpt2-cuda/metrics.jsonl")
            if "kernels/attention_cudnn" in m]
    ck.check(said == [0], f"the cuda run records its attention choice once, ztrain's flash "
             f"kernel: kernels/attention_cudnn {said}")
    close(ck, "GPT-2 fp32, 1 rank, cuda vs cpu", cpu, cuda, 1e-4)
    # The bias gradients came from cuBLASLt's BGRADA epilogue on the weight-gradient GEMMs
    # (GPT-2's W[C,OC]), recorded once (1); with ZTRAIN_CUDA_BIAS_GRAD=sums from the row-tile
    # sums (0), the losses as close to the CPU's; and a value the variable does not know is
    # refused by name before any step.
    def bias_said(name):
        return [m["kernels/bias_grad_epilogue"] for m in read_metrics(f"{d}/{name}/metrics.jsonl")
                if "kernels/bias_grad_epilogue" in m]
    ck.check(bias_said("gpt2-cuda") == [1], f"the cuda run records its bias gradients from the "
             f"epilogue once: kernels/bias_grad_epilogue {bias_said('gpt2-cuda')}")
    sums = train(d, job("gpt2-cuda-sums", "cuda"), env_extra={"ZTRAIN_CUDA_BIAS_GRAD": "sums"})
    close(ck, "GPT-2 fp32, 1 rank, cuda with the row-tile bias sums vs cpu", cpu, sums, 1e-4)
    ck.check(bias_said("gpt2-cuda-sums") == [0], f"with ZTRAIN_CUDA_BIAS_GRAD=sums the record "
             f"says the sums: kernels/bias_grad_epilogue {bias_said('gpt2-cuda-sums')}")
    p = train(d, job("gpt2-cuda-badbias", "cuda"), env_extra={"ZTRAIN_CUDA_BIAS_GRAD": "often"},
              check=False)
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0 and "ZTRAIN_CUDA_BIAS_GRAD" in out and "often" in out and
             '"sums"' in out, f"ZTRAIN_CUDA_BIAS_GRAD=often is refused naming the variable and "
             f"its values (exit {p.returncode}): {out.strip()[-300:]}")
    # The host's time blocked waiting for the device, a step's part of its time: on the emulated
    # device, which runs the queued work when the host waits, nearly all of it; no such figure
    # on the CPU.
    steps = [m for m in read_metrics(f"{d}/gpt2-cuda/metrics.jsonl")
             if "perf/rank0/step_time_ms" in m]
    waits = [(m.get("perf/rank0/device_wait_ms"), m["perf/rank0/step_time_ms"]) for m in steps]
    ck.check(len(waits) == STEPS and all(w is not None and 0 < w <= t for w, t in waits),
             f"each cuda step records the host's wait for the device, within the step: {waits}")
    ck.check(not any("perf/rank0/device_wait_ms" in m
                     for m in read_metrics(f"{d}/gpt2-cpu/metrics.jsonl")),
             "a CPU run records no device wait")
    # Resume on cuda: 2 steps and their checkpoint, then the rest from it in a second run, bit
    # for bit the uninterrupted run (weights, optimizer state, data position and RNG restored
    # into device memory).
    ckpt = {"checkpoint_dir": f"{d}/ckpt-split"}
    train(d, job("gpt2-cuda-split", "cuda", train_opts=dict(ckpt, bench_steps=2)))
    split = train(d, job("gpt2-cuda-split", "cuda", train_opts=dict(ckpt, resume=True)))
    ck.check(split == cuda, f"GPT-2 fp32 on cuda resumed after step 2 equals the uninterrupted run "
             f"bit for bit ({split} vs {cuda})")
    cpu_bf = train(d, job("gpt2-cpu-bf16", "cpu", bf16=True))
    close(ck, "GPT-2 bf16, 1 rank, cuda vs cpu", cpu_bf,
          train(d, job("gpt2-cuda-bf16", "cuda", bf16=True)), 2e-3)
    cpu_fp16 = train(d, job("gpt2-cpu-fp16", "cpu", fp16=True))
    close(ck, "GPT-2 fp16, 1 rank, cuda vs cpu", cpu_fp16,
          train(d, job("gpt2-cuda-fp16", "cuda", fp16=True)), 2e-3)
    close(ck, "GPT-2 fp32 with activation checkpointing, cuda vs cpu without", cpu,
          train(d, job("gpt2-cuda-ac", "cuda", train_opts={"activation_checkpointing": True})),
          1e-4)
    pinned_cpu = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    off = train(d, job("gpt2-cuda-off", "cuda", world=2, micro=4, stage=2, zero=pinned_cpu))
    close(ck, "GPT-2 fp32, ZeRO 2 with the optimizer offloaded to pinned CPU memory, 2 ranks on "
          "cuda vs 1 rank on cpu", cpu, off, 1e-4)
    # In tiles of 2,048 elements (nine a rank): each tile's copies are issued while the host
    # updates the tile before, through two sets of pinned buffers taken in turn. The update is
    # element by element, so the losses are the one-tile run's bit for bit.
    tiled = train(d, job("gpt2-cuda-off-tiles", "cuda", world=2, micro=4, stage=2,
                         zero=dict(pinned_cpu, sub_group_size=2048)))
    ck.check(tiled == off, f"GPT-2 fp32, ZeRO 2 offloaded in 9 tiles a rank on cuda equals the "
             f"one-tile run bit for bit ({tiled} vs {off})")
    os.makedirs(f"{d}/nvme")
    pinned_nvme = {"offload_optimizer": {"device": "nvme", "nvme_path": f"{d}/nvme",
                                         "pin_memory": True}}
    close(ck, "GPT-2 fp32, ZeRO 3 with the optimizer on NVMe through pinned buffers, cuda vs cpu",
          cpu, train(d, job("gpt2-cuda-nvme", "cuda", stage=3, zero=pinned_nvme)), 1e-4)
    for stage in (0, 1, 2, 3):
        got = train(d, job(f"gpt2-cuda-z{stage}", "cuda", world=2, micro=4, stage=stage))
        close(ck, f"GPT-2 fp32, ZeRO stage {stage}, 2 ranks on cuda vs 1 rank on cpu", cpu, got,
              1e-4)
    # Two pipeline stages: activations and their gradients cross from one rank's device memory
    # to the other's, staged through host memory over shm (the global batch is the same 8
    # sequences, as 2 micro-batches of 4).
    close(ck, "GPT-2 fp32, 2 pipeline stages on cuda vs 1 rank on cpu", cpu,
          train(d, job("gpt2-cuda-pipe", "cuda", world=2, micro=4, stages=2)), 1e-4)
    # In bf16 each micro-batch's outer gradients are added into the 16-bit ones and let go at
    # the end of its backward, and the first stage runs the second micro-batch's forward before
    # the first one's backward: the second backward must commit them again (a write into the
    # released memory faults in this check mode).
    close(ck, "GPT-2 bf16, 2 pipeline stages on cuda vs 1 rank on cpu", cpu_bf,
          train(d, job("gpt2-cuda-pipe-bf16", "cuda", world=2, micro=4, stages=2, bf16=True)),
          2e-3)
    cpu_llama = train(d, job("llama-cpu", "cpu", model=LLAMA))
    close(ck, "Llama fp32, 1 rank, cuda vs cpu", cpu_llama,
          train(d, job("llama-cuda", "cuda", model=LLAMA)), 1e-4)
    # A device fault in the second optimizer launch: the step that meets it fails the job.
    p = train(d, job("gpt2-fault", "cuda"), {"ZTRAIN_CUDA_EMU_FAULT": "adam_mixed_kernel:2"},
              check=False)
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0 and "cuda device 0" in out and "ZTRAIN_CUDA_EMU_FAULT" in out,
             f"an injected device fault fails the job naming the device (exit {p.returncode})")
    done = [m for m in read_metrics(f"{d}/gpt2-fault/metrics.jsonl") if "train/loss" in m] \
        if os.path.exists(f"{d}/gpt2-fault/metrics.jsonl") else []
    ck.check(len(done) <= 2, f"no step is logged after the fault ({len(done)} logged)")
    if p.returncode == 0 or "ZTRAIN_CUDA_EMU_FAULT" not in out:
        sys.stderr.write(out[-3000:])
    # A device fault after the step's read and before the offloaded update's copies: the
    # clipping's scale, at its second launch, which is in the second step whose norm (in the
    # tiled run above, the same job) is over gradient_clipping. The wait for the first tile's
    # copies meets it, and the job stops before that step is applied (a wait that missed it
    # would apply the step from what the faulted device left, and log it).
    clipped = [i + 1 for i, m in enumerate(
        m for m in read_metrics(f"{d}/gpt2-cuda-off-tiles/metrics.jsonl") if "train/grad_norm" in m)
        if m["train/grad_norm"] > 1.0]
    faulted = clipped[1] if len(clipped) > 1 else None
    ck.check(faulted is not None, f"two steps of the tiled run clip their gradients: {clipped}")
    p = train(d, job("gpt2-off-fault", "cuda", world=2, micro=4, stage=2,
                     zero=dict(pinned_cpu, sub_group_size=2048)),
              {"ZTRAIN_CUDA_EMU_FAULT": "scale_kernel:2"}, check=False)
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0 and "cuda device 0" in out and "ZTRAIN_CUDA_EMU_FAULT" in out,
             f"a device fault before the offloaded update fails the job naming the device "
             f"(exit {p.returncode})")
    done = [m for m in read_metrics(f"{d}/gpt2-off-fault/metrics.jsonl") if "train/loss" in m] \
        if os.path.exists(f"{d}/gpt2-off-fault/metrics.jsonl") else []
    ck.check(faulted is not None and len(done) == faulted - 1,
             f"the offloaded update of the faulted step {faulted} is not applied: {len(done)} "
             f"steps logged")
    if p.returncode == 0 or "ZTRAIN_CUDA_EMU_FAULT" not in out:
        sys.stderr.write(out[-3000:])
ck.done()
