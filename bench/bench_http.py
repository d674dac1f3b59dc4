"""What HTTP read load costs a training job: ztraind runs one long job while `wrk` hammers the
metrics endpoint the dashboard polls, in alternating phases (idle, load, idle, load, ...), and
the job's own perf/tokens_per_second records are averaged per phase.

    /usr/bin/python3 bench/bench_http.py [--build build] [--phase-seconds 10] [--phases 4]
                                         [--threads-per-rank 1] [--wrk-threads 1]
                                         [--connections 8] [--max-points 500]
                                         [--wrk-nice 0]

The job is a GPT-2 (n_layer 2, n_embd 64, block 64, micro-batch 4) logging every step, so that
the metrics history grows by hundreds of records a second and the endpoint thins a long series
(`/api/v1/jobs/{id}/metrics?keys=train/loss&max_points=500`). Before the first phase the job runs
until it has --warm-records records. Each phase's first second is left out of its average (the
transition). Printed: requests/s and latency from wrk for each load phase, tokens/s for each
phase, and the ratio of the load phases' mean to the idle phases' mean.

On a 2-core machine wrk and the server threads compete with the job for the cores; the ratio
then measures that competition as much as the server's own cost (locks held, pipe back-pressure
on the ranks). --threads-per-rank 1 leaves one core to the HTTP side; --wrk-nice 19 makes wrk
yield like a client on another machine would, leaving the server's own cost (ztraind runs its
connection threads at nice 10 for the same reason)."""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "service"))
import api_view  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MICRO_BATCH, BLOCK = 4, 64
TOKENS_PER_STEP = MICRO_BATCH * BLOCK
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief.\n" * 400)


def submit(grpc_addr, source, tmp):
    """The job, over gRPC with stubs generated from proto/ztrain.proto."""
    out = os.path.join(tmp, "stubs")
    os.makedirs(out)
    subprocess.run(["protoc", "-I" + os.path.join(source, "proto"), "-I/usr/include",
                    "--python_out=" + out,
                    "--grpc_out=" + out, "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
                    "ztrain.proto"], check=True)
    sys.path.insert(0, out)
    import grpc  # noqa: E402
    import ztrain_pb2 as pb  # noqa: E402
    import ztrain_pb2_grpc as pb_grpc  # noqa: E402
    spec = pb.JobSpec(name="bench-http", world_size=1, device="cpu",
                      model=pb.ModelSpec(type="gpt2", n_layer=2, n_head=2, n_embd=64,
                                         vocab_size=256, block_size=BLOCK),
                      data=pb.DataSpec(train="train.txt"),
                      train=pb.TrainOptions(max_steps=100_000_000, log_interval=1,
                                            warmup_steps=0),
                      deepspeed_json=json.dumps({"train_micro_batch_size_per_gpu": MICRO_BATCH,
                                                 "optimizer": {"type": "AdamW",
                                                               "params": {"lr": 1e-3}}}))
    stub = pb_grpc.TrainerStub(grpc.insecure_channel(grpc_addr))
    return stub.SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=30).id


def get_json(base, path):
    """The route's body as plain values (tests/service/api_view.py)."""
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return api_view.view(path, json.loads(r.read()))


def start_daemon(build, tmp, threads_per_rank):
    state = os.path.join(tmp, "state")
    os.makedirs(os.path.join(state, "data"))
    with open(os.path.join(state, "data", "train.txt"), "wb") as f:
        f.write(TEXT)
    log_path = os.path.join(tmp, "ztraind.log")
    with open(log_path, "wb") as log:
        p = subprocess.Popen([os.path.join(build, "ztraind"), "--grpc-addr", "127.0.0.1:0",
                              "--http-addr", "127.0.0.1:0", "--state-dir", state,
                              "--max-ranks", "1", "--threads-per-rank", str(threads_per_rank)],
                             stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log_path) as f:
            m = re.search(r"ready grpc=(\S+) http=(http://[\d.:]+)", f.read())
        if m:
            return p, m.group(1), m.group(2)
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    with open(log_path) as f:
        raise SystemExit("ztraind did not start:\n" + f.read())


def run_wrk(url, seconds, threads, connections, nice):
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    if nice:
        cmd = ["nice", "-n", str(nice)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = re.search(r"Latency\s+(\S+)", out).group(1)
    p99 = re.search(r"99%\s+(\S+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, lat, p99.group(1) if p99 else "?", int(non2xx.group(1)) if non2xx else 0


def phase_tokens(base, job_id, since_step, t0_ms, t1_ms):
    """Over the records stamped within [t0, t1): the mean of perf/tokens_per_second (the speed
    of the steps themselves) and the tokens trained per wall-clock second (which also counts
    the time the rank spent waiting, e.g. on a full stdout pipe)."""
    recs = get_json(base, f"/api/v1/jobs/{job_id}/records?since_step={since_step}")["records"]
    vals = [r["values"]["perf/tokens_per_second"] for r in recs
            if t0_ms <= r["time_unix_ms"] < t1_ms and
            r["values"].get("perf/tokens_per_second") is not None]
    wall = len(vals) * TOKENS_PER_STEP / ((t1_ms - t0_ms) / 1e3)
    return (statistics.mean(vals) if vals else float("nan")), wall, len(vals)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--source", default=os.path.join(HERE, ".."))
    ap.add_argument("--phase-seconds", type=int, default=10)
    ap.add_argument("--phases", type=int, default=4, help="idle/load phases, alternating")
    ap.add_argument("--threads-per-rank", type=int, default=1)
    ap.add_argument("--wrk-threads", type=int, default=1)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--wrk-nice", type=int, default=0,
                    help="run wrk niced, approximating clients on other machines")
    ap.add_argument("--max-points", type=int, default=500)
    ap.add_argument("--warm-records", type=int, default=3000)
    args = ap.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed")

    tmp = tempfile.mkdtemp(prefix="ztrain-bench-http-")
    daemon, grpc_addr, base = start_daemon(args.build, tmp, args.threads_per_rank)
    try:
        job_id = submit(grpc_addr, args.source, tmp)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            j = get_json(base, f"/api/v1/jobs/{job_id}")
            if j["state"] not in ("QUEUED", "STARTING", "RUNNING"):
                raise SystemExit(f"the job ended: {j['state']} {j['reason']}")
            if j["step"] >= args.warm_records:
                break
            time.sleep(0.2)
        url = f"{base}/api/v1/jobs/{job_id}/metrics?keys=train/loss&max_points={args.max_points}"
        print(f"job {job_id}: {j['step']} records before the first phase; wrk -t{args.wrk_threads} "
              f"-c{args.connections} on {url}")
        results = {"idle": [], "load": []}
        wall = {"idle": [], "load": []}
        for i in range(args.phases):
            kind = "idle" if i % 2 == 0 else "load"
            since = get_json(base, f"/api/v1/jobs/{job_id}")["step"]
            t0 = int(time.time() * 1000)
            if kind == "load":
                rps, lat, p99, bad = run_wrk(url, args.phase_seconds, args.wrk_threads,
                                             args.connections, args.wrk_nice)
            else:
                time.sleep(args.phase_seconds)
            t1 = int(time.time() * 1000)
            tps, wtps, n = phase_tokens(base, job_id, since, t0 + 1000, t1)
            results[kind].append(tps)
            wall[kind].append(wtps)
            extra = (f"  | {rps:9.0f} req/s, latency avg {lat}, p99 {p99}"
                     f"{f', {bad} non-2xx' if bad else ''}" if kind == "load" else "")
            print(f"phase {i + 1} {kind}: {tps:8.0f} tokens/s in steps, {wtps:8.0f} per wall "
                  f"second ({n} steps){extra}")
        j = get_json(base, f"/api/v1/jobs/{job_id}")
        print(f"series length at the end: {j['step']} steps; threads per rank "
              f"{args.threads_per_rank}, {os.cpu_count()} CPUs")
        for name, r in (("step speed (perf/tokens_per_second)", results),
                        ("wall-clock tokens/s", wall)):
            idle, load = statistics.mean(r["idle"]), statistics.mean(r["load"] or [0])
            print(f"{name}: idle {idle:.0f}, under load {load:.0f}, ratio {load / idle:.3f}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
