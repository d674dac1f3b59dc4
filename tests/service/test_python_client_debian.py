"""The Python client on Debian's python3 (python3-grpcio, python3-protobuf; Debian packages no
googleapis-common-protos), imported from the source tree as clients/python/README.md says, against
a real ztraind with a token. Every refusal must come out as docs/api.md's ApiError subclass with
the detail its error table names, decoded with the protobuf runtime alone.

  a. The interpreter is /usr/bin/python3 and google.rpc cannot be imported (a system that has it
     gets it hidden, so the fallback is what is tested).
  b. A missing job is NotFound: .code NOT_FOUND, .resource "jobs/job-999999" (ResourceInfo).
  c. A wrong token is Unauthenticated with ErrorInfo domain "ztrain", reason TOKEN_INVALID.
  d. A data path outside the data root is InvalidArgument naming spec.data.train (BadRequest).
  e. More ranks than --max-ranks is FailedPrecondition with a RANKS violation of
     spec.world_size (PreconditionFailure).
  f. examples/python/quickstart.py runs to its last cell (NOT_FOUND jobs/job-999999)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, SOURCE, Checker, Daemon, temp_dir, tiny_job  # noqa: E402

ck = Checker()
TOKEN = "debian-client-token"
CLIENT = os.path.join(SOURCE, "clients", "python")
# Run by every interpreter below: hides google.rpc when this system has it, as Debian's has not.
HIDE_GOOGLE_RPC = ("import sys\n"
                   "try:\n    import google.rpc.status_pb2\n"
                   "except ImportError:\n    pass\n"
                   "else:\n    sys.modules['google.rpc'] = None\n")


def refusal(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the class is what is checked
        return e
    return None


def details_named(err, name):
    return [m for m in err.details if m.DESCRIPTOR.full_name == "google.rpc." + name]


def main():
    ck.check(os.path.realpath(sys.executable) == os.path.realpath("/usr/bin/python3"),
             f"a: run by Debian's /usr/bin/python3 (got {sys.executable})")
    exec(HIDE_GOOGLE_RPC, {})
    try:
        import google.rpc.status_pb2  # noqa: F401
        hidden = False
    except ImportError:
        hidden = True
    ck.check(hidden, "a: google.rpc cannot be imported")
    sys.path.insert(0, CLIENT)
    import ztrain
    ck.check(ztrain.__file__.startswith(CLIENT), f"a: the source tree's client ({ztrain.__file__})")

    tmp = temp_dir("ztrain-pyclient-debian-")
    with Daemon(BUILD, os.path.join(tmp, "d"), max_ranks=1, token=TOKEN) as d:
        with ztrain.Client(d.grpc_addr, token=TOKEN) as c:
            e = refusal(lambda: c.get("job-999999"))
            ck.check(isinstance(e, ztrain.NotFound) and e.code == "NOT_FOUND" and
                     e.resource == "jobs/job-999999" and
                     details_named(e, "ResourceInfo"), f"b: a missing job: {e!r}")
            with ztrain.Client(d.grpc_addr, token="wrong") as wrong:
                e = refusal(lambda: wrong.get("job-999999"))
            info = details_named(e, "ErrorInfo") if isinstance(e, ztrain.ApiError) else []
            ck.check(isinstance(e, ztrain.Unauthenticated) and info and
                     info[0].domain == "ztrain" and info[0].reason == "TOKEN_INVALID",
                     f"c: a wrong token: {e!r} {info}")
            job = tiny_job(d.data_root)
            job["data"]["train"] = "/etc/passwd"
            e = refusal(lambda: c.submit(job))
            ck.check(isinstance(e, ztrain.InvalidArgument) and e.field == "spec.data.train" and
                     e.violations[0].kind == "field" and details_named(e, "BadRequest"),
                     f"d: a path outside the data root: {e!r}")
            e = refusal(lambda: c.submit(tiny_job(d.data_root, world_size=2, deepspeed={
                "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2})))
            kinds = [(v.kind, v.type, v.subject) for v in getattr(e, "violations", [])]
            ck.check(isinstance(e, ztrain.FailedPrecondition) and
                     ("precondition", "RANKS", "spec.world_size") in kinds,
                     f"e: 2 ranks on a --max-ranks 1 daemon: {e!r} {kinds}")
        env = dict(os.environ, ZTRAIN_ADDR=d.grpc_addr, ZTRAIN_TOKEN=TOKEN, PYTHONPATH=CLIENT)
        script = HIDE_GOOGLE_RPC + "import runpy\nrunpy.run_path(sys.argv[1], run_name='__main__')\n"
        out = subprocess.run([sys.executable, "-c", script,
                              os.path.join(SOURCE, "examples", "python", "quickstart.py")],
                             capture_output=True, text=True, timeout=180, env=env)
        ck.check(out.returncode == 0 and "SUCCEEDED at step 20" in out.stdout and
                 "NOT_FOUND jobs/job-999999" in out.stdout,
                 f"f: examples/python/quickstart.py under /usr/bin/python3 ({out.returncode}): "
                 f"{(out.stdout + out.stderr)[-400:]}")
    ck.done()


if __name__ == "__main__":
    main()
