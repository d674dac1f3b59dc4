"""training_args.warmup_steps against transformers 5 itself (.venv-ds): for each case the
warmup_num_steps that HfTrainerDeepSpeedConfig.trainer_config_finalize fills into "auto" (its
source's max(1, get_warmup_steps(max_steps)), with TrainingArguments' own get_warmup_steps; the
config object itself needs accelerate, which .venv-ds lacks) equals the one in
`ztrain validate -o json`'s effective config for the same job: an int as steps, a float in
[0, 1) as a ratio of the training steps, int() of a fraction above 1, and 0 (no warmup).
transformers 5 has no warmup_ratio; tests/unit/test_ds_script.c covers transformers 4's.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_hf5_warmup.py (make test-deepspeed)
"""
import inspect
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv(".venv-ds", "scripts/install-deps.sh deepspeed")

sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from transformers import TrainingArguments  # noqa: E402
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig  # noqa: E402

from ztref import Checker, tool, write_llmc_tokens  # noqa: E402

MAX_STEPS = 10
CASES = [3, 0.25, 0.05, 0.5, 2.5, 1.0, 0, 12]


def ds_config():
    return {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}}


class Args:
    """TrainingArguments' own get_warmup_steps on its warmup_steps field: constructing the class
    needs accelerate (for the Trainer's devices), which .venv-ds does not hold."""
    get_warmup_steps = TrainingArguments.get_warmup_steps

    def __init__(self, warmup_steps):
        self.warmup_steps = warmup_steps


def transformers_fill(tmp, warmup):
    """What trainer_config_finalize fills: its own source says max(1, get_warmup_steps(N)) (the
    object itself needs accelerate to be built), get_warmup_steps is TrainingArguments' own."""
    assert TrainingArguments.__dataclass_fields__["warmup_steps"].type in (float, "float")
    assert "max(1, args.get_warmup_steps(num_training_steps))" in FINALIZE
    return max(1, Args(warmup).get_warmup_steps(MAX_STEPS))


def ztrain_fill(tmp, warmup):
    write_llmc_tokens(os.path.join(tmp, "t.bin"), [i % 16 for i in range(512)])
    job = {"model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 16,
                     "block_size": 8},
           "data": {"train": "t.bin"}, "train": {"max_steps": MAX_STEPS},
           "training_args": {"warmup_steps": warmup}, "deepspeed": ds_config()}
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    p = subprocess.run([tool("ztrain"), "validate", path, "-o", "json"], capture_output=True,
                       text=True, timeout=60)
    v = json.loads(p.stdout) if p.stdout.strip() else {}
    eff = v.get("effective_config") or {}
    return eff.get("scheduler", {}).get("params", {}).get("warmup_num_steps"), v.get("errors")


FINALIZE = inspect.getsource(HfTrainerDeepSpeedConfig.trainer_config_finalize)
ck = Checker()
with tempfile.TemporaryDirectory() as tmp:
    for w in CASES:
        want = transformers_fill(tmp, w)
        got, errors = ztrain_fill(tmp, w)
        ck.check(got == want and not errors, f"warmup_steps {w!r} over {MAX_STEPS} steps: ztrain fills "
                 f"warmup_num_steps {got}, transformers 5 {want} {errors or ''}")
ck.done()
