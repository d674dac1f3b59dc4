"""The load of issue 19's load test, shared by tests/soak/test_soak.py (which asserts on it) and
bench/bench_soak.py (which prints figures): one running training job watched from step 0 by 200
clients (grpcio WatchJob streams and Server-Sent Events), 1,000 jobs submitted behind it and
listed page by page, /metrics scraped every second and GetJob timed throughout.

The watchers and the GetJob prober run in child processes (this file run as a script), so that
the watchers' Python and the submitting thread do not stall the timed calls on one GIL; on 2 cores
they still compete with the daemon and the job for the CPU, as clients on the same host would.

    /usr/bin/python3 load.py watch --grpc-addr H:P --http-port P --job ID --grpc N --sse M --out F
    /usr/bin/python3 load.py probe --grpc-addr H:P --job ID --out F     (until stdin closes)"""
import argparse
import http.client
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
import api_view  # noqa: E402
import svc  # noqa: E402

# Streams of one gRPC connection: the watchers are spread over several, as separate clients are.
STREAMS_PER_CHANNEL = 25
# SSE watchers connect from several loopback addresses, so that a per-address connection cap
# meant for one misbehaving client does not decide how many dashboards may watch.
SSE_SOURCES = [f"127.0.0.{i}" for i in range(2, 7)]


def load_job(data_root, name="watched", log_interval=20):
    """The watched job: a 2-layer GPT-2 with n_embd 64, block 64 and micro-batch 4 (a few ms a
    step on one core, a record every `log_interval` steps) that runs until it is cancelled."""
    job = svc.tiny_job(data_root, name=name, max_steps=svc.LONG, log_interval=log_interval)
    job["model"].update(n_embd=64, block_size=64)
    job["deepspeed"]["train_micro_batch_size_per_gpu"] = 4
    return job


def queued_job(data_root, i):
    """One of the 1,000: a valid 1-layer job that waits behind the watched one (--max-ranks 1)."""
    job = svc.tiny_job(data_root, name=f"load-{i:04d}", max_steps=10)
    job["model"]["n_layer"] = 1
    return job


def percentile(values, q):
    """The q-quantile (0..1) of values by the nearest-rank rule; NaN for none."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# ---- in the test's process -------------------------------------------------------------------

def cpu_seconds(pid):
    """User plus system CPU time a live process has used so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child(args, nice=0):
    """This file run as a child process; `nice` above 0 makes it yield the CPU like a client on
    another machine would."""
    return subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, ZTRAIN_BUILD=svc.BUILD, ZTRAIN_SOURCE=svc.SOURCE),
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)


class Watchers:
    """`grpc` WatchJob streams and `sse` event streams on one job, from step 0, in `procs` child
    processes. start() returns once every stream has its first event; join() returns the
    results of every watcher once the job has ended (see _watch_main for their shape)."""

    def __init__(self, d, job_id, tmpdir, grpc=150, sse=50, procs=4, nice=0):
        self.d, self.job_id, self.tmpdir, self.nice = d, job_id, tmpdir, nice
        def share(n, i):
            return n * (i + 1) // procs - n * i // procs
        self.plan = [(share(grpc, i), share(sse, i)) for i in range(procs)
                     if (share(grpc, i), share(sse, i)) != (0, 0)]
        self.children = []

    def start(self, timeout=120):
        for i, (g, s) in enumerate(self.plan):
            out = os.path.join(self.tmpdir, f"watch-{i}.json")
            p = _child(["watch", "--grpc-addr", self.d.grpc_addr, "--http-port",
                        str(self.d.http_port), "--job", self.job_id, "--grpc", str(g),
                        "--sse", str(s), "--out", out], self.nice)
            self.children.append((p, out))
        deadline = time.monotonic() + timeout
        for p, _ in self.children:
            line = _readline(p, deadline)
            if line.strip() != "ready":
                raise RuntimeError(f"a watcher process did not get ready: {line!r}")

    def join(self, timeout=120):
        results = []
        deadline = time.monotonic() + timeout
        for p, out in self.children:
            try:
                p.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.returncode == 0 and os.path.exists(out):
                with open(out) as f:
                    results.append(json.load(f))
            else:
                results.append({"distinct": [], "watchers": [], "exit": p.returncode})
        return results

    def pids(self):
        return [p.pid for p, _ in self.children]

    def kill(self):
        for p, _ in self.children:
            if p.poll() is None:
                p.kill()
                p.wait()


def _readline(p, deadline):
    """A line of a child's stdout, or "" when it ends or the deadline passes first."""
    got = []
    t = threading.Thread(target=lambda: got.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    return got[0] if got else ""


class Prober:
    """GetJob of one job in a loop (every `interval` s) in a child process, from start() to
    stop(), which returns each call's latency in ms and the number of failed calls."""

    def __init__(self, d, job_id, tmpdir, interval=0.01, nice=0):
        self.nice = nice
        self.out = os.path.join(tmpdir, "probe.json")
        self.args = ["probe", "--grpc-addr", d.grpc_addr, "--job", job_id, "--interval",
                     str(interval), "--out", self.out]
        self.p = None

    def start(self):
        self.p = _child(self.args, self.nice)
        if _readline(self.p, time.monotonic() + 60).strip() != "ready":
            raise RuntimeError("the GetJob prober did not start")

    def stop(self):
        self.p.stdin.close()
        self.p.wait(60)
        with open(self.out) as f:
            r = json.load(f)
        return r["ms"], r["failed"]


class Scraper(threading.Thread):
    """GET /metrics once a second until stop(); keeps each scrape's status, latency (ms) and the
    value of `ztrain_jobs{state="queued"}`."""

    def __init__(self, d):
        super().__init__(daemon=True)
        self.url = d.http_url + "/metrics"
        self.scrapes = []
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            t = time.perf_counter()
            status, queued = 0, None
            try:
                with urllib.request.urlopen(self.url, timeout=30) as r:
                    status, text = r.status, r.read().decode()
                for line in text.splitlines():
                    if line.lower().startswith('ztrain_jobs{state="queued"}'):
                        queued = int(float(line.split()[-1]))
            except Exception:  # noqa: BLE001 - a failed scrape is counted, not fatal
                pass
            ms = (time.perf_counter() - t) * 1e3
            self.scrapes.append({"status": status, "ms": ms, "queued": queued})
            self._halt.wait(max(0.0, 1.0 - ms / 1e3))

    def stop(self):
        self._halt.set()
        self.join(60)
        return self.scrapes


def submit_many(d, n):
    """Submits n queued_job()s one after another; returns their ids and each call's ms."""
    pb = svc.stubs()[0]
    stub = d.stub()
    ids, ms = [], []
    for i in range(n):
        req = pb.SubmitJobRequest(spec=svc.spec_proto(queued_job(d.data_root, i)))
        t = time.perf_counter()
        ids.append(stub.SubmitJob(req, metadata=d.metadata, timeout=30).id)
        ms.append((time.perf_counter() - t) * 1e3)
    return ids, ms


def list_grpc(d, page_size, state=0):
    """Every job ListJobs returns, page by page: (ids in the order served, pages)."""
    pb = svc.stubs()[0]
    ids, pages, token = [], 0, ""
    while True:
        r = d.stub().ListJobs(pb.ListJobsRequest(state=state, page_size=page_size,
                                                 page_token=token), metadata=d.metadata, timeout=30)
        ids += [j.id for j in r.jobs]
        pages += 1
        token = r.next_page_token
        if not token or pages > 10_000:
            return ids, pages


def list_http(d, limit):
    """The same through GET /api/v1/jobs?page_size=&page_token=."""
    ids, pages, after = [], 0, ""
    while True:
        url = (f"{d.http_url}/api/v1/jobs?page_size={limit}" +
               (f"&page_token={after}" if after else ""))
        with urllib.request.urlopen(url, timeout=30) as r:
            page = json.loads(r.read())
        ids += [j["id"] for j in page.get("jobs", [])]
        pages += 1
        after = page.get("nextPageToken") or None
        if not after or pages > 10_000:
            return ids, pages


# ---- in the child processes ------------------------------------------------------------------

def _grpc_watch(stub, pb, job_id, first):
    """One WatchJob stream from step 0 to its end: records as (step, {key: value}). `first` is
    set at the first event, or when the stream ends without one."""
    w = {"kind": "grpc", "states": [], "records": [], "code": None, "error": None}
    try:
        for ev in stub.WatchJob(pb.WatchJobRequest(id=job_id, since_step=0), timeout=600):
            kind = ev.WhichOneof("event")
            if kind == "job":
                w["states"].append(pb.JobState.Name(ev.job.state).replace("JOB_STATE_", ""))
                first.set()
            elif kind == "metrics":
                w["records"].append([ev.metrics.step,
                                     {v.key: v.value for v in ev.metrics.values}])
        w["code"] = "OK"
    except Exception as e:  # noqa: BLE001 - reported to the test
        w["code"] = str(getattr(e, "code", lambda: "?")())
        w["error"] = repr(e)[:500]
    finally:
        first.set()
    return w


def _sse_watch(port, source, job_id, first):
    """One event stream from step 0 to its end, read line by line as EventSource would; `first`
    as for _grpc_watch."""
    w = {"kind": "sse", "states": [], "records": [], "code": None, "error": None}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600,
                                       source_address=(source, 0))
        c.request("GET", f"/api/v1/jobs/{job_id}/events?since_step=0")
        r = c.getresponse()
        w["code"] = str(r.status)
        name, data = "message", []
        while r.status == 200:
            line = r.readline()
            if not line:
                break
            line = line.decode("utf-8").rstrip("\n")
            if line == "":
                if data and name == "job":
                    w["states"].append(api_view.job(json.loads("\n".join(data)))["state"])
                    first.set()
                elif data and name == "metrics":
                    rec = api_view.record(json.loads("\n".join(data)))
                    w["records"].append([rec["step"], rec["values"]])
                name, data = "message", []
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        c.close()
    except Exception as e:  # noqa: BLE001 - reported to the test
        w["error"] = repr(e)[:500]
    finally:
        first.set()
    return w


def _watch_main(a):
    """Writes {"distinct": [records lists], "watchers": [{kind, states, code, error,
    records: index into distinct}]}: watchers that saw the same records share one list."""
    import grpc
    pb, rpc = svc.stubs()[:2]
    n = a.grpc + a.sse
    firsts = [threading.Event() for _ in range(n)]
    results = [None] * n
    threads = []
    channels = [grpc.insecure_channel(a.grpc_addr, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range((a.grpc + STREAMS_PER_CHANNEL - 1) // STREAMS_PER_CHANNEL)]
    for i in range(n):
        if i < a.grpc:
            stub = rpc.TrainerStub(channels[i // STREAMS_PER_CHANNEL])
            fn = (lambda i=i, stub=stub: results.__setitem__(
                i, _grpc_watch(stub, pb, a.job, firsts[i])))
        else:
            src = SSE_SOURCES[i % len(SSE_SOURCES)]
            fn = (lambda i=i, src=src: results.__setitem__(
                i, _sse_watch(a.http_port, src, a.job, firsts[i])))
        t = threading.Thread(target=fn, daemon=True)
        t.start()
        threads.append(t)
    for f in firsts:
        f.wait()
    print("ready", flush=True)
    for t in threads:
        t.join()
    distinct, keyed = [], {}
    for w in results:
        key = json.dumps(w["records"])
        if key not in keyed:
            keyed[key] = len(distinct)
            distinct.append(w["records"])
        w["records"] = keyed[key]
    with open(a.out, "w") as f:
        json.dump({"distinct": distinct, "watchers": results}, f)
    for ch in channels:
        ch.close()


def _probe_main(a):
    pb = svc.stubs()[0]
    import grpc
    stub = svc.stubs()[1].TrainerStub(grpc.insecure_channel(a.grpc_addr))
    req = pb.GetJobRequest(id=a.job)
    stub.GetJob(req, timeout=30)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("ready", flush=True)
    ms, failed = [], 0
    while not stop.is_set():
        t = time.perf_counter()
        try:
            stub.GetJob(req, timeout=30)
            ms.append((time.perf_counter() - t) * 1e3)
        except Exception:  # noqa: BLE001 - counted
            failed += 1
        stop.wait(a.interval)
    with open(a.out, "w") as f:
        json.dump({"ms": ms, "failed": failed}, f)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watch")
    w.add_argument("--grpc-addr", required=True)
    w.add_argument("--http-port", type=int, required=True)
    w.add_argument("--job", required=True)
    w.add_argument("--grpc", type=int, default=0)
    w.add_argument("--sse", type=int, default=0)
    w.add_argument("--out", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--grpc-addr", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--interval", type=float, default=0.01)
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    _watch_main(a) if a.cmd == "watch" else _probe_main(a)


if __name__ == "__main__":
    main()
