"""Unread event streams do not hold a job's history in memory (issue 34, defect 9), with a real
ztraind, a real job and raw sockets.

On main, 24 clients opening GET /api/v1/jobs/{id}/events?since_step=0 on a 20,000-record job and
never reading took ztraind from 30 to 514 MB: each stream queued the whole replay. Here the replay
is paged as the client reads:
  a. A finished job of 8,000 records (log_interval 1). 24 clients open the stream with a small
     receive buffer and read nothing: ztraind's resident memory (VmRSS) grows by less than
     24 MiB, where whole queued replays take more than 24 x 8,000 x ~700 bytes (~130 MiB).
  b. Once they close, a client that reads gets the job event, then every record once, in step
     order, 1 to 8,000 (equal to metrics.jsonl), then the terminal state.
  c. Meanwhile GetJob answers.
The same over gRPC: WatchJob replayed the whole history into its call before the client read a
message (without the paging, 24 unread WatchJobs of this job grew ztraind by 214 MiB).
  d. 24 WatchJob calls from since_step 0, each on its own channel with HTTP/2's flow-control
     window kept at its 64 KiB default (no BDP probing), never read: VmRSS grows by less than
     24 MiB; GetJob and ListJobs answer meanwhile.
  e. Once they are cancelled, a WatchJob that reads gets every record once, in step order (equal
     to metrics.jsonl), then the terminal state."""
import json
import os
import socket
import sys
import time
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, get_job, read_metrics, stubs, submit,  # noqa: E402
                 temp_dir, tiny_job, wait_state)

pb, pb_grpc = stubs()[:2]
ck = Checker()
STEPS = 8000
_cache = os.path.join(BUILD, "CMakeCache.txt")
SANITIZED = os.path.exists(_cache) and "ZT_SANITIZE:BOOL=ON" in open(_cache).read()
CLIENTS = 24


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


with Daemon(BUILD, temp_dir("ztrain-replay-"), max_ranks=1) as d:
    j = submit(d, tiny_job(d.data_root, max_steps=STEPS, log_interval=1))
    end = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=600)
    ck.check(end.state == pb.JOB_STATE_SUCCEEDED, f"the {STEPS}-step job succeeds ({end.reason})")
    recs = read_metrics(os.path.join(end.run_dir, "metrics.jsonl"))
    want = [r["train/global_step"] for r in recs if "train/loss" in r]
    time.sleep(1)
    base = rss_kib(d.proc.pid)
    socks = []
    for _ in range(CLIENTS):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", d.http_port))
        s.sendall(f"GET /api/v1/jobs/{j.id}/events?since_step=0 HTTP/1.1\r\n"
                  f"Host: 127.0.0.1:{d.http_port}\r\n\r\n".encode())
        socks.append(s)
    time.sleep(6)
    t0 = time.monotonic()
    g = get_job(d, j.id)
    ck.check(g.id == j.id and time.monotonic() - t0 < 2, "c: GetJob answers with the streams open")
    grown = (rss_kib(d.proc.pid) - base) / 1024
    if SANITIZED:
        print(f"skip  a: {CLIENTS} unread streams grow VmRSS by {grown:.1f} MiB (sanitizer build: "
              f"RSS not comparable)")
    else:
        ck.check(grown < 24, f"a: {CLIENTS} unread streams grow VmRSS by {grown:.1f} MiB (< 24)")
    for s in socks:
        s.close()
    time.sleep(1)

    steps, first, last = [], None, None
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{j.id}/events?since_step=0",
                                timeout=120) as r:
        event = None
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                body = json.loads(line[6:])
                if event == "metrics":
                    steps.append(int(body["step"]))
                elif event == "job":
                    first = first or body.get("state")
                    last = body.get("state")
    ck.check(steps == want and len(steps) == STEPS,
             f"b: a reading client gets every record once in order ({len(steps)} of {len(want)}; "
             f"first {steps[:3]}, last {steps[-3:]})")
    ck.check(last in ("SUCCEEDED", "JOB_STATE_SUCCEEDED"), f"b: the stream ends with {last}")

    time.sleep(1)
    base = rss_kib(d.proc.pid)
    calls, channels = [], []
    for _ in range(CLIENTS):
        ch = grpc.insecure_channel(d.grpc_addr, options=[("grpc.http2.bdp_probe", 0)])
        channels.append(ch)
        stub = pb_grpc.TrainerStub(ch)
        calls.append(stub.WatchJob(pb.WatchJobRequest(id=j.id, since_step=0), timeout=120))
    time.sleep(6)
    t0 = time.monotonic()
    g = get_job(d, j.id)
    listed = d.stub().ListJobs(pb.ListJobsRequest(), timeout=10)
    ck.check(g.id == j.id and any(x.id == j.id for x in listed.jobs) and time.monotonic() - t0 < 5,
             "d: GetJob and ListJobs answer with the watches open")
    grown = (rss_kib(d.proc.pid) - base) / 1024
    if SANITIZED:
        print(f"skip  d: {CLIENTS} unread WatchJobs grow VmRSS by {grown:.1f} MiB (sanitizer "
              f"build: RSS not comparable)")
    else:
        ck.check(grown < 24, f"d: {CLIENTS} unread WatchJobs grow VmRSS by {grown:.1f} MiB (< 24)")
    for c in calls:
        c.cancel()
    for ch in channels:
        ch.close()
    time.sleep(1)

    steps, states = [], []
    for ev in d.stub().WatchJob(pb.WatchJobRequest(id=j.id, since_step=0), timeout=120):
        kind = ev.WhichOneof("event")
        if kind == "metrics":
            steps.append(ev.metrics.step)
        elif kind == "job":
            states.append(ev.job.state)
    ck.check(steps == want and len(steps) == STEPS,
             f"e: a reading WatchJob gets every record once in order ({len(steps)} of "
             f"{len(want)}; first {steps[:3]}, last {steps[-3:]})")
    ck.check(states and states[-1] == pb.JOB_STATE_SUCCEEDED,
             f"e: the watch ends with SUCCEEDED ({states[-1:]})")
ck.done()
