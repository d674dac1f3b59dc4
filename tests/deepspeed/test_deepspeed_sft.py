"""Ten steps of supervised fine-tuning in real DeepSpeed and in ztrain, on the same model and the
same batches: the losses agree within 1e-4 relative, and so do the global gradient norms (those
DeepSpeed's clipping sees: the gradients its backward averaged over the ranks).

DeepSpeed (the .venv-ds environment: PyPI's torch on the CPU, DeepSpeed built without its ops,
transformers 5; `scripts/install-deps.sh deepspeed`) runs on its CPU accelerator with two gloo
ranks, ZeRO 0, fp32, gradient accumulation 2, global-norm clipping at 1.0, and torch.optim.AdamW
as the client optimizer: DeepSpeed's engine does the accumulation, the average over the ranks, the
clipping (its clip_grad_norm_) and the step. The model is transformers 5's LlamaForCausalLM, saved
with save_pretrained (a config.json in the 5.x layout, rope_parameters) and read by ztrain from
that directory. The loss is what transformers' Trainer hands DeepSpeed since 4.46: each
micro-batch's summed token losses over num_items_in_batch (the step's trained labels over all
ranks), times the world size, with engine.backward(loss, scale_wrt_gas=False). Packed documents
are each run as a sequence of their own (position ids from 0), which is what the attention reset
at a document boundary computes.

ztrain trains the same directory on the same token file and loss mask with data.format "masked"
(two ranks, the same micro-batches, shuffle off: rank r takes samples r, r + 2, ...).

Run: make test-deepspeed, or ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_deepspeed_sft.py
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv(".venv-ds", "scripts/install-deps.sh deepspeed")

sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import torch  # noqa: E402
from ztref import Checker, read_metrics, run, tool, write_job, write_llmc_tokens  # noqa: E402
from ports import free_port  # noqa: E402

T, B, GAS, W, STEPS, LR = 16, 2, 2, 2, 10, 1e-2
N_SAMPLES = STEPS * W * GAS * B


def make_data(d):
    """Tokens in documents of 2 to 11 tokens (each opens at random and follows a rule, so the
    loss falls), 60% of them trained: the token file and its loss mask (docs/fine-tuning.md)."""
    g = torch.Generator().manual_seed(31)
    n = N_SAMPLES * T + 1
    tokens, trained, starts, next_doc = [], [], [], 0
    for i in range(n):
        start = i == next_doc
        if start:
            next_doc += int(torch.randint(2, 12, (1,), generator=g))
        tokens.append(int(torch.randint(0, 256, (1,), generator=g)) if start
                      else (tokens[-1] * 5 + 1) % 256)
        trained.append(bool(torch.rand(1, generator=g) < 0.6))
        starts.append(start)
    write_llmc_tokens(f"{d}/train.bin", tokens)
    with open(f"{d}/train.bin.mask", "wb") as f:
        f.write(struct.pack("<256i", 20261204, 1, n, *([0] * 253)))
        f.write(bytes((1 if t else 0) | (2 if s else 0) for t, s in zip(trained, starts)))
    return tokens, trained, starts


def make_model(d):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                          "rope_theta": 500000.0})
    torch.manual_seed(3)
    model = LlamaForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
    model.save_pretrained(f"{d}/hf")
    with open(f"{d}/hf/config.json") as f:
        return json.load(f)


def segments(starts, s):
    """Sample s's documents as [a, b) ranges of its T inputs."""
    cut = [0] + [i for i in range(1, T) if starts[s * T + i]] + [T]
    return list(zip(cut[:-1], cut[1:]))


def deepspeed_rank(d, rank, port):
    """One DeepSpeed rank (a process of its own): 10 steps, rank 0 writes the losses and norms."""
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(W), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed
    import torch.distributed as dist
    from transformers import LlamaForCausalLM
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    with open(f"{d}/data.json") as f:
        tokens, trained, starts = json.load(f)
    tokens, trained, starts = (torch.tensor(tokens), torch.tensor(trained),
                               torch.tensor(starts))
    model = LlamaForCausalLM.from_pretrained(f"{d}/hf", dtype=torch.float32,
                                             attn_implementation="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config={
        "train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": GAS,
        "gradient_clipping": 1.0, "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 6})
    windows = [tokens[s * T:s * T + T + 1] for s in range(N_SAMPLES)]
    labels = [torch.where(trained[s * T:s * T + T + 1] & ~starts[s * T:s * T + T + 1],
                          windows[s], torch.tensor(-100)) for s in range(N_SAMPLES)]
    mine = list(range(rank, N_SAMPLES, W))
    out = []
    for step in range(STEPS):
        batch = mine[step * GAS * B:(step + 1) * GAS * B]
        # transformers' num_items_in_batch: the step's trained labels, summed over the ranks
        items = torch.tensor(float(sum((labels[s][1:] != -100).sum() for s in batch)))
        dist.all_reduce(items)
        step_loss = torch.tensor(0.0, dtype=torch.float64)
        for m in range(GAS):
            loss = 0.0
            for s in batch[m * B:(m + 1) * B]:
                for a, e in segments(starts.tolist(), s):
                    end = T + 1 if e == T else e
                    loss = loss + engine(input_ids=windows[s][a:end][None],
                                         labels=labels[s][a:end][None],
                                         num_items_in_batch=items).loss
            step_loss += float(loss)
            engine.backward(loss * W, scale_wrt_gas=False)
            # At the boundary the backward has averaged the gradients over the ranks: their
            # norm is the one DeepSpeed's clip_grad_norm_ clips by (its fp32 step keeps none).
            if m == GAS - 1:
                norm = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in model.parameters()))
            engine.step()
        dist.all_reduce(step_loss)
        out.append((step_loss.item(), norm.item()))
    if rank == 0:
        with open(f"{d}/deepspeed.json", "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def main():
    ck = Checker()
    with tempfile.TemporaryDirectory() as d:
        data = make_data(d)
        with open(f"{d}/data.json", "w") as f:
            json.dump(data, f)
        cfg = make_model(d)
        ck.check("rope_parameters" in cfg and "rope_theta" not in cfg,
                 f"transformers {cfg.get('transformers_version')} wrote the 5.x layout")
        port = free_port()
        ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(port), d],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(W)]
        logs = [p.communicate(timeout=600)[0] for p in ranks]
        ok = all(p.returncode == 0 for p in ranks)
        ck.check(ok, "both DeepSpeed ranks ran: " +
                 " | ".join(f"rank {r} exit {p.returncode}: {logs[r].strip()[-400:]}"
                            for r, p in enumerate(ranks) if p.returncode))
        want = json.load(open(f"{d}/deepspeed.json")) if ok else []
        write_job(f"{d}/job.json", {
            "world_size": W,
            "model": {"init_from": "hf", "block_size": T},
            "data": {"train": "train.bin", "shuffle": False, "format": "masked"},
            "train": {"max_steps": STEPS, "log_interval": 1, "warmup_steps": 0},
            "deepspeed": {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": GAS,
                          "gradient_clipping": 1.0,
                          "optimizer": {"type": "AdamW",
                                        "params": {"lr": LR, "weight_decay": 0.1}}}})
        p = run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"], check=False)
        got = [(r["train/loss"], r["train/grad_norm"])
               for r in read_metrics(f"{d}/run/metrics.jsonl")] if p.returncode == 0 else []
        ck.check(p.returncode == 0, f"ztrain ran: {p.stderr.strip()[-400:]}")
        ck.check(len(want) == STEPS and want[-1][0] < want[0][0],
                 f"DeepSpeed's loss falls: {[round(x[0], 5) for x in want]}")
        for i, what in ((0, "losses"), (1, "gradient norms")):
            errs = [abs(a[i] - b[i]) / abs(b[i]) for a, b in zip(got, want)]
            worst = max(errs) if errs else float("nan")
            ck.check(len(got) == STEPS and len(want) == STEPS and worst < 1e-4,
                     f"10 SFT steps, ztrain vs DeepSpeed {__import__('deepspeed').__version__}: "
                     f"{what} worst rel {worst:.1e}; ztrain {[round(x[i], 5) for x in got]} vs "
                     f"DeepSpeed {[round(x[i], 5) for x in want]}")
    ck.done()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        deepspeed_rank(sys.argv[4], int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
