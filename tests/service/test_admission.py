"""Admission control (issue 19, defect 5): ztraind refuses, before it is queued, a job whose
memory cannot fit, and a spec whose sizes overflow, instead of starting a worker that grows until
the host runs out.

  a. With its defaults (the host's MemTotal as the limit), SubmitJob of n_embd 65536, n_layer 1
     (about 50 billion parameters, hundreds of GiB) is FAILED_PRECONDITION at once (a valid spec
     that does not fit this host), naming the estimate and the host's memory; n_embd 600000000
     (4·n_embd overflows the kernels' int), a parameter count past 64 bits, and a micro-batch
     past one forward's int tokens are INVALID_ARGUMENT (they fit nowhere), each naming the
     field. None of them becomes a job, ztraind does not grow, and an ordinary job is
     still admitted and runs to the end. A rank slot is held by a running job throughout, so a
     refusal that does not happen leaves the job queued (the test fails) rather than started.
  b. --max-rank-memory and --max-job-memory, set from `ztrain estimate --json` of the jobs
     themselves: a job exactly at a limit is admitted, one above it refused naming the limit;
     world_size multiplies a job's memory. Bad sizes stop ztraind at start with exit status 2.
  c. On the emulated CUDA device (an H100 of 80 GB; skipped in a build without it), with
     --max-device-memory 16M: a "cuda" job whose device estimate is above it is
     FAILED_PRECONDITION naming the figure and the option, and a "cpu" job is admitted; without
     the option, 6.4 G parameters at stage 0 are refused against the server's GPU itself,
     naming it."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, stubs, submit, temp_dir, tiny_job,  # noqa: E402
                 tool, wait_state)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()


def refused(d, job):
    """(status code, details, seconds) of a SubmitJob."""
    t0 = time.monotonic()
    try:
        j = submit(d, job)
        return grpc.StatusCode.OK, f"accepted as {j.id}", time.monotonic() - t0
    except grpc.RpcError as e:
        return e.code(), e.details() or "", time.monotonic() - t0


def job_ids(d):
    return [j.id for j in d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata,
                                            timeout=30).jobs]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def with_model(job, micro_batch=None, **model):
    j = json.loads(json.dumps(job))
    j["model"].update(model)
    if micro_batch is not None:
        j["deepspeed"]["train_micro_batch_size_per_gpu"] = micro_batch
    return j


def estimate(job, where):
    """`ztrain estimate --json` of a job-spec dict written into `where`."""
    path = os.path.join(where, f"estimate-{job['name']}.json")
    with open(path, "w") as f:
        json.dump(job, f)
    out = subprocess.run([tool("ztrain"), "estimate", "--json", path], capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)


def case_a(tmp):
    with Daemon(BUILD, os.path.join(tmp, "a"), max_ranks=1) as d:
        blocker = submit(d, tiny_job(d.data_root, name="blocker", max_steps=LONG))
        ck.check(wait_state(d, blocker.id, {"RUNNING"}).state == pb.JOB_STATE_RUNNING,
                 "a: a running job holds the only rank slot")
        rss0 = rss_mb(d.proc.pid)
        base = tiny_job(d.data_root, name="big")
        bad = [
            ("n_embd 65536, n_layer 1", with_model(base, n_layer=1, n_head=1, n_embd=65536),
             ["does not fit", "GiB per rank", "parameters at ZeRO stage 0",
              "this host's memory (MemTotal)"]),
            ("n_embd 600000000", with_model(base, n_layer=1, n_head=1, n_embd=600000000),
             ["model.n_embd (600000000) is too large"]),
            ("a parameter count past 64 bits",
             with_model(base, n_layer=16, n_head=4, n_embd=536870908),
             ["model.n_layer (16) blocks", "64-bit"]),
            ("a micro-batch of 2^26 sequences", with_model(base, micro_batch=1 << 26),
             ["2147483648 tokens"]),
            ("n_layer 2000000000", with_model(base, n_layer=2000000000, n_head=8, n_embd=512),
             ["does not fit", "parameters"]),
        ]
        for what, job, facts in bad:
            code, details, secs = refused(d, job)
            want = (grpc.StatusCode.FAILED_PRECONDITION if "does not fit" in facts
                    else grpc.StatusCode.INVALID_ARGUMENT)
            ck.check(code == want and all(f in details for f in facts) and secs < 10,
                     f"a: {what}: {code.name} (want {want.name}) in {secs:.2f} s: "
                     f"{details[:400]}")
        ids = job_ids(d)
        ck.check(ids == [blocker.id], f"a: no refused spec became a job: {ids}")
        ck.check(rss_mb(d.proc.pid) < rss0 + 200,
                 f"a: ztraind did not grow: {rss0:.0f} -> {rss_mb(d.proc.pid):.0f} MB")
        ordinary = submit(d, tiny_job(d.data_root, name="ordinary", max_steps=5))
        ck.check(ordinary.state == pb.JOB_STATE_QUEUED, "a: an ordinary job is still admitted")
        # Anything wrongly admitted goes before the slot is freed, so that it never starts.
        for jid in job_ids(d):
            if jid not in (blocker.id, ordinary.id):
                d.stub().CancelJob(pb.CancelJobRequest(id=jid), metadata=d.metadata, timeout=30)
        d.stub().CancelJob(pb.CancelJobRequest(id=blocker.id), metadata=d.metadata, timeout=30)
        done = wait_state(d, ordinary.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
        ck.check(done.state == pb.JOB_STATE_SUCCEEDED, f"a: the ordinary job ran: {done.reason}")
        ck.check(not d.sanitizer_errors(), f"a: no sanitizer report: {d.sanitizer_errors()}")


def case_b(tmp):
    where = os.path.join(tmp, "b")
    os.makedirs(where, exist_ok=True)
    one = tiny_job(where, name="one")
    more = tiny_job(where, name="more")
    more["deepspeed"]["train_micro_batch_size_per_gpu"] = 8
    two = tiny_job(where, name="two", world_size=2)
    e_one, e_more, e_two = (estimate(j, where) for j in (one, more, two))
    ck.check(e_one["rank_bytes"] < e_more["rank_bytes"] and e_one["job_bytes"] < e_two["job_bytes"],
             f"b: estimates one {e_one['rank_bytes']}, more {e_more['rank_bytes']}, "
             f"two {e_two['job_bytes']} bytes")
    args = ["--max-rank-memory", str(e_one["rank_bytes"]),
            "--max-job-memory", str(e_two["job_bytes"] - 1)]
    with Daemon(BUILD, os.path.join(tmp, "b-daemon"), max_ranks=2, extra_args=args) as d:
        for job in (one, more, two):
            job["data"]["train"] = tiny_job(d.data_root)["data"]["train"]
        code, details, _ = refused(d, one)
        ck.check(code == grpc.StatusCode.OK, f"b: a job exactly at --max-rank-memory: {details}")
        code, details, _ = refused(d, more)
        ck.check(code == grpc.StatusCode.FAILED_PRECONDITION and
                 "above this server's --max-rank-memory" in details and
                 "micro-batch of 8" in details,
                 f"b: a micro-batch of 8 is above --max-rank-memory: {details[:400]}")
        code, details, _ = refused(d, two)
        ck.check(code == grpc.StatusCode.FAILED_PRECONDITION and
                 "its 2 ranks together would need" in details and
                 "above this server's --max-job-memory" in details,
                 f"b: two ranks are above --max-job-memory: {details[:400]}")
        ck.check(len(job_ids(d)) == 1, "b: only the admitted job exists")
    for flag, value in (("--max-rank-memory", "0"), ("--max-job-memory", "12Q")):
        out = subprocess.run([tool("ztraind"), flag, value], capture_output=True, text=True,
                             timeout=30)
        ck.check(out.returncode == 2 and f"{flag} expects a positive size" in out.stderr,
                 f"b: ztraind {flag} {value}: exit {out.returncode}, "
                 f"{out.stderr.splitlines()[:1]}")


def case_c(tmp):
    if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
        print("c: skipped (this build has no emulated CUDA device)")
        return
    os.environ["ZTRAIN_CUDA_EMU"] = "1"
    try:
        with Daemon(BUILD, os.path.join(tmp, "c"), max_ranks=1,
                    extra_args=["--max-device-memory", "16M"]) as d:
            gpu = tiny_job(d.data_root, name="gpu")
            gpu["device"] = "cuda"
            code, details, _ = refused(d, gpu)
            ck.check(code == grpc.StatusCode.FAILED_PRECONDITION and
                     "does not fit on the GPU" in details and "MiB per rank on the GPU" in details
                     and "above this server's --max-device-memory, 16.0 MiB" in details,
                     f"c: a cuda job above --max-device-memory: {code.name} {details[:400]}")
            cpu = tiny_job(d.data_root, name="cpu", max_steps=LONG)
            code, details, _ = refused(d, cpu)
            ck.check(code == grpc.StatusCode.OK, f"c: a cpu job is admitted: {details}")
            for jid in job_ids(d):
                d.stub().CancelJob(pb.CancelJobRequest(id=jid), metadata=d.metadata, timeout=30)
        # Without the option the GPU itself is the limit.
        with Daemon(BUILD, os.path.join(tmp, "c2"), max_ranks=1) as d:
            big = with_model(tiny_job(d.data_root, name="big"), n_layer=8, n_head=64, n_embd=8192)
            big["device"] = "cuda"
            code, details, _ = refused(d, big)
            ck.check(code == grpc.StatusCode.FAILED_PRECONDITION and
                     "this server's GPU 0 (NVIDIA H100 80GB HBM3" in details and
                     "for the CUDA context" in details,
                     f"c: 6.4 G parameters are above the server's GPU: {details[:500]}")
            ck.check(job_ids(d) == [], "c: no refused spec became a job")
    finally:
        del os.environ["ZTRAIN_CUDA_EMU"]


tmp = temp_dir("ztrain-admission-")
case_a(tmp)
case_b(tmp)
case_c(tmp)
ck.done()
