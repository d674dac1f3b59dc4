"""A submit token writes only into the checkpoints of jobs it submitted (security.md, "Roles"),
with a real ztraind and three tokens: two of scope submit (A's and B's) and an admin.

  a. Job 1 of token A writes checkpoints every 2 steps to 4 in its default directory
     (RUNS/job-000001/ckpt) and ends. Token B submitting a job with that directory as its
     train.checkpoint_dir and "resume": true is refused, over gRPC (PERMISSION_DENIED) and HTTP
     (403, ErrorInfo reason NOT_JOB_SUBMITTER), naming jobs/job-000001. On main it was taken:
     B's job resumed A's checkpoint and wrote its own global_step6 there, and A's `latest` then
     named a checkpoint A never wrote, which A's next resume would load.
  b. The same for a directory of A's own choosing (train.checkpoint_dir "shared"), and for one
     inside it.
  c. After the refusals, A's `latest` still names global_step4, whose meta.json records job 1.
  d. Token A itself may resume its job from that directory, and so may the admin, after which
     it is still A's (A resumes again); a daemon without tokens keeps taking it from anyone
     (test_job_isolation)."""
import json
import os
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, TERMINAL, Checker, Daemon, spec_proto, stubs, temp_dir,  # noqa: E402
                 tiny_job)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
A, B, ADMIN = "a" * 24 + "1", "b" * 24 + "2", "c" * 24 + "3"


def md(token):
    return [("authorization", f"Bearer {token}")]


def submit_grpc(d, job, token):
    try:
        j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job)), metadata=md(token),
                               timeout=30)
        return "OK", j.id
    except grpc.RpcError as e:
        return e.code().name, e.details()


def submit_http(d, job, token):
    req = urllib.request.Request(d.http_url + "/api/v1/jobs", method="POST",
                                 data=json.dumps({"spec": job}).encode(),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_ended(d, job_id, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = d.stub().GetJob(pb.GetJobRequest(id=job_id), metadata=md(ADMIN), timeout=10)
        if pb.JobState.Name(j.state).replace("JOB_STATE_", "") in TERMINAL:
            return pb.JobState.Name(j.state)
        time.sleep(0.1)
    return "still running"


def latest(ckpt):
    with open(os.path.join(ckpt, "latest")) as f:
        tag = f.read().strip()
    with open(os.path.join(ckpt, tag, "meta.json")) as f:
        return tag, json.load(f).get("job_id")


tmp = temp_dir("ztrain-ckpt-tokens-")
tokens = os.path.join(tmp, "tokens")
with open(tokens, "w") as f:
    f.write(f"{A} submit\n{B} submit\n{ADMIN} admin\n")
with Daemon(BUILD, tmp, extra_args=["--token-file", tokens]) as d:
    for dir_name, part in ((None, "a"), ("shared", "b")):
        job = tiny_job(d.data_root, max_steps=4, checkpoint_interval=2)
        if dir_name:
            job["train"]["checkpoint_dir"] = dir_name
        code, first = submit_grpc(d, job, A)
        state = wait_ended(d, first) if code == "OK" else code
        ck.check(state == "JOB_STATE_SUCCEEDED", f"{part}: A's job {first} ended: {state}")
        ckpt = os.path.join(d.runs_root, dir_name or f"{first}/ckpt")
        before = latest(ckpt)
        ck.check(before == ("global_step4", first), f"{part}: A's latest: {before}")

        again = tiny_job(d.data_root, max_steps=6, checkpoint_interval=2, resume=True,
                         checkpoint_dir=ckpt)
        inside = dict(again, train=dict(again["train"], checkpoint_dir=ckpt + "/sub"))
        for spec, what in ((again, "its checkpoint directory"), (inside, "a directory in it")):
            code, text = submit_grpc(d, spec, B)
            if code == "OK":   # taken (as on main): let it write what it would
                wait_ended(d, text)
            ck.check(code == "PERMISSION_DENIED" and f"jobs/{first}" in text and
                     "checkpoint_dir" in text and "needs admin" in text,
                     f"{part}: B's job in {what} of A's job is refused over gRPC: {code} {text}")
            status, body = submit_http(d, spec, B)
            ck.check(status == 403 and body.get("reason") == "NOT_JOB_SUBMITTER" and
                     f"jobs/{first}" in body.get("error", ""),
                     f"{part}: and over HTTP: {status} {body}")
        after = latest(ckpt)
        ck.check(after == before, f"c: A's latest after B's tries: {after}")

        for token, who in ((A, "A itself"), (ADMIN, "the admin"), (A, "A after the admin")):
            code, taken = submit_grpc(d, again, token)
            state = wait_ended(d, taken) if code == "OK" else code
            ck.check(state == "JOB_STATE_SUCCEEDED",
                     f"d: {who} resumes A's job from {ckpt}: {code} {taken} {state}")
ck.done()
