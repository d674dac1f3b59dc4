"""A resume with other data or another order: data.train, train.seed and data.shuffle may change
(continued training), but the run then does not continue bit-exactly, so it says so on stderr, one
warning line for each changed key naming its old and new value. An unchanged resume says nothing;
a checkpoint written before meta.json recorded data.train is not compared on it."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from ztref import Checker, run, tool, write_job  # noqa: E402

ck = Checker()
z = tool("ztrain")
with tempfile.TemporaryDirectory() as d:
    for name, k in (("a.txt", 7), ("b.txt", 5)):
        with open(f"{d}/{name}", "wb") as f:
            f.write(bytes((i * k + i // 13) % 251 for i in range(800)))

    def job(steps, train="a.txt", seed=5, shuffle=True):
        return {"name": "resume-changes",
                "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16,
                          "vocab_size": 256, "block_size": 16},
                "data": {"train": train, "shuffle": shuffle},
                "train": {"max_steps": steps, "checkpoint_dir": "ckpt", "checkpoint_interval": 2,
                          "resume": True, "seed": seed},
                "deepspeed": {"train_batch_size": 4, "optimizer": {"type": "AdamW"}}}

    def warnings(p):
        return [line for line in p.stderr.splitlines() if "warning: resume:" in line]

    write_job(f"{d}/first.json", job(2))
    run([z, "run", f"{d}/first.json", "--out", f"{d}/out"])
    write_job(f"{d}/same.json", job(4))
    p = run([z, "run", f"{d}/same.json", "--out", f"{d}/out"])
    ck.check(warnings(p) == [], f"an unchanged resume warns of nothing: {warnings(p)}")

    write_job(f"{d}/changed.json", job(6, train="b.txt", seed=6, shuffle=False))
    p = run([z, "run", f"{d}/changed.json", "--out", f"{d}/out"])
    got = warnings(p)
    ck.check(len(got) == 3, f"three warning lines, one per changed key: {got}")
    for key, old, new in (("data.train", f"{d}/a.txt", f"{d}/b.txt"), ("train.seed", "5", "6"),
                          ("data.shuffle", "true", "false")):
        lines = [line for line in got if f" {key} " in line]
        ok = (len(lines) == 1 and lines[0].startswith("ztrain: warning:") and
              f"from {old} " in lines[0] and f"to {new}:" in lines[0] and
              "global_step4" in lines[0])
        ck.check(ok, f"{key}: one line naming {old} and {new} and the checkpoint: {lines}")

    # The newest checkpoint as one written before meta.json recorded data.train: the train
    # path is not compared (its seed and shuffle still are).
    meta_path = f"{d}/ckpt/global_step6/meta.json"
    with open(meta_path) as f:
        meta = json.load(f)
    del meta["data"]["train"]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    write_job(f"{d}/old.json", job(8, train="a.txt", seed=6, shuffle=True))
    p = run([z, "run", f"{d}/old.json", "--out", f"{d}/out"])
    got = warnings(p)
    ck.check(len(got) == 1 and " data.shuffle " in got[0],
             f"an older checkpoint: only data.shuffle is said to change: {got}")
ck.done()
