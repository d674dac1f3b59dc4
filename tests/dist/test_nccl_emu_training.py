"""Training on the "nccl" transport ("comm": "nccl" in the job spec) on the emulated CUDA device,
whose NCCL (kernels/cuda/emu/emu_nccl.cc) joins the ranks' processes through /dev/shm: GPT-2 at
ZeRO stages 0-3, fp32 and bf16, and two pipeline stages, on two ranks, each with an emulated GPU
of its own (ZTRAIN_CUDA_EMU_DEVICES=2, as NCCL needs a GPU per rank).

References: fp32 against one CPU rank with the same global batch (the tolerance of the other
emulated-device parity tests, 1e-4); bf16 against the same two ranks on the CPU (2e-3). And
against the same job on the emulated device over shm, which stages through host memory and adds
16-bit values in fp32 with one rounding: at two ranks NCCL's sum rounded at each step is one
rounding of the exact sum too (and its average halves exactly first), so the losses must be the
same bits. At three ranks the two roundings may differ: the test prints by how much and holds
the bf16 tolerance."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))

from ztref import BUILD, Checker, check_losses, read_metrics, run, tool, worst_loss_err, write_job  # noqa: E402

STEPS = 4
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 32}

if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
    print("SKIPPED: this build has no emulated CUDA device (-DZT_CUDA_EMU=OFF or no CUDA headers)")
    sys.exit(0)


def job(name, device, world, stage=0, bf16=False, comm=None, stages=1):
    # A global batch of 12 sequences: over the data-parallel ranks, or as the micro-batches of a
    # pipeline.
    ds = {"train_micro_batch_size_per_gpu": 12 // world, "gradient_accumulation_steps": stages,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1,
                                                    "eps": 1e-4}},
          "gradient_clipping": 1.0, "zero_optimization": {"stage": stage}}
    if bf16:
        ds["bf16"] = {"enabled": True}
    spec = {"name": name, "world_size": world, "device": device, "model": GPT2,
            "data": {"train": "train.txt"},
            "train": {"max_steps": STEPS, "log_interval": 1, "seed": 5}, "deepspeed": ds}
    if comm:
        spec["comm"] = comm
    if stages > 1:
        spec["pipeline"] = {"stages": stages}
    return spec


def train(d, spec, devices=2):
    name = spec["name"]
    write_job(f"{d}/{name}.json", spec)
    env = dict(os.environ, ZTRAIN_CUDA_EMU="1", ZTRAIN_CUDA_EMU_DEVICES=str(devices))
    p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], env=env, cwd=d)
    if spec.get("comm") == "nccl":
        out = p.stdout + p.stderr
        assert "comm transport nccl" in out, f"{name} did not run on nccl:\n{out[-2000:]}"
    return [m["train/loss"] for m in read_metrics(f"{d}/{name}/metrics.jsonl")]


def close(ck, what, ref, got, tol):
    check_losses(ck, what, ref, got, tol, STEPS)


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    cpu = train(d, job("cpu", "cpu", 1))
    for stage in (0, 1, 2, 3):
        got = train(d, job(f"nccl-z{stage}", "cuda", 2, stage, comm="nccl"))
        close(ck, f"GPT-2 fp32, ZeRO {stage}, 2 ranks on nccl (emulated) vs 1 rank on cpu", cpu,
              got, 1e-4)
        shm = train(d, job(f"shm-z{stage}", "cuda", 2, stage, comm="shm"))
        ck.check(got == shm, f"GPT-2 fp32, ZeRO {stage}: nccl {got} and shm {shm} on the "
                 "emulated device are the same bits (one rounding of a 2-term sum each)")
        cpu_bf = train(d, job(f"cpu-bf16-z{stage}", "cpu", 2, stage, bf16=True))
        got = train(d, job(f"nccl-bf16-z{stage}", "cuda", 2, stage, bf16=True, comm="nccl"))
        close(ck, f"GPT-2 bf16, ZeRO {stage}, 2 ranks on nccl (emulated) vs 2 ranks on cpu",
              cpu_bf, got, 2e-3)
        shm = train(d, job(f"shm-bf16-z{stage}", "cuda", 2, stage, bf16=True, comm="shm"))
        ck.check(got == shm, f"GPT-2 bf16, ZeRO {stage}: nccl {got} and shm {shm} on the "
                 "emulated device are the same bits (at two ranks both round the exact sum once)")
    # Two pipeline stages: activations and their gradients go from device memory to device
    # memory as NCCL messages (posted, their headers checked when the step's wait retires them).
    got = train(d, job("nccl-pipe", "cuda", 2, comm="nccl", stages=2))
    close(ck, "GPT-2 fp32, 2 pipeline stages on nccl (emulated) vs 1 rank on cpu", cpu, got, 1e-4)
    shm = train(d, job("shm-pipe", "cuda", 2, comm="shm", stages=2))
    ck.check(got == shm, f"GPT-2 fp32, 2 pipeline stages: nccl {got} and shm {shm} on the "
             "emulated device are the same bits")
    # Three ranks: NCCL's bf16 sum rounds after each addition, shm's once after an fp32 sum.
    nccl3 = train(d, job("nccl-bf16-3", "cuda", 3, 2, bf16=True, comm="nccl"), devices=3)
    shm3 = train(d, job("shm-bf16-3", "cuda", 3, 2, bf16=True, comm="shm"), devices=3)
    cpu3 = train(d, job("cpu-bf16-3", "cpu", 3, 2, bf16=True))
    close(ck, "GPT-2 bf16, ZeRO 2, 3 ranks on nccl (emulated) vs 3 ranks on cpu", cpu3, nccl3,
          2e-3)
    print(f"bf16 ZeRO 2, 3 ranks: nccl vs shm on the emulated device, worst rel loss difference "
          f"{worst_loss_err(shm3, nccl3):.2e} (nccl {nccl3}, shm {shm3})")
ck.done()
