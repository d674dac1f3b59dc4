"""ztraind's supervision and durability, with real processes and signals:

- a rank killed with SIGKILL fails its job within 5 s, naming the rank and the signal, and no
  process of the job is left (nor its shared-memory segment);
- a rank stopped with SIGSTOP (a hang) fails its job once its peer's collective times out
  (ZTRAIN_COMM_TIMEOUT_S), and the reason and the attempt blame the stopped rank, not the peer
  that gave up waiting for it, as `ztrain run` does (docs/parallelism.md);
- rank 0 killed with SIGKILL while rank 1 is slow to start (a wrapper delays it), before rank 1
  attached to the job's shared-memory segment: the segment, which only rank 0 removes, is
  removed by ztraind once both ranks ended;
- jobs whose ranks' pipes do not fit ztraind's open-file limit (64 here) wait in QUEUED, saying
  so, and start once running jobs end, instead of failing with "pipe: Too many open files";
- ztraind killed with SIGKILL takes its ranks along (they ask for SIGTERM when it dies), and the
  restarted daemon has every job, its metric history and its log tail; the job that was running
  is FAILED with the reason, its ranks' ends unknown (not "exited with status 0"), and a queued
  job still runs;
- ztraind sent SIGHUP (its terminal closed) goes on serving, the running job still training,
  and says it ignored the signal; then SIGTERM cancels the job with a checkpoint and exits 0;
- an HTTP port already in use is an error at start, naming the address."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, alive, get_job, state_name, stubs, submit, temp_dir,
                 tiny_job, wait_gone, wait_state, wait_step)

c = Checker()
pb = stubs()[0]


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=10) as r:
        return view(path, json.loads(r.read()))


def series(d, job_id, key="train/loss"):
    r = d.stub().GetMetrics(pb.GetMetricsRequest(id=job_id, keys=[key]), metadata=d.metadata,
                            timeout=10)
    return [(s, v) for s, v in zip(r.series[0].steps, r.series[0].values)] if r.series else []


def shm_segments(d, job_id):
    """This daemon's shared-memory segments of the job (the ranks' ZTRAIN_RUN_ID names them)."""
    return [n for n in os.listdir("/dev/shm") if f"ztraind{d.proc.pid}-{job_id}" in n]


def killed_rank():
    d = Daemon(BUILD, temp_dir("ztrain-sup-kill-"), max_ranks=2)
    with d:
        j = submit(d, tiny_job(d.data_root, name="victim", world_size=2, max_steps=100000))
        j = wait_step(d, j.id, 3)
        c.check(state_name(j.state) == "RUNNING", f"2-rank job running (state {state_name(j.state)})")
        pids = [r.pid for r in j.ranks]
        c.check(all(alive(p) for p in pids), f"both ranks alive: {pids}")
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        j = wait_state(d, j.id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=30, poll=0.02)
        took = time.monotonic() - t0
        c.check(state_name(j.state) == "FAILED", f"job FAILED after SIGKILL of rank 1 "
                f"(state {state_name(j.state)}) in {took:.2f} s")
        c.check(took < 5.0, f"failure noticed within 5 s ({took:.2f} s)")
        c.check("rank 1" in j.reason and "signal 9 (SIGKILL)" in j.reason,
                f"reason names the rank and the signal: {j.reason!r}")
        c.check(j.ranks[1].signal == 9 and not j.ranks[1].running, "rank 1 recorded as signal 9")
        c.check(not wait_gone(pids, 5), "no rank process left")
        c.check(not shm_segments(d, j.id), f"no shm segment of the job left: "
                f"{shm_segments(d, j.id)}")
        logs = http_json(d, f"/api/v1/jobs/{j.id}/logs?tail=50")["lines"]
        c.check(any("signal 9" in l["text"] and l["stream"] == "ztraind" for l in logs),
                "ztraind's own log line about the killed rank is in the job's log")


def stopped_rank():
    d = Daemon(BUILD, temp_dir("ztrain-sup-stop-"), max_ranks=2,
               env={"ZTRAIN_COMM_TIMEOUT_S": "3"})
    with d:
        j = submit(d, tiny_job(d.data_root, name="hung", world_size=2, max_steps=100000))
        j = wait_step(d, j.id, 3)
        pids = [r.pid for r in j.ranks]
        os.kill(pids[0], signal.SIGSTOP)
        j = wait_state(d, j.id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=60, poll=0.05)
        c.check(state_name(j.state) == "FAILED", f"job FAILED after SIGSTOP of rank 0 "
                f"(state {state_name(j.state)})")
        want = f"rank 0 (pid {pids[0]}) stopped answering: it was stopped (SIGSTOP"
        c.check(j.reason.startswith(want) and f"when rank 1 (pid {pids[1]}) exited" in j.reason,
                f"reason blames the stopped rank 0, then says how rank 1 failed: {j.reason!r}")
        attempt = j.attempts[-1] if j.attempts else None
        c.check(attempt is not None and attempt.rank == 0,
                f"the attempt's failed rank is 0 ({attempt.rank if attempt else None})")
        c.check(not wait_gone(pids, 5), "no rank process left (the stopped one included)")
        c.check(not shm_segments(d, j.id), f"no shm segment of the job left: "
                f"{shm_segments(d, j.id)}")


def segment_of_killed_rank0():
    tmp = temp_dir("ztrain-sup-shm-")
    wrapper = os.path.join(tmp, "slow-rank1-worker")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\n[ "$RANK" = 1 ] && sleep 60\n'
                f'exec {os.path.join(BUILD, "ztrain-worker")} "$@"\n')
    os.chmod(wrapper, 0o755)
    d = Daemon(BUILD, tmp, max_ranks=2, extra_args=["--worker", wrapper])
    with d:
        j = submit(d, tiny_job(d.data_root, name="slow-start", world_size=2, max_steps=100000))
        deadline = time.monotonic() + 15
        while not shm_segments(d, j.id) and time.monotonic() < deadline:
            time.sleep(0.05)
        j = get_job(d, j.id)
        c.check(shm_segments(d, j.id) and len(j.ranks) == 2 and j.ranks[0].pid > 0,
                f"rank 0 made the segment while rank 1 waits ({shm_segments(d, j.id)})")
        if not shm_segments(d, j.id):
            return
        os.kill(j.ranks[0].pid, signal.SIGKILL)
        j = wait_state(d, j.id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=30, poll=0.05)
        c.check(state_name(j.state) == "FAILED" and "rank 0" in j.reason,
                f"the job FAILED naming rank 0: {j.reason!r}")
        left = shm_segments(d, j.id)
        c.check(not left, f"no shm segment of the job left: {left}")
        for n in left:
            os.unlink(os.path.join("/dev/shm", n))


def descriptors_run_out():
    d = Daemon(BUILD, temp_dir("ztrain-sup-fds-"), max_ranks=40, open_files=64)
    with d:
        jobs = [submit(d, tiny_job(d.data_root, name=f"fds-{i}", world_size=2, max_steps=100000))
                for i in range(10)]
        time.sleep(3)
        now = [get_job(d, j.id) for j in jobs]
        states = [state_name(j.state) for j in now]
        c.check("FAILED" not in states and "RUNNING" in states and "QUEUED" in states,
                f"under a limit of 64 descriptors some jobs run and the rest wait, none fails: "
                f"{[(s, j.reason[:60]) for s, j in zip(states, now)]}")
        waiting = [j for j in now if state_name(j.state) == "QUEUED"]
        c.check(waiting and "waiting for file descriptors" in waiting[0].reason,
                f"the first waiting job says what for: "
                f"{waiting[0].reason if waiting else None!r}")
        running = [j for j in now if state_name(j.state) == "RUNNING"]
        for j in running:
            d.stub().CancelJob(pb.CancelJobRequest(id=j.id, force=True), metadata=d.metadata,
                               timeout=10)
        if waiting:
            w = wait_step(d, waiting[0].id, 1, timeout=30)
            c.check(state_name(w.state) == "RUNNING",
                    f"a waiting job starts once the running ones end ({state_name(w.state)} "
                    f"{w.reason!r})")
        for j in jobs:
            d.stub().CancelJob(pb.CancelJobRequest(id=j.id, force=True), metadata=d.metadata,
                               timeout=10)


def daemon_killed_and_restarted():
    d = Daemon(BUILD, temp_dir("ztrain-sup-restart-"), max_ranks=1)
    done = submit(d, tiny_job(d.data_root, name="finished", max_steps=15))
    done = wait_state(d, done.id, {"SUCCEEDED", "FAILED"}, timeout=60)
    c.check(state_name(done.state) == "SUCCEEDED", "first job succeeded")
    before = series(d, done.id)
    c.check(len(before) == 15, f"15 loss points before the kill ({len(before)})")
    logs_before = http_json(d, f"/api/v1/jobs/{done.id}/logs?tail=1000")["lines"]

    running = submit(d, tiny_job(d.data_root, name="interrupted", max_steps=100000))
    queued = submit(d, tiny_job(d.data_root, name="queued", max_steps=5))
    running = wait_step(d, running.id, 3)
    c.check(state_name(running.state) == "RUNNING", "second job running")
    c.check(state_name(get_job(d, queued.id).state) == "QUEUED", "third job queued behind it")
    pids = [r.pid for r in running.ranks]
    seen = len(series(d, running.id))
    c.check(seen > 0, f"the running job has records before the kill ({seen})")

    d.kill()
    c.check(not wait_gone(pids, 10), "the running job's rank ended with the killed daemon")
    d.start()

    after = get_job(d, done.id)
    c.check(state_name(after.state) == "SUCCEEDED", "finished job still SUCCEEDED after restart")
    c.check(series(d, done.id) == before, "its loss history is intact")
    logs_after = http_json(d, f"/api/v1/jobs/{done.id}/logs?tail=1000")["lines"]
    c.check([l["text"] for l in logs_after] == [l["text"] for l in logs_before],
            f"its log tail is intact ({len(logs_after)} lines)")
    r = get_job(d, running.id)
    c.check(state_name(r.state) == "FAILED" and "restarted" in r.reason,
            f"the interrupted job is FAILED with the reason: {state_name(r.state)} {r.reason!r}")
    c.check(all(rk.exit_unknown and not rk.running for rk in r.ranks),
            f"its rank's end is unknown, not a made-up exit status: "
            f"{[(rk.rank, rk.exit_code, rk.signal, rk.exit_unknown) for rk in r.ranks]}")
    ranks_json = http_json(d, f"/api/v1/jobs/{running.id}")["ranks"]
    c.check([rk["exit_unknown"] for rk in ranks_json] == [True],
            f"HTTP says the same: {ranks_json}")
    shown = subprocess.run([os.path.join(BUILD, "ztrain"), "--server", d.grpc_addr, "status",
                            running.id], capture_output=True, text=True, timeout=30).stdout
    c.check("end unknown (ztraind was restarted while it ran)" in shown
            and "exited with status" not in shown, f"`ztrain status` says so: {shown!r}")
    c.check(not any(rk.exit_unknown for rk in get_job(d, done.id).ranks),
            "the job that had ended keeps its ranks' exits")
    c.check(len(series(d, running.id)) >= seen, f"its records up to the kill are kept "
            f"({len(series(d, running.id))} >= {seen})")
    q = wait_state(d, queued.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
    c.check(state_name(q.state) == "SUCCEEDED", f"the queued job ran after the restart "
            f"({state_name(q.state)} {q.reason!r})")
    ids = [j.id for j in d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata).jobs]
    c.check(ids == [queued.id, running.id, done.id], f"all three jobs listed, newest first: {ids}")
    d.stop()


def daemon_sigterm():
    d = Daemon(BUILD, temp_dir("ztrain-sup-term-"), max_ranks=1, grace=20)
    j = submit(d, tiny_job(d.data_root, name="graceful", max_steps=100000))
    j = wait_step(d, j.id, 3)
    d.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    c.check(d.proc.poll() is None, f"ztraind survives SIGHUP (exit {d.proc.poll()})")
    c.check("SIGHUP ignored" in d.log(), "ztraind says it ignored SIGHUP")
    if d.proc.poll() is not None:
        return
    step = get_job(d, j.id).step
    after = wait_step(d, j.id, step + 1)
    c.check(state_name(after.state) == "RUNNING" and after.step > step,
            f"the job trains on after SIGHUP (step {step} -> {after.step})")
    rc = d.stop(timeout=30)
    c.check(rc == 0, f"ztraind exits 0 on SIGTERM (got {rc})")
    c.check(not wait_gone([r.pid for r in j.ranks], 5), "no rank left")
    d.start()
    j = get_job(d, j.id)
    c.check(state_name(j.state) == "CANCELLED", f"the running job is CANCELLED "
            f"({state_name(j.state)} {j.reason!r})")
    latest = os.path.join(j.checkpoint_dir, "latest")
    tag = open(latest).read().strip() if os.path.exists(latest) else ""
    c.check(bool(tag) and os.path.exists(os.path.join(j.checkpoint_dir, tag, "DONE")),
            f"a complete checkpoint was written ({tag!r})")
    d.stop()


def http_port_in_use():
    d = Daemon(BUILD, temp_dir("ztrain-sup-port-"))
    with d:
        other = temp_dir("ztrain-sup-port2-")
        p = subprocess.run([os.path.join(BUILD, "ztraind"), "--grpc-addr", "127.0.0.1:0",
                            "--http-addr", f"127.0.0.1:{d.http_port}", "--state-dir", other],
                           capture_output=True, text=True, timeout=30)
        c.check(p.returncode == 1 and f"127.0.0.1:{d.http_port}" in p.stderr,
                f"second daemon on the same HTTP port fails naming it: rc {p.returncode}, "
                f"{p.stderr.strip()!r}")


killed_rank()
stopped_rank()
segment_of_killed_rank0()
descriptors_run_out()
daemon_killed_and_restarted()
daemon_sigterm()
http_port_in_use()
c.done()
