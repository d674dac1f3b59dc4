"""GPUs in ztraind on a host without one (issue 15, item 4), against a real ztraind with Python
grpcio: the daemon says how many GPUs it schedules (none here, whatever the build: no GPU is
visible, or --gpus 0 says so), and a job asking for "device": "cuda" is refused
(FAILED_PRECONDITION when only the daemon's --gpus 0 stands in its way, INVALID_ARGUMENT when
the build or host has no CUDA) naming the field (the spec parser's refusal in a build without the CUDA backend, the daemon's own with
it) and makes no job, while the same job on "cpu" is taken. A daemon started with more
--gpus than CUDA_VISIBLE_DEVICES lists refuses to start, naming --gpus.

On a host with a GPU, a daemon told it has one (--gpus 1 under CUDA_VISIBLE_DEVICES=0) hands it to
"cuda" jobs one at a time: each job's start says CUDA_VISIBLE_DEVICES=0 in its log and the GPU is
released for the next, so all three run in turn (on a host without one the spec parser refuses
such jobs before the queue sees them, so this case runs only where a GPU is). Where the build has
the emulated CUDA device, a cuda job runs through the daemon on it to the end."""
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, state_name, stubs, submit, temp_dir,  # noqa: E402
                 tiny_job, wait_state)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()


def refused(d, job):
    try:
        return None, submit(d, job).id
    except grpc.RpcError as e:
        return e.code(), e.details()


def case_no_gpu(d, what):
    job = tiny_job(d.data_root, max_steps=1)
    code, msg = refused(d, dict(job, device="cuda"))
    # The spec parser refuses it without the CUDA backend or without a visible GPU; past it,
    # the daemon's own check refuses it when --gpus is 0.
    # A build or host that can never run CUDA makes the spec invalid; a daemon given no GPUs
    # (--gpus 0) could run it elsewhere, so that is FAILED_PRECONDITION.
    want = (grpc.StatusCode.FAILED_PRECONDITION if "no GPUs" in msg
            else grpc.StatusCode.INVALID_ARGUMENT)
    ck.check(code == want and 'device "cuda"' in msg and
             ("no GPUs" in msg or "-DZT_CUDA=ON" in msg or "no cuda device is visible" in msg),
             f"{what}: a cuda job is {want.name} naming the field: {code} {msg}")
    n = len(d.stub().ListJobs(pb.ListJobsRequest(page_size=100), timeout=30).jobs)
    ck.check(n == 0, f"{what}: the refused job made no job ({n})")
    code, _ = refused(d, dict(job, device="cpu"))
    ck.check(code is None, f"{what}: the same job on the CPU is taken ({code})")
    with open(d.log_path) as f:
        log = f.read()
    ck.check("ztraind: gpus: 0 (" in log, f"{what}: the daemon says it has no GPUs to give")


def logs_of(d, job_id):
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}/logs?tail=200",
                                timeout=30) as r:
        return json.loads(r.read())["lines"]


def case_one_gpu(tmp):
    """Three cuda jobs through one GPU: given in turn, released after each."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    try:
        with Daemon(BUILD, os.path.join(tmp, "one"), max_ranks=4, extra_args=["--gpus", "1"]) as d:
            job = tiny_job(d.data_root, max_steps=1)
            ids = [submit(d, dict(job, name=f"g{i}", device="cuda", world_size=1 + i % 2)).id
                   for i in range(3)]
            for i, jid in enumerate(ids):
                j = wait_state(d, jid, ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=120)
                lines = [line["text"] for line in logs_of(d, jid)]
                started = [t for t in lines if t.startswith("started ")]
                ck.check(started and "CUDA_VISIBLE_DEVICES=0" in started[0],
                         f"job {i}: its ranks got CUDA_VISIBLE_DEVICES=0: {started}")
                ck.check(state_name(j.state) in ("SUCCEEDED", "FAILED"),
                         f"job {i} ended: {state_name(j.state)} {j.reason[:200]!r}")
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]


def case_emulated_gpu(tmp):
    """A cuda job through ztraind on the emulated CUDA device (ZTRAIN_CUDA_EMU=1 in the daemon's
    environment, which its ranks inherit; docs/gpu.md): taken, given GPU 0, trained to the end."""
    os.environ.update(CUDA_VISIBLE_DEVICES="0", ZTRAIN_CUDA_EMU="1")
    try:
        with Daemon(BUILD, os.path.join(tmp, "emu"), max_ranks=2, extra_args=["--gpus", "1"]) as d:
            job = tiny_job(d.data_root, max_steps=2)
            jid = submit(d, dict(job, name="emulated", device="cuda")).id
            j = wait_state(d, jid, ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=240)
            lines = [line["text"] for line in logs_of(d, jid)]
            started = [t for t in lines if t.startswith("started ")]
            ck.check(state_name(j.state) == "SUCCEEDED" and started and
                     "CUDA_VISIBLE_DEVICES=0" in started[0],
                     f"a cuda job on the emulated device: {state_name(j.state)} "
                     f"{j.reason[:300]!r}, {started}")
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"], os.environ["ZTRAIN_CUDA_EMU"]


def main():
    tmp = temp_dir("ztrain-gpu-submit-")
    env_gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    # Only where this host has no GPU may the default (every visible GPU) be 0.
    probe = subprocess.run([os.path.join(BUILD, "ztraind"), "--help"], capture_output=True)
    ck.check(b"--gpus N" in probe.stdout + probe.stderr, "--help documents --gpus")
    if not env_gpus and not os.path.exists("/dev/nvidia0"):
        with Daemon(BUILD, os.path.join(tmp, "default")) as d:
            case_no_gpu(d, "default --gpus on a host without GPUs")
    with Daemon(BUILD, os.path.join(tmp, "zero"), extra_args=["--gpus", "0"]) as d:
        case_no_gpu(d, "--gpus 0")
    if os.path.exists("/dev/nvidia0"):
        case_one_gpu(tmp)
    else:
        print("skip  one GPU through the queue: this host has no GPU")
    if os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
        case_emulated_gpu(tmp)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    p = subprocess.run([os.path.join(BUILD, "ztraind"), "--gpus", "2", "--grpc-addr",
                        "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir",
                        os.path.join(tmp, "bad")], capture_output=True, env=env, timeout=60)
    err = p.stderr.decode(errors="replace")
    ck.check(p.returncode != 0 and "--gpus 2" in err, f"--gpus past CUDA_VISIBLE_DEVICES: "
             f"rc {p.returncode}: {err.strip()}")
    ck.done()


main()
