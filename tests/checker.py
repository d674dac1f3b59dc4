"""The check every Python test counts with: check(ok, what) prints "ok" or "FAIL" and the text and
returns ok; done() (or finish()) ends the test, exiting non-zero when any check failed. The CLI,
service and reference helpers (cli/cliref.py, service/svc.py, reference/ztref.py) all hand out
this one."""


class Checker:
    def __init__(self):
        self.failed = 0

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        self.failed += 0 if ok else 1
        return ok

    def done(self):
        if self.failed:
            raise SystemExit(f"{self.failed} check(s) failed")
        print("all checks passed")

    finish = done
