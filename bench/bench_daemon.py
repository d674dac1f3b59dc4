"""ztraind itself under load, side by side with an idle daemon (issue 34): GetJob and ListJobs
latency (p50/p99) and ztraind's resident memory, with and without 1,000 queued jobs, 200 watchers
(grpcio WatchJob streams from step 0) and 50 event streams (Server-Sent Events from step 0).

    /usr/bin/python3 bench/bench_daemon.py [--build build] [--jobs 1000] [--grpc 200] [--sse 50]
                                           [--calls 300] [--settle 10]

Both runs use a fresh ztraind (--max-ranks 1, --threads-per-rank 1) with one running job (the
watched one: tests/soak/load.py's, a record every 20 steps). The idle run times --calls GetJob and
--calls ListJobs (page_size 100, first page) from this process, one after another; the loaded run
first submits --jobs jobs (which queue behind the running one), starts the watchers in child
processes (tests/soak/load.py) and a /metrics scrape every second, waits --settle seconds for the
replays to be sent, then times the same calls. ztraind's VmRSS is read after the calls, VmHWM at
the end. Figures, not assertions: tests/soak/test_soak.py asserts on the same load."""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "service"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "soak"))
import load  # noqa: E402
import svc  # noqa: E402


def vm(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn, n):
    ms = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return ms


def run(args, loaded):
    pb = svc.stubs()[0]
    with tempfile.TemporaryDirectory(prefix="ztrain-bench-daemon-") as tmp:
        d = svc.Daemon(args.build, tmp, max_ranks=1,
                       extra_args=["--max-jobs", str(args.jobs + 10)])
        watchers = scraper = None
        out = {"loaded": loaded}
        try:
            job = svc.wait_step(d, svc.submit(d, load.load_job(d.data_root)).id, 60)
            if loaded:
                _, out["submit_ms"] = load.submit_many(d, args.jobs)
                watchers = load.Watchers(d, job.id, tmp, grpc=args.grpc, sse=args.sse)
                watchers.start()
                scraper = load.Scraper(d)
                scraper.start()
                time.sleep(args.settle)
            stub = d.stub()
            out["get"] = timed(lambda: stub.GetJob(pb.GetJobRequest(id=job.id), timeout=30),
                               args.calls)
            out["list"] = timed(lambda: stub.ListJobs(pb.ListJobsRequest(page_size=100),
                                                      timeout=30), args.calls)
            out["rss"] = vm(d.proc.pid, "VmRSS")
            out["queued"] = len(load.list_grpc(d, 1000, pb.JOB_STATE_QUEUED)[0])
            if scraper:
                s = scraper.stop()
                out["scrapes"] = (len(s), sum(1 for x in s if x["status"] == 200))
            d.stub().CancelJob(pb.CancelJobRequest(id=job.id), timeout=30)
            out["hwm"] = vm(d.proc.pid, "VmHWM")
        finally:
            if watchers:
                watchers.kill()
            d.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--grpc", type=int, default=200)
    ap.add_argument("--sse", type=int, default=50)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--settle", type=float, default=10)
    args = ap.parse_args()
    idle, busy = run(args, False), run(args, True)
    pct = load.percentile
    print(f"{'':34} {'idle':>12} {'loaded':>12}")
    print(f"{'queued jobs':34} {idle['queued']:12d} {busy['queued']:12d}")
    print(f"{'watchers (gRPC + SSE)':34} {0:12d} {args.grpc + args.sse:12d}")
    for k, name in (("get", "GetJob"), ("list", "ListJobs (page of 100)")):
        for q in (0.5, 0.99):
            print(f"{name + f' p{int(q * 100)} ms':34} {pct(idle[k], q):12.2f} "
                  f"{pct(busy[k], q):12.2f}")
    print(f"{'ztraind VmRSS MiB':34} {idle['rss']:12.1f} {busy['rss']:12.1f}")
    print(f"{'ztraind VmHWM MiB':34} {idle['hwm']:12.1f} {busy['hwm']:12.1f}")
    print(f"SubmitJob while queueing {args.jobs}: p50 {pct(busy['submit_ms'], 0.5):.2f} ms, "
          f"p99 {pct(busy['submit_ms'], 0.99):.2f} ms; /metrics scrapes ok "
          f"{busy['scrapes'][1]}/{busy['scrapes'][0]}")


if __name__ == "__main__":
    main()
