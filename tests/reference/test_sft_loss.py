"""Loss-masked training (data.format "masked") against transformers' loss rule, with and
without documents packed into the sequences.

Token files with a loss mask (X.mask, written here from the layout in docs/fine-tuning.md) train
GPT-2, Llama 3 (GQA, llama3 rope scaling, rope_theta 5e5), Qwen2 and (packed) Mistral with a
sliding window directories for one SGD step with gradient accumulation, on one rank and on two.
With packed documents (bit 1 of the mask) the reference runs every document as a sequence of its
own, which is what DataCollatorWithFlattening's position_ids with flash-attn's varlen path
compute (a block-diagonal causal mask, positions restarting), and labels a document's first
token -100 as that collator does. In padded mode (data.packing "padded") the reference is
transformers with one document per row, right-padded, and its attention_mask. The reference is the transformers model
(float64, eager) with labels -100 on the untrained tokens and the loss of
transformers.loss.loss_utils.ForCausalLMLoss with num_items_in_batch, the trained targets of the
whole global batch (all micro-batches, all ranks), as transformers' Trainer passes it; summed
over the micro-batches of every rank, that is the objective whose gradient the step follows.

Checked: `ztrain run`'s train/loss equals the reference loss within 1e-5, train/trained_tokens
and train/tokens equal the counts, and the gradient ztrain applied, (w0 - w1) / lr read back from
the exported directory, equals transformers' within 1e-5 (norm-wise, every tensor together and
each one). A rule of per-micro-batch means would differ by far more: the micro-batches hold
different numbers of trained tokens by construction.

test_sft_train.py runs ten steps of the same against a DeepSpeed-rules loop."""
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from llama_ref import base_config, hf_model  # noqa: E402
from ztref import Checker, read_metrics, rel_err, run, st_read, tool, write_job, write_llmc_tokens  # noqa: E402

hf_logging.set_verbosity_error()
torch.set_num_threads(2)
T, B, GAS, LR = 16, 2, 2, 100.0


def write_mask(path, trained, starts=None):
    """A loss mask: 256 int32 header (magic 20261204, version 1, count), one byte per token with
    bit 0 set for a trained token and bit 1 for a document's first token."""
    header = [0] * 256
    header[0], header[1], header[2] = 20261204, 1, len(trained)
    starts = starts if starts is not None else [False] * len(trained)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(bytes((1 if t else 0) | (2 if s else 0) for t, s in zip(trained, starts)))


def gpt2_model(seed):
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    m = GPT2LMHeadModel(cfg).float()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    return m


def rank_batches(n_samples, world, rank):
    """The sample indices of each micro-batch of rank's first step: DistributedSampler without
    shuffling (rank r takes r, r+W, ...), cut into batches of B."""
    mine = list(range(rank, n_samples, world))
    return [mine[m * B:(m + 1) * B] for m in range(GAS)]


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
QWEN2 = base_config(num_key_value_heads=4, tie_word_embeddings=True, use_sliding_window=False)
# (what, family, config, ranks, packed documents)
CASES = [
    ("gpt2", "gpt2", None, 1, False),
    ("llama 3 (GQA, llama3 rope scaling)", "llama",
     base_config(rope_theta=500000.0, rope_scaling=LLAMA3), 1, False),
    ("qwen2 (q/k/v biases, tied)", "qwen2", QWEN2, 1, False),
    ("llama 3 on two ranks", "llama", base_config(rope_theta=500000.0, rope_scaling=LLAMA3), 2,
     False),
    ("gpt2, packed documents", "gpt2", None, 1, True),
    ("llama 3, packed documents", "llama",
     base_config(rope_theta=500000.0, rope_scaling=LLAMA3), 1, True),
    ("qwen2, packed documents", "qwen2", QWEN2, 1, True),
    ("mistral (sliding window 5), packed documents", "mistral", base_config(sliding_window=5), 1,
     True),
    ("llama 3, packed documents, two ranks", "llama",
     base_config(rope_theta=500000.0, rope_scaling=LLAMA3), 2, True),
    ("gpt2, padded documents", "gpt2", None, 1, True, "padded"),
    ("llama 3, padded documents, two ranks", "llama",
     base_config(rope_theta=500000.0, rope_scaling=LLAMA3), 2, True, "padded"),
]

ck = Checker()
def segments(starts, s):
    """The documents of sample s's T inputs: [a, b) ranges, a new one at the window's first
    token and at every token marked as a document's first."""
    cut = [0] + [i for i in range(1, T) if starts[s * T + i]] + [T]
    return list(zip(cut[:-1], cut[1:]))


for i, (what, family, config, world, packed, *mode) in enumerate(CASES):
    padded = mode == ["padded"]
    model = gpt2_model(70 + i) if family == "gpt2" else hf_model(family, 70 + i, **config)
    V = model.config.vocab_size
    n_samples = world * GAS * B
    g = torch.Generator().manual_seed(400 + i)
    tokens = torch.randint(0, V, (n_samples * T + 1,), generator=g)
    # Spans of trained tokens of random length, and micro-batches whose trained counts differ.
    trained = torch.zeros(len(tokens), dtype=torch.bool)
    pos = 0
    while pos < len(tokens):
        span = int(torch.randint(1, 9, (1,), generator=g))
        trained[pos:pos + span] = bool(torch.randint(0, 2, (1,), generator=g))
        pos += span
    trained[T + 1:2 * T + 1] = False  # sample 1 has no trained target at all
    # Documents of 1 to 8 tokens packed one after another.
    starts = torch.zeros(len(tokens), dtype=torch.bool)
    if packed:
        pos = 0
        while pos < len(tokens):
            starts[pos] = True
            pos += int(torch.randint(1, 9, (1,), generator=g))
    if padded:
        starts[1:T + 4] = False  # the first document is longer than a row: it is cut
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(f"{d}/hf", safe_serialization=True)
        write_llmc_tokens(f"{d}/train.bin", tokens.tolist())
        write_mask(f"{d}/train.bin.mask", trained.tolist(), starts.tolist())

        # The reference: HF labels (-100 where untrained), num_items_in_batch over the global
        # batch, each rank's micro-batch losses summed.
        ref = model.double()
        ref.config._attn_implementation = "eager"
        # A document's first token is never a target (DataCollatorWithFlattening's -100).
        windows = [tokens[s * T:s * T + T + 1] for s in range(n_samples)]
        labels = [torch.where(trained[s * T:s * T + T + 1] & ~starts[s * T:s * T + T + 1],
                              windows[s], torch.tensor(-100)) for s in range(n_samples)]
        n_items = int(sum((lab[1:] != -100).sum() for lab in labels))
        ref.zero_grad()
        total = 0.0
        micro_counts = []
        # Packed documents attend only inside themselves, with positions from 0: each is run
        # as a sequence of its own (the last one with the window's extra token, so its last
        # input predicts it); num_items_in_batch stays the global batch's.
        if padded:
            # One document per row, right-padded, HF's attention_mask on the padding: the rows
            # hold T + 1 tokens so that a cut document's T-th input has its target.
            cuts = [j for j in range(len(tokens)) if j == 0 or starts[j]] + [len(tokens)]
            docs = [(a, min(b, a + T + 1)) for a, b in zip(cuts[:-1], cuts[1:])]
            n_items = 0
            rows = []
            for a, b in docs:
                ids = torch.zeros(T + 1, dtype=torch.long)
                lab = torch.full((T + 1,), -100)
                am = torch.zeros(T + 1, dtype=torch.long)
                ids[:b - a], am[:b - a] = tokens[a:b], 1
                lab[:b - a] = torch.where(trained[a:b], tokens[a:b], torch.tensor(-100))
                rows.append((ids, lab, am))
            used = [s for r in range(world) for bt in rank_batches(len(docs), world, r) for s in bt]
            n_items = int(sum((rows[s][1][1:] != -100).sum() for s in used))
            for r in range(world):
                for batch in rank_batches(len(docs), world, r):
                    micro_counts.append(int(sum((rows[s][1][1:] != -100).sum() for s in batch)))
                    ids = torch.stack([rows[s][0] for s in batch])
                    lab = torch.stack([rows[s][1] for s in batch])
                    am = torch.stack([rows[s][2] for s in batch])
                    logits = ref(input_ids=ids, attention_mask=am).logits
                    loss = ForCausalLMLoss(logits, lab, V, num_items_in_batch=n_items)
                    loss.backward()
                    total += loss.item()
        for r in range(world if not padded else 0):
            for batch in rank_batches(n_samples, world, r):
                micro_counts.append(int(sum((labels[s][1:] != -100).sum() for s in batch)))
                for s in batch:
                    for a, b in segments(starts, s):
                        end = T + 1 if b == T else b
                        logits = ref(input_ids=windows[s][a:end][None]).logits
                        loss = ForCausalLMLoss(logits, labels[s][a:end][None], V,
                                               num_items_in_batch=n_items)
                        loss.backward()
                        total += loss.item()
        ck.check(len(set(micro_counts)) > 1, f"{what}: micro-batches hold different trained "
                 f"counts {micro_counts} (so the rule matters)")
        want_grads = {k: p.grad.clone() for k, p in ref.named_parameters()}

        write_job(f"{d}/job.json", {
            "world_size": world,
            "model": {"init_from": "hf", "block_size": T},
            "data": {"train": "train.bin", "shuffle": False, "format": "masked",
                     **({"packing": "padded"} if padded else {})},
            "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0,
                      "checkpoint_dir": "ckpt"},
            "deepspeed": {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": GAS,
                          "gradient_clipping": 0.0,
                          "optimizer": {"type": "SGD", "params": {"lr": LR}}}})
        p = run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"], check=False)
        m = read_metrics(f"{d}/run/metrics.jsonl") if p.returncode == 0 else []
        rec = m[0] if m else {}
        loss = rec.get("train/loss", float("nan"))
        e = abs(loss - total) / total
        ck.check(p.returncode == 0 and e < 1e-5, f"{what}: train/loss {loss:.7f} vs transformers "
                 f"{total:.7f} (rel {e:.1e}) {p.stderr.strip()[-300:]}")
        ck.check(rec.get("train/trained_tokens") == n_items and
                 rec.get("train/tokens") == n_samples * T,
                 f"{what}: train/trained_tokens {rec.get('train/trained_tokens')} of "
                 f"{rec.get('train/tokens')} (want {n_items} of {n_samples * T})")
        ref_norm = torch.cat([g.flatten() for g in want_grads.values()]).norm().item()
        e = abs(rec.get("train/grad_norm", float("nan")) - ref_norm) / ref_norm
        ck.check(e < 1e-5, f"{what}: train/grad_norm {rec.get('train/grad_norm')} vs "
                 f"transformers' {ref_norm:.7f} (rel {e:.1e})")
        if p.returncode != 0:
            continue
        p = run([tool("ztrain"), "export", f"{d}/ckpt", "--hf", f"{d}/out"], check=False)
        ck.check(p.returncode == 0, f"{what}: export {p.stderr.strip()[-200:]}")
        if p.returncode != 0:
            continue
        w0, _ = st_read(f"{d}/hf/model.safetensors")
        w1, _ = st_read(f"{d}/out/model.safetensors")
        got, want, worst = [], [], (0.0, "")
        for name, g_ref in want_grads.items():
            key = name if name in w1 else name.removeprefix("transformer.")
            if key not in w1 or key not in w0:
                continue  # a tied head is stored once
            # GPT-2's position table is cropped to block_size on loading.
            rows = w1[key].shape[0] if w1[key].dim() else 1
            g_ref = g_ref[:rows] if g_ref.dim() else g_ref
            g_zt = (w0[key][:rows].double() - w1[key].double()) / LR
            got.append(g_zt.flatten())
            want.append(g_ref.flatten())
            e = rel_err(g_zt, g_ref)
            worst = max(worst, (e, key))
        e = rel_err(torch.cat(got), torch.cat(want)) if got else float("nan")
        ck.check(len(got) >= 10 and e < 1e-5 and worst[0] < 1e-4,
                 f"{what}: gradient of the step vs transformers': rel err {e:.2e} over "
                 f"{len(got)} tensors (worst {worst[0]:.1e} in {worst[1]})")

# Bad masks are refused by name before any rank starts.
with tempfile.TemporaryDirectory() as d:
    hf_model("llama", 90, **base_config()).save_pretrained(f"{d}/hf")
    write_llmc_tokens(f"{d}/train.bin", list(range(80)))
    write_job(f"{d}/job.json", {"model": {"init_from": "hf", "block_size": T},
                                "data": {"train": "train.bin", "format": "masked"},
                                "deepspeed": {"train_micro_batch_size_per_gpu": 1}})
    for why, body, key in [("missing", None, "train.bin.mask"),
                           ("short", [1] * 79, "80"),
                           ("reserved bit", [1] * 80, "token 40")]:
        if os.path.exists(f"{d}/train.bin.mask"):
            os.remove(f"{d}/train.bin.mask")
        if body is not None:
            write_mask(f"{d}/train.bin.mask", body)
            if why == "reserved bit":
                with open(f"{d}/train.bin.mask", "r+b") as f:
                    f.seek(1024 + 40)
                    f.write(b"\x04")
        p = run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"], check=False)
        ck.check(p.returncode == 1 and "train.bin.mask" in p.stderr and key in p.stderr,
                 f"{why} mask: exit {p.returncode}: {p.stderr.strip()[-200:]}")
ck.done()
