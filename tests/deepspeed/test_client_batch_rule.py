"""The Python client's local check of DeepSpeed's batch rule (JobSpec.validate), against real
DeepSpeed (the .venv-ds environment, `scripts/install-deps.sh deepspeed`).

For every combination of train_batch_size, train_micro_batch_size_per_gpu and
gradient_accumulation_steps, each absent or one of a few values (0, negatives and values that do
not divide included), on data-parallel sizes 1 to 4 (and 4 ranks as 2 pipeline stages):
DeepSpeedConfig accepts the config exactly when the client's validate() does; where DeepSpeed's
_batch_assertion refuses it, the client's SpecError carries DeepSpeed's own text and names a
batch key; where DeepSpeed fails by dividing by zero, the client refuses too, and its message
names the key that is 0. Configs with neither train_batch_size nor the micro batch are left
out: ztraind (as Hugging Face's Trainer) supplies the micro batch there, where DeepSpeed
refuses.

Run by `make test-deepspeed`; ZTRAIN_DS_PYTHON names another interpreter with DeepSpeed."""
import itertools
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import venv_python  # noqa: E402

SOURCE = os.environ.get("ZTRAIN_SOURCE") or os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "clients", "python"))
import ztrain  # noqa: E402

VALUES = (None, -2, 0, 1, 2, 3, 4, 8, 12)
LAYOUTS = ((1, 1), (2, 1), (3, 1), (4, 1), (4, 2))  # (world_size, pipeline stages)
KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# Runs in .venv-ds: each case's config through DeepSpeedConfig with a data-parallel group of
# the given size, and what became of it.
REFERENCE = r"""
import json, sys, logging
import deepspeed.runtime.config as dsc
dsc.logger.setLevel(logging.ERROR)
dsc.dist.get_rank = lambda: 0
class Mpu:
    def __init__(self, n): self.n = n
    def get_data_parallel_world_size(self): return self.n
out = []
for ds, dp in json.load(sys.stdin):
    try:
        c = dsc.DeepSpeedConfig(ds, mpu=Mpu(dp))
        out.append(["ok", [c.train_batch_size, c.train_micro_batch_size_per_gpu,
                           c.gradient_accumulation_steps]])
    except AssertionError as e:
        out.append(["assert", str(e)])
    except ZeroDivisionError as e:
        out.append(["zerodiv", str(e)])
# DeepSpeed prints to stdout: the answer goes to the file named by argv[1].
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


def main():
    ds_python = os.environ.get("ZTRAIN_DS_PYTHON") or venv_python(".venv-ds")
    if not os.path.exists(ds_python):
        sys.exit(f"{ds_python} is missing; run `scripts/install-deps.sh deepspeed`")
    cases = []
    for ws, stages in LAYOUTS:
        for vals in itertools.product(VALUES, repeat=3):
            if vals[0] is None and vals[1] is None:
                continue
            ds = {k: v for k, v in zip(KEYS, vals) if v is not None}
            cases.append((ds, ws, stages))
    with tempfile.TemporaryDirectory(prefix="ztrain-batch-rule-") as tmp:
        answer = os.path.join(tmp, "outcomes.json")
        ref = subprocess.run([ds_python, "-c", REFERENCE, answer], capture_output=True,
                             text=True, timeout=600,
                             input=json.dumps([[ds, ws // stages] for ds, ws, stages in cases]))
        if ref.returncode != 0:
            sys.exit(f"DeepSpeed's run failed ({ref.returncode}): {ref.stderr[-2000:]}")
        with open(answer) as f:
            outcomes = json.load(f)
    failures = []
    counts = {"ok": 0, "assert": 0, "zerodiv": 0}
    for (ds, ws, stages), (kind, what) in zip(cases, outcomes):
        counts[kind] += 1
        spec = (ztrain.JobSpec(name="b", world_size=ws).model(type="gpt2")
                .data(train="train.bin").deepspeed(ds))
        if stages > 1:
            spec.pipeline(stages=stages)
        try:
            spec.validate()
            got = None
        except ztrain.SpecError as e:
            got = e
        where = f"{ds} on world_size {ws}" + (f" in {stages} stages" if stages > 1 else "")
        if kind == "ok":
            if got is not None:
                failures.append(f"{where}: DeepSpeed accepts it ({what}), the client says {got}")
        elif got is None:
            failures.append(f"{where}: DeepSpeed refuses it ({kind}: {what}), the client "
                            f"accepts it")
        elif not got.field.startswith("spec.deepspeed.") or \
                got.field[len("spec.deepspeed."):] not in KEYS:
            failures.append(f"{where}: the refusal names {got.field}, not a batch key")
        elif kind == "assert" and not got.message.startswith(what):
            failures.append(f"{where}: DeepSpeed says {what!r}, the client {got.message!r}")
        elif kind == "zerodiv" and not any(k in got.message for k in KEYS if ds.get(k) == 0):
            failures.append(f"{where}: a division by zero, but the message does not name the "
                            f"key that is 0 ({got.message})")
    for f in failures[:30]:
        print("FAIL:", f)
    print(f"{len(cases)} configs: DeepSpeed accepts {counts['ok']}, asserts on "
          f"{counts['assert']}, divides by zero on {counts['zerodiv']}; "
          f"{len(failures)} disagreements")
    print("FAILED" if failures else "PASSED")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
