"""ztraind's gRPC API driven by Python grpcio: the life of a job and what it reports.

  a. Health/Check answers SERVING (and NOT_FOUND for a service it does not have); Health/Watch
     sends SERVING (SERVICE_UNKNOWN for a service it does not have) first and stays open, and
     SIGTERM with one open stops ztraind at once, ending the stream.
  b. A job submitted behind a running one waits QUEUED with a reason (--max-ranks 1 leaves room
     for one rank), and WatchJob sees it go QUEUED -> STARTING/RUNNING -> SUCCEEDED, then the
     stream ends with OK. Three jobs: one runs, two wait; ListJobs filters them by state.
  c. GetMetrics returns exactly the loss series the rank wrote to <run dir>/metrics.jsonl, and
     max_points thins it while keeping the last point.
  d. WatchJob from step 0, opened after the job started, replays every record (compared with
     metrics.jsonl); since_step skips the earlier ones.
  e. ListJobs pages newest first with page tokens; a repeated idempotency key returns the first
     job; StreamLogs returns the last lines; unknown ids are NOT_FOUND everywhere.
  f. A log's tail says the same over gRPC, HTTP, the CLI and the Python client (docs/api.md,
     "Logs"; kubectl's --tail): none given, the last 100; 0, none, and with follow only new
     lines (none, of a finished job); n, the last n. The reference is every kept line."""
import json
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, SOURCE, Checker, Daemon, get_job, read_metrics, state_name, stubs,  # noqa: E402
                 submit, temp_dir, tiny_job, wait_state, wait_step)

import grpc  # noqa: E402

pb, rpc, hpb, hrpc = stubs()
ck = Checker()


def watch(d, job_id, since_step=0, timeout=60):
    """Every event of a WatchJob stream until it ends: (states seen, metric records, status)."""
    states, records = [], []
    try:
        for ev in d.stub().WatchJob(pb.WatchJobRequest(id=job_id, since_step=since_step),
                                    metadata=d.metadata, timeout=timeout):
            kind = ev.WhichOneof("event")
            if kind == "job":
                states.append(state_name(ev.job.state))
            elif kind == "metrics":
                records.append(ev.metrics)
        return states, records, grpc.StatusCode.OK
    except grpc.RpcError as e:
        return states, records, e.code()


def record_values(rec):
    return {v.key: v.value for v in rec.values}


def case_a(d):
    h = d.health()
    ck.check(h.Check(hpb.HealthCheckRequest(), timeout=10).status ==
             hpb.HealthCheckResponse.SERVING, "a: Health/Check is SERVING")
    ck.check(h.Check(hpb.HealthCheckRequest(service="ztrain.v1.Trainer"), timeout=10).status ==
             hpb.HealthCheckResponse.SERVING, "a: ... for ztrain.v1.Trainer too")
    try:
        h.Check(hpb.HealthCheckRequest(service="nope.Service"), timeout=10)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    ck.check(code == grpc.StatusCode.NOT_FOUND, f"a: an unknown service is NOT_FOUND ({code})")

    # Health/Watch, as the health protocol has it (grpc/doc/health-checking.md): the current
    # status at once and the call stays open; an unknown service is SERVICE_UNKNOWN, and that
    # call stays open too.
    for service, want in (("", hpb.HealthCheckResponse.SERVING),
                          ("ztrain.v1.Trainer", hpb.HealthCheckResponse.SERVING),
                          ("nope.Service", hpb.HealthCheckResponse.SERVICE_UNKNOWN)):
        stream = h.Watch(hpb.HealthCheckRequest(service=service), timeout=30)
        try:
            got = hpb.HealthCheckResponse.ServingStatus.Name(next(stream).status)
        except grpc.RpcError as e:
            got = e.code().name
        time.sleep(0.3)
        open_ = stream.is_active()
        stream.cancel()
        ck.check(got == hpb.HealthCheckResponse.ServingStatus.Name(want) and open_,
                 f"a: Health/Watch {service!r} sends {got} first and stays open ({open_})")


def health_watch_at_shutdown(d):
    """SIGTERM with a Health/Watch open (its deadline far off): ztraind stops at once and the
    stream ends, instead of waiting for the client."""
    channel = grpc.insecure_channel(d.grpc_addr)
    stream = hrpc.HealthStub(channel).Watch(hpb.HealthCheckRequest(), timeout=600)
    try:
        next(stream)
    except grpc.RpcError:
        pass
    t = time.monotonic()
    rc = d.stop(timeout=20)
    took = time.monotonic() - t
    try:
        for _ in stream:
            pass
        end = "OK"
    except grpc.RpcError as e:
        end = e.code().name
    channel.close()
    ck.check(rc == 0 and took < 10 and end in ("OK", "UNAVAILABLE", "CANCELLED"),
             f"ztraind stops cleanly on SIGTERM with a Health/Watch open (exit {rc}, "
             f"{took:.1f} s, the stream ended {end})")


def case_b(d):
    blocker = submit(d, tiny_job(d.data_root, name="blocker", max_steps=LONG, log_interval=50))
    j = wait_state(d, blocker.id, {"RUNNING"})
    ck.check(state_name(j.state) == "RUNNING", f"b: the first job runs ({state_name(j.state)})")
    second = submit(d, tiny_job(d.data_root, name="second", max_steps=30))
    third = submit(d, tiny_job(d.data_root, name="third", max_steps=LONG))
    s2, s3, s1 = get_job(d, second.id), get_job(d, third.id), get_job(d, blocker.id)
    ck.check(state_name(s2.state) == "QUEUED" and s2.reason and state_name(s3.state) == "QUEUED",
             f"b: with --max-ranks 1 the others wait QUEUED with a reason ('{s2.reason}'; the "
             f"first is {state_name(s1.state)} {s1.reason})")
    # A job with no record yet has no loss: NaN, never a 0 that reads as a real value.
    ck.check(math.isnan(s2.loss) and math.isnan(s2.tokens_per_second) and s2.step == 0,
             f"b: a queued job's loss and tokens/s are NaN ({s2.loss}, {s2.tokens_per_second})")
    queued = d.stub().ListJobs(pb.ListJobsRequest(state=pb.JOB_STATE_QUEUED), metadata=d.metadata)
    running = d.stub().ListJobs(pb.ListJobsRequest(state=pb.JOB_STATE_RUNNING), metadata=d.metadata)
    ck.check([x.id for x in queued.jobs] == [third.id, second.id] and
             [x.id for x in running.jobs] == [blocker.id],
             "b: ListJobs filters by state, newest first")

    # The watch opens while the job waits, so it sees every state from QUEUED on.
    import threading
    result = {}
    t = threading.Thread(target=lambda: result.update(w=watch(d, second.id)))
    t.start()
    time.sleep(0.3)
    d.stub().CancelJob(pb.CancelJobRequest(id=blocker.id, force=True), metadata=d.metadata)
    t.join(90)
    states, records, code = result.get("w", ([], [], None))
    ck.check(code == grpc.StatusCode.OK and states[:1] == ["QUEUED"] and "RUNNING" in states and
             states[-1] == "SUCCEEDED" and states.index("RUNNING") > 0,
             f"b: WatchJob sees {states} and ends OK ({code})")
    ck.check([r.step for r in records] == list(range(1, 31)),
             f"b: ... with one record per step ({len(records)} records)")
    d.stub().CancelJob(pb.CancelJobRequest(id=third.id, force=True), metadata=d.metadata)
    wait_state(d, third.id, {"CANCELLED"})
    return second.id


def case_c(d, job_id):
    job = get_job(d, job_id)
    recs = [r for r in read_metrics(os.path.join(job.run_dir, "metrics.jsonl")) if "train/loss" in r]
    resp = d.stub().GetMetrics(pb.GetMetricsRequest(id=job_id, keys=["train/loss"]),
                               metadata=d.metadata)
    s = resp.series[0] if len(resp.series) == 1 else None
    ck.check(s is not None and s.key == "train/loss" and
             list(s.steps) == [r["train/global_step"] for r in recs] and
             list(s.values) == [r["train/loss"] for r in recs],
             f"c: GetMetrics' train/loss equals metrics.jsonl ({len(recs)} records)")
    all_keys = d.stub().GetMetrics(pb.GetMetricsRequest(id=job_id), metadata=d.metadata)
    keys = {x.key for x in all_keys.series}
    ck.check({"train/loss", "train/learning_rate", "perf/tokens_per_second"} <= keys,
             f"c: with no keys every series comes back ({len(keys)} keys)")
    thin = d.stub().GetMetrics(pb.GetMetricsRequest(id=job_id, keys=["train/loss"], max_points=5),
                               metadata=d.metadata).series[0]
    ck.check(len(thin.steps) == 5 and thin.steps[-1] == recs[-1]["train/global_step"],
             f"c: max_points=5 keeps 5 points ending at the last ({list(thin.steps)})")
    since = d.stub().GetMetrics(pb.GetMetricsRequest(id=job_id, keys=["train/loss"],
                                                     since_step=25), metadata=d.metadata).series[0]
    ck.check(list(since.steps) == list(range(25, 31)), f"c: since_step=25 ({list(since.steps)})")


def case_d(d):
    job = submit(d, tiny_job(d.data_root, name="replay", max_steps=3000, log_interval=15))
    j = wait_step(d, job.id, 30)
    ck.check(state_name(j.state) == "RUNNING" and j.step >= 30,
             f"d: the job is running (step {j.step})")
    states, records, code = watch(d, job.id, since_step=0)
    later = watch(d, job.id, since_step=1500)[1]
    end = get_job(d, job.id)
    recs = [r for r in read_metrics(os.path.join(end.run_dir, "metrics.jsonl"))]
    ck.check(code == grpc.StatusCode.OK and states[0] == "RUNNING" and states[-1] == "SUCCEEDED",
             f"d: the watch starts RUNNING and ends SUCCEEDED ({states[0]}..{states[-1]}, {code})")
    ck.check([r.step for r in records] == [r["train/global_step"] for r in recs] and
             len(records) == 200,
             f"d: WatchJob from step 0 replays every record ({len(records)} of {len(recs)})")
    same = all(record_values(a).get("train/loss") == b["train/loss"] and
               record_values(a).get("train/learning_rate") == b["train/learning_rate"]
               for a, b in zip(records, recs))
    ck.check(same, "d: ... with the values of metrics.jsonl")
    ck.check(later and later[0].step == 1500 and later[-1].step == 3000,
             f"d: since_step=1500 starts at step {later[0].step if later else None}")
    nulls_left_out = all(all(v.value == v.value for v in r.values) for r in records)
    ck.check(nulls_left_out, "d: no record carries a NaN (nulls are left out)")


def case_e(d):
    stub = d.stub()
    ids = [submit(d, tiny_job(d.data_root, name=f"page{i}", max_steps=3)).id for i in range(3)]
    for i in ids:
        wait_state(d, i, {"SUCCEEDED", "FAILED"})
    everything = stub.ListJobs(pb.ListJobsRequest(page_size=1000), metadata=d.metadata)
    all_ids = [j.id for j in everything.jobs]
    pages, token = [], ""
    while True:
        page = stub.ListJobs(pb.ListJobsRequest(page_size=2, page_token=token), metadata=d.metadata)
        pages.append([j.id for j in page.jobs])
        token = page.next_page_token
        if not token:
            break
    ck.check(all_ids == sorted(all_ids, reverse=True) and all_ids[:3] == ids[::-1],
             f"e: ListJobs is newest first ({all_ids})")
    ck.check(sum(pages, []) == all_ids and all(len(p) <= 2 for p in pages) and
             everything.next_page_token == "",
             f"e: pages of 2 with tokens cover the list once ({pages})")

    job = tiny_job(d.data_root, name="idem", max_steps=3)
    a = submit(d, job, key="abc-123")
    b = submit(d, job, key="abc-123")
    ck.check(a.id == b.id and a.idempotency_key == "abc-123",
             f"e: a repeated idempotency key returns the first job ({a.id}, {b.id})")

    lines = [l.text for l in stub.StreamLogs(pb.StreamLogsRequest(id=ids[0], tail=2),
                                             metadata=d.metadata, timeout=10)]
    ck.check(len(lines) == 2 and "exited with status 0" in lines[-1],
             f"e: StreamLogs tail=2 gives the last two lines ({lines})")
    case_f(d)

    missing = "job-999999"
    calls = {
        "GetJob": lambda: stub.GetJob(pb.GetJobRequest(id=missing), metadata=d.metadata),
        "CancelJob": lambda: stub.CancelJob(pb.CancelJobRequest(id=missing), metadata=d.metadata),
        "GetMetrics": lambda: stub.GetMetrics(pb.GetMetricsRequest(id=missing), metadata=d.metadata),
        "WatchJob": lambda: list(stub.WatchJob(pb.WatchJobRequest(id=missing), metadata=d.metadata,
                                               timeout=10)),
        "StreamLogs": lambda: list(stub.StreamLogs(pb.StreamLogsRequest(id=missing, follow=True),
                                                   metadata=d.metadata, timeout=10)),
    }
    for name, call in calls.items():
        try:
            call()
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
        ck.check(code == grpc.StatusCode.NOT_FOUND and missing in details,
                 f"e: {name} of an unknown id is NOT_FOUND naming it ({code}: {details})")


def case_f(d):
    """The tail of a finished job's log over every way in, against every line it keeps: a job
    that prints each step (DeepSpeed's steps_per_print 1), so that it keeps more than 100."""
    stub = d.stub()
    job_id = submit(d, tiny_job(d.data_root, name="chatty", max_steps=120, log_interval=60,
                                deepspeed={"train_micro_batch_size_per_gpu": 1,
                                           "steps_per_print": 1})).id
    j = wait_state(d, job_id, {"SUCCEEDED", "FAILED"}, timeout=120)
    kept = [l.text for l in stub.StreamLogs(pb.StreamLogsRequest(id=job_id, tail=10000),
                                            metadata=d.metadata, timeout=10)]
    ck.check(state_name(j.state) == "SUCCEEDED" and len(kept) > 100,
             f"f: a job that keeps more than 100 log lines ({state_name(j.state)}, {len(kept)})")
    want = {None: kept[-100:], 0: [], 2: kept[-2:]}
    sys.path.insert(0, os.path.join(SOURCE, "clients", "python"))
    import ztrain

    def grpc_tail(tail, follow):
        req = pb.StreamLogsRequest(id=job_id, follow=follow)
        if tail is not None:
            req.tail = tail
        return [l.text for l in stub.StreamLogs(req, metadata=d.metadata, timeout=30)]

    def http_tail(tail, follow):
        if follow:
            return None  # HTTP follows with /events?logs=1, not /logs
        query = "" if tail is None else f"?tail={tail}"
        with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}/logs{query}",
                                    timeout=30) as r:
            return [l.get("text", "") for l in json.load(r).get("lines", [])]

    def cli_tail(tail, follow):
        args = [os.path.join(BUILD, "ztrain"), "logs", job_id, "--server", d.grpc_addr]
        args += (["--tail", str(tail)] if tail is not None else []) + (["-f"] if follow else [])
        env = {k: v for k, v in os.environ.items() if k not in ("ZTRAIN_SERVER", "ZTRAIN_TOKEN")}
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
        if p.returncode != 0:
            return f"exit {p.returncode}: {p.stderr.strip()}"
        # [ztraind] and [rank N] prefix the lines of ztraind and of ranks above 0.
        return [line.split("] ", 1)[1] if line.startswith(("[ztraind] ", "[rank ")) else line
                for line in p.stdout.splitlines()]

    def python_tail(tail, follow):
        with ztrain.Client(d.grpc_addr) as c:
            kw = {} if tail is None else {"tail": tail}
            return [l.text for l in c.logs(job_id, follow=follow, timeout=30, **kw)]

    ways = {"gRPC": grpc_tail, "HTTP": http_tail, "CLI": cli_tail, "Python": python_tail}
    for name, read in ways.items():
        for tail in (None, 0, 2):
            for follow in (False, True):
                try:
                    got = read(tail, follow)
                except (grpc.RpcError, urllib.error.URLError, ztrain.ZtrainError) as e:
                    got = f"{type(e).__name__}: {e}"
                if got is None:
                    continue
                ck.check(got == want[tail], f"f: {name} tail={tail} follow={follow} gives "
                         f"{len(want[tail])} of the {len(kept)} kept lines (got "
                         f"{got if isinstance(got, str) else len(got)})")


tmp = temp_dir("ztrain-grpc-jobs-")
with Daemon(BUILD, tmp, max_ranks=1) as d:
    for case in (case_a, case_b, case_c, case_d, case_e):
        t = time.monotonic()
        if case is case_c:
            case(d, second_id)
        elif case is case_b:
            second_id = case(d)
        else:
            case(d)
        print(f"      ({case.__name__}: {time.monotonic() - t:.1f} s)")
    health_watch_at_shutdown(d)
ck.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind {d.sanitizer_errors()}")
ck.done()
