"""Resume is bit-exact: a run stopped after 5 steps and resumed from its checkpoint produces the
same losses, lr and gradient norms, to the last bit, as one uninterrupted run. The data is
shuffled and small enough that the runs cross epoch boundaries, and gradients are accumulated, so
the sampler position, the optimizer moments and the schedule all have to be restored. Resuming a
checkpoint at or past train.max_steps trains nothing and says so (exit 0), printing no loss."""
import os
import tempfile

from ztref import Checker, read_metrics, run, tool, write_job

ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(600)))
    def job(ckpt, resume, bench_steps):
        return {
            "name": "resume",
            "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                      "block_size": 16},
            "data": {"train": "train.txt", "shuffle": True},
            "train": {"max_steps": 12, "log_interval": 1, "checkpoint_dir": ckpt,
                      "resume": resume, "bench_steps": bench_steps, "seed": 99},
            "deepspeed": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
                          "scheduler": {"type": "WarmupCosineLR",
                                        "params": {"total_num_steps": 12, "warmup_num_steps": 3}},
                          "gradient_clipping": 1.0}}
    write_job(f"{d}/full.json", job("ckpt-full", False, 0))
    write_job(f"{d}/first.json", job("ckpt-split", False, 5))
    write_job(f"{d}/second.json", job("ckpt-split", True, 0))
    z = tool("ztrain")
    run([z, "run", f"{d}/full.json", "--out", f"{d}/full"])
    run([z, "run", f"{d}/first.json", "--out", f"{d}/split"])
    ck.check(open(f"{d}/ckpt-split/latest").read().strip() == "global_step5",
             "the stopped run's latest checkpoint is global_step5")
    ck.check(os.path.exists(f"{d}/ckpt-split/global_step5/DONE"), "it has its DONE marker")
    p = run([z, "run", f"{d}/second.json", "--out", f"{d}/split"])
    ck.check("resumed from" in p.stdout and "step 5" in p.stdout, "the second run says it resumed at step 5")
    full = read_metrics(f"{d}/full/metrics.jsonl")
    split = read_metrics(f"{d}/split/metrics.jsonl")
    ck.check([m["train/global_step"] for m in split] == list(range(1, 13)),
             "the resumed run's metrics continue the first run's, steps 1..12")
    epochs = full[-1]["train/epoch"]
    ck.check(epochs > 2, f"the run crosses epoch boundaries (epoch {epochs:.2f} at the end)")
    for a, b in zip(full, split):
        same = all(a[k] == b[k] for k in ("train/loss", "train/learning_rate", "train/grad_norm"))
        ck.check(same, f"step {a['train/global_step']}: loss {a['train/loss']!r} vs {b['train/loss']!r}")
    # Resuming the finished run (its checkpoint is at step 12) with fewer steps than it holds runs
    # nothing, as Hugging Face's Trainer does, and says so instead of a loss no step computed.
    n_records = len(split)
    p = run([z, "run", f"{d}/second.json", "--out", f"{d}/split", "--set", "train.max_steps=1"],
            check=False)
    ck.check(p.returncode == 0, f"resuming at step 12 with max_steps 1 succeeds (exit "
             f"{p.returncode}) {p.stderr.strip()}")
    ck.check("done: nothing to train: the checkpoint is at step 12, at or past train.max_steps 1"
             in p.stdout, f"it says no step ran and why: {p.stdout.strip()}")
    ck.check("nan" not in p.stdout.lower(), f"no loss is printed that was not computed: "
             f"{p.stdout.strip()}")
    ck.check(len(read_metrics(f"{d}/split/metrics.jsonl")) == n_records,
             "no step was recorded")
ck.done()
