"""Job webhooks under the operator's policy (issue 34, defects 2-5), with a real ztraind, Python
grpcio and HTTP receivers on this host.

  2. SSRF: a daemon without --webhook-allow refuses a job webhook at submit, and its receiver on
     loopback gets nothing. With --webhook-allow 127.0.0.1 --webhook-allow localhost (and no
     --webhook-allow-private): the literal 127.0.0.1 is refused at submit; "localhost" passes the
     name check but each attempt is refused because it resolves to loopback (recorded, nothing
     received); a host not allowed is refused naming the flag.
  3. secret_env: the operator's --webhook-secret-env, a set variable outside the granted prefix and
     an unset one get the same refusal (no signing oracle, no probe of the environment); a name
     inside the prefix is taken.
  4. The operator's --webhook URL, whose path holds a token, is never served: /webhooks lists
     it as scheme://host:port.
  5. One job cannot drop the others' alerts: job A has 16 hooks to a receiver that never answers
     and a loss_spike rule that fires nearly every step for 2,000 steps; job B ends meanwhile and
     the operator's hook gets B's job.end (on main: "dropped (the delivery queue was full)"). A's
     rows in the state file stay within the per-job bounds (1,000 anomalies, 2,000 deliveries).
ZT_TEST_OLD_FLAGS=1 runs part 5 without the new flags, to see it fail against an older build."""
import http.server
import json
import os
import socket
import sqlite3
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, stubs, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state, wait_step)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
OLD = os.environ.get("ZT_TEST_OLD_FLAGS") == "1"


class Receiver(http.server.BaseHTTPRequestHandler):
    seen = []
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with Receiver.lock:
            Receiver.seen.append((self.path, dict(self.headers), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def received(path_prefix):
    with Receiver.lock:
        return [(p, h, b) for p, h, b in Receiver.seen if p.startswith(path_prefix)]


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]
hook = f"http://127.0.0.1:{port}"
# A receiver that never answers: connections wait in the listen backlog.
silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(64)
silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"


def http_get(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return view(path, json.loads(r.read()))


def refusal(d, job):
    try:
        return "taken " + submit(d, job).id
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"


def deliveries(d, job_id):
    return http_get(d, f"/api/v1/jobs/{job_id}/webhooks")["deliveries"]


os.environ["ZT_OPERATOR_SECRET"] = "operator-secret-" + "9" * 16
os.environ["ZT_JOB_HOOK_A"] = "job-secret-" + "3" * 16

if not OLD:
    # ---- 2. no allowlist: no job webhooks at all ------------------------------------------
    with Daemon(BUILD, temp_dir("ztrain-hooks-"), max_ranks=1) as d:
        job = tiny_job(d.data_root, max_steps=3)
        job["alerts"] = {"webhooks": [{"url": hook + "/ssrf", "on": ["end"]}]}
        r = refusal(d, job)
        ck.check(r.startswith("INVALID_ARGUMENT") and "alerts.webhooks[0].url" in r and
                 "--webhook-allow" in r, f"without --webhook-allow a job webhook is refused: {r}")
        if r.startswith("taken"):
            wait_state(d, r.split()[1], {"SUCCEEDED", "FAILED"}, timeout=60)
            time.sleep(1)
        ck.check(not received("/ssrf"), f"the loopback receiver got nothing "
                 f"({len(received('/ssrf'))} posts)")

    # ---- 2, 3, 4 with a policy -------------------------------------------------------------
    args = ["--webhook-allow", "127.0.0.1", "--webhook-allow", "localhost",
            "--webhook-secret-prefix", "ZT_JOB_HOOK_", "--webhook-secret-env", "ZT_OPERATOR_SECRET",
            "--webhook", hook + "/services/T0001/B0002/operator-path-token",
            "--webhook-attempts", "1"]
    with Daemon(BUILD, temp_dir("ztrain-hooks-"), max_ranks=1, extra_args=args) as d:
        base = tiny_job(d.data_root, max_steps=3)

        def with_hooks(*hooks):
            return dict(base, alerts={"webhooks": list(hooks)})

        r = refusal(d, with_hooks({"url": hook + "/lit", "on": ["end"]}))
        ck.check(r.startswith("INVALID_ARGUMENT") and "127.0.0.1" in r and "private" in r,
                 f"an allowed but loopback address is refused at submit: {r}")
        r = refusal(d, with_hooks({"url": "http://metadata.example:80/x"}))
        ck.check(r.startswith("INVALID_ARGUMENT") and "not among the hosts" in r,
                 f"a host not allowed is refused: {r}")
        msgs = {}
        for name in ("ZT_OPERATOR_SECRET", "HOME", "ZT_NOT_SET_ANYWHERE"):
            msgs[name] = refusal(d, with_hooks({"url": f"http://localhost:{port}/named",
                                                "secret_env": name}))
        ck.check(all(m.startswith("INVALID_ARGUMENT") and "secret_env" in m
                     for m in msgs.values()), f"secret_env outside the grant is refused: {msgs}")
        shapes = {m.replace(n, "NAME") for n, m in msgs.items()}
        ck.check(len(shapes) == 1, f"set and unset names get the same answer: {shapes}")

        j = submit(d, with_hooks({"url": f"http://localhost:{port}/named",
                                  "secret_env": "ZT_JOB_HOOK_A", "on": ["end"]}))
        ck.check(bool(j.id), "a granted secret_env on an allowed name is taken")
        wait_state(d, j.id, {"SUCCEEDED", "FAILED"}, timeout=60)
        deadline = time.monotonic() + 20
        rows = []
        while time.monotonic() < deadline:
            rows = deliveries(d, j.id)
            if {x["outcome"] for x in rows} >= {"failed", "delivered"}:
                break
            time.sleep(0.2)
        job_rows = [x for x in rows if "/named" in x["url"]]
        ck.check(job_rows and all(x["outcome"] == "failed" and "loopback" in x["error"]
                                  for x in job_rows),
                 f"localhost resolves to loopback: each attempt is refused: {job_rows}")
        ck.check(not received("/named"), "the job's receiver got nothing")
        op_rows = [x for x in rows if x not in job_rows]
        ck.check(op_rows and all(x["url"] == hook for x in op_rows) and
                 "operator-path-token" not in json.dumps(rows) and "/services" not in
                 json.dumps(rows), f"the operator's URL is listed without its path: "
                 f"{[x['url'] for x in rows]}")
        ck.check(any(x["outcome"] == "delivered" for x in op_rows) and received("/services/"),
                 "the operator's hook itself is still delivered to its full URL")

# ---- 5. quotas and fairness ----------------------------------------------------------------
args = ["--webhook", hook + "/operator", "--webhook-attempts", "1"]
if not OLD:
    args += ["--webhook-allow", "127.0.0.1", "--webhook-allow-private"]
tmp = temp_dir("ztrain-hooks-")
with Daemon(BUILD, tmp, max_ranks=2, extra_args=args) as d:
    a = tiny_job(d.data_root, name="noisy", max_steps=2000)
    a["events"] = {"loss_spike": {"zscore": 1e-6, "window": 2, "policy": "record"}}
    a["alerts"] = {"webhooks": [{"url": f"{silent_url}/h{i}", "on": ["event", "end"]}
                                for i in range(16)]}
    ja = submit(d, a)
    wait_step(d, ja.id, 400, timeout=120)
    jb = submit(d, tiny_job(d.data_root, name="quiet", max_steps=5))
    wait_state(d, jb.id, {"SUCCEEDED", "FAILED"}, timeout=120)
    ends = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ends:
        ends = [json.loads(b) for p, h, b in received("/operator")
                if h.get("X-Ztrain-Event") == "job.end" and json.loads(b)["job"]["id"] == jb.id]
        time.sleep(0.2)
    b_rows = [x for x in deliveries(d, jb.id) if x["type"] == "job.end"]
    ck.check(len(ends) == 1, f"the operator's hook got job B's job.end while job A floods: "
             f"{[(x['outcome'], x['error']) for x in b_rows]}")
    wait_state(d, ja.id, {"SUCCEEDED", "FAILED"}, timeout=300)
    db = sqlite3.connect(os.path.join(d.state_dir, "ztraind.db"))
    n_anom = db.execute("SELECT COUNT(*) FROM anomalies WHERE job_id = ?", (ja.id,)).fetchone()[0]
    n_del = db.execute("SELECT COUNT(*) FROM webhook_deliveries WHERE job_id = ?",
                       (ja.id,)).fetchone()[0]
    db.close()
    ck.check(0 < n_anom <= 1000, f"job A's anomaly rows are bounded: {n_anom}")
    ck.check(0 < n_del <= 2000, f"job A's delivery rows are bounded: {n_del}")
silent.close()
ck.done()
