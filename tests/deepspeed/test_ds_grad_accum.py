"""bf16 training with data_types.grad_accum_dtype "fp32" and gradient accumulation 4, at ZeRO
stages 1 and 2, in real DeepSpeed and in ztrain, on the same model and batches: DeepSpeed runs
its BF16_Optimizer (stage 1) and its ZeRO optimizer (stage 2), which add the micro-steps up in
fp32; ztrain adds them up in fp32 and rounds the sum once (docs/deepspeed.md). The 8 losses of
each stage agree within 5e-3 relative and fall.

This is a parity check, not the check that tells fp32 from bf16 accumulation apart: the two bf16
forwards (torch's bf16 kernels, ztrain's ops) already differ by ~3e-4 at the first step, more
than the accumulation type moves the losses. tests/dist/test_grad_accum_fp32.py is that check.

The setup is test_deepspeed_sft.py's (transformers 5's LlamaForCausalLM, two gloo ranks, the
loss transformers' Trainer hands DeepSpeed, torch.optim.AdamW as the client optimizer, packed
documents as sequences of their own; its data and model) with bf16 on, one sample a micro-step
and 4 micro-steps.

Run: make test-deepspeed, or ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_grad_accum.py
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv(".venv-ds", "scripts/install-deps.sh deepspeed")

sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import torch  # noqa: E402
from ztref import Checker, read_metrics, run, tool, write_job  # noqa: E402
from ports import free_port  # noqa: E402
from test_deepspeed_sft import make_data, make_model, segments  # noqa: E402

T, B, GAS, W, STEPS, LR = 16, 1, 4, 2, 8, 1e-2
CASES = [(1, "fp32"), (2, "fp32")]
N_SAMPLES = STEPS * W * GAS * B  # within test_deepspeed_sft's make_data


def ds_config(stage, accum):
    cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": GAS,
           "gradient_clipping": 1.0, "bf16": {"enabled": True},
           "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 6}
    if accum:
        cfg["data_types"] = {"grad_accum_dtype": accum}
    return cfg


def deepspeed_rank(d, rank, port):
    """One DeepSpeed rank (a process of its own) of the case in $GACC_CASE ([stage, accum]):
    STEPS steps, rank 0 writes the losses."""
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
    stage, accum = json.loads(os.environ["GACC_CASE"])
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=ds_config(stage, accum))
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
            engine.step()
        dist.all_reduce(step_loss)
        out.append(step_loss.item())
    if rank == 0:
        with open(f"{d}/deepspeed.json", "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def deepspeed_losses(d, stage, accum):
    port = free_port()
    env = dict(os.environ, GACC_CASE=json.dumps([stage, accum]))
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(port), d],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(W)]
    logs = [p.communicate(timeout=900)[0] for p in ranks]
    if any(p.returncode for p in ranks):
        return " | ".join(f"rank {r} exit {p.returncode}: {logs[r].strip()[-400:]}"
                          for r, p in enumerate(ranks) if p.returncode), []
    with open(f"{d}/deepspeed.json") as f:
        return "", json.load(f)


def ztrain_losses(d, stage, accum):
    ds = ds_config(stage, accum)
    del ds["steps_per_print"]
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.1}}
    name = f"s{stage}-{accum}"
    write_job(f"{d}/{name}.json", {
        "world_size": W, "model": {"init_from": "hf", "block_size": T},
        "data": {"train": "train.bin", "shuffle": False, "format": "masked"},
        "train": {"max_steps": STEPS, "log_interval": 1, "warmup_steps": 0}, "deepspeed": ds})
    p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], check=False)
    if p.returncode != 0:
        return p.stderr.strip()[-400:], []
    return p.stderr, [r["train/loss"] for r in read_metrics(f"{d}/{name}/metrics.jsonl")]


def main():
    ck = Checker()
    with tempfile.TemporaryDirectory() as d:
        data = make_data(d)
        with open(f"{d}/data.json", "w") as f:
            json.dump(data, f)
        make_model(d)
        for stage, accum in CASES:
            err, want = deepspeed_losses(d, stage, accum)
            ck.check(len(want) == STEPS, f"DeepSpeed ran stage {stage} {accum}: {err}")
            zerr, got = ztrain_losses(d, stage, accum)
            ck.check(len(got) == STEPS, f"ztrain ran: {zerr}")
            errs = [abs(a - b) / abs(b) for a, b in zip(got, want)]
            worst = max(errs) if len(errs) == STEPS else float("nan")
            ck.check(worst < 5e-3 and "grad_accum_dtype" not in zerr,
                     f"stage {stage}, grad_accum_dtype {accum}: {STEPS} bf16 losses, ztrain vs "
                     f"DeepSpeed {__import__('deepspeed').__version__}: worst rel {worst:.1e}; "
                     f"ztrain {[round(x, 5) for x in got]} vs DeepSpeed "
                     f"{[round(x, 5) for x in want]}")
            ck.check(len(want) == STEPS and want[-1] < want[0] and got[-1] < got[0],
                     f"stage {stage}: both losses fall")
    ck.done()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        deepspeed_rank(sys.argv[4], int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
