"""Token roles (issue 34): a token file with a scope per token, over gRPC (Python grpcio) and HTTP
(urllib), against a real ztraind.

  a. read: Health, ListJobs, GetJob, WatchJob, GetMetrics; GET /api/v1/jobs, /metrics (the
     Prometheus scrape), /events with ?access_token=. SubmitJob and CancelJob are
     PERMISSION_DENIED naming the token's scope and the one needed; POST .../cancel is 403.
  b. submit: SubmitJob is taken, and the job records its submitter: "sha256:" and the first 16
     hex digits of the token's SHA-256 (computed here with hashlib) and the scope, over gRPC and
     HTTP, also after ztraind restarts. A submit token cancels its own jobs (CancelJob, POST
     .../cancel) but not another submit token's nor an admin's: PERMISSION_DENIED / 403 saying
     it may cancel only the jobs it submitted; read's CancelJob is PERMISSION_DENIED naming
     submit as the scope needed.
  c. admin: CancelJob and POST .../cancel work on any job.
  f. A state file from before jobs recorded their submitter (the columns dropped here) is
     upgraded: its jobs have none, and only an admin cancels them.
  d. no token or an unknown one: UNAUTHENTICATED / 401; a token alone on its line is admin (the
     one-token file of before); '#' lines are comments.
  e. A token file with an unknown scope, or a line with more than a token and a scope, stops
     ztraind with status 1 and a message naming the file and line.
  h. Every operation, each with a read, a submit and an admin token, over gRPC and HTTP: allowed
     exactly when the token's scope reaches the one security.md's table gives the operation
     (read for every query: ListCheckpoints, GetEffectiveConfig, ListAnomalies,
     ListWebhookDeliveries, health Check and Watch, reflection and openapi.json included;
     submit for SubmitJob and CancelJob), PERMISSION_DENIED / 403 otherwise.
  g. ZTRAIN_TOKEN or ZTRAIN_TOKEN_FILE set but empty, or ZTRAIN_TOKEN blank, stops ztraind with
     status 1 naming the variable (an empty variable is not "no authentication")."""
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, spec_proto, stubs, temp_dir, tiny_job,  # noqa: E402
                 wait_state, wait_step)

import grpc  # noqa: E402

pb, rpc, hpb, hrpc = stubs()
ck = Checker()
READ, SUBMIT, ADMIN, OLD = "r" * 24 + "1", "s" * 24 + "2", "a" * 24 + "3", "o" * 24 + "4"
SUBMIT2 = "t" * 24 + "5"


def identity(token):
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:16]


def md(token):
    return [("authorization", f"Bearer {token}")] if token else []


def grpc_code(fn):
    try:
        fn()
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details()


def http(d, method, path, token=None):
    req = urllib.request.Request(d.http_url + path, method=method,
                                 data=b"{}" if method == "POST" else None,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    if method == "POST":
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(2000).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


# Every operation of the API, as gRPC calls it and as HTTP does, with the scope security.md's
# table gives it: (name, scope needed, gRPC call or None, HTTP (method, path) or None).
SCOPE_RANK = {"read": 1, "submit": 2, "admin": 3}
TOKEN_SCOPE = {READ: "read", SUBMIT: "submit", ADMIN: "admin"}
MISSING = "job-999999"


def operations(stub, health, channel, job_id):
    def reflect(token):
        call = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        # ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
        return list(call(iter([b"\x3a\x00"]), metadata=md(token), timeout=10))

    def health_watch(token):
        it = health.Watch(hpb.HealthCheckRequest(), metadata=md(token), timeout=10)
        first = next(it)
        it.cancel()
        return first

    return [
        ("SubmitJob", "submit",
         lambda t: stub.SubmitJob(pb.SubmitJobRequest(), metadata=md(t), timeout=10),
         ("POST", "/api/v1/jobs")),
        ("CancelJob", "submit",
         lambda t: stub.CancelJob(pb.CancelJobRequest(id=MISSING), metadata=md(t), timeout=10),
         ("POST", f"/api/v1/jobs/{MISSING}/cancel")),
        ("GetJob", "read",
         lambda t: stub.GetJob(pb.GetJobRequest(id=job_id), metadata=md(t), timeout=10),
         ("GET", f"/api/v1/jobs/{job_id}")),
        ("ListJobs", "read",
         lambda t: stub.ListJobs(pb.ListJobsRequest(), metadata=md(t), timeout=10),
         ("GET", "/api/v1/jobs")),
        ("WatchJob", "read",
         lambda t: list(stub.WatchJob(pb.WatchJobRequest(id=job_id), metadata=md(t), timeout=10)),
         ("GET", f"/api/v1/jobs/{job_id}/events")),
        ("GetMetrics", "read",
         lambda t: stub.GetMetrics(pb.GetMetricsRequest(id=job_id), metadata=md(t), timeout=10),
         ("GET", f"/api/v1/jobs/{job_id}/metrics")),
        ("StreamLogs", "read",
         lambda t: list(stub.StreamLogs(pb.StreamLogsRequest(id=job_id, tail=5), metadata=md(t),
                                        timeout=10)),
         ("GET", f"/api/v1/jobs/{job_id}/logs")),
        ("ListCheckpoints", "read",
         lambda t: stub.ListCheckpoints(pb.ListCheckpointsRequest(id=job_id), metadata=md(t),
                                        timeout=10),
         ("GET", f"/api/v1/jobs/{job_id}/checkpoints")),
        ("GetEffectiveConfig", "read",
         lambda t: stub.GetEffectiveConfig(pb.GetEffectiveConfigRequest(id=job_id),
                                           metadata=md(t), timeout=10),
         ("GET", f"/api/v1/jobs/{job_id}/config")),
        ("ListAnomalies", "read",
         lambda t: stub.ListAnomalies(pb.ListAnomaliesRequest(id=job_id), metadata=md(t),
                                      timeout=10),
         ("GET", f"/api/v1/jobs/{job_id}/anomalies")),
        ("ListWebhookDeliveries", "read",
         lambda t: stub.ListWebhookDeliveries(pb.ListWebhookDeliveriesRequest(id=job_id),
                                              metadata=md(t), timeout=10),
         ("GET", f"/api/v1/jobs/{job_id}/webhooks")),
        ("the API's description (reflection, openapi.json)", "read", reflect,
         ("GET", "/api/v1/openapi.json")),
        ("Health.Check", "read",
         lambda t: health.Check(hpb.HealthCheckRequest(), metadata=md(t), timeout=10), None),
        ("Health.Watch", "read", health_watch, None),
        ("/records", "read", None, ("GET", f"/api/v1/jobs/{job_id}/records")),
        ("metrics.csv", "read", None, ("GET", f"/api/v1/jobs/{job_id}/metrics.csv")),
        ("metrics.jsonl", "read", None, ("GET", f"/api/v1/jobs/{job_id}/metrics.jsonl")),
        ("tensorboard.tar", "read", None, ("GET", f"/api/v1/jobs/{job_id}/tensorboard.tar")),
        ("Prometheus /metrics", "read", None, ("GET", "/metrics")),
    ]


def walk_operations(d, stub, health, job_id):
    """Each operation with each token: allowed exactly when the token's scope reaches the one
    the operation needs, over gRPC (not PERMISSION_DENIED) and HTTP (not 403) alike."""
    for name, need, call, route in operations(stub, health, d.channel(), job_id):
        for token, scope in TOKEN_SCOPE.items():
            want = SCOPE_RANK[scope] >= SCOPE_RANK[need]
            got = {}
            if call:
                code, text = grpc_code(lambda: call(token))
                got["gRPC"] = (code != "PERMISSION_DENIED", f"{code} {text[:80]}")
            if route:
                status, body = http(d, route[0], route[1], token)
                got["HTTP"] = (status != 403, f"{status} {' '.join(body.split())[:80]}")
            ck.check(all(allowed == want for allowed, _ in got.values()),
                     f"h: {name} with a {scope} token is {'allowed' if want else 'refused'} "
                     f"(needs {need}): " + "; ".join(f"{k} {v}" for k, (_, v) in got.items()))


tmp = temp_dir("ztrain-roles-")
token_file = os.path.join(tmp, "tokens")
with open(token_file, "w") as f:
    f.write(f"# dashboards and Prometheus\n{READ} read\n\n{SUBMIT} submit\n{ADMIN}   admin\n{OLD}\n"
            f"{SUBMIT2} submit\n")
os.chmod(token_file, 0o600)

with Daemon(BUILD, tmp, max_ranks=1, extra_args=["--token-file", token_file]) as d:
    d.token = READ  # what svc.py's helpers send
    stub, health = d.stub(), d.health()
    job = tiny_job(d.data_root, max_steps=LONG, log_interval=5)
    submit_req = pb.SubmitJobRequest(spec=spec_proto(job))

    code, text = grpc_code(lambda: stub.SubmitJob(submit_req, metadata=md(READ), timeout=30))
    ck.check(code == "PERMISSION_DENIED" and "scope is read" in text and "needs submit" in text,
             f"a: read cannot SubmitJob: {code} {text}")
    j = stub.SubmitJob(submit_req, metadata=md(SUBMIT), timeout=30)
    ck.check(bool(j.id), "b: submit submits a job")
    # Queued behind j (max_ranks 1): another submit token's job and an admin's.
    k = stub.SubmitJob(submit_req, metadata=md(SUBMIT2), timeout=30)
    m = stub.SubmitJob(submit_req, metadata=md(ADMIN), timeout=30)
    wait_step(d, j.id, 1, timeout=120)
    reads = {
        "Health": lambda: health.Check(hpb.HealthCheckRequest(), metadata=md(READ), timeout=10),
        "ListJobs": lambda: stub.ListJobs(pb.ListJobsRequest(), metadata=md(READ), timeout=10),
        "GetJob": lambda: stub.GetJob(pb.GetJobRequest(id=j.id), metadata=md(READ), timeout=10),
        "GetMetrics": lambda: stub.GetMetrics(pb.GetMetricsRequest(id=j.id), metadata=md(READ),
                                              timeout=10),
        "WatchJob": lambda: next(iter(stub.WatchJob(pb.WatchJobRequest(id=j.id),
                                                    metadata=md(READ), timeout=10))),
    }
    for name, fn in reads.items():
        code, text = grpc_code(fn)
        ck.check(code == "OK", f"a: read may call {name} ({code} {text})")
    for path in ("/api/v1/jobs", "/metrics", f"/api/v1/jobs/{j.id}/records"):
        status, body = http(d, "GET", path, READ)
        ck.check(status == 200, f"a: read may GET {path} ({status})")
    req = urllib.request.Request(f"{d.http_url}/api/v1/jobs/{j.id}/events?access_token={READ}")
    with urllib.request.urlopen(req, timeout=30) as r:
        ck.check(r.status == 200 and b"event: job" in r.read(200),
                 "a: read opens the event stream with ?access_token=")

    def submitter(job_id):
        g = stub.GetJob(pb.GetJobRequest(id=job_id), metadata=md(READ), timeout=10)
        req = urllib.request.Request(f"{d.http_url}/api/v1/jobs/{job_id}",
                                     headers={"Authorization": f"Bearer {READ}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            h = json.load(r)
        # HTTP: the proto3 JSON mapping (lowerCamelCase, "" left out).
        return (g.submitter, g.submitter_scope), (h.get("submitter", ""),
                                                   h.get("submitterScope", ""))

    for job, token, scope in ((j, SUBMIT, "submit"), (k, SUBMIT2, "submit"), (m, ADMIN, "admin")):
        want = (identity(token), scope)
        got = submitter(job.id)
        ck.check(got == (want, want), f"b: {job.id} records its submitter {want} (gRPC, HTTP: {got})")

    code, text = grpc_code(lambda: stub.CancelJob(pb.CancelJobRequest(id=j.id), metadata=md(READ),
                                                  timeout=10))
    ck.check(code == "PERMISSION_DENIED" and "scope is read" in text and "needs submit" in text,
             f"b: read cannot CancelJob: {code} {text}")
    status, body = http(d, "POST", f"/api/v1/jobs/{j.id}/cancel", READ)
    ck.check(status == 403 and "scope is read" in body, f"b: read: POST .../cancel is 403: {status}")
    for other, whose in ((k, "another submit token's"), (m, "an admin's")):
        code, text = grpc_code(lambda: stub.CancelJob(pb.CancelJobRequest(id=other.id),
                                                      metadata=md(SUBMIT), timeout=10))
        ck.check(code == "PERMISSION_DENIED" and "only the jobs it submitted" in text and
                 other.id in text, f"b: submit cannot CancelJob {whose} job: {code} {text}")
        status, body = http(d, "POST", f"/api/v1/jobs/{other.id}/cancel", SUBMIT)
        ck.check(status == 403 and "only the jobs it submitted" in body,
                 f"b: submit: POST .../cancel of {whose} job is 403: {status} {body[:160]}")
    code, text = grpc_code(lambda: stub.CancelJob(pb.CancelJobRequest(id=j.id), metadata=md(SUBMIT),
                                                  timeout=10))
    ck.check(code == "OK", f"b: submit may CancelJob its own job ({code} {text})")

    for token, what in ((None, "no token"), ("nope-" + "x" * 20, "an unknown token")):
        code, text = grpc_code(lambda: stub.ListJobs(pb.ListJobsRequest(), metadata=md(token),
                                                     timeout=10))
        status, _ = http(d, "GET", "/api/v1/jobs", token)
        ck.check(code == "UNAUTHENTICATED" and status == 401, f"d: {what}: {code}, HTTP {status}")

    # The submitter is part of the job's record: a restarted daemon still knows it (k and m
    # stayed queued), and the submit token still cancels its own job.
    d.restart()
    stub = d.stub()
    got = submitter(k.id)
    ck.check(got == ((identity(SUBMIT2), "submit"),) * 2,
             f"b: after a restart {k.id} still records its submitter ({got})")
    status, body = http(d, "POST", f"/api/v1/jobs/{k.id}/cancel", SUBMIT2)
    state = stub.GetJob(pb.GetJobRequest(id=k.id), metadata=md(READ), timeout=10).state
    ck.check(status == 200 and state == pb.JOB_STATE_CANCELLED,
             f"b: submit: POST .../cancel of its own queued job after a restart: {status}, "
             f"{pb.JobState.Name(state)}")
    status, body = http(d, "POST", f"/api/v1/jobs/{m.id}/cancel", OLD)
    ck.check(status == 200, f"c/d: a token alone on its line is admin: POST cancel {status}")
    code, text = grpc_code(lambda: stub.CancelJob(pb.CancelJobRequest(id=j.id), metadata=md(ADMIN),
                                                  timeout=10))
    ck.check(code == "OK", f"c: admin may CancelJob any job ({code} {text})")
    wait_state(d, j.id, {"CANCELLED", "SUCCEEDED", "FAILED"}, timeout=120)
    walk_operations(d, d.stub(), d.health(), j.id)

    # A state file from before jobs recorded their submitter: ztraind adds the columns, empty,
    # and such a job is nobody's: a submit token may not cancel it, an admin may.
    n = stub.SubmitJob(submit_req, metadata=md(SUBMIT), timeout=30)
    d.stop()
    db = sqlite3.connect(os.path.join(d.state_dir, "ztraind.db"))
    db.executescript("ALTER TABLE jobs DROP COLUMN submitter;"
                     "ALTER TABLE jobs DROP COLUMN submitter_scope;")
    db.close()
    d.start()
    stub = d.stub()
    got = submitter(n.id)
    code, text = grpc_code(lambda: stub.CancelJob(pb.CancelJobRequest(id=n.id), metadata=md(SUBMIT),
                                                  timeout=10))
    ck.check(got == (("", ""),) * 2 and code == "PERMISSION_DENIED" and "no recorded token" in text,
             f"f: a job of an older state file has no submitter ({got}) and submit cannot cancel "
             f"it: {code} {text}")
    code, text = grpc_code(lambda: stub.CancelJob(pb.CancelJobRequest(id=n.id), metadata=md(ADMIN),
                                                  timeout=10))
    ck.check(code == "OK", f"f: admin cancels it ({code} {text})")

for content, where in ((f"{READ} read\n{SUBMIT} owner\n", ":2: unknown scope 'owner'"),
                       (f"{READ} read extra\n", ":1: 'extra' after the scope"),
                       (f"{READ} read\n{READ} admin\n", ":2: the same token")):
    bad = os.path.join(tmp, "bad-tokens")
    with open(bad, "w") as f:
        f.write(content)
    p = subprocess.run([os.path.join(BUILD, "ztraind"), "--token-file", bad, "--state-dir",
                        os.path.join(tmp, "s2"), "--grpc-addr", "127.0.0.1:0", "--http-addr",
                        "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    ck.check(p.returncode == 1 and bad + where in p.stderr,
             f"e: {content.splitlines()[-1][-14:]!r}: exit {p.returncode}: {p.stderr.strip()[:160]}")

# g. ZTRAIN_TOKEN or ZTRAIN_TOKEN_FILE set but empty (or blank) is a mistake, not "no
# authentication": ztraind refuses to start, naming the variable.
for var, value in (("ZTRAIN_TOKEN", ""), ("ZTRAIN_TOKEN", " "), ("ZTRAIN_TOKEN_FILE", "")):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZTRAIN_TOKEN")}
    env[var] = value
    try:
        p = subprocess.run([os.path.join(BUILD, "ztraind"), "--state-dir",
                            os.path.join(tmp, "s3"), "--grpc-addr", "127.0.0.1:0",
                            "--http-addr", "127.0.0.1:0"],
                           capture_output=True, text=True, timeout=15, env=env)
        rc, err = p.returncode, p.stderr.strip()
    except subprocess.TimeoutExpired:  # killed by run(): it served without authentication
        rc, err = "none (still serving after 15 s)", ""
    ck.check(rc == 1 and var + " is " in err, f"g: {var}={value!r}: exit {rc}: {err[:160]}")
ck.done()
