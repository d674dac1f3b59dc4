"""A tensor-parallel checkpoint directory keeps every tag readable after a resume at another TP
size: each tag's shard-0 meta.json keeps the layout its shards were saved in ("tensor_parallel"),
and readers go by it rather than tp.json, which describes only the newest save.

A tp 2 job saves global_step5; the same directory resumed at tp 1 saves global_step10 (tp.json
now says tp 1). Then:
- `ztrain export --tag global_step5` equals the tp 2 shards joined here by the layout tp.json had
  when they were saved (a copy taken then), bit for bit;
- with global_step10 gone, the tp 2 tag resumes at tp 1 and continues bit-identically to the tp 1
  run that first resumed it (losses, gradient norms, final weights), and at tp 2 bit-identically
  to the tp 2 run that never stopped;
- a tag without the layout in its meta.json (saved by an older ztrain) is read by tp.json, and
  when tp.json is of another TP size the error says so."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, run, st_read, tool  # noqa: E402
from tpref import GPT2, STEPS, identical, job, tp_join, train, write_text  # noqa: E402

HALF = STEPS // 2


def joined(d, tag):
    """The shards of tensor-parallel directory d at tag, joined by d/tp.json."""
    return tp_join(d, lambda t: st_read(f"{d}/tp_{t:02d}/{tag}/model.safetensors")[0])


def set_latest(d, tag, drop):
    """d's shards resume from tag: the newer tag `drop` removed, latest pointed back."""
    shutil.rmtree(f"{d}/tp_00/{drop}")
    with open(f"{d}/tp_00/latest", "w") as f:
        f.write(tag)


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_text(d)
    ref2 = train(d, "tp2-whole", job(GPT2, 2, 1, "ck-tp2-whole", zero=1))
    train(d, "tp2-half", job(GPT2, 2, 1, "ck", zero=1, steps=HALF), export=False)
    shutil.copytree(f"{d}/ck", f"{d}/ck-at-save")
    tp1 = train(d, "tp1-resumed", job(GPT2, 1, 1, "ck", zero=1))
    with open(f"{d}/ck/tp.json") as f:
        ck.check(json.load(f)["tp"] == 1 and "resumed from" in tp1[3],
                 "the tp 2 checkpoint resumed at tp 1, whose save rewrote tp.json to tp 1")

    tag = f"global_step{HALF}"
    p = run([tool("ztrain"), "export", f"{d}/ck", "--tag", tag, "--out", f"{d}/old.safetensors"],
            check=False)
    want = joined(f"{d}/ck-at-save", tag)
    got = st_read(f"{d}/old.safetensors")[0] if p.returncode == 0 else {}
    ck.check(p.returncode == 0 and sorted(got) == sorted(want) and
             all(torch.equal(got[k], want[k]) for k in want),
             f"export --tag {tag} (saved at tp 2) is its shards joined, bit for bit "
             f"({p.stderr.strip()[-200:]})")

    # The tp 2 tag resumed again, the tp 1 save gone: at tp 1 as the first resume, and at tp 2
    # as the run that never stopped.
    for tp, ref in ((1, tp1), (2, ref2)):
        shutil.copytree(f"{d}/ck", f"{d}/ck-again{tp}")
        set_latest(f"{d}/ck-again{tp}", tag, f"global_step{STEPS}")
        spec = job(GPT2, tp, 1, f"ck-again{tp}", zero=1)
        try:
            got = train(d, f"again{tp}", spec)
        except SystemExit:
            got = ([], [], {}, "")
        ck.check(f"at step {HALF}" in got[3], f"the tp 2 tag resumes at tp {tp} from step {HALF}")
        identical(ck, f"the tp 2 tag resumed at tp {tp} against the tp {tp} run", ref, got)

    # An older tag without the layout in its meta.json: read by tp.json, which is now tp 1.
    shutil.copytree(f"{d}/ck", f"{d}/ck-old")
    for t in range(2):
        path = f"{d}/ck-old/tp_{t:02d}/{tag}/meta.json"
        with open(path) as f:
            meta = json.load(f)
        meta.pop("tensor_parallel", None)
        with open(path, "w") as f:
            json.dump(meta, f)
    p = run([tool("ztrain"), "export", f"{d}/ck-old", "--tag", tag, "--out", f"{d}/x.safetensors"],
            check=False)
    ck.check(p.returncode != 0 and "tp 1" in p.stderr and "tp.json" in p.stderr and
             "newest save" in p.stderr,
             f"a tag without its layout, tp.json of another size: the error names both "
             f"({p.stderr.strip()[-300:]})")
ck.done()
