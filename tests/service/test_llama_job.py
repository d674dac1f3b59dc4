"""Llama-family jobs through ztraind (issue 14): a qwen2 job submitted over gRPC with every Llama
field set (qkv_bias explicitly false, which the proto carries in a oneof, against qwen2's default
true) trains to SUCCEEDED; GetJob and HTTP give the fields back as sent, the checkpoint's
meta.json records them, and `ztrain sample` generates from it. A mistral job file submitted with
the CLI runs too (one with rms_norm_eps 0, which the proto would carry as unset,
is refused), and a spec whose n_head is no multiple of n_kv_head is INVALID_ARGUMENT naming
both fields, making no job."""
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, spec_proto, state_name, stubs, submit,  # noqa: E402
                 temp_dir, tiny_job, wait_state)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
ZTRAIN = os.path.join(BUILD, "ztrain")
QWEN2 = {"type": "qwen2", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 32, "rms_norm_eps": 1e-5,
         "rope_theta": 1000000.0, "rope_scaling": "linear", "rope_factor": 2.0,
         "max_position_embeddings": 64, "tie_word_embeddings": True, "qkv_bias": False,
         "o_bias": True, "sliding_window": 16}

tmp = temp_dir("llama-job")
with Daemon(BUILD, tmp, max_ranks=2) as d:
    job = tiny_job(d.data_root, name="qwen2", max_steps=6, world_size=2,
                   deepspeed={"train_micro_batch_size_per_gpu": 2,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                              "zero_optimization": {"stage": 3}})
    job["model"] = QWEN2
    j = submit(d, job)
    done = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    ck.check(state_name(done.state) == "SUCCEEDED",
             f"qwen2 at ZeRO-3 on 2 ranks: {state_name(done.state)} {done.reason}")
    m = done.spec.model
    ck.check(m.HasField("qkv_bias") and m.qkv_bias is False,
             "GetJob: qkv_bias false is kept, not taken for qwen2's default true")
    got = {k: getattr(m, k) for k in QWEN2}
    ck.check(got == QWEN2, f"GetJob gives every model field back: {got}")
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{j.id}", timeout=30) as r:
        api = view(f"/api/v1/jobs/{j.id}", json.load(r))
    spec = api.get("spec", {}).get("model", {})
    ck.check(all(spec.get(k) == v for k, v in QWEN2.items()),
             f"HTTP gives the model fields back: {spec}")
    ckpt = os.path.join(d.runs_root, j.id, "ckpt")
    with open(os.path.join(ckpt, "latest")) as f:
        tag = f.read().strip()
    with open(os.path.join(ckpt, tag, "meta.json")) as f:
        meta = json.load(f)["model"]
    ck.check(all(meta.get(k) == v for k, v in QWEN2.items()),
             f"meta.json records the model: {meta}")
    p = subprocess.run([ZTRAIN, "sample", ckpt, "--prompt", "It was", "--tokens", "20"],
                       capture_output=True, timeout=60)
    ck.check(p.returncode == 0 and p.stdout.startswith(b"It was") and len(p.stdout) >= 26,
             f"ztrain sample from the qwen2 checkpoint: {p.stdout[:60]!r} {p.stderr[-200:]!r}")

    mistral = tiny_job(d.data_root, name="mistral", max_steps=4)
    mistral["model"] = {"type": "mistral", "n_layer": 1, "n_head": 4, "n_kv_head": 1,
                        "n_embd": 32, "intermediate_size": 64, "vocab_size": 256,
                        "block_size": 32, "sliding_window": 8}
    path = os.path.join(tmp, "mistral.json")
    with open(path, "w") as f:
        json.dump(mistral, f)
    env = {k: v for k, v in os.environ.items() if k not in ("ZTRAIN_SERVER", "ZTRAIN_TOKEN")}
    p = subprocess.run([ZTRAIN, "submit", path, "--server", d.grpc_addr], capture_output=True,
                       text=True, env=env, timeout=60)
    job_id = p.stdout.strip()
    ck.check(p.returncode == 0 and job_id, f"ztrain submit of a mistral job: {p.stderr[-200:]}")
    if job_id:
        done = wait_state(d, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
        ck.check(state_name(done.state) == "SUCCEEDED" and done.spec.model.sliding_window == 8,
                 f"the mistral job: {state_name(done.state)} {done.reason}")

    # A zero double would travel as "unset" and become the default: the CLI refuses it.
    zero = dict(mistral, model=dict(mistral["model"], rms_norm_eps=0))
    with open(path, "w") as f:
        json.dump(zero, f)
    p = subprocess.run([ZTRAIN, "submit", path, "--server", d.grpc_addr], capture_output=True,
                       text=True, env=env, timeout=60)
    ck.check(p.returncode != 0 and "model.rms_norm_eps' must be positive, got 0" in p.stderr,
             f"ztrain submit with rms_norm_eps 0 is refused: {p.stderr.strip()[-200:]}")

    before = len(d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata, timeout=30).jobs)
    bad = tiny_job(d.data_root, name="bad")
    bad["model"] = dict(QWEN2, n_kv_head=3)
    try:
        submit(d, bad)
        ck.check(False, "n_head 4 over n_kv_head 3 was accepted")
    except grpc.RpcError as e:
        ck.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "model.n_head (4) must be a "
                 "multiple of model.n_kv_head (3)" in e.details(),
                 f"n_head 4 over n_kv_head 3: {e.code()} {e.details()}")
    after = len(d.stub().ListJobs(pb.ListJobsRequest(), metadata=d.metadata, timeout=30).jobs)
    ck.check(after == before, "and made no job")
ck.done()
