"""Tensor parallelism on the "nccl" transport on the emulated CUDA device (ZTRAIN_CUDA_EMU=1, an
emulated GPU per rank, the emulated device's NCCL between the ranks' processes): the TP groups,
the data-parallel groups beside them, a pipeline's groups and the group of the shards that share
a kv head are NCCL communicators of their own (engine/comm/comm_nccl.c), so every row-parallel
all-reduce, the vocabulary-parallel loss's all-gather and the shared gradients' sums run as NCCL
collectives posted on the stream. GPT-2 (tied, vocabulary-parallel head) and Llama with grouped-
query attention at tp 2 and at dp 2 x tp 2 (ZeRO 1), GPT-2 at pp 2 x tp 2 and pp 2 x dp 2 x tp 2
(eight ranks), and Llama with 2 kv
heads at tp 4 (a group of the TP group per kv head) follow the single-rank CPU run of the same
global batch for 10 steps within test_tp_parity's tolerances (losses 1e-6 relative, gradient
norms and final weights 1e-5); GPT-2 and Llama in bf16 at tp 2 follow the CPU's bf16 single rank
within its bf16 tolerances (losses 2e-3, weights 3e-2)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker  # noqa: E402
from tpref import (GPT2, LLAMA, compare, job, skip_without_emulator, train,  # noqa: E402
                   write_text)

skip_without_emulator()

KV2 = dict(LLAMA, n_kv_head=2)


def on_nccl(d, name, spec):
    """spec on the emulated device over nccl, a GPU per rank; what train() returns."""
    spec["device"] = "cuda"
    spec["comm"] = "nccl"
    world = spec["world_size"]
    got = train(d, name, spec, env={"ZTRAIN_CUDA_EMU": "1",
                                    "ZTRAIN_CUDA_EMU_DEVICES": str(world)})
    ck.check("comm transport nccl" in got[3] and got[3].count("(ztrain emulated device)") == world,
             f"{name}: every one of {world} ranks runs on an emulated GPU over nccl")
    return got


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_text(d)
    refs = {}
    for name, model in (("GPT-2", GPT2), ("Llama GQA", LLAMA)):
        key = name.split()[0].lower()
        refs[key] = ref = train(d, f"{key}-cpu", job(model, 1, 1, f"ck-{key}-cpu"))
        for tp, dp, zero in ((2, 1, 0), (2, 2, 1)):
            got = on_nccl(d, f"{key}-nccl-{dp}x{tp}",
                          job(model, tp, dp, f"ck-{key}-nccl-{dp}x{tp}", zero=zero))
            compare(ck, f"{name} dp {dp} x tp {tp} on nccl (ZeRO {zero}) against one CPU rank",
                    ref, got)
    # Two pipeline stages of tp 2: the stage, model-parallel and tied-weights groups on nccl too.
    got = on_nccl(d, "gpt2-nccl-pp", job(GPT2, 2, 1, "ck-gpt2-nccl-pp", zero=1, pp=2))
    compare(ck, "GPT-2 pp 2 x tp 2 on nccl, 4 micro-batches, against one CPU rank", refs["gpt-2"],
            got)
    # And two replicas of them (eight ranks): the stages' agreement on the step (losses, tokens,
    # the micro-batches' hashes) is a group of its own, every stage of every replica of one
    # shard, summed on the device.
    got = on_nccl(d, "gpt2-nccl-pp-dp", job(GPT2, 2, 2, "ck-gpt2-nccl-pp-dp", zero=1, pp=2))
    compare(ck, "GPT-2 pp 2 x dp 2 x tp 2 on nccl, against one CPU rank", refs["gpt-2"], got)
    # Two kv heads at tp 4: each kv head's two shards sum its gradients in a group of the TP group.
    kref = train(d, "kv2-cpu", job(KV2, 1, 1, "ck-kv2-cpu", zero=1))
    got = on_nccl(d, "kv2-nccl", job(KV2, 4, 1, "ck-kv2-nccl", zero=1))
    compare(ck, "Llama 2 kv heads at tp 4 on nccl (each kv head on 2 ranks) against one CPU rank",
            kref, got)
    for name, model in (("GPT-2", GPT2), ("Llama GQA", LLAMA)):
        key = name.split()[0].lower()
        bref = train(d, f"{key}-cpu-bf16", job(model, 1, 1, f"ck-{key}-bf16-cpu",
                                               precision="bf16"))
        got = on_nccl(d, f"{key}-nccl-bf16", job(model, 2, 1, f"ck-{key}-bf16-nccl", zero=1,
                                                 precision="bf16"))
        compare(ck, f"{name} bf16 tp 2 on nccl against one CPU rank in bf16", bref, got,
                loss_tol=2e-3, tol=3e-2)
ck.done()
