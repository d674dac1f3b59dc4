"""The HTTP API's OpenAPI 3.1 document (service/http/openapi.json) against a real ztraind with a
token and a finished job (run in .venv/ for schemathesis, from PyPI).

  a. GET /api/v1/openapi.json serves the repository's document byte for byte (embedded at
     build time), and it is an OpenAPI 3.1 document whose $refs all resolve; its message
     schemas (the proto3 JSON mapping of every response message) are what
     scripts/openapi_messages.py generates from proto/ztrain.proto today.
  b. The document's routes are the server's: every operation answers with a status the
     document lists for it (never "no route"); every other method on a documented path is 405
     with an Allow header naming exactly the documented methods, and OPTIONS on it (without a
     token) is 204 with that Allow header; every sub-resource in the
     router's table (service/http/http_api.c, read here as text) is documented; a path the
     document does not have is 404 "no route", for OPTIONS too. Every operation lists the refusals it can
     meet: 403 for another site's Origin, 421 for a foreign Host, 401 without a token.
  c. The event stream answers text/event-stream for the job and a problem for a missing one
     (schemathesis streams only the finished job: schemathesis.toml says why).
  d. schemathesis runs every operation, the event stream included (each event's data checked
     against its message's schema), with every check (no 5xx, statuses, content types
     and bodies as documented, invalid input refused, valid input accepted, methods, auth),
     bounded in examples and time, and finds nothing; its counts are printed."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, SOURCE, Checker, Daemon, submit, temp_dir, tiny_job, wait_state  # noqa: E402

ck = Checker()
TOKEN = "openapi-token"
DOC = os.path.join(SOURCE, "service", "http", "openapi.json")
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


def request(d, method, path, body=None, token=TOKEN, headers=None):
    h = {"Authorization": f"Bearer {token}"} if token else {}
    h.update(headers or {})
    data = None
    if method == "POST":
        data = json.dumps(body if body is not None else {}).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(d.http_url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def resolve_refs(doc):
    missing = []

    def walk(x):
        if isinstance(x, dict):
            r = x.get("$ref")
            if isinstance(r, str):
                node = doc
                for part in r.lstrip("#/").split("/"):
                    node = node.get(part) if isinstance(node, dict) else None
                if node is None:
                    missing.append(r)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    return missing


def case_a(d, doc_bytes, doc):
    # The message schemas are generated from the proto's descriptors (the proto3 JSON mapping).
    out = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "openapi_messages.py"),
                          "--check"], capture_output=True, text=True, timeout=60)
    ck.check(out.returncode == 0, "a: the message schemas are scripts/openapi_messages.py's "
             f"output for today's proto ({out.stderr.strip()[-200:]})")
    s, h, body = request(d, "GET", "/api/v1/openapi.json")
    ck.check(s == 200 and h.get("Content-Type") == "application/json" and body == doc_bytes,
             f"a: /api/v1/openapi.json is the repository's document ({s}, {len(body)} bytes)")
    ck.check(doc.get("openapi", "").startswith("3.1") and not resolve_refs(doc),
             f"a: OpenAPI {doc.get('openapi')}, unresolved $refs: {resolve_refs(doc)}")


def router_subs():
    """The sub-resources of /api/v1/jobs/{id}/ in the router's table, from its C source."""
    with open(os.path.join(SOURCE, "service", "http", "http_api.c")) as f:
        text = f.read()
    table = re.search(r"subs\[N_SUBS\]\s*=\s*\{(.*?)\};", text, re.S).group(1)
    return [s for s in re.findall(r'"([^"]*)"', table) if s]


def case_b(d, doc, job_id):
    for path, item in doc["paths"].items():
        url = path.replace("{id}", job_id)
        documented = [m.upper() for m in item if m.upper() in METHODS]
        for m in documented:
            if item[m.lower()].get("operationId") == "WatchJob":
                continue  # an open stream: case c
            s, h, body = request(d, m, url, body={"spec": {}} if path == "/api/v1/jobs" else None)
            listed = item[m.lower()]["responses"]
            no_route = b"no route" in body
            ck.check(str(s) in listed and not no_route,
                     f"b: {m} {path}: {s} is documented ({sorted(listed)})")
        for m in METHODS:
            if m in documented:
                continue
            s, h, body = request(d, m, url)
            allow = {x.strip() for x in h.get("Allow", "").split(",") if x.strip()}
            ck.check(s == 405 and allow - {"HEAD", "OPTIONS"} == set(documented),
                     f"b: {m} {path}: {s}, Allow {sorted(allow)} = documented {documented}")
        # OPTIONS asks for the same methods (RFC 9110 9.3.7), with no token (a CORS preflight
        # carries none).
        s, h, _ = request(d, "OPTIONS", url, token=None)
        allow = {x.strip() for x in h.get("Allow", "").split(",") if x.strip()}
        ck.check(s == 204 and "OPTIONS" in allow and
                 allow - {"HEAD", "OPTIONS"} == set(documented),
                 f"b: OPTIONS {path}: {s}, Allow {sorted(allow)} = documented {documented}")
    # The refusals every operation can meet are listed for each: another site's Origin (403),
    # a Host that is not the server's (421), and no token where one is needed (401).
    for path, item in doc["paths"].items():
        url = path.replace("{id}", job_id)
        for m, op in item.items():
            if m.upper() not in METHODS:
                continue
            cases = [({"Origin": "https://evil.example"}, TOKEN, 403),
                     ({"Host": "evil.example"}, TOKEN, 421)]
            if op.get("security", doc.get("security")):
                cases.append(({}, None, 401))
            for headers, token, want in cases:
                s, _, _ = request(d, m.upper(), url, token=token, headers=headers)
                ck.check(s == want and str(s) in op["responses"],
                         f"b: {m.upper()} {path} with {headers or 'no token'}: {s} (want {want}) "
                         f"is documented ({sorted(op['responses'])})")
    subs = router_subs()
    undocumented = [s for s in subs if f"/api/v1/jobs/{{id}}/{s}" not in doc["paths"]]
    ck.check(len(subs) >= 10 and not undocumented,
             f"b: the router's {len(subs)} sub-resources are documented (missing {undocumented})")
    for path in ("/api/v1/jobs/x/nothing", "/api/v1/nothing", "/api/v2/jobs"):
        for m in ("GET", "OPTIONS"):
            s, _, body = request(d, m, path)
            ck.check(s == 404 and b"no route" in body, f"b: {m} {path} is 404 no route ({s})")


def case_c(d, job_id):
    s, h, body = request(d, "GET", f"/api/v1/jobs/{job_id}/events")
    ck.check(s == 200 and h.get("Content-Type") == "text/event-stream" and b"event: job" in body,
             f"c: the finished job's event stream ({s} {h.get('Content-Type')})")
    s, h, body = request(d, "GET", "/api/v1/jobs/job-999999/events")
    ck.check(s == 404 and h.get("Content-Type") == "application/problem+json",
             f"c: a missing job's stream is a problem ({s})")


def case_d(d, doc):
    ops = sum(1 for p in doc["paths"].values() for m in p if m in ("get", "post", "put", "delete",
                                                                  "patch"))
    # schemathesis's own command line, through the wrapper that lets it read event streams with
    # the venv's urllib3 1.26.
    cmd = [sys.executable, os.path.join(SOURCE, "tests", "service", "schemathesis_run.py"),
           "--config-file", os.path.join(SOURCE, "tests", "service", "schemathesis.toml"),
           "run", DOC, "--url", d.http_url, "-H", f"Authorization: Bearer {TOKEN}",
           "--checks", "all", "--max-examples", "15", "--max-time", "40",
           "--request-timeout", "10", "--workers", "1", "--no-color"]
    t = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=d.dir)
    secs = time.monotonic() - t
    text = out.stdout + out.stderr
    counts = re.search(r"(\d+) generated, (\d+) passed(?:, (\d+) skipped)?", text)
    summary = [l for l in text.splitlines()
               if re.search(r"generated|Selected|Tested|Scenarios|Seed", l)]
    print("schemathesis: " + " | ".join(s.strip() for s in summary) + f" ({secs:.0f} s)")
    ck.check(out.returncode == 0 and counts and counts.group(1) == counts.group(2),
             f"d: schemathesis passes ({out.returncode}): " +
             (text[-3000:] if out.returncode else counts.group(0) if counts else text[-500:]))
    ck.check(f"Selected: {ops}/{ops}" in text and f"Tested: {ops}" in text,
             f"d: every operation was run, the event stream too ({ops})")


def main():
    with open(DOC, "rb") as f:
        doc_bytes = f.read()
    doc = json.loads(doc_bytes)
    tmp = temp_dir("ztrain-openapi-")
    with Daemon(BUILD, os.path.join(tmp, "d"), token=TOKEN) as d:
        job = submit(d, tiny_job(d.data_root, max_steps=3))
        ck.check(job.id == "job-000001", f"the finished job schemathesis streams is job-000001 "
                 f"({job.id}, schemathesis.toml)")
        wait_state(d, job.id, {"SUCCEEDED", "FAILED"})
        case_a(d, doc_bytes, doc)
        case_b(d, doc, job.id)
        case_c(d, job.id)
        case_d(d, doc)
        s, _, _ = request(d, "GET", "/healthz", token=None)
        ck.check(s == 200 and d.proc.poll() is None, "d: ztraind still serves")
    ck.done()


if __name__ == "__main__":
    main()
