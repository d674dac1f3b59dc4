"""ztraind's HTTP API, driven against a real daemon running real jobs (submitted over gRPC with
grpcio), with the worker's own metrics.jsonl as the reference for every number:

  a. A port already in use is a startup error naming host:port.
  b. Open routes (/healthz, /, /vendor/chart.js/, OPTIONS preflights) need no token; /api/* and
     /metrics answer 401 with WWW-Authenticate without it or with a wrong one; no response
     allows other origins (no Access-Control-Allow-Origin, Vary: Origin; a preflight from
     another origin is 403: test_http_security.py has the rest); unknown routes 404, wrong methods 405,
     OPTIONS 204 with the 405's Allow (404 on unknown routes), bad query values 400 naming
     the parameter; path traversal under /static/ and /vendor/ is refused; an oversized POST is
     refused; garbage on the socket does not hurt the daemon. An HTTP/1.1 request without Host
     is 400 (RFC 9112 3.2) with a problem body; the refusals libmicrohttpd makes itself, before
     ztraind sees the request (a URL or header over its memory limit, an HTTP version it does
     not speak), are the statuses the OpenAPI document lists for them.
  c. A finished job: a live event stream opened at submission replays and follows every record
     (equal to metrics.jsonl) and log line, each metrics and log event with
     "<record seq>:0:<log seq>" as the event id, the last of each sent (no anomaly events), and
     ends after the terminal job
     event; an eval step's two records are each given once by /records paged one record at a
     time, by a stream dropped between them and resumed with Last-Event-ID or ?after_seq=, and
     by WatchJob's after_seq; a bare-number Last-Event-ID (the old step id) resumes at the
     next step, a two-number one (the id before log lines had one) after that record; a stream
     with logs dropped after a log line and resumed with Last-Event-ID, ?after_log_seq= or
     WatchJob's after_log_seq gives every line once; GET /api/v1/jobs/{id} has
     every field, the checkpoints with DONE and "latest"; metric series equal metrics.jsonl (keys
     repeated or comma-separated alike, 65 of them 400),
     max_points thins them keeping the last point; records and logs; the list pages.
  d. /metrics parses as Prometheus text (HELP and TYPE for every family, names in base units:
     ztrain_job_flops_per_second is perf/tflops times 10^12) and ztrain_job_loss is the last
     train/loss; label values are escaped.
  e. A running job: its run duration and /healthz; cancel over POST ends it CANCELLED with a complete
     checkpoint, and its event stream (authorised by ?access_token=) ends with that state.
  f. SIGTERM with an event stream open: the daemon ends it, stops and exits 0 (under ASan: no
     leaks)."""
import http.client
import json
import math
import os
import re
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api_view  # noqa: E402
import grpc  # noqa: E402
from svc import (BUILD, SOURCE, TERMINAL, Checker, Daemon, read_metrics, stubs,  # noqa: E402
                 submit, temp_dir, tiny_job)

sys.stdout.reconfigure(line_buffering=True)
TOKEN = "tok-3f9a7c1e"
# The members of a finished job's Job JSON (proto3 mapping: defaults such as an empty reason or
# idempotencyKey are left out).
JOB_FIELDS = ("id", "name", "state", "comm", "grid", "createTime", "startTime", "endTime",
              "runDuration", "step", "maxSteps", "loss", "tokensPerSecond", "ranks", "attempts",
              "runDir", "checkpointDir", "spec")
ck = Checker()
top = temp_dir("ztrain-http-")
# An event's data is the proto3 JSON of its message; the checks read plain values.
SSE_VIEW = {"job": api_view.job, "metrics": api_view.record, "anomaly": api_view.anomaly,
            "log": api_view.log_line}


def start_job(d, name, max_steps, log_interval=1, **train):
    """Submits svc's tiny GPT-2 (2 layers, n_embd 32); eval_interval adds the text as val data."""
    job = tiny_job(d.data_root, name=name, max_steps=max_steps, log_interval=log_interval,
                   **train)
    if train.get("eval_interval"):
        job["data"]["val"] = job["data"]["train"]
        job["train"].setdefault("eval_steps", 2)
    return submit(d, job).id


# ---- HTTP helpers ----------------------------------------------------------------------------

class Http:
    def __init__(self, port, token):
        self.port, self.token = port, token

    def request(self, method, path, body=None, headers=None, auth=True, timeout=30):
        """(status, headers, body bytes); status None when the server dropped the connection."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = dict(headers or {})
        if auth and self.token:
            h["Authorization"] = "Bearer " + self.token
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return r.status, r.headers, r.read()
        except (ConnectionError, http.client.HTTPException):
            return None, {}, b""
        finally:
            c.close()

    def get(self, path, **kw):
        """(status, parsed JSON or None)."""
        status, _, data = self.request("GET", path, **kw)
        try:
            return status, api_view.view(path, json.loads(data))
        except ValueError:
            return status, None

    def job(self, job_id):
        return self.get(f"/api/v1/jobs/{job_id}")[1]

    def wait_job(self, job_id, pred, timeout=120):
        deadline = time.monotonic() + timeout
        j = None
        while time.monotonic() < deadline:
            j = self.job(job_id)
            if j and pred(j):
                return j
            time.sleep(0.1)
        return j


class EventStream(threading.Thread):
    """Reads a Server-Sent Events stream to its end into self.events: (event, data, id)."""

    def __init__(self, api, path, auth=True, timeout=120, headers=None):
        super().__init__(daemon=True)
        self.c = http.client.HTTPConnection("127.0.0.1", api.port, timeout=timeout)
        headers = dict(headers or {})
        if auth and api.token:
            headers["Authorization"] = "Bearer " + api.token
        self.c.request("GET", path, headers=headers)
        self.r = self.c.getresponse()
        self.status = self.r.status
        self.content_type = self.r.getheader("Content-Type", "")
        self.events, self.comments, self.error, self.clean_end = [], 0, None, False
        self.start()

    def run(self):
        name, data, eid = "message", [], None
        try:
            while True:
                line = self.r.readline()
                if not line:
                    self.clean_end = True
                    break
                line = line.decode("utf-8").rstrip("\n")
                if line == "":
                    if data:
                        self.events.append((name, SSE_VIEW.get(name, lambda x: x)(
                            json.loads("\n".join(data))), eid))
                    name, data, eid = "message", [], None
                elif line.startswith(":"):
                    self.comments += 1
                elif line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
                elif line.startswith("id: "):
                    eid = line[4:]
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            self.error = repr(e)
        finally:
            self.c.close()


def series_of(records, key):
    pts = [(r["train/global_step"], r[key]) for r in records if r.get(key) is not None]
    return [s for s, _ in pts], [v for _, v in pts]


def cors_ok(headers):
    """No other origin may read the answer (the daemon runs without --http-allow-origin), and
    caches are told that the answer depends on the Origin."""
    return ("Access-Control-Allow-Origin" not in headers and
            "Origin" in (headers.get("Vary") or ""))


# ---- cases -----------------------------------------------------------------------------------

def case_a(d):
    other = Daemon(BUILD, temp_dir("ztrain-http-port-"), start=False)
    other.http_port = d.http_port
    try:
        other.start(timeout=20)
        err = None
    except RuntimeError as e:
        err = str(e)
    other.stop(5)
    ck.check(err is not None and "exited with 1" in err and
             f"--http-addr 127.0.0.1:{d.http_port}: cannot listen there: the address is in use"
             in err,
             f"a: a port in use is an error naming it "
             f"({(err or 'it started').strip().splitlines()[-1]})")


def case_b(api, d):
    s, h, body = api.request("GET", "/healthz", auth=False)
    hz = json.loads(body) if s == 200 else {}
    ck.check(s == 200 and hz.get("status") == "ok" and
             all(isinstance(hz.get(k), int) for k in ("jobs", "running", "queued")) and cors_ok(h),
             f"b: /healthz needs no token and has status, jobs, running, queued ({s} {hz})")
    s, h, _ = api.request("OPTIONS", "/api/v1/jobs", auth=False,
                          headers={"Access-Control-Request-Method": "POST"})
    ck.check(s == 204 and cors_ok(h) and h.get("Access-Control-Max-Age"),
             f"b: OPTIONS is 204 with Max-Age, no token needed ({s})")
    # OPTIONS names the methods a route takes in Allow (RFC 9110 9.3.7): the methods the 405 of
    # a method it does not take names; a path with no route is 404, as for GET.
    for path in ("/api/v1/jobs", "/api/v1/jobs/job-000001/cancel",
                 "/api/v1/jobs/job-000001/events", "/api/v1/jobs/job-000001/metrics",
                 "/metrics", "/healthz", "/"):
        s, h, _ = api.request("OPTIONS", path, auth=False)
        _, h405, _ = api.request("PUT", path)
        ck.check(s == 204 and h.get("Allow") and h.get("Allow") == h405.get("Allow"),
                 f"b: OPTIONS {path}: 204 with Allow {h.get('Allow')!r}, the 405's "
                 f"{h405.get('Allow')!r} ({s})")
    for path in ("/nothing", "/api/v1/nothing", "/api/v1/jobs/job-000001/nothing"):
        s, _, body = api.request("OPTIONS", path, auth=False)
        s_get, _, _ = api.request("GET", path)
        ck.check(s == 404 == s_get and b"no route" in body,
                 f"b: OPTIONS {path} is 404 as GET is ({s}, GET {s_get})")
    s, h, _ = api.request("OPTIONS", "/api/v1/jobs", auth=False,
                          headers={"Origin": "http://x", "Access-Control-Request-Method": "POST"})
    ck.check(s == 403 and cors_ok(h),
             f"b: a preflight from another origin is 403 without CORS headers ({s})")
    for path in ("/api/v1/jobs", "/api/v1/jobs/job-000001/metrics", "/metrics"):
        s, h, body = api.request("GET", path, auth=False)
        s2, _, _ = api.request("GET", path, auth=False, headers={"Authorization": "Bearer nope"})
        s3, _, _ = api.request("GET", path, auth=False,
                               headers={"Authorization": "Basic " + TOKEN})
        ck.check(s == 401 and s2 == 401 and s3 == 401 and
                 h.get("WWW-Authenticate", "").startswith("Bearer") and cors_ok(h) and
                 json.loads(body).get("error") == "missing or invalid bearer token",
                 f"b: {path} without a token, with a wrong one, or not Bearer: 401 ({s} {s2} {s3})")
    s, h, _ = api.request("GET", "/api/v1/jobs")
    ck.check(s == 200 and cors_ok(h) and h.get("Content-Type") == "application/json",
             f"b: with the token: 200, JSON, no CORS headers ({s})")
    s, h, body = api.request("GET", "/", auth=False)
    index = os.path.join(SOURCE, "web", "index.html")
    if os.path.exists(index):
        with open(index, "rb") as f:
            ck.check(s == 200 and body == f.read() and h.get("Content-Type", "").startswith(
                "text/html"), f"b: / serves web/index.html without a token ({s})")
    else:
        ck.check(s == 404, f"b: / is 404 while web/index.html does not exist ({s})")
    chart = "/usr/share/javascript/chart.js/chart.min.js"
    if os.path.exists(chart):
        s, h, body = api.request("GET", "/vendor/chart.js/chart.min.js", auth=False)
        ck.check(s == 200 and len(body) == os.path.getsize(chart) and
                 h.get("Content-Type", "").startswith("text/javascript"),
                 f"b: /vendor/chart.js/chart.min.js is Debian's file ({s}, {len(body)} bytes)")
    for path in ("/static/../../../../etc/passwd", "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                 "/vendor/chart.js/../../../../etc/passwd", "/static/.hidden", "/static/a//b",
                 "/static/"):
        s, _, body = api.request("GET", path, auth=False)
        ck.check(s == 404 and b"root:" not in body, f"b: {path} is refused ({s})")
    for path, param in (("/api/v1/jobs/job-000001/metrics?since_step=abc", "since_step"),
                        ("/api/v1/jobs/job-000001/metrics?max_points=-1", "max_points"),
                        ("/api/v1/jobs/job-000001/records?since_step=1.5", "since_step"),
                        ("/api/v1/jobs/job-000001/logs?tail=x", "tail"),
                        ("/api/v1/jobs/job-000001/events?logs=maybe", "logs"),
                        # only the documented values: the OpenAPI enum has no "False"
                        ("/api/v1/jobs/job-000001/events?logs=False", "logs"),
                        # 0 is the default page and 1001 the maximum (AIP-158); -1 is no size
                        ("/api/v1/jobs?page_size=-1", "page_size"),
                        ("/api/v1/jobs?limit=-1", "limit"),
                        ("/api/v1/jobs?state=BOGUS", "state"),
                        ("/api/v1/jobs?page_token=job-999999", "page_token"),
                        ("/api/v1/jobs?after=../x", "after"),
                        # a NUL byte would cut the C string short: "%00x" must not read as ""
                        ("/api/v1/jobs?state=JOB_STATE_RUNNING&page_token=%00x", "page_token"),
                        ("/api/v1/jobs/job-000001/logs?tail=%001", "tail"),
                        ("/metrics?x%00y=1", r"x\x7fy"),  # the message escapes the byte
                        ("/api/v1/jobs/job-000001/metrics?keys=loss%09", "keys")):
        s, j = api.get(path)
        ck.check(s == 400 and j and j["error"].startswith(param + ":"),
                 f"b: {path} is 400 naming {param} ({s} {j})")
    for path in ("/api/v1/jobs/job-999999", "/api/v1/jobs/job-999999/metrics",
                 "/api/v1/jobs/job-999999/events", "/api/v1/jobs/..%2f..%2fetc",
                 "/api/v1/nothing", "/nothing"):
        s, j = api.get(path)
        ck.check(s == 404 and j and "error" in j, f"b: {path} is 404 with an error ({s} {j})")
    s, j = api.get("/api/v1/jobs/job-999999")
    ck.check(s == 404 and j and j["error"] == "jobs/job-999999 not found",
             f"b: a missing job is named by its resource name ({j})")
    # A decoded NUL must not end the path (not /api/v1/jobs, not job-000001) nor be shown as
    # another byte: the path is refused naming where the byte is.
    for path, at in (("/api/v1/jobs%00x", 12), ("/api/v1/jobs/job-000001%00x", 23),
                     ("/healthz%00", 8), ("/api/v1/jobs/job%1F1", 16)):
        s, j = api.get(path)
        ck.check(s == 400 and j and j.get("field") == "path" and f"byte {at}" in j["error"] and
                 "\x7f" not in j["error"], f"b: {path} is 400 naming the path ({s} {j})")
    s, h, body = api.request("DELETE", "/api/v1/jobs/job-000001")
    s2, _, _ = api.request("GET", "/api/v1/jobs/job-000001/cancel")
    ck.check(s == 405 and s2 == 405 and "GET" in h.get("Allow", ""),
             f"b: a wrong method is 405 with Allow ({s} {s2} {h.get('Allow')})")
    big = b"{" + b" " * (200 * 1024) + b"}"
    s, _, _ = api.request("POST", "/api/v1/jobs/job-000001/cancel", body=big,
                          headers={"Content-Type": "application/json"})
    ck.check(s in (413, None), f"b: a 200 KiB POST body is refused ({s})")
    s, _, _ = api.request("POST", "/api/v1/jobs/job-999999/cancel", body=b"not json",
                          headers={"Content-Type": "application/json"})
    ck.check(s == 400, f"b: a cancel body that is not JSON is 400 ({s})")
    # Garbage and abuse on raw sockets; the daemon must stay up and keep answering.
    for junk in (b"\x00\xff garbage\r\n\r\n", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\n\r\n",
                 b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 5000 + b"\r\n",
                 b"POST /api/v1/jobs/x/cancel HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\n"):
        try:
            with socket.create_connection(("127.0.0.1", api.port), timeout=5) as sock:
                sock.sendall(junk)
                sock.recv(4096)
        except OSError:
            pass
    s, _, _ = api.request("GET", "/healthz", auth=False)
    ck.check(s == 200 and d.proc.poll() is None, f"b: the daemon survives junk requests ({s})")

    def raw_answer(request):
        """(status, Content-Type, body) of one request sent as raw bytes."""
        with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
            try:
                sock.sendall(request)
            except OSError:
                pass  # the server may answer and close before it has read everything
            data = b""
            while True:
                try:
                    chunk = sock.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        ctype = {k.lower(): v.strip() for k, v in fields.items()}.get("content-type", "")
        status = int(lines[0].split()[1]) if len(lines[0].split()) > 1 else 0
        return status, ctype, body
    for version, want in ((b"HTTP/1.1", 400), (b"HTTP/1.0", 200)):
        st, ctype, body = raw_answer(b"GET /healthz " + version + b"\r\nConnection: close\r\n\r\n")
        problem = json.loads(body) if ctype == "application/problem+json" else {}
        ck.check(st == want and (want == 200 or problem.get("field") == "Host"),
                 f"b: {version.decode()} without Host is {want} ({st} {ctype} {body[:80]!r})")
    with open(os.path.join(SOURCE, "service", "http", "openapi.json")) as f:
        doc = json.load(f)
    listed = {code: doc["components"]["responses"][r["$ref"].split("/")[-1]] if "$ref" in r else r
              for code, r in doc["paths"]["/healthz"]["get"]["responses"].items()}
    for what, req, want in (
            ("a URL over the size limit", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n"
             b"\r\n", 414),
            ("a 100 KB header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: " + b"b" * 100000 +
             b"\r\n\r\n", 431),
            ("HTTP/2.0", b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505)):
        # libmicrohttpd sends its page without a Content-Type; the document says it is HTML.
        st, ctype, body = raw_answer(req)
        ck.check(st == want and body.startswith(b"<html>") and str(st) in listed and
                 list(listed[str(st)].get("content", {})) == ["text/html"],
                 f"b: {what}: libmicrohttpd's {st} ({ctype!r}, {body[:40]!r}) is listed in the "
                 f"OpenAPI document as HTML")


def read_until(api, path, stop, headers=None):
    """The (event, data, id) of an event stream up to and including the first event for which
    stop is true; then the connection is dropped, as a client that goes away."""
    c = http.client.HTTPConnection("127.0.0.1", api.port, timeout=60)
    c.request("GET", path, headers=dict(headers or {}, Authorization="Bearer " + api.token))
    r = c.getresponse()
    out, name, data, eid = [], "message", [], None
    try:
        while True:
            line = r.readline()
            if not line:
                return out
            line = line.decode("utf-8").rstrip("\n")
            if line == "":
                if data:
                    out.append((name, SSE_VIEW.get(name, lambda x: x)(
                        json.loads("\n".join(data))), eid))
                    if stop(out[-1]):
                        return out
                name, data, eid = "message", [], None
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line.startswith("id: "):
                eid = line[4:]
    finally:
        c.close()


def check_record_cursor(api, d, job_id, recs):
    """A step with two records (train and eval, every eval_interval): /records paged one record
    at a time, an event stream cut between the two and resumed by Last-Event-ID (or after_seq),
    and WatchJob's after_seq each give every record exactly once, in metrics.jsonl's order."""
    two = [st for st in {r["train/global_step"] for r in recs}
           if sum(r["train/global_step"] == st for r in recs) == 2]
    ck.check(len(two) >= 2, f"c: the eval steps have two records each ({sorted(two)})")
    for since in (0, min(two)):
        want = [r for r in recs if r["train/global_step"] >= since]
        s, _, raw = api.request("GET", f"/api/v1/jobs/{job_id}/records?since_step={since}")
        whole = json.loads(raw)["records"] if s == 200 else []
        pages, token, paged = 0, "", []
        while pages <= len(recs) + 1:
            q = f"since_step={since}&page_size=1" + (f"&page_token={token}" if token else "")
            s, _, raw = api.request("GET", f"/api/v1/jobs/{job_id}/records?{q}")
            body = json.loads(raw) if s == 200 else {}
            paged += body.get("records", [])
            pages += 1
            token = body.get("nextPageToken", "")
            if not token:
                break
        ck.check([api_view.record(x)["values"] for x in whole] == want and paged == whole and
                 pages == len(want) and
                 [int(x["seq"]) for x in paged] == sorted({int(x["seq"]) for x in paged}),
                 f"c: /records?since_step={since} paged one record at a time ({pages} pages, "
                 f"{len(paged)} records) is the unpaged list ({len(whole)}), metrics.jsonl's "
                 f"{len(want)}, each once")
    for step in sorted(two)[:2]:
        # Drop the stream right after the first of the step's two records, then reconnect.
        first = read_until(api, f"/api/v1/jobs/{job_id}/events?since_step=0",
                           lambda e, st=step: e[0] == "metrics" and e[1]["step"] == st)
        last_id = first[-1][2] if first else None
        # The id is "<record seq>:<anomaly seq>:<log seq>" (docs/api.md); no events here.
        last_seq = last_id.split(":")[0] if last_id else "0"
        rest = EventStream(api, f"/api/v1/jobs/{job_id}/events?since_step=0",
                           headers={"Last-Event-ID": last_id or ""})
        rest.join(60)
        joined = [e[1]["values"] for e in first + rest.events if e[0] == "metrics"]
        ck.check(joined == recs and rest.clean_end and rest.events[-1][0] == "job",
                 f"c: a stream dropped after the first record of step {step} (id {last_id}) "
                 f"and resumed with Last-Event-ID: every record once ({len(joined)} of "
                 f"{len(recs)})")
        by_query = EventStream(api, f"/api/v1/jobs/{job_id}/events?after_seq={last_seq}")
        by_query.join(60)
        tail = [e[1]["values"] for e in by_query.events if e[0] == "metrics"]
        ck.check(tail == recs[int(last_seq):],
                 f"c: ?after_seq={last_seq} streams the records after it ({len(tail)})")
        # The same over gRPC.
        req = stubs()[0].WatchJobRequest(id=job_id, after_seq=int(last_seq))
        watched = [ev.metrics for ev in d.stub().WatchJob(req, metadata=d.metadata, timeout=60)
                   if ev.WhichOneof("event") == "metrics"]
        ck.check([{v.key: v.value for v in m.values} ==
                  {k: v for k, v in r.items() if v is not None}
                  for m, r in zip(watched, recs[int(last_seq):])] ==
                 [True] * (len(recs) - int(last_seq)) and
                 [m.seq for m in watched] == list(range(int(last_seq) + 1, len(recs) + 1)),
                 f"c: WatchJob after_seq={last_seq} gives the records after it, seq "
                 f"{[m.seq for m in watched][:2]}...")
    # A bare number is the id streams sent before seq cursors, a step: the stream goes on at
    # the next step (here an eval step's, whose seq is not its step any more).
    step = min(two)
    old = EventStream(api, f"/api/v1/jobs/{job_id}/events?since_step=0",
                      headers={"Last-Event-ID": str(step)})
    old.join(60)
    vals = [e[1]["values"] for e in old.events if e[0] == "metrics"]
    ck.check(vals == [r for r in recs if r["train/global_step"] > step],
             f"c: an old step id (Last-Event-ID: {step}) resumes at step {step + 1} "
             f"({len(vals)} records)")
    # A two-number id, the one streams sent before log lines had a seq, resumes after that
    # record.
    two_part = EventStream(api, f"/api/v1/jobs/{job_id}/events?since_step=0",
                           headers={"Last-Event-ID": "3:0"})
    two_part.join(60)
    vals = [e[1]["values"] for e in two_part.events if e[0] == "metrics"]
    ck.check(vals == recs[3:], f"c: Last-Event-ID 3:0 resumes after record 3 ({len(vals)} "
             f"records, want {len(recs) - 3})")
    req = stubs()[0].WatchJobRequest(id=job_id, after_seq=-1)
    try:
        list(d.stub().WatchJob(req, metadata=d.metadata, timeout=30))
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    ck.check(code == "INVALID_ARGUMENT", f"c: WatchJob after_seq=-1 is INVALID_ARGUMENT ({code})")


def check_log_cursor(api, d, job_id):
    """A stream with logs cut right after a log line and resumed with its Last-Event-ID (or
    ?after_log_seq=, or WatchJob's after_log_seq) gives every log line exactly once: before
    log lines had a seq in the id, a reconnecting dashboard got the last `tail` lines again."""
    s, lg = api.get(f"/api/v1/jobs/{job_id}/logs?tail=10000")
    every = [l["seq"] for l in lg.get("lines", [])] if s == 200 else []
    ck.check(len(every) >= 6, f"c: the job has log lines to resume in ({len(every)})")
    if len(every) < 6:
        return
    cut = every[len(every) // 2]
    path = f"/api/v1/jobs/{job_id}/events?since_step=0&logs=1&tail=10000"
    first = read_until(api, path, lambda e: e[0] == "log" and e[1]["seq"] == cut)
    last_id = first[-1][2] if first else ""
    rest = EventStream(api, path, headers={"Last-Event-ID": last_id})
    rest.join(60)
    joined = [e[1]["seq"] for e in first + rest.events if e[0] == "log"]
    ck.check(joined == every and rest.clean_end,
             f"c: a stream with logs dropped after log line {cut} (id {last_id}) and resumed "
             f"with Last-Event-ID gives every line once ({len(joined)} of {len(every)}, "
             f"{len(joined) - len(set(joined))} twice)")
    by_query = EventStream(api, path + f"&after_log_seq={cut}")
    by_query.join(60)
    tail = [e[1]["seq"] for e in by_query.events if e[0] == "log"]
    ck.check(tail == [x for x in every if x > cut],
             f"c: ?after_log_seq={cut} streams the lines after it ({len(tail)})")
    # Over gRPC: a first watch's lines are live ones only (none, the job has ended); a resumed
    # one gets the kept lines after its last.
    pb = stubs()[0]
    for after, want in ((0, []), (cut, [x for x in every if x > cut])):
        req = pb.WatchJobRequest(id=job_id, logs=True, after_log_seq=after)
        got = [ev.log.seq for ev in d.stub().WatchJob(req, metadata=d.metadata, timeout=60)
               if ev.WhichOneof("event") == "log"]
        ck.check(got == want, f"c: WatchJob logs after_log_seq={after} gives {len(want)} "
                 f"lines ({len(got)}: {got[:3]}...)")
    try:
        list(d.stub().WatchJob(pb.WatchJobRequest(id=job_id, after_log_seq=-1),
                               metadata=d.metadata, timeout=30))
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    ck.check(code == "INVALID_ARGUMENT", f"c: WatchJob after_log_seq=-1 is INVALID_ARGUMENT "
             f"({code})")


def case_c(api, d):
    job_id = start_job(d, "finite", 400, eval_interval=100, checkpoint_interval=100)
    keys = ["train/loss", "eval/loss", "perf/tokens_per_second"]
    query = f"/api/v1/jobs/{job_id}/metrics?keys={','.join(keys)}"
    # The query asked while the job runs is asked again at the end: a response kept from the
    # run must not be served once more records exist. The first ask comes before the job's
    # worker can have reported a step.
    polled = []

    def poll_query():
        polled.append(len(api.get(query)[1]["series"][0]["steps"]))
    poll_query()
    stream = EventStream(api, f"/api/v1/jobs/{job_id}/events?since_step=0&logs=1")

    def done(j):
        poll_query()
        return j["state"] in TERMINAL
    j = api.wait_job(job_id, done)
    stream.join(60)
    ck.check(j and j["state"] == "SUCCEEDED", f"c: the job succeeds ({j and j['state']})")
    recs = read_metrics(os.path.join(j["run_dir"], "metrics.jsonl"))
    # The keys of a series query, repeated or comma-separated or both, are one list: the same
    # series (eval/loss as metrics.jsonl has it), and the 64-key limit counts them all.
    evals = [r["eval/loss"] for r in recs if "eval/loss" in r]
    for q in ("keys=train/loss&keys=eval/loss", "keys=train/loss,eval/loss",
              "keys=train/loss&keys=eval/loss,train/loss"):
        s, body = api.get(f"/api/v1/jobs/{job_id}/metrics?{q}")
        series = body.get("series", []) if s == 200 else []
        ck.check([x["key"] for x in series] == ["train/loss", "eval/loss"] and evals and
                 series[1]["values"] == evals,
                 f"c: metrics?{q} gives both series ({s}, {[x['key'] for x in series]})")
    s, body = api.get(f"/api/v1/jobs/{job_id}/metrics?" +
                      "&".join(f"keys=k/{i}" for i in range(65)))
    ck.check(s == 400 and body["error"].startswith("keys:") and "64" in body["error"],
             f"c: 65 repeated keys are 400 naming the limit of 64 ({s} {body})")
    ck.check(stream.status == 200 and stream.content_type.startswith("text/event-stream"),
             f"c: the event stream is text/event-stream ({stream.status} {stream.content_type})")
    ev = stream.events
    jobs = [e for e in ev if e[0] == "job"]
    got = [e[1] for e in ev if e[0] == "metrics"]
    ck.check(not stream.is_alive() and stream.clean_end and not stream.error,
             f"c: the stream ends by itself ({stream.error})")
    ck.check(ev and ev[-1][0] == "job" and ev[-1][1]["state"] == "SUCCEEDED" and
             all(e[1]["state"] not in TERMINAL for e in jobs[:-1]),
             f"c: the stream ends right after the terminal job event "
             f"({[e[1]['state'] for e in jobs]})")
    ids = [e[2] for e in ev if e[0] in ("metrics", "log")]
    want_ids, seq, log_seq = [], 0, 0
    for e in ev:
        if e[0] == "metrics":
            seq += 1
        elif e[0] == "log":
            log_seq = e[1]["seq"]
        if e[0] in ("metrics", "log"):
            want_ids.append(f"{seq}:0:{log_seq}")
    ck.check([g["values"] for g in got] == recs and
             all(g["step"] == r["train/global_step"] for g, r in zip(got, recs)) and
             ids == want_ids,
             f"c: the stream's metrics events are metrics.jsonl, in order, and every metrics "
             f"and log event's id is the record seq 1, 2, ..., the job's anomaly seq, 0, and the "
             f"last log line's seq ({len(got)} events, {len(recs)} records, ids {ids[:3]}, "
             f"want {want_ids[:3]})")
    logs = [e[1] for e in ev if e[0] == "log"]
    ck.check(logs and all(set(l) == {"seq", "time_unix_ms", "rank", "stream", "text"} for l in logs)
             and [l["seq"] for l in logs] == sorted({l["seq"] for l in logs}),
             f"c: logs=1 adds log events with increasing seq ({len(logs)})")

    check_record_cursor(api, d, job_id, recs)
    check_log_cursor(api, d, job_id)

    s, _, raw = api.request("GET", f"/api/v1/jobs/{job_id}")
    missing = [k for k in JOB_FIELDS if k not in json.loads(raw)]
    ck.check(s == 200 and not missing, f"c: the job has every field (missing {missing})")
    j = api.job(job_id)
    j.update(api.get(f"/api/v1/jobs/{job_id}/checkpoints")[1])
    train_recs = [r for r in recs if r.get("train/loss") is not None]
    ck.check(j["step"] == 400 and j["max_steps"] == 400 and
             j["loss"] == train_recs[-1]["train/loss"] and
             j["tokens_per_second"] == train_recs[-1]["perf/tokens_per_second"] and
             j["elapsed_ms"] == j["finished_unix_ms"] - j["started_unix_ms"] and
             j["created_unix_ms"] <= j["started_unix_ms"] <= j["finished_unix_ms"],
             f"c: step, loss, tokens/s are the last record's; elapsed = finished - started "
             f"({j['step']} {j['loss']} {j['elapsed_ms']})")
    # The rank's step and system figures beside these are test_rank_metrics.py's.
    status = [{k: r[k] for k in ("rank", "pid", "running", "exit_code", "signal")}
              for r in j["ranks"]]
    ck.check(status == [{"rank": 0, "pid": j["ranks"][0]["pid"], "running": False,
                         "exit_code": 0, "signal": 0}] and j["ranks"][0]["pid"] > 0,
             f"c: ranks ({status})")
    ck.check(j["spec"]["model"]["n_layer"] == 2 and j["spec"]["train"]["max_steps"] == 400 and
             j["name"] == "finite" and j["world_size"] == 1 and j["device"] == "cpu",
             "c: spec is the resolved job spec as an object")
    ck.check(j["comm"] == "shm", f"c: one host's ranks use the shm transport ({j['comm']!r})")
    ckdir = j["checkpoint_dir"]
    with open(os.path.join(ckdir, "latest")) as f:
        latest = f.read().strip()
    want = sorted((int(t[len("global_step"):]), t) for t in os.listdir(ckdir)
                  if os.path.isdir(os.path.join(ckdir, t)) and not t.startswith("."))
    ck.check([(c["step"], c["tag"]) for c in j["checkpoints"]] == want and
             all(c["complete"] == os.path.exists(os.path.join(ckdir, c["tag"], "DONE"))
                 for c in j["checkpoints"]) and j["latest"] == latest and
             any(c["step"] == 400 and c["complete"] for c in j["checkpoints"]),
             f"c: checkpoints list the directory with DONE, and latest ({j['checkpoints']} "
             f"{j['latest']})")

    s, m = api.get(query)
    ok = s == 200 and [x["key"] for x in m["series"]] == keys
    for x in m["series"] if ok else []:
        steps, values = series_of(recs, x["key"])
        ok = ok and x["steps"] == steps and x["values"] == values and len(steps) > 0
    ck.check(ok, f"c: metric series equal metrics.jsonl exactly (train/loss, eval/loss, tokens/s; "
                 f"the same query during the run saw {polled[:3]}...{polled[-2:]} points)")
    steps, values = series_of(recs, "train/loss")
    # Without this the check above could pass with no answer ever cached from the run.
    ck.check(polled and polled == sorted(polled) and polled[0] < len(steps) and
             polled[-1] == len(steps),
             f"c: the query asked during the run grew with the job and reached every point "
             f"({len(polled)} polls, {polled[0] if polled else None} -> "
             f"{polled[-1] if polled else None} of {len(steps)})")
    s, m = api.get(f"/api/v1/jobs/{job_id}/metrics?keys=train/loss&max_points=7")
    x = m["series"][0] if s == 200 else {"steps": [], "values": []}
    ck.check(0 < len(x["steps"]) <= 7 and x["steps"][-1] == steps[-1] and
             x["values"][-1] == values[-1] and x["steps"][0] == steps[0] and
             all(dict(zip(steps, values))[st] == v for st, v in zip(x["steps"], x["values"])),
             f"c: max_points=7 keeps <= 7 points of the series, first and last included "
             f"({x['steps']})")
    s, m = api.get(f"/api/v1/jobs/{job_id}/metrics?keys=train/loss&since_step=350")
    ck.check(s == 200 and m["series"][0]["steps"] == [t for t in steps if t >= 350],
             "c: since_step keeps steps >= since_step")
    s, m = api.get(f"/api/v1/jobs/{job_id}/metrics")
    allkeys = {k for r in recs for k, v in r.items() if v is not None}
    ck.check(s == 200 and {x["key"] for x in m["series"]} == allkeys,
             f"c: without keys, every key of the records ({len(m['series'])} series)")
    s, m = api.get(f"/api/v1/jobs/{job_id}/metrics?keys=no/such,train/loss,no/such")
    ck.check(s == 200 and [(x["key"], len(x["steps"])) for x in m["series"]] ==
             [("no/such", 0), ("train/loss", len(steps))],
             "c: an unknown key is an empty series; duplicates are dropped")
    s, r = api.get(f"/api/v1/jobs/{job_id}/records?since_step=390")
    want = [x for x in recs if x["train/global_step"] >= 390]
    ck.check(s == 200 and [x["values"] for x in r["records"]] == want and
             all(x["step"] == x["values"]["train/global_step"] and x["time_unix_ms"] > 0
                 for x in r["records"]),
             f"c: records since_step=390 are metrics.jsonl's ({len(r['records'])})")
    s, lg = api.get(f"/api/v1/jobs/{job_id}/logs?tail=5")
    lines = lg["lines"] if s == 200 else []
    ck.check(len(lines) == 5 and [l["seq"] for l in lines] == sorted(l["seq"] for l in lines) and
             lines[-1]["rank"] == -1 and lines[-1]["stream"] == "ztraind" and
             any(l["stream"] == "stdout" and l["rank"] == 0 for l in lines),
             f"c: logs?tail=5 are the last 5 lines ({[l['text'][:40] for l in lines]})")
    return job_id, recs


def prom_parse(text):
    """{family: (help, type)}, [(name, {label: value}, float)], or raises on a bad line."""
    families, samples = {}, []
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, kind, name, rest = line.split(" ", 3)
            h, t = families.get(name, (None, None))
            families[name] = (rest, t) if kind == "HELP" else (h, rest)
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)", line)
        if not m:
            raise ValueError(f"bad sample line {line!r}")
        labels = {}
        if m.group(3):
            body = m.group(3)
            pos = 0
            while pos < len(body):
                lm = label_re.match(body, pos)
                if not lm:
                    raise ValueError(f"bad labels in {line!r}")
                labels[lm.group(1)] = re.sub(r'\\(.)', lambda e: "\n" if e.group(1) == "n"
                                             else e.group(1), lm.group(2))
                pos = lm.end() + (1 if lm.end() < len(body) and body[lm.end()] == "," else 0)
        samples.append((m.group(1), labels, float(m.group(4))))
    if not text.endswith("\n"):
        raise ValueError("the last line is not newline-terminated")
    return families, samples


def case_d(api, d, job_id, recs):
    # A name cannot hold a newline (ztraind refuses control characters); a backslash before an
    # "n" is the case a careless unescaper would turn into one.
    odd = 'odd "name" \\ with \\n, not a newline'
    odd_id = start_job(d, odd, 3)
    api.wait_job(odd_id, lambda j: j["state"] in TERMINAL)
    s, h, body = api.request("GET", "/metrics")
    try:
        families, samples = prom_parse(body.decode())
        err = None
    except ValueError as e:
        families, samples, err = {}, [], str(e)
    ck.check(s == 200 and h.get("Content-Type", "").startswith("text/plain; version=0.0.4") and
             not err, f"d: /metrics is Prometheus text 0.0.4 ({s} {err})")
    names = {n for n, _, _ in samples}
    ck.check(names and all(families.get(n, (None, None))[0] and families[n][1] in
                           ("gauge", "counter") for n in names),
             f"d: every family has HELP and TYPE ({sorted(names)})")
    ck.check(all(re.fullmatch(r"ztrain_[a-z_]+", n) for n in names) and
             all(families[n][1] == "counter" for n in names if n.endswith("_total")),
             "d: names follow the conventions (prefix, _total counters)")

    def value(name, jid):
        v = [x for n, lab, x in samples if n == name and lab.get("job_id") == jid]
        return v[0] if len(v) == 1 else None

    last = [r for r in recs if r.get("train/loss") is not None][-1]
    ck.check(value("ztrain_job_loss", job_id) == last["train/loss"] and
             value("ztrain_job_step", job_id) == 400 and
             value("ztrain_job_tokens_per_second", job_id) == last["perf/tokens_per_second"] and
             value("ztrain_job_learning_rate", job_id) == last["train/learning_rate"] and
             value("ztrain_job_grad_norm", job_id) == last["train/grad_norm"] and
             math.isclose(value("ztrain_job_step_time_seconds", job_id) or 0,
                          last["perf/step_time_ms"] / 1e3, rel_tol=1e-12) and
             value("ztrain_job_skipped_steps_total", job_id) == last["train/skipped_steps"] and
             value("ztrain_job_world_size", job_id) == 1,
             f"d: per-job gauges are the last record's values "
             f"(loss {value('ztrain_job_loss', job_id)} vs {last['train/loss']})")
    # Prometheus' naming practice: base units (seconds, bytes, FLOP/s; a ratio, not a percent)
    # named by their suffix, never milli-, mega- or tera- ones.
    scaled = re.compile(r"(^|_)(ms|us|ns|milliseconds|microseconds|minutes|hours|kb|mb|gb|kib|mib|"
                        r"gib|kilobytes|megabytes|gigabytes|percent|pct|kflops|mflops|gflops|"
                        r"tflops)(_|$)")
    ck.check(not [n for n in names if scaled.search(n)],
             f"d: no family is in scaled units ({sorted(n for n in names if scaled.search(n))})")
    flops = value("ztrain_job_flops_per_second", job_id)
    ck.check(flops is not None and math.isclose(flops, last["perf/tflops"] * 1e12, rel_tol=1e-12),
             f"d: ztrain_job_flops_per_second is perf/tflops in FLOP/s ({flops} vs "
             f"{last['perf/tflops']} TFLOPS)")
    st = [lab for n, lab, x in samples if n == "ztrain_job_state" and lab["job_id"] == job_id]
    ck.check(len(st) == 1 and st[0]["state"] == "SUCCEEDED" and st[0]["job_name"] == "finite",
             f"d: ztrain_job_state has one series per job, for its current state ({st})")
    counts = {lab["state"]: x for n, lab, x in samples if n == "ztrain_jobs"}
    ck.check(set(counts) == {"QUEUED", "STARTING", "RUNNING", "STOPPING", "SUCCEEDED", "FAILED",
                             "CANCELLED"} and counts["SUCCEEDED"] >= 1 and
             ("ztrain_up", {}, 1.0) in samples,
             f"d: ztrain_jobs counts every state; ztrain_up 1 ({counts})")
    odd_lab = [lab for n, lab, x in samples if n == "ztrain_job_state" and lab["job_id"] == odd_id]
    ck.check(len(odd_lab) == 1 and odd_lab[0]["job_name"] == odd,
             f"d: label values escape backslash and quote ({odd_lab})")
    s, lst = api.get("/api/v1/jobs?page_size=1")
    s2, nxt = (api.get(f"/api/v1/jobs?page_size=1&page_token={lst['next_page_token']}")
               if s == 200 else (0, {}))
    s3, only = api.get("/api/v1/jobs?state=SUCCEEDED&page_size=1000")
    ck.check(s == 200 and lst["jobs"][0]["id"] == odd_id and lst["next_page_token"] not in ("", odd_id) and
             s2 == 200 and nxt["jobs"][0]["id"] == job_id and
             all(j["state"] == "SUCCEEDED" for j in only["jobs"]) and
             only["next_page_token"] == "" and job_id in [j["id"] for j in only["jobs"]],
             "d: the list is newest first, pages with page_size/page_token/next_page_token and "
             "filters by state")


def case_e(api, d):
    job_id = start_job(d, "long", 10_000_000, log_interval=20)
    j = api.wait_job(job_id, lambda j: j["state"] == "RUNNING" and j["step"] >= 40, timeout=60)
    ck.check(j and j["state"] == "RUNNING" and j["elapsed_ms"] > 0 and not j["finished_unix_ms"]
             and j["ranks"][0]["running"],
             f"e: a running job has a run duration and no end time ({j and j['elapsed_ms']})")
    s, hz = api.get("/healthz", auth=False)
    ck.check(s == 200 and hz["running"] >= 1, f"e: /healthz counts it running ({hz})")
    step = j["step"] if j else 0
    bare = Http(api.port, None)
    s, _ = bare.get(f"/api/v1/jobs/{job_id}/events?access_token=wrong")
    ck.check(s == 401, f"e: a wrong access_token is 401 ({s})")
    s, _ = bare.get(f"/api/v1/jobs/{job_id}/events?access_token={TOKEN}%00junk")
    ck.check(s == 401, f"e: the token followed by a NUL byte and more is 401, not the token ({s})")
    stream = EventStream(bare, f"/api/v1/jobs/{job_id}/events?since_step={step}"
                               f"&access_token={TOKEN}", auth=False)
    time.sleep(0.5)
    s, h, body = api.request("POST", f"/api/v1/jobs/{job_id}/cancel",
                             body=json.dumps({"force": False, "grace_seconds": 120}),
                             headers={"Content-Type": "application/json"})
    c = json.loads(body) if s == 200 else {}
    ck.check(s == 200 and cors_ok(h) and c.get("id") == job_id and
             c.get("state") in ("JOB_STATE_STOPPING", "JOB_STATE_CANCELLED"),
             f"e: POST cancel answers the job after the request ({s} {c.get('state')})")
    # The grace is generous: on a loaded machine the last step and the checkpoint can take many
    # seconds, and a grace that ran out would kill the ranks before the checkpoint is complete.
    j = api.wait_job(job_id, lambda j: j["state"] in TERMINAL, timeout=150)
    if j:
        j.update(api.get(f"/api/v1/jobs/{job_id}/checkpoints")[1])
    stream.join(30)
    ev = stream.events
    met = [e[1]["step"] for e in ev if e[0] == "metrics"]
    ck.check(stream.status == 200 and not stream.is_alive() and ev and ev[0][0] == "job" and
             ev[-1][0] == "job" and ev[-1][1]["state"] == "CANCELLED" and
             "STOPPING" in [e[1]["state"] for e in ev if e[0] == "job"] and
             met and met[0] >= step and met == sorted(met),
             f"e: the stream (token in the query) starts with the job, follows from since_step "
             f"and ends with CANCELLED ({[e[1].get('state') for e in ev if e[0] == 'job']}, "
             f"{len(met)} records, {stream.error})")
    ck.check(j and j["state"] == "CANCELLED" and j["latest"] and
             any(c["tag"] == j["latest"] and c["complete"] for c in j["checkpoints"]),
             f"e: the cancelled job left a complete checkpoint ({j and j['checkpoints']})")


def case_f(api, d):
    job_id = start_job(d, "at-shutdown", 10_000_000, log_interval=50)
    api.wait_job(job_id, lambda j: j["state"] == "RUNNING", timeout=60)
    stream = EventStream(api, f"/api/v1/jobs/{job_id}/events")
    time.sleep(0.5)
    t0 = time.monotonic()
    rc = d.stop(timeout=60)
    stream.join(10)
    ck.check(rc == 0 and not stream.is_alive(),
             f"f: SIGTERM with a live stream: the stream ends and ztraind exits 0 in "
             f"{time.monotonic() - t0:.1f} s (exit {rc}: {d.log().strip().splitlines()[-1]})")


def main():
    d = Daemon(BUILD, os.path.join(top, "main"), token=TOKEN, grace=20, start=False)
    try:
        d.start()
        api = Http(d.http_port, TOKEN)
        case_a(d)
        case_b(api, d)
        job_id, recs = case_c(api, d)
        case_d(api, d, job_id, recs)
        case_e(api, d)
        case_f(api, d)
    finally:
        d.stop(30)
    errors = d.sanitizer_errors()
    ck.check(not errors, f"ztraind's log has no sanitizer report ({errors})")
    ck.done()


if __name__ == "__main__":
    main()
