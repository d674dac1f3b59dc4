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


class Checks:
    """check(ok, what) prints "ok" or "FAIL" and the text, and returns ok; finish() prints the
    verdict and exits 1 when any check failed."""

    def __init__(self):
        self.failed = 0

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        self.failed += 0 if ok else 1
        return ok

    def finish(self):
        print("FAILED" if self.failed else "PASSED")
        sys.exit(1 if self.failed else 0)
