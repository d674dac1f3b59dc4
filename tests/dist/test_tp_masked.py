"""Fine-tuning data with a loss mask and packed documents (data.format "masked",
docs/fine-tuning.md) under tensor parallelism gives the single-rank trajectory: GPT-2 and Llama
(2 kv heads) at tp 2, tp 4 (ZeRO 1) and dp 2 x tp 2 (ZeRO 2), for the same global batch of 16
sequences, with 60% of the targets trained and documents of 2 to 11 tokens packed into each
row (the attention and positions restart at each document's first token); GPT-2 also with 2
pipeline stages of tp 2; and packing "padded" (one document per row) at dp 2 x tp 2.

Every TP rank of a replica reads the same rows, masks and documents; the vocabulary-parallel
cross-entropy gives a masked target no loss and no gradient on every shard (the target is
ignored before the shards' statistics are combined), and the step's loss is the mean over the
global batch's trained targets, whose count is summed over the data-parallel group only (the
TP ranks would count each target tp times). The single-rank masked run is test_sft_train's,
proven there against PyTorch; here fp32 within test_tp_parity's tolerances (losses 1e-6,
gradient norms and weights 1e-5; measured 1e-7 and 1e-6), and each step's trained-token count
(train/trained_tokens) equal to the single rank's. The mask matters: the same data without it
trains elsewhere (losses differing by more than 1e-3)."""
import os
import random
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, write_llmc_tokens  # noqa: E402
from tpref import GLOBAL, GPT2, LLAMA, compare, job, train  # noqa: E402

N = 20000


def write_data(d):
    """train.bin (llm.c tokens) and its mask: 60% of the targets trained, a document start every
    2 to 11 tokens (the mask's bit 0 and bit 1, after a 256-int32 header: magic 20261204,
    version 1, count)."""
    rng = random.Random(7)
    write_llmc_tokens(f"{d}/train.bin", [(i * 7 + i // 13) % 251 for i in range(N)])
    trained = [rng.random() < 0.6 for _ in range(N)]
    starts, p = [False] * N, 0
    while p < N:
        starts[p] = True
        p += rng.randint(2, 11)
    header = [20261204, 1, N] + [0] * 253
    with open(f"{d}/train.bin.mask", "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(bytes((1 if t else 0) | (2 if s else 0) for t, s in zip(trained, starts)))


def trained_tokens(d, name):
    return [m["train/trained_tokens"] for m in read_metrics(f"{d}/{name}/metrics.jsonl")
            if "train/trained_tokens" in m]


MASKED = {"train": "train.bin", "shuffle": True, "format": "masked"}
ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_data(d)
    for mname, model in (("GPT-2", GPT2), ("Llama", dict(LLAMA, n_kv_head=2))):
        ref = train(d, f"{mname}-1", job(model, 1, 1, f"ck-{mname}-1", data=MASKED))
        counts = trained_tokens(d, f"{mname}-1")
        ck.check(len(counts) == len(ref[0]) and all(0 < c < GLOBAL * 16 for c in counts),
                 f"{mname}: the single rank trains part of each step's {GLOBAL * 16} targets "
                 f"({counts[:3]}...)")
        plain = train(d, f"{mname}-plain", job(model, 1, 1, f"ck-{mname}-plain",
                                                data=dict(MASKED, format="tokens")))
        diff = max(abs(a - b) / abs(b) for a, b in zip(plain[0][1:], ref[0][1:]))
        ck.check(diff > 1e-3, f"{mname}: the mask changes the trajectory (losses differ by "
                 f"{diff:.1e} without it)")
        for tp, dp, zero in ((2, 1, 0), (4, 1, 1), (2, 2, 2)):
            name = f"{mname}-tp{tp}-dp{dp}"
            got = train(d, name, job(model, tp, dp, f"ck-{name}", zero=zero, data=MASKED))
            compare(ck, f"{mname} masked and packed, dp {dp} x tp {tp}, ZeRO {zero}", ref, got)
            ck.check(trained_tokens(d, name) == counts,
                     f"{mname} dp {dp} x tp {tp}: each step's trained tokens as the single rank's")
        if mname == "GPT-2":
            # Pipeline stages too: the documents travel with the activations between stages,
            # and the last stage's TP shards compute the masked loss.
            got = train(d, f"{mname}-pp2-tp2", job(model, 2, 1, f"ck-{mname}-pp2-tp2", pp=2,
                                                   data=MASKED))
            compare(ck, f"{mname} masked and packed, pp 2 x tp 2", ref, got)
            ck.check(trained_tokens(d, f"{mname}-pp2-tp2") == counts,
                     f"{mname} pp 2 x tp 2: each step's trained tokens as the single rank's")
    # packing "padded": one document per row, the rest of the row not trained.
    PADDED = dict(MASKED, packing="padded")
    ref = train(d, "padded-1", job(GPT2, 1, 1, "ck-padded-1", data=PADDED))
    got = train(d, "padded-tp2", job(GPT2, 2, 2, "ck-padded-tp2", zero=1, data=PADDED))
    compare(ck, "GPT-2 masked, packing \"padded\", dp 2 x tp 2, ZeRO 1", ref, got)
ck.done()
