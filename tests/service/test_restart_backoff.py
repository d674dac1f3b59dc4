"""Automatic restarts back off exponentially (issue 34, defect 10), with a real ztraind.

On main a job with max_restarts 30 and a corrupt model.init_from (the submit check only opens the
file) restarted 31 times in 0.3 s. Here, with --restart-backoff 0.5:
  a. the gaps between the starts of consecutive attempts (Job.attempts[].start_time) are at
     least 0.5, 1, 2, 4 s: each at least the back-off the formula gives (0.5 * 2^(n-1));
  b. while it waits, the job is QUEUED and its reason names the back-off and the failure;
  c. after 9 s it has made at most 5 attempts and has not FAILED; CancelJob ends it."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, get_job, spec_proto, state_name, stubs,  # noqa: E402
                 temp_dir, tiny_job)

pb = stubs()[0]
ck = Checker()
BASE = 0.5

with Daemon(BUILD, temp_dir("ztrain-backoff-"), max_ranks=1,
            extra_args=["--restart-backoff", str(BASE)]) as d:
    with open(os.path.join(d.data_root, "bad.safetensors"), "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\0" * 64)
    job = tiny_job(d.data_root, max_steps=5)
    job["model"]["init_from"] = "bad.safetensors"
    spec = spec_proto(job)
    spec.max_restarts = 30
    t0 = time.monotonic()
    j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=30)
    reasons = set()
    while time.monotonic() - t0 < 9:
        g = get_job(d, j.id)
        if state_name(g.state) == "QUEUED" and g.attempts:
            reasons.add(g.reason)
        if state_name(g.state) in ("FAILED", "SUCCEEDED", "CANCELLED"):
            break
        time.sleep(0.05)
    g = get_job(d, j.id)
    starts = [a.start_time.ToMilliseconds() for a in g.attempts]
    gaps = [(b - a) / 1000 for a, b in zip(starts, starts[1:])]
    ck.check(state_name(g.state) not in ("FAILED", "SUCCEEDED"),
             f"c: after 9 s the job is {state_name(g.state)}, not used up ({g.reason[:160]})")
    ck.check(2 <= len(starts) <= 5, f"c: {len(starts)} attempts in 9 s (2 to 5 with back-off)")
    want = [BASE * 2 ** k for k in range(len(gaps))]
    ck.check(gaps and all(g_ >= w * 0.95 for g_, w in zip(gaps, want)),
             f"a: gaps between attempts {[round(x, 2) for x in gaps]} s are at least {want}")
    ck.check(any("back-off" in r and "attempt 1 failed" in r for r in reasons),
             f"b: the queued job's reason names the back-off and the failure: "
             f"{sorted(reasons)[:2]}")
    d.stub().CancelJob(pb.CancelJobRequest(id=j.id), timeout=30)
    deadline = time.monotonic() + 30
    while state_name(get_job(d, j.id).state) != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.1)
    ck.check(state_name(get_job(d, j.id).state) == "CANCELLED", "c: CancelJob ends it")
ck.done()
