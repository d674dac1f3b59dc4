"""The per-rank figures of a real 2-rank job under ztraind, with the job's own metrics.jsonl as
the reference: GetJob's RankStatus (grpcio), the HTTP job JSON and `ztrain status` carry each
rank's step time, breakdown, CPU and memory of the last logged step; GET /metrics exposes the
straggler, and no per-rank series once the job has ended (they are a running job's); a CPU
job's GPU fields are NaN / null. A record as long as a
300-rank job's arrives whole (a stand-in worker writes it)."""
import json
import math
import os
import re
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, get_job, read_metrics, stubs, submit,  # noqa: E402
                 temp_dir, tiny_job, wait_state)

PERF = ("step_time_ms", "data_ms", "fwd_ms", "bwd_ms", "step_ms", "comm_ms", "compute_ms")
SYSTEM = ("cpu_util", "rss_bytes", "peak_rss_bytes")
GPU = ("gpu_util", "gpu_memory_used_bytes", "gpu_power_watts", "gpu_temperature_c")
PHASES = {"data": "data_ms", "fwd": "fwd_ms", "bwd": "bwd_ms", "step": "step_ms", "comm": "comm_ms"}


def prom_samples(text):
    """(name, labels, value) of every sample line; HELP/TYPE names as a dict name -> type."""
    samples, types = [], {}
    for line in text.splitlines():
        m = re.fullmatch(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples, types


def get(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return r.read().decode()


ck = Checker()
pb = stubs()[0]
with Daemon(BUILD, temp_dir("ztrain-rankm-"), max_ranks=2) as d:
    job = tiny_job(d.data_root, name="ranks", max_steps=6, log_interval=3, world_size=2,
                   deepspeed={"train_micro_batch_size_per_gpu": 2,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                              "zero_optimization": {"stage": 2}})
    jid = submit(d, job).id
    j = wait_state(d, jid, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    ck.check(j.state == pb.JOB_STATE_SUCCEEDED, f"the 2-rank job succeeded ({j.reason})")
    recs = [r for r in read_metrics(os.path.join(j.run_dir, "metrics.jsonl"))
            if "perf/rank0/step_time_ms" in r]
    ck.check(len(recs) == 2, f"two logged steps carry per-rank figures ({len(recs)})")
    last = recs[-1]

    def want(r, name):
        return last[f"{'perf' if name in PERF else 'system'}/rank{r}/{name}"]

    # gRPC: RankStatus.
    j = get_job(d, jid)
    for r, rs in enumerate(j.ranks):
        ck.check(all(getattr(rs, n) == want(r, n) for n in PERF + SYSTEM),
                 f"GetJob rank {r}: {', '.join(f'{n} {getattr(rs, n):.4g}' for n in PERF + SYSTEM)} "
                 f"are the last record's")
        ck.check(all(math.isnan(getattr(rs, n)) for n in GPU), f"GetJob rank {r}: GPU fields are NaN on a CPU job")

    # The CLI's status: each rank's line ends with its figures.
    out = subprocess.run([os.path.join(BUILD, "ztrain"), "status", jid, "--server", d.grpc_addr],
                         capture_output=True, text=True, timeout=60).stdout
    for r in range(2):
        line = f"; step {want(r, 'step_time_ms'):.1f} ms (comm {want(r, 'comm_ms'):.1f}), " \
               f"cpu {want(r, 'cpu_util'):.2f}, rss {want(r, 'rss_bytes') / 1048576:.1f} MiB"
        ck.check(any(f"rank {r}: pid" in ln and ln.endswith(line) for ln in out.splitlines()),
                 f"ztrain status: rank {r}'s line ends with {line!r}")

    # HTTP job JSON.
    hj = view(f"/api/v1/jobs/{jid}", json.loads(get(d, f"/api/v1/jobs/{jid}")))
    for r, rs in enumerate(hj["ranks"]):
        ck.check(all(rs.get(n) == want(r, n) for n in PERF + SYSTEM),
                 f"HTTP job rank {r}: the per-rank figures are the last record's")
        ck.check(all(n in rs and rs[n] is None for n in GPU), f"HTTP job rank {r}: GPU figures are null")

    # Prometheus.
    samples, types = prom_samples(get(d, "/metrics"))

    def series(name, **labels):
        return [v for n, lab, v in samples
                if n == name and lab.get("job_id") == jid and all(lab.get(k) == x for k, x in labels.items())]

    # Per-rank series are exported only while a job runs (issue 34: bounded cardinality); this
    # one has ended, so only its job series remain (test_prometheus_window checks a running
    # job's ranks).
    mine = {n for n, lab, _ in samples if lab.get("job_id") == jid and n.startswith("ztrain_rank_")}
    ck.check(not mine, f"/metrics: the ended job has no per-rank series ({sorted(mine)})")
    ck.check(series("ztrain_job_straggler_rank") == [last["perf/straggler_rank"]] and
             series("ztrain_job_straggler_ratio") == [last["perf/straggler_ratio"]],
             f"/metrics: the straggler (rank {last['perf/straggler_rank']}, ratio "
             f"{last['perf/straggler_ratio']:.3f}) is the record's")
    d.stop()
    ck.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind: {d.sanitizer_errors()}")

# A record of 300 ranks' step figures (70 KB, past the 16 KiB of a log line) reaches ztraind
# whole: a stand-in worker writes it to the metrics pipe.
FAKE_WORKER = """#!/usr/bin/python3
import json, os, sys
fd = int(os.environ["ZTRAIN_METRICS_FD"])
rec = {"train/global_step": 1, "train/loss": 1.5}
for r in range(300):
    for k in %r:
        rec["perf/rank%%d/%%s" %% (r, k)] = r + 0.25
data = (json.dumps(rec) + "\\n").encode()
while data:
    data = data[os.write(fd, data):]
""" % (PERF,)
top = temp_dir("ztrain-rankm-big-")
fake = os.path.join(top, "fake-worker")
with open(fake, "w") as f:
    f.write(FAKE_WORKER)
os.chmod(fake, 0o755)
with Daemon(BUILD, top, max_ranks=1, extra_args=["--worker", fake]) as d:
    jid = submit(d, tiny_job(d.data_root, name="big-record", max_steps=1)).id
    j = wait_state(d, jid, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
    recs = view("/api/v1/jobs/x/records", json.loads(get(d, f"/api/v1/jobs/{jid}/records")))["records"]
    values = recs[0]["values"] if recs else {}
    ck.check(j.state == pb.JOB_STATE_SUCCEEDED and len(recs) == 1 and len(values) == 2 + 300 * len(PERF)
             and all(values[f"perf/rank{r}/compute_ms"] == r + 0.25 for r in range(300)),
             f"a {len(json.dumps(values)) // 1000} KB record arrives whole ({len(values)} keys, {j.reason})")
    hj = view(f"/api/v1/jobs/{jid}", json.loads(get(d, f"/api/v1/jobs/{jid}")))
    ck.check(hj["ranks"][0].get("step_time_ms") == 0.25, "... and the job's one rank takes its figures from it")
ck.done()
