"""A GPU job's device memory against the formula (issue 28: memory per rank within 10% of weights
+ gradients + optimizer share + activations), on the emulated CUDA device (ZTRAIN_CUDA_EMU=1),
where every cudaMalloc goes through the emulator's allocator as it would through CUDA's, so the
bytes are a GPU's.

GPT-2 (4 layers, 192 channels, 3 heads, vocabulary 768, T 64, micro-batch 4) on two ranks, ZeRO
stages 0-3 in fp32 and bf16, and fp32 stage 0 with activation checkpointing: each rank's
memory/rank<r>/device_peak_bytes (the CUDA backend's high-water mark of its own allocations and
workspaces) must lie within 10% of the formula of tests/gpu/device_memory.py, computed from the
shapes alone: the ZeRO paper's model state (with mixed precision's fp32 working copy), the
ranges the CUDA backend releases but keeps allocated, one micro-batch's activations counted from
GPT-2's architecture, and the fixed workspaces the backend documents (cuBLASLt's 32 MiB). The
part above the fixed workspaces must also lie within 10% of the formula's (the whole is half
workspace at this size, so this is the check that sees a model-sized mistake). The parameter
count the formula starts from is checked against the GPT-2 shapes of the PyTorch reference
(ztref.gpt2_shapes).

Measured on the emulated device: every configuration within 0.05% of the formula, whole or
above the workspaces. The peak is printed beside admission's estimate (`ztrain estimate
--json`), whose terms are the engine's host accounting: it has no device figure of its own, and
its sum of the terms a GPU would hold lies under the measured device peak (by the cuBLASLt
workspace and the released ranges)."""
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import BUILD, Checker, gpt2_shapes, read_metrics, run, tool, write_job  # noqa: E402

if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
    print("SKIPPED: this build has no emulated CUDA device (-DZT_CUDA_EMU=OFF or no CUDA headers)")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "gpu"))
from device_memory import FIXED, MIB, describe, formula, gpt2_params  # noqa: E402

L, C, H, V, T, B, N = 4, 192, 3, 768, 64, 4, 2
MODEL = {"type": "gpt2", "n_layer": L, "n_head": H, "n_embd": C, "vocab_size": V, "block_size": T}
PSI = sum(int(math.prod(s)) for s in gpt2_shapes(L, C, V, T).values())

ck = Checker()
ck.check(gpt2_params(L, C, V, T) == PSI, f"the formula's Ψ {gpt2_params(L, C, V, T)} is the "
         f"reference shapes' {PSI}")
with tempfile.TemporaryDirectory(prefix="ztrain-devmem-") as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 3 + i // 7) % 256 for i in range(30000)))
    runs = [(s, prec, 0) for prec in (None, "bf16") for s in (0, 1, 2, 3)] + [(0, None, 1)]
    for stage, prec, every in runs:
        name = f"stage {stage} {prec or 'fp32'}" + (f", checkpointing every {every}" if every else "")
        ds = {"train_micro_batch_size_per_gpu": B,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": stage}}
        if prec:
            ds[prec] = {"enabled": True}
        train = {"max_steps": 1, "log_interval": 1}
        if every:
            train.update(activation_checkpointing=True, activation_checkpoint_interval=every)
        job = f"{d}/s{stage}{prec or 'fp32'}{every}.json"
        write_job(job, {"name": "devmem", "world_size": N, "device": "cuda",
                        "model": MODEL,
                        "data": {"train": "train.txt"}, "train": train, "deepspeed": ds})
        out = job[:-5]
        emu = dict(os.environ, ZTRAIN_CUDA_EMU="1")
        run([tool("ztrain"), "run", job, "--out", out], env=emu)
        # The estimate reads the job too, and a "cuda" job needs a CUDA module to be read: in a
        # build with the emulator alone that is the emulator.
        est = json.loads(run([tool("ztrain"), "estimate", "--json", job], env=emu).stdout)
        rec = read_metrics(f"{out}/metrics.jsonl")[-1]
        terms = formula(MODEL, B, N, stage, prec is not None, every)
        want = sum(terms.values())
        fixed = sum(v for k, v in terms.items() if k in FIXED)
        print(f"  {name}: formula {want / MIB:.2f} MiB = {describe(terms)}")
        est_device = sum(est[k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes",
                                          "workspace_bytes", "activation_bytes"))
        for r in range(N):
            peak = rec.get(f"memory/rank{r}/device_peak_bytes")
            now = rec.get(f"memory/rank{r}/device_allocated_bytes")
            has = peak is not None and now is not None and now <= peak
            ck.check(has, f"{name}, rank {r}: the record has device_peak_bytes and "
                          f"device_allocated_bytes, now <= peak ({now}, {peak})")
            if not has:
                continue
            ck.check(abs(peak - want) <= 0.10 * want,
                     f"{name}, rank {r}: device peak {peak / MIB:.2f} MiB, formula "
                     f"{want / MIB:.2f} MiB ({(peak / want - 1) * 100:+.2f}%)")
            ck.check(abs((peak - fixed) - (want - fixed)) <= 0.10 * (want - fixed),
                     f"{name}, rank {r}: above the fixed workspaces {(peak - fixed) / MIB:.2f} "
                     f"MiB, formula {(want - fixed) / MIB:.2f} MiB "
                     f"({((peak - fixed) / (want - fixed) - 1) * 100:+.2f}%)")
            if r == 0:
                print(f"      admission's estimate of the same terms (host accounting, fp32 "
                      f"activations): {est_device / MIB:.2f} MiB against the measured "
                      f"{peak / MIB:.2f} MiB")
    # A CPU job has no device figures: its record leaves them out rather than write zeros.
    write_job(f"{d}/cpu.json", {"name": "devmem-cpu", "world_size": N, "model": MODEL,
                                "data": {"train": "train.txt"},
                                "train": {"max_steps": 1, "log_interval": 1},
                                "deepspeed": {"train_micro_batch_size_per_gpu": B}})
    run([tool("ztrain"), "run", f"{d}/cpu.json", "--out", f"{d}/cpu"])
    rec = read_metrics(f"{d}/cpu/metrics.jsonl")[-1]
    ck.check("memory/rank1/params_bytes" in rec and not [k for k in rec if "/device_" in k],
             "a CPU job's record has its memory figures and no device_* ones")
ck.done()
