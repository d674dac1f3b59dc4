"""A job's history as downloads: GET /api/v1/jobs/{id}/metrics.csv and .../metrics.jsonl, and the
TensorBoard event files of its run directory as .../tensorboard.tar. The references are the JSON
API (/metrics with every point, /records page by page), Python's csv and tarfile modules, and
TensorBoard's own reader (EventAccumulator, from PyPI in .venv).

  a. A job of 1,300 logged steps (more than one page of the export, most of it read back from
     the store) with an eval every 100 steps, so records have different keys:
     - JSONL: one line per record, each equal to the /records element, all of them in order;
     - CSV: header step,time_unix_ms and every key in first-seen order; for every key, the
       non-empty cells as (step, float) equal /metrics' series exactly, and the other cells are
       empty exactly where the record lacks the key;
     - Content-Type and Content-Disposition (attachment, named after the job) of both.
  b. The tar holds <job id>/events.out.tfevents.*; EventAccumulator reads, for every key but
     train/global_step, the /metrics series rounded to float32, step for step.
  c. An export of a running job is a consistent snapshot: every CSV row has as many cells as the
     header, and steps are whole; an unknown job is 404 with a JSON error; a job with no
     records has a header-only CSV and an empty JSONL."""
import csv
import io
import json
import os
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import numpy as np  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from api_view import view  # noqa: E402
from svc import (BUILD, LONG, Checker, Daemon, stubs, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state, wait_step)

ck = Checker()


def get(d, path):
    """(status, headers, body bytes)."""
    try:
        with urllib.request.urlopen(d.http_url + path, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def api(d, path):
    status, _, body = get(d, path)
    assert status == 200, (path, status, body[:300])
    return view(path, json.loads(body))


def all_records(d, job_id):
    out, query = [], "since_step=0"
    while query:
        page = api(d, f"/api/v1/jobs/{job_id}/records?{query}&page_size=400")
        out += page["records"]
        query = page["next_page_token"] and f"page_token={page['next_page_token']}"
    return out


def series(d, job_id):
    """{key: [(step, value), ...]} of /metrics, every point (the job has fewer than 10,000)."""
    s = api(d, f"/api/v1/jobs/{job_id}/metrics")
    return {x["key"]: list(zip(x["steps"], x["values"])) for x in s["series"]}


def check_headers(h, job_id, kind, ctype):
    ck.check(h.get("Content-Type", "").startswith(ctype),
             f"{kind}: Content-Type {h.get('Content-Type')!r} starts with {ctype}")
    want = f'attachment; filename="{job_id}-metrics.{kind}"'
    ck.check(h.get("Content-Disposition") == want,
             f"{kind}: Content-Disposition {h.get('Content-Disposition')!r}")


def check_finished(d, job_id):
    recs = all_records(d, job_id)
    ser = series(d, job_id)
    ck.check(len(recs) > 1300, f"the job has {len(recs)} records (more than an export page)")

    status, h, body = get(d, f"/api/v1/jobs/{job_id}/metrics.jsonl")
    ck.check(status == 200, f"metrics.jsonl: 200 (got {status})")
    check_headers(h, job_id, "jsonl", "application/x-ndjson")
    lines = body.decode().splitlines()
    ck.check(body.endswith(b"\n") and [json.loads(l) for l in lines] == recs,
             f"JSONL: {len(lines)} lines equal the {len(recs)} /records elements in order")

    status, h, body = get(d, f"/api/v1/jobs/{job_id}/metrics.csv")
    ck.check(status == 200, f"metrics.csv: 200 (got {status})")
    check_headers(h, job_id, "csv", "text/csv")
    text = body.decode()
    ck.check(text.count("\r\n") == len(recs) + 1, "CSV: CRLF line ends, a header and one row per record")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    head, rows = rows[0], rows[1:]
    first_seen = []
    for r in recs:
        for k in r["values"]:
            if k not in first_seen:
                first_seen.append(k)
    ck.check(head == ["step", "time_unix_ms"] + first_seen,
             f"CSV header: step, time_unix_ms and the {len(first_seen)} keys in first-seen order")
    ck.check(len(rows) == len(recs) and all(len(r) == len(head) for r in rows),
             "CSV: every row has a cell per column")
    ck.check([(int(r[0]), int(r[1])) for r in rows] ==
             [(r["step"], r["time_unix_ms"]) for r in recs], "CSV: step and time of every record")
    for i, key in enumerate(head[2:], start=2):
        pts = [(int(r[0]), float(r[i])) for r in rows if r[i] != ""]
        ck.check(pts == ser.get(key), f"CSV column {key}: {len(pts)} points equal /metrics bit for bit")
        holes = [j for j, r in enumerate(rows) if r[i] == ""]
        ck.check(holes == [j for j, r in enumerate(recs) if r["values"].get(key) is None],
                 f"CSV column {key}: empty exactly where the record lacks it")
    ck.check("eval/loss" in head and len(ser["eval/loss"]) >= 13, "records with and without eval/loss")
    return ser


def check_tensorboard(d, job_id, ser):
    status, h, body = get(d, f"/api/v1/jobs/{job_id}/tensorboard.tar")
    ck.check(status == 200 and h.get("Content-Type") == "application/x-tar",
             f"tensorboard.tar: 200, application/x-tar (got {status}, {h.get('Content-Type')})")
    ck.check(h.get("Content-Disposition") == f'attachment; filename="{job_id}-tensorboard.tar"',
             f"tensorboard.tar: Content-Disposition {h.get('Content-Disposition')!r}")
    with tarfile.open(fileobj=io.BytesIO(body)) as tf:
        names = tf.getnames()
        ck.check(len(names) == 1 and names[0].startswith(f"{job_id}/events.out.tfevents."),
                 f"the archive holds one event file under {job_id}/ ({names})")
        out = tempfile.mkdtemp(prefix="ztrain-tb-")
        tf.extractall(out)
    acc = EventAccumulator(os.path.join(out, job_id), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = set(ser) - {"train/global_step"}
    ck.check(tags == want, f"TensorBoard tags are the metric keys but train/global_step "
             f"(missing {sorted(want - tags)}, extra {sorted(tags - want)})")
    for key in sorted(want & tags):
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        ref = [(s, float(np.float32(v))) for s, v in ser[key]]
        ck.check(got == ref, f"TensorBoard {key}: {len(got)} scalars equal /metrics as float32")


def check_running_and_errors(d):
    j = submit(d, tiny_job(d.data_root, name="export-running", max_steps=LONG))
    wait_step(d, j.id, 30)
    status, _, body = get(d, f"/api/v1/jobs/{j.id}/metrics.csv")
    rows = list(csv.reader(io.StringIO(body.decode(), newline="")))
    ck.check(status == 200 and len(rows) > 30 and all(len(r) == len(rows[0]) for r in rows),
             f"running job: a CSV of {len(rows) - 1} whole rows")
    status, _, body = get(d, f"/api/v1/jobs/{j.id}/metrics.jsonl")
    ck.check(status == 200 and all(json.loads(l)["step"] >= 0 for l in body.decode().splitlines()),
             "running job: JSONL lines are whole records")
    status, _, body = get(d, "/api/v1/jobs/job-999999/metrics.csv")
    ck.check(status == 404 and "job-999999" in json.loads(body).get("error", ""),
             f"unknown job: 404 naming it ({status}, {body[:80]!r})")
    status, _, body = get(d, "/api/v1/jobs/job-999999/tensorboard.tar")
    ck.check(status == 404, f"unknown job's tensorboard.tar: 404 ({status})")
    return j.id


def check_empty(d):
    """A queued job (max_ranks is taken by the running one) has no records yet."""
    j = submit(d, tiny_job(d.data_root, name="export-empty", max_steps=5))
    status, _, body = get(d, f"/api/v1/jobs/{j.id}/metrics.csv")
    ck.check(status == 200 and body == b"step,time_unix_ms\r\n",
             f"a job with no records: a header-only CSV ({body[:60]!r})")
    status, _, body = get(d, f"/api/v1/jobs/{j.id}/metrics.jsonl")
    ck.check(status == 200 and body == b"", f"a job with no records: an empty JSONL ({body[:60]!r})")
    status, _, body = get(d, f"/api/v1/jobs/{j.id}/tensorboard.tar")
    ck.check(status == 404 and "no TensorBoard" in json.loads(body).get("error", ""),
             f"a job that has not trained: tensorboard.tar is 404 saying so ({status})")


def main():
    tmp = temp_dir("ztrain-export-")
    with Daemon(BUILD, tmp, max_ranks=1) as d:
        job = tiny_job(d.data_root, name="export", max_steps=1300, eval_interval=100, eval_steps=1)
        job["data"]["val"] = "train.txt"
        j = submit(d, job)
        done = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=240)
        ck.check(done.state == 5, f"the 1,300-step job succeeded ({done.reason})")
        ser = check_finished(d, j.id)
        check_tensorboard(d, j.id, ser)
        running = check_running_and_errors(d)
        check_empty(d)
        d.stub().CancelJob(stubs()[0].CancelJobRequest(id=running, force=True),
                           metadata=d.metadata)
        wait_state(d, running, {"CANCELLED"})
        rc = d.stop()
        ck.check(rc == 0 and not d.sanitizer_errors(),
                 f"ztraind exits 0 with no sanitizer report ({rc}, {d.sanitizer_errors()})")
    ck.done()


main()
