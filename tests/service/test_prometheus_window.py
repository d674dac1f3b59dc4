"""/metrics keeps a bounded set of series (issue 34), with a real ztraind, real jobs and the
Prometheus text format parsed by its own rules (one sample a line: name{labels} value).

On main /metrics exported series for every job ever submitted, so a long-lived daemon's scrape
grew without end. Here, with --metrics-window 4:
  a. While job B runs and right after job A ended: A's job series are exported (ended within the
     window) but none of its per-rank series; B's per-rank series are.
  b. Once the window has passed: no sample names A (ztrain_jobs{state="SUCCEEDED"} still counts
     it), and A's history is still served by the API (/api/v1/jobs/{id}, its records).
  c. Twelve more short jobs that ended long enough ago add no series: the number of samples
     labelled with a job id is that of the running job alone."""
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, submit, temp_dir, tiny_job, wait_state,  # noqa: E402
                 wait_step)

ck = Checker()
WINDOW = 4
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')


def scrape(d):
    with urllib.request.urlopen(d.http_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            ck.check(False, f"a sample line parses: {line[:80]}")
        else:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4))))
    return samples


def of_job(samples, job_id):
    return [s for s in samples if s[1].get("job_id") == job_id]


def get(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return r.status, r.read()


with Daemon(BUILD, temp_dir("ztrain-prom-"), max_ranks=3,
            extra_args=["--metrics-window", str(WINDOW)]) as d:
    b = submit(d, tiny_job(d.data_root, name="running", max_steps=LONG, log_interval=2,
                           world_size=2))
    wait_step(d, b.id, 4, timeout=120)
    a = submit(d, tiny_job(d.data_root, name="short", max_steps=6))
    wait_state(d, a.id, {"SUCCEEDED"}, timeout=120)
    s = scrape(d)
    a_names = {n for n, _, _ in of_job(s, a.id)}
    ck.check("ztrain_job_step" in a_names and "ztrain_job_state" in a_names,
             f"a: the job that just ended is exported ({sorted(a_names)[:4]})")
    ck.check(not any(n.startswith("ztrain_rank_") for n in a_names),
             f"a: but none of its per-rank series ({sorted(n for n in a_names if 'rank' in n)})")
    b_ranks = {l.get("rank") for n, l, _ in of_job(s, b.id) if n.startswith("ztrain_rank_")}
    ck.check(b_ranks == {"0", "1"}, f"a: the running job's ranks are exported ({b_ranks})")

    time.sleep(WINDOW + 1.5)
    s = scrape(d)
    ck.check(not of_job(s, a.id), f"b: after the window no sample names {a.id} "
             f"({len(of_job(s, a.id))})")
    succeeded = [v for n, l, v in s if n == "ztrain_jobs" and l.get("state") == "SUCCEEDED"]
    ck.check(succeeded == [1.0], f"b: ztrain_jobs still counts it ({succeeded})")
    st, _ = get(d, f"/api/v1/jobs/{a.id}")
    st2, body = get(d, f"/api/v1/jobs/{a.id}/records")
    ck.check(st == 200 and st2 == 200 and b'"step"' in body, "b: its history is still in the API")

    for i in range(12):
        j = submit(d, tiny_job(d.data_root, name=f"more{i}", max_steps=2))
        wait_state(d, j.id, {"SUCCEEDED", "FAILED"}, timeout=120)
    before = len([x for x in scrape(d) if "job_id" in x[1]])
    time.sleep(WINDOW + 1.5)
    s = scrape(d)
    with_id = [x for x in s if "job_id" in x[1]]
    ck.check(with_id and all(x[1]["job_id"] == b.id for x in with_id),
             f"c: {len(with_id)} samples name a job, all of them the running one "
             f"({before} while the twelve were in the window)")
ck.done()
