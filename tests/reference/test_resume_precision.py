"""A resume that changes the precision. DeepSpeed's dynamic loss scaler starts at
2^initial_scale_power and a load restores its state from the checkpoint; a checkpoint of fp32
training has no dynamic scaler (its scale is a fixed 1), so an fp16 run resumed from it starts at
2^initial_scale_power as a fresh fp16 run does, and says on stderr that the precision changed. An
fp16 checkpoint's scale is still restored: resumed with another initial_scale_power, the scale
goes on from the checkpoint's. A stage-0 fp16 run with hysteresis -1 (which that scaler does not
read) resumes from its checkpoint."""
import json
import shutil
import tempfile

from ztref import Checker, read_metrics, run, tool, write_job

ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(1200)))

    def job(max_steps, fp16_power, ckpt="ckpt"):
        ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
        if fp16_power is not None:
            ds["fp16"] = {"enabled": True, "initial_scale_power": fp16_power}
        return {"name": "resume-precision",
                "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32,
                          "vocab_size": 256, "block_size": 16},
                "data": {"train": "train.txt"},
                "train": {"max_steps": max_steps, "log_interval": 1, "checkpoint_dir": ckpt,
                          "checkpoint_interval": 5, "resume": True, "seed": 5},
                "deepspeed": ds}

    write_job(f"{d}/fp32.json", job(5, None))
    write_job(f"{d}/fp16.json", job(10, 8))
    write_job(f"{d}/fp16-more.json", job(12, 12))
    write_job(f"{d}/fp16-old.json", job(6, 8, "ckpt-old"))
    z = tool("ztrain")
    run([z, "run", f"{d}/fp32.json", "--out", f"{d}/out", "--threads", "2"])
    # The same checkpoint as one written before meta.json recorded the precision and whether
    # the scaler was dynamic: its deepspeed section says fp32.
    shutil.copytree(f"{d}/ckpt", f"{d}/ckpt-old")
    with open(f"{d}/ckpt-old/global_step5/meta.json") as f:
        meta = json.load(f)
    del meta["precision"], meta["loss_scaler"]["dynamic"]
    with open(f"{d}/ckpt-old/global_step5/meta.json", "w") as f:
        json.dump(meta, f)
    p = run([z, "run", f"{d}/fp16-old.json", "--out", f"{d}/out-old", "--threads", "2"])
    got = [m.get("train/loss_scale") for m in read_metrics(f"{d}/out-old/metrics.jsonl")
           if m.get("train/global_step") == 6]
    ck.check(got == [2.0 ** 8], f"step 6 from an older fp32 checkpoint: loss scale {got}, want 2^8")
    ck.check("precision changed from fp32" in p.stderr, f"and the warning: {p.stderr!r}")
    p = run([z, "run", f"{d}/fp16.json", "--out", f"{d}/out", "--threads", "2"])
    metrics = {m["train/global_step"]: m for m in read_metrics(f"{d}/out/metrics.jsonl")
               if "train/global_step" in m}
    for step in range(6, 11):
        got = metrics.get(step, {}).get("train/loss_scale")
        ck.check(got == 2.0 ** 8, f"step {step} (fp16 from an fp32 checkpoint): loss scale {got}, "
                                  f"want 2^8 as a fresh run")
    lines = [l for l in p.stderr.splitlines() if "precision" in l]
    ck.check(len(lines) == 1 and "warning" in lines[0] and "fp32" in lines[0] and "fp16" in lines[0]
             and "2^8" in lines[0],
             f"stderr says the precision changed from fp32 to fp16, and the scale's start: {lines}")
    ck.check(not any(k in p.stderr for k in ("data.train", "train.seed", "data.shuffle")),
             f"and nothing else changed: {p.stderr!r}")

    p = run([z, "run", f"{d}/fp16-more.json", "--out", f"{d}/out", "--threads", "2"])
    metrics = {m["train/global_step"]: m for m in read_metrics(f"{d}/out/metrics.jsonl")
               if "train/global_step" in m}
    got = metrics.get(11, {}).get("train/loss_scale")
    ck.check(got == 2.0 ** 8, f"step 11 (fp16 from an fp16 checkpoint): loss scale {got}, the "
                              f"checkpoint's 2^8, not initial_scale_power 12")
    ck.check("precision" not in p.stderr, f"no precision warning fp16 to fp16: {p.stderr!r}")

    # At stage 0 DeepSpeed's FP16_Optimizer never reads hysteresis and takes any int: a
    # checkpoint's scaler then holds the negative count, and the run resumes from it.
    neg = job(10, 30, "ckpt-neg")
    neg["deepspeed"]["fp16"]["hysteresis"] = -1
    neg["train"]["max_steps"] = 5
    write_job(f"{d}/neg.json", neg)
    neg["train"]["max_steps"] = 10
    write_job(f"{d}/neg-more.json", neg)
    run([z, "run", f"{d}/neg.json", "--out", f"{d}/out-neg", "--threads", "2"])
    with open(f"{d}/ckpt-neg/global_step5/meta.json") as f:
        saved = json.load(f)["loss_scaler"]["cur_hysteresis"]
    p = run([z, "run", f"{d}/neg-more.json", "--out", f"{d}/out-neg", "--threads", "2"],
            check=False)
    ck.check(saved == -1 and p.returncode == 0 and "resumed from" in p.stdout + p.stderr,
             f"fp16 stage 0, hysteresis -1: cur_hysteresis {saved} saved, the resume exits "
             f"{p.returncode} ({p.stderr[-300:]!r})")
ck.done()
