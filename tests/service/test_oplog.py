"""ztraind's own log tells the operator about every job, with a real ztraind:

a. each state change of a job is one line, `ztraind: job ID "NAME": STATE`, in the order GetJob
   saw the states: a job that succeeds is QUEUED, STARTING, RUNNING, SUCCEEDED; a job whose
   rank 1 exits with status 3 ends with `FAILED: REASON`, REASON being GetJob's reason; a
   cancelled job's line carries its reason too;
b. quotes and backslashes in a job's name, and control characters in a rank's last stderr line
   (which the reason quotes) are escaped: a line cannot be forged or end early;
c. with JOURNAL_STREAM naming the device and inode of ztraind's output (systemd's sign that
   stdout/stderr go to journald, systemd.exec(5)) every line starts with sd-daemon(3)'s priority: `<6>` for the ready line and the states, `<4>` for a restart,
   `<3>` for the failure, `<4>` for the SIGHUP that ztraind ignores; without it no line has a
   prefix, nor when JOURNAL_STREAM names another file (inherited from a service that started
   ztraind with its output elsewhere)."""
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, spec_proto, stubs,  # noqa: E402
                 submit, temp_dir, tiny_job, wait_state)

pb = stubs()[0]
c = Checker()
FORGED = 'job-000099 "x": SUCCEEDED'
# Names are printable (SubmitJob refuses control characters), but may hold quotes.
EVIL_NAME = f'evil" \\ {FORGED}'


def escaped(text):
    """The escaping the docs promise: backslash, quote, \\n, \\t and \\xNN for other controls."""
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7f:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def failing_worker(tmp):
    """A worker whose rank 1 writes a line with control characters to stderr and exits with
    status 3: the job fails naming it, its reason holding that line."""
    path = os.path.join(tmp, "rank1-exits-3")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\n[ "$RANK" = 1 ] && printf "boom\\t\\033[2J\\n" >&2 && exit 3\n'
                f'exec {os.path.join(BUILD, "ztrain-worker")} "$@"\n')
    os.chmod(path, 0o755)
    return path


def stream_of(path):
    """JOURNAL_STREAM as systemd writes it for the file at path: "DEVICE:INODE"."""
    open(path, "a").close()
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def job_lines(log, job_id):
    """(priority prefix, text after `ztraind: job ID `) of the job's lines, in order."""
    pat = re.compile(r"^(<\d>)?ztraind: job " + re.escape(job_id) + r" (.*)$")
    return [(m.group(1) or "", m.group(2)) for m in map(pat.match, log.splitlines()) if m]


def states_of(lines, name):
    head = f'"{escaped(name)}": '
    return [t[len(head):].split(":")[0] for _, t in lines if t.startswith(head)]


def run_fail(d, max_restarts=0):
    spec = spec_proto(tiny_job(d.data_root, name="two-ranks", world_size=2, max_steps=LONG))
    spec.max_restarts = max_restarts
    j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)
    return wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)


tmp = temp_dir("ztrain-oplog-")
with Daemon(BUILD, tmp, max_ranks=2, extra_args=["--worker", failing_worker(tmp)],
            env={"JOURNAL_STREAM": stream_of(os.path.join(tmp, "elsewhere"))}) as d:
    ok = submit(d, tiny_job(d.data_root, name=EVIL_NAME, max_steps=3))
    ok = wait_state(d, ok.id, {"SUCCEEDED", "FAILED", "CANCELLED"})
    bad = run_fail(d)
    cancelled = submit(d, tiny_job(d.data_root, name="long", max_steps=LONG))
    wait_state(d, cancelled.id, {"RUNNING"})
    d.stub().CancelJob(pb.CancelJobRequest(id=cancelled.id, force=True), metadata=d.metadata,
                       timeout=30)
    cancelled = wait_state(d, cancelled.id, {"SUCCEEDED", "FAILED", "CANCELLED"})
    d.stop()
    log = d.log()

    lines = job_lines(log, ok.id)
    c.check(states_of(lines, EVIL_NAME) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"],
            f"the job that succeeds: one line per state, in order: {lines}")
    c.check(f'"{escaped(EVIL_NAME)}": SUCCEEDED' in log,
            f"the name is escaped: {escaped(EVIL_NAME)!r}")

    lines = job_lines(log, bad.id)
    want = f'"two-ranks": FAILED: {escaped(bad.reason)}'
    c.check("rank 1" in bad.reason and "exited with status 3" in bad.reason,
            f"GetJob's reason names rank 1 and its status: {bad.reason!r}")
    c.check("\x1b" in bad.reason and "\x1b" not in log,
            "the escape character the rank wrote is in the reason, and escaped in the log")
    c.check(lines and lines[-1] == ("", want),
            f"the failed job's last line is its state and reason ({lines[-1:]}, want {want!r})")

    lines = job_lines(log, cancelled.id)
    want = f'"long": CANCELLED: {escaped(cancelled.reason)}'
    c.check(lines and lines[-1] == ("", want) and cancelled.reason,
            f"the cancelled job's last line is its state and reason ({lines[-1:]})")
    c.check(not re.search(r"^<\d>", log, re.M),
            "with JOURNAL_STREAM naming another file no line has a prefix")

tmp = temp_dir("ztrain-oplog-journal-")
with Daemon(BUILD, tmp, max_ranks=2, extra_args=["--worker", failing_worker(tmp)],
            env={"JOURNAL_STREAM": stream_of(os.path.join(tmp, "ztraind.log"))}) as d:
    bad = run_fail(d, max_restarts=1)
    d.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    d.stop()
    log = d.log()
    unmarked = [line for line in log.splitlines() if not re.match(r"<[346]>", line)]
    c.check(not unmarked, f"with JOURNAL_STREAM every line has a priority: {unmarked[:5]}")
    c.check(re.search(r"^<6>ztraind: ready ", log, re.M) is not None, "the ready line is <6>")
    c.check(re.search(r"^<4>ztraind: SIGHUP ignored", log, re.M) is not None,
            "the line of the signal handler is a warning (<4>) too")
    lines = job_lines(log, bad.id)
    # RUNNING comes only if rank 0 reported before rank 1's exit was seen: either is right.
    prio = [(p, t.split(": ")[1]) for p, t in lines if t.split(": ")[1] != "RUNNING"]
    c.check(prio == [("<6>", "QUEUED"), ("<6>", "STARTING"), ("<4>", "QUEUED"),
                     ("<6>", "STARTING"), ("<3>", "FAILED")],
            f"the states at info, the restart a warning, the failure an error: {prio}")
    c.check(lines and lines[-1][1].endswith(escaped(bad.reason)),
            f"the failure's line holds GetJob's reason: {lines[-1:]} vs {bad.reason!r}")
c.done()
