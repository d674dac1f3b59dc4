"""What ztraind's gRPC server does with bad requests, bad clients and a busy port (Python grpcio).

  a. With a token, every call (Health/Check included) without "authorization: Bearer <token>",
     or with a wrong one, is UNAUTHENTICATED; the right token works.
  b. SubmitJob with a data path escaping the data root, a bad model, a bad DeepSpeed config
     (DeepSpeed's own text), deepspeed_json that is not JSON or not an object: INVALID_ARGUMENT
     naming the field at fault.
  c. Garbage bytes as the request of a unary and of a streaming method are INVALID_ARGUMENT, an
     empty request says the id is required, an unknown method is UNIMPLEMENTED, a message over
     the size limit is RESOURCE_EXHAUSTED, and the server keeps serving throughout.
  d. Watchers that cancel or hit their deadline mid-stream are cleaned up: the job goes on, new
     watches work, and 100 concurrent calls all succeed.
  e. A second ztraind on the same gRPC port fails to start with an error naming the address.
  f. ztraind with --grpc-addr, then --http-addr, on a port a Python socket holds: exit 1, one
     message naming that address and saying it is in use, no gRPC core text on stderr, and
     nothing left on disk: a new --state-dir does not exist afterwards, and an existing one
     (holding a file) is left exactly as it was.
  g. The same port taken in the moment between ztraind's check and its servers' bind (the test
     hook ZTRAIN_INJECT_LISTEN_RACE_MS holds ztraind there, after it has made its state
     directory): exit 1, one message naming the address, and the state directory and the data
     and runs roots this start made are removed again."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, get_job, spec_proto, state_name, stubs,  # noqa: E402
                 submit, temp_dir, tiny_job, wait_state, wait_step)
from ports import free_port  # noqa: E402

import grpc  # noqa: E402

pb, rpc, hpb, hrpc = stubs()
ck = Checker()


def code_of(call):
    """(status code, details) of a call that is expected to fail."""
    try:
        r = call()
        if hasattr(r, "__iter__") and not hasattr(r, "ListFields"):
            list(r)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def serving(d):
    try:
        return d.health().Check(hpb.HealthCheckRequest(), metadata=d.metadata,
                                timeout=10).status == hpb.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def case_a(tmp):
    with Daemon(BUILD, os.path.join(tmp, "auth"), token="s3cret-token") as d:
        stub, health = d.stub(), d.health()
        for name, md in (("no", []), ("a wrong", [("authorization", "Bearer nope")]),
                         ("a non-Bearer", [("authorization", "s3cret-token")])):
            codes = [
                code_of(lambda: health.Check(hpb.HealthCheckRequest(), metadata=md, timeout=10)),
                code_of(lambda: stub.GetJob(pb.GetJobRequest(id="job-000001"), metadata=md,
                                            timeout=10)),
                code_of(lambda: stub.ListJobs(pb.ListJobsRequest(), metadata=md, timeout=10)),
                code_of(lambda: stub.WatchJob(pb.WatchJobRequest(id="job-000001"), metadata=md,
                                              timeout=10)),
                code_of(lambda: stub.SubmitJob(
                    pb.SubmitJobRequest(spec=spec_proto(tiny_job(d.data_root))), metadata=md,
                    timeout=10)),
            ]
            ck.check(all(c == grpc.StatusCode.UNAUTHENTICATED for c, _ in codes),
                     f"a: {name} token: UNAUTHENTICATED everywhere ({[c.name for c, _ in codes]})")
        ck.check(serving(d), "a: with the token Health/Check is SERVING")
        j = submit(d, tiny_job(d.data_root, max_steps=3))
        ck.check(state_name(wait_state(d, j.id, {"SUCCEEDED", "FAILED"}).state) == "SUCCEEDED",
                 "a: with the token a job runs")


def case_b(d):
    stub = d.stub()

    def submit_code(job):
        return code_of(lambda: stub.SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job)),
                                              metadata=d.metadata, timeout=30))

    job = tiny_job(d.data_root)
    job["data"]["train"] = "../../etc/passwd"
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "data.train" in details,
             f"b: a data path escaping the root: {code.name}: {details}")

    job = tiny_job(d.data_root)
    job["data"]["train"] = "/etc/passwd"
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "data.train" in details,
             f"b: an absolute path outside the root: {code.name}: {details}")

    job = tiny_job(d.data_root)
    job["deepspeed"]["zero_optimization"] = {
        "stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/etc"}}
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and
             "offload_optimizer.nvme_path" in details and "outside" in details,
             f"b: an NVMe offload path outside the runs root: {code.name}: {details}")

    for monitor in ({"enabled": True, "output_path": "/etc"},
                    {"enabled": True, "job_name": "../../../etc"}):
        job = tiny_job(d.data_root)
        job["deepspeed"]["tensorboard"] = monitor
        code, details = submit_code(job)
        ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and
                 "deepspeed.tensorboard output_path/job_name" in details and "outside" in details,
                 f"b: a TensorBoard directory outside the runs root: {code.name}: {details}")

    job = tiny_job(d.data_root)
    job["model"].update(n_embd=30, n_head=4)
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "model.n_embd" in details and
             "divisible" in details, f"b: a bad model: {code.name}: {details}")

    job = tiny_job(d.data_root, deepspeed={"train_batch_size": 3,
                                           "train_micro_batch_size_per_gpu": 2})
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and
             "Check batch related parameters. train_batch_size is not equal to "
             "micro_batch_per_gpu * gradient_acc_step * world_size" in details,
             f"b: a bad DeepSpeed config gets DeepSpeed's text: {code.name}: {details}")

    job = tiny_job(d.data_root, deepspeed={"zero_optimization": {"stag": 2}})
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "stag" in details,
             f"b: an unknown DeepSpeed key is named: {code.name}: {details}")

    job = tiny_job(d.data_root)
    job["deepspeed"] = '{"train_micro_batch_size_per_gpu": 2,,}'
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "spec.deepspeed_json" in details and
             "line 1" in details, f"b: deepspeed_json that is not JSON: {code.name}: {details}")

    job = tiny_job(d.data_root)
    job["deepspeed"] = json.dumps("/etc/passwd")
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "spec.deepspeed_json" in details,
             f"b: deepspeed_json that is a string (a path) is refused: {code.name}: {details}")

    job = tiny_job(d.data_root)
    del job["model"]
    code, details = submit_code(job)
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "model" in details,
             f"b: a spec without a model: {code.name}: {details}")

    code, details = code_of(lambda: stub.ListJobs(pb.ListJobsRequest(state=42),
                                                  metadata=d.metadata, timeout=10))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT, f"b: ListJobs of state 42: {code.name}")
    ck.check(serving(d), "b: the server still serves")


def case_c(d):
    ch = d.channel()
    garbage = b"\xff\xff\xff\xff\x0f\x12\x80"
    unary = ch.unary_unary("/ztrain.v1.Trainer/GetJob")
    stream = ch.unary_stream("/ztrain.v1.Trainer/WatchJob")
    code, details = code_of(lambda: unary(garbage, metadata=d.metadata, timeout=10))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "GetJobRequest" in details,
             f"c: garbage to GetJob: {code.name}: {details}")
    code, details = code_of(lambda: stream(garbage, metadata=d.metadata, timeout=10))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT, f"c: garbage to WatchJob: {code.name}")
    code, details = code_of(lambda: ch.unary_unary("/ztrain.v1.Trainer/SubmitJob")(
        os.urandom(4096), metadata=d.metadata, timeout=10))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT, f"c: random bytes to SubmitJob: {code.name}")
    code, details = code_of(lambda: unary(b"", metadata=d.metadata, timeout=10))
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT and "id is required" in details,
             f"c: an empty GetJob request: {code.name}: {details}")
    code, details = code_of(lambda: ch.unary_unary("/ztrain.v1.Trainer/DeleteEverything")(
        b"", metadata=d.metadata, timeout=10))
    ck.check(code == grpc.StatusCode.UNIMPLEMENTED, f"c: an unknown method: {code.name}: {details}")
    big = pb.GetJobRequest(id="x" * (5 << 20))
    code, details = code_of(lambda: d.stub().GetJob(big, metadata=d.metadata, timeout=10))
    ck.check(code == grpc.StatusCode.RESOURCE_EXHAUSTED,
             f"c: a 5 MiB request over the 4 MiB limit: {code.name}")
    ck.check(serving(d), "c: the server still serves")


def case_d(d):
    job = submit(d, tiny_job(d.data_root, name="watched", max_steps=LONG, log_interval=1))
    wait_step(d, job.id, 5)
    stub = d.stub()
    for i in range(20):
        it = stub.WatchJob(pb.WatchJobRequest(id=job.id, logs=True), metadata=d.metadata,
                           timeout=30)
        next(it)
        next(it)
        it.cancel()
    code, _ = code_of(lambda: list(stub.WatchJob(pb.WatchJobRequest(id=job.id),
                                                 metadata=d.metadata, timeout=0.3)))
    ck.check(code == grpc.StatusCode.DEADLINE_EXCEEDED, f"d: a watch's deadline ends it ({code.name})")
    code, _ = code_of(lambda: list(stub.StreamLogs(pb.StreamLogsRequest(id=job.id, follow=True),
                                                   metadata=d.metadata, timeout=0.3)))
    ck.check(code == grpc.StatusCode.DEADLINE_EXCEEDED, f"d: so does a log follower's ({code.name})")
    j = get_job(d, job.id)
    ck.check(state_name(j.state) == "RUNNING", "d: after 20 cancelled watchers the job runs on")
    it = stub.WatchJob(pb.WatchJobRequest(id=job.id, since_step=LONG), metadata=d.metadata,
                       timeout=60)
    first = next(it)
    ck.check(first.WhichOneof("event") == "job", "d: a new watch starts with the job's state")
    with ThreadPoolExecutor(max_workers=20) as ex:
        futures = [ex.submit(lambda: stub.GetJob(pb.GetJobRequest(id=job.id), metadata=d.metadata,
                                                 timeout=30)) for _ in range(100)]
        ids = [f.result().id for f in futures]
    ck.check(ids == [job.id] * 100, "d: 100 concurrent GetJob calls all succeed")
    stub.CancelJob(pb.CancelJobRequest(id=job.id, force=True), metadata=d.metadata)
    states = [state_name(ev.job.state) for ev in it if ev.WhichOneof("event") == "job"]
    ck.check(states and states[-1] == "CANCELLED", f"d: the open watch ends with {states}")


def case_e(d, tmp):
    second = Daemon(BUILD, os.path.join(tmp, "second"), start=False)
    second.grpc_port = d.grpc_port
    try:
        second.start(timeout=20)
        started, log = True, second.log()
    except RuntimeError as e:
        started, log = False, str(e)
    finally:
        second.kill()
    ck.check(not started and second.proc.returncode == 1 and
             f"127.0.0.1:{d.grpc_port}" in log and "cannot listen" in log,
             f"e: a second ztraind on port {d.grpc_port} fails: "
             f"{[l for l in log.splitlines() if 'ztraind:' in l][-1:]}")
    ck.check(serving(d), "e: the first one still serves")


def tree(path):
    """{relative path: file bytes or None for a directory} of everything under path."""
    out = {}
    for root, dirs, files in os.walk(path):
        for n in dirs:
            out[os.path.relpath(os.path.join(root, n), path)] = None
        for n in files:
            with open(os.path.join(root, n), "rb") as f:
                out[os.path.relpath(os.path.join(root, n), path)] = f.read()
    return out


def case_f(tmp):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = f"127.0.0.1:{holder.getsockname()[1]}"
    existing = os.path.join(tmp, "existing-state")
    os.makedirs(existing)
    with open(os.path.join(existing, "notes.txt"), "w") as f:
        f.write("kept\n")
    before = tree(existing)
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_VERBOSITY", "GRPC_TRACE")}
    try:
        for flag in ("--grpc-addr", "--http-addr"):
            for state, new in ((os.path.join(tmp, f"new-state{flag}"), True), (existing, False)):
                addrs = {"--grpc-addr": "127.0.0.1:0", "--http-addr": "127.0.0.1:0", flag: busy}
                p = subprocess.run([os.path.join(BUILD, "ztraind"),
                                    "--grpc-addr", addrs["--grpc-addr"],
                                    "--http-addr", addrs["--http-addr"], "--state-dir", state],
                                   capture_output=True, text=True, timeout=30, env=env)
                lines = [l for l in p.stderr.splitlines() if l.strip()]
                what = f"f: {flag} {busy} busy, {'new' if new else 'existing'} state dir"
                ck.check(p.returncode == 1, f"{what}: exit 1 ({p.returncode})")
                ck.check(len(lines) == 1 and flag in lines[0] and busy in lines[0] and
                         "in use" in lines[0],
                         f"{what}: one message naming the address as in use ({lines})")
                ck.check(not any(t in p.stderr for t in ("grpc:", "UNKNOWN:", "chttp2", "errno")),
                         f"{what}: no gRPC core text ({p.stderr.strip()[:300]!r})")
                if new:
                    ck.check(not os.path.exists(state), f"{what}: {state} was not left behind "
                             f"({sorted(tree(state)) if os.path.isdir(state) else 'a file'})")
                else:
                    after = tree(existing)
                    ck.check(after == before, f"{what}: it is left as it was ({sorted(after)})")
    finally:
        holder.close()


def case_g(tmp):
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_VERBOSITY", "GRPC_TRACE")}
    env["ZTRAIN_INJECT_LISTEN_RACE_MS"] = "1500"
    for flag in ("--grpc-addr", "--http-addr"):
        port = free_port()
        addr = f"127.0.0.1:{port}"
        addrs = {"--grpc-addr": "127.0.0.1:0", "--http-addr": "127.0.0.1:0", flag: addr}
        made = [os.path.join(tmp, f"race{flag}-{d}") for d in ("state", "data", "runs")]
        p = subprocess.Popen([os.path.join(BUILD, "ztraind"), "--grpc-addr", addrs["--grpc-addr"],
                              "--http-addr", addrs["--http-addr"], "--state-dir", made[0],
                              "--data-root", made[1], "--runs-root", made[2]],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 20
        while not os.path.exists(made[0]) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port))
            holder.listen()
            out, err = p.communicate(timeout=30)
        finally:
            holder.close()
        lines = [l for l in err.splitlines() if l.strip()]
        what = f"g: {flag} {addr} taken after the check"
        ck.check(p.returncode == 1, f"{what}: exit 1 ({p.returncode})")
        ck.check("ready" not in out, f"{what}: never ready ({out.strip()[-200:]!r})")
        ck.check(len(lines) == 1 and addr in lines[0] and "in use" in lines[0],
                 f"{what}: one message naming the address as in use ({lines})")
        for d in made:
            ck.check(not os.path.exists(d), f"{what}: {os.path.basename(d)}, made by this start, "
                     f"was removed")


tmp = temp_dir("ztrain-grpc-errors-")
t = time.monotonic()
case_a(tmp)
print(f"      (case_a: {time.monotonic() - t:.1f} s)")
t = time.monotonic()
case_f(tmp)
print(f"      (case_f: {time.monotonic() - t:.1f} s)")
t = time.monotonic()
case_g(tmp)
print(f"      (case_g: {time.monotonic() - t:.1f} s)")
with Daemon(BUILD, os.path.join(tmp, "main"), max_ranks=1) as d:
    for case, args in ((case_b, ()), (case_c, ()), (case_d, ()), (case_e, (tmp,))):
        t = time.monotonic()
        case(d, *args)
        print(f"      ({case.__name__}: {time.monotonic() - t:.1f} s)")
    rc = d.stop()
    ck.check(rc == 0, f"ztraind stops cleanly after all that (exit {rc})")
ck.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind {d.sanitizer_errors()}")
ck.done()
