"""Latency of ztraind's gRPC API as a Python grpcio client sees it: GetJob, ListJobs and SubmitJob,
p50/p99 over N sequential calls each, against a live ztraind started for the run.

    /usr/bin/python3 bench/bench_grpc.py [--build build] [--calls 1000] [--token]

The daemon gets --max-ranks 1 and a long-running "blocker" job first, so every benchmarked
SubmitJob is a real, valid tiny job that is validated, stored (SQLite) and queued, but never
starts; all of them are cancelled afterwards (CancelJob latency is reported too). --token turns
on bearer-token checking to show what it costs. Calls are sequential on one channel, so the
figures are round trips, not throughput.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "service"))
import svc  # noqa: E402


def timed(n, call):
    """Milliseconds of each of n calls."""
    out = []
    for i in range(n):
        t = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def row(name, ms):
    ms = sorted(ms)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return (f"{name:<12} {len(ms):>6} {statistics.mean(ms):>9.3f} {p(0.50):>9.3f} {p(0.99):>9.3f} "
            f"{ms[-1]:>9.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--token", action="store_true")
    args = ap.parse_args()
    pb = svc.stubs()[0]
    with tempfile.TemporaryDirectory(prefix="ztrain-bench-grpc-") as tmp:
        d = svc.Daemon(args.build, tmp, max_ranks=1, token="bench-token" if args.token else None,
                       extra_args=["--max-jobs", str(args.calls + 10)])
        try:
            stub, md = d.stub(), d.metadata
            blocker = svc.submit(d, svc.tiny_job(d.data_root, name="blocker", max_steps=10**9,
                                                 log_interval=1000))
            svc.wait_state(d, blocker.id, {"RUNNING"})
            spec = svc.spec_proto(svc.tiny_job(d.data_root, name="queued", max_steps=10))
            for _ in range(50):  # warm the channel and the server's caches
                stub.GetJob(pb.GetJobRequest(id=blocker.id), metadata=md)
            get = timed(args.calls, lambda i: stub.GetJob(pb.GetJobRequest(id=blocker.id),
                                                          metadata=md))
            ids = []
            submit = timed(args.calls, lambda i: ids.append(
                stub.SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=md).id))
            lst = timed(args.calls // 10, lambda i: stub.ListJobs(
                pb.ListJobsRequest(page_size=50), metadata=md))
            cancel = timed(len(ids), lambda i: stub.CancelJob(
                pb.CancelJobRequest(id=ids[i]), metadata=md))
            stub.CancelJob(pb.CancelJobRequest(id=blocker.id, force=True), metadata=md)
            queued = sum(1 for j in stub.ListJobs(pb.ListJobsRequest(state=pb.JOB_STATE_QUEUED),
                                                  metadata=md).jobs)
        finally:
            d.stop()
    print(f"ztraind gRPC latency, Python grpcio client, sequential calls on one channel"
          f"{', bearer token' if args.token else ''} ({os.cpu_count()} CPUs)")
    print(f"{'call':<12} {'n':>6} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    print(row("GetJob", get))
    print(row("SubmitJob", submit))
    print(row("ListJobs/50", lst))
    print(row("CancelJob", cancel))
    if queued:
        print(f"warning: {queued} jobs were still queued at the end")


if __name__ == "__main__":
    main()
