"""A job may not write into another job's checkpoints or run directory (issue 34, defect 7), with
a real ztraind and Python grpcio.

On main, train.checkpoint_dir set to a running job's RUNS/<id>/ckpt was accepted: its checkpoints
became that job's `latest`, and that job's next automatic restart resumed from them. Here:
  a. While job A runs: checkpoint_dir = A's checkpoint directory, a directory inside it, A's run
     directory, and a directory inside A's run directory are each INVALID_ARGUMENT naming A.
  b. Two submits naming the same new directory: the first is taken, the second (while the first
     is queued or running) refused.
  c. Once job E has ended, a new job may resume from E's checkpoint directory (how a cancelled job
     continues, README), but not write elsewhere in E's run directory nor in a directory that
     holds it, and the refusal says which of the two it is.
  e. A DeepSpeed monitor (tensorboard, csv_monitor) writing inside A's run or checkpoint
     directory, or an ended job's run directory, is INVALID_ARGUMENT naming the key and the job;
     one of its own elsewhere in the runs root is taken; A's TensorBoard directory holds only
     A's own event file (on main a second job's was there, and in A's tensorboard.tar).
  d. A's checkpoints are all A's own: every meta.json under its checkpoint directory is from A's
     run (nothing else wrote there)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, stubs, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state, wait_step)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def refusal(d, job):
    try:
        j = submit(d, job)
        return "taken " + j.id
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"


with Daemon(BUILD, temp_dir("ztrain-iso-"), max_ranks=2) as d:
    e = submit(d, tiny_job(d.data_root, name="ended", max_steps=4, checkpoint_interval=2))
    e = wait_state(d, e.id, TERMINAL, timeout=120)
    a = submit(d, tiny_job(d.data_root, name="victim", max_steps=LONG, checkpoint_interval=5,
                           log_interval=5))
    a = wait_step(d, a.id, 6, timeout=120)
    taken = []
    for what, path in (("its checkpoint directory", a.checkpoint_dir),
                       ("a directory in its checkpoints", os.path.join(a.checkpoint_dir, "x")),
                       ("its run directory", a.run_dir),
                       ("a directory in its run directory", os.path.join(a.run_dir, "mine"))):
        r = refusal(d, tiny_job(d.data_root, name="intruder", max_steps=LONG,
                                checkpoint_dir=path, checkpoint_interval=1))
        ck.check(r.startswith("INVALID_ARGUMENT") and "train.checkpoint_dir" in r and a.id in r,
                 f"a: running job's {what} is refused: {r}")
        if r.startswith("taken"):
            taken.append(r.split()[1])
    for t in taken:
        d.stub().CancelJob(pb.CancelJobRequest(id=t), timeout=30)

    shared = os.path.join(d.runs_root, "shared-ckpt")
    r1 = refusal(d, tiny_job(d.data_root, name="first", max_steps=LONG, checkpoint_dir=shared))
    r2 = refusal(d, tiny_job(d.data_root, name="second", max_steps=LONG, checkpoint_dir=shared))
    ck.check(r1.startswith("taken") and r2.startswith("INVALID_ARGUMENT") and r1.split()[-1] in r2,
             f"b: one new directory for one live job: {r1} / {r2}")
    for r in (r1, r2):
        if r.startswith("taken"):
            d.stub().CancelJob(pb.CancelJobRequest(id=r.split()[1]), timeout=30)

    r = refusal(d, tiny_job(d.data_root, name="resume", max_steps=6, resume=True,
                            checkpoint_dir=e.checkpoint_dir))
    ck.check(r.startswith("taken"), f"c: an ended job's checkpoint directory may be resumed: {r}")
    if r.startswith("taken"):
        wait_state(d, r.split()[1], TERMINAL, timeout=120)
    r = refusal(d, tiny_job(d.data_root, name="squat", max_steps=3,
                            checkpoint_dir=os.path.join(e.run_dir, "other")))
    ck.check(r.startswith("INVALID_ARGUMENT") and
             f"is inside the run directory of jobs/{e.id}" in r,
             f"c: elsewhere in an ended job's run directory is refused: {r}")
    # A directory above it (the runs root, where checkpoint_dir "." resolves) contains it: the
    # message says so, not the reverse.
    r = refusal(d, tiny_job(d.data_root, name="above", max_steps=3,
                            checkpoint_dir=os.path.dirname(e.run_dir)))
    ck.check(r.startswith("INVALID_ARGUMENT") and
             f"contains the run directory of jobs/{e.id}" in r and "is inside" not in r,
             f"c: a directory holding an ended job's run directory is refused: {r}")

    # e. DeepSpeed's monitors write where output_path/job_name say, inside the runs root: not
    # in another job's run or checkpoint directory. Put in A's, the intruder's event files
    # became part of A's TensorBoard export (tensorboard.tar).
    tb_dir = os.path.join(a.run_dir, "tensorboard")
    for key, out, name, whose in (("tensorboard", a.run_dir, "tensorboard", a.id),
                                  ("csv_monitor", a.checkpoint_dir, "csv", a.id),
                                  ("tensorboard", e.run_dir, "", e.id)):
        job = tiny_job(d.data_root, name="monitor-intruder", max_steps=3)
        job["deepspeed"][key] = {"enabled": True, "output_path": out, "job_name": name}
        r = refusal(d, job)
        ck.check(r.startswith("INVALID_ARGUMENT") and f"deepspeed.{key} output_path" in r and
                 f"jobs/{whose}" in r, f"e: {key} in {out} is refused: {r}")
        if r.startswith("taken"):
            wait_state(d, r.split()[1], TERMINAL, timeout=120)
    job = tiny_job(d.data_root, name="monitor-elsewhere", max_steps=3)
    job["deepspeed"]["tensorboard"] = {"enabled": True, "output_path": "tb-elsewhere"}
    r = refusal(d, job)
    ck.check(r.startswith("taken"), f"e: a monitor directory of its own is taken: {r}")
    if r.startswith("taken"):
        wait_state(d, r.split()[1], TERMINAL, timeout=120)
    events = sorted(os.listdir(tb_dir)) if os.path.isdir(tb_dir) else []
    ck.check(len(events) == 1, f"e: A's TensorBoard directory holds only A's event file: {events}")

    d.stub().CancelJob(pb.CancelJobRequest(id=a.id), timeout=30)
    a = wait_state(d, a.id, TERMINAL, timeout=120)
    metas = []
    for root, _, files in os.walk(a.checkpoint_dir):
        if "meta.json" in files:
            metas.append(root)
    foreign = [m for m in metas if os.path.basename(m).startswith("global_step") and
               not os.path.exists(os.path.join(m, "DONE"))]
    ck.check(metas and not foreign and not os.path.exists(os.path.join(a.checkpoint_dir, "x")),
             f"d: the victim's checkpoints are its own ({len(metas)} tags, no stranger's dir)")
ck.done()
