"""A FIFO named by a job spec cannot wedge ztraind's gRPC server (issue 34, defect 1).

Opening a FIFO for reading blocks until a writer comes. On main, SubmitJob with data.train naming
a FIFO inside the data root opened it on the gRPC server's only thread: the submit timed out and so
did Health and ListJobs on fresh channels. Here, with a real ztraind and Python grpcio:

  a. data.train, a glob whose match is a FIFO, data.val and model.init_from (as a file, and as the
     config.json of a Hugging Face directory) each naming a FIFO: SubmitJob answers
     INVALID_ARGUMENT naming the field and "FIFO" well within its deadline, and makes no job.
  b. While and after those submits, Health and ListJobs on fresh channels answer.
  c. A plain job still runs to SUCCEEDED afterwards.
Nothing ever opens the FIFOs for writing (unless the test has failed, to let a wedged daemon go)."""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, Checker, Daemon, spec_proto, stubs, temp_dir, tiny_job, wait_state  # noqa: E402

import grpc  # noqa: E402

pb, rpc, hpb, hrpc = stubs()
ck = Checker()
tmp = temp_dir("ztrain-fifo-")


def fresh_calls(d):
    """Health and ListJobs on a new channel, each with a short deadline: (ok, what)."""
    ch = grpc.insecure_channel(d.grpc_addr)
    try:
        h = hrpc.HealthStub(ch).Check(hpb.HealthCheckRequest(), timeout=5)
        n = len(rpc.TrainerStub(ch).ListJobs(pb.ListJobsRequest(), timeout=5).jobs)
        return h.status == hpb.HealthCheckResponse.SERVING, f"SERVING, {n} job(s)"
    except grpc.RpcError as e:
        return False, f"{e.code()}: {e.details()}"
    finally:
        ch.close()


def release(fifos):
    """Opens each FIFO for writing once, which lets a reader blocked on it go."""
    for f in fifos:
        try:
            fd = os.open(f, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass


with Daemon(BUILD, tmp, max_ranks=1) as d:
    base = tiny_job(d.data_root, max_steps=3)
    fifo = os.path.join(d.data_root, "pipe.bin")
    os.mkfifo(fifo)
    os.makedirs(os.path.join(d.data_root, "shards"))
    os.mkfifo(os.path.join(d.data_root, "shards", "s0.bin"))
    os.mkfifo(os.path.join(d.data_root, "model.safetensors"))
    hf = os.path.join(d.data_root, "hf")
    os.makedirs(hf)
    os.mkfifo(os.path.join(hf, "config.json"))
    fifos = [fifo, os.path.join(d.data_root, "shards", "s0.bin"),
             os.path.join(d.data_root, "model.safetensors"), os.path.join(hf, "config.json")]

    cases = []
    j = json.loads(json.dumps(base)); j["data"]["train"] = "pipe.bin"
    cases.append(("data.train", j))
    j = json.loads(json.dumps(base)); j["data"]["train"] = "shards/s*.bin"
    cases.append(("data.train", j))
    j = json.loads(json.dumps(base)); j["data"]["val"] = "pipe.bin"; j["train"]["eval_interval"] = 2
    cases.append(("data.val", j))
    j = json.loads(json.dumps(base)); j["model"]["init_from"] = "model.safetensors"
    cases.append(("model.init_from", j))
    j = json.loads(json.dumps(base)); j["model"]["init_from"] = "hf"
    cases.append(("model.init_from", j))

    for field, job in cases:
        result = {}

        def call():
            t0 = time.monotonic()
            try:
                r = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job)), timeout=15)
                result["got"] = ("taken", r.id)
            except grpc.RpcError as e:
                result["got"] = (e.code(), e.details())
            result["s"] = time.monotonic() - t0

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.3)
        ok, what = fresh_calls(d)
        ck.check(ok, f"{field} = {job['data']['train'] if field == 'data.train' else ''}"
                     f"{job['data'].get('val', '') if field == 'data.val' else ''}"
                     f"{job['model'].get('init_from', '') if field == 'model.init_from' else ''}"
                     f": Health and ListJobs on a fresh channel during the submit answer ({what})")
        t.join(20)
        if t.is_alive():
            release(fifos)
            t.join(20)
        code, details = result.get("got", (None, "no answer"))
        ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and field in details
                 and "FIFO" in details,
                 f"  SubmitJob is INVALID_ARGUMENT naming {field} and the FIFO in "
                 f"{result.get('s', 0):.2f} s: {code}: {details}")
        ok, what = fresh_calls(d)
        ck.check(ok, f"  Health and ListJobs after it answer ({what})")

    n = len(d.stub().ListJobs(pb.ListJobsRequest(), timeout=10).jobs)
    ck.check(n == 0, f"no job was made by the refused submits ({n})")
    r = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(base)), timeout=30)
    state = wait_state(d, r.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120).state
    ck.check(state == pb.JOB_STATE_SUCCEEDED, f"a plain job then runs to SUCCEEDED ({state})")
    release(fifos)
ck.done()
