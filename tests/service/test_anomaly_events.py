"""Anomaly events and webhooks through ztraind, with real clients.

One job's step 3 has NaN gradients (ZTRAIN_INJECT_NAN_GRAD, handed to the ranks) and its step 12
a batch of random bytes (a loss spike); both have the policy "skip". Each event must reach
WatchJob (JobEvent.anomaly), the SSE stream (event: anomaly) and /api/v1/jobs/{id}/anomalies,
and the job must succeed with 2 skipped steps. Another job is stopped with SIGSTOP: ztraind must
report a stall over the same three paths. Webhooks go to a receiver on loopback (http.server):
the job's own (signed with a secret from ztraind's environment: the X-Ztrain-Signature must be
the HMAC-SHA256 computed here) succeeds on the third attempt after two 500s, one that always
fails is given up after --webhook-attempts, the daemon's --webhook gets everything; every
attempt is listed at /api/v1/jobs/{id}/webhooks; no body holds the token or the secret.

Resuming repeats nothing: the SSE id of a metrics or anomaly event is "<record seq>:<anomaly
seq>" (computed here from the events' own seqs); a stream cut after a record or after the first
event (of the finished job, and live at submission) and resumed with its Last-Event-ID gives every
record and every event once; ?after_seq=&after_anomaly_seq= and WatchJob's after_seq and
after_anomaly_seq give only what follows them (after_seq alone: every event, as before); a bare
number as Last-Event-ID is an old step id and resumes at the next step."""
import hashlib
import hmac
import http.client
import http.server
import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import grpc
from api_view import anomaly, view  # noqa: E402
from svc import (BUILD, LONG, TEXT, Checker, Daemon, get_job, state_name, stubs, submit,
                 tiny_job, wait_state, wait_step, write_data)

TOKEN = "tok-" + "7" * 24
SECRET = "hook-secret-" + "5" * 16
ck = Checker()


class Receiver(http.server.BaseHTTPRequestHandler):
    """Records every POST; /flaky answers 500 to the first two attempts of its first delivery,
    /dead to every one."""
    seen = []
    counts = {}
    first = None
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = self.path.split("?")[0]
        delivery = self.headers.get("X-Ztrain-Delivery")
        with Receiver.lock:
            if path == "/flaky" and Receiver.first is None:
                Receiver.first = delivery
            n = Receiver.counts.get(delivery, 0) + 1
            Receiver.counts[delivery] = n
            Receiver.seen.append((path, dict(self.headers), body))
        fail = path == "/dead" or (path == "/flaky" and delivery == Receiver.first and n <= 2)
        self.send_response(500 if fail else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def sse_reader(d, job_id, out, stop):
    """Collects the data of every `event: anomaly` of the job's stream into out."""
    req = urllib.request.Request(f"{d.http_url}/api/v1/jobs/{job_id}/events",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            kind = None
            for raw in r:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind == "anomaly":
                    out.append(anomaly(json.loads(line[6:])))
                if stop.is_set():
                    return
    except Exception as e:  # the stream ends with the job, or the test stops it
        out.append({"error": str(e)})


def read_events(d, job_id, query="", headers=None, stop=None):
    """[(event, data as JSON, id)] of the job's event stream, until it ends or stop(list) holds
    (then the connection is dropped, as a client that goes away)."""
    c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=60)
    c.request("GET", f"/api/v1/jobs/{job_id}/events?{query}",
              headers=dict(headers or {}, Authorization=f"Bearer {TOKEN}"))
    r = c.getresponse()
    out, name, data, eid = [], "message", None, None
    try:
        if r.status != 200:
            return [("status", r.status, json.loads(r.read() or b"null"))]
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line == "":
                if data is not None:
                    out.append((name, data, eid))
                    if stop and stop(out):
                        return out
                name, data, eid = "message", None, None
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif line.startswith("id: "):
                eid = line[4:]
        return out
    finally:
        c.close()


def seqs(events, kind):
    return [int(data["seq"]) for name, data, _ in events if name == kind]


def cursors(events):
    """The ids the stream must give its metrics and anomaly events: the seq of the last record,
    anomaly event and log line sent so far, "<record>:<anomaly>:<log>" (no log lines here)."""
    r = a = 0
    out = []
    for name, data, _ in events:
        if name == "metrics":
            r = int(data["seq"])
        elif name == "anomaly":
            a = int(data["seq"])
        if name in ("metrics", "anomaly"):
            out.append(f"{r}:{a}:0")
    return out


def check_resume(d, job_id, n_records, what, stop):
    """A stream cut where stop says and resumed with its Last-Event-ID gives every record and
    both anomaly events once, and ends with the job."""
    first = read_events(d, job_id, stop=stop)
    last = next((e[2] for e in reversed(first) if e[2]), None)
    rest = read_events(d, job_id, headers={"Last-Event-ID": last} if last else None)
    both = first + rest
    ck.check(seqs(both, "metrics") == list(range(1, n_records + 1)) and
             seqs(both, "anomaly") == [1, 2] and rest and rest[-1][0] == "job",
             f"SSE cut {what} (id {last}) and resumed with Last-Event-ID: records "
             f"{seqs(both, 'metrics')}, events {seqs(both, 'anomaly')}, each once")


def check_cursors(d, job_id, n_records):
    """The event stream's one cursor over records and anomaly events (docs/api.md)."""
    pb = stubs()[0]
    full = read_events(d, job_id)
    ids = [e[2] for e in full if e[0] in ("metrics", "anomaly")]
    ck.check(seqs(full, "anomaly") == [1, 2] and ids == cursors(full),
             f"SSE ids are <record seq>:<anomaly seq>:<log seq> ({ids[:2]} ... {ids[-3:]})")
    check_resume(d, job_id, n_records, "after record 5",
                 lambda evs: seqs(evs, "metrics")[-1:] == [5])
    check_resume(d, job_id, n_records, "after the first anomaly event",
                 lambda evs: seqs(evs, "anomaly") == [1])
    tail = read_events(d, job_id, query="after_seq=5&after_anomaly_seq=1")
    ck.check(seqs(tail, "metrics") == list(range(6, n_records + 1)) and
             seqs(tail, "anomaly") == [2],
             f"?after_seq=5&after_anomaly_seq=1: records {seqs(tail, 'metrics')[:2]}..., events "
             f"{seqs(tail, 'anomaly')}")
    bad = read_events(d, job_id, query="after_anomaly_seq=-1")
    ck.check(bad and bad[0][:2] == ("status", 400) and bad[0][2].get("field") ==
             "after_anomaly_seq", f"?after_anomaly_seq=-1 is 400 naming it: {bad[:1]}")
    # An id of the streams before these cursors was a record's step: it resumes at the next.
    records = http_get(d, f"/api/v1/jobs/{job_id}/records")["records"]
    old = read_events(d, job_id, headers={"Last-Event-ID": "5"})
    steps = [int(data["step"]) for name, data, _ in old if name == "metrics"]
    ck.check(steps == [int(r["step"]) for r in records if int(r["step"]) >= 6] and
             seqs(old, "anomaly") == [1, 2],
             f"an old step id (Last-Event-ID: 5) resumes at step 6: steps {steps[:3]}...")
    # The same cursors over gRPC.
    def watch(**kw):
        evs = list(d.stub().WatchJob(pb.WatchJobRequest(id=job_id, **kw), metadata=d.metadata,
                                     timeout=60))
        return ([e.metrics.seq for e in evs if e.WhichOneof("event") == "metrics"],
                [e.anomaly.seq for e in evs if e.WhichOneof("event") == "anomaly"])
    got = watch(after_seq=n_records, after_anomaly_seq=1)
    ck.check(got == ([], [2]), f"WatchJob after_seq={n_records}, after_anomaly_seq=1: {got}")
    got = watch(after_seq=5)
    ck.check(got == (list(range(6, n_records + 1)), [1, 2]),
             f"WatchJob after_seq=5 alone gives every event, as a first watch: {got}")
    try:
        watch(after_anomaly_seq=-1)
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    ck.check(code == "INVALID_ARGUMENT", f"WatchJob after_anomaly_seq=-1: {code}")


def http_get(d, path):
    req = urllib.request.Request(d.http_url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return view(path, json.loads(r.read()))


def watch_anomalies(d, job_id, until, timeout=90):
    """WatchJob's anomaly events, until `until(list)` holds or the stream ends."""
    pb = stubs()[0]
    got = []
    stream = d.stub().WatchJob(pb.WatchJobRequest(id=job_id), metadata=d.metadata,
                               timeout=timeout)
    try:
        for ev in stream:
            if ev.WhichOneof("event") == "anomaly":
                got.append(ev.anomaly)
                if until(got):
                    stream.cancel()
                    break
    except Exception as e:
        if "CANCELLED" not in str(e):
            ck.check(False, f"WatchJob: {e}")
    return got


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
hook = f"http://127.0.0.1:{server.server_address[1]}"

os.environ["ZTRAIN_INJECT_NAN_GRAD"] = "3"
os.environ["ZT_TEST_HOOK_SECRET"] = SECRET
# The receiver is on this host: the operator allows it by name and opens loopback to jobs.
POLICY = ["--webhook-allow", "127.0.0.1", "--webhook-allow-private",
          "--webhook-secret-prefix", "ZT_TEST_"]
with tempfile.TemporaryDirectory() as tmp:
    d = Daemon(BUILD, tmp, max_ranks=2, token=TOKEN,
               extra_args=["--webhook", hook + "/daemon", "--webhook-attempts", "3",
                           "--webhook-backoff-ms", "200"] + POLICY)
    with d:
        # Byte text with step 12's 2 × 33 bytes replaced by random ones.
        data = bytearray(TEXT)
        rnd = random.Random(5)
        for i in range(11 * 64, 12 * 64 + 1):
            data[i] = rnd.randrange(256)
        job = tiny_job(d.data_root, name="spiky", max_steps=16, data_name="spiky.txt",
                       deepspeed={"train_micro_batch_size_per_gpu": 2,
                                  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})
        write_data(d.data_root, "spiky.txt", bytes(data))
        job["data"]["shuffle"] = False
        job["events"] = {"nonfinite": {"policy": "skip"},
                         "loss_spike": {"zscore": 3, "window": 5, "policy": "skip"}}
        job["alerts"] = {"webhooks": [
            {"url": hook + "/flaky?key=abc", "secret_env": "ZT_TEST_HOOK_SECRET"},
            {"url": hook + "/dead", "on": ["end"]}]}
        j = submit(d, job)
        sse, stop = [], threading.Event()
        t = threading.Thread(target=sse_reader, args=(d, j.id, sse, stop), daemon=True)
        t.start()
        watched = watch_anomalies(d, j.id, lambda got: False)
        final = wait_state(d, j.id, {"SUCCEEDED", "FAILED"}, timeout=120)
        ck.check(state_name(final.state) == "SUCCEEDED", f"the job succeeds ({final.reason})")
        t.join(timeout=30)
        want = [("nonfinite", 3, "skip"), ("loss_spike", 12, "skip")]
        ck.check([(a.kind, a.step, a.policy) for a in watched] == want,
                 f"WatchJob: {[(a.kind, a.step, a.policy, a.message) for a in watched]}")
        ck.check([(a.get("kind"), a.get("step"), a.get("policy")) for a in sse] == want,
                 f"SSE: {sse}")
        listed = http_get(d, f"/api/v1/jobs/{j.id}/anomalies")["anomalies"]
        ck.check([(a["kind"], a["step"], a["policy"]) for a in listed] == want,
                 f"/anomalies: {listed}")
        ck.check([a["seq"] for a in listed] == [1, 2], "events are numbered per job")
        recs = http_get(d, f"/api/v1/jobs/{j.id}/records")["records"]
        ck.check(recs and recs[-1]["values"]["train/skipped_steps"] == 2, "two updates were skipped")
        # `ztrain watch` prints them too.
        env = {k: v for k, v in os.environ.items() if k != "ZTRAIN_SERVER"}
        env["ZTRAIN_TOKEN"] = TOKEN
        p = subprocess.run([os.path.join(BUILD, "ztrain"), "watch", j.id, "--server", d.grpc_addr],
                           capture_output=True, text=True, env=env, timeout=60)
        ck.check(f"{j.id}: event loss_spike: step 12: loss" in p.stdout,
                 f"ztrain watch prints the events: {p.stdout[-400:]} {p.stderr[-200:]}")
        # A watch that starts after the job ended is replayed the events too.
        again = watch_anomalies(d, j.id, lambda got: False)
        ck.check([(a.kind, a.step) for a in again] == [(k, s) for k, s, _ in want],
                 "a later WatchJob replays them")
        check_cursors(d, j.id, len(recs))
        # Live: a stream opened at submission, cut after the first event, resumed.
        j2 = submit(d, dict({k: v for k, v in job.items() if k != "alerts"}, name="spiky-live"))
        check_resume(d, j2.id, 16, "live, after the first anomaly event",
                     lambda evs: seqs(evs, "anomaly") == [1])
        wait_state(d, j2.id, {"SUCCEEDED", "FAILED"}, timeout=120)

        # Webhooks: wait for the retries to settle (200, 400 ms backoff; 3 attempts).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            deliveries = http_get(d, f"/api/v1/jobs/{j.id}/webhooks")["deliveries"]
            pending = [x for x in deliveries if x["outcome"] == "retrying"]
            done_ids = {x["delivery_id"] for x in deliveries if x["outcome"] != "retrying"}
            if len(done_ids) >= 7 and all(p["delivery_id"] in done_ids for p in pending):
                break
            time.sleep(0.2)
        by_url = {}
        for x in deliveries:
            by_url.setdefault(x["url"], []).append(x)
        flaky = by_url.get(hook + "/flaky", [])
        ck.check("key=abc" not in json.dumps(deliveries), "recorded URLs lose their query")
        first = [x for x in flaky if x["delivery_id"] == Receiver.first]
        ck.check([(x["attempt"], x["outcome"], x["http_status"]) for x in first] ==
                 [(1, "retrying", 500), (2, "retrying", 500), (3, "delivered", 200)],
                 f"the first delivery succeeds on the third attempt: {first}")
        types = sorted(x["type"] for x in flaky if x["outcome"] == "delivered")
        ck.check(types == ["job.end", "job.event", "job.event"], f"/flaky got {types}")
        dead = by_url.get(hook + "/dead", [])
        ck.check([(x["attempt"], x["outcome"]) for x in dead] ==
                 [(1, "retrying"), (2, "retrying"), (3, "failed")] and
                 all(x["type"] == "job.end" for x in dead),
                 f"/dead is given up after 3 attempts: {dead}")
        # The operator's URL is listed without its path (issue 34: services keep tokens there).
        daemon_types = sorted(x["type"] for x in by_url.get(hook, []))
        ck.check(daemon_types == ["job.end", "job.event", "job.event"],
                 f"the daemon's --webhook got {daemon_types}")
        with Receiver.lock:
            seen = list(Receiver.seen)
        flaky_posts = [(h, b) for p, h, b in seen if p == "/flaky"]
        ok_sig = all(h.get("X-Ztrain-Signature") == "sha256=" +
                     hmac.new(SECRET.encode(), b, hashlib.sha256).hexdigest()
                     for h, b in flaky_posts)
        ck.check(flaky_posts and ok_sig, f"{len(flaky_posts)} signed posts, each signature right")
        ck.check(all("X-Ztrain-Signature" not in h for p, h, b in seen if p == "/dead"),
                 "a webhook without secret_env is unsigned")
        ck.check(not any(TOKEN.encode() in b or SECRET.encode() in b for _, _, b in seen),
                 f"no body of {len(seen)} holds the token or the secret")
        event_body = next((json.loads(b) for p, h, b in seen
                           if p == "/daemon" and h.get("X-Ztrain-Event") == "job.event"), {})
        ck.check(event_body.get("job", {}).get("id") == j.id and
                 event_body.get("event", {}).get("kind") in ("nonfinite", "loss_spike"),
                 f"an event body names the job and the event: {event_body}")

        # Bad input is refused at submit, naming the key.
        bad = [({"webhooks": [{"url": "ftp://x"}]},
                "spec: key 'alerts.webhooks[0].url' must be an http:// or https:// URL"),
               ({"webhooks": [{"url": hook, "secret": "abc"}]},
                "spec: key 'alerts.webhooks[0].secret' is not accepted"),
               ({"webhooks": [{"url": hook, "secret_env": "ZT_TEST_UNSET_VAR"}]},
                "spec: key 'alerts.webhooks[0].secret_env' names \"ZT_TEST_UNSET_VAR\", which "
                "is not set in ztraind's environment"),
               ({"webhooks": [{"url": hook, "on": ["start"]}]},
                "spec: key 'alerts.webhooks[0].on' holds \"start\"")]
        for alerts, msg in bad:
            spec = dict(job, alerts=alerts)
            try:
                submit(d, spec)
                ck.check(False, f"{alerts} is refused")
            except Exception as e:
                ck.check("INVALID_ARGUMENT" in str(e) and msg in str(e), f"{msg}: {e}")
        try:
            submit(d, dict(job, events={"loss_spike": {"window": 1}}))
            ck.check(False, "events.loss_spike.window 1 is refused")
        except Exception as e:
            ck.check("key 'events.loss_spike.window' must be between 2 and 100000" in str(e),
                     f"a bad events section is refused: {e}")

        # A stall: ztraind sees that the stopped rank reports nothing.
        long = tiny_job(d.data_root, name="stalls", max_steps=LONG)
        # (The daemon hands ZTRAIN_INJECT_NAN_GRAD to every job: this one skips it too.)
        long["events"] = {"stall": {"seconds": 2}, "nonfinite": {"policy": "skip"}}
        s = submit(d, long)
        wait_step(d, s.id, 2)
        pid = get_job(d, s.id).ranks[0].pid
        sse2, stop2 = [], threading.Event()
        t2 = threading.Thread(target=sse_reader, args=(d, s.id, sse2, stop2), daemon=True)
        t2.start()
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        stalls = watch_anomalies(d, s.id, lambda got: any(a.kind == "stall" for a in got))
        waited = time.monotonic() - t0
        stall = next((a for a in stalls if a.kind == "stall"), None)
        ck.check(stall is not None and 2 <= waited < 10 and stall.value >= 2,
                 f"WatchJob: a stall after {waited:.1f} s ({stall.message if stall else None})")
        time.sleep(0.5)
        ck.check(any(a.get("kind") == "stall" for a in sse2), f"SSE: {sse2}")
        listed = http_get(d, f"/api/v1/jobs/{s.id}/anomalies")["anomalies"]
        ck.check([a["kind"] for a in listed if a["kind"] == "stall"] == ["stall"],
                 f"/anomalies: {listed}")
        os.kill(pid, signal.SIGCONT)
        stop2.set()
        d.stub().CancelJob(stubs()[0].CancelJobRequest(id=s.id, force=True), metadata=d.metadata)
        wait_state(d, s.id, {"CANCELLED"})
    errs = d.sanitizer_errors()
    ck.check(not errs, f"no sanitizer reports from the first daemon: {errs}")
    # Durable: a restarted daemon lists the events.
    with Daemon(BUILD, tmp, max_ranks=2, token=TOKEN) as d2:
        listed = http_get(d2, f"/api/v1/jobs/{j.id}/anomalies")["anomalies"]
        ck.check([a["kind"] for a in listed] == ["nonfinite", "loss_spike"],
                 "the events survive a daemon restart")
        errs = d2.sanitizer_errors()
        ck.check(not errs, f"no sanitizer reports: {errs}")
server.shutdown()
ck.done()
