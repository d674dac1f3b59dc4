"""Automatic restarts back off exponentially (issue 34, defect 10), with a real ztraind.

On main a job with max_restarts 30 and a corrupt model.init_from (the submit check only opens the
file) restarted 31 times in 0.3 s. Here, with --restart-backoff 0.5:
  a. the gaps between the starts of consecutive attempts (Job.attempts[].start_time) are at
     least 0.5, 1, 2, 4 s: each at least the back-off the formula gives (0.5 * 2^(n-1));
  b. while it waits, the job is QUEUED and its reason names the back-off and the failure;
  c. after 9 s it has made at most 5 attempts and has not FAILED; CancelJob ends it;
  d. `ztrain watch` of the job, started at the submit, prints one line for each attempt that
     started while it watched, naming how the attempt before ended, as GetJob's attempts say."""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, get_job, spec_proto, state_name, stubs,  # noqa: E402
                 temp_dir, tiny_job)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cli"))
from cliref import ZTRAIN  # noqa: E402

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
    watch = subprocess.Popen([ZTRAIN, "--server", d.grpc_addr, "watch", j.id],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    try:
        out, err = watch.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        watch.kill()
        out, err = watch.communicate()
    attempts = list(get_job(d, j.id).attempts)
    lines = re.findall(r"^\S+: attempt (\d+) started from step (\d+); attempt (\d+) (failed|ended) "
                       r"at step (\d+)(?:: (.*))?$", out, re.M)
    seen = [int(m[0]) for m in lines]
    ck.check(seen and seen == list(range(seen[0], attempts[-1].attempt + 1)) and seen[0] >= 2,
             f"d: watch printed attempts {seen} started, each one after the last up to "
             f"{attempts[-1].attempt} ({out.strip()[-300:]} {err.strip()[-200:]})")
    by_number = {a.attempt: a for a in attempts}
    for m in lines:
        before = by_number.get(int(m[2]))
        ck.check(before is not None and int(m[2]) == int(m[0]) - 1 and before.failed and
                 m[3] == "failed" and (m[5] or "") == before.reason and
                 int(m[1]) == by_number[int(m[0])].resumed_from_step,
                 f"d: the line for attempt {m[0]} names attempt {m[2]} {m[3]}: {m[5][:100]!r} "
                 f"(GetJob: {before.reason[:100] if before else None!r})")
ck.done()
