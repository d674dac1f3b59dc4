"""What the scripts of tests/deepspeed/ share. Importing it re-executes the script under .venv-ds
(DeepSpeed 0.19, torch 2.x, transformers 5; `scripts/install-deps.sh deepspeed` makes it), on
DeepSpeed's CPU accelerator with DeepSpeed's logger quiet, and puts tests/reference (ztref) on the
path. zt_lr_dump parses a DeepSpeed config as `ztrain run` does (the build's zt_lr_dump tool)."""
import json
import logging
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv(".venv-ds", "scripts/install-deps.sh deepspeed")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

from deepspeed.utils import logger  # noqa: E402

from ztref import tool  # noqa: E402

logger.setLevel(logging.ERROR)


def zt_lr_dump(tmp, cfg, updates=1):
    """Writes the config cfg (a dict) to tmp/ds.json and parses it with zt_lr_dump, which prints
    the lr of each of the first `updates` updates: the CompletedProcess, output as text."""
    path = os.path.join(tmp, "ds.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return subprocess.run([tool("zt_lr_dump"), path, str(updates)], capture_output=True,
                          text=True, timeout=60)
