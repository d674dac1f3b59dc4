"""Cancelling jobs through ztraind's gRPC API (Python grpcio).

  a. Graceful cancel of a running job: CancelJob answers STOPPING at once, a watcher's stream
     ends with CANCELLED and status OK, and the ranks leave a complete checkpoint
     (<checkpoint_dir>/latest names a tag whose directory holds DONE and meta.json).
  b. A job submitted with resume true and that checkpoint_dir starts from the saved step: its
     first metric record is the step after it.
  c. Force cancel of a 2-rank job: CANCELLED within seconds and no rank process is left (their
     pids are gone from /proc); the ranks report the signal that ended them.
  d. Cancelling a queued job cancels it at once; cancelling a finished job leaves it as it was;
     a negative grace is INVALID_ARGUMENT.
  e. Force cancel of a 2-rank job that offloads its optimizer state to NVMe files: the killed
     ranks cannot remove their offload directories, so ztraind removes each one they made and
     says so in the job's log, while a directory beside them that another run made (named like
     this job's rank 1's) is left as it was."""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, get_job, read_metrics, state_name, stubs,  # noqa: E402
                 submit, temp_dir, tiny_job, wait_gone, wait_state, wait_step)

import grpc  # noqa: E402

pb, rpc, hpb, hrpc = stubs()
ck = Checker()


def cancel(d, job_id, **kw):
    return d.stub().CancelJob(pb.CancelJobRequest(id=job_id, **kw), metadata=d.metadata, timeout=30)


def watch_states(d, job_id, out):
    try:
        for ev in d.stub().WatchJob(pb.WatchJobRequest(id=job_id, since_step=LONG),
                                    metadata=d.metadata, timeout=120):
            if ev.WhichOneof("event") == "job":
                out.setdefault("states", []).append(state_name(ev.job.state))
        out["code"] = grpc.StatusCode.OK
    except grpc.RpcError as e:
        out["code"] = e.code()


def case_a(d):
    job = submit(d, tiny_job(d.data_root, name="graceful", max_steps=LONG, log_interval=5))
    j = wait_step(d, job.id, 20)
    ck.check(state_name(j.state) == "RUNNING", f"a: the job runs (step {j.step})")
    seen = {}
    t = threading.Thread(target=watch_states, args=(d, job.id, seen))
    t.start()
    time.sleep(0.2)
    c = cancel(d, job.id)
    ck.check(state_name(c.state) in ("STOPPING", "CANCELLED"),
             f"a: CancelJob answers {state_name(c.state)} ({c.reason})")
    end = wait_state(d, job.id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
    t.join(60)
    ck.check(state_name(end.state) == "CANCELLED", f"a: the job ends CANCELLED ({end.reason})")
    states = seen.get("states", [])
    ck.check(seen.get("code") == grpc.StatusCode.OK and states and states[-1] == "CANCELLED" and
             "STOPPING" in states, f"a: the watcher saw {states} and an OK end ({seen.get('code')})")
    ckpt = end.checkpoint_dir
    tag = ""
    if os.path.exists(os.path.join(ckpt, "latest")):
        with open(os.path.join(ckpt, "latest")) as f:
            tag = f.read().strip()
    done = tag and os.path.exists(os.path.join(ckpt, tag, "DONE"))
    ck.check(done, f"a: {ckpt}/latest names '{tag}', which holds DONE")
    step = 0
    if done:
        with open(os.path.join(ckpt, tag, "meta.json")) as f:
            step = json.load(f)["global_steps"]
    ck.check(step >= 20, f"a: the checkpoint is at step {step} (the job had reached {j.step})")
    return ckpt, step


def case_b(d, ckpt, step):
    job = submit(d, tiny_job(d.data_root, name="resumed", max_steps=step + 5, log_interval=1,
                             resume=True, checkpoint_dir=ckpt))
    end = wait_state(d, job.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
    ck.check(state_name(end.state) == "SUCCEEDED", f"b: the resumed job succeeds ({end.reason})")
    recs = read_metrics(os.path.join(end.run_dir, "metrics.jsonl"))
    steps = [r["train/global_step"] for r in recs if "train/loss" in r]
    ck.check(steps == list(range(step + 1, step + 6)),
             f"b: it trains steps {step + 1}..{step + 5} only ({steps})")
    series = d.stub().GetMetrics(pb.GetMetricsRequest(id=job.id, keys=["train/global_step"]),
                                 metadata=d.metadata).series
    ck.check(series and list(series[0].steps)[:1] == [step + 1],
             "b: GetMetrics agrees on the first step")


def case_c(d):
    job = submit(d, tiny_job(d.data_root, name="forced", world_size=2, max_steps=LONG,
                             log_interval=10))
    j = wait_step(d, job.id, 10)
    pids = [r.pid for r in j.ranks]
    ck.check(state_name(j.state) == "RUNNING" and len(pids) == 2 and all(pids),
             f"c: both ranks run (pids {pids})")
    t0 = time.monotonic()
    cancel(d, job.id, force=True)
    end = wait_state(d, job.id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=20)
    took = time.monotonic() - t0
    ck.check(state_name(end.state) == "CANCELLED", f"c: force cancel ends CANCELLED "
                                                   f"({state_name(end.state)}, {end.reason})")
    left = wait_gone(pids, timeout=10)
    ck.check(not left and took < 15, f"c: no rank process is left ({left}) after {took:.1f} s")
    ck.check(all(not r.running and r.signal == 9 for r in end.ranks),
             f"c: the ranks were ended by SIGKILL ({[(r.rank, r.signal, r.exit_code) for r in end.ranks]})")


def case_d(d):
    blocker = submit(d, tiny_job(d.data_root, name="blocker", world_size=2, max_steps=LONG,
                                 log_interval=50))
    b = wait_state(d, blocker.id, {"RUNNING"})
    ck.check(state_name(b.state) == "RUNNING", f"d: a 2-rank job fills --max-ranks 2 "
                                               f"({state_name(b.state)} {b.reason})")
    queued = submit(d, tiny_job(d.data_root, name="queued", max_steps=LONG))
    q = get_job(d, queued.id)
    c = cancel(d, queued.id)
    ck.check(state_name(q.state) == "QUEUED" and state_name(c.state) == "CANCELLED",
             f"d: a queued job is cancelled at once ({state_name(q.state)} -> {state_name(c.state)})")
    try:
        cancel(d, blocker.id, grace_seconds=-1)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    ck.check(code == grpc.StatusCode.INVALID_ARGUMENT, f"d: a negative grace is refused ({code})")
    cancel(d, blocker.id, force=True)
    gone = wait_state(d, blocker.id, {"CANCELLED", "FAILED"}, timeout=20)
    ck.check(state_name(gone.state) == "CANCELLED",
             f"d: force cancel ends it ({state_name(gone.state)} {gone.reason})")
    again = cancel(d, blocker.id)
    ck.check(state_name(again.state) == "CANCELLED", "d: cancelling a finished job leaves it be")


def case_e(d):
    nvme = os.path.join(d.runs_root, "nvme")
    neighbour = os.path.join(nvme, "ztrain-offloaded-rank1-Other0")
    os.makedirs(neighbour)
    with open(os.path.join(neighbour, "exp_avg.bin"), "wb") as f:
        f.write(b"another run's state")
    ds = {"train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
                                                                  "nvme_path": nvme}}}
    job = submit(d, tiny_job(d.data_root, name="offloaded", world_size=2, max_steps=LONG,
                             log_interval=10, deepspeed=ds))
    j = wait_step(d, job.id, 10)
    ours = sorted(set(os.listdir(nvme)) - {os.path.basename(neighbour)})
    ck.check(state_name(j.state) == "RUNNING" and len(ours) == 2,
             f"e: both ranks run and make their offload directories ({ours}, {j.reason})")
    cancel(d, job.id, force=True)
    end = wait_state(d, job.id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=20)
    ck.check(state_name(end.state) == "CANCELLED" and
             all(r.signal == 9 for r in end.ranks),
             f"e: force cancel kills the ranks ({state_name(end.state)}, {end.reason})")
    left = sorted(os.listdir(nvme))
    ck.check(left == [os.path.basename(neighbour)],
             f"e: the killed ranks' offload directories are removed, the other run's is kept "
             f"({left})")
    with open(os.path.join(neighbour, "exp_avg.bin"), "rb") as f:
        ck.check(f.read() == b"another run's state", "e: the other run's file is untouched")
    lines = [l.text for l in d.stub().StreamLogs(pb.StreamLogsRequest(id=job.id),
                                                 metadata=d.metadata, timeout=10)]
    said = [l for l in lines if "removed the NVMe offload directories" in l]
    named = said and all(f"rank {name.split('-rank')[1][0]}: {os.path.join(nvme, name)}" in said[0]
                         for name in ours)
    ck.check(named, f"e: the job's log names each directory removed and its rank "
                    f"({said or lines[-3:]})")


tmp = temp_dir("ztrain-grpc-cancel-")
with Daemon(BUILD, tmp, max_ranks=2, grace=20) as d:
    t = time.monotonic()
    ckpt, step = case_a(d)
    print(f"      (case_a: {time.monotonic() - t:.1f} s)")
    for case, args in ((case_b, (ckpt, step)), (case_c, ()), (case_d, ()),
                       (case_e, ())):
        t = time.monotonic()
        case(d, *args)
        print(f"      ({case.__name__}: {time.monotonic() - t:.1f} s)")
ck.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind {d.sanitizer_errors()}")
ck.done()
