"""One API over two transports: submitting over HTTP (POST /api/v1/jobs) as over gRPC, and the
same structured error over both, read the way clients read them: grpcio-status's
rpc_status.from_call with googleapis' error_details messages (PyPI, run in .venv/) for gRPC, and
RFC 9457 problem JSON (application/problem+json) for HTTP.

  a. A job submitted over HTTP (curl's way: POST /api/v1/jobs with {"spec": <job file>}) and one
     over gRPC appear in the same list, both run to SUCCEEDED; an Idempotency-Key repeated over
     the other transport returns the same job, with another spec it is ALREADY_EXISTS (HTTP 409)
     and ResourceInfo names the job.
  b. Invalid specs, the same over both transports: a bad model dimension is INVALID_ARGUMENT
     with BadRequest's field "spec.model.n_embd" (HTTP 400, "field" the same); a DeepSpeed batch
     mismatch names "spec.deepspeed.train_batch_size", an unknown DeepSpeed key its section
     ("spec.deepspeed.zero_optimization.zz_unknown", a 1.5 KB message whose status still fits
     the clients' trailer limit), and a refusal in DeepSpeed's own words its exact key
     ("spec.deepspeed.scheduler.params.warmup_num_steps", "spec.deepspeed.fp16.min_loss_scale",
     "spec.deepspeed.optimizer.type", ...); a non-UTF-8 name is refused naming
     "spec.name" (gRPC) and an unknown key names "spec.model.n_embed" (HTTP, where JSON can
     carry one). A number beyond a double's range (1e400) is refused as not finite naming its
     key: "spec.model.n_embd" (HTTP), "spec.deepspeed.optimizer.params.lr" (both).
  c. A job that does not exist: NOT_FOUND with ResourceInfo {ztrain.v1.Job, jobs/ID} (HTTP 404
     with "resource"), also for an id outside the id pattern ("x y", 70 characters), whose whole
     name both transports give in the message and the resource.
  d. Valid specs this server cannot run: world_size above --max-ranks is FAILED_PRECONDITION
     with PreconditionFailure {type RANKS, subject spec.world_size}; above --max-world-size is
     RESOURCE_EXHAUSTED with QuotaFailure on spec.world_size; a full server (--max-jobs) is
     RESOURCE_EXHAUSTED with QuotaFailure on "jobs". HTTP gives each the same code and field.
  e. Request fields: ListJobs page_size -1 and GetJob without an id name "page_size" and "id";
     over HTTP a bad page_size names it too, and a body that is not a SubmitJobRequest is 400.
     A cancel's grace_seconds above a day (86400) is INVALID_ARGUMENT naming it over both; a
     day itself is taken.
  f. Sizes: a 200 KB spec over HTTP is judged like any other; a 2 MB one is RESOURCE_EXHAUSTED
     with QuotaFailure on "spec" over both (the manager's limit, not a transport's).
  g. JSON bodies as Python's json reads them (a document is one value; the strings a C string
     cannot carry are refused): U+0000 in a spec's string or the idempotency key is 400 naming
     the field (as gRPC's "spec.name: a NUL byte"), and no job is made; text after the value
     (submit and cancel) is 400 naming the byte where it starts.
  h. The Bearer scheme in any case (RFC 9110 11.1, RFC 6750 2.1): "bearer" and "BEARER" are
     accepted over HTTP and gRPC; a wrong token is still 401 / UNAUTHENTICATED.
  i. The same validation over both transports: page_size 0 is the default page and one above
     the maximum is the maximum (AIP-158), over HTTP as over gRPC; a negative since_step is
     INVALID_ARGUMENT naming it over both (GetMetrics, WatchJob; HTTP /metrics); empty metric
     keys are skipped over both (GetMetrics keys [""] is every key, as HTTP's ?keys=).
  j. Page tokens belong to their list and filter (AIP-158): a job id the server never handed
     out as a token, a token of the unfiltered job list used with a state filter, and a bare
     number on a job's anomalies are INVALID_ARGUMENT naming page_token over both transports;
     a token pages on over the other transport when the filter is the same.
  k. Page tokens are signed (page_token.h): the state directory's key is 32 bytes, mode 0600;
     /records paged one record at a time gives the unpaged list; a token's tag is the
     HMAC-SHA256 computed here (Python's hmac) with that key over the list, the job and the
     filter, and a token made here that way is read. Refused, naming page_token: a token with
     one character changed (first, middle, last), cut short, a bare number (the old /records
     token), signed with another key or another state directory's, of another list, of another
     job's records or anomalies, with another since_step, over HTTP and gRPC. A records token
     still pages on after the daemon restarts on the same state directory.
  l. Refusals of the caller carry google.rpc.ErrorInfo (reason, domain "ztrain", metadata) over
     gRPC and the same "reason", "domain" and "metadata" in HTTP's problem: no token
     (CREDENTIALS_MISSING), a wrong one (TOKEN_INVALID), a scope too small
     (ACCESS_TOKEN_SCOPE_INSUFFICIENT, scope and requiredScope), a submit token cancelling
     another's job (NOT_JOB_SUBMITTER, job and requiredScope); over HTTP a foreign Host (421,
     HOST_NOT_ALLOWED) and a foreign Origin (403, ORIGIN_NOT_ALLOWED)."""
import base64
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, spec_proto, state_name, stubs, submit,  # noqa: E402
                 temp_dir, tiny_job, wait_state)

import grpc  # noqa: E402
from google.rpc import error_details_pb2  # noqa: E402
from grpc_status import rpc_status  # noqa: E402

pb = stubs()[0]
ck = Checker()
TOKEN = "errors-token"


def unb64(token):
    try:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except ValueError:
        return b""


def page_key(d):
    with open(os.path.join(d.state_dir, "page_token.key"), "rb") as f:
        return f.read()


def tag(key, kind, job, filt, cursor):
    """A page token's tag as page_token.h defines it: HMAC-SHA256 of version 2, the list, and
    the job, filter and cursor each after its length (2 bytes, big-endian)."""
    msg = bytes([2, kind])
    for field in (job, filt, cursor):
        b = field.encode()
        msg += len(b).to_bytes(2, "big") + b
    return hmac.new(key, msg, hashlib.sha256).digest()


def make_token(key, kind, job, filt, cursor):
    raw = bytes([2, kind]) + cursor.encode() + tag(key, kind, job, filt, cursor)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def flip(token, at):
    """The token with the character at `at` replaced by another of the alphabet."""
    c = token[at]
    return token[:at] + ("B" if c == "A" else "A") + token[at + 1:]


def http(d, method, path, body=None, headers=None):
    """(status, content type, parsed JSON body) of a request with the daemon's token."""
    h = {"Authorization": f"Bearer {TOKEN}"}
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    req = urllib.request.Request(d.http_url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), json.loads(e.read() or b"null")


def grpc_error(call):
    """(code, google.rpc.Status or None) of a call expected to fail."""
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), rpc_status.from_call(e)
    return grpc.StatusCode.OK, None


def detail(status, cls):
    """The first detail of type cls in a google.rpc.Status, or None."""
    for any_ in (status.details if status else []):
        if any_.Is(cls.DESCRIPTOR):
            m = cls()
            any_.Unpack(m)
            return m
    return None


def grpc_submit(d, job, key=""):
    return lambda: d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job), idempotency_key=key),
                                      metadata=d.metadata, timeout=30)


def expect_bad_field(what, d, job, field, http_only=False, grpc_only=False):
    if not http_only:
        code, st = grpc_error(grpc_submit(d, job))
        br = detail(st, error_details_pb2.BadRequest)
        fields = [v.field for v in br.field_violations] if br else []
        ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and st and st.code == code.value[0] and
                 fields == [field], f"b: gRPC {what}: {code.name} BadRequest {fields}: "
                 f"{st.message[:160] if st else ''}")
    if not grpc_only:
        s, ctype, p = http(d, "POST", "/api/v1/jobs", {"spec": job})
        ck.check(s == 400 and ctype == "application/problem+json" and
                 p.get("code") == "INVALID_ARGUMENT" and p.get("field") == field and
                 p.get("status") == 400 and p.get("violations", [{}])[0].get("field") == field,
                 f"b: HTTP {what}: {s} {ctype} {p.get('code')} field {p.get('field')!r}")


def case_a(d):
    via_http = tiny_job(d.data_root, name="via-http", max_steps=3)
    s, ctype, j1 = http(d, "POST", "/api/v1/jobs", {"spec": via_http, "idempotency_key": "k-1"})
    ck.check(s == 200 and ctype == "application/json" and j1.get("id"),
             f"a: POST /api/v1/jobs: {s} {j1.get('id') if isinstance(j1, dict) else j1}")
    j2 = submit(d, tiny_job(d.data_root, name="via-grpc", max_steps=3))
    listed = [j.id for j in d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata,
                                              timeout=30).jobs]
    s, _, page = http(d, "GET", "/api/v1/jobs")
    http_listed = [j["id"] for j in page.get("jobs", [])]
    ck.check({j1.get("id"), j2.id} <= set(listed) and {j1.get("id"), j2.id} <= set(http_listed),
             f"a: both jobs in both lists (gRPC {listed}, HTTP {http_listed})")
    for jid in (j1.get("id"), j2.id):
        st = state_name(wait_state(d, jid, {"SUCCEEDED", "FAILED", "CANCELLED"}).state)
        ck.check(st == "SUCCEEDED", f"a: {jid} ran: {st}")
    # The key works across transports: the same spec over gRPC is the same job.
    again = submit(d, via_http, key="k-1")
    ck.check(again.id == j1.get("id"), f"a: the HTTP job's key over gRPC returns it ({again.id})")
    s, _, j3 = http(d, "POST", "/api/v1/jobs", {"spec": via_http},
                    headers={"Idempotency-Key": "k-1"})
    ck.check(s == 200 and j3.get("id") == j1.get("id"),
             f"a: the Idempotency-Key header returns the same job ({s} {j3.get('id')})")
    other = dict(via_http, name="other-spec")
    code, st = grpc_error(grpc_submit(d, other, key="k-1"))
    ri = detail(st, error_details_pb2.ResourceInfo)
    ck.check(code == grpc.StatusCode.ALREADY_EXISTS and ri and
             ri.resource_name == f"jobs/{j1.get('id')}" and ri.resource_type == "ztrain.v1.Job",
             f"a: gRPC: the key with another spec: {code.name} {ri.resource_name if ri else None}")
    s, _, p = http(d, "POST", "/api/v1/jobs", {"spec": other, "idempotency_key": "k-1"})
    ck.check(s == 409 and p.get("code") == "ALREADY_EXISTS" and
             p.get("resource", {}).get("name") == f"jobs/{j1.get('id')}",
             f"a: HTTP: the key with another spec: {s} {p.get('code')} {p.get('resource')}")


def case_b(d):
    job = tiny_job(d.data_root)
    job["model"].update(n_embd=30, n_head=4)
    expect_bad_field("n_embd not divisible by n_head", d, job, "spec.model.n_embd")
    job = tiny_job(d.data_root, deepspeed={"train_batch_size": 3,
                                           "train_micro_batch_size_per_gpu": 2})
    expect_bad_field("a DeepSpeed batch mismatch", d, job, "spec.deepspeed.train_batch_size")
    job = tiny_job(d.data_root)
    job["data"]["train"] = "../../etc/passwd"
    expect_bad_field("a data path outside the root", d, job, "spec.data.train")
    job = tiny_job(d.data_root)
    job["model"]["n_embed"] = 32
    expect_bad_field("an unknown key", d, job, "spec.model.n_embed", http_only=True)
    # DeepSpeed's parser lists every allowed key: a message of about 1.5 KB, whose status must
    # still fit the clients' trailer limit.
    job = tiny_job(d.data_root)
    job["deepspeed"]["zero_optimization"] = {"stage": 1, "zz_unknown": 1}
    expect_bad_field("an unknown DeepSpeed key (a long message)", d, job,
                     "spec.deepspeed.zero_optimization.zz_unknown")
    job = tiny_job(d.data_root)
    job["deepspeed"]["optimizer"]["params"]["zz"] = 2
    expect_bad_field("an unknown optimizer parameter", d, job,
                     "spec.deepspeed.optimizer.params.zz")
    # Refusals whose text is DeepSpeed's own (no "key '...'" in it) name the exact key too: the
    # parser records it with the failure, the API passes it on.
    for what, section, field in (
            ("warmup_num_steps 0", {"scheduler": {"type": "WarmupLR",
                                                  "params": {"warmup_num_steps": 0}}},
             "scheduler.params.warmup_num_steps"),
            # A whole number written as a float stays one on the way to the parser (DeepSpeed's
            # isinstance(v, int) refuses 3.0).
            ("warmup_num_steps 3.0", {"scheduler": {"type": "WarmupLR",
                                                    "params": {"warmup_num_steps": 3.0}}},
             "scheduler.params.warmup_num_steps"),
            ("fp16.min_loss_scale 0", {"fp16": {"enabled": True, "min_loss_scale": 0}},
             "fp16.min_loss_scale"),
            # Refused at ZeRO stages 1-3 only: at stage 0 DeepSpeed does not read it.
            ("fp16.hysteresis 0", {"zero_optimization": {"stage": 1},
                                   "fp16": {"enabled": True, "hysteresis": 0}}, "fp16.hysteresis"),
            ("fp16.loss_scale_window 0", {"fp16": {"enabled": True, "loss_scale_window": 0}},
             "fp16.loss_scale_window"),
            ("betas out of range", {"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.5]}}},
             "optimizer.params.betas"),
            ("a negative lr", {"optimizer": {"type": "AdamW", "params": {"lr": -1}}},
             "optimizer.params.lr"),
            ("an unknown optimizer type", {"optimizer": {"type": "Adamm", "params": {}}},
             "optimizer.type")):
        job = tiny_job(d.data_root)
        job["deepspeed"].update(section)
        expect_bad_field(what, d, job, "spec.deepspeed." + field)

    # A number beyond a double's range (Python's json reads 1e400 as inf) is refused by its
    # key as not finite, never read as absent ("is required"): in the model over HTTP, in the
    # DeepSpeed config over both transports.
    job = tiny_job(d.data_root)
    text = json.dumps({"spec": job}).replace('"n_embd": 32', '"n_embd": 1e400', 1)
    assert "1e400" in text and json.loads(text)["spec"]["model"]["n_embd"] == float("inf")
    s, _, p = http(d, "POST", "/api/v1/jobs", text.encode())
    ck.check(s == 400 and p.get("field") == "spec.model.n_embd" and
             "finite" in p.get("detail", ""),
             f"b: HTTP n_embd 1e400: {s} field {p.get('field')!r} {p.get('detail', '')[:120]!r}")
    lr = "spec.deepspeed.optimizer.params.lr"
    ds = json.dumps(job["deepspeed"]).replace(json.dumps(job["deepspeed"]["optimizer"]["params"]
                                                         ["lr"]), "1e400", 1)
    assert json.loads(ds)["optimizer"]["params"]["lr"] == float("inf")
    text = json.dumps({"spec": dict(job, deepspeed="@DS@")}).replace('"@DS@"', ds)
    s, _, p = http(d, "POST", "/api/v1/jobs", text.encode())
    ck.check(s == 400 and p.get("field") == lr and "finite" in p.get("detail", ""),
             f"b: HTTP lr 1e400: {s} field {p.get('field')!r} {p.get('detail', '')[:120]!r}")
    req = pb.SubmitJobRequest(spec=spec_proto(job))
    req.spec.deepspeed_json = ds
    code, st = grpc_error(lambda: d.stub().SubmitJob(req, metadata=d.metadata, timeout=30))
    br = detail(st, error_details_pb2.BadRequest)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
             br.field_violations[0].field == lr and "finite" in st.message,
             f"b: gRPC lr 1e400: {code.name} {st.message[:120] if st else ''}")

    raw = pb.SubmitJobRequest(spec=spec_proto(tiny_job(d.data_root))).SerializeToString()
    bad = raw.replace(b"tiny", b"t\xffny", 1)
    call = d.channel().unary_unary("/ztrain.v1.Trainer/SubmitJob")
    code, st = grpc_error(lambda: call(bad, metadata=d.metadata, timeout=30))
    br = detail(st, error_details_pb2.BadRequest)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
             br.field_violations[0].field == "spec.name",
             f"b: gRPC a name that is not UTF-8: {code.name} "
             f"{br.field_violations[0].field if br else None}")


def case_c(d):
    code, st = grpc_error(lambda: d.stub().GetJob(pb.GetJobRequest(id="job-999999"),
                                                  metadata=d.metadata, timeout=30))
    ri = detail(st, error_details_pb2.ResourceInfo)
    ck.check(code == grpc.StatusCode.NOT_FOUND and ri and ri.resource_name == "jobs/job-999999"
             and ri.resource_type == "ztrain.v1.Job",
             f"c: gRPC GetJob of a missing job: {code.name} {ri.resource_name if ri else None}")
    code, st = grpc_error(lambda: list(d.stub().WatchJob(pb.WatchJobRequest(id="job-999998"),
                                                         metadata=d.metadata, timeout=30)))
    ri = detail(st, error_details_pb2.ResourceInfo)
    ck.check(code == grpc.StatusCode.NOT_FOUND and ri and ri.resource_name == "jobs/job-999998",
             f"c: gRPC WatchJob of a missing job: {code.name}")
    # An id outside the id pattern (a space, 70 characters) is as missing as any other: the
    # same message and whole resource name over both transports, never cut.
    for bad, quoted in (("x y", "x%20y"), ("j" * 70, "j" * 70)):
        code, st = grpc_error(lambda: d.stub().GetJob(pb.GetJobRequest(id=bad),
                                                      metadata=d.metadata, timeout=30))
        ri = detail(st, error_details_pb2.ResourceInfo)
        s, ctype, p = http(d, "GET", f"/api/v1/jobs/{quoted}/logs")
        want = {"type": "ztrain.v1.Job", "name": f"jobs/{bad}"}
        ck.check(code == grpc.StatusCode.NOT_FOUND and ri and ri.resource_name == want["name"]
                 and s == 404 and p.get("resource") == want and st and
                 p.get("detail") == st.message == f"jobs/{bad} not found",
                 f"c: the id {bad[:12]!r}... ({len(bad)} characters): gRPC {code.name} "
                 f"{ri.resource_name if ri else None}, HTTP {s} {p.get('resource')} "
                 f"{p.get('detail')!r}")
    for path in ("/api/v1/jobs/job-999999", "/api/v1/jobs/job-999999/metrics",
                 "/api/v1/jobs/job-999999/logs"):
        s, ctype, p = http(d, "GET", path)
        ck.check(s == 404 and ctype == "application/problem+json" and
                 p.get("code") == "NOT_FOUND" and
                 p.get("resource") == {"type": "ztrain.v1.Job", "name": "jobs/job-999999"},
                 f"c: HTTP GET {path}: {s} {p.get('code')} {p.get('resource')}")


def case_c_bytes(d):
    """Found by schemathesis: a job id in the URL cut at 64 bytes inside a UTF-8 character made
    the problem's JSON invalid UTF-8. The detail escapes what is not text instead."""
    path = "/api/v1/jobs/" + "%C3%AB" * 40 + "%FF/logs"
    req = urllib.request.Request(d.http_url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        urllib.request.urlopen(req, timeout=30)
        status, body = 200, b""
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    try:
        problem = json.loads(body.decode("utf-8"))
    except ValueError:
        problem = {}
    ck.check(status == 404 and problem.get("code") == "NOT_FOUND",
             f"c: an id of cut UTF-8 in the URL: {status}, the problem is UTF-8 JSON "
             f"({body[:80]!r})")


def expect_admission(what, d, job, code_name, detail_cls, subject, type_=None):
    code, st = grpc_error(grpc_submit(d, job))
    m = detail(st, detail_cls)
    v = m.violations[0] if m and m.violations else None
    ck.check(code.name == code_name and v is not None and v.subject == subject and
             (type_ is None or v.type == type_),
             f"d: gRPC {what}: {code.name} {detail_cls.__name__} "
             f"{(v.subject, getattr(v, 'type', '')) if v else None}: {st.message[:120] if st else ''}")
    s, _, p = http(d, "POST", "/api/v1/jobs", {"spec": job})
    want_status = 429 if code_name == "RESOURCE_EXHAUSTED" else 400
    ck.check(s == want_status and p.get("code") == code_name and p.get("field") == subject,
             f"d: HTTP {what}: {s} {p.get('code')} field {p.get('field')!r}")


def case_d(tmp):
    with Daemon(BUILD, os.path.join(tmp, "d"), max_ranks=1, token=TOKEN,
                extra_args=["--max-world-size", "4", "--max-jobs", "1"]) as d:
        expect_admission("world_size 2 on a server of 1 rank", d,
                         tiny_job(d.data_root, world_size=2), "FAILED_PRECONDITION",
                         error_details_pb2.PreconditionFailure, "spec.world_size", "RANKS")
        expect_admission("world_size 8 above --max-world-size 4", d,
                         tiny_job(d.data_root, world_size=8), "RESOURCE_EXHAUSTED",
                         error_details_pb2.QuotaFailure, "spec.world_size")
        first = submit(d, tiny_job(d.data_root, name="holds-the-slot", max_steps=10_000_000))
        expect_admission("a full server", d, tiny_job(d.data_root), "RESOURCE_EXHAUSTED",
                         error_details_pb2.QuotaFailure, "jobs")
        d.stub().CancelJob(pb.CancelJobRequest(id=first.id, force=True), metadata=d.metadata,
                           timeout=30)


def case_e(d):
    code, st = grpc_error(lambda: d.stub().ListJobs(pb.ListJobsRequest(page_size=-1),
                                                    metadata=d.metadata, timeout=30))
    br = detail(st, error_details_pb2.BadRequest)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
             br.field_violations[0].field == "page_size", f"e: gRPC page_size -1: {code.name}")
    code, st = grpc_error(lambda: d.stub().GetJob(pb.GetJobRequest(), metadata=d.metadata,
                                                  timeout=30))
    br = detail(st, error_details_pb2.BadRequest)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
             br.field_violations[0].field == "id", f"e: gRPC GetJob without an id: {code.name}")
    s, _, p = http(d, "GET", "/api/v1/jobs?page_size=-1")
    ck.check(s == 400 and p.get("field") == "page_size",
             f"e: HTTP page_size=-1: {s} {p.get('field')!r}")
    for body in (b"[1]", b"{}", b'{"spec": {}, "extra": 1}', b"not json"):
        s, _, p = http(d, "POST", "/api/v1/jobs", body)
        ck.check(s == 400 and p.get("code") == "INVALID_ARGUMENT" and p.get("field"),
                 f"e: HTTP body {body!r}: {s} field {p.get('field')!r}: {p.get('detail')}")
    # A cancel's grace period is at most a day (docs/service.md), as ztraind's --grace: above
    # it is refused naming grace_seconds over both; a day itself is taken (the job is unknown).
    for grace, refused in ((86400.5, True), (1e9, True), (86400, False)):
        code, st = grpc_error(lambda: d.stub().CancelJob(
            pb.CancelJobRequest(id="job-999999", grace_seconds=grace), metadata=d.metadata,
            timeout=30))
        br = detail(st, error_details_pb2.BadRequest)
        fields = [v.field for v in br.field_violations] if br else []
        ck.check((code == grpc.StatusCode.INVALID_ARGUMENT and fields == ["grace_seconds"])
                 if refused else code == grpc.StatusCode.NOT_FOUND,
                 f"e: gRPC cancel with grace_seconds {grace}: {code.name} {fields}")
        s, _, p = http(d, "POST", "/api/v1/jobs/job-999999/cancel", {"grace_seconds": grace})
        ck.check((s == 400 and p.get("field") == "grace_seconds") if refused else s == 404,
                 f"e: HTTP cancel with grace_seconds {grace}: {s} {p.get('field')!r}: "
                 f"{p.get('detail')}")


def case_f(d):
    """Sizes: a spec of 200 KB is judged, not refused for its size (HTTP's 64 KiB cap on other
    bodies does not apply to a submit); one of 2 MB is above the manager's spec limit over both
    transports alike: RESOURCE_EXHAUSTED, QuotaFailure on "spec", HTTP 429."""
    job = tiny_job(d.data_root)
    job["deepspeed"]["zero_optimization"] = {"stage": 1, "zz_padding": "x" * 200_000}
    s, _, p = http(d, "POST", "/api/v1/jobs", {"spec": job})
    ck.check(s == 400 and p.get("field") == "spec.deepspeed.zero_optimization.zz_padding",
             f"f: a 200 KB spec over HTTP is judged: {s} {p.get('field')!r}")
    job["deepspeed"]["zero_optimization"]["zz_padding"] = "x" * 2_000_000
    code, st = grpc_error(grpc_submit(d, job))
    q = detail(st, error_details_pb2.QuotaFailure)
    ck.check(code == grpc.StatusCode.RESOURCE_EXHAUSTED and q and q.violations[0].subject == "spec",
             f"f: gRPC a 2 MB spec: {code.name} {q.violations[0].subject if q else None}")
    s, _, p = http(d, "POST", "/api/v1/jobs", {"spec": job})
    ck.check(s == 429 and p.get("code") == "RESOURCE_EXHAUSTED" and p.get("field") == "spec",
             f"f: HTTP a 2 MB spec: {s} {p.get('code')} {p.get('field')!r}")


def raw_json(obj):
    return json.dumps(obj).encode()


def case_g(d):
    job = tiny_job(d.data_root, name="ab\u0000cd")
    body = raw_json({"spec": job})
    # What Python's json reads the body as: a name that holds U+0000, which no C string can.
    ck.check("\0" in json.loads(body)["spec"]["name"], "g: the test's body holds U+0000")
    before = len(d.stub().ListJobs(pb.ListJobsRequest(page_size=1000), metadata=d.metadata,
                                   timeout=30).jobs)
    s, _, p = http(d, "POST", "/api/v1/jobs", body)
    ck.check(s == 400 and p.get("code") == "INVALID_ARGUMENT" and p.get("field") == "spec.name"
             and "byte" in p.get("detail", ""),
             f"g: HTTP a name holding \\u0000: {s} field {p.get('field')!r}: {p.get('detail')}")
    job = tiny_job(d.data_root, name="nul-key")
    for key in ("nul\u0000A", "nul\u0000B"):
        s, _, p = http(d, "POST", "/api/v1/jobs", raw_json({"spec": job, "idempotency_key": key}))
        ck.check(s == 400 and p.get("field") == "idempotency_key",
                 f"g: HTTP an idempotency key holding \\u0000: {s} {p.get('field')!r}")
    # A raw NUL byte inside a string, and U+0000 in an array's element, name their paths.
    job = tiny_job(d.data_root, name="raw")
    text = raw_json({"spec": job}).replace(b'"raw"', b'"r\x00w"')
    s, _, p = http(d, "POST", "/api/v1/jobs", text)
    ck.check(s == 400 and p.get("field") == "spec.name",
             f"g: HTTP a raw NUL byte in a name: {s} {p.get('field')!r}: {p.get('detail')}")
    job = tiny_job(d.data_root)
    job["deepspeed"]["zz_list"] = ["ok", {"k": "a\u0000"}]
    s, _, p = http(d, "POST", "/api/v1/jobs", raw_json({"spec": job}))
    ck.check(s == 400 and p.get("field") == "spec.deepspeed.zz_list[1].k",
             f"g: HTTP U+0000 in an array's element: {s} {p.get('field')!r}")
    # An escaped backslash before "u0000" is no NUL: the spec goes on to be judged.
    s, _, p = http(d, "POST", "/api/v1/jobs",
                   raw_json({"spec": dict(tiny_job(d.data_root), world_size=0,
                                          name="back\\u0000slash")}))
    ck.check(s == 400 and p.get("field") == "spec.world_size",
             f"g: HTTP a name with '\\\\u0000' is judged as text: {s} {p.get('field')!r}")
    after = len(d.stub().ListJobs(pb.ListJobsRequest(page_size=1000), metadata=d.metadata,
                                  timeout=30).jobs)
    ck.check(after == before, f"g: no job was made from a body holding U+0000 ({before} -> {after})")

    good = raw_json({"spec": tiny_job(d.data_root, name="trailing")})
    for tail in (b"xyz", b" {}", b"\x00", b"\n]"):
        try:
            json.loads(good + tail)
            python_ok = True
        except ValueError:
            python_ok = False
        s, _, p = http(d, "POST", "/api/v1/jobs", good + tail)
        ck.check(not python_ok and s == 400 and p.get("code") == "INVALID_ARGUMENT" and
                 f"byte {len(good) + len(tail) - len(tail.lstrip())}" in p.get("detail", ""),
                 f"g: HTTP submit with {tail!r} after the JSON: {s}: {p.get('detail')}")
    s, _, p = http(d, "POST", "/api/v1/jobs", good + b" \r\n\t")
    ck.check(s == 200, f"g: HTTP submit with JSON whitespace after the value: {s}")
    s, _, p = http(d, "POST", "/api/v1/jobs/job-000001/cancel",
                   b'{"force":true} this is not json')
    ck.check(s == 400 and "byte 15" in p.get("detail", ""),
             f"g: HTTP cancel with text after the JSON: {s}: {p.get('detail')}")
    s, _, p = http(d, "POST", "/api/v1/jobs/job-000001/cancel", b'{"force":\x01true}')
    ck.check(s == 400, f"g: HTTP cancel with a control byte between tokens: {s}")


def case_h(d):
    for scheme in ("bearer", "BEARER", "bEaReR"):
        auth = f"{scheme} {TOKEN}"
        s, _, _ = http(d, "GET", "/api/v1/jobs", headers={"Authorization": auth})
        ck.check(s == 200, f"h: HTTP Authorization '{scheme} <token>': {s}")
        code, _ = grpc_error(lambda: d.stub().ListJobs(
            pb.ListJobsRequest(), metadata=[("authorization", auth)], timeout=30))
        ck.check(code == grpc.StatusCode.OK, f"h: gRPC authorization '{scheme} <token>': {code}")
    s, _, _ = http(d, "GET", "/api/v1/jobs", headers={"Authorization": "bearer wrong"})
    ck.check(s == 401, f"h: HTTP a wrong token with 'bearer': {s}")
    code, _ = grpc_error(lambda: d.stub().ListJobs(
        pb.ListJobsRequest(), metadata=[("authorization", "bearer wrong")], timeout=30))
    ck.check(code == grpc.StatusCode.UNAUTHENTICATED, f"h: gRPC a wrong token: {code}")


def case_i(d):
    for i in range(3):
        submit(d, tiny_job(d.data_root, name=f"page-{i}", max_steps=1))
    total = len(d.stub().ListJobs(pb.ListJobsRequest(page_size=1000), metadata=d.metadata,
                                  timeout=30).jobs)
    for size in (0, 1001, 5000):
        g = d.stub().ListJobs(pb.ListJobsRequest(page_size=size), metadata=d.metadata, timeout=30)
        s, _, p = http(d, "GET", f"/api/v1/jobs?page_size={size}")
        ck.check(s == 200 and len(p.get("jobs", [])) == len(g.jobs) == total,
                 f"i: page_size={size}: HTTP {s} {len(p.get('jobs', []))} jobs, gRPC "
                 f"{len(g.jobs)}, of {total}")
    job_id = d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata, timeout=30).jobs[0].id
    for size in (0, 20000):
        s, _, p = http(d, "GET", f"/api/v1/jobs/{job_id}/anomalies?page_size={size}")
        ck.check(s == 200, f"i: HTTP anomalies page_size={size}: {s} {p}")
    code, st = grpc_error(lambda: d.stub().GetMetrics(
        pb.GetMetricsRequest(id=job_id, since_step=-5), metadata=d.metadata, timeout=30))
    br = detail(st, error_details_pb2.BadRequest)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
             br.field_violations[0].field == "since_step",
             f"i: gRPC GetMetrics since_step=-5: {code.name}")
    code, st = grpc_error(lambda: list(d.stub().WatchJob(
        pb.WatchJobRequest(id=job_id, since_step=-5), metadata=d.metadata, timeout=30)))
    br = detail(st, error_details_pb2.BadRequest)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
             br.field_violations[0].field == "since_step",
             f"i: gRPC WatchJob since_step=-5: {code.name}")
    s, _, p = http(d, "GET", f"/api/v1/jobs/{job_id}/metrics?since_step=-5")
    ck.check(s == 400 and p.get("field") == "since_step",
             f"i: HTTP metrics since_step=-5: {s} {p.get('field')!r}")
    # An empty metric key names no metric: skipped over both transports (HTTP's "keys=a,,b"
    # has none between its commas), so only empty keys ask for every key.
    ran = [j.id for j in d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata,
                                           timeout=30).jobs if state_name(j.state) == "SUCCEEDED"]
    for keys, query in (([""], "keys="), (["train/loss", ""], "keys=train/loss,,"),
                        (["", "train/loss", ""], "keys=,train/loss&keys=")):
        g = d.stub().GetMetrics(pb.GetMetricsRequest(id=ran[0], keys=keys), metadata=d.metadata,
                                timeout=30)
        s, _, p = http(d, "GET", f"/api/v1/jobs/{ran[0]}/metrics?{query}")
        got_g = [m.key for m in g.series]
        got_h = [m.get("key") for m in p.get("series", [])]
        want = ["train/loss"] if "train/loss" in keys else got_h
        ck.check(s == 200 and got_g == got_h == want and "" not in got_g and
                 "train/loss" in got_g, f"i: GetMetrics keys={keys}: gRPC {got_g}, HTTP "
                 f"?{query}: {s} {got_h}")


def case_j(d):
    md = d.metadata
    stub = d.stub()
    everything = [j.id for j in stub.ListJobs(pb.ListJobsRequest(page_size=1000), metadata=md,
                                                timeout=30).jobs]
    first = stub.ListJobs(pb.ListJobsRequest(page_size=1), metadata=md, timeout=30)
    s, _, p = http(d, "GET", f"/api/v1/jobs?page_size=1&page_token={first.next_page_token}")
    ck.check(len(everything) >= 3 and first.next_page_token and s == 200 and
             [j["id"] for j in p.get("jobs", [])] == everything[1:2],
             f"j: a ListJobs token pages on over HTTP ({s}, {p.get('jobs', [{}])[0].get('id')} "
             f"after {everything[:2]})")
    # Opaque to clients, but what the design says it is: URL-safe base64 (RFC 4648 section 5,
    # unpadded) of version, list, the position (the page's last job id) and its HMAC-SHA256.
    token = first.next_page_token
    raw = unb64(token)
    ck.check("=" not in token and raw[2:-32] == everything[0].encode() and
             raw[-32:] == tag(page_key(d), 1, "", "", everything[0]),
             f"j: the token is base64url of version, list, cursor and HMAC ({raw!r})")
    s, _, p = http(d, "GET", "/api/v1/jobs?page_size=1")
    g = stub.ListJobs(pb.ListJobsRequest(page_size=1, page_token=p.get("nextPageToken", "")),
                      metadata=md, timeout=30)
    ck.check([j.id for j in g.jobs] == everything[1:2],
             f"j: an HTTP token pages on over gRPC ({[j.id for j in g.jobs]})")
    foreign = (("a job id never handed out", everything[1], 0),
               ("the unfiltered list's token with a state", first.next_page_token,
                pb.JOB_STATE_SUCCEEDED),
               ("an altered token", first.next_page_token[:-2] + "AA", 0))
    for what, token, state in foreign:
        query = f"page_token={token}" + ("&state=JOB_STATE_SUCCEEDED" if state else "")
        s, _, p = http(d, "GET", f"/api/v1/jobs?{query}")
        ck.check(s == 400 and p.get("field") == "page_token",
                 f"j: HTTP {what}: {s} {p.get('field')!r}: {p.get('detail')}")
        code, st = grpc_error(lambda: stub.ListJobs(
            pb.ListJobsRequest(page_token=token, state=state), metadata=md, timeout=30))
        br = detail(st, error_details_pb2.BadRequest)
        ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
                 br.field_violations[0].field == "page_token",
                 f"j: gRPC ListJobs {what}: {code.name}")
    s, _, p = http(d, "GET", f"/api/v1/jobs/{everything[0]}/anomalies?page_token=1")
    ck.check(s == 400 and p.get("field") == "page_token",
             f"j: HTTP anomalies with a bare number as token: {s} {p.get('field')!r}")
    code, _ = grpc_error(lambda: stub.ListAnomalies(
        pb.ListAnomaliesRequest(id=everything[0], page_token="1"), metadata=md, timeout=30))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT,
             f"j: gRPC ListAnomalies with a bare number as token: {code.name}")


def records_pages(d, job_id, since=0, token=""):
    """(status, field, [seqs]) of paging a job's records one at a time from `token`."""
    seqs = []
    while True:
        q = f"since_step={since}&page_size=1" + (f"&page_token={token}" if token else "")
        s, _, p = http(d, "GET", f"/api/v1/jobs/{job_id}/records?{q}")
        if s != 200:
            return s, p.get("field"), seqs
        seqs += [int(r["seq"]) for r in p.get("records", [])]
        token = p.get("nextPageToken", "")
        if not token:
            return s, None, seqs


def case_k(d, tmp):
    md = d.metadata
    stub = d.stub()
    key = page_key(d)
    mode = os.stat(os.path.join(d.state_dir, "page_token.key")).st_mode & 0o777
    ck.check(len(key) == 32 and mode == 0o600,
             f"k: the state directory's key is 32 bytes, mode 0600 ({len(key)}, {mode:o})")
    a = submit(d, tiny_job(d.data_root, name="tok-a", max_steps=4)).id
    b = submit(d, tiny_job(d.data_root, name="tok-b", max_steps=4)).id
    for job_id in (a, b):
        wait_state(d, job_id, ("SUCCEEDED", "FAILED"), timeout=120)
    s, _, p = http(d, "GET", f"/api/v1/jobs/{a}/records?since_step=0")
    unpaged = [int(r["seq"]) for r in p.get("records", [])]
    s, field, seqs = records_pages(d, a)
    ck.check(s == 200 and len(unpaged) >= 3 and seqs == unpaged,
             f"k: /records paged one at a time round-trips its tokens ({s} {field} {seqs} of "
             f"{unpaged})")
    s, _, p = http(d, "GET", f"/api/v1/jobs/{a}/records?since_step=0&page_size=1")
    token = p.get("nextPageToken", "")
    raw = unb64(token)
    ck.check(raw[:2] == bytes([2, 3]) and raw[2:-32] == str(unpaged[0]).encode() and
             raw[-32:] == tag(key, 3, a, "0", str(unpaged[0])),
             f"k: a records token binds the job and since_step ({raw!r})")
    other = os.urandom(32)
    jobs_token = make_token(key, 1, "", "", a)
    refused = [("one character changed", token, flip(token, len(token) // 2)),
               ("its first character changed", token, flip(token, 0)),
               ("its last character changed", token, flip(token, len(token) - 1)),
               ("cut short", token, token[:-4]),
               ("a bare number (the old /records token)", token, str(unpaged[0])),
               ("signed with another key", token, make_token(other, 3, a, "0", str(unpaged[0]))),
               ("of the jobs list", token, jobs_token)]
    for what, _, bad in refused:
        s, _, p = http(d, "GET", f"/api/v1/jobs/{a}/records?since_step=0&page_token={bad}")
        ck.check(s == 400 and p.get("field") == "page_token",
                 f"k: /records with a token {what}: {s} {p.get('field')!r}")
    s, _, p = http(d, "GET", f"/api/v1/jobs/{b}/records?since_step=0&page_token={token}")
    ck.check(s == 400 and p.get("field") == "page_token",
             f"k: job A's records token on job B: {s} {p.get('field')!r}")
    s, _, p = http(d, "GET", f"/api/v1/jobs/{a}/records?since_step=1&page_token={token}")
    ck.check(s == 400 and p.get("field") == "page_token",
             f"k: a records token with another since_step: {s} {p.get('field')!r}")
    s, _, p = http(d, "GET", f"/api/v1/jobs/{a}/anomalies?page_token={token}")
    ck.check(s == 400 and p.get("field") == "page_token",
             f"k: a records token on /anomalies: {s} {p.get('field')!r}")

    # A token made here with the state directory's key is one the server reads: the format is
    # the one page_token.h defines. One with another state directory's key is refused.
    everything = [j.id for j in stub.ListJobs(pb.ListJobsRequest(page_size=1000), metadata=md,
                                                timeout=30).jobs]
    page = stub.ListJobs(pb.ListJobsRequest(page_size=1, page_token=make_token(
        key, 1, "", "", everything[0])), metadata=md, timeout=30)
    ck.check([j.id for j in page.jobs] == everything[1:2],
             f"k: a ListJobs token signed here with the key pages on ({[j.id for j in page.jobs]})")
    with Daemon(BUILD, os.path.join(tmp, "k-other"), max_ranks=1, token=TOKEN) as d2:
        key2 = page_key(d2)
    ck.check(key2 != key, "k: another state directory has another key")
    alien = {"ListJobs": lambda t: stub.ListJobs(pb.ListJobsRequest(page_token=t), metadata=md,
                                                 timeout=30),
             "ListAnomalies": lambda t: stub.ListAnomalies(
                 pb.ListAnomaliesRequest(id=b, page_token=t), metadata=md, timeout=30)}
    grpc_refused = [("ListJobs", "of another state directory", make_token(key2, 1, "", "",
                                                                          everything[0])),
                    ("ListJobs", "with one character changed",
                     flip(make_token(key, 1, "", "", everything[0]), 10)),
                    ("ListJobs", "of /records", token),
                    ("ListAnomalies", "of another job", make_token(key, 2, a, "", "1")),
                    ("ListAnomalies", "of another state directory",
                     make_token(key2, 2, b, "", "1")),
                    ("ListAnomalies", "that is a bare number", "1")]
    for method, what, bad in grpc_refused:
        code, st = grpc_error(lambda: alien[method](bad))
        br = detail(st, error_details_pb2.BadRequest)
        ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and br and
                 br.field_violations[0].field == "page_token",
                 f"k: gRPC {method} with a token {what}: {code.name}")
    s, _, p = http(d, "GET", f"/api/v1/jobs?page_token={make_token(key2, 1, '', '', a)}")
    ck.check(s == 400 and p.get("field") == "page_token",
             f"k: HTTP jobs list with another state directory's token: {s} {p.get('field')!r}")
    page = stub.ListAnomalies(pb.ListAnomaliesRequest(id=b, page_token=make_token(
        key, 2, b, "", "0")), metadata=md, timeout=30)
    ck.check(page is not None, "k: a ListAnomalies token of the job itself is read")

    # The key is the state directory's: a token outlives a restart.
    d.restart()
    s, field, seqs = records_pages(d, a, token=token)
    ck.check(s == 200 and seqs == unpaged[1:],
             f"k: a records token pages on after a restart ({s} {field} {seqs})")


def error_info(st):
    """(reason, domain, metadata) of a google.rpc.Status's ErrorInfo, or None."""
    ei = detail(st, error_details_pb2.ErrorInfo)
    return (ei.reason, ei.domain, dict(ei.metadata)) if ei else None


def problem_info(p):
    return (p.get("reason"), p.get("domain"), p.get("metadata", {})) if isinstance(p, dict) \
        else None


def expect_refusal(what, grpc_call, http_args, code, status, want):
    """The same ErrorInfo over gRPC (rpc_status) and HTTP (the problem's reason, domain and
    metadata), with the code and status given."""
    got_code, st = grpc_error(grpc_call)
    ck.check(got_code == code and error_info(st) == want,
             f"l: gRPC {what}: {got_code.name} ErrorInfo {error_info(st)}")
    d, method, path, hdrs = http_args
    s, ctype, p = http(d, method, path, {} if method == "POST" else None, headers=hdrs)
    ck.check(s == status and ctype == "application/problem+json" and
             p.get("code") == code.name and problem_info(p) == want,
             f"l: HTTP {what}: {s} {p.get('code')} {problem_info(p)}")


def case_l(tmp):
    """Refusals of the caller carry ErrorInfo (Google's AIP-193 for auth errors), over both
    transports alike."""
    READ, SUBMIT, ADMIN = "k-read-" + "r" * 20, "k-submit-" + "s" * 20, "k-admin-" + "a" * 20
    os.makedirs(os.path.join(tmp, "k"), exist_ok=True)
    tokens = os.path.join(tmp, "k", "tokens")
    with open(tokens, "w") as f:
        f.write(f"{READ} read\n{SUBMIT} submit\n{ADMIN} admin\n")
    os.chmod(tokens, 0o600)
    with Daemon(BUILD, os.path.join(tmp, "k", "d"), max_ranks=1, token=ADMIN,
                extra_args=["--token-file", tokens]) as d:
        stub = d.stub()
        job = tiny_job(d.data_root, name="admins", max_steps=2)
        theirs = stub.SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job)), metadata=d.metadata,
                                timeout=30)

        def auth(token):
            return [("authorization", f"Bearer {token}")] if token else []

        def headers(token):
            # urllib sends no Authorization when the value is empty: the helper's is replaced.
            return {"Authorization": f"Bearer {token}" if token else ""}

        missing = ("CREDENTIALS_MISSING", "ztrain", {})
        code, st = grpc_error(lambda: stub.ListJobs(pb.ListJobsRequest(), timeout=30))
        ck.check(code == grpc.StatusCode.UNAUTHENTICATED and error_info(st) == missing,
                 f"l: gRPC no token: {code.name} ErrorInfo {error_info(st)}")
        req = urllib.request.Request(d.http_url + "/api/v1/jobs")
        try:
            urllib.request.urlopen(req, timeout=30)
            s, p = 200, {}
        except urllib.error.HTTPError as e:
            s, p = e.code, json.loads(e.read() or b"null")
        ck.check(s == 401 and problem_info(p) == missing,
                 f"l: HTTP no token: {s} {problem_info(p)}")
        expect_refusal("a wrong token",
                       lambda: stub.ListJobs(pb.ListJobsRequest(), metadata=auth("nope"),
                                             timeout=30),
                       (d, "GET", "/api/v1/jobs", headers("nope")),
                       grpc.StatusCode.UNAUTHENTICATED, 401, ("TOKEN_INVALID", "ztrain", {}))
        expect_refusal("a read token submitting",
                       lambda: stub.SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job)),
                                              metadata=auth(READ), timeout=30),
                       (d, "POST", "/api/v1/jobs", headers(READ)),
                       grpc.StatusCode.PERMISSION_DENIED, 403,
                       ("ACCESS_TOKEN_SCOPE_INSUFFICIENT", "ztrain",
                        {"scope": "read", "requiredScope": "submit"}))
        expect_refusal("a submit token cancelling an admin's job",
                       lambda: stub.CancelJob(pb.CancelJobRequest(id=theirs.id),
                                              metadata=auth(SUBMIT), timeout=30),
                       (d, "POST", f"/api/v1/jobs/{theirs.id}/cancel", headers(SUBMIT)),
                       grpc.StatusCode.PERMISSION_DENIED, 403,
                       ("NOT_JOB_SUBMITTER", "ztrain",
                        {"job": f"jobs/{theirs.id}", "requiredScope": "admin"}))
        code, st = grpc_error(lambda: stub.CancelJob(pb.CancelJobRequest(id=theirs.id),
                                                     metadata=auth(SUBMIT), timeout=30))
        ck.check(st and f"and jobs/{theirs.id} was submitted by another token" in st.message,
                 f"l: the refusal names the job by its resource name: "
                 f"{st.message if st else None!r}")
        # HTTP's own refusals of where a request comes from.
        s, _, p = http(d, "GET", "/api/v1/jobs", headers={"Host": "evil.example"})
        ck.check(s == 421 and p.get("code") == "PERMISSION_DENIED" and
                 problem_info(p) == ("HOST_NOT_ALLOWED", "ztrain", {}),
                 f"l: HTTP a foreign Host: {s} {problem_info(p)}")
        s, _, p = http(d, "GET", "/api/v1/jobs", headers={"Origin": "https://evil.example"})
        ck.check(s == 403 and p.get("code") == "PERMISSION_DENIED" and
                 problem_info(p) == ("ORIGIN_NOT_ALLOWED", "ztrain", {}),
                 f"l: HTTP a foreign Origin: {s} {problem_info(p)}")


def main():
    tmp = temp_dir("ztrain-api-errors-")
    with Daemon(BUILD, os.path.join(tmp, "main"), max_ranks=1, token=TOKEN) as d:
        case_a(d)
        case_b(d)
        case_c(d)
        case_c_bytes(d)
        case_e(d)
        case_f(d)
        case_g(d)
        case_h(d)
        case_i(d)
        case_j(d)
        case_k(d, tmp)
    case_d(tmp)
    case_l(tmp)
    ck.done()


if __name__ == "__main__":
    main()
