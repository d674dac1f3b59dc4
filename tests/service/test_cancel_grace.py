"""The reason of a job whose ranks were killed when the grace period ran out names the grace period
that was in force (issue 19, defect 8), with ranks that ignore SIGTERM: ztraind runs a stand-in
worker (--worker), a shell script that traps SIGTERM away and sleeps.

  a. CancelJob with grace_seconds 2, then again with grace_seconds 300 while the first is under
     way: the ranks are killed about 2 s after the first request, and the reason says 2 s (it said
     300 s).
  b. ztraind --grace 1 stopped with SIGTERM: it exits 0 soon after, and the restarted daemon shows
     the job CANCELLED with a reason naming the 1 s grace period."""
import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, get_job, state_name, stubs, temp_dir,  # noqa: E402
                 submit, tiny_job, wait_gone, wait_state)

pb = stubs()[0]
ck = Checker()

STUBBORN = """#!/bin/sh
trap '' TERM
echo "stand-in worker: ignoring SIGTERM"
while :; do sleep 0.2; done
"""


def stubborn_worker(top):
    path = os.path.join(top, "stubborn-worker")
    with open(path, "w") as f:
        f.write(STUBBORN)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def started(d, job_id):
    """Waits until the job's stand-in rank says it ignores SIGTERM; returns the Job."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}/logs?tail=50",
                                    timeout=10) as r:
            # ListLogLinesResponse: no "lines" member while the log is empty.
            lines = json.loads(r.read()).get("lines", [])
        if any("ignoring SIGTERM" in l.get("text", "") for l in lines):
            break
        time.sleep(0.05)
    return get_job(d, job_id)


def grace_in(reason):
    m = re.search(r"grace period of ([0-9.]+) s", reason)
    return float(m.group(1)) if m else None


def case_a():
    top = temp_dir("ztrain-grace-a-")
    d = Daemon(BUILD, top, extra_args=["--worker", stubborn_worker(top)])
    with d:
        j = started(d, submit(d, tiny_job(d.data_root, name="stubborn")).id)
        ck.check(state_name(j.state) in ("STARTING", "RUNNING"),
                 f"a: the stand-in rank runs ({state_name(j.state)}, pid {j.ranks[0].pid})")
        t0 = time.monotonic()
        stub = d.stub()
        stub.CancelJob(pb.CancelJobRequest(id=j.id, grace_seconds=2), metadata=d.metadata,
                       timeout=10)
        stub.CancelJob(pb.CancelJobRequest(id=j.id, grace_seconds=300), metadata=d.metadata,
                       timeout=10)
        end = wait_state(d, j.id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
        took = time.monotonic() - t0
        ck.check(state_name(end.state) == "CANCELLED", f"a: CANCELLED after {took:.1f} s "
                 f"({state_name(end.state)})")
        ck.check(took < 30, f"a: the ranks were killed when the first grace period ran out, "
                 f"not the second ({took:.1f} s)")
        ck.check(grace_in(end.reason) == 2,
                 f"a: the reason names the 2 s grace period in force: {end.reason!r}")
        ck.check(end.ranks[0].signal == 9, f"a: the rank was killed (signal {end.ranks[0].signal})")
        ck.check(not wait_gone([j.ranks[0].pid], 5), "a: no rank left")
    ck.check(not d.sanitizer_errors(), f"a: no sanitizer report from ztraind {d.sanitizer_errors()}")


def case_b():
    top = temp_dir("ztrain-grace-b-")
    d = Daemon(BUILD, top, grace=1, extra_args=["--worker", stubborn_worker(top)])
    j = started(d, submit(d, tiny_job(d.data_root, name="stubborn")).id)
    t0 = time.monotonic()
    rc = d.stop(timeout=60)
    took = time.monotonic() - t0
    ck.check(rc == 0, f"b: ztraind exits 0 on SIGTERM (got {rc}) after {took:.1f} s")
    ck.check(took < 20, f"b: it did not wait past the 1 s grace period by much ({took:.1f} s)")
    ck.check(not wait_gone([j.ranks[0].pid], 5), "b: no rank left")
    d.start()
    end = get_job(d, j.id)
    ck.check(state_name(end.state) == "CANCELLED" and "ztraind was stopped" in end.reason,
             f"b: the job is CANCELLED because ztraind stopped: {end.reason!r}")
    ck.check(grace_in(end.reason) == 1,
             f"b: the reason names the 1 s grace period: {end.reason!r}")
    d.stop()
    ck.check(not d.sanitizer_errors(), f"b: no sanitizer report from ztraind {d.sanitizer_errors()}")


case_a()
case_b()
ck.done()
