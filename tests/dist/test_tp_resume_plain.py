"""A checkpoint saved without tensor parallelism (no tp.json: an ordinary checkpoint directory of
a tp 1 job, ZeRO 1 on one rank or ZeRO 3 on two) resumes at tp 2 and tp 4, and a tensor-parallel
checkpoint at tp 1: every shard reads each whole tensor (weights, Adam moments) from the saved
checkpoint and takes its own piece, the counters, schedule and data position coming from its
meta.json (zt_ckpt_tp_load); the job's own saves then go to tp_<t>/ shard directories beside it.

- Resumed after 5 of 10 steps, each run follows the uninterrupted run at its new size within
  test_tp_parity's tolerances (losses 1e-6 relative, gradient norms and weights 1e-5): the first
  five steps were computed at another size, so bit-identity is not defined there.
- Right after loading (a run whose max_steps is the checkpoint's step loads and saves again
  without a step) the new checkpoint's whole tensors equal the old one's bit for bit, and going
  back (tp 1 -> tp 2 -> tp 1) continues bit-identically to the uninterrupted tp 1 run: nothing
  is lost, Adam moments, counters and data position included.
- GPT-2, two pipeline stages (each stage's directory resharded alike), and Llama with 2 kv heads
  at tp 4 (each kv head replicated on two ranks)."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, run, st_read, tool  # noqa: E402
from tpref import GPT2, LLAMA, compare, identical, job, train, write_text  # noqa: E402

KV2 = dict(LLAMA, n_kv_head=2)


def exported(d, ckpt):
    run([tool("ztrain"), "export", f"{d}/{ckpt}", "--out", f"{d}/{ckpt}.safetensors"])
    return st_read(f"{d}/{ckpt}.safetensors")[0]


def same_bits(ck, what, a, b):
    ck.check(sorted(a) == sorted(b) and all(a[k].shape == b[k].shape and (a[k] == b[k]).all()
                                            for k in a),
             f"{what}: every tensor bit for bit ({len(a)} tensors)")


def half(d, name, spec):
    """The first 5 steps of spec into its checkpoint directory."""
    spec["train"]["max_steps"] = 5
    train(d, name, spec, export=False)


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_text(d)
    ref = {tp: train(d, f"gpt2-tp{tp}", job(GPT2, tp, 1, f"ck-gpt2-tp{tp}", zero=1))
           for tp in (1, 2, 4)}

    # ---- without TP -> TP ---------------------------------------------------------------------
    half(d, "plain", job(GPT2, 1, 1, "ck-plain", zero=1))
    ck.check(not os.path.exists(f"{d}/ck-plain/tp.json"), "a tp 1 job saves an ordinary checkpoint")
    for tp in (2, 4):
        shutil.copytree(f"{d}/ck-plain", f"{d}/ck-plain-at{tp}")
        got = train(d, f"plain-at{tp}", job(GPT2, tp, 1, f"ck-plain-at{tp}", zero=1))
        ck.check("resumed from" in got[3] and "at step 5" in got[3],
                 f"the tp 1 checkpoint resumes at tp {tp} from step 5")
        compare(ck, f"GPT-2 tp 1 checkpoint resumed at tp {tp} against the uninterrupted tp {tp} "
                "run", ref[tp], got)

    # Loaded at tp 2 and saved again without a step: the same tensors, and back at tp 1 the
    # uninterrupted tp 1 run bit for bit.
    shutil.copytree(f"{d}/ck-plain", f"{d}/ck-round")
    mid = train(d, "round-to-2", job(GPT2, 2, 1, "ck-round", zero=1, steps=5), export=False)
    ck.check("resumed from" in mid[3] and not mid[0] and os.path.exists(f"{d}/ck-round/tp.json"),
             "the tp 1 checkpoint loaded at tp 2 and saved again as shards without a step")
    same_bits(ck, "tp 1 checkpoint loaded at tp 2: the weights right after loading",
              exported(d, "ck-plain"), exported(d, "ck-round"))
    got = train(d, "round-back-1", job(GPT2, 1, 1, "ck-round", zero=1))
    identical(ck, "GPT-2 tp 1 -> tp 2 -> tp 1", ref[1], got)

    # ZeRO 3 on two data-parallel ranks: the weights from the ranks' model shards, the moments
    # from their partitions.
    half(d, "plain-z3", job(GPT2, 1, 2, "ck-plain-z3", zero=3))
    got = train(d, "z3-at2", job(GPT2, 2, 1, "ck-plain-z3", zero=1))
    compare(ck, "GPT-2 tp 1 checkpoint of ZeRO 3 on 2 ranks resumed at tp 2 (ZeRO 1) against "
            "the uninterrupted tp 2 run", ref[2], got)

    # A pipeline's stages are checkpoint directories of their own: 2 stages saved without TP
    # resume as 2 stages of tp 2 (4 micro-batches a step).
    pref = train(d, "pipe-tp2", job(GPT2, 2, 1, "ck-pipe-tp2", zero=1, pp=2))
    half(d, "pipe-plain", job(GPT2, 1, 1, "ck-pipe-plain", zero=1, pp=2))
    got = train(d, "pipe-at2", job(GPT2, 2, 1, "ck-pipe-plain", zero=1, pp=2))
    compare(ck, "GPT-2 pp 2 x tp 1 checkpoint resumed at pp 2 x tp 2 against the uninterrupted "
            "pp 2 x tp 2 run", pref, got)

    # Llama with 2 kv heads at tp 4: each rank takes its replicated kv head from the whole one.
    kref = train(d, "kv2-tp4", job(KV2, 4, 1, "ck-kv2-tp4", zero=1))
    half(d, "kv2-plain", job(KV2, 1, 1, "ck-kv2-plain", zero=1))
    shutil.copytree(f"{d}/ck-kv2-plain", f"{d}/ck-kv2-load")
    train(d, "kv2-load", job(KV2, 4, 1, "ck-kv2-load", zero=1, steps=5), export=False)
    same_bits(ck, "Llama (2 kv heads) tp 1 checkpoint loaded at tp 4: the weights right after "
              "loading", exported(d, "ck-kv2-plain"), exported(d, "ck-kv2-load"))
    got = train(d, "kv2-at4", job(KV2, 4, 1, "ck-kv2-plain", zero=1))
    compare(ck, "Llama 2 kv heads, tp 1 checkpoint resumed at tp 4 against the uninterrupted "
            "tp 4 run", kref, got)

    # ---- TP -> without TP ---------------------------------------------------------------------
    half(d, "tp2", job(GPT2, 2, 1, "ck-tp2", zero=1))
    shutil.copytree(f"{d}/ck-tp2", f"{d}/ck-tp2-load")
    train(d, "tp2-load1", job(GPT2, 1, 1, "ck-tp2-load", zero=1, steps=5), export=False)
    same_bits(ck, "tp 2 checkpoint loaded at tp 1: the weights right after loading",
              exported(d, "ck-tp2"), exported(d, "ck-tp2-load"))
    got = train(d, "tp2-at1", job(GPT2, 1, 1, "ck-tp2", zero=1))
    compare(ck, "GPT-2 tp 2 checkpoint resumed at tp 1 against the uninterrupted tp 1 run",
            ref[1], got)
ck.done()
