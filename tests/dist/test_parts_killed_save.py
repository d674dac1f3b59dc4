"""A checkpoint saved in parts (a pipeline's stages, a tensor-parallel job's shards) whose last
save did not finish on every part, as a job killed while saving leaves it: each part installs its
own copy and moves its own `latest`, so the first part may name global_step10 while the second
has no complete copy of it. For 2 stages and for TP 2, from an uninterrupted run of 10 steps with
a checkpoint every 5:

  the second part lacks global_step10 (killed before its DONE): `ztrain export` and `sample`
      without --tag read global_step5 as the resume does, saying which part lacks global_step10
      (export's file is that of `--tag global_step5` of the uninterrupted run's checkpoint); the
      resume says which part lacks it and resumes from global_step5, the newest checkpoint every
      part has, and steps 6-10 equal the uninterrupted run's bit for bit; every part's `latest`
      then names global_step10.
  the second part's global_step10 is finished but still under its temporary name (killed before
      its rename) and its `latest` names global_step5: the resume takes global_step10.
  the second part has no checkpoint at all: refused naming the part, and nothing is written.
  the layout marker (pipeline.json, tp.json) is damaged: refused naming it, nothing written.
  the second part's directory is a file, with 2 replicas: the save fails, and its other replica
      names the failing rank by its rank in the job (before: by its replica index, "rank 0").

Before, the pipeline refused to resume ("delete the newer stage checkpoints") and the TP job
failed loading a shard that does not exist, so a job killed while saving never resumed on its
own (ztraind's max_restarts included)."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, run, tool, write_job  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 16}
DS = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}},
      "scheduler": {"type": "WarmupDecayLR",
                    "params": {"warmup_num_steps": 3, "total_num_steps": 10}},
      "zero_optimization": {"stage": 1}}
LAYOUTS = {"pipeline": ({"pipeline": {"stages": 2}}, {}, "stage_01", "pipeline.json"),
           "tensor parallel": ({}, {"tensor_parallel": {"autotp_size": 2}}, "tp_01", "tp.json")}


def job(layout, ckpt, resume):
    extra, ds, _, _ = LAYOUTS[layout]
    return {"name": "parts", "world_size": 2, "model": GPT2,
            "data": {"train": "train.txt", "shuffle": True},
            "train": {"max_steps": 10, "log_interval": 1, "checkpoint_dir": ckpt,
                      "checkpoint_interval": 5, "resume": resume, "seed": 3},
            "deepspeed": {**DS, **ds}, **extra}


def train(d, name, spec):
    write_job(f"{d}/{name}.json", spec)
    return run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/out-{name}"],
               check=False)


def losses(d, name):
    return [m["train/loss"] for m in read_metrics(f"{d}/out-{name}/metrics.jsonl")
            if "train/loss" in m]


def listing(top):
    return sorted(os.path.relpath(os.path.join(r, f), top)
                  for r, dirs, files in os.walk(top) for f in files + dirs)


def refused_as_is(d, layout, ckpt, name, damage, says, what):
    """Resumes (run `name`) from ckpt, a copy of the uninterrupted run's checkpoint that
    damage(ckpt) changed: the run must fail, its stderr holding every string of `says`, and
    ckpt must be as it was (nothing written)."""
    shutil.copytree(f"{d}/ck-whole", ckpt)
    damage(ckpt)
    before = listing(ckpt)
    p = train(d, name, job(layout, ckpt, True))
    ck.check(p.returncode != 0 and all(s in p.stderr for s in says) and
             listing(ckpt) == before,
             f"{layout}: {what}, nothing written: {(p.stdout + p.stderr).strip()[-600:]}")
    shutil.rmtree(ckpt)


ck = Checker()
with tempfile.TemporaryDirectory() as top:
    with open(f"{top}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    for layout, (_, _, second, marker) in LAYOUTS.items():
        d = tempfile.mkdtemp(dir=top)
        shutil.copy(f"{top}/train.txt", d)
        p = train(d, "whole", job(layout, "ck-whole", False))
        whole = losses(d, "whole")
        ck.check(p.returncode == 0 and len(whole) == 10, f"{layout}: the uninterrupted run")

        # Killed before the second part's DONE: its step-10 directory never became complete.
        ckpt = f"{d}/ck-lost"
        shutil.copytree(f"{d}/ck-whole", ckpt)
        shutil.rmtree(f"{ckpt}/{second}/global_step10")
        with open(f"{ckpt}/{second}/latest", "w") as f:
            f.write("global_step5")
        # export and sample read by default the tag a resume takes (before: part 0's latest,
        # global_step10, which the second part lacks), and say so.
        for cmd in (["export", ckpt, "--out", f"{d}/default.safetensors"],
                    ["sample", ckpt, "--prompt-tokens", "1,2", "--tokens", "3"]):
            p = run([tool("ztrain")] + cmd, check=False, errors="replace")
            ck.check(p.returncode == 0 and f"{second}/global_step10" in p.stderr and
                     f"{cmd[0]}: " in p.stderr and "reading the newest checkpoint complete in "
                     "all of them, global_step5" in p.stderr,
                     f"{layout}: `{cmd[0]}` with a part without global_step10 reads "
                     f"global_step5, saying why: {(p.stdout + p.stderr).strip()[-600:]}")
        run([tool("ztrain"), "export", f"{d}/ck-whole", "--tag", "global_step5", "--out",
             f"{d}/step5.safetensors"])
        with open(f"{d}/default.safetensors", "rb") as a, open(f"{d}/step5.safetensors", "rb") as b:
            ck.check(a.read() == b.read(), f"{layout}: export's default is global_step5's weights")
        p = train(d, "lost", job(layout, ckpt, True))
        ck.check(p.returncode == 0 and f"{second}/global_step10" in p.stdout and
                 "resuming from the newest checkpoint complete in all of them, global_step5"
                 in p.stdout and "at step 5" in p.stdout,
                 f"{layout}: a part without global_step10 resumes from global_step5, saying "
                 f"which part lacks it: {(p.stdout + p.stderr).strip()[-600:]}")
        ck.check(losses(d, "lost") == whole[5:],
                 f"{layout}: steps 6-10 are the uninterrupted run's: {losses(d, 'lost')} vs "
                 f"{whole[5:]}")
        latest = {}
        for part in (second.replace("01", "00"), second):
            with open(f"{ckpt}/{part}/latest") as f:
                latest[part] = f.read().strip()
        ck.check(set(latest.values()) == {"global_step10"} and
                 os.path.exists(f"{ckpt}/{second}/global_step10/DONE"),
                 f"{layout}: every part's latest then names global_step10: {latest}")
        shutil.rmtree(ckpt)

        # Killed between the second part's DONE and its rename: global_step10 is complete there.
        shutil.copytree(f"{d}/ck-whole", ckpt)
        os.rename(f"{ckpt}/{second}/global_step10", f"{ckpt}/{second}/.global_step10.tmp")
        with open(f"{ckpt}/{second}/latest", "w") as f:
            f.write("global_step5")
        p = train(d, "renamed", job(layout, ckpt, True))
        ck.check(p.returncode == 0 and "at step 10" in p.stdout and "not complete" not in p.stdout,
                 f"{layout}: a finished copy under the temporary name resumes from step 10: "
                 f"{(p.stdout + p.stderr).strip()[-600:]}")
        shutil.rmtree(ckpt)

        # The second part never saved at all: nothing every part has.
        def no_checkpoint(ckpt):
            for name in os.listdir(f"{ckpt}/{second}"):
                shutil.rmtree(f"{ckpt}/{second}/{name}", ignore_errors=True)
            os.remove(f"{ckpt}/{second}/latest")
        refused_as_is(d, layout, ckpt, "none", no_checkpoint,
                      [f"{second}/global_step10", "no other checkpoint is"],
                      "no checkpoint on every part is refused naming the part")

        # A damaged layout marker (cut short): refused naming it. Before, a TP job took the
        # shard directories for tags without DONE, started over from step 0 and saved over them.
        def cut_marker(ckpt):
            with open(f"{ckpt}/{marker}", "r+") as f:
                f.truncate(20)
        refused_as_is(d, layout, ckpt, "marker", cut_marker,
                      [f"{ckpt}/{marker}", "cannot be resumed without it"],
                      f"a damaged {marker} is refused naming it")

        # A part that cannot save at all (its directory is a file), with 2 replicas: the part's
        # other replica names the failing rank by its rank in the job, not by its replica index
        # (rank = (stage * dp + replica) * tp + shard: the second part's replica 0 is rank 2 of
        # the pipeline, rank 1 of TP).
        os.makedirs(ckpt)
        open(f"{ckpt}/{second}", "w").close()
        spec = job(layout, ckpt, False)
        spec["world_size"] = 4
        p = train(d, "unsaved", spec)
        failing = 2 if layout == "pipeline" else 1
        out = p.stdout + p.stderr
        ck.check(p.returncode != 0 and f"rank 3: creating the checkpoint directory failed on "
                 f"rank {failing}\n" in out and f"{ckpt}/{second}: exists and is not a directory"
                 in out, f"{layout}: a part whose directory is a file fails the save naming rank "
                 f"{failing}: {out.strip()[-500:]}")
        shutil.rmtree(ckpt)
ck.done()
