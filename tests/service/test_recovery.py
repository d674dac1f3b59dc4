"""Automatic recovery (max_restarts) with real processes and signals, against an uninterrupted
run of the same spec as the reference:

- a job whose ranks are SIGKILLed twice mid-run, with max_restarts 2 and a checkpoint every few
  steps, ends SUCCEEDED with the same per-step losses and bit-identical final weights and
  optimizer state as the uninterrupted run, and its attempts (gRPC and HTTP) say which rank died
  of which signal and which checkpoint each restart resumed from; its records (the steps run
  again recorded twice) are numbered 1, 2, ... as they came, and /records paged one record at
  a time, with or without since_step, gives the unpaged list;
- a third failure ends the job FAILED with every attempt's reason;
- ztraind SIGKILLed and started again on the same state resumes a running job with restarts left
  from its checkpoint (its old ranks stop first), and it still ends bit-identical."""
import json
import os
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, LONG, Checker, Daemon, get_job, state_name, stubs, temp_dir, tiny_job,
                 wait_gone, wait_state, wait_step)

c = Checker()
pb = stubs()[0]

STEPS = 240        # long enough that a kill lands mid-run on a loaded machine
INTERVAL = 20      # checkpoint every INTERVAL steps
# The files of a checkpoint that carry the training state: weights and each rank's optimizer.
STATE_FILES = ("model.safetensors", "optim_rank_00000.safetensors", "optim_rank_00001.safetensors")


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=10) as r:
        return view(path, json.loads(r.read()))


def submit_spec(d, job, max_restarts=0):
    from svc import spec_proto
    spec = spec_proto(job)
    spec.max_restarts = max_restarts
    return d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)


def job_spec(d, name, max_steps=STEPS):
    return tiny_job(d.data_root, name=name, max_steps=max_steps, world_size=2,
                    checkpoint_interval=INTERVAL)


def losses(d, job_id):
    """{step: train/loss} from the job's stored records; where a step was run again after a
    restart, its last record (the resumed trajectory's) wins."""
    out, query = {}, "since_step=0"
    while query:
        page = http_json(d, f"/api/v1/jobs/{job_id}/records?{query}")
        for r in page["records"]:
            if "train/loss" in r["values"]:
                out[r["step"]] = r["values"]["train/loss"]
        query = page["next_page_token"] and f"page_token={page['next_page_token']}"
    return out


def raw_records(d, job_id, query):
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}/records?{query}",
                                timeout=10) as r:
        return json.loads(r.read())


def records_cursor(d, job_id, what):
    """The steps a restart runs again are recorded twice; /records paged one record at a time
    (with since_step kept on every page) gives the unpaged list, each record once, numbered
    1, 2, ... in the order they came."""
    whole = raw_records(d, job_id, "since_step=0").get("records", [])
    steps = [int(r["step"]) for r in whole]
    again = sorted({s for s in steps if steps.count(s) > 1})
    c.check(again and [int(r["seq"]) for r in whole] == list(range(1, len(whole) + 1)),
            f"{what}: records numbered 1..{len(whole)} in the order they came, the steps run "
            f"again recorded twice ({again[:3]}...)")
    since = again[0] if again else 0
    for q in ("since_step=0", f"since_step={since}"):
        paged, token = [], ""
        for _ in range(len(whole) + 2):
            page = raw_records(d, job_id, f"{q}&page_size=1" +
                               (f"&page_token={token}" if token else ""))
            paged += page.get("records", [])
            token = page.get("nextPageToken", "")
            if not token:
                break
        want = [r for r in whole if int(r["step"]) >= int(q.split("=")[1])]
        c.check(paged == want, f"{what}: /records?{q} paged one record at a time is the "
                f"unpaged list's records from that step ({len(paged)} of {len(want)})")


def state_bytes(job):
    """The final checkpoint's state files, as bytes."""
    tag = os.path.join(job.checkpoint_dir, f"global_step{STEPS}")
    return {f: open(os.path.join(tag, f), "rb").read() for f in STATE_FILES}


def wait_attempt(d, job_id, n, step, timeout=60):
    """Waits until the job's attempt n runs and has reported `step` or later; the Job."""
    deadline = time.monotonic() + timeout
    while True:
        j = get_job(d, job_id)
        if (len(j.attempts) >= n and not j.attempts[-1].HasField("end_time") and
                state_name(j.state) == "RUNNING" and j.step >= step and
                all(r.pid and r.running for r in j.ranks)) or time.monotonic() > deadline:
            return j
        time.sleep(0.02)


def kill_rank(d, job_id, attempt, rank, step):
    """SIGKILLs `rank` of the job's attempt once it has reached `step`; the Job before."""
    j = wait_attempt(d, job_id, attempt, step)
    c.check(len(j.attempts) == attempt and j.step < STEPS,
            f"attempt {attempt} is running at step {j.step} (of {STEPS}) when rank {rank} "
            f"is killed")
    os.kill(j.ranks[rank].pid, signal.SIGKILL)
    return j


def same_as_reference(d, job, ref_losses, ref_state, what, unrecorded=()):
    """The job's losses and final state against the uninterrupted run's; `unrecorded`: steps
    that may have no record (run by ranks whose daemon had died)."""
    got = losses(d, job.id)
    missing = sorted(set(range(1, STEPS + 1)) - set(got) - set(unrecorded))
    c.check(not missing and len(got) >= STEPS - len(unrecorded),
            f"{what}: a loss for every step 1..{STEPS} (missing: {missing[:5]})")
    diff = [s for s in got if got[s] != ref_losses.get(s)]
    c.check(not diff, f"{what}: every step's loss equals the uninterrupted run's "
            f"(differing steps: {diff[:5]})")
    st = state_bytes(job)
    c.check(all(st[f] == ref_state[f] for f in STATE_FILES),
            f"{what}: final weights and optimizer state are bit-identical to the uninterrupted "
            f"run's ({', '.join(f for f in STATE_FILES if st[f] != ref_state[f]) or 'all equal'})")


def restarts_after_kills(d, ref_losses, ref_state):
    j = submit_spec(d, job_spec(d, "recovers"), max_restarts=2)
    first = kill_rank(d, j.id, 1, 1, 2 * INTERVAL + 3)
    second = kill_rank(d, j.id, 2, 0, first.step + INTERVAL + 3)
    j = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    c.check(state_name(j.state) == "SUCCEEDED", f"job with two killed ranks and max_restarts 2 "
            f"SUCCEEDED ({state_name(j.state)} {j.reason!r})")
    a = list(j.attempts)
    c.check(len(a) == 3, f"three attempts ({len(a)})")
    if len(a) == 3:
        c.check(a[0].failed and a[0].rank == 1 and a[0].signal == 9 and
                "rank 1" in a[0].reason and "SIGKILL" in a[0].reason,
                f"attempt 1 failed: rank 1, signal 9: {a[0].reason!r}")
        c.check(a[1].failed and a[1].rank == 0 and a[1].signal == 9 and "rank 0" in a[1].reason,
                f"attempt 2 failed: rank 0, signal 9: {a[1].reason!r}")
        c.check(not a[2].failed and a[2].reason == "" and a[2].HasField("end_time"),
                "attempt 3 succeeded")
        # The checkpoint each restart resumed from: the newest complete one before the kill.
        c.check(a[1].resumed_from_step % INTERVAL == 0 and
                INTERVAL <= a[1].resumed_from_step <= a[0].step,
                f"attempt 2 resumed from checkpoint step {a[1].resumed_from_step} "
                f"(killed at {a[0].step})")
        c.check(a[2].resumed_from_step % INTERVAL == 0 and
                a[1].resumed_from_step <= a[2].resumed_from_step <= a[1].step,
                f"attempt 3 resumed from checkpoint step {a[2].resumed_from_step} "
                f"(killed at {a[1].step})")
        c.check(a[0].resumed_from_step == 0, "attempt 1 started from the beginning")
    h = http_json(d, f"/api/v1/jobs/{j.id}")
    c.check([(x["attempt"], x["failed"], x["rank"], x["signal"]) for x in h["attempts"]] ==
            [(x.attempt, x.failed, x.rank, x.signal) for x in a],
            f"the HTTP job JSON has the same attempts: {h['attempts']}")
    same_as_reference(d, j, ref_losses, ref_state, "restarted job")
    records_cursor(d, j.id, "restarted job")


def third_failure_fails(d):
    j = submit_spec(d, tiny_job(d.data_root, name="keeps-failing", max_steps=LONG, world_size=2,
                                checkpoint_interval=INTERVAL), max_restarts=2)
    for attempt in (1, 2, 3):
        kill_rank(d, j.id, attempt, attempt % 2, 3)
    j = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
    c.check(state_name(j.state) == "FAILED" and "max_restarts" in j.reason,
            f"the third failure ends the job FAILED, saying the restarts are used up: "
            f"{j.reason!r}")
    a = list(j.attempts)
    c.check(len(a) == 3 and all(x.failed and x.signal == 9 for x in a) and
            [x.rank for x in a] == [1, 0, 1] and
            all(f"rank {x.rank}" in x.reason and "SIGKILL" in x.reason for x in a),
            f"every attempt's reason is kept: {[x.reason for x in a]}")
    h = http_json(d, f"/api/v1/jobs/{j.id}")
    c.check([x["reason"] for x in h["attempts"]] == [x.reason for x in a],
            "and shown in the HTTP job JSON")


def daemon_restart_resumes(d, ref_losses, ref_state):
    j = submit_spec(d, job_spec(d, "survives-daemon"), max_restarts=1)
    j = wait_attempt(d, j.id, 1, 2 * INTERVAL + 3)
    pids = [r.pid for r in j.ranks]
    c.check(j.step < STEPS, f"the job runs at step {j.step} when ztraind is killed")
    d.kill()
    d.start()
    j = get_job(d, j.id)
    c.check(state_name(j.state) in ("QUEUED", "STARTING", "RUNNING", "SUCCEEDED"),
            f"after the daemon's restart the job is resumed, not failed: {state_name(j.state)} "
            f"{j.reason!r}")
    j = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    c.check(state_name(j.state) == "SUCCEEDED", f"and it SUCCEEDED ({state_name(j.state)} "
            f"{j.reason!r})")
    c.check(not wait_gone(pids, 1), "the previous daemon's ranks are gone")
    a = list(j.attempts)
    c.check(len(a) == 2 and a[0].failed and a[0].rank == -1 and
            "ztraind was restarted" in a[0].reason and not a[1].failed,
            f"two attempts, the first ended by the daemon's restart: {[x.reason for x in a]}")
    unrecorded = ()
    if len(a) == 2:
        c.check(a[1].resumed_from_step >= INTERVAL,
                f"the second resumed from checkpoint step {a[1].resumed_from_step}")
        # The old ranks finish their step and write a checkpoint when the daemon dies; the
        # records of the steps they ran after it died went nowhere.
        unrecorded = range(a[0].step + 1, a[1].resumed_from_step + 1)
    same_as_reference(d, j, ref_losses, ref_state, "job resumed after a daemon restart",
                      unrecorded)


d = Daemon(BUILD, temp_dir("ztrain-recovery-"), max_ranks=2)
ref = submit_spec(d, job_spec(d, "uninterrupted"))
ref = wait_state(d, ref.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
c.check(state_name(ref.state) == "SUCCEEDED" and len(ref.attempts) == 1 and
        not ref.attempts[0].failed, f"the uninterrupted reference run SUCCEEDED in one attempt "
        f"({state_name(ref.state)} {ref.reason!r})")
ref_losses, ref_state = losses(d, ref.id), state_bytes(ref)
c.check(len(ref_losses) == STEPS, f"the reference has {STEPS} losses ({len(ref_losses)})")

restarts_after_kills(d, ref_losses, ref_state)
third_failure_fails(d)
daemon_restart_resumes(d, ref_losses, ref_state)
errors = d.sanitizer_errors()
c.check(not errors, f"no sanitizer report in ztraind's log: {errors}")
d.stop()
c.done()
