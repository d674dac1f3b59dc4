"""A GPU job's device memory against the formula (issue 28: memory per rank within 10% of weights
+ gradients + optimizer share + activations), on the emulated CUDA device (ZTRAIN_CUDA_EMU=1),
where every cudaMalloc goes through the emulator's allocator as it would through CUDA's, so the
bytes are a GPU's.

GPT-2 (4 layers, 192 channels, 3 heads, vocabulary 768, T 64, micro-batch 4) on two ranks, ZeRO
stages 0-3 in fp32 and bf16, and fp32 stage 0 with activation checkpointing: each rank's
memory/rank<r>/device_peak_bytes (the CUDA backend's high-water mark of its own allocations and
workspaces) must lie within 10% of the formula below, and so must the part of it above the fixed
workspaces (the whole is half workspace at this size, so the second check is the one that sees a
model-sized mistake). The formula is computed here from the shapes, never from engine code:

  model state, the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3.1) for Ψ
  parameters over N ranks, 2 + 2 + K bytes a parameter in mixed precision (16-bit parameters
  and gradients; K = 12: fp32 masters, Adam's two moments), 4 + 4 + 8 in fp32; the optimizer
  share partitioned from stage 1, gradients from 2, parameters at 3;
  + the fp32 working copy (mixed precision): the model's fp32 parameters and gradients, whole,
    which the CUDA kernels compute in beside the 16-bit twin (8Ψ);
  + released but still allocated: the CUDA backend's release zeroes a range and keeps its memory
    (no virtual-memory unmapping yet, backend.h), so the ranges ZeRO gives back stay: the whole
    flat fp32 gradient buffer at stages 2-3 in fp32 (beside the reduce-scattered slice), the
    parameters outside the rank's slice at stage 3 (fp32, or 16-bit in mixed precision);
  + activations of one micro-batch, counted from the architecture (below);
  + fixed workspaces the backend documents (docs/gpu.md): cuBLASLt's 32 MiB, the two-pass sums'
    partials ((2 · 1024 + 2) doubles), and in mixed precision ZeRO's 64 Ki-float conversion chunk.

Activations a GPT-2 block's backward needs, in the activation type (4 bytes, 2 in bf16) unless
said: the LayerNorm outputs that feed the QKV and FC products (2 · BTC) and their fp32 means and
reciprocal deviations (4 · BT), q, k, v (3 · BTC), the attention output that feeds the
projection (BTC) and flash attention's fp32 log-sum-exp per (row, head) (B · H · T, no T×T
matrix), the residual after attention (BTC, LayerNorm 2's input), the FC pre-activation (4 · BTC,
GELU's backward) and GELU's output (4 · BTC, the FC projection's input), and the block's output
(BTC, the next block's LayerNorm input): 16 · BTC a block. The embedding's output (the first
block's input), the final LayerNorm's output and statistics, the logits (B · T · V, their
gradient written in place by the fused loss) and fp32 per-token losses. The backward's own
buffers: the residual stream's gradient (BTC) and the gradients of one block's intermediates
(FC 4 · BTC, QKV 3 · BTC, attention output BTC, LayerNorm output BTC, and flash attention's
per-row fp32 term B · H · T). With activation checkpointing every block, the blocks keep only
their inputs (L · BTC) and one block's 16 · BTC, recomputed in the backward.

The measured peak is also printed beside admission's estimate (`ztrain estimate --json`), whose
terms describe host memory (it has no device figure of its own)."""
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

L, C, H, V, T, B, N = 4, 192, 3, 768, 64, 4, 2
MIB = 1 << 20
CUBLASLT_WORKSPACE = 32 * MIB
SUMS = (2 * 1024 + 2) * 8
ZERO_CHUNK = 4 * (1 << 16)

PSI = sum(int(math.prod(s)) for s in gpt2_shapes(L, C, V, T).values())
# ZeRO pads the flat buffer so every rank's slice has a multiple of 16 elements.
PSI_PAD = -(-PSI // (16 * N)) * (16 * N)


def activations(es, every=0):
    """Device bytes of one micro-batch's activations, in activation elements of es bytes."""
    BT, f32 = B * T, 4
    BTC = BT * C
    block = es * 16 * BTC + f32 * (4 * BT + B * H * T)
    if every:
        kept = every * block + es * math.ceil(L / every) * BTC
    else:
        kept = L * block + es * BTC  # every block's tensors and the embedding's output
    head = es * BTC + f32 * 2 * BT + es * BT * V + f32 * BT
    backward = es * BTC + es * (4 + 3 + 1 + 1) * BTC + f32 * B * H * T
    return kept + head + backward


def formula(stage, half, every=0):
    """The named terms of one rank's device bytes."""
    p, n = PSI_PAD, N
    P = 2 if half else 4
    K = 12 if half else 8
    terms = {
        "parameters": P * (p / n if stage == 3 else p),
        "gradients": P * (p / n if stage >= 2 else p),
        "optimizer": K * (p / n if stage >= 1 else p),
    }
    if half:
        terms["fp32 working copy"] = 8 * p
    held = 0
    if not half and stage >= 2:
        held += 4 * p
    if stage == 3:
        held += P * (p - p / n)
    if held:
        terms["released, still allocated"] = held
    terms["activations"] = activations(2 if half else 4, every)
    terms["cuBLASLt workspace"] = CUBLASLT_WORKSPACE
    terms["two-pass sums"] = SUMS
    if half:
        terms["ZeRO conversion chunk"] = ZERO_CHUNK
    return terms


FIXED = ("cuBLASLt workspace", "two-pass sums", "ZeRO conversion chunk")

ck = Checker()
print(f"GPT-2 L {L}, C {C}, heads {H}, V {V}, T {T}, micro-batch {B}, {N} ranks: "
      f"Ψ = {PSI} ({PSI_PAD} padded)")
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
                        "model": {"type": "gpt2", "n_layer": L, "n_head": H, "n_embd": C,
                                  "vocab_size": V, "block_size": T},
                        "data": {"train": "train.txt"}, "train": train, "deepspeed": ds})
        out = job[:-5]
        run([tool("ztrain"), "run", job, "--out", out],
            env=dict(os.environ, ZTRAIN_CUDA_EMU="1"))
        est = json.loads(run([tool("ztrain"), "estimate", "--json", job]).stdout)
        rec = read_metrics(f"{out}/metrics.jsonl")[-1]
        terms = formula(stage, prec is not None, every)
        want = sum(terms.values())
        fixed = sum(v for k, v in terms.items() if k in FIXED)
        print(f"  {name}: formula {want / MIB:.2f} MiB = " +
              " + ".join(f"{k} {v / MIB:.2f}" for k, v in terms.items()))
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
ck.done()
