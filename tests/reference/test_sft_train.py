"""Ten SFT steps (data.format "masked", packed documents, two ranks, gradient accumulation 2,
AdamW with weight decay and global-norm clipping at 1.0) against a PyTorch loop that follows
DeepSpeed's rules, DeepSpeed itself not being installed in the test venv: torch.optim.AdamW
(DeepSpeed's AdamW: decoupled decay, bias correction), DeepSpeed's clipping coefficient
max_norm / (norm + 1e-6), and each step's loss the mean over the global batch's trained tokens
(transformers' ForCausalLMLoss with num_items_in_batch), every document run on its own, in
float64. Every step's loss must agree within 1e-4. The same run stopped after 5 steps and resumed
from its checkpoint must agree with the loop too: the engine draws each step's micro-batches at
the end of the step before (to count their trained targets under that step's wait), so the
checkpoint has to record where the steps taken got to, not where the loader did. The eval loss
on masked validation data is the mean over its trained targets, an all-masked batch adding
nothing, and NaN with a warning when there are none; masks beside the shards of a job whose
data.format ignores them are warned about once."""
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from llama_ref import base_config, hf_model  # noqa: E402
from ztref import Checker, read_metrics, run, tool, write_job, write_llmc_tokens  # noqa: E402

hf_logging.set_verbosity_error()
torch.set_num_threads(2)
T, B, GAS = 16, 2, 2


def write_mask(path, trained, starts=None):
    """A loss mask: 256 int32 header (magic 20261204, version 1, count), one byte per token with
    bit 0 set for a trained token and bit 1 for a document's first token."""
    header = [0] * 256
    header[0], header[1], header[2] = 20261204, 1, len(trained)
    starts = starts if starts is not None else [False] * len(trained)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(bytes((1 if t else 0) | (2 if s else 0) for t, s in zip(trained, starts)))


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
def segments(starts, s):
    """The documents of sample s's T inputs: [a, b) ranges, a new one at the window's first
    token and at every token marked as a document's first."""
    cut = [0] + [i for i in range(1, T) if starts[s * T + i]] + [T]
    return list(zip(cut[:-1], cut[1:]))


ck = Checker()
# Ten steps of AdamW on packed, masked data against a PyTorch loop that follows DeepSpeed's
# rules (DeepSpeed itself is not installed in the test venv): torch.optim.AdamW (DeepSpeed's
# AdamW is its decoupled decay with bias correction), global-norm clipping at 1.0 with
# DeepSpeed's coefficient max_norm / (norm + 1e-6), the loss of each step transformers' global
# batch mean, two ranks with gradient accumulation 2, in float64.
STEPS, W, LR10 = 10, 2, 2e-2
cfg = base_config(rope_theta=500000.0, rope_scaling=LLAMA3)
model = hf_model("llama", 99, **cfg)
V = model.config.vocab_size
per_step = W * GAS * B
n_samples = STEPS * per_step
g = torch.Generator().manual_seed(999)
tokens = torch.randint(0, V, (n_samples * T + 1,), generator=g)
trained = torch.rand(len(tokens), generator=g) < 0.6
starts = torch.zeros(len(tokens), dtype=torch.bool)
pos = 0
while pos < len(tokens):
    starts[pos] = True
    pos += int(torch.randint(2, 12, (1,), generator=g))
with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(f"{d}/hf", safe_serialization=True)
    write_llmc_tokens(f"{d}/train.bin", tokens.tolist())
    write_mask(f"{d}/train.bin.mask", trained.tolist(), starts.tolist())
    def job(name, **train):
        write_job(f"{d}/{name}.json", {
            "world_size": W,
            "model": {"init_from": "hf", "block_size": T},
            "data": {"train": "train.bin", "shuffle": False, "format": "masked"},
            "train": dict({"max_steps": STEPS, "log_interval": 1, "warmup_steps": 0}, **train),
            "deepspeed": {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": GAS,
                          "gradient_clipping": 1.0,
                          "optimizer": {"type": "AdamW", "params": {"lr": LR10,
                                                                    "weight_decay": 0.1}}}})
        p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/split"
                 if name != "job" else f"{d}/run"], check=False)
        return p

    p = job("job")
    got = [r["train/loss"] for r in read_metrics(f"{d}/run/metrics.jsonl")] \
        if p.returncode == 0 else []
    first = job("first", checkpoint_dir=f"{d}/ckpt", bench_steps=5)
    second = job("second", checkpoint_dir=f"{d}/ckpt", resume=True)
    split = read_metrics(f"{d}/split/metrics.jsonl") \
        if first.returncode == 0 and second.returncode == 0 else []
    ref = model.double()
    ref.config._attn_implementation = "eager"
    opt = torch.optim.AdamW(ref.parameters(), lr=LR10, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1)
    windows = [tokens[s * T:s * T + T + 1] for s in range(n_samples)]
    labels = [torch.where(trained[s * T:s * T + T + 1] & ~starts[s * T:s * T + T + 1],
                          windows[s], torch.tensor(-100)) for s in range(n_samples)]
    want = []
    for step in range(STEPS):
        # rank r's share: its DistributedSampler indices, GAS·B of them per step
        batches = [list(range(r, n_samples, W))[step * GAS * B:(step + 1) * GAS * B]
                   for r in range(W)]
        n_items = int(sum((labels[s][1:] != -100).sum() for b in batches for s in b))
        opt.zero_grad()
        total = 0.0
        for b in batches:
            for s in b:
                for a, e in segments(starts, s):
                    end = T + 1 if e == T else e
                    logits = ref(input_ids=windows[s][a:end][None]).logits
                    loss = ForCausalLMLoss(logits, labels[s][a:end][None], V,
                                           num_items_in_batch=n_items)
                    loss.backward()
                    total += loss.item()
        norm = torch.sqrt(sum((q.grad ** 2).sum() for q in ref.parameters())).item()
        coef = 1.0 / (norm + 1e-6)
        if coef < 1.0:
            for q in ref.parameters():
                q.grad.mul_(coef)
        opt.step()
        want.append(total)
    errs = [abs(a - b) / abs(b) for a, b in zip(got, want)]
    ck.check(len(got) == STEPS and max(errs) < 1e-4,
             f"10 SFT steps (AdamW, clipping, packed and masked, 2 ranks × 2 micro-batches) vs "
             f"the DeepSpeed-rules loop: worst rel {max(errs) if errs else float('nan'):.1e}; "
             f"losses {[round(x, 5) for x in got]} vs {[round(x, 5) for x in want]} "
             f"{p.stderr.strip()[-200:]}")
    resumed = [r["train/loss"] for r in split if r["train/global_step"] > 5]
    errs = [abs(a - b) / abs(b) for a, b in zip(resumed, want[5:])]
    ck.check(len(resumed) == STEPS - 5 and max(errs) < 1e-4,
             f"steps 6-10 resumed from the checkpoint of step 5 vs the loop's: worst rel "
             f"{max(errs) if errs else float('nan'):.1e}; losses {[round(x, 5) for x in resumed]} "
             f"vs {[round(x, 5) for x in want[5:]]} {second.stderr.strip()[-200:]}")
    # A rank's share of the data is n_samples / W samples an epoch, GAS·B of them a step.
    share, used = n_samples // W, [s * GAS * B for s in range(1, STEPS + 1)]
    epochs = [u // share + (u % share) / share for u in used]
    full = read_metrics(f"{d}/run/metrics.jsonl") if p.returncode == 0 else []
    for name, rows in (("uninterrupted", full), ("split", split)):
        ck.check([r["train/epoch"] for r in rows] == epochs,
                 f"the {name} run's epochs are where its steps got to (not the loader, drawn a "
                 f"step ahead): {[r['train/epoch'] for r in rows]} vs {epochs}")

# The eval loss on masked validation data: the mean over every trained target of the evaluated
# batches of both ranks (transformers' loss over its labels != -100), computed here in PyTorch on
# the same batches, at lr 0 so the weights are the model's. Rank 0's first batch (samples 0 and
# 2, DistributedSampler order) has no trained target: it adds nothing, where a mean of batch
# means would count it as 0. A validation set without a trained target is NaN (what the
# cross-entropy of no label gives) with a warning that names data.val.
EVAL_STEPS = 2
n_val = W * B * EVAL_STEPS
val_tokens = torch.randint(0, V, (n_val * T + 1,), generator=g)
val_trained = torch.rand(len(val_tokens), generator=g) < 0.6
for s in (0, 2):
    val_trained[s * T + 1:s * T + T + 1] = False
val_starts = torch.zeros(len(val_tokens), dtype=torch.bool)
val_starts[0] = True
val_starts[T // 2 + 3 * T] = True
fresh = hf_model("llama", 99, **cfg)
with tempfile.TemporaryDirectory() as d:
    fresh.save_pretrained(f"{d}/hf", safe_serialization=True)
    write_llmc_tokens(f"{d}/train.bin", tokens.tolist())
    write_mask(f"{d}/train.bin.mask", trained.tolist(), starts.tolist())
    write_llmc_tokens(f"{d}/val.bin", val_tokens.tolist())
    write_mask(f"{d}/val.bin.mask", val_trained.tolist(), val_starts.tolist())
    write_llmc_tokens(f"{d}/none.bin", val_tokens.tolist())
    write_mask(f"{d}/none.bin.mask", [False] * len(val_tokens), val_starts.tolist())

    def eval_run(val, fmt="masked"):
        write_job(f"{d}/{val}.json", {
            "world_size": W,
            "model": {"init_from": "hf", "block_size": T},
            "data": {"train": "train.bin", "val": f"{val}.bin", "shuffle": False,
                     "format": fmt},
            "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0, "eval_interval": 1,
                      "eval_steps": EVAL_STEPS},
            "deepspeed": {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
                          "optimizer": {"type": "AdamW", "params": {"lr": 0.0,
                                                                    "weight_decay": 0.0}}}})
        p = run([tool("ztrain"), "run", f"{d}/{val}.json", "--out", f"{d}/run_{val}"],
                check=False)
        rows = read_metrics(f"{d}/run_{val}/metrics.jsonl") if p.returncode == 0 else []
        return p, [r["eval/loss"] for r in rows if "eval/loss" in r]

    p, got = eval_run("val")
    ref = fresh.double()
    ref.config._attn_implementation = "eager"
    windows = [val_tokens[s * T:s * T + T + 1] for s in range(n_val)]
    labels = [torch.where(val_trained[s * T:s * T + T + 1] & ~val_starts[s * T:s * T + T + 1],
                          windows[s], torch.tensor(-100)) for s in range(n_val)]
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(n_val):
            for a, e in segments(val_starts, s):
                end = T + 1 if e == T else e
                logits = ref(input_ids=windows[s][a:end][None]).logits[0, :-1]
                lab = labels[s][a:end][1:]
                total += torch.nn.functional.cross_entropy(logits, lab, ignore_index=-100,
                                                           reduction="sum").item()
                count += int((lab != -100).sum())
    want = total / count
    ck.check(len(got) == 1 and got[0] is not None and abs(got[0] - want) / want < 1e-4,
             f"eval loss over masked validation data with an all-masked batch: {got} vs "
             f"PyTorch's mean over the {count} trained targets {want:.6f} "
             f"{p.stderr.strip()[-200:]}")
    p, got = eval_run("none")
    ck.check(p.returncode == 0 and got == [None] and "data.val" in p.stderr and "NaN" in p.stderr,
             f"a validation set without a trained target: eval/loss {got} (null: NaN) and a "
             f"warning naming data.val: exit {p.returncode} {p.stderr.strip()[-300:]}")
    # Masks beside the shards that data.format "tokens" ignores: said once, naming both keys.
    p, got = eval_run("val", "tokens")
    ck.check(p.returncode == 0 and p.stderr.count("data.train") == 1 and "train.bin.mask" in
             p.stderr and 'data.format "tokens"' in p.stderr, f"shards with masks under "
             f"data.format tokens: one warning: exit {p.returncode} {p.stderr.strip()[-300:]}")

ck.done()
