"""Metric queries bounded in keys, points and time, and ztraind's memory bounded in the history it
keeps (issue 19, defects 3 and 4), against a real daemon running real jobs:

  a. GetMetrics with 3,000 copies of one key and max_points 0 grows ztraind's peak RSS (VmHWM)
     by less than 64 MiB.
  b. While another thread polls GetJob: GetMetrics with 10,000 and with 100,000 copies of one
     key answers one series (or is refused), 100,000 distinct keys are INVALID_ARGUMENT naming
     the limit of 64, an over-long key is INVALID_ARGUMENT, and 65 keys over HTTP are 400 naming
     64; no GetJob waits 5 s and the running job's step never stops for 5 s (liveness bounds:
     the measured times are printed, a stalled loop takes far longer).
     WatchJob from step 0 on that job gives every record once, in order, from the first to live
     ones.
  c. A finished job with more records than ztraind keeps in memory (1,200): GetMetrics, the HTTP
     series, /records read page by page and WatchJob from step 0 all equal metrics.jsonl, and
     still do after a restart.
  d. The state file as the previous ztraind wrote it (no record numbers), with 60 more finished
     jobs of 2,000 records each (one of 12,000): after a restart ztraind's VmHWM stays under
     64 MiB (loading every record took 115 MiB), GetJob and /metrics have each job's last step
     and loss, and a job's whole history is served from the file: series equal to what was
     written, a thinned series spanning it, /records pages covering it.
  e. max_points 0, or above the cap, gives 10,000 points of a 12,000-point series (gRPC and
     HTTP), evenly spread: the first and the last included, each one a point of the series.

In a sanitizer build the peak RSS of d and e is only printed: it measures the sanitizer."""
import json
import os
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, LONG, Checker, Daemon, get_job, read_metrics,  # noqa: E402
                 state_name, stubs, submit, temp_dir, tiny_job, wait_state, wait_step)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
MAX_KEYS = 64
MAX_POINTS = 10_000
HWM_LIMIT_MIB = 64
_cache = os.path.join(BUILD, "CMakeCache.txt")
SANITIZED = os.path.exists(_cache) and "ZT_SANITIZE:BOOL=ON" in open(_cache).read()


def vm_kib(pid, field):
    """A VmHWM/VmRSS line of /proc/<pid>/status, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def metrics_request(job_id, keys=(), max_points=0, since_step=0):
    return pb.GetMetricsRequest(id=job_id, keys=list(keys), max_points=max_points,
                                since_step=since_step)


def check_hwm(pid, what):
    """ztraind's peak RSS is under HWM_LIMIT_MIB; a sanitizer build's (shadow memory,
    quarantine) measures the sanitizer, so there it is only shown."""
    hwm = vm_kib(pid, "VmHWM") / 1024
    if SANITIZED:
        print(f"skip  {what}: VmHWM {hwm:.0f} MiB (sanitizer build: RSS not comparable)")
        return
    ck.check(hwm < HWM_LIMIT_MIB, f"{what}: ztraind's VmHWM is {hwm:.0f} MiB "
                                  f"(< {HWM_LIMIT_MIB})")


def get_metrics(d, job_id, keys=(), max_points=0, since_step=0, timeout=120, req=None):
    """(series list or None, status code, details, seconds) of GetMetrics (of req when given)."""
    req = req or metrics_request(job_id, keys, max_points, since_step)
    t0 = time.monotonic()
    try:
        r = d.stub().GetMetrics(req, metadata=d.metadata, timeout=timeout)
        return list(r.series), grpc.StatusCode.OK, "", time.monotonic() - t0
    except grpc.RpcError as e:
        return None, e.code(), e.details() or "", time.monotonic() - t0


def http_get(d, path, timeout=60):
    """(status, parsed JSON or the body's text)."""
    try:
        with urllib.request.urlopen(d.http_url + path, timeout=timeout) as r:
            return r.status, view(path, json.loads(r.read()))
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def points_of(recs, key):
    return [(r["train/global_step"], r[key]) for r in recs if r.get(key) is not None]


def series_points(s):
    return list(zip(s.steps, s.values))


def all_records(d, job_id, limit):
    """Every record of /records, read page by page (next_page_token) with `limit` a page."""
    out, query, pages = [], "since_step=0", 0
    while query and pages < 10_000:
        status, body = http_get(d, f"/api/v1/jobs/{job_id}/records?{query}&page_size={limit}")
        if status != 200:
            return None, pages
        out += [r["values"] for r in body["records"]]
        query = body.get("next_page_token") and f"page_token={body['next_page_token']}"
        pages += 1
    return out, pages


def watch_records(d, job_id, timeout=60):
    recs = []
    for ev in d.stub().WatchJob(pb.WatchJobRequest(id=job_id, since_step=0), metadata=d.metadata,
                                timeout=timeout):
        if ev.WhichOneof("event") == "metrics":
            recs.append({v.key: v.value for v in ev.metrics.values})
    return recs


# ---- a-c: one running job under hostile queries ---------------------------------------------

class JobPoller(threading.Thread):
    """Polls GetJob as fast as it answers, keeping (start, end, step) of every call."""

    def __init__(self, d, job_id):
        super().__init__(daemon=True)
        self.d, self.job_id = d, job_id
        self.samples, self.errors = [], []
        self.stop = threading.Event()

    def run(self):
        stub = self.d.stub()
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                j = stub.GetJob(pb.GetJobRequest(id=self.job_id), metadata=self.d.metadata,
                                timeout=60)
                self.samples.append((t0, time.monotonic(), j.step))
            except grpc.RpcError as e:
                self.errors.append(e.code())
            time.sleep(0.005)

    def slowest(self):
        return max((end - start for start, end, _ in self.samples), default=0.0)

    def longest_stall(self):
        """The longest time between two answers that saw the step go up."""
        longest, last_up, last_step = 0.0, None, None
        for _, end, step in self.samples:
            if last_step is None or step > last_step:
                if last_up is not None:
                    longest = max(longest, end - last_up)
                last_up, last_step = end, step
        if self.samples and last_up is not None:
            longest = max(longest, self.samples[-1][1] - last_up)
        return longest


def case_a(d, job_id):
    before = vm_kib(d.proc.pid, "VmHWM")
    series, code, _, took = get_metrics(d, job_id, ["train/loss"] * 3000, max_points=0)
    grown = (vm_kib(d.proc.pid, "VmHWM") - before) / 1024
    ck.check(grown < 64, f"a: 3,000 copies of a key with max_points 0 grow VmHWM by "
                         f"{grown:.0f} MiB (< 64; answer {code.name}, "
                         f"{len(series) if series is not None else '-'} series, {took:.2f} s)")


def case_b(d, job_id):
    # The big requests are made before the poller starts: building them holds the test's GIL,
    # which would slow the poller's own calls down.
    copies_reqs = [(copies, max_points,
                    metrics_request(job_id, ["train/loss"] * copies, max_points=max_points))
                   for copies, max_points in ((10_000, 1), (100_000, 1))]
    distinct = metrics_request(job_id, [f"k/{i:06d}" for i in range(100_000)])
    poller = JobPoller(d, job_id)
    poller.start()
    time.sleep(0.5)
    tries = []
    for copies, max_points, req in copies_reqs:
        series, code, details, took = get_metrics(d, job_id, req=req)
        one = series is not None and len(series) == 1 and series[0].key == "train/loss"
        tries.append((copies, code.name, took))
        ck.check(one or code == grpc.StatusCode.INVALID_ARGUMENT,
                 f"b: {copies:,} copies of one key, max_points {max_points}: one series or "
                 f"refused ({code.name}, {len(series) if series is not None else '-'} series, "
                 f"{took:.2f} s)")
    _, code, details, took = get_metrics(d, job_id, req=distinct)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and str(MAX_KEYS) in details,
             f"b: 100,000 distinct keys are INVALID_ARGUMENT naming {MAX_KEYS} ({code.name}: "
             f"{details[:120]!r}, {took:.2f} s)")
    _, code, details, _ = get_metrics(d, job_id, ["x" * 100_000])
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT,
             f"b: a 100,000-byte key is INVALID_ARGUMENT ({code.name}: {details[:120]!r})")
    _, code, _, _ = get_metrics(d, job_id, [f"k/{i}" for i in range(MAX_KEYS - 1)] +
                                ["train/loss"] * 50)
    ck.check(code == grpc.StatusCode.OK, f"b: {MAX_KEYS} distinct keys and duplicates are "
                                         f"answered ({code.name})")
    keys = ",".join(f"k/{i}" for i in range(MAX_KEYS + 1))
    status, body = http_get(d, f"/api/v1/jobs/{job_id}/metrics?keys={keys}")
    ck.check(status == 400 and str(MAX_KEYS) in str(body),
             f"b: {MAX_KEYS + 1} keys over HTTP are 400 naming {MAX_KEYS} ({status})")
    time.sleep(0.5)
    poller.stop.set()
    poller.join(120)
    ck.check(not poller.errors and len(poller.samples) > 10 and poller.slowest() < 5.0,
             f"b: meanwhile no GetJob was stalled (5 s bound; {len(poller.samples)} calls, "
             f"slowest {poller.slowest():.2f} s, errors {poller.errors[:3]}; {tries})")
    ck.check(poller.longest_stall() < 5.0,
             f"b: ... and the job's step never stopped going up (5 s bound; longest wait "
             f"{poller.longest_stall():.2f} s)")


def case_b_watch(d, job_id):
    """WatchJob from step 0 on the running job: the records only in the state file, then the
    newest ones, then live ones, each once and in order, across the moment it caught up."""
    start = get_job(d, job_id).step
    steps = []
    stream = d.stub().WatchJob(pb.WatchJobRequest(id=job_id, since_step=0), metadata=d.metadata,
                               timeout=60)
    try:
        for ev in stream:
            if ev.WhichOneof("event") == "metrics":
                steps.append(ev.metrics.step)
                if ev.metrics.step >= start + 1000:
                    break
    finally:
        stream.cancel()
    ck.check(len(steps) > 1000 and steps == list(range(1, len(steps) + 1)),
             f"b: WatchJob from step 0 on the running job (at step {start}) replays and follows "
             f"every record once, in order ({len(steps)} records, "
             f"steps {steps[:2]}..{steps[-2:]})")


# ---- c: a finished job longer than the in-memory cache --------------------------------------

def case_c(d, job_id, when):
    j = get_job(d, job_id)
    recs = read_metrics(os.path.join(j.run_dir, "metrics.jsonl"))
    want = points_of(recs, "train/loss")
    series, code, _, _ = get_metrics(d, job_id, ["train/loss", "perf/tokens_per_second"])
    ok = series is not None and len(series) == 2
    ck.check(ok and series_points(series[0]) == want and
             series_points(series[1]) == points_of(recs, "perf/tokens_per_second"),
             f"c ({when}): GetMetrics equals metrics.jsonl ({len(want)} records, {code.name})")
    series, _, _, _ = get_metrics(d, job_id, ["train/loss"], since_step=700)
    ck.check(series and series_points(series[0]) == [p for p in want if p[0] >= 700],
             f"c ({when}): ... and from since_step 700")
    status, body = http_get(d, f"/api/v1/jobs/{job_id}/metrics?keys=train/loss")
    x = body["series"][0] if status == 200 else {"steps": [], "values": []}
    ck.check(list(zip(x["steps"], x["values"])) == want,
             f"c ({when}): the HTTP series equals metrics.jsonl")
    got, pages = all_records(d, job_id, 500)
    ck.check(got == recs and pages >= 3,
             f"c ({when}): /records read in pages of 500 equals metrics.jsonl ({pages} pages)")
    ck.check(watch_records(d, job_id) == recs,
             f"c ({when}): WatchJob from step 0 replays metrics.jsonl")


# ---- d, e: a state file with many jobs and records ---------------------------------------------

SYNTH_JOBS = 60
SYNTH_RECORDS = 2000
LONG_JOB = SYNTH_JOBS - 1         # the one synthetic job with more points than a series holds
LONG_RECORDS = MAX_POINTS + 2000


def synth_count(i):
    return LONG_RECORDS if i == LONG_JOB else SYNTH_RECORDS


def synth_loss(i, step):
    return 1.0 + ((i * 7919 + step * 31) % 100_000) / 100_000.0


def synth_record(template, i, step):
    rec = dict(template)
    rec["train/global_step"] = step
    rec["train/loss"] = synth_loss(i, step)
    return rec


def as_previous_daemon_wrote_it(db_path, template_id):
    """Rewrites the records table as it was before records were numbered (job, step, time_ms,
    json; indexed by job), and adds SYNTH_JOBS finished jobs, copies of template_id, each with
    SYNTH_RECORDS records. Returns the ids and the template record."""
    db = sqlite3.connect(db_path)
    cols = [r[1] for r in db.execute("PRAGMA table_info(records)")]
    if cols != ["job", "step", "time_ms", "json"]:
        db.executescript(
            "CREATE TABLE old_records (job INTEGER NOT NULL, step INTEGER NOT NULL,"
            " time_ms INTEGER NOT NULL, json TEXT NOT NULL);"
            "INSERT INTO old_records SELECT job, step, time_ms, json FROM records"
            " ORDER BY job, rowid;"
            "DROP TABLE records; ALTER TABLE old_records RENAME TO records;"
            "CREATE INDEX records_by_job ON records (job);")
    job_cols = [r[1] for r in db.execute("PRAGMA table_info(jobs)")]
    row = dict(zip(job_cols, db.execute("SELECT * FROM jobs WHERE id = ?",
                                        (template_id,)).fetchone()))
    number = row["number"]
    template = json.loads(db.execute("SELECT json FROM records WHERE job = ? ORDER BY rowid DESC"
                                     " LIMIT 1", (number,)).fetchone()[0])
    # Each record's text is cut from the template's, as ztraind prints records (no spaces).
    rest = json.dumps({k: v for k, v in template.items()
                       if k not in ("train/global_step", "train/loss")}, separators=(",", ":"))
    ids = []
    for i in range(SYNTH_JOBS):
        n = 100 + i
        job = dict(row, number=n, id=f"job-{n:06d}", name=f"synth-{i}", idempotency_key="")
        db.execute(f"INSERT INTO jobs ({','.join(job_cols)}) VALUES "
                   f"({','.join('?' * len(job_cols))})", [job[c] for c in job_cols])
        db.executemany("INSERT INTO records (job, step, time_ms, json) VALUES (?, ?, ?, ?)",
                       ((n, s, 1_700_000_000_000 + s, f'{{"train/global_step":{s},'
                         f'"train/loss":{synth_loss(i, s)!r},{rest[1:]}')
                        for s in range(1, synth_count(i) + 1)))
        ids.append(job["id"])
    db.commit()
    db.close()
    return ids, template


def case_d(d, ids, template):
    pid = d.proc.pid
    get_job(d, ids[-1])
    check_hwm(pid, f"d: after loading {SYNTH_JOBS} jobs of {SYNTH_RECORDS} records")
    i = 37
    job_id = ids[i]
    j = get_job(d, job_id)
    ck.check(state_name(j.state) == "SUCCEEDED" and j.step == SYNTH_RECORDS and
             j.loss == synth_loss(i, SYNTH_RECORDS),
             f"d: GetJob has the last step and loss ({j.step}, {j.loss})")
    status, body = None, ""
    with urllib.request.urlopen(d.http_url + "/metrics", timeout=60) as r:
        status, body = r.status, r.read().decode()
    line = f'ztrain_job_step{{job_id="{job_id}",job_name="synth-{i}"}} {SYNTH_RECORDS}'
    ck.check(status == 200 and line in body and
             sum(l.startswith("ztrain_job_step{") for l in body.splitlines()) >= SYNTH_JOBS,
             f"d: /metrics has every job's step ({line!r})")
    want = [(s, synth_loss(i, s)) for s in range(1, SYNTH_RECORDS + 1)]
    series, code, _, took = get_metrics(d, job_id, ["train/loss"])
    ck.check(series and series_points(series[0]) == want,
             f"d: GetMetrics serves the whole history from the file ({code.name}, {took:.2f} s)")
    series, _, _, _ = get_metrics(d, job_id, ["train/loss"], since_step=1501)
    ck.check(series and series_points(series[0]) == want[1500:], "d: ... and since_step 1501")
    series, _, _, _ = get_metrics(d, job_id, ["train/loss", "train/learning_rate"],
                                  max_points=100)
    pts = series_points(series[0]) if series else []
    lr = series_points(series[1]) if series and len(series) > 1 else []
    ck.check(len(pts) == 100 and pts[0] == want[0] and pts[-1] == want[-1] and
             all(p in want for p in pts) and len(lr) == 100 and
             all(v == template["train/learning_rate"] for _, v in lr),
             f"d: max_points 100 spans it, first and last kept ({pts[:2]}..{pts[-1:]})")
    status, body = http_get(d, f"/api/v1/jobs/{job_id}/metrics?keys=train/loss&since_step=1000")
    ck.check(status == 200 and list(zip(body["series"][0]["steps"], body["series"][0]["values"]))
             == want[999:], "d: the HTTP series from since_step 1000 equals what was written")
    got, pages = all_records(d, job_id, 500)
    ck.check(got == [synth_record(template, i, s) for s in range(1, SYNTH_RECORDS + 1)],
             f"d: /records in pages of 500 cover the history ({pages} pages)")
    check_hwm(pid, "d: after those queries")


def case_e(d, job_id):
    want = [(s, synth_loss(LONG_JOB, s)) for s in range(1, LONG_RECORDS + 1)]
    evenly = [want[k * (LONG_RECORDS - 1) // (MAX_POINTS - 1)] for k in range(MAX_POINTS)]
    for max_points in (0, 3 * MAX_POINTS):
        series, code, _, _ = get_metrics(d, job_id, ["train/loss"], max_points=max_points)
        pts = series_points(series[0]) if series else []
        ck.check(pts == evenly, f"e: gRPC max_points {max_points}: {len(pts)} evenly spread "
                                f"points of {LONG_RECORDS} (the cap is {MAX_POINTS}; {code.name})")
    for query in ("", "&max_points=0", f"&max_points={3 * MAX_POINTS}"):
        status, body = http_get(d, f"/api/v1/jobs/{job_id}/metrics?keys=train/loss{query}")
        x = body["series"][0] if status == 200 else {"steps": [], "values": []}
        ck.check(list(zip(x["steps"], x["values"])) == evenly,
                 f"e: HTTP '{query or '(no max_points)'}': {len(x['steps'])} evenly spread points")
    check_hwm(d.proc.pid, "e: after those queries")


def main():
    d = Daemon(BUILD, temp_dir("ztrain-mbounds-"), max_ranks=1)
    try:
        running = submit(d, tiny_job(d.data_root, name="long", max_steps=LONG, log_interval=1))
        j = wait_step(d, running.id, 2500, timeout=120)
        ck.check(state_name(j.state) == "RUNNING", f"the job runs (step {j.step})")
        case_a(d, running.id)
        wait_step(d, running.id, 5000, timeout=120)
        case_b(d, running.id)
        case_b_watch(d, running.id)
        d.stub().CancelJob(pb.CancelJobRequest(id=running.id, force=True), metadata=d.metadata)
        wait_state(d, running.id, {"CANCELLED", "FAILED"})

        finished = submit(d, tiny_job(d.data_root, name="finished", max_steps=1200,
                                      log_interval=1))
        j = wait_state(d, finished.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
        ck.check(state_name(j.state) == "SUCCEEDED", f"the 1,200-step job succeeded "
                                                     f"({state_name(j.state)})")
        case_c(d, finished.id, "finished")
        d.stop()
        ids, template = as_previous_daemon_wrote_it(os.path.join(d.state_dir, "ztraind.db"),
                                                    finished.id)
        d.start(timeout=120)
        case_c(d, finished.id, "after the restart")
        case_d(d, ids, template)
        case_e(d, ids[LONG_JOB])
        ck.check(d.stop() == 0 and not d.sanitizer_errors(),
                 f"ztraind stops cleanly {d.sanitizer_errors()}")
    finally:
        d.kill()
    ck.done()


main()
