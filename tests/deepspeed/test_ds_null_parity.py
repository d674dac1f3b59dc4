"""JSON null in a DeepSpeed config against DeepSpeed 0.19 itself (.venv-ds): for every top-level
key of ztrain's key table (`ztrain config-keys -o json`), and for the fields of the pydantic
sections (fp16, bf16, zero_optimization and its offload sections), a config holding that key as
null is read by DeepSpeedConfig and by zt_lr_dump (the parser of `ztrain run`): ztrain refuses
exactly where DeepSpeed fails, and accepts where DeepSpeed reads None as its default.
gradient_clipping is the one exception by design: DeepSpeedConfig keeps None, and the engine's
first step then fails comparing it with 0.0 (engine.py _take_model_step), so ztrain refuses it
at once.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_null_parity.py (make test-deepspeed)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dsref import tool, zt_lr_dump  # noqa: E402  (re-executes under .venv-ds)

from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from ztref import Checker  # noqa: E402

BASE = {"train_batch_size": 2}
ENGINE_FAILS = {"gradient_clipping"}


def deepspeed_ok(cfg):
    try:
        DeepSpeedConfig(cfg)
        return True, ""
    except Exception as e:
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"


def ztrain_ok(tmp, cfg):
    p = zt_lr_dump(tmp, cfg)
    return p.returncode == 0, p.stderr.strip()[-160:]


rows = json.loads(subprocess.run([tool("ztrain"), "config-keys", "-o", "json"], check=True,
                                 capture_output=True, text=True).stdout)
cases = {}
for r in rows:
    key = r["key"]
    if "." not in key and key not in BASE:
        cases[key] = dict(BASE, **{key: None})
    parts = key.split(".")
    # The fields of the pydantic sections, each null inside its section (ZeRO stage 3 so that
    # every field of it is read, an offload section with its device).
    if parts[0] in ("fp16", "bf16") and len(parts) == 2:
        cases[key] = dict(BASE, **{parts[0]: {parts[1]: None}})
    if parts[0] == "zero_optimization" and len(parts) == 2 and parts[1] != "stage":
        cases[key] = dict(BASE, zero_optimization={"stage": 3, parts[1]: None})
    if parts[0] == "zero_optimization" and len(parts) == 3 and parts[1].startswith("offload_"):
        cases[key] = dict(BASE, zero_optimization={"stage": 3, parts[1]: {"device": "cpu",
                                                                         parts[2]: None}})

ck = Checker()
with tempfile.TemporaryDirectory() as tmp:
    agree = 0
    for key, cfg in cases.items():
        ds, why = deepspeed_ok(cfg)
        zt, msg = ztrain_ok(tmp, cfg)
        if key in ENGINE_FAILS:
            ck.check(ds and not zt and key in msg, f"{key}: null refused by name (DeepSpeed's engine "
                     f"fails on it at the first step): {msg}")
        elif ds == zt and (ds or key.split(".")[-1] in msg or "removed" in msg):
            agree += 1
        else:
            ck.check(False, f"{key}: null: DeepSpeed {'accepts' if ds else 'fails: ' + why}, "
                     f"ztrain {'accepts' if zt else 'refuses: ' + msg}")
    ck.check(agree > 100, f"{agree} keys as null: ztrain accepts or refuses as DeepSpeed does")
ck.done()
