"""Tensor parallelism on the CUDA backend, run on the emulated CUDA device (ZTRAIN_CUDA_EMU=1:
the CUDA module's own kernels and comm code, device memory the host cannot read, deferred
streams): GPT-2 (tied, vocabulary-parallel LM head) and Llama with grouped-query attention (8
heads, 4 kv heads, SwiGLU, untied head) at tp 2 on 2 ranks and at dp 2 x tp 2 on 4 ranks (ZeRO 1)
follow the single-rank CPU run of the same global batch (16 sequences a step) for 10 steps:
losses within 1e-6 relative, global gradient norms within 1e-5, and the final weights (the
shards' checkpoint exported as one whole model) within 1e-5 per tensor, test_tp_parity's
tolerances. The row-parallel all-reduces, the vocabulary-parallel loss's statistics and the
shared gradients of the replicated norms run on device memory through the comm layer's device
path; a rank that skipped one of them, or read a device pointer on the host, would fail here
(the emulator faults on a host read of device memory).

Measured on the 2-core CI machine: losses 9e-8, gradient norms 2e-7, weights 2e-6 at worst."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import BUILD, Checker  # noqa: E402
from tpref import GPT2, LLAMA, compare, job, train, write_text  # noqa: E402

if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
    print("SKIPPED: this build has no emulated CUDA device (-DZT_CUDA_EMU=OFF or no CUDA headers)")
    sys.exit(0)

EMU = {"ZTRAIN_CUDA_EMU": "1"}


def on_cuda(spec):
    spec["device"] = "cuda"
    return spec


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_text(d)
    for name, model in (("GPT-2", GPT2), ("Llama GQA", LLAMA)):
        key = name.split()[0].lower()
        ref = train(d, f"{key}-cpu", job(model, 1, 1, f"ck-{key}-cpu"))
        ck.check(ref[0][-1] < ref[0][0], f"{name}: the single-rank CPU loss falls")
        for tp, dp, zero in ((2, 1, 0), (2, 2, 1)):
            got = train(d, f"{key}-cuda-{dp}x{tp}",
                        on_cuda(job(model, tp, dp, f"ck-{key}-cuda-{dp}x{tp}", zero=zero)),
                        env=EMU)
            ck.check(got[3].count("emulated device") == tp * dp,
                     f"{name} dp {dp} x tp {tp}: every rank runs on the emulated CUDA device")
            compare(ck, f"{name} dp {dp} x tp {tp} on cuda (ZeRO {zero}) against one CPU rank",
                    ref, got)
ck.done()
