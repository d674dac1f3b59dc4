"""One API, two transports: every JSON route of the HTTP API answers with the proto3 JSON mapping
of the message gRPC answers with, so that google.protobuf.json_format.Parse (protobuf's own
parser, strict: an unknown or misspelt field is an error) reads each HTTP body into that
message, and the message equals the gRPC answer (run in .venv/).

A real job of 6 steps checkpoints every 2 steps, gets a NaN gradient injected at step 3 (an
anomaly "nonfinite", policy skip; ZTRAIN_INJECT_NAN_GRAD as test_anomaly_events uses it) and
sends its end to a webhook nobody listens on (one attempt, "failed"). Each route is then read
over HTTP and parsed, and compared with gRPC (all of it after the job ended, so nothing moves
between the two reads):

  a. GET /api/v1/jobs (ListJobsResponse) and /jobs/{id} (Job) equal ListJobs and GetJob; the
     job's times are Timestamps within the test's own clock readings around the run, and its
     run_duration is end_time - start_time.
  b. /checkpoints (ListCheckpointsResponse) equals ListCheckpoints and the directory on disk;
     /config (EffectiveConfig) equals GetEffectiveConfig and the file rank 0 wrote.
  c. /anomalies (ListAnomaliesResponse) equals ListAnomalies (one nonfinite event at step 3),
     also paged one event at a time; /webhooks (ListWebhookDeliveriesResponse) equals
     ListWebhookDeliveries (the dead receiver's "failed").
  d. /metrics (GetMetricsResponse) equals GetMetrics for the same keys and for all keys;
     /records (ListMetricRecordsResponse) equals WatchJob's metric events, and their losses are
     the rank's own metrics.jsonl; /logs (ListLogLinesResponse) equals StreamLogs' tail.
  e. /events (SSE): each event's data parses as the message WatchJob's JobEvent carries for it
     (job: Job, metrics: MetricRecord, anomaly: AnomalyEvent), and the sequence equals
     WatchJob's; both open with the ended job's state (the proto's "current state first")
     and end with it ("the stream ends after the event that carries a terminal state").
  f. POST /api/v1/jobs and POST /cancel answer a Job that equals GetJob's fields that do not
     move (id, spec, create_time), and the cancelled job's state is the name JOB_STATE_*.
  g. The raw JSON follows the mapping's spelling: lowerCamelCase names, the state's enum name,
     int64 as strings, RFC 3339 times, a "1.5s"-style Duration, NaN as "NaN"; no snake_case
     name of the old HTTP JSON is left.
  h. A missing job is NotFound naming jobs/ID for each side-data method."""
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, LONG, SOURCE, Checker, Daemon, read_metrics, temp_dir, tiny_job  # noqa: E402
from ports import free_port  # noqa: E402

sys.path.insert(0, os.path.join(SOURCE, "clients", "python"))
import ztrain  # noqa: E402
from ztrain._gen import ztrain_pb2 as pb  # noqa: E402
from google.protobuf import json_format  # noqa: E402

ck = Checker()
TOKEN = "parity-token"


def http_raw(d, path, method="GET", body=None):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
        body = json.dumps(body).encode()
    req = urllib.request.Request(d.http_url + path, data=body, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def http(d, path, message, method="GET", body=None):
    """The route's body parsed strictly into `message` (a class), and the raw JSON."""
    text = http_raw(d, path, method, body)
    try:
        return json_format.Parse(text, message()), json.loads(text)
    except json_format.ParseError as e:
        ck.check(False, f"{method} {path}: json_format.Parse as {message.__name__}: {e}")
        return message(), json.loads(text)


def same(name, via_http, via_grpc):
    ck.check(via_http == via_grpc,
             f"{name}: HTTP equals gRPC" + ("" if via_http == via_grpc else
                                            f"\n  HTTP {via_http}\n  gRPC {via_grpc}"))


def sse_events(d, job_id):
    """(event, data) pairs of the job's event stream, which ends after its terminal state."""
    req = urllib.request.Request(d.http_url + f"/api/v1/jobs/{job_id}/events",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    out, event, data = [], None, []
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and event:
                out.append((event, "\n".join(data)))
                event, data = None, []
    return out


def check_spelling(raw_job, raw_series, raw_list):
    text = json.dumps([raw_job, raw_series, raw_list])
    old = [k for k in re.findall(r'"([a-z0-9]+(?:_[a-z0-9]+)+)":', text)
           if k not in raw_job.get("spec", {}).get("deepspeedJson", "")]
    ck.check(not old, f"g: no snake_case member names left ({sorted(set(old))[:8]})")
    ck.check(raw_job["state"] == "JOB_STATE_SUCCEEDED", f"g: state by its enum name "
             f"({raw_job['state']!r})")
    ck.check(isinstance(raw_job["step"], str) and raw_job["step"] == "6",
             f"g: int64 step as a string ({raw_job['step']!r})")
    rfc3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3}|\.\d{6}|\.\d{9})?Z$")
    ck.check(all(rfc3339.match(raw_job[k]) for k in ("createTime", "startTime", "endTime")),
             f"g: RFC 3339 times ({raw_job['createTime']}, {raw_job['endTime']})")
    ck.check(re.match(r"^\d+(\.\d{3}|\.\d{6}|\.\d{9})?s$", raw_job["runDuration"]) is not None,
             f"g: Duration as seconds ({raw_job['runDuration']})")
    series = raw_series["series"][0]
    ck.check(all(isinstance(s, str) for s in series["steps"]),
             f"g: the series' int64 steps as strings ({series['steps'][:3]})")
    figures = raw_job["ranks"][0]
    ck.check(isinstance(figures.get("stepTimeMs"), (int, float)),
             f"g: a rank's figures by lowerCamelCase names ({sorted(figures)[:6]})")
    ck.check("nextPageToken" not in raw_list,
             "g: an empty next page token is left out, as protobuf prints defaults")


def main():
    tmp = temp_dir("ztrain-parity-")
    os.environ["ZTRAIN_INJECT_NAN_GRAD"] = "3"
    with Daemon(BUILD, os.path.join(tmp, "d"), token=TOKEN,
                extra_args=["--webhook-attempts", "1", "--webhook-allow", "127.0.0.1",
                            "--webhook-allow-private"]) as d:
        c = ztrain.Client(d.grpc_addr, token=TOKEN)
        stub, md = c._stub, c._metadata
        job = tiny_job(d.data_root, name="parity", max_steps=6, checkpoint_dir="ck",
                       checkpoint_interval=2)
        job["events"] = {"nonfinite": {"policy": "skip"}}
        job["alerts"] = {"webhooks": [{"url": f"http://127.0.0.1:{free_port()}/hook",
                                       "on": ["end"]}]}
        before = time.time()
        j = c.submit(job)
        end = c.wait(j.id, timeout=120)
        after = time.time()
        ck.check(ztrain.state_name(end.state) == "SUCCEEDED", f"the job ran ({end.reason})")
        # The end's webhook is delivered after the job ends: wait for its one attempt.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hooks = c.webhook_deliveries(j.id)
            if hooks and all(h.outcome != "retrying" for h in hooks):
                break
            time.sleep(0.2)

        # a. jobs
        got, raw_job = http(d, f"/api/v1/jobs/{j.id}", pb.Job)
        grpc_job = stub.GetJob(pb.GetJobRequest(id=j.id), metadata=md)
        same("a: GET /jobs/{id} as Job", got, grpc_job)
        listed, _ = http(d, "/api/v1/jobs?page_size=10", pb.ListJobsResponse)
        same("a: GET /jobs as ListJobsResponse", listed,
             stub.ListJobs(pb.ListJobsRequest(page_size=10), metadata=md))
        times = [got.create_time.ToMilliseconds() / 1e3, got.start_time.ToMilliseconds() / 1e3,
                 got.end_time.ToMilliseconds() / 1e3]
        ck.check(before - 1 <= times[0] <= times[1] <= times[2] <= after + 1,
                 f"a: create <= start <= end times within the test's clock "
                 f"[{before:.3f}, {after:.3f}]: {times}")
        ran = got.end_time.ToMilliseconds() - got.start_time.ToMilliseconds()
        ck.check(got.run_duration.ToMilliseconds() == ran,
                 f"a: run_duration {got.run_duration.ToMilliseconds()} ms = end - start {ran} ms")
        att = got.attempts[0] if got.attempts else pb.JobAttempt()
        ck.check(len(got.attempts) == 1 and att.start_time.ToMilliseconds() >=
                 got.create_time.ToMilliseconds() and att.HasField("end_time"),
                 f"a: its one attempt's start and end times ({att})")

        # b. checkpoints and the effective config
        ckdir = end.checkpoint_dir
        on_disk = sorted((t, os.path.exists(os.path.join(ckdir, t, "DONE")))
                         for t in os.listdir(ckdir)
                         if os.path.isdir(os.path.join(ckdir, t)) and not t.startswith("."))
        with open(os.path.join(ckdir, "latest")) as f:
            latest = f.read().strip()
        cks, _ = http(d, f"/api/v1/jobs/{j.id}/checkpoints", pb.ListCheckpointsResponse)
        same("b: /checkpoints as ListCheckpointsResponse", cks, c.checkpoints(j.id))
        ck.check(sorted((x.tag, x.complete) for x in cks.checkpoints) == on_disk and
                 len(on_disk) == 3 and cks.latest == latest,
                 f"b: the checkpoints on disk {on_disk}, latest {latest!r}")
        cfg, _ = http(d, f"/api/v1/jobs/{j.id}/config", pb.EffectiveConfig)
        same("b: /config as EffectiveConfig", cfg,
             stub.GetEffectiveConfig(pb.GetEffectiveConfigRequest(id=j.id), metadata=md))
        with open(os.path.join(end.run_dir, "ds_config.effective.json")) as f:
            written = json.load(f)
        ck.check(json.loads(cfg.deepspeed_json or "null") == written,
                 "b: the effective config is the file rank 0 wrote")

        # c. anomalies and webhook deliveries
        an, raw_an = http(d, f"/api/v1/jobs/{j.id}/anomalies", pb.ListAnomaliesResponse)
        same("c: /anomalies as ListAnomaliesResponse", an,
             stub.ListAnomalies(pb.ListAnomaliesRequest(id=j.id), metadata=md))
        ck.check([(a.kind, a.step, a.policy, a.seq) for a in an.anomalies] ==
                 [("nonfinite", 3, "skip", 1)], f"c: one nonfinite event at step 3 ({an})")
        paged, token, pages = [], "", 0
        while pages < 10:
            page, _ = http(d, f"/api/v1/jobs/{j.id}/anomalies?page_size=1" +
                           (f"&page_token={token}" if token else ""), pb.ListAnomaliesResponse)
            paged += list(page.anomalies)
            token, pages = page.next_page_token, pages + 1
            if not token:
                break
        ck.check(paged == list(c.anomalies(j.id, page_size=1)) and len(paged) == 1,
                 f"c: paging by one gives the same events over both ({pages} pages)")
        hooks_http, _ = http(d, f"/api/v1/jobs/{j.id}/webhooks",
                             pb.ListWebhookDeliveriesResponse)
        same("c: /webhooks as ListWebhookDeliveriesResponse", hooks_http,
             stub.ListWebhookDeliveries(pb.ListWebhookDeliveriesRequest(id=j.id), metadata=md))
        ck.check([(h.type, h.outcome) for h in hooks_http.deliveries] == [("job.end", "failed")]
                 and hooks_http.deliveries[0].HasField("time"),
                 f"c: the dead receiver's one attempt, failed ({hooks_http})")

        # d. metrics, records, logs
        keys = ["train/loss", "train/learning_rate", "no/such_key"]
        series, raw_series = http(d, f"/api/v1/jobs/{j.id}/metrics?keys=" + ",".join(keys),
                                  pb.GetMetricsResponse)
        same("d: /metrics?keys= as GetMetricsResponse", series,
             stub.GetMetrics(pb.GetMetricsRequest(id=j.id, keys=keys), metadata=md))
        every, _ = http(d, f"/api/v1/jobs/{j.id}/metrics", pb.GetMetricsResponse)
        same("d: /metrics (every key) as GetMetricsResponse", every,
             stub.GetMetrics(pb.GetMetricsRequest(id=j.id), metadata=md))
        records, raw_records = http(d, f"/api/v1/jobs/{j.id}/records",
                                    pb.ListMetricRecordsResponse)
        watched = [ev for ev in stub.WatchJob(pb.WatchJobRequest(id=j.id), metadata=md,
                                              timeout=60)]
        same("d: /records as ListMetricRecordsResponse, WatchJob's metric events",
             list(records.records), [ev.metrics for ev in watched
                                     if ev.WhichOneof("event") == "metrics"])
        rank0 = read_metrics(os.path.join(end.run_dir, "metrics.jsonl"))
        want = [(r["train/global_step"], r["train/loss"]) for r in rank0 if "train/loss" in r]
        have = [(r.step, {v.key: v.value for v in r.values}.get("train/loss"))
                for r in records.records]
        ck.check(have == want and len(want) == 6,
                 f"d: the records' losses are the rank's metrics.jsonl ({have[:2]} ...)")
        ck.check(all(r.HasField("time") and before - 1 <= r.time.ToMilliseconds() / 1e3 <= after + 1
                     for r in records.records), "d: each record's time within the run")
        logs, _ = http(d, f"/api/v1/jobs/{j.id}/logs?tail=5", pb.ListLogLinesResponse)
        streamed = list(stub.StreamLogs(pb.StreamLogsRequest(id=j.id, tail=5), metadata=md,
                                        timeout=60))
        same("d: /logs as ListLogLinesResponse, StreamLogs' tail", list(logs.lines), streamed)
        ck.check(len(logs.lines) == 5, f"d: tail=5 gives 5 lines ({len(logs.lines)})")
        # A tail above the kept lines is every kept line (docs/api.md, Logs), over HTTP as over
        # gRPC: the largest the proto's int32 holds, and one past the 100,000 HTTP once refused.
        kept = list(stub.StreamLogs(pb.StreamLogsRequest(id=j.id, tail=10000), metadata=md,
                                    timeout=60))
        for big in (100001, 2**31 - 1):
            try:
                logs, raw = http(d, f"/api/v1/jobs/{j.id}/logs?tail={big}",
                                 pb.ListLogLinesResponse)
            except urllib.error.HTTPError as e:
                logs, raw = None, f"{e.code} {e.read()[:100]}"
            streamed = list(stub.StreamLogs(pb.StreamLogsRequest(id=j.id, tail=big),
                                            metadata=md, timeout=60))
            ck.check(logs is not None and list(logs.lines) == streamed == kept and len(kept) > 5,
                     f"d: tail={big} gives every kept line over HTTP and gRPC "
                     f"({len(streamed)} of {len(kept)}; HTTP {str(raw)[:120]})")

        # e. the event stream
        kinds = {"job": ("job", pb.Job), "metrics": ("metrics", pb.MetricRecord),
                 "anomaly": ("anomaly", pb.AnomalyEvent), "log": ("log", pb.LogLine)}
        sse, bad = [], []
        for event, data in sse_events(d, j.id):
            field, cls = kinds.get(event, (None, None))
            try:
                sse.append((field, json_format.Parse(data, cls())))
            except (json_format.ParseError, TypeError) as e:
                bad.append(f"{event}: {e}")
        ck.check(not bad, f"e: every SSE event parses as its message ({bad[:2]})")
        as_grpc = [(ev.WhichOneof("event"), getattr(ev, ev.WhichOneof("event")))
                   for ev in watched]
        # A job event's run_duration is the same for an ended job; the lists are whole.
        same("e: /events as WatchJob's events", sse, as_grpc)
        # The current state comes first, an ended job's too; the stream still ends with it.
        for what, evs in (("WatchJob", as_grpc), ("/events", sse)):
            jobs_at = [i for i, (field, _) in enumerate(evs) if field == "job"]
            ck.check(len(evs) > 2 and jobs_at == [0, len(evs) - 1] and
                     evs[0][1].state == evs[-1][1].state == end.state,
                     f"e: {what} of the ended job opens with its state and ends with it (job "
                     f"events at {jobs_at} of {len(evs)})")

        # f. submit and cancel over HTTP
        long_job = tiny_job(d.data_root, name="parity-long", max_steps=LONG)
        posted, _ = http(d, "/api/v1/jobs", pb.Job, "POST", {"spec": long_job})
        fresh = stub.GetJob(pb.GetJobRequest(id=posted.id), metadata=md)
        ck.check(posted.id and posted.spec == fresh.spec and posted.create_time == fresh.create_time,
                 f"f: POST /jobs answers the Job GetJob gives ({posted.id})")
        cancelled, raw_cancel = http(d, f"/api/v1/jobs/{posted.id}/cancel", pb.Job, "POST",
                                     {"force": True})
        ck.check(cancelled.id == posted.id and raw_cancel["state"].startswith("JOB_STATE_"),
                 f"f: POST /cancel answers the Job ({raw_cancel['state']})")
        c.wait(posted.id, timeout=60)

        # g. the spelling of the raw JSON
        check_spelling(raw_job, raw_series, raw_an)
        ck.check(all(isinstance(v, str) and v == "NaN" or isinstance(v, (int, float))
                     for r in raw_records["records"] for v in
                     [x.get("value", 0) for x in r.get("values", [])]),
                 "g: record values are numbers")
        gpu = raw_job["ranks"][0].get("gpuUtil")
        ck.check(gpu == "NaN" and math.isnan(got.ranks[0].gpu_util),
                 f"g: a CPU rank's GPU figure, NaN, is the string \"NaN\" ({gpu!r})")

        # h. a missing job
        for name, call in (("ListCheckpoints", lambda: c.checkpoints("job-424242")),
                           ("GetEffectiveConfig", lambda: c.effective_config("job-424242")),
                           ("ListAnomalies", lambda: list(c.anomalies("job-424242"))),
                           ("ListWebhookDeliveries", lambda: c.webhook_deliveries("job-424242"))):
            try:
                call()
                err = None
            except ztrain.NotFound as e:
                err = e
            ck.check(err is not None and err.resource == "jobs/job-424242",
                     f"h: {name} of a missing job: {err!r}")
        c.close()
    ck.done()


if __name__ == "__main__":
    main()
