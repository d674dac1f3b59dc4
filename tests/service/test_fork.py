"""Forks: SubmitJob with fork_from {job, step} (and `ztrain submit --fork-from ID@STEP`) starts a
new job from that job's checkpoint of that step with a changed config (a lower learning rate).

- The fork's trajectory is checked against an independent plain resume: `ztrain run` (no
  daemon) of the same spec resuming from a copy of the parent's checkpoint gives the same
  per-step losses and the same final weights; its first step's loss is the parent's (the
  weights are the checkpoint's), and the next one differs (the learning rate changed).
- The lineage is shown: Job.spec.fork_from over gRPC, the HTTP job JSON, `ztrain status`.
- Refused clearly (INVALID_ARGUMENT naming the key): a parent that does not exist, a step without
  a complete checkpoint (listing those there are), a model of another shape, a parent trained in
  pipeline stages (its checkpoints are saved per stage); the CLI refuses a
  malformed --fork-from, and `ztrain run` a spec with fork_from (there is no job to fork)."""
import json
import os
import shutil
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, get_job, read_metrics, spec_proto, state_name, stubs,
                 temp_dir, tiny_job, wait_state)

import grpc  # noqa: E402  (after svc, which makes sure the stubs exist)

c = Checker()
pb = stubs()[0]
ZTRAIN = os.path.join(BUILD, "ztrain")
STEPS, INTERVAL, FORK_AT = 12, 4, 8


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=10) as r:
        return view(path, json.loads(r.read()))


def cli(args, d=None):
    env = {k: v for k, v in os.environ.items() if k not in ("ZTRAIN_SERVER", "ZTRAIN_TOKEN")}
    full = [ZTRAIN] + list(args) + (["--server", d.grpc_addr] if d else [])
    p = subprocess.run(full, capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
    return path


def job_with_lr(d, name, lr, **model):
    job = tiny_job(d.data_root, name=name, max_steps=STEPS, checkpoint_interval=INTERVAL)
    job["deepspeed"]["optimizer"]["params"]["lr"] = lr
    job["model"].update(model)
    return job


def losses(d, job_id):
    page = http_json(d, f"/api/v1/jobs/{job_id}/records")
    return {r["step"]: r["values"]["train/loss"] for r in page["records"]
            if "train/loss" in r["values"]}


def submit_fork(d, job, parent, step):
    spec = spec_proto(job)
    spec.fork_from.job = parent
    spec.fork_from.step = step
    return d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)


def refused(d, job, parent, step, facts, what):
    try:
        j = submit_fork(d, job, parent, step)
        c.check(False, f"{what}: refused (it was accepted as {j.id})")
    except grpc.RpcError as e:
        text = e.details() or ""
        c.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and all(f in text for f in facts),
                f"{what}: INVALID_ARGUMENT naming {facts}: {e.code().name} {text!r}")


def plain_resume(d, tmp, parent_ckpt, job):
    """The reference: `ztrain run` of the fork's spec without fork_from, resuming from a copy of
    the parent's checkpoint of FORK_AT. Returns (losses by step, final weights)."""
    ckpt = os.path.join(tmp, "ref-ckpt")
    tag = f"global_step{FORK_AT}"
    shutil.copytree(os.path.join(parent_ckpt, tag), os.path.join(ckpt, tag))
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write(tag)
    ref = json.loads(json.dumps(job))
    ref["data"]["train"] = os.path.join(d.data_root, ref["data"]["train"])
    ref["train"].update(checkpoint_dir=ckpt, resume=True)
    path = write_json(os.path.join(tmp, "ref", "job.json"), ref)
    out = os.path.join(tmp, "ref-out")
    rc, so, se = cli(["run", path, "--out", out, "--threads", "1"])
    c.check(rc == 0, f"the plain resume ran ({se.strip()[-300:]})")
    recs = read_metrics(os.path.join(out, "metrics.jsonl")) if rc == 0 else []
    got = {r["train/global_step"]: r["train/loss"] for r in recs if "train/loss" in r}
    weights = os.path.join(ckpt, f"global_step{STEPS}", "model.safetensors")
    return got, open(weights, "rb").read() if os.path.exists(weights) else b""


tmp = temp_dir("ztrain-fork-")
d = Daemon(BUILD, os.path.join(tmp, "daemon"), max_ranks=2)
parent = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job_with_lr(d, "parent", 1e-3))),
                            metadata=d.metadata, timeout=30)
parent = wait_state(d, parent.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
c.check(state_name(parent.state) == "SUCCEEDED", f"the parent SUCCEEDED ({parent.reason!r})")
p_losses = losses(d, parent.id)

# The fork, through the CLI: the same model, half the learning rate.
fork_job = job_with_lr(d, "fork", 5e-4)
path = write_json(os.path.join(tmp, "jobs", "fork.json"), fork_job)
rc, out, err = cli(["submit", path, "--fork-from", f"{parent.id}@{FORK_AT}", "--wait"], d)
c.check(rc == 0, f"ztrain submit --fork-from {parent.id}@{FORK_AT} --wait exits 0 "
        f"({out.strip()} {err.strip()[-300:]})")
fork = get_job(d, out.strip())
c.check(state_name(fork.state) == "SUCCEEDED", f"the fork SUCCEEDED ({fork.reason!r})")
c.check(fork.spec.fork_from.job == parent.id and fork.spec.fork_from.step == FORK_AT,
        f"Job.spec.fork_from is the lineage: {fork.spec.fork_from.job}@{fork.spec.fork_from.step}")
h = http_json(d, f"/api/v1/jobs/{fork.id}")
c.check(h["spec"].get("fork_from") == {"job": parent.id, "step": FORK_AT},
        f"the HTTP job JSON shows it: {h['spec'].get('fork_from')}")
c.check(len(h["attempts"]) == 1 and h["attempts"][0]["resumed_from_step"] == FORK_AT,
        f"its one attempt resumed from step {FORK_AT}: {h['attempts']}")
rc, out, _ = cli(["status", fork.id], d)
c.check(rc == 0 and f"forked from  {parent.id} at step {FORK_AT}" in out,
        f"ztrain status shows the lineage: {[l for l in out.splitlines() if 'fork' in l]}")
c.check(os.path.realpath(fork.checkpoint_dir) != os.path.realpath(parent.checkpoint_dir),
        "the fork writes checkpoints of its own")

f_losses = losses(d, fork.id)
c.check(sorted(f_losses) == list(range(FORK_AT + 1, STEPS + 1)),
        f"the fork's records start after step {FORK_AT}: {sorted(f_losses)}")
c.check(f_losses.get(FORK_AT + 1) == p_losses.get(FORK_AT + 1),
        f"its first loss is the parent's at step {FORK_AT + 1} (the checkpoint's weights): "
        f"{f_losses.get(FORK_AT + 1)} {p_losses.get(FORK_AT + 1)}")
c.check(f_losses.get(FORK_AT + 2) != p_losses.get(FORK_AT + 2),
        f"its second differs (the lower learning rate): {f_losses.get(FORK_AT + 2)} vs "
        f"{p_losses.get(FORK_AT + 2)}")
ref_losses, ref_weights = plain_resume(d, tmp, parent.checkpoint_dir, fork_job)
c.check(ref_losses and ref_losses == f_losses,
        f"every loss equals a plain resume's of the same spec from the parent's checkpoint "
        f"({ref_losses})")
f_weights = os.path.join(fork.checkpoint_dir, f"global_step{STEPS}", "model.safetensors")
c.check(ref_weights and open(f_weights, "rb").read() == ref_weights,
        "and so do the final weights, bit for bit")
p_weights = os.path.join(parent.checkpoint_dir, f"global_step{STEPS}", "model.safetensors")
c.check(open(p_weights, "rb").read() != ref_weights,
        "which differ from the parent's own final weights")

refused(d, fork_job, "job-000099", FORK_AT, ["fork_from.job", "job-000099"],
        "a parent that does not exist")
refused(d, fork_job, parent.id, 5, ["fork_from.step", "step 5", "4, 8, 12"],
        "a step without a checkpoint")
refused(d, job_with_lr(d, "wider", 5e-4, n_embd=64), parent.id, FORK_AT,
        ["fork_from", "n_embd 64"], "a model of another shape")
# A pipelined parent saved each stage apart: refused by name before any checkpoint is looked up.
pp_spec = spec_proto(job_with_lr(d, "pipelined", 1e-3))
pp_spec.world_size = 2
pp_spec.pipeline.CopyFrom(pb.PipelineSpec(stages=2))
pp = d.stub().SubmitJob(pb.SubmitJobRequest(spec=pp_spec), metadata=d.metadata, timeout=30)
refused(d, fork_job, pp.id, FORK_AT, ["fork_from.job", pp.id, "2 pipeline stages"],
        "a pipelined parent")
pp = wait_state(d, pp.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
c.check(state_name(pp.state) == "SUCCEEDED", f"the pipelined parent itself trains ({pp.reason})")
rc, _, err = cli(["submit", path, "--fork-from", "nostep"], d)
c.check(rc == 2 and "JOB@STEP" in err, f"ztrain submit refuses --fork-from nostep: {err.strip()}")
local = json.loads(json.dumps(fork_job))
local["data"]["train"] = os.path.join(d.data_root, local["data"]["train"])
local["fork_from"] = {"job": parent.id, "step": FORK_AT}
local["train"]["checkpoint_dir"] = os.path.join(tmp, "local-ckpt")
rc, _, err = cli(["run", write_json(os.path.join(tmp, "local", "job.json"), local)])
c.check(rc == 1 and "fork_from is for ztraind" in err,
        f"ztrain run refuses a spec with fork_from rather than train from scratch: "
        f"{err.strip()[-200:]}")

errors = d.sanitizer_errors()
c.check(not errors, f"no sanitizer report in ztraind's log: {errors}")
d.stop()
c.done()
