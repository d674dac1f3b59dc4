"""What SubmitJob lets in and what the CLI lets out (issue 19, defect 10), against a real ztraind
with Python grpcio, the C CLI and HTTP.

  a. Job names: ESC/BEL, a bidirectional override, a NUL, bytes that are not UTF-8 (sent raw)
     and a name past 128 bytes are INVALID_ARGUMENT naming the field and the byte at fault, and
     make no job; a 128-byte name in several scripts comes back byte for byte (GetJob, HTTP).
     `ztrain submit` of a file with such a name fails the same way, and prints no control byte.
  b. An idempotency key: the same spec again (its DeepSpeed keys in another order, the data path
     written another way) is the same job; another spec is ALREADY_EXISTS naming the key and the
     job, and makes no job; a key with a control character is INVALID_ARGUMENT.
  c. --max-jobs 3 and 24 SubmitJob calls at once from threads: exactly 3 are taken, the others
     are RESOURCE_EXHAUSTED. (ztraind answers unary calls on one thread today, so this passes
     without the fix too; tests/unit/test_job_submit.c races the manager's own threads.)
  d. A job whose rank prints 10,300 lines: StreamLogs and HTTP /logs serve the last 10,000 (the
     store's promise), not the 2,000 kept in memory, contiguous and ending at the last line; the
     losses in the step lines are those of metrics.jsonl; the same after a restart, `ztrain logs`
     and StreamLogs -f included.
  e. The CLI escapes what a server sends: a state file written by an older daemon, holding a name,
     a reason and a log line with ESC, BEL, C1, a bidirectional override and a stray byte, makes
     `list`, `status`, `status --json`, `watch`, `cancel` and `logs` print every one of them as a
     visible escape, never the byte itself."""
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, LONG, TERMINAL, Checker, Daemon, get_job, read_metrics,  # noqa: E402
                 spec_proto, state_name, stubs, submit, temp_dir, tiny_job, wait_state)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
ZTRAIN = os.path.join(BUILD, "ztrain")
# Bytes a terminal acts on: C0 but tab and newline, DEL, C1 (as UTF-8), the bidi override.
FORBIDDEN = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]")


def cli(args, d, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in ("ZTRAIN_SERVER", "ZTRAIN_TOKEN")}
    p = subprocess.run([ZTRAIN] + args + ["--server", d.grpc_addr], capture_output=True,
                       env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def n_jobs(d):
    return len(d.stub().ListJobs(pb.ListJobsRequest(page_size=1000), timeout=30).jobs)


def refused(d, job, key=""):
    """The gRPC error of a submit that must fail: (code, details); (None, id) if it was taken."""
    try:
        return None, submit(d, job, key).id
    except grpc.RpcError as e:
        return e.code(), e.details()


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return view(path, json.loads(r.read()))


def case_a(d, tmp):
    job = tiny_job(d.data_root, max_steps=1)
    before = n_jobs(d)
    for name, at, what in (("ok\x1b]0;pwned\x07", 2, "U+001B"), ("bell\x07", 4, "U+0007"),
                           ("abc\u202egnp.exe", 3, "U+202E"), ("tab\there", 3, "U+0009")):
        code, msg = refused(d, dict(job, name=name))
        ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "name" in msg and
                 f"at byte {at}" in msg and what in msg and not FORBIDDEN.search(msg.encode()),
                 f"a: name {name!r} is INVALID_ARGUMENT naming the field and byte {at}: {msg}")
    code, msg = refused(d, dict(job, name="ab\x00cd"))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "spec.name" in msg and "NUL" in msg and
             "at byte 2" in msg, f"a: a NUL in the name is refused, not cut short: {msg}")
    code, msg = refused(d, dict(job, name="x" * 129))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "name" in msg and "128" in msg,
             f"a: a 129-byte name is refused: {msg}")
    # Python will not put a stray byte into a string field: the message is patched on the wire.
    raw = pb.SubmitJobRequest(spec=spec_proto(dict(job, name="QQQQ"))).SerializeToString()
    raw = raw.replace(b"QQQQ", b"Q\xff\xc0Q")
    call = d.channel().unary_unary("/ztrain.v1.Trainer/SubmitJob")
    try:
        call(raw, timeout=30)
        code, msg = None, "taken"
    except grpc.RpcError as e:
        code, msg = e.code(), e.details()
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "spec.name" in msg and
             "UTF-8" in msg and "at byte 1" in msg, f"a: bytes that are not UTF-8: {msg}")
    ck.check(n_jobs(d) == before, f"a: no refused name made a job ({n_jobs(d) - before} made)")

    # 128 bytes exactly, in four scripts: taken, and served back unchanged everywhere.
    name = ("résumé-训练-🚀-" * 8).encode()[:128].decode("utf-8", "ignore")
    name += "x" * (128 - len(name.encode()))
    j = submit(d, dict(job, name=name))
    ck.check(len(name.encode()) == 128 and j.name == name and get_job(d, j.id).name == name and
             http_json(d, f"/api/v1/jobs/{j.id}")["name"] == name,
             "a: a 128-byte UTF-8 name comes back unchanged (gRPC, HTTP)")

    path = os.path.join(tmp, "evil.json")
    with open(path, "w") as f:
        json.dump(dict(job, name="ok\x1b[2J\x07"), f)
    rc, out, err = cli(["submit", path], d)
    ck.check(rc == 1 and b"name" in err and b"at byte 2" in err and not FORBIDDEN.search(err),
             f"a: ztrain submit of such a file fails with the field and byte, no raw ESC: {err!r}")
    with open(path, "w") as f:
        f.write(json.dumps(dict(job, name="ab")).replace('"ab"', '"ab\\u0000cd"'))
    rc, out, err = cli(["submit", path], d)
    ck.check(rc == 1 and b"\\u0000" in err and b"line 1" in err,
             f"a: a \\u0000 in a job file is refused where it is: {err!r}")
    wait_state(d, j.id, TERMINAL)
    return j.id


def case_b(d):
    job = tiny_job(d.data_root, name="keyed", max_steps=1)
    before = n_jobs(d)
    first = submit(d, job, key="nightly-42")
    # The same job written differently: DeepSpeed keys reordered, the data path with "./".
    again = dict(job, data={"train": "./" + job["data"]["train"]},
                 deepspeed=dict(reversed(list(job["deepspeed"].items()))))
    second = submit(d, again, key="nightly-42")
    ck.check(second.id == first.id, f"b: the same spec with the same key is the same job "
             f"({first.id}, {second.id})")
    code, msg = refused(d, dict(job, train=dict(job["train"], max_steps=2)), key="nightly-42")
    ck.check(code == grpc.StatusCode.ALREADY_EXISTS and "nightly-42" in msg and first.id in msg,
             f"b: another spec with that key is ALREADY_EXISTS naming the key and job: {code} {msg}")
    code, msg = refused(d, job, key="k\x1b[31m")
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "idempotency_key" in msg and
             "at byte 1" in msg, f"b: a key with ESC is refused: {msg}")
    ck.check(n_jobs(d) == before + 1, f"b: one job for the key ({n_jobs(d) - before})")
    wait_state(d, first.id, TERMINAL)


def case_c(tmp):
    with Daemon(BUILD, temp_dir("ztrain-maxjobs-"), max_ranks=1,
                extra_args=["--max-jobs", "3"]) as d:
        job = tiny_job(d.data_root, max_steps=LONG)
        results, start = [], threading.Barrier(24)

        def one(i):
            ch = grpc.insecure_channel(d.grpc_addr)
            stub = stubs()[1].TrainerStub(ch)
            req = pb.SubmitJobRequest(spec=spec_proto(dict(job, name=f"burst-{i}")))
            grpc.channel_ready_future(ch).result(timeout=30)
            start.wait()
            try:
                results.append(stub.SubmitJob(req, timeout=60).id)
            except grpc.RpcError as e:
                results.append(e.code())
            ch.close()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        taken = [r for r in results if isinstance(r, str)]
        others = [r for r in results if not isinstance(r, str)]
        ck.check(len(taken) == 3 and all(r == grpc.StatusCode.RESOURCE_EXHAUSTED for r in others),
                 f"c: 24 concurrent submits with --max-jobs 3: {len(taken)} taken, the others "
                 f"{sorted(set(map(str, others)))}")
        live = [j for j in d.stub().ListJobs(pb.ListJobsRequest(page_size=100), timeout=30).jobs
                if state_name(j.state) not in TERMINAL]
        ck.check(len(live) == 3, f"c: {len(live)} jobs queued or running")
        for job_id in taken:
            d.stub().CancelJob(pb.CancelJobRequest(id=job_id, force=True), timeout=30)
        for job_id in taken:
            wait_state(d, job_id, TERMINAL)


STEP_LINE = re.compile(r"step (\d+)/(\d+) \| loss (\S+) \|")


def check_tail(what, lines, last_seq, metrics):
    """lines: (seq, text) pairs that must be the job's last 10,000, their step lines agreeing
    with metrics.jsonl (loss by step, to the 4 decimals the progress line prints)."""
    seqs = [s for s, _ in lines]
    ok = len(lines) == 10_000 and seqs == list(range(last_seq - 9_999, last_seq + 1))
    steps = []
    for _, text in lines:
        m = STEP_LINE.match(text)
        if m:
            step = int(m.group(1))
            steps.append(step)
            ok = ok and m.group(3) == f"{metrics[step]:.4f}"
    ok = ok and steps == list(range(steps[0], 10_301)) if steps else False
    ck.check(ok, f"{what}: {len(lines)} lines, seq {seqs[:1]}..{seqs[-1:]} (want "
             f"{last_seq - 9_999}..{last_seq}), step lines {steps[:1]}..{steps[-1:]} agree with "
             "metrics.jsonl")


def case_d(d):
    j = submit(d, tiny_job(d.data_root, name="chatty", max_steps=10_300, log_interval=1))
    j = wait_state(d, j.id, TERMINAL, timeout=240)
    ck.check(state_name(j.state) == "SUCCEEDED", f"d: the chatty job succeeded ({j.reason})")
    metrics = {r["train/global_step"]: r["train/loss"]
               for r in read_metrics(os.path.join(j.run_dir, "metrics.jsonl"))
               if "train/loss" in r}

    def stream(tail, follow=False):
        return [(l.seq, l.text) for l in d.stub().StreamLogs(
            pb.StreamLogsRequest(id=j.id, tail=tail, follow=follow), timeout=60)]

    everything = stream(20_000)
    last_seq = everything[-1][0] if everything else 0
    ck.check(last_seq > 10_300, f"d: the job wrote {last_seq} log lines")
    check_tail("d: StreamLogs tail=20000", everything, last_seq, metrics)
    got = http_json(d, f"/api/v1/jobs/{j.id}/logs?tail=10000")["lines"]
    check_tail("d: HTTP /logs?tail=10000", [(l["seq"], l["text"]) for l in got], last_seq,
               metrics)
    small = stream(150)
    ck.check(small == everything[-150:], "d: a tail the memory holds is the same lines")
    d.restart()
    check_tail("d: StreamLogs after a restart", stream(10_000), last_seq, metrics)
    check_tail("d: StreamLogs -f of an ended job", stream(10_000, follow=True), last_seq, metrics)
    rc, out, err = cli(["logs", j.id, "--tail", "10000"], d)
    texts = out.decode().splitlines()
    ck.check(rc == 0 and len(texts) == 10_000 and texts[-1].endswith(everything[-1][1]),
             f"d: ztrain logs --tail 10000 prints {len(texts)} lines ({err!r})")


def case_e(d, job_id):
    """Writes what an older daemon could have stored, as it would have (SQLite), then reads it
    back through the CLI."""
    d.stop()
    db = sqlite3.connect(os.path.join(d.state_dir, "ztraind.db"))
    number = int(job_id.split("-")[1])
    evil_name = b"evil\x1b]0;pwned\x07\x1b[2J\xc2\x9b\xe2\x80\xaeabc\xff"
    db.execute("UPDATE jobs SET name = CAST(? AS TEXT), state = 6, reason = CAST(? AS TEXT) "
               "WHERE number = ?", (evil_name, b"boom\x1b[31m\r\x08", number))
    seq = db.execute("SELECT MAX(seq) FROM logs WHERE job = ?", (number,)).fetchone()[0] or 0
    db.execute("INSERT INTO logs VALUES (?, ?, 0, 0, 'stdout', CAST(? AS TEXT))",
               (number, seq + 1, b"log\x1b[5mblink\x07\xc2\x9b"))
    db.commit()
    db.close()
    d.start()
    runs = {"list": cli(["list"], d), "status": cli(["status", job_id], d),
            "status --json": cli(["status", job_id, "--json"], d),
            "watch": cli(["watch", job_id], d), "cancel": cli(["cancel", job_id], d),
            "logs": cli(["logs", job_id, "--tail", "5"], d)}
    for what, (rc, out, err) in runs.items():
        bad = FORBIDDEN.search(out) or FORBIDDEN.search(err)
        ck.check(not bad, f"e: `ztrain {what}` writes no control byte "
                 f"({bad.group(0) if bad else ''!r} in {(out + err)[:300]!r})")
    for what in ("list", "status"):
        ck.check(rb"evil\x1b]0;pwned\x07\x1b[2J\u009b\u202eabc\xff" in runs[what][1],
                 f"e: `ztrain {what}` shows the name's escapes: {runs[what][1][:400]!r}")
    ck.check(rb"boom\x1b[31m\x0d\x08" in runs["status"][1], "e: status shows the reason escaped")
    ck.check(rb"boom\x1b[31m" in runs["watch"][2] and runs["watch"][0] == 1,
             f"e: watch shows the reason escaped: {runs['watch'][2]!r}")
    ck.check(rb"boom\x1b[31m" in runs["cancel"][1], f"e: cancel too: {runs['cancel'][1]!r}")
    ck.check(rb"log\x1b[5mblink\x07\u009b" in runs["logs"][1],
             f"e: logs shows the line escaped: {runs['logs'][1][-200:]!r}")
    rc, out, _ = runs["status --json"]
    try:
        name = json.loads(out)["name"]
    except ValueError as e:
        name = f"not JSON: {e}"
    ck.check(rc == 0 and name == "evil\x1b]0;pwned\x07\x1b[2J\x9b\u202eabc\ufffd",
             f"e: status --json is JSON whose name decodes to what was stored: {name!r}")


def main():
    tmp = temp_dir("ztrain-submit-validation-")
    with Daemon(BUILD, tmp, max_ranks=1) as d:
        job_id = case_a(d, tmp)
        case_b(d)
        case_d(d)
        case_e(d, job_id)
    errors = d.sanitizer_errors()
    case_c(tmp)
    ck.check(not errors, f"no sanitizer report in ztraind's log: {errors}")
    ck.done()


main()
