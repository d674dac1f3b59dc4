"""Two jobs that share a checkpoint directory each list only the checkpoints they wrote, with a
real ztraind, over gRPC (ListCheckpoints) and HTTP (/checkpoints).

Job A (checkpoints every 2 steps to 4) ends; job B, another model, is then submitted with the
same relative train.checkpoint_dir "ckpt" (RUNS/ckpt, accepted once A has ended) and writes
checkpoints every 3 steps to 6, so RUNS/ckpt/latest names B's global_step6. On main, A's list
showed B's global_step3 and global_step6, and global_step6 as A's latest. Here:
  - A lists global_step2 and global_step4 (the multiples of its interval), and no latest: the
    latest file names B's checkpoint;
  - B lists global_step3 and global_step6, latest global_step6;
  - a checkpoint that records no job (as `ztrain run` and older versions write them: here a copy
    of one of A's with meta.json's "job_id" taken out) is listed for both, as before;
  - each checkpoint's meta.json names the job that wrote it: the one whose model it holds (A's
    has n_embd 32, B's 64)."""
import json
import os
import shutil
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, TERMINAL, Checker, Daemon, stubs, submit, temp_dir,  # noqa: E402
                 tiny_job, wait_state)

pb = stubs()[0]
ck = Checker()


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=10) as r:
        return json.loads(r.read())


def grpc_list(d, job_id):
    r = d.stub().ListCheckpoints(pb.ListCheckpointsRequest(id=job_id), metadata=d.metadata,
                                 timeout=30)
    return [c.tag for c in r.checkpoints], r.latest


def http_list(d, job_id):
    body = http_json(d, f"/api/v1/jobs/{job_id}/checkpoints")
    return [c["tag"] for c in body.get("checkpoints", [])], body.get("latest", "")


def expected_tags(interval, max_steps):
    return [f"global_step{s}" for s in range(interval, max_steps + 1, interval)]


with Daemon(BUILD, temp_dir("ztrain-ckpt-owner-"), max_ranks=1) as d:
    a_job = tiny_job(d.data_root, name="a", max_steps=4, checkpoint_interval=2,
                     checkpoint_dir="ckpt")
    a = wait_state(d, submit(d, a_job).id, TERMINAL, timeout=120)
    ck.check(a.state == pb.JOB_STATE_SUCCEEDED, f"job A succeeded ({a.reason!r})")
    b_job = tiny_job(d.data_root, name="b", max_steps=6, checkpoint_interval=3,
                     checkpoint_dir="ckpt")
    b_job["model"]["n_embd"] = 64
    b = wait_state(d, submit(d, b_job).id, TERMINAL, timeout=120)
    ck.check(b.state == pb.JOB_STATE_SUCCEEDED, f"job B succeeded ({b.reason!r})")
    shared = a.checkpoint_dir
    ck.check(os.path.realpath(shared) == os.path.realpath(b.checkpoint_dir) ==
             os.path.realpath(os.path.join(d.runs_root, "ckpt")),
             f"both write into RUNS/ckpt: {a.checkpoint_dir} {b.checkpoint_dir}")
    with open(os.path.join(shared, "latest")) as f:
        latest_on_disk = f.read().strip()
    ck.check(latest_on_disk == "global_step6", f"RUNS/ckpt/latest names B's: {latest_on_disk}")

    # Which job wrote each checkpoint, from its weights' shape: A's model has n_embd 32, B's 64.
    by_width = {a_job["model"]["n_embd"]: a.id, b_job["model"]["n_embd"]: b.id}
    for tag in sorted(t for t in os.listdir(shared) if t.startswith("global_step")):
        with open(os.path.join(shared, tag, "meta.json")) as f:
            meta = json.load(f)
        writer = by_width.get(meta["model"]["n_embd"])
        ck.check(meta.get("job_id") == writer,
                 f"{tag}/meta.json names the job whose model it holds: {meta.get('job_id')} "
                 f"(n_embd {meta['model']['n_embd']}: {writer})")

    a_tags, b_tags = expected_tags(2, 4), expected_tags(3, 6)
    for name, j, tags, latest in (("A", a, a_tags, ""), ("B", b, b_tags, "global_step6")):
        for how, got in (("gRPC", grpc_list(d, j.id)), ("HTTP", http_list(d, j.id))):
            ck.check(got == (tags, latest),
                     f"{how}: {name} lists its own {tags} and latest {latest!r}: {got}")

    # A checkpoint that records no writer: a copy of A's first without "job_id", under a tag of
    # its own.
    legacy = os.path.join(shared, "global_step1")
    shutil.copytree(os.path.join(shared, "global_step2"), legacy)
    with open(os.path.join(legacy, "meta.json")) as f:
        meta = json.load(f)
    meta.pop("job_id", None)
    with open(os.path.join(legacy, "meta.json"), "w") as f:
        json.dump(meta, f)
    for name, j, tags, latest in (("A", a, a_tags, ""), ("B", b, b_tags, "global_step6")):
        for how, got in (("gRPC", grpc_list(d, j.id)), ("HTTP", http_list(d, j.id))):
            ck.check(got == (["global_step1"] + tags, latest),
                     f"{how}: {name} also lists the checkpoint without a writer: {got}")
ck.done()
