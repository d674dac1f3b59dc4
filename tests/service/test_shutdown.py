"""ztraind stopped with SIGTERM while jobs wait in its queue (issue 19, defect 1).

With --max-ranks 1, one job running and two queued: SIGTERM must cancel the running job with a
checkpoint and start neither queued job (no rank process, nothing in their run directories), and
the daemon must exit 0 soon after the running job has stopped. The queued jobs stay QUEUED in the
state file; a daemon started again on the same state runs them to the end."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, get_job, state_name, submit, temp_dir, tiny_job,
                 wait_gone, wait_state, wait_step)

c = Checker()
QUEUED = 1   # ZT_JOB_QUEUED, as the state file stores it


def queued_jobs_stay_queued():
    d = Daemon(BUILD, temp_dir("ztrain-shutdown-"), max_ranks=1, grace=30)
    running = submit(d, tiny_job(d.data_root, name="running", max_steps=100000,
                                 checkpoint_interval=0))
    # Long enough that a queued job started by mistake is still running when the daemon is
    # expected to be gone, short enough for the restart half of the test.
    queued = [submit(d, tiny_job(d.data_root, name=f"queued{i}", max_steps=8)) for i in (1, 2)]
    running = wait_step(d, running.id, 3)
    c.check(state_name(running.state) == "RUNNING", f"the first job runs "
            f"({state_name(running.state)})")
    for q in queued:
        c.check(state_name(get_job(d, q.id).state) == "QUEUED", f"{q.id} is queued behind it")

    t0 = time.monotonic()
    d._close_channel()
    d.proc.send_signal(15)
    try:
        rc = d.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.monotonic() - t0
    c.check(rc == 0, f"ztraind exits 0 on SIGTERM (got {rc}) after {took:.1f} s")
    # The running job stops at its next step (milliseconds for this model): a daemon that ran
    # the two queued jobs as well takes seconds more, but 20 s leaves room for a loaded machine.
    c.check(took < 20, f"ztraind exits soon after the running job stopped ({took:.1f} s)")
    c.check(not wait_gone([r.pid for r in running.ranks], 5), "no rank of the running job left")
    for q in queued:
        c.check(not os.path.exists(os.path.join(q.run_dir, "metrics.jsonl")),
                f"{q.id} never started: no metrics.jsonl in {q.run_dir}")

    # The state file, read before a new daemon could start anything: the queued jobs are still
    # QUEUED, were never started, and ztraind's log of them has no "started" line.
    import sqlite3
    db = sqlite3.connect(os.path.join(d.state_dir, "ztraind.db"))
    for q in queued:
        number = int(q.id.split("-")[1])
        row = db.execute("SELECT state, started_ms FROM jobs WHERE number = ?", (number,)).fetchone()
        c.check(row is not None and row[0] == QUEUED and row[1] == 0,
                f"{q.id} is QUEUED and was never started in the state file "
                f"(state, started_ms: {row})")
        lines = [t for (t,) in db.execute("SELECT text FROM logs WHERE job = ?", (number,))]
        c.check(not any(t.startswith("started") for t in lines),
                f"no rank of {q.id} was started: {lines}")
    db.close()

    d.start()
    r = get_job(d, running.id)
    c.check(state_name(r.state) == "CANCELLED", f"the running job is CANCELLED "
            f"({state_name(r.state)} {r.reason!r})")
    c.check("checkpoint" in r.reason, f"its reason names the checkpoint: {r.reason!r}")
    latest = os.path.join(r.checkpoint_dir, "latest")
    tag = open(latest).read().strip() if os.path.exists(latest) else ""
    c.check(bool(tag) and os.path.exists(os.path.join(r.checkpoint_dir, tag, "DONE")),
            f"it wrote a complete checkpoint ({tag!r})")
    for q in queued:
        j = wait_state(d, q.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=90)
        c.check(state_name(j.state) == "SUCCEEDED" and j.step == 8,
                f"{q.id} runs after the restart ({state_name(j.state)}, step {j.step}, "
                f"{j.reason!r})")
    c.check(d.stop() == 0, "the restarted daemon stops cleanly")
    c.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind {d.sanitizer_errors()}")


queued_jobs_stay_queued()
c.done()
