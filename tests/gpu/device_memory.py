"""The device memory one rank of a GPT-2 job should hold on the CUDA backend, from the shapes
alone (no engine code, no PyTorch): what tests/dist/test_cuda_device_memory.py checks on the
emulated device and tests/gpu/train_check.py's memory check on a GPU, against
memory/rank<r>/device_peak_bytes. docs/gpu.md ("Device memory") states the same terms.

  model state, the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3.1) for Ψ
  parameters (padded as ZeRO pads the flat buffer) over N ranks: 2 + 2 + 12 bytes a parameter in
  mixed precision (16-bit parameters and gradients, fp32 masters and Adam's two moments), 4 + 4
  + 8 in fp32; the optimizer share partitioned from stage 1, gradients from 2, parameters at 3;
  + the fp32 working copy (mixed precision): the model's fp32 parameters and gradients, whole,
    which the CUDA kernels compute in beside the 16-bit copy (8Ψ);
  + released but still allocated: the CUDA backend's release zeroes a range and keeps its memory
    (no virtual-memory unmapping yet, backend.h), so what ZeRO gives back stays: the whole flat
    fp32 gradient buffer at stages 2-3 in fp32 (beside the reduce-scattered slice), and the
    parameters outside the rank's slice at stage 3 (fp32, or 16-bit in mixed precision);
  + one micro-batch's activations, counted from the architecture (activations());
  + the fixed workspaces the backend documents: cuBLASLt's 32 MiB, the two-pass sums' partials
    ((2 · 1024 + 2) doubles), and in mixed precision ZeRO's conversion chunk (64 Ki floats).

Activations a GPT-2 block's backward needs, in the activation type (4 bytes, 2 in bf16) unless
said: the LayerNorm outputs that feed the QKV and FC products (2 · BTC) and their fp32 means and
reciprocal deviations (4 · BT), q, k, v (3 · BTC), the attention output that feeds the
projection (BTC) and flash attention's fp32 log-sum-exp per row and head (B · H · T: no T × T
matrix), the residual after attention (BTC, LayerNorm 2's input), the FC pre-activation
(4 · BTC, GELU's backward) and GELU's output (4 · BTC, the FC projection's input), and the
block's output (BTC, the next block's input): 16 · BTC a block. Besides: the embedding's output
(the first block's input), the final LayerNorm's output and statistics, the logits (B · T · V,
their gradient written in place by the fused loss) and fp32 per-token losses; and the
backward's own buffers, the residual stream's gradient (BTC) and the gradients of one block's
intermediates (FC 4 · BTC, QKV 3 · BTC, attention output BTC, LayerNorm output BTC, flash
attention's per-row fp32 term B · H · T). With activation checkpointing every k blocks, the
blocks keep each group's input (ceil(L / k) · BTC) and k blocks' tensors, recomputed in the
backward."""
import math

MIB = 1 << 20
CUBLASLT_WORKSPACE = 32 * MIB
SUMS = (2 * 1024 + 2) * 8
ZERO_CHUNK = 4 * (1 << 16)
FIXED = ("cuBLASLt workspace", "two-pass sums", "ZeRO conversion chunk")


def gpt2_params(L, C, V, T):
    """Ψ of a GPT-2 with tied embeddings: token and position embeddings, per block two
    LayerNorms (weight, bias), the QKV, projection, FC and FC-projection products with biases,
    and the final LayerNorm."""
    block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return V * C + T * C + L * block + 2 * C


def activations(L, C, H, V, T, B, es, every=0):
    """Device bytes of one micro-batch's activations, activation elements of es bytes."""
    BT, f32 = B * T, 4
    BTC = BT * C
    block = es * 16 * BTC + f32 * (4 * BT + B * H * T)
    if every:
        kept = min(every, L) * block + es * math.ceil(L / every) * BTC
    else:
        kept = L * block + es * BTC
    head = es * BTC + f32 * 2 * BT + es * BT * V + f32 * BT
    backward = es * BTC + es * (4 + 3 + 1 + 1) * BTC + f32 * B * H * T
    return kept + head + backward


def formula(model, micro_batch, world, stage, half, every=0):
    """The named terms (bytes) of one rank's device memory for a GPT-2 model spec (n_layer,
    n_embd, n_head, vocab_size, block_size) trained with AdamW on `world` ranks."""
    L, C, H = model["n_layer"], model["n_embd"], model["n_head"]
    V, T = model["vocab_size"], model["block_size"]
    n = world
    p = -(-gpt2_params(L, C, V, T) // (16 * n)) * (16 * n)
    P, K = (2, 12) if half else (4, 8)
    terms = {
        "parameters": P * (p / n if stage == 3 else p),
        "gradients": P * (p / n if stage >= 2 else p),
        "optimizer": K * (p / n if stage >= 1 else p),
    }
    if half:
        terms["fp32 working copy"] = 8 * p
    held = (4 * p if not half and stage >= 2 else 0) + (P * (p - p / n) if stage == 3 else 0)
    if held:
        terms["released, still allocated"] = held
    terms["activations"] = activations(L, C, H, V, T, micro_batch, 2 if half else 4, every)
    terms["cuBLASLt workspace"] = CUBLASLT_WORKSPACE
    terms["two-pass sums"] = SUMS
    if half:
        terms["ZeRO conversion chunk"] = ZERO_CHUNK
    return terms


def describe(terms):
    return " + ".join(f"{k} {v / MIB:.2f}" for k, v in terms.items())
