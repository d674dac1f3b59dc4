"""The device memory one rank of a GPT-2 job should hold on the CUDA backend, from the shapes
alone (no engine code, no PyTorch): what tests/dist/test_cuda_device_memory.py checks on the
emulated device and tests/gpu/train_check.py's memory check on a GPU, against
memory/rank<r>/device_peak_bytes. docs/gpu.md ("Device memory") states the same terms.

The backend counts physical memory. An allocation of at least 8 MiB (four granules) is a
reserved range of 2 MiB granules, so it counts rounded up to whole granules (gran()), and a
granule ZeRO releases wholly is given back (kernels/cuda/memory/device_vmm.c); smaller
allocations are cudaMalloc's, counted as asked. Granules given back are reused by later allocations and commits
before new ones are made, so the peak is the most held at one moment, in one of two phases:

  setup: the model is made in fp32: its parameters whole, its gradients reserved but holding
  nothing (a large allocation, or any in mixed precision, where the ops write 16-bit gradients
  and the fp32 ones are never written; a small one in fp32 is held whole) until ZeRO commits
  what it writes
  (whole at stages 0-1 in fp32, per layer in the step otherwise); then ZeRO gives back what a
  step holds of the parameters only per layer before allocating its own buffers (their
  granules are reused): stage 3's parameters outside the rank's slice, and in mixed precision
  the whole fp32 parameters, once the 16-bit ones are made from them (at stage 3 only the
  slice's, the rest never held). So setup's moment is 4Ψ, plus stage 3's tensors kept whole
  in fp32, or in mixed precision the 16-bit parameters made beside them;

  step: the model state, plus what the step holds per layer: the fp32 parameters of the
  layers in use (fp32 stage 3: one block gathered at a time, a layer's fp32 copy going once
  the layer is done; none in mixed precision, whose ops read the 16-bit parameters: the CUDA
  backend's reads_param16, backend.h) and the fp32 gradients of the layers the backward
  writes (the outer tensors' from the forward's start, committed before the head's backward
  writes them; in mixed precision none: the ops add into 16-bit gradients (writes_grad16,
  backend.h), whole below stage 2, and from stage 2 held as the fp32 ones are in fp32, in
  2-byte elements;
  in fp32 at stages 2-3 the blocks of the bucket being filled and the one reduced before it,
  a bucket being ceil(reduce_bucket_size / block) blocks; all of them at stages 0-1 in fp32,
  which keep them whole anyway). Each is counted in whole granules of the flat buffer's
  layout ([token and position embeddings | blocks | final LayerNorm]), so a block costs the
  granules it touches; at stage 3 in mixed precision the 16-bit parameters are the rank's
  slice and the layers gathered beside it, counted the same way in 2-byte elements (the most
  over the ranks, whose slices lie differently).

Stage 3 gives back the parameters outside the rank's slice where a whole granule is outside
it. Tensors kept whole on every rank (stage3_param_persistence_threshold, 100000 elements by
default; GPT-2's biases, LayerNorms and position embedding) keep their values in a small buffer
of their own and are in the flat buffer only while their layer is in use, so they pin none of
its granules; that buffer counts as parameters (mixed precision ignores the threshold).

Terms (bytes), for Ψ parameters padded as ZeRO pads the flat buffer over N ranks:
  parameters: fp32 4Ψ, or 4Ψ/N at stage 3 and the tensors kept whole (plus the step's gathered
    blocks); mixed precision:
    the 16-bit parameters 2Ψ, or at stage 3 the slice 2Ψ/N and the layers gathered;
  gradients: fp32 4Ψ at stages 0-1; at 2-3 the fp32 partition 4Ψ/N; mixed precision: the 16-bit
    gradients 2Ψ (stages 0-1) or their partition 2Ψ/N and the buckets the backward writes (2-3);
  optimizer: Adam's two moments, and in mixed precision the fp32 masters, each 4Ψ (stage 0) or
    4Ψ/N (from stage 1), one allocation each;
  fp32 in use: what of the fp32 parameters and gradients the peak phase holds beyond those
    (setup: its moment above, less the terms above; step: the layers in use);
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


def gpt2_tensors(L, C, V, T):
    """The element counts of GPT-2's tensors: token and position embeddings, each block's (two
    LayerNorms' weights and biases, QKV, projection, FC and FC-projection weights and biases)
    and the final LayerNorm's."""
    block = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C]
    return [V * C, T * C] + block * L + [C, C]


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


GRANULE = 2 * MIB
VMM_MIN = 4 * GRANULE


def gran(nbytes):
    """What an allocation of nbytes holds: whole granules from VMM_MIN on, else itself."""
    return -(-nbytes // GRANULE) * GRANULE if nbytes >= VMM_MIN else nbytes


def _granules(a, b):
    """The granules [a, b) bytes of a flat buffer touch."""
    return set(range(a // GRANULE, (b - 1) // GRANULE + 1)) if b > a else set()


def _layers_held(L, C, V, T, psi, es, blocks, own=None):
    """Bytes of granules of a flat buffer of es-byte elements held by the outer tensors and
    `blocks` adjacent blocks (and the element range `own`, a rank's slice), the most over where
    those blocks lie."""
    block = 12 * C * C + 13 * C
    first = V * C + T * C
    outer = _granules(0, es * first) | _granules(es * (psi - 2 * C), es * psi)
    if own:
        outer |= _granules(es * own[0], es * own[1])
    blocks = min(blocks, L)
    most = len(outer)
    for l in range(L - blocks + 1):
        at = first + l * block
        most = max(most, len(outer | _granules(es * at, es * (at + blocks * block))))
    return most * GRANULE


def formula(model, micro_batch, world, stage, half, every=0, bucket=500000000,
            persistence=100000):
    """The named terms (bytes) of one rank's device memory for a GPT-2 model spec (n_layer,
    n_embd, n_head, vocab_size, block_size) trained with AdamW on `world` ranks, with
    zero_optimization's reduce_bucket_size `bucket` and stage3_param_persistence_threshold
    `persistence` (DeepSpeed's defaults)."""
    L, C, H = model["n_layer"], model["n_embd"], model["n_head"]
    V, T = model["vocab_size"], model["block_size"]
    n = world
    psi = gpt2_params(L, C, V, T)
    p = -(-psi // (16 * n)) * (16 * n)
    slice_ = p // n
    block = 12 * C * C + 13 * C
    # Blocks of fp32 gradients held in the step: the bucket filling and the one before it.
    grad_blocks = L if bucket >= p else -(-bucket // block) + 1
    opt = gran(4 * (slice_ if stage >= 1 else p))
    terms = {}
    # Setup: the fp32 parameters whole, and in fp32 the gradients where they are a small
    # allocation (a large one is reserved, holding nothing until committed; in mixed precision,
    # where the ops write 16-bit gradients, they are reserved at any size and never written).
    made = gran(4 * p) + (4 * p if 4 * p < VMM_MIN and not half else 0)
    if half:
        # The layers in use: the next one prefetched at stage 3 (overlap_comm, its default).
        k = 2 if stage == 3 and n > 1 else 1
        # Setup's moment: the 16-bit parameters made beside the fp32 ones (at stage 3 the
        # slice, the most granules over the ranks).
        if stage == 3 and 2 * p >= VMM_MIN:
            made += max(len(_granules(2 * r * slice_, 2 * (r + 1) * slice_))
                        for r in range(n)) * GRANULE
        else:
            made += gran(2 * p)
        if stage == 3:
            terms["parameters"] = max(
                _layers_held(L, C, V, T, p, 2, k, own=(r * slice_, (r + 1) * slice_))
                for r in range(n))
        else:
            terms["parameters"] = gran(2 * p)
        # The gradients the backward writes, in 16 bits (the CUDA backend's writes_grad16,
        # backend.h): whole below stage 2; from stage 2 the slice's accumulator and, in a
        # reserved buffer of their own, the blocks of the bucket being filled and the one
        # reduced before it, as the fp32 ones are held in fp32. The ops read the 16-bit
        # parameters, so a step holds no fp32 parameter or gradient: only setup's moment can
        # be higher.
        terms["gradients"] = gran(2 * (slice_ if stage >= 2 else p))
        if stage >= 2:
            terms["gradients"] += _layers_held(L, C, V, T, p, 2, grad_blocks)
        terms["optimizer"] = 3 * opt
        # The step holds the fp32 parameters where they are a small allocation, which a
        # release does not give back.
        terms["fp32 in use"] = max(made - sum(terms.values()), 4 * p if 4 * p < VMM_MIN else 0)
    else:
        terms["parameters"] = gran(4 * (slice_ if stage == 3 else p))
        kept = sum(t for t in gpt2_tensors(L, C, V, T) if t < persistence)
        if stage == 3 and kept:
            terms["kept whole"] = gran(4 * kept)
        terms["gradients"] = gran(4 * (slice_ if stage >= 2 else p))
        terms["optimizer"] = 2 * opt
        if stage == 3 and kept:
            made += gran(4 * kept)  # setup: made before the parameters outside the slice go
        if stage >= 2:
            # The step: the gradients the backward writes and (stage 3) the block gathered.
            step = _layers_held(L, C, V, T, p, 4, grad_blocks)
            if stage == 3:
                step += _layers_held(L, C, V, T, p, 4, 1)
            terms["fp32 in use"] = max(made - sum(terms.values()), step)
    terms["activations"] = gran(activations(L, C, H, V, T, micro_batch, 2 if half else 4, every))
    terms["cuBLASLt workspace"] = CUBLASLT_WORKSPACE
    terms["two-pass sums"] = SUMS
    if half:
        terms["ZeRO conversion chunk"] = ZERO_CHUNK
    return terms


def describe(terms):
    return " + ".join(f"{k} {v / MIB:.2f}" for k, v in terms.items())
