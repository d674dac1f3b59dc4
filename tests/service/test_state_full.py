"""ztraind when its state file cannot be written (found by exploratory testing): a job the state
file did not take used to be accepted and run, then vanished at the next restart, its id handed
to a later job that appended to its run directory.

  a. The state directory is a 2 MiB tmpfs (a private mount namespace: the test re-runs itself
     under `unshare --mount`, as root), filled to the last byte by a file beside the database.
     SubmitJob is UNAVAILABLE and POST /api/v1/jobs 503, both naming the state file, and no job
     appears; with the filler removed the next submit is accepted and takes the next id (the
     refused ones took none). Then ztraind is SIGKILLed and started again: every accepted job
     is there, and nothing else.
  b. A run directory whose job the state file does not hold (a state directory restored from an
     older copy): a fresh ztraind numbers its first job after it, never into it.

Without root or unshare, part a is skipped, saying so."""
import errno
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()  # googleapis' error_details and grpc_status (PyPI)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc  # noqa: E402
from google.rpc import error_details_pb2  # noqa: E402
from grpc_status import rpc_status  # noqa: E402

from svc import BUILD, Checker, Daemon, stubs, submit, temp_dir, tiny_job  # noqa: E402

IN_NS = "ZT_TEST_STATE_FULL_NS"
c = Checker()
pb = stubs()[0]


def fill(directory):
    """Writes directory/filler until the file system is full; returns its path."""
    path = os.path.join(directory, "filler")
    block = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    break
                block = block[:len(block) // 2]
    return path


def job_ids(d):
    resp = d.stub().ListJobs(pb.ListJobsRequest(page_size=100), metadata=d.metadata, timeout=30)
    return sorted(j.id for j in resp.jobs)


def http_submit(d, job):
    req = urllib.request.Request(d.http_url + "/api/v1/jobs", data=json.dumps({"spec": job}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def full_state_dir():
    tmp = temp_dir("zt_state_full_")
    d = Daemon(BUILD, tmp, start=False)
    os.makedirs(d.state_dir)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", d.state_dir], check=True)
    try:
        d.start()
        job = tiny_job(d.data_root, max_steps=2)
        first = submit(d, job).id
        c.check(first == "job-000001", f"a: the first job is job-000001 ({first})")
        filler = fill(d.state_dir)
        try:
            submit(d, dict(job, name="refused"))
            c.check(False, "a: SubmitJob on a full state directory is refused")
        except grpc.RpcError as e:
            st = rpc_status.from_call(e)
            info = [x for x in (st.details if st else [])
                    if x.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
            reason = None
            if info:
                ei = error_details_pb2.ErrorInfo()
                info[0].Unpack(ei)
                reason = (ei.reason, ei.domain)
            c.check(e.code() == grpc.StatusCode.UNAVAILABLE and "state file" in e.details()
                    and "not queued" in e.details()
                    and reason == ("STATE_FILE_UNWRITABLE", "ztrain"),
                    f"a: SubmitJob is UNAVAILABLE naming the state file, ErrorInfo "
                    f"STATE_FILE_UNWRITABLE: {e.code()} {e.details()!r} {reason}")
        status, body = http_submit(d, dict(job, name="refused-http"))
        c.check(status == 503 and body.get("code") == "UNAVAILABLE"
                and "state file" in body.get("detail", "")
                and body.get("reason") == "STATE_FILE_UNWRITABLE",
                f"a: POST /api/v1/jobs is 503 UNAVAILABLE: {status} {body}")
        c.check(job_ids(d) == [first], f"a: no refused job is listed: {job_ids(d)}")
        os.unlink(filler)
        second = submit(d, dict(job, name="after")).id
        c.check(second == "job-000002",
                f"a: with space again the next job takes the next id, job-000002 ({second})")
        d.kill()
        d.start()
        c.check(job_ids(d) == [first, second],
                f"a: after SIGKILL and a restart the accepted jobs, and only they: {job_ids(d)}")
        third = submit(d, dict(job, name="later")).id
        c.check(third == "job-000003", f"a: and the next id after them ({third})")
    finally:
        d.kill()
        subprocess.run(["umount", "-l", d.state_dir])


def orphan_run_dir():
    tmp = temp_dir("zt_state_orphan_")
    d = Daemon(BUILD, tmp, start=False)
    os.makedirs(os.path.join(d.runs_root, "job-000041"))
    with open(os.path.join(d.runs_root, "job-000041", "metrics.jsonl"), "w") as f:
        f.write('{"train/global_step": 1}\n')
    d.start()
    try:
        got = submit(d, tiny_job(d.data_root, max_steps=2)).id
        c.check(got == "job-000042",
                f"b: beside runs/job-000041, which the state file does not hold, the first job "
                f"is job-000042 ({got})")
        with open(os.path.join(d.runs_root, "job-000041", "metrics.jsonl")) as f:
            c.check(f.read() == '{"train/global_step": 1}\n', "b: the old run directory is "
                    "untouched")
    finally:
        d.kill()


def main():
    if os.environ.get(IN_NS) != "1":
        if os.geteuid() == 0 and shutil.which("unshare") and subprocess.run(
                ["unshare", "--mount", "true"]).returncode == 0:
            env = dict(os.environ, **{IN_NS: "1"})
            os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private",
                                   sys.executable, os.path.abspath(__file__)], env)
        print("skip  a: needs root and unshare --mount for a tmpfs of its own")
    else:
        full_state_dir()
    orphan_run_dir()
    c.done()


if __name__ == "__main__":
    main()
