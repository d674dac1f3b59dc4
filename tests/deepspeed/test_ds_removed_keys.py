"""The keys of features DeepSpeed 0.19 removed, against DeepSpeed itself (.venv-ds): DeepSpeedConfig
refuses each one whatever its value (runtime/config.py, _reject_removed_config_keys, before it
reads anything else). ztrain's key table marks the same keys (`ztrain config-keys -o json`, the
rows whose note says "removed from DeepSpeed 0.19"), no more and no fewer than DeepSpeed's own
lists, and zt_lr_dump (the parser of `ztrain run`) refuses each of them, with each value below,
naming the key, where DeepSpeed refuses it too. A removed key is a section of the table (its
contents unlisted) exactly when DeepSpeed held an object in it; a scalar one is an ordinary row.

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

# What DeepSpeed held in a removed key whose 0.19 message does not say ("configuration block" is
# an object, "flag" and "configuration option" a scalar): the field types of DeepSpeed 0.18's
# models and getters, which 0.19 deleted (zero/config.py: mics_shard_size int = -1,
# mics_hierarchical_params_gather bool = False, zeropp_loco_param Optional[Dict]; runtime/
# config.py: amp, quantize_training and curriculum_learning are read as dicts).
DS018_OBJECT = {"amp": True, "quantize_training": True, "curriculum_learning": True,
                "zero_optimization.mics_shard_size": False,
                "zero_optimization.mics_hierarchical_params_gather": False,
                "zero_optimization.zeropp_loco_param": True}


def removed_is_object(key, message):
    if "block" in message:
        return True
    if " flag " in message or "configuration option" in message:
        return False
    return DS018_OBJECT.get(key)
VALUES = (None, {}, {"enabled": False}, False, 0)

ck = Checker()
messages = dict(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS, **{
    "zero_optimization." + k: m for k, m in ds_config._REMOVED_ZERO_CONFIG_KEYS.items()})
theirs = set(messages)
rows = json.loads(subprocess.run([tool("ztrain"), "config-keys", "-o", "json"], check=True,
                                 capture_output=True, text=True).stdout)
ours = {r["key"] for r in rows if "removed from DeepSpeed 0.19" in (r.get("note") or "")}
ck.check(ours == theirs, f"the removed keys are DeepSpeed's: only DeepSpeed's {sorted(theirs - ours)}"
         f", only ztrain's {sorted(ours - theirs)}")
by_key = {r["key"]: r for r in rows}
for key, message in sorted(messages.items()):
    obj = removed_is_object(key, message)
    row = by_key.get(key, {})
    ck.check(obj is not None and row.get("fate") == "refused" and row.get("section") is obj and
             row.get("contents_listed") is not obj,
             f"config-keys -o json: removed key {key} is refused, section {obj} as its value in "
             f"DeepSpeed is {'an object' if obj else 'a scalar'} (section {row.get('section')}, "
             f"contents_listed {row.get('contents_listed')})")

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
