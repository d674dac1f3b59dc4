"""ztraind keeps a job's newest 1,000 anomaly events, and the API says how many there were, with
a real ztraind over gRPC (ListAnomalies) and HTTP (/anomalies).

A job whose loss_spike and grad_norm_spike rules have a threshold of almost 0 over a window of 2
fires on about every other step of each, some 1,800 events in 1,500 steps. Rank 0 also appends
every event to the run directory's events.jsonl, which is the count and the order checked
against. On main the lists held the newest 1,000 and nothing said that there had been more.
Here:
  - ListAnomalies and /anomalies list exactly the last 1,000 lines of events.jsonl (kind, step,
    message), seq N - 999 .. N, with total_size (HTTP "totalSize", an int64 string) N, the number
    of lines, on every page of a paged walk too;
  - a job without events answers total_size 0 (HTTP: no "totalSize", as proto3 JSON leaves
    defaults out)."""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, TERMINAL, Checker, Daemon, stubs, submit, temp_dir,  # noqa: E402
                 tiny_job, wait_state)

pb = stubs()[0]
ck = Checker()
KEPT = 1000   # ZT_EVENT_STORE_ANOMALIES_PER_JOB, as docs/metrics-and-events.md states it


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return json.loads(r.read())


def grpc_pages(d, job_id, page_size):
    pages, token = [], ""
    while True:
        r = d.stub().ListAnomalies(pb.ListAnomaliesRequest(id=job_id, page_size=page_size,
                                                           page_token=token),
                                   metadata=d.metadata, timeout=30)
        pages.append(r)
        token = r.next_page_token
        if not token:
            return pages


def http_pages(d, job_id, page_size):
    pages, token = [], ""
    while True:
        body = http_json(d, f"/api/v1/jobs/{job_id}/anomalies?page_size={page_size}"
                            f"&page_token={token}")
        pages.append(body)
        token = body.get("nextPageToken", "")
        if not token:
            return pages


with Daemon(BUILD, temp_dir("ztrain-anomaly-cap-"), max_ranks=1) as d:
    job = tiny_job(d.data_root, name="spiky", max_steps=1500, log_interval=500)
    job["events"] = {"loss_spike": {"zscore": 1e-6, "window": 2, "policy": "record"},
                     "grad_norm_spike": {"zscore": 1e-6, "window": 2, "policy": "record"}}
    j = wait_state(d, submit(d, job).id, TERMINAL, timeout=300)
    ck.check(j.state == pb.JOB_STATE_SUCCEEDED, f"the job succeeded ({j.reason!r})")
    with open(os.path.join(j.run_dir, "events.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    n = len(lines)
    ck.check(n > KEPT + 100, f"rank 0 wrote {n} events to events.jsonl, more than are kept")
    newest = [(e["kind"], e["train/global_step"], e["message"]) for e in lines[-KEPT:]]

    for size in (0, 300):
        pages = grpc_pages(d, j.id, size)
        got = [a for p in pages for a in p.anomalies]
        ck.check([(a.kind, a.step, a.message) for a in got] == newest,
                 f"gRPC page_size {size}: the {len(got)} events listed are events.jsonl's "
                 f"last {KEPT}")
        ck.check([a.seq for a in got] == list(range(n - KEPT + 1, n + 1)),
                 f"gRPC page_size {size}: seq {got[0].seq if got else None}.."
                 f"{got[-1].seq if got else None}, the newest numbers of {n}")
        ck.check(all(p.total_size == n for p in pages),
                 f"gRPC page_size {size}: every one of {len(pages)} page(s) says total_size {n}: "
                 f"{sorted(set(p.total_size for p in pages))}")

        pages = http_pages(d, j.id, size)
        got = [a for p in pages for a in p.get("anomalies", [])]
        ck.check([(a["kind"], int(a["step"]), a["message"]) for a in got] == newest,
                 f"HTTP page_size {size}: the {len(got)} events listed are events.jsonl's "
                 f"last {KEPT}")
        ck.check(all(p.get("totalSize") == str(n) for p in pages),
                 f"HTTP page_size {size}: every one of {len(pages)} page(s) says totalSize "
                 f"\"{n}\": {sorted(set(str(p.get('totalSize')) for p in pages))}")

    quiet = wait_state(d, submit(d, tiny_job(d.data_root, name="quiet", max_steps=3)).id,
                       TERMINAL, timeout=120)
    r = d.stub().ListAnomalies(pb.ListAnomaliesRequest(id=quiet.id), metadata=d.metadata,
                               timeout=30)
    body = http_json(d, f"/api/v1/jobs/{quiet.id}/anomalies")
    ck.check(len(r.anomalies) == 0 and r.total_size == 0 and "totalSize" not in body,
             f"a job without events: total_size {r.total_size}, HTTP {body}")
ck.done()
