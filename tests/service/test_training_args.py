"""The job as the training script, through ztraind (issue 20): a JobSpec whose TrainingArgs fill a
DeepSpeed config's "auto" values and stand in for its missing optimizer, as the Hugging Face
Trainer does. Checked: the arguments survive the round trip (GetJob), the resolved values and the
config's warnings are in the job's log exactly once, as ztraind's own lines and never a rank's
(two ranks), the effective config in the run directory holds the values transformers' rules give
(re-derived here: micro = per_device_train_batch_size, train_batch_size = micro * accumulation *
world, warmup = ceil(max_steps * warmup_ratio), ...), and a value that mismatches an argument is
INVALID_ARGUMENT with the Trainer's text, before any rank starts. A warmup_steps above 2^31 - 1
(TrainingArgs.warmup_steps is int64) goes through gRPC, `ztrain submit`, the Python client and
HTTP, whose body takes each form json_format reads as an int64 (a number, a decimal string) and
refuses the others by the field's name."""
import json
import math
import os
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, SOURCE, Checker, Daemon, get_job, stubs, submit, temp_dir, tiny_job, wait_state  # noqa: E402

import grpc  # noqa: E402
from google.protobuf import json_format, wrappers_pb2  # noqa: E402

pb = stubs()[0]
ck = Checker()
ARGS = {"learning_rate": 3e-4, "weight_decay": 0.01, "adam_beta2": 0.95,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "warmup_ratio": 0.5}
MAX_STEPS = 3
DS = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "scheduler": {"type": "WarmupDecayLR",
                    "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                               "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "allgather_bucket_size": 2e8},
      "activation_checkpointing": {"partition_activations": True}}
WARNINGS = ["no \"optimizer\" section: training with the Trainer's default AdamW",
            "zero_optimization.allgather_bucket_size has no effect",
            "activation_checkpointing.partition_activations has no effect"]

with Daemon(BUILD, temp_dir("ztrain-targs-"), max_ranks=2) as d:
    job = tiny_job(d.data_root, name="targs", max_steps=MAX_STEPS, world_size=2, deepspeed=DS)
    job["training_args"] = ARGS
    j = submit(d, job)
    j = wait_state(d, j.id, {"SUCCEEDED", "FAILED"}, timeout=120)
    ck.check(j.state == pb.JobState.Value("JOB_STATE_SUCCEEDED"), f"the job succeeds ({j.reason})")
    got = get_job(d, j.id).spec.training_args
    ck.check(math.isclose(got.learning_rate, 3e-4) and got.per_device_train_batch_size == 2 and
             math.isclose(got.warmup_ratio, 0.5) and got.WhichOneof("max_grad_norm_present") is None,
             f"GetJob returns the training arguments as sent ({got})")

    logs = list(d.stub().StreamLogs(pb.StreamLogsRequest(id=j.id, tail=10000), metadata=d.metadata,
                                    timeout=30))
    daemon = [l.text for l in logs if l.rank == -1]
    ranks = [l.text for l in logs if l.rank >= 0]
    for w in WARNINGS:
        n = sum(w in t for t in daemon)
        ck.check(n == 1, f"warning '{w}' is in the log once, as ztraind's line (seen {n})")
    ck.check(not [t for t in ranks if "warning" in t or "\"auto\"" in t],
             "no rank prints the config's warnings or resolved values")
    def count_autos(tree):
        return sum(count_autos(v) if isinstance(v, dict) else v == "auto" for v in tree.values())
    autos = [t for t in daemon if "\"auto\"" in t]
    n_auto = count_autos(DS)
    ck.check(len(autos) == n_auto and len(set(autos)) == n_auto,
             f"each of the {n_auto} \"auto\" values is logged once ({len(autos)} lines)")

    with open(os.path.join(j.run_dir, "ds_config.effective.json")) as f:
        eff = json.load(f)
    micro, gas, world = ARGS["per_device_train_batch_size"], ARGS["gradient_accumulation_steps"], 2
    sched = eff["scheduler"]["params"]
    want = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "train_batch_size": micro * gas * world, "gradient_clipping": 1.0}
    ck.check(all(eff[k] == v for k, v in want.items()), f"effective batch and clipping {want}")
    ck.check(sched["warmup_min_lr"] == 0 and math.isclose(sched["warmup_max_lr"], 3e-4) and
             sched["total_num_steps"] == MAX_STEPS and
             sched["warmup_num_steps"] == math.ceil(MAX_STEPS * ARGS["warmup_ratio"]),
             f"effective scheduler from the arguments ({sched})")
    ck.check(eff["zero_optimization"]["reduce_bucket_size"] == 32 * 32,
             "reduce_bucket_size \"auto\" is hidden_size squared")
    opt = eff["optimizer"]
    ck.check(opt["type"] == "AdamW" and math.isclose(opt["params"]["lr"], 3e-4) and
             opt["params"]["betas"] == [0.9, 0.95] and opt["params"]["weight_decay"] == 0.01,
             f"the Trainer's AdamW stands in for the missing optimizer ({opt})")

    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{j.id}/config", timeout=30) as r:
        served = json.loads(json.load(r).get("deepspeedJson", "null"))
    ck.check(served == eff, "GET /api/v1/jobs/{id}/config serves the effective config")

    # The CLI sends a job file's training_args through the same proto fields.
    path = os.path.join(d.data_root, "..", "targs.json")
    with open(path, "w") as f:
        json.dump(dict(job, name="targs-cli"), f)
    env = {k: v for k, v in os.environ.items() if k not in ("ZTRAIN_SERVER", "ZTRAIN_TOKEN")}
    p = subprocess.run([os.path.join(BUILD, "ztrain"), "submit", path, "--server", d.grpc_addr],
                       capture_output=True, text=True, env=env, timeout=60)
    sent = get_job(d, p.stdout.strip()).spec.training_args if p.returncode == 0 else None
    ck.check(sent is not None and sent == got,
             f"`ztrain submit` sends the same TrainingArgs ({p.stderr.strip()} {sent})")

    bad = tiny_job(d.data_root, name="mismatch", max_steps=2,
                   deepspeed={"train_micro_batch_size_per_gpu": 4,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    bad["training_args"] = {"learning_rate": 3e-4, "per_device_train_batch_size": 2}
    try:
        submit(d, bad)
        ck.check(False, "a mismatch with the training arguments is refused")
    except grpc.RpcError as e:
        ck.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                 "- ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=2\n"
                 "- ds optimizer.params.lr=0.0001 vs hf learning_rate=0.0003" in e.details(),
                 f"a mismatch is INVALID_ARGUMENT with the Trainer's text ({e.details()})")

    # A count above int32's 2^31 - 1 (TrainingArgs.warmup_steps is int64) over every way in:
    # gRPC, `ztrain submit`, the Python client and HTTP's body, whose integers take the proto3
    # JSON mapping's forms as json_format.Parse reads them (a number, or a decimal string).
    # One idempotency key over all of them: each must resolve to the same spec, so to one job.
    BIG = 3_000_000_000
    big = tiny_job(d.data_root, name="big-warmup", max_steps=1)
    big["training_args"] = {"warmup_steps": BIG, "learning_rate": 1e-3}
    KEY = "big-warmup"
    first = None
    try:
        first = submit(d, big, key=KEY)
        got = get_job(d, first.id).spec.training_args
        ck.check(got.WhichOneof("warmup_steps_present") == "warmup_steps" and
                 got.warmup_steps == BIG, f"gRPC: warmup_steps {BIG} round-trips ({got})")
    except (ValueError, grpc.RpcError) as e:
        ck.check(False, f"gRPC: a warmup_steps of {BIG} can be sent ({e})")
    with open(path, "w") as f:
        json.dump(big, f)
    p = subprocess.run([os.path.join(BUILD, "ztrain"), "submit", path, "--server", d.grpc_addr,
                        "--idempotency-key", KEY], capture_output=True, text=True, env=env,
                       timeout=60)
    ck.check(p.returncode == 0 and first is not None and p.stdout.strip() == first.id,
             f"`ztrain submit` sends warmup_steps {BIG}: the same job ({p.stdout.strip()} "
             f"{p.stderr.strip()})")
    sys.path.insert(0, os.path.join(SOURCE, "clients", "python"))
    import ztrain  # noqa: E402
    try:
        with ztrain.Client(d.grpc_addr) as c:
            via = c.submit(big, idempotency_key=KEY)
        ck.check(first is not None and via.id == first.id and
                 via.spec.training_args.warmup_steps == BIG,
                 f"the Python client sends warmup_steps {BIG}: the same job ({via.id})")
    except (ValueError, ztrain.ZtrainError) as e:
        ck.check(False, f"the Python client sends warmup_steps {BIG} ({e})")

    def post(spec, warmup):
        """POST the spec with warmup_steps written as the JSON text `warmup`."""
        spec = json.loads(json.dumps(spec))
        spec["training_args"]["warmup_steps"] = "@W@"
        body = json.dumps({"spec": spec, "idempotency_key": KEY}).replace('"@W@"', warmup)
        body = body.encode()
        req = urllib.request.Request(f"{d.http_url}/api/v1/jobs", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    # Each form of the value, judged by json_format as an int64 (the reference: Int64Value's
    # JSON is the bare value, read as an int64 field's) and by POST /api/v1/jobs.
    forms = ["3000000000", '"3000000000"', "3e9", "3000000000.0", '"+3000000000"',
             '"03000000000"', '"3e9"', '"3000000000.0"', '" 3000000000"', '"3000000000 "',
             '"0x10"', '""', '"1.5"', "1.5", '"9223372036854775808"', "true"]
    for form in forms:
        try:
            ref = json_format.Parse(form, wrappers_pb2.Int64Value()).value
        except (json_format.ParseError, ValueError):  # a wrapper's refusal is a ValueError
            ref = None
        status, body = post(big, form)
        if ref is not None:
            job_id = body.get("id")
            sent = (body.get("spec", {}).get("trainingArgs", {}).get("warmupSteps"))
            ck.check(status == 200 and first is not None and job_id == first.id and
                     sent == str(ref),
                     f"HTTP: warmup_steps {form} is accepted as {ref}, json_format's reading "
                     f"({status} {job_id} {sent} {body.get('detail', '')})")
        else:
            ck.check(status == 400 and body.get("field") == "spec.training_args.warmup_steps",
                     f"HTTP: warmup_steps {form} is refused naming the field, as json_format "
                     f"refuses it ({status} {body.get('field')}: {body.get('detail')})")
    if first is not None:
        d.stub().CancelJob(pb.CancelJobRequest(id=first.id, force=True), metadata=d.metadata,
                           timeout=30)
ck.done()
