"""ztraind under load and across faults (`make test-soak`), with a real daemon and real clients:

  a. load: one training job runs, watched from step 0 by 150 grpcio WatchJob streams and 50
     Server-Sent Events streams; meanwhile 1,000 jobs are submitted behind it (--max-ranks 1, so
     they wait QUEUED), ListJobs and GET /api/v1/jobs page through all 1,001 exactly once, newest
     first, /metrics is scraped every second and a separate process times GetJob all along. Then
     the 1,000 are cancelled and the watched job too. Every watcher saw every record of the job,
     equal to its metrics.jsonl, and the terminal state; ztraind's peak RSS and GetJob's p99 stay
     under the bounds below.
  b. soak: 100 small jobs (1 and 2 ranks, 10 to 40 steps) in batches of ten, with ztraind
     SIGKILLed and restarted twice while a 2-rank job runs and small jobs come and go beside it.
     At the end every job SUCCEEDED with its whole history (GetMetrics of every key equals its
     metrics.jsonl) or, only if it was not finished at a kill, is FAILED with the documented
     reason; the jobs that were certainly still queued at a kill ran; no rank process and no
     shared-memory segment of any of the daemons is left.

    /usr/bin/python3 tests/soak/test_soak.py [BUILD_DIR]"""
import json
import math
import os
import signal
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
sys.path.insert(0, HERE)
if len(sys.argv) > 1:
    os.environ["ZTRAIN_BUILD"] = os.path.abspath(sys.argv[1])
from api_view import view  # noqa: E402
from svc import (BUILD, TERMINAL, Checker, Daemon, daemon_ranks, daemon_shm, get_job,  # noqa: E402
                 read_metrics, state_name, stubs, submit, temp_dir, tiny_job, wait_gone,
                 wait_state, wait_step)
import load  # noqa: E402

c = Checker()
pb = stubs()[0]
T0 = time.monotonic()

N_QUEUED = 1000
GRPC_WATCHERS, SSE_WATCHERS = 150, 50
# The load is held at least this long, so that /metrics is scraped a dozen times under it.
HOLD_S = 15
# GetJob is one lookup under the manager's lock and a small reply; unloaded it takes ~0.1 ms
# (bench/README.md). Under this load on 2 shared cores it is a few ms at p99 (bench_soak.py);
# 1 s is what a dashboard polling once a second would see as a stall, and a lock held through a
# long scan or a scrape (issue 19's defects 3 and 4) would show as seconds.
GETJOB_P99_MS = 1000
# ztraind alone is ~20 MiB; the 200 watchers add ~10 MiB (a thread per SSE stream, a reply queue
# per stream, gRPC's per-connection buffers) and the 1,000 queued jobs ~68 MiB, because each job
# allocates its 2,000-line log ring when it is submitted (job_history.c): ~100 MiB measured on
# current main. 256 MiB leaves room for allocator and gRPC differences between hosts and for the
# history cache that issue 19 bounds, and still fails if the daemon copied the job list per
# scrape or a job's records per watcher.
PEAK_RSS_KIB = 256 * 1024


def sanitized_build():
    """Whether BUILD is a -DZT_SANITIZE=ON build: ASan's shadow memory and quarantine make its
    RSS several times larger (~400 MiB here), so the bound is only for a plain build."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            return "ZT_SANITIZE:BOOL=ON" in f.read()
    except OSError:
        return False


def on_signal(sig, frame):
    raise SystemExit(f"stopped by signal {sig}")


def elapsed():
    return f"{time.monotonic() - T0:.0f} s"


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return view(path, json.loads(r.read()))


def newest_first(ids):
    return sorted(ids, key=lambda i: int(i.split("-")[1]), reverse=True)


def finite(v):
    return v is not None and math.isfinite(v)


def check_watchers(results, recs):
    """Every watcher of every process saw exactly the records of metrics.jsonl and the end."""
    want_sse = [[r["train/global_step"], r] for r in recs]
    want_grpc = [[s, {k: v for k, v in r.items() if finite(v)}] for s, r in want_sse]
    watchers = [(w, res["distinct"][w["records"]]) for res in results for w in res["watchers"]]
    grpc_w = [(w, r) for w, r in watchers if w["kind"] == "grpc"]
    sse_w = [(w, r) for w, r in watchers if w["kind"] == "sse"]
    c.check(len(grpc_w) == GRPC_WATCHERS and len(sse_w) == SSE_WATCHERS,
            f"a: every watcher reported ({len(grpc_w)} gRPC, {len(sse_w)} SSE; watcher process "
            f"exits {[res.get('exit', 0) for res in results]})")
    bad = [w for w, _ in grpc_w if w["code"] != "OK" or w["error"]]
    bad += [w for w, _ in sse_w if w["code"] != "200" or w["error"]]
    c.check(not bad, f"a: every stream ended cleanly ({len(bad)} did not"
            f"{': ' + str(bad[0]['code']) + ' ' + str(bad[0]['error']) if bad else ''})")
    ends = {w["states"][-1] if w["states"] else None for w, _ in watchers}
    c.check(ends == {"CANCELLED"}, f"a: every watcher's last event is the terminal state {ends}")
    wrong = sum(1 for _, r in grpc_w if r != want_grpc) + sum(1 for _, r in sse_w if r != want_sse)
    c.check(len(recs) >= 20 and wrong == 0,
            f"a: every watcher saw every record of metrics.jsonl, in order, with its values "
            f"({len(recs)} records; {wrong} watchers differ)")


def load_test():
    tmp = temp_dir("ztrain-soak-load-")
    d = Daemon(BUILD, tmp, max_ranks=1, extra_args=["--max-jobs", str(N_QUEUED + 10)])
    watchers = None
    try:
        job = wait_step(d, submit(d, load.load_job(d.data_root)).id, 60)
        c.check(state_name(job.state) == "RUNNING", f"a: the watched job runs ({elapsed()})")
        watchers = load.Watchers(d, job.id, tmp, grpc=GRPC_WATCHERS, sse=SSE_WATCHERS)
        watchers.start()
        print(f"      {GRPC_WATCHERS} + {SSE_WATCHERS} watchers connected ({elapsed()})")
        prober = load.Prober(d, job.id, tmp)
        prober.start()
        scraper = load.Scraper(d)
        scraper.start()
        t_load = time.monotonic()
        step_before = get_job(d, job.id).step

        ids, _ = load.submit_many(d, N_QUEUED)
        c.check(len(set(ids)) == N_QUEUED, f"a: {N_QUEUED} jobs submitted, each a new id "
                f"({len(set(ids))} distinct, {elapsed()})")
        everything = newest_first(ids + [job.id])
        for name, (got, pages) in (("ListJobs", load.list_grpc(d, 100)),
                                   ("GET /api/v1/jobs", load.list_http(d, 100))):
            c.check(got == everything, f"a: {name} pages through all {len(everything)} jobs "
                    f"exactly once, newest first ({len(got)} in {pages} pages, "
                    f"{len(set(got))} distinct)")
        queued, _ = load.list_grpc(d, 300, state=pb.JOB_STATE_QUEUED)
        c.check(sorted(queued) == sorted(ids), f"a: the QUEUED filter lists the {N_QUEUED} "
                f"({len(queued)})")
        health = http_json(d, "/healthz")
        c.check(health["queued"] == N_QUEUED and health["running"] == 1,
                f"a: /healthz counts them: {health}")
        time.sleep(max(0.0, HOLD_S - (time.monotonic() - t_load)))
        step_after = get_job(d, job.id).step

        for i in ids:
            d.stub().CancelJob(pb.CancelJobRequest(id=i), metadata=d.metadata, timeout=30)
        states = {state_name(get_job(d, i).state) for i in ids}
        c.check(states == {"CANCELLED"}, f"a: the {N_QUEUED} queued jobs cancelled ({states})")
        d.stub().CancelJob(pb.CancelJobRequest(id=job.id), metadata=d.metadata, timeout=30)
        end = wait_state(d, job.id, TERMINAL, timeout=60)
        c.check(state_name(end.state) == "CANCELLED", f"a: the watched job cancelled "
                f"({state_name(end.state)} {end.reason!r}, {elapsed()})")
        results = watchers.join(timeout=120)
        scrapes = scraper.stop()
        ms, failed = prober.stop()
        held = time.monotonic() - t_load

        c.check(step_after > step_before, f"a: the job trained under the load "
                f"(step {step_before} -> {step_after})")
        check_watchers(results, read_metrics(os.path.join(end.run_dir, "metrics.jsonl")))
        ok = [s for s in scrapes if s["status"] == 200]
        c.check(len(ok) == len(scrapes) and len(scrapes) >= held / 2,
                f"a: /metrics answered every scrape, one a second ({len(ok)} of {len(scrapes)} "
                f"in {held:.0f} s; slowest {max(s['ms'] for s in scrapes):.0f} ms)")
        c.check(any(s["queued"] == N_QUEUED for s in scrapes),
                f"a: a scrape counted the {N_QUEUED} queued jobs")
        p50, p99 = load.percentile(ms, 0.5), load.percentile(ms, 0.99)
        c.check(failed == 0 and len(ms) >= 100 and p99 < GETJOB_P99_MS,
                f"a: GetJob under load: {len(ms)} calls, {failed} failed, p50 {p50:.1f} ms, "
                f"p99 {p99:.1f} ms (bound {GETJOB_P99_MS} ms)")
        rss = d.peak_rss_kib()
        if sanitized_build():
            print(f"      ztraind's peak RSS {rss / 1024:.1f} MiB (a sanitizer build: no bound)")
        else:
            c.check(rss < PEAK_RSS_KIB, f"a: ztraind's peak RSS {rss / 1024:.1f} MiB "
                    f"(bound {PEAK_RSS_KIB // 1024} MiB)")
    finally:
        if watchers:
            watchers.kill()
        d.stop()
    c.check(not d.sanitizer_errors(), f"a: no sanitizer report from ztraind {d.sanitizer_errors()}")


# ---- b. soak -----------------------------------------------------------------------------------

BATCHES, PER_BATCH = 10, 10
KILL_BATCHES = (3, 7)
RESTART_REASON = "ztraind was restarted while the job was running"


def small_job(d, n, k):
    """The n-th small job, k-th of its batch: 2 ranks at k 4 and 9 (they wait for two free ranks,
    which a running 2-rank job denies them), else 1; 10 to 40 steps, a record each."""
    return tiny_job(d.data_root, name=f"soak-{n:03d}", max_steps=10 + 5 * (n % 7),
                    world_size=2 if k % 5 == 4 else 1)


def wait_all(d, ids, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        jobs = {i: get_job(d, i) for i in ids}
        if all(state_name(j.state) in TERMINAL for j in jobs.values()) or \
                time.monotonic() > deadline:
            return jobs
        time.sleep(0.1)


def kill_and_restart(d, blocker, batch, snapshots):
    """With the 2-rank blocker running and small jobs passing beside it: SIGKILL, check that
    nothing of the killed daemon is left, start it again. Records which jobs were unfinished
    and which were certainly still queued (behind a 2-rank job that cannot start) at the kill."""
    wait_step(d, blocker, 5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = [i for i in batch if state_name(get_job(d, i).state) in TERMINAL]
        if len(done) >= 2:
            break
        time.sleep(0.01)
    jobs = [get_job(d, i) for i in [blocker] + batch]
    unfinished = {j.id for j in jobs if state_name(j.state) not in TERMINAL}
    first_blocked = next((k for k, j in enumerate(jobs[1:]) if j.spec.world_size == 2), None)
    certain = {j.id for j in jobs[1 + first_blocked:] if state_name(j.state) == "QUEUED"} \
        if first_blocked is not None and state_name(jobs[1 + first_blocked].state) == "QUEUED" \
        else set()
    snapshots.append((blocker, unfinished, certain))
    c.check(state_name(jobs[0].state) == "RUNNING" and certain,
            f"b: before kill {len(snapshots)}: the 2-rank job runs, {len(unfinished)} jobs "
            f"unfinished, {len(certain)} certainly queued ({elapsed()})")
    pids = [r.pid for j in jobs if j.id in unfinished for r in j.ranks if r.pid > 0 and r.running]
    old = d.proc.pid
    d.kill()
    c.check(not wait_gone(pids, 20) and not daemon_ranks(old),
            f"b: the ranks of the killed daemon ended with it ({len(pids)} seen; left "
            f"{daemon_ranks(old)})")
    c.check(not daemon_shm(old), f"b: no shared-memory segment of it is left {daemon_shm(old)}")
    d.start()
    j = get_job(d, blocker)
    c.check(state_name(j.state) == "FAILED" and j.reason.startswith(RESTART_REASON),
            f"b: after the restart the 2-rank job is FAILED: {j.reason!r}")


def jsonl_records(job):
    """The records of the job's metrics.jsonl; none when a job killed while starting never
    wrote one."""
    path = os.path.join(job.run_dir, "metrics.jsonl")
    return read_metrics(path) if os.path.exists(path) else []


def series_of(recs):
    """{key: (steps, values)} from metrics.jsonl records, as GetMetrics serves them: each key's
    non-null values with the record's step."""
    out = {}
    for r in recs:
        for k, v in r.items():
            if finite(v):
                s = out.setdefault(k, ([], []))
                s[0].append(r["train/global_step"])
                s[1].append(v)
    return out


def served_series(d, job_id):
    r = d.stub().GetMetrics(pb.GetMetricsRequest(id=job_id), metadata=d.metadata, timeout=30)
    return {s.key: (list(s.steps), list(s.values)) for s in r.series}


def soak_test():
    d = Daemon(BUILD, temp_dir("ztrain-soak-kill-"), max_ranks=3, extra_args=["--max-jobs", "200"])
    snapshots, ids = [], []
    try:
        n = 0
        for b in range(BATCHES):
            blocker = None
            if b in KILL_BATCHES:
                blocker = submit(d, tiny_job(d.data_root, name=f"blocker-{b}", world_size=2,
                                             max_steps=10_000_000, log_interval=10)).id
                ids.append(blocker)
            batch = []
            for k in range(PER_BATCH - (blocker is not None)):
                batch.append(submit(d, small_job(d, n, k)).id)
                n += 1
            ids += batch
            if blocker:
                kill_and_restart(d, blocker, batch, snapshots)
            jobs = wait_all(d, batch)
            left = [i for i, j in jobs.items() if state_name(j.state) not in TERMINAL]
            c.check(not left, f"b: batch {b + 1} ended ({len(left)} unfinished, {elapsed()})")

        jobs = {i: get_job(d, i) for i in ids}
        unfinished = set().union(*(u for _, u, _ in snapshots))
        certain = set().union(*(q for _, _, q in snapshots))
        states = {}
        for j in jobs.values():
            states[state_name(j.state)] = states.get(state_name(j.state), 0) + 1
        restarted = {i for i, j in jobs.items() if state_name(j.state) == "FAILED" and
                     j.reason.startswith(RESTART_REASON)}
        odd = [(i, state_name(j.state), j.reason) for i, j in jobs.items()
               if state_name(j.state) != "SUCCEEDED" and i not in restarted]
        c.check(len(ids) == 100 and not odd, f"b: all 100 jobs SUCCEEDED or FAILED by a restart "
                f"({states}; others: {odd[:3]})")
        c.check(restarted <= unfinished and {b for b, _, _ in snapshots} <= restarted,
                f"b: only jobs unfinished at a kill FAILED ({len(restarted)}, among "
                f"{len(unfinished)} unfinished), the 2-rank jobs among them")
        c.check(all(state_name(jobs[i].state) == "SUCCEEDED" for i in certain),
                f"b: the {len(certain)} jobs certainly queued at the kills ran and SUCCEEDED")

        whole, prefix = 0, 0
        for i, j in jobs.items():
            want = series_of(jsonl_records(j))
            got = served_series(d, i)
            if state_name(j.state) == "SUCCEEDED":
                steps = want.get("train/loss", ([], []))[0]
                whole += got == want and steps == list(range(1, j.spec.train.max_steps + 1))
            else:
                prefix += set(got) <= set(want) and all(
                    got[k][0] == want[k][0][:len(got[k][0])] and
                    got[k][1] == want[k][1][:len(got[k][1])] for k in got)
        ok = states.get("SUCCEEDED", 0)
        c.check(whole == ok, f"b: every SUCCEEDED job's GetMetrics (every key) equals its "
                f"metrics.jsonl, one record a step ({whole} of {ok})")
        c.check(prefix == len(ids) - ok, f"b: every FAILED job kept its records up to the kill, a "
                f"prefix of metrics.jsonl ({prefix} of {len(ids) - ok})")
        listed = []
        token = ""
        while True:
            r = d.stub().ListJobs(pb.ListJobsRequest(page_size=30, page_token=token),
                                  metadata=d.metadata, timeout=30)
            listed += [x.id for x in r.jobs]
            token = r.next_page_token
            if not token:
                break
        c.check(listed == newest_first(ids), f"b: the restarted daemon lists all {len(listed)}")
        health = http_json(d, "/healthz")
        c.check(health["running"] == 0 and health["queued"] == 0,
                f"b: nothing running or queued: {health}")
        rc = d.stop()
        c.check(rc == 0 and not d.sanitizer_errors(), f"b: the last daemon exits 0 on SIGTERM "
                f"({rc}), no sanitizer report from any {d.sanitizer_errors()}")
        left = {p: (daemon_ranks(p), daemon_shm(p)) for p in d.pids}
        c.check(len(d.pids) == 3 and not any(r or s for r, s in left.values()),
                f"b: no rank process and no shared-memory segment of any of the {len(d.pids)} "
                f"daemons is left {left}")
    finally:
        d.kill()


# A SIGTERM (a CI timeout) unwinds like an error, so that every daemon started is stopped.
signal.signal(signal.SIGTERM, on_signal)
load_test()
soak_test()
print(f"test_soak: {elapsed()}")
c.done()
