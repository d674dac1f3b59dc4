"""The keys of features DeepSpeed 0.19 removed, against DeepSpeed itself (.venv-ds): DeepSpeedConfig
refuses each one whatever its value (runtime/config.py, _reject_removed_config_keys, before it
reads anything else). ztrain's key table marks the same keys (`ztrain config-keys -o json`, the
rows whose note says "removed from DeepSpeed 0.19"), no more and no fewer than DeepSpeed's own
lists, and zt_lr_dump (the parser of `ztrain run`) refuses each of them, with each value below,
naming the key, where DeepSpeed refuses it too.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_ds_removed_keys.py (make test-deepspeed)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dsref import tool, zt_lr_dump  # noqa: E402  (re-executes under .venv-ds)

from deepspeed.runtime import config as ds_config  # noqa: E402
from ztref import Checker  # noqa: E402

BASE = {"train_batch_size": 2}
VALUES = (None, {}, {"enabled": False}, False, 0)

ck = Checker()
theirs = set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS) | {
    "zero_optimization." + k for k in ds_config._REMOVED_ZERO_CONFIG_KEYS}
rows = json.loads(subprocess.run([tool("ztrain"), "config-keys", "-o", "json"], check=True,
                                 capture_output=True, text=True).stdout)
ours = {r["key"] for r in rows if "removed from DeepSpeed 0.19" in (r.get("note") or "")}
ck.check(ours == theirs, f"the removed keys are DeepSpeed's: only DeepSpeed's {sorted(theirs - ours)}"
         f", only ztrain's {sorted(ours - theirs)}")

with tempfile.TemporaryDirectory() as tmp:
    for key in sorted(theirs):
        for value in VALUES:
            if key.startswith("zero_optimization."):
                cfg = dict(BASE, zero_optimization={"stage": 1, key.split(".", 1)[1]: value})
            else:
                cfg = dict(BASE, **{key: value})
            try:
                ds_config.DeepSpeedConfig(cfg)
                ds_refuses = False
            except ds_config.DeepSpeedConfigError:
                ds_refuses = True
            p = zt_lr_dump(tmp, cfg)
            ck.check(ds_refuses and p.returncode != 0 and f"{key}: removed from DeepSpeed 0.19"
                     in p.stderr, f"{key} = {json.dumps(value)}: DeepSpeed "
                     f"{'refuses' if ds_refuses else 'accepts'}, ztrain: {p.stderr.strip()[-150:]!r}")
    # DeepSpeed looks into zero_optimization only when it is an object (the legacy boolean form).
    cfg = dict(BASE, zero_optimization=True)
    ds_config.DeepSpeedConfig(dict(cfg))
    p = zt_lr_dump(tmp, cfg)
    ck.check("removed" not in p.stderr, f"\"zero_optimization\": true is not a removed key: "
             f"{p.stderr.strip()[-150:]!r}")
ck.done()
