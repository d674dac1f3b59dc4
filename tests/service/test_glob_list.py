"""A data glob is expanded once, when the job is checked (issue 34, defect 8), with a real
ztraind and real jobs.

On main the ranks expanded data.train's glob again when they started: a symlink added while the
job was queued mapped a file outside the data root into its training data. Here the checked
matches go into the spec (data.train_files) and the ranks open those, each re-checked:
  a. A job on "shards/a*.txt" (two files) waits behind another. Meanwhile shards/a2.txt appears,
     a symlink to an empty file outside the data root (reading it would fail the job). The job
     then runs to SUCCEEDED, its spec listing exactly the two files that were checked.
  b. Another such job waits; meanwhile shards/a1.txt is replaced by a symlink to a file outside
     the data root. The job FAILS with a reason naming a1.txt and that it changed since the job
     was checked; it never trains on the outside file.
(A submitted spec that names data.train_files itself is refused by spec_check: gRPC's DataSpec
cannot carry one, so that refusal is for JSON specs.)"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, TEXT, Checker, Daemon, get_job, state_name, stubs, submit,  # noqa: E402
                 temp_dir, tiny_job, wait_state, wait_step, write_data)

pb = stubs()[0]
ck = Checker()
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}

tmp = temp_dir("ztrain-glob-")
outside = os.path.join(tmp, "outside")
os.makedirs(outside)
open(os.path.join(outside, "empty.txt"), "wb").close()
with open(os.path.join(outside, "secret.txt"), "wb") as f:
    f.write(b"the operator's secret, not training data. " * 200)


def glob_job(d, name):
    job = tiny_job(d.data_root, name=name, max_steps=4)
    job["data"]["train"] = "shards/a*.txt"
    return job


def run_behind(d, job, meanwhile):
    """Submits job behind a running blocker, calls meanwhile() while it is queued, then lets
    it run; returns its final Job."""
    blocker = submit(d, tiny_job(d.data_root, name="blocker", max_steps=LONG, log_interval=5))
    wait_step(d, blocker.id, 1, timeout=120)
    j = submit(d, job)
    ck.check(state_name(get_job(d, j.id).state) == "QUEUED", f"{job['name']} waits in the queue")
    meanwhile()
    d.stub().CancelJob(pb.CancelJobRequest(id=blocker.id), timeout=30)
    return wait_state(d, j.id, TERMINAL, timeout=180)


with Daemon(BUILD, tmp, max_ranks=1) as d:
    shards = os.path.join(d.data_root, "shards")
    for name in ("a0.txt", "a1.txt"):
        write_data(d.data_root, os.path.join("shards", name), TEXT)

    end = run_behind(d, glob_job(d, "added"), lambda: os.symlink(
        os.path.join(outside, "empty.txt"), os.path.join(shards, "a2.txt")))
    with open(os.path.join(end.run_dir, "job.json")) as f:
        files = json.load(f).get("data", {}).get("train_files")
    ck.check(state_name(end.state) == "SUCCEEDED",
             f"a: a match added while queued is not read: {state_name(end.state)} ({end.reason})")
    ck.check(files and [os.path.basename(f) for f in files] == ["a0.txt", "a1.txt"],
             f"a: the spec lists the two checked files ({files})")
    os.remove(os.path.join(shards, "a2.txt"))

    def swap():
        os.remove(os.path.join(shards, "a1.txt"))
        os.symlink(os.path.join(outside, "secret.txt"), os.path.join(shards, "a1.txt"))

    end = run_behind(d, glob_job(d, "swapped"), swap)
    ck.check(state_name(end.state) == "FAILED" and "a1.txt" in end.reason and
             "changed since the job was checked" in end.reason,
             f"b: a checked file swapped for a symlink outside fails the job: "
             f"{state_name(end.state)} ({end.reason[:200]})")

ck.done()
