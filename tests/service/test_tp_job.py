"""Tensor-parallel jobs through ztraind (issue 32): a GPT-2 job of 4 ranks whose DeepSpeed config
says tensor_parallel.autotp_size 2, submitted over gRPC, trains to SUCCEEDED; GetJob and the HTTP
API give its grid (dp 2 x pp 1 x tp 2); every rank's Prometheus series carry the rank's
coordinates by the grid's formula rank = ((pp_stage * dp) + dp_rank) * tp + tp_rank (computed
here, not read from ztraind); the checkpoint directory has the TP layout (tp.json, tp_00, tp_01),
which the HTTP API lists as one complete checkpoint. A TP size that does not divide the ranks is
INVALID_ARGUMENT naming tensor_parallel.autotp_size, making no job."""
import json
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, state_name, stubs, submit, temp_dir,  # noqa: E402
                 tiny_job, wait_state)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
DP, TP = 2, 2


def get(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return r.read().decode()


def ds(tp):
    return {"train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "tensor_parallel": {"autotp_size": tp}}


os.environ["ZTRAIN_INJECT_SLOW_RANK"] = "300:0"
with Daemon(BUILD, temp_dir("ztrain-tpjob-"), max_ranks=DP * TP) as d:
    job = tiny_job(d.data_root, name="tp", max_steps=3, world_size=DP * TP, deepspeed=ds(TP))
    j = submit(d, job)
    # Per-rank series are exported while a job runs (issue 34's bound on /metrics): read them
    # then, rank 0 slowed so that the run lasts long enough to be seen.
    want = {r: (str((r // TP) % DP), "0", str(r % TP)) for r in range(DP * TP)}
    got, deadline = {}, time.monotonic() + 120
    while got != want and time.monotonic() < deadline:
        for m in re.finditer(r'^ztrain_rank_step_time_seconds\{([^}]*)\}', get(d, "/metrics"),
                             re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if labels.get("job_id") == j.id:
                got[int(labels["rank"])] = (labels.get("dp_rank"), labels.get("pp_stage"),
                                            labels.get("tp_rank"))
        time.sleep(0.05)
    ck.check(got == want, f"every rank's series carries its coordinates: {got}")
    done = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    ck.check(state_name(done.state) == "SUCCEEDED",
             f"a dp {DP} x tp {TP} job: {state_name(done.state)} {done.reason}")
    ck.check((done.grid.dp, done.grid.pp, done.grid.tp) == (DP, 1, TP),
             f"GetJob gives the grid: {done.grid}")
    api = view(f"/api/v1/jobs/{j.id}", json.loads(get(d, f"/api/v1/jobs/{j.id}")))
    api.update(view(f"/api/v1/jobs/{j.id}/checkpoints",
                    json.loads(get(d, f"/api/v1/jobs/{j.id}/checkpoints"))))
    ck.check(api.get("grid") == {"dp": DP, "pp": 1, "tp": TP},
             f"the HTTP API gives the grid: {api.get('grid')}")

    ckpt = os.path.join(d.runs_root, j.id, "ckpt")
    names = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
    ck.check(names == ["tp.json", "tp_00", "tp_01"], f"the checkpoint has the TP layout: {names}")
    tags = [(c.get("tag"), c.get("complete")) for c in api.get("checkpoints", [])]
    ck.check(tags == [("global_step3", True)] and api.get("latest") == "global_step3",
             f"the HTTP API lists the TP checkpoint once: {tags}, latest {api.get('latest')}")

    before = len(d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata, timeout=30).jobs)
    try:
        submit(d, tiny_job(d.data_root, name="bad", world_size=2, deepspeed=ds(4)))
        ck.check(False, "autotp_size 4 on 2 ranks was accepted")
    except grpc.RpcError as e:
        ck.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                 "tensor_parallel.autotp_size" in e.details(),
                 f"autotp_size 4 on 2 ranks: {e.code()} {e.details()}")
    after = len(d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata, timeout=30).jobs)
    ck.check(after == before, "and made no job")
ck.done()
