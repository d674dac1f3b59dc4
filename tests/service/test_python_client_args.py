"""The Python client's arguments and versions, imported from the source tree (as
clients/python/README.md has it) against a real ztraind with a token.

  a. Every method's arguments are checked against their request field before any call: a value
     of another type (get(42), force="yes", grace_seconds="3", keys=[3], idempotency_key=3) or
     out of the field's range (int32: -2^31..2^31-1, int64: -2^63..2^63-1, from the proto's
     types) is InvalidArgument naming the field, not protobuf's TypeError or "Value out of
     range"; a page_size, max_points or tail above int32 is taken as its maximum, as ztraind
     takes a size above its maximum (AIP-158): list(page_size=2^31) lists what HTTP's
     ?page_size=2^31 lists, metrics(max_points=2^40) and logs(tail=2^40) what the defaults give
     for a short job. A timeout of 0 (gRPC's deadline already past, which a quick local server
     still meets at times) or below, to Client, watch or logs, is InvalidArgument naming
     timeout.
  b. The version is one: CMake's project(VERSION), pyproject.toml's and ztrain.__version__
     agree, `ztraind --version` says it, HTTP answers carry `Server: ztraind/VERSION` and gRPC
     answers the same `server` initial metadata, which Client.server_version() reads.
  c. Every public method of Client has a docstring (help(ztrain.Client)).
  d. The streaming methods (watch, logs, anomalies) check their arguments at the call, before
     the first next(), as list() does: a bad id, range or timeout raises InvalidArgument from
     the call itself. wait(id, timeout=0) looks at the job once, as `kubectl wait --timeout=0`
     does: a job that has ended is returned, not a TimeoutError."""
import inspect
import json
import os
import re
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, SOURCE, Checker, Daemon, temp_dir, tiny_job  # noqa: E402

ck = Checker()
TOKEN = "args-client-token"
CLIENT = os.path.join(SOURCE, "clients", "python")
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def refusal(call):
    try:
        r = call()
        if inspect.isgenerator(r):
            list(r)
    except Exception as e:  # noqa: BLE001 - the class is what is checked
        return e
    return None


def http_get(d, path):
    req = urllib.request.Request(d.http_url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.headers.get("Server"), json.loads(r.read())


def case_a(ztrain, c, d, job):
    for what, call, field in (
            ("get(42)", lambda: c.get(42), "id"),
            ("cancel(force='yes')", lambda: c.cancel(job.id, force="yes"), "force"),
            ("cancel(grace_seconds='3')", lambda: c.cancel(job.id, grace_seconds="3"),
             "grace_seconds"),
            ("metrics(keys=[3])", lambda: c.metrics(job.id, [3]), "keys"),
            ("submit(idempotency_key=3)",
             lambda: c.submit(tiny_job(d.data_root), idempotency_key=3), "idempotency_key"),
            ("list(page_size=-2^31-1)", lambda: c.list(page_size=-INT32_MAX - 2), "page_size"),
            ("list(page_size='5')", lambda: c.list(page_size="5"), "page_size"),
            ("watch(since_step=2^63)", lambda: c.watch(job.id, since_step=INT64_MAX + 1),
             "since_step"),
            ("watch(after_seq=-2^63-1)", lambda: c.watch(job.id, after_seq=-INT64_MAX - 2),
             "after_seq"),
            ("metrics(since_step=2^63)", lambda: c.metrics(job.id, since_step=INT64_MAX + 1),
             "since_step"),
            ("anomalies(page_size=True)", lambda: c.anomalies(job.id, page_size=True),
             "page_size"),
            ("Client(timeout=-1)", lambda: ztrain.Client(d.grpc_addr, timeout=-1), "timeout")):
        e = refusal(call)
        ck.check(isinstance(e, ztrain.InvalidArgument) and e.field == field and
                 e.message.startswith(field + ":"),
                 f"a: {what} is InvalidArgument naming {field} ({e!r})")

    ids = [j.id for j in c.list(page_size=INT32_MAX + 1)]
    _, body = http_get(d, f"/api/v1/jobs?page_size={INT32_MAX + 1}")
    ck.check(ids == [j["id"] for j in body.get("jobs", [])] and job.id in ids,
             f"a: list(page_size=2^31) lists what HTTP's ?page_size=2^31 lists ({ids}, {body})")
    ck.check(c.metrics(job.id, max_points=2**40) == c.metrics(job.id),
             "a: metrics(max_points=2^40) is the default's (10,000) for a short job")
    ck.check([l.text for l in c.logs(job.id, tail=2**40)] ==
             [l.text for l in c.logs(job.id, tail=INT32_MAX)],
             "a: logs(tail=2^40) is every line kept, as tail=2^31-1")
    for what, call in (("Client(timeout=0)", lambda: ztrain.Client(d.grpc_addr, timeout=0)),
                       ("watch(timeout=0)", lambda: c.watch(job.id, timeout=0)),
                       ("logs(timeout=-1)", lambda: c.logs(job.id, timeout=-1))):
        e = refusal(call)
        ck.check(isinstance(e, ztrain.InvalidArgument) and e.field == "timeout",
                 f"a: {what} (gRPC's deadline already past, which a quick server may still "
                 f"meet) is InvalidArgument naming timeout ({e!r})")


def case_b(ztrain, c, d):
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        cmake = re.search(r"project\(ztrain VERSION ([0-9.]+)", f.read()).group(1)
    with open(os.path.join(CLIENT, "pyproject.toml")) as f:
        pyproject = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    ck.check(cmake == pyproject == ztrain.__version__,
             f"b: CMake {cmake}, pyproject.toml {pyproject}, ztrain.__version__ "
             f"{ztrain.__version__} agree")
    out = subprocess.run([os.path.join(BUILD, "ztraind"), "--version"], capture_output=True,
                         text=True, timeout=30)
    ck.check(out.stdout.strip() == f"ztraind {cmake}", f"b: ztraind --version ({out.stdout!r})")
    server, _ = http_get(d, "/api/v1/jobs")
    ck.check(server == f"ztraind/{cmake}", f"b: HTTP's Server header ({server!r})")
    try:
        version = c.server_version()
    except Exception as e:  # noqa: BLE001 - reported below
        version = repr(e)
    ck.check(version == cmake, f"b: Client.server_version() is {cmake} ({version!r})")


def case_c(ztrain):
    public = [n for n, f in inspect.getmembers(ztrain.Client, inspect.isfunction)
              if not n.startswith("_")]
    bare = [n for n in public if not inspect.getdoc(getattr(ztrain.Client, n))]
    ck.check("get" in public and "close" in public and not bare,
             f"c: every public method of Client has a docstring (none: {bare})")


def raised_at_call(call):
    """What the call itself raises, before anything is iterated; None when it raises nothing."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the class is what is checked
        return e
    return None


def case_d(ztrain, c, job):
    for what, call, field in (
            ("watch(42)", lambda: c.watch(42), "id"),
            ("watch(since_step=2^63)", lambda: c.watch(job.id, since_step=INT64_MAX + 1),
             "since_step"),
            ("watch(timeout=0)", lambda: c.watch(job.id, timeout=0), "timeout"),
            ("logs(42)", lambda: c.logs(42), "id"),
            ("logs(timeout=-1)", lambda: c.logs(job.id, timeout=-1), "timeout"),
            ("anomalies(42)", lambda: c.anomalies(42), "id"),
            ("anomalies(page_size=True)", lambda: c.anomalies(job.id, page_size=True),
             "page_size")):
        e = raised_at_call(call)
        ck.check(isinstance(e, ztrain.InvalidArgument) and e.field == field,
                 f"d: {what} raises InvalidArgument naming {field} at the call, before "
                 f"next() ({e!r})")
    for timeout in (0, -1):
        try:
            got = c.wait(job.id, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - reported below
            got = e
        ck.check(isinstance(got, ztrain.pb.Job) and got.id == job.id and got.state == job.state,
                 f"d: wait(ended job, timeout={timeout}) returns the job, as kubectl wait "
                 f"--timeout=0 checks once ({getattr(got, 'id', got)!r:.120})")


def main():
    sys.path.insert(0, CLIENT)
    import ztrain
    ck.check(ztrain.__file__.startswith(CLIENT), f"the source tree's client ({ztrain.__file__})")
    tmp = temp_dir("ztrain-pyclient-args-")
    with Daemon(BUILD, os.path.join(tmp, "d"), max_ranks=1, token=TOKEN) as d:
        with ztrain.Client(d.grpc_addr, token=TOKEN) as c:
            job = c.wait(c.submit(tiny_job(d.data_root, max_steps=3)).id, timeout=120)
            case_a(ztrain, c, d, job)
            case_b(ztrain, c, d)
            case_d(ztrain, c, job)
    case_c(ztrain)
    ck.done()


if __name__ == "__main__":
    main()
