"""Pipeline jobs through ztraind (issue 16): a 2-stage GPT-2 job with 4 micro-batches submitted
over gRPC (JobSpec.pipeline) trains to SUCCEEDED; GetJob and the HTTP API give the pipeline
section back as sent; the run's metrics carry the measured bubble fraction (perf/pipeline_bubble,
in [0, 1)); the checkpoint directory has the per-stage layout (pipeline.json, stage_00,
stage_01), which the HTTP API lists as one checkpoint. A pipeline whose stages do not divide world_size is INVALID_ARGUMENT naming
pipeline.stages, making no job."""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, read_metrics, spec_proto, state_name, stubs,  # noqa: E402
                 temp_dir, tiny_job, wait_state)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
tmp = temp_dir("pipeline-job")


def submit_piped(d, job, stages, partition="uniform"):
    spec = spec_proto(job)
    spec.pipeline.CopyFrom(pb.PipelineSpec(stages=stages, partition=partition))
    return d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)


with Daemon(BUILD, tmp, max_ranks=2) as d:
    job = tiny_job(d.data_root, name="piped", max_steps=4, world_size=2,
                   deepspeed={"train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 4,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    j = submit_piped(d, job, 2)
    done = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    ck.check(state_name(done.state) == "SUCCEEDED",
             f"a 2-stage pipeline job: {state_name(done.state)} {done.reason}")
    ck.check(done.spec.pipeline.stages == 2 and done.spec.pipeline.partition == "uniform",
             f"GetJob gives the pipeline back: {done.spec.pipeline}")
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{j.id}", timeout=30) as r:
        api = view(f"/api/v1/jobs/{j.id}", json.load(r))
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{j.id}/checkpoints", timeout=30) as r:
        api.update(view(f"/api/v1/jobs/{j.id}/checkpoints", json.load(r)))
    got = api.get("spec", {}).get("pipeline", {})
    ck.check(got.get("stages") == 2 and got.get("partition") == "uniform",
             f"HTTP gives the pipeline back: {got}")
    recs = [r for r in read_metrics(os.path.join(done.run_dir, "metrics.jsonl"))
            if "train/loss" in r]
    bubbles = [r.get("perf/pipeline_bubble") for r in recs]
    ck.check(len(recs) == 4 and all(b is not None and 0.0 <= b < 1.0 for b in bubbles),
             f"every step's record has the bubble fraction: {bubbles}")
    ckpt = os.path.join(d.runs_root, j.id, "ckpt")
    ck.check(os.path.exists(os.path.join(ckpt, "pipeline.json")) and
             all(os.path.isdir(os.path.join(ckpt, f"stage_{s:02d}")) for s in (0, 1)),
             f"the checkpoint has the per-stage layout: {sorted(os.listdir(ckpt))}")
    tags = [(c.get("tag"), c.get("complete")) for c in api.get("checkpoints", [])]
    ck.check(("global_step4", True) in tags and api.get("latest") == "global_step4",
             f"the HTTP API lists the pipeline's checkpoint: {tags}, latest {api.get('latest')}")

    before = len(d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata, timeout=30).jobs)
    try:
        submit_piped(d, tiny_job(d.data_root, name="bad", world_size=2), 3)
        ck.check(False, "3 stages on 2 ranks were accepted")
    except grpc.RpcError as e:
        ck.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "pipeline.stages" in e.details(),
                 f"3 stages on 2 ranks: {e.code()} {e.details()}")
    after = len(d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata, timeout=30).jobs)
    ck.check(after == before, "and made no job")
ck.done()
