"""A resume that changes the batch: a run of 5 steps at gradient_accumulation_steps 1 (4 samples a
step), resumed at gas 2 (8 samples a step). As DeepSpeed, which restores global_steps,
global_samples and skipped_steps but no micro-step count, every step after the resume is a full
step of the new gas: its loss is the mean of its two micro-batches' losses and its gradient
their mean, computed here in PyTorch from the checkpointed weights on the samples the resumed
run reads next (unshuffled, from sample 20: where the first run stopped). And a resume on another
number of data-parallel ranks (2 -> 3) that cannot split the samples drawn: each rank resumes at
the same position, rounded down, so the first step reads from sample 15 where 16 were drawn,
which the run says in a warning; its loss is PyTorch's on samples 15-26."""
import json
import tempfile

import torch
import torch.nn.functional as F

from ztref import Checker, gpt2_forward, read_metrics, run, st_read, tool, write_job

L, NH, C, V, T, MICRO = 2, 2, 32, 256, 16, 4
ck = Checker()
with tempfile.TemporaryDirectory() as d:
    data = bytes((i * 7 + i // 13) % 251 for i in range(1200))
    with open(f"{d}/train.txt", "wb") as f:
        f.write(data)

    def job(gas, max_steps, interval, resume):
        return {
            "name": "resume-gas",
            "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
                      "block_size": T},
            "data": {"train": "train.txt", "shuffle": False},
            "train": {"max_steps": max_steps, "log_interval": 1, "checkpoint_dir": "ckpt",
                      "checkpoint_interval": interval, "resume": resume, "seed": 5},
            "deepspeed": {"train_batch_size": MICRO * gas, "train_micro_batch_size_per_gpu": MICRO,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}}

    write_job(f"{d}/first.json", job(1, 5, 5, False))
    write_job(f"{d}/second.json", job(2, 7, 1, True))
    z = tool("ztrain")
    run([z, "run", f"{d}/first.json", "--out", f"{d}/out", "--threads", "2"])
    p = run([z, "run", f"{d}/second.json", "--out", f"{d}/out", "--threads", "2"])
    ck.check("step 5" in p.stdout, "the second run resumes at step 5")
    metrics = {m["train/global_step"]: m for m in read_metrics(f"{d}/out/metrics.jsonl")
               if "train/global_step" in m}
    ck.check(sorted(metrics) == list(range(1, 8)), f"steps logged: {sorted(metrics)}")

    tokens = torch.tensor(list(data), dtype=torch.long)
    sample = 5 * MICRO
    for step, tag in ((6, "global_step5"), (7, "global_step6")):
        saved, _ = st_read(f"{d}/ckpt/{tag}/model.safetensors")
        params = {k: v.double().requires_grad_(True) for k, v in saved.items()}
        loss = 0.0
        for micro in range(2):
            starts = [(sample + i) * T for i in range(MICRO)]
            sample += MICRO
            x = torch.stack([tokens[s:s + T] for s in starts])
            y = torch.stack([tokens[s + 1:s + T + 1] for s in starts])
            micro_loss = F.cross_entropy(gpt2_forward(params, x, L, NH).reshape(-1, V),
                                         y.reshape(-1))
            (micro_loss / 2).backward()
            loss += micro_loss.item() / 2
        norm = torch.sqrt(sum((q.grad ** 2).sum() for q in params.values())).item()
        m = metrics.get(step, {})
        got = m.get("train/loss", float("nan"))
        ck.check(abs(got - loss) < 1e-4 * loss,
                 f"step {step}: loss {got:.6f} is the mean of 2 micro-batches, torch {loss:.6f}")
        got = m.get("train/grad_norm", float("nan"))
        ck.check(abs(got - norm) < 1e-3 * norm,
                 f"step {step}: grad norm {got:.5f} vs torch {norm:.5f} over 2 micro-batches")
    # global_samples is a running total, as DeepSpeed's: 5 steps of 4, then steps of 8.
    n_samples = (len(data) - 1) // T
    for step in range(1, 8):
        want = MICRO * step if step <= 5 else 5 * MICRO + 2 * MICRO * (step - 5)
        got = metrics.get(step, {}).get("train/samples")
        ck.check(got == want, f"step {step}: train/samples {got}, want {want}")
        got = metrics.get(step, {}).get("train/epoch", float("nan"))
        ck.check(abs(got - want / n_samples) < 1e-9,
                 f"step {step}: train/epoch {got:.6f} is {want}/{n_samples} samples")
    for step in (5, 6, 7):
        with open(f"{d}/ckpt/global_step{step}/meta.json") as f:
            meta = json.load(f)
        want = MICRO * step if step <= 5 else 5 * MICRO + 2 * MICRO * (step - 5)
        got = meta["global_samples"]
        ck.check(got == want, f"global_step{step}/meta.json: global_samples {got}, want {want}")
    ck.check(meta["data"]["position"] == 5 * MICRO + 2 * 2 * MICRO,
             f"the data position after step 7 is 5*4 + 2*8 samples: {meta['data']['position']}")

    # Another data-parallel size: 2 ranks draw 2 steps of 2 x 4 = 16 samples, which 3 ranks
    # cannot split; each resumes at 16 // 3 = 5 of its share, so the step after the resume reads
    # samples 15-26 (rank r taking 15 + r, 18 + r, ...: DistributedSampler's order), 15 again.
    def world_job(world, max_steps, resume):
        spec = job(1, max_steps, 2, resume)
        spec["world_size"] = world
        spec["train"]["checkpoint_dir"] = "ckpt-world"
        spec["deepspeed"]["train_batch_size"] = MICRO * world
        return spec

    write_job(f"{d}/two.json", world_job(2, 2, False))
    write_job(f"{d}/three.json", world_job(3, 3, True))
    run([z, "run", f"{d}/two.json", "--out", f"{d}/out-two"])
    p = run([z, "run", f"{d}/three.json", "--out", f"{d}/out-three"])
    ck.check("had drawn 16 samples of epoch 0, which 3 data-parallel ranks cannot split evenly: "
             "they continue from sample 15, drawing the last 1 of them again" in p.stderr,
             f"the resume on 3 ranks says it draws sample 15 again: {p.stderr.strip()[-400:]}")
    saved, _ = st_read(f"{d}/ckpt-world/global_step2/model.safetensors")
    params = {k: v.double() for k, v in saved.items()}
    starts = [s * T for s in range(15, 15 + 3 * MICRO)]
    x = torch.stack([tokens[s:s + T] for s in starts])
    y = torch.stack([tokens[s + 1:s + T + 1] for s in starts])
    with torch.no_grad():
        want = F.cross_entropy(gpt2_forward(params, x, L, NH).reshape(-1, V), y.reshape(-1)).item()
    got = [m["train/loss"] for m in read_metrics(f"{d}/out-three/metrics.jsonl")
           if m.get("train/global_step") == 3]
    ck.check(len(got) == 1 and abs(got[0] - want) < 1e-4 * want,
             f"step 3 on 3 ranks reads samples 15-26: loss {got} vs torch {want:.6f}")
ck.done()
