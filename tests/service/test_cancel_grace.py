"""The reason of a job whose ranks were killed when the grace period ran out names the grace period
that was in force (issue 19, defect 8), with ranks that ignore SIGTERM: ztraind runs a stand-in
worker (--worker), a shell script that traps SIGTERM away and sleeps.

  a. CancelJob with grace_seconds 2, then again with grace_seconds 300 while the first is under
     way: the ranks are killed about 2 s after the first request, and the reason says 2 s (it said
     300 s).
  b. ztraind --grace 1 stopped with SIGTERM: it exits 0 soon after, and the restarted daemon shows
     the job CANCELLED with a reason naming the 1 s grace period.
  c. A cancel that lands before the ranks have met: rank 0 is the real ztrain-worker, waiting at
     the rendezvous for rank 1, a stand-in that never joins and exits 130 on SIGTERM as a real
     rank stopped there does. Both exit 130, the checkpoint directory has no `latest`, and the
     reason says the ranks stopped before training began without writing a checkpoint (it said
     they wrote one).
  d. ztraind --grace 1 stopped with SIGTERM while a job is already being cancelled with
     grace_seconds 300: ztraind exits soon after (it waited the 300 s: shutdown passed over jobs
     already cancelling) and no rank is left."""
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


# Rank 0 the real worker; every other rank a stand-in that never joins the rendezvous and exits
# as a real rank stopped there does (130, ztrain_worker.c).
LATE_PEER = """#!/bin/sh
if [ "$RANK" = 0 ]; then exec "{worker}" "$@"; fi
trap 'exit 130' TERM
echo "stand-in rank $RANK: not joining the rendezvous"
while :; do sleep 0.2; done
"""


def late_peer_worker(top):
    path = os.path.join(top, "late-peer-worker")
    with open(path, "w") as f:
        f.write(LATE_PEER.format(worker=os.path.join(BUILD, "ztrain-worker")))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def takes_stop_signals(pid, timeout=30):
    """Waits until the process has its thread that takes SIGTERM (ztrain/stop_signals.h), so
    that a cancel stops it rather than kills it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for t in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{t}/comm") as f:
                    if f.read().strip() == "zt-stop-signals":
                        return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


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


def case_c():
    top = temp_dir("ztrain-grace-c-")
    d = Daemon(BUILD, top, extra_args=["--worker", late_peer_worker(top), "--max-ranks", "2"])
    with d:
        job_id = submit(d, tiny_job(d.data_root, name="late-peer", world_size=2)).id
        deadline = time.monotonic() + 30
        j = get_job(d, job_id)
        while (len(j.ranks) < 2 or not j.ranks[0].pid) and time.monotonic() < deadline:
            time.sleep(0.05)
            j = get_job(d, job_id)
        waiting = bool(j.ranks) and takes_stop_signals(j.ranks[0].pid)
        ck.check(waiting, f"c: rank 0, the real worker, waits at the rendezvous "
                 f"({state_name(j.state)})")
        d.stub().CancelJob(pb.CancelJobRequest(id=job_id), metadata=d.metadata, timeout=10)
        end = wait_state(d, job_id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
        codes = [r.exit_code for r in end.ranks]
        latest = os.path.join(end.checkpoint_dir, "latest")
        ck.check(state_name(end.state) == "CANCELLED" and codes == [130, 130] and
                 not os.path.exists(latest),
                 f"c: CANCELLED, both ranks exit 130, no checkpoint ({state_name(end.state)}, "
                 f"{codes}, latest there: {os.path.exists(latest)})")
        ck.check("before training began" in end.reason and
                 "without writing a checkpoint" in end.reason and
                 "wrote a checkpoint" not in end.reason,
                 f"c: the reason says no checkpoint was written: {end.reason!r}")
    ck.check(not d.sanitizer_errors(), f"c: no sanitizer report from ztraind {d.sanitizer_errors()}")


def case_d():
    top = temp_dir("ztrain-grace-d-")
    d = Daemon(BUILD, top, grace=1, extra_args=["--worker", stubborn_worker(top)])
    j = started(d, submit(d, tiny_job(d.data_root, name="stubborn")).id)
    d.stub().CancelJob(pb.CancelJobRequest(id=j.id, grace_seconds=300), metadata=d.metadata,
                       timeout=10)
    t0 = time.monotonic()
    rc = d.stop(timeout=60)
    took = time.monotonic() - t0
    ck.check(rc == 0 and took < 20, f"d: ztraind exits 0 about --grace 1 s after SIGTERM, not "
             f"after the job's 300 s (rc {rc}, {took:.1f} s)")
    ck.check(not wait_gone([j.ranks[0].pid], 5), "d: no rank left")
    ck.check(not d.sanitizer_errors(), f"d: no sanitizer report from ztraind {d.sanitizer_errors()}")


case_a()
case_b()
case_c()
case_d()
ck.done()
