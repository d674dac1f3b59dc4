"""What the CLI tests share: where the source and the build are (ZTRAIN_SOURCE, ZTRAIN_BUILD), and
a check that prints each comparison and counts the failures. Without PyTorch, which ztref pulls in:
these tests only run programs and read their output."""
import os
import sys

SRC = os.environ.get("ZTRAIN_SOURCE") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("ZTRAIN_BUILD", os.path.join(SRC, "build")))
ZTRAIN = os.path.join(BUILD, "ztrain")
ZTRAIND = os.path.join(BUILD, "ztraind")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checker import Checker as Checks  # noqa: E402,F401  (the tests' one check)
