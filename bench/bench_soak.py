"""What issue 19's load costs a training job and what it costs ztraind: the load of
`make test-soak` (tests/soak/load.py: 150 grpcio WatchJob and 50 SSE watchers from step 0,
1,000 jobs submitted behind the job and paged through by ListJobs and GET /api/v1/jobs, /metrics
scraped every second, GetJob timed from another process) next to unloaded runs of the same job.

    /usr/bin/python3 bench/bench_soak.py [--build build] [--seconds 30] [--jobs 1000]
                                         [--grpc 150] [--sse 50] [--log-interval 20]
                                         [--rounds 1] [--client-nice 0]

Runs alternate, each on a fresh ztraind (--max-ranks 1, --threads-per-rank 1): unloaded, then
--rounds times loaded and unloaded. In each the job (a 2-layer GPT-2, n_embd 64, block 64,
micro-batch 4, a record every --log-interval steps) trains for --seconds after it has started;
GetJob is timed throughout (every 10 ms, in a child process), and afterwards 100 SubmitJob calls
are timed in the unloaded runs for reference. Printed per run: the job's step speed (mean
perf/tokens_per_second of the records in the window, the first second left out) and steps per
wall-clock second, steps per CPU second the rank got (what the job did with the CPU it had, which
other processes on a shared machine do not change), ztraind's peak RSS, GetJob and SubmitJob
p50/p99, and the CPU (in cores) that the rank, ztraind and the clients used in the window; then
the ratio of the loaded
runs' mean speed to the unloaded runs'. Figures, not assertions: the test asserts. On 2 shared
cores the clients (Python) compete with the job and the daemon for the CPU, so the ratio
measures that competition too; --client-nice 19 makes the watchers yield as clients on other
machines would (the GetJob prober and the submitting process keep normal priority)."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "service"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "soak"))
import api_view  # noqa: E402
import load  # noqa: E402
import svc  # noqa: E402


def records(d, job_id):
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}/records?since_step=0",
                                timeout=60) as r:
        return api_view.view("/api/v1/jobs/x/records", json.loads(r.read()))["records"]


def speed(recs, t0_ms, t1_ms):
    """Mean perf/tokens_per_second and steps per wall-clock second of the records stamped in
    [t0, t1)."""
    inside = [r for r in recs if t0_ms <= r["time_unix_ms"] < t1_ms]
    tps = [r["values"]["perf/tokens_per_second"] for r in inside
           if r["values"].get("perf/tokens_per_second") is not None]
    if len(inside) < 2:
        return float("nan"), float("nan")
    steps = inside[-1]["step"] - inside[0]["step"]
    wall = (inside[-1]["time_unix_ms"] - inside[0]["time_unix_ms"]) / 1e3
    return statistics.mean(tps), steps / wall


def lat(ms):
    return f"{load.percentile(ms, 0.5):7.2f} {load.percentile(ms, 0.99):8.2f}"


def run(args, loaded):
    """One run; returns its figures."""
    pb = svc.stubs()[0]
    with tempfile.TemporaryDirectory(prefix="ztrain-bench-soak-") as tmp:
        d = svc.Daemon(args.build, tmp, max_ranks=1, extra_args=["--max-jobs",
                                                                 str(args.jobs + 110)])
        watchers = None
        try:
            job = svc.wait_step(d, svc.submit(d, load.load_job(d.data_root,
                                                            log_interval=args.log_interval)).id,
                                3 * args.log_interval)
            out = {"loaded": loaded}
            if loaded:
                watchers = load.Watchers(d, job.id, tmp, grpc=args.grpc, sse=args.sse,
                                         nice=args.client_nice)
                watchers.start()
                scraper = load.Scraper(d)
                scraper.start()
            prober = load.Prober(d, job.id, tmp)
            prober.start()
            clients = (watchers.pids() if watchers else []) + [prober.p.pid]
            procs = {"rank": [job.ranks[0].pid], "ztraind": [d.proc.pid], "clients": clients}
            cpu0 = {k: sum(load.cpu_seconds(p) for p in v) for k, v in procs.items()}
            cpu0["clients"] += time.process_time()
            t0 = time.time()
            if loaded:
                ids, out["submit"] = load.submit_many(d, args.jobs)
                t = time.perf_counter()
                listed, _ = load.list_grpc(d, 100)
                out["list_s"] = time.perf_counter() - t
                out["listed"] = len(set(listed))
            time.sleep(max(0.0, args.seconds - (time.time() - t0)))
            t1 = time.time()
            cpu1 = {k: sum(load.cpu_seconds(p) for p in v) for k, v in procs.items()}
            cpu1["clients"] += time.process_time()
            out["cores"] = {k: (cpu1[k] - cpu0[k]) / (t1 - t0) for k in procs}
            out["getjob"], out["getjob_failed"] = prober.stop()
            if loaded:
                out["scrapes"] = scraper.stop()
                for i in ids:
                    d.stub().CancelJob(pb.CancelJobRequest(id=i), metadata=d.metadata)
            else:
                ids, out["submit"] = load.submit_many(d, 100)
                for i in ids:
                    d.stub().CancelJob(pb.CancelJobRequest(id=i), metadata=d.metadata)
            d.stub().CancelJob(pb.CancelJobRequest(id=job.id), metadata=d.metadata)
            end = svc.wait_state(d, job.id, svc.TERMINAL, timeout=120)
            if loaded:
                res = watchers.join(timeout=300)
                want = len(svc.read_metrics(os.path.join(end.run_dir, "metrics.jsonl")))
                seen = [len(r["distinct"][w["records"]]) for r in res for w in r["watchers"]]
                out["watchers"] = (len(seen), sum(1 for n in seen if n == want), want)
            out["tps"], out["steps_s"] = speed(records(d, job.id), int(t0 * 1000) + 1000,
                                               int(t1 * 1000))
            out["steps_cpu"] = out["steps_s"] / out["cores"]["rank"]
            out["rss_mib"] = d.peak_rss_kib() / 1024
        finally:
            if watchers:
                watchers.kill()
            d.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--grpc", type=int, default=150)
    ap.add_argument("--sse", type=int, default=50)
    ap.add_argument("--log-interval", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--client-nice", type=int, default=0,
                    help="run the watcher processes niced, approximating clients elsewhere")
    args = ap.parse_args()
    runs = [run(args, False)]
    for _ in range(args.rounds):
        runs += [run(args, True), run(args, False)]
    niced = f", watchers at nice {args.client_nice}" if args.client_nice else ""
    print(f"ztraind under load: {args.grpc} WatchJob + {args.sse} SSE watchers, {args.jobs} jobs "
          f"submitted and listed, /metrics every second; {args.seconds:.0f} s a run "
          f"({os.cpu_count()} CPUs{niced})")
    print(f"{'run':<10} {'tokens/s':>9} {'steps/s':>8} {'/CPU s':>7} {'peak RSS':>9} "
          f"{'GetJob p50/p99 ms':>18} {'SubmitJob p50/p99 ms':>21}  cores: rank, ztraind, clients")
    for r in runs:
        failed = f"  ({r['getjob_failed']} GetJob failed)" if r["getjob_failed"] else ""
        cores = r["cores"]
        print(f"{'loaded' if r['loaded'] else 'unloaded':<10} {r['tps']:9.0f} {r['steps_s']:8.1f} "
              f"{r['steps_cpu']:7.1f} {r['rss_mib']:6.1f} MiB {lat(r['getjob']):>18} "
              f"{lat(r['submit']):>21}  "
              f"{cores['rank']:.2f} {cores['ztraind']:.2f} {cores['clients']:.2f}{failed}")
    idle = [r for r in runs if not r["loaded"]]
    busy = [r for r in runs if r["loaded"]]
    for name, key in (("step speed (perf/tokens_per_second)", "tps"),
                      ("wall-clock steps/s", "steps_s"),
                      ("steps per CPU second of the rank", "steps_cpu")):
        base = statistics.mean(r[key] for r in idle)
        high = statistics.mean(r[key] for r in busy)
        print(f"{name}: unloaded {base:.0f}, loaded {high:.0f}, ratio {high / base:.3f}")
    for b in busy:
        scr = [s["ms"] for s in b["scrapes"]]
        n, full, want = b["watchers"]
        print(f"loaded run: {len(b['getjob'])} GetJob calls; ListJobs of {b['listed']} jobs in "
              f"pages of 100: {b['list_s'] * 1e3:.0f} ms; {len(scr)} scrapes of /metrics, p50 "
              f"{load.percentile(scr, 0.5):.0f} ms, max {max(scr):.0f} ms; {full} of {n} "
              f"watchers saw all {want} records")


if __name__ == "__main__":
    main()
