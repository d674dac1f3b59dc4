"""Forks with tensor parallelism: SubmitJob with fork_from {job, step} where the parent, the fork
or both run at tp 2 (DeepSpeed's tensor_parallel.autotp_size). ztraind puts every shard's
checkpoint of that step (tp_<t>/ beside tp.json) into the fork's directory, and the fork resumes
them at its own TP size, resharded when it differs.

The reference is the single-rank fork: a tp 1 parent forked at tp 1 with a lower learning rate.
- A tp 2 fork of the tp 1 parent, and tp 2 and tp 1 forks of a tp 2 parent (whose first 8 steps
  were computed at tp 2), follow it for the remaining steps: losses within 1e-6 relative, the
  final weights (the fork's checkpoint exported whole) within 1e-5 per tensor, test_tp_parity's
  tolerances.
- A fork at the parent's own TP size starts from the parent's weights exactly: its first loss is
  the parent's at that step, bit for bit.
- A tp 2 parent whose shard 1 lacks the step is refused naming the shard."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, spec_proto, state_name, stubs, temp_dir,  # noqa: E402
                 tiny_job, wait_state)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from ztref import rel_err, st_read  # noqa: E402

import grpc  # noqa: E402
import urllib.request  # noqa: E402

c = Checker()
pb = stubs()[0]
ZTRAIN = os.path.join(BUILD, "ztrain")
STEPS, INTERVAL, FORK_AT = 12, 4, 8


def job(d, name, tp, lr):
    j = tiny_job(d.data_root, name=name, max_steps=STEPS, checkpoint_interval=INTERVAL)
    j["world_size"] = tp
    j["deepspeed"] = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                      "optimizer": {"type": "AdamW", "params": {"lr": lr, "eps": 1e-4}}}
    if tp > 1:
        j["deepspeed"]["tensor_parallel"] = {"autotp_size": tp}
    return j


def submit(d, spec_dict, parent=None, step=0):
    spec = spec_proto(spec_dict)
    if parent:
        spec.fork_from.job = parent
        spec.fork_from.step = step
    j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)
    j = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    c.check(state_name(j.state) == "SUCCEEDED",
            f"{spec_dict['name']} ({j.id}) SUCCEEDED ({j.reason!r})")
    return j


def losses(d, job_id):
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}/records", timeout=10) as r:
        page = view(f"/api/v1/jobs/{job_id}/records", json.loads(r.read()))
    return {r["step"]: r["values"]["train/loss"] for r in page["records"]
            if "train/loss" in r["values"]}


def weights(tmp, j):
    out = os.path.join(tmp, j.id + ".safetensors")
    p = subprocess.run([ZTRAIN, "export", j.checkpoint_dir, "--out", out], capture_output=True,
                       text=True, timeout=120)
    c.check(p.returncode == 0, f"{j.id}'s checkpoint exports ({p.stderr.strip()[-200:]})")
    return st_read(out)[0] if p.returncode == 0 else {}


def follows(what, ref, got):
    (rl, rw), (gl, gw) = ref, got
    steps = list(range(FORK_AT + 1, STEPS + 1))
    worst = max((abs(gl[s] - rl[s]) / abs(rl[s]) for s in steps if s in gl and s in rl),
                default=1.0)
    c.check(sorted(gl) == steps and worst <= 1e-6,
            f"{what}: steps {sorted(gl)}, losses within {worst:.1e} of the single-rank fork's")
    err, name = max(((rel_err(gw[k], rw[k]), k) for k in rw if k in gw), default=(1.0, "-"))
    c.check(sorted(gw) == sorted(rw) and err <= 1e-5,
            f"{what}: final weights, worst tensor {name} rel err {err:.1e}")


tmp = temp_dir("ztrain-tp-fork-")
d = Daemon(BUILD, os.path.join(tmp, "daemon"), max_ranks=2)
p1 = submit(d, job(d, "parent-tp1", 1, 1e-2))
p2 = submit(d, job(d, "parent-tp2", 2, 1e-2))
c.check(os.path.exists(os.path.join(p2.checkpoint_dir, "tp.json")),
        "the tp 2 parent saves tensor-parallel checkpoints")
p1_losses, p2_losses = losses(d, p1.id), losses(d, p2.id)

f1 = submit(d, job(d, "fork-tp1-of-tp1", 1, 5e-3), p1.id, FORK_AT)
ref = (losses(d, f1.id), weights(tmp, f1))
c.check(ref[0].get(FORK_AT + 2) != p1_losses.get(FORK_AT + 2),
        "the single-rank fork's learning rate changes its trajectory from the parent's")

for name, tp, parent, parent_losses in (("fork-tp2-of-tp1", 2, p1, p1_losses),
                                        ("fork-tp2-of-tp2", 2, p2, p2_losses),
                                        ("fork-tp1-of-tp2", 1, p2, p2_losses)):
    f = submit(d, job(d, name, tp, 5e-3), parent.id, FORK_AT)
    got = (losses(d, f.id), weights(tmp, f))
    if f"tp{tp}-of-tp{tp}" in name:
        c.check(got[0].get(FORK_AT + 1) == parent_losses.get(FORK_AT + 1),
                f"{name}: its first loss is the parent's at step {FORK_AT + 1}, bit for bit")
    follows(name, ref, got)
    c.check(os.path.exists(os.path.join(f.checkpoint_dir, "tp.json")) == (tp > 1 or parent is p2),
            f"{name}: checkpoints in the tensor-parallel layout where either side has TP")

# A shard without the step: refused by name, before anything is linked.
shutil.rmtree(os.path.join(p2.checkpoint_dir, "tp_01", f"global_step{INTERVAL}"))
try:
    spec = spec_proto(job(d, "no-shard", 2, 5e-3))
    spec.fork_from.job = p2.id
    spec.fork_from.step = INTERVAL
    j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)
    c.check(False, f"a fork of a step shard 1 lacks is refused (accepted as {j.id})")
except grpc.RpcError as e:
    text = e.details() or ""
    c.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "shard 1 of 2" in text and
            "fork_from.step" in text, f"a fork of a step shard 1 lacks: {e.code().name} {text!r}")

errors = d.sanitizer_errors()
c.check(not errors, f"no sanitizer report in ztraind's log: {errors}")
d.stop()
c.done()
