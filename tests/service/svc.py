"""Shared pieces of the service tests: the build, Python gRPC stubs generated at test time, a real
ztraind on free ports with its own state, data and runs directories, tiny jobs, and waits.

    from svc import Checker, Daemon, stubs, tiny_job, spec_proto, wait_state

    pb, rpc = stubs()
    with Daemon(BUILD, tmp, max_ranks=1) as d:
        job = tiny_job(d.data_root, max_steps=20)
        j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job)), metadata=d.metadata)
        wait_state(d, j.id, {"SUCCEEDED"})

Nothing here imports torch, so a service test starts in well under a second. Each test is a
standalone /usr/bin/python3 script run by ctest with ZTRAIN_BUILD and ZTRAIN_SOURCE set."""
import atexit
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.environ.get("ZTRAIN_SOURCE", os.path.join(HERE, "..", "..")))
BUILD = os.path.abspath(os.environ.get("ZTRAIN_BUILD", os.path.join(SOURCE, "build")))
HEALTH_PROTO_DIR = "/usr/share/grpc-proto/grpc/health/v1"

# Byte-level text for vocab 256: long enough for a few hundred steps of block 32.
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief, it was the epoch of "
        b"incredulity, it was the season of Light, it was the season of Darkness.\n") * 60

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
# max_steps of a job that runs until it is cancelled; as since_step, it skips every record.
LONG = 10_000_000

# ctest shows a test's output as it goes only when it is flushed line by line.
sys.stdout.reconfigure(line_buffering=True)


def tool(name):
    return os.path.join(BUILD, name)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checker import Checker  # noqa: E402,F401  (the tests' one check)


# ---- stubs ---------------------------------------------------------------------------------

_stubs = None


def stubs():
    """(ztrain_pb2, ztrain_pb2_grpc, health_pb2, health_pb2_grpc), generated once per process
    with protoc and Debian's grpc_python_plugin into a temporary directory."""
    global _stubs
    if _stubs:
        return _stubs
    out = tempfile.mkdtemp(prefix="ztrain-stubs-")
    atexit.register(shutil.rmtree, out, True)
    plugin = "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"
    for include, proto in ((os.path.join(SOURCE, "proto"), "ztrain.proto"),
                           (HEALTH_PROTO_DIR, "health.proto")):
        subprocess.run(["protoc", "-I", include, f"--python_out={out}", f"--grpc_out={out}", plugin,
                        proto], check=True)
    sys.path.insert(0, out)
    import health_pb2
    import health_pb2_grpc
    import ztrain_pb2
    import ztrain_pb2_grpc
    _stubs = (ztrain_pb2, ztrain_pb2_grpc, health_pb2, health_pb2_grpc)
    return _stubs


def state_name(value):
    """"RUNNING" for JOB_STATE_RUNNING's number."""
    pb = stubs()[0]
    return pb.JobState.Name(value).replace("JOB_STATE_", "")


# ---- the daemon ----------------------------------------------------------------------------

class Daemon:
    """A ztraind on 127.0.0.1 with free ports (kept across restart) and everything under tmpdir:
    state/ (SQLite), data/ (the data root), runs/ (the runs root). stdout and stderr go to
    tmpdir/ztraind.log, which log() returns."""

    def __init__(self, build, tmpdir, max_ranks=1, token=None, extra_args=(), threads_per_rank=1,
                 grace=None, start=True, env=None, open_files=None):
        self.build = os.path.abspath(build)
        self.dir = tmpdir
        self.state_dir = os.path.join(tmpdir, "state")
        self.data_root = os.path.join(tmpdir, "data")
        self.runs_root = os.path.join(tmpdir, "runs")
        os.makedirs(self.data_root, exist_ok=True)
        os.makedirs(self.runs_root, exist_ok=True)
        self.max_ranks = max_ranks
        self.token = token
        self.token_file = None
        if token:
            self.token_file = os.path.join(tmpdir, "token")
            with open(self.token_file, "w") as f:
                f.write(token + "\n")
        self.extra_args = list(extra_args)
        self.threads_per_rank = threads_per_rank
        self.grace = grace
        self.env = env or {}   # variables set for ztraind (and so its ranks) beyond the tests'
        self.open_files = open_files   # ztraind's open-file limit, soft and hard (None: ours)
        self.log_path = os.path.join(tmpdir, "ztraind.log")
        self.grpc_port = 0
        self.http_port = 0
        self.proc = None
        # Every pid this daemon had, one per start(): what a killed one left behind is found by it.
        self.pids = []
        self._channel = None
        if start:
            self.start()

    @property
    def grpc_addr(self):
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self):
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metadata(self):
        """The call metadata this daemon needs (the bearer token, when it has one)."""
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def args(self):
        a = [os.path.join(self.build, "ztraind"),
             "--grpc-addr", f"127.0.0.1:{self.grpc_port}",
             "--http-addr", f"127.0.0.1:{self.http_port}",
             "--state-dir", self.state_dir, "--data-root", self.data_root,
             "--runs-root", self.runs_root, "--max-ranks", str(self.max_ranks),
             "--threads-per-rank", str(self.threads_per_rank)]
        if self.grace is not None:
            a += ["--grace", str(self.grace)]
        if self.token_file:
            a += ["--token-file", self.token_file]
        return a + self.extra_args

    def start(self, timeout=30):
        """Starts ztraind and waits for its ready line, which names the ports it bound."""
        env = dict(os.environ)
        env.pop("ZTRAIN_TOKEN", None)
        env.update(self.env)
        with open(self.log_path, "ab") as log:
            start_offset = log.tell()
            limit = self.open_files
            self.proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.dir,
                preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
                if limit else None)
        self.pids.append(self.proc.pid)
        # A test that dies on an exception must not leave its daemon (and its ranks) running.
        atexit.register(self.kill)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log(start_offset)
            m = re.search(r"ztraind: ready grpc=\S+:(\d+) http=https?://\S+:(\d+)", text)
            if m:
                self.grpc_port, self.http_port = int(m.group(1)), int(m.group(2))
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"ztraind exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"ztraind did not get ready in {timeout} s:\n{self.log()}")

    def log(self, offset=0):
        """The daemon's log from byte `offset` on (a byte offset: its lines hold UTF-8 names)."""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")

    def sanitizer_errors(self):
        """The first lines of any AddressSanitizer, LeakSanitizer or UBSan report in the log (in
        a -DZT_SANITIZE=ON build); empty when there is none. Leaks show up after stop()."""
        pat = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:")
        return [l for l in self.log().splitlines() if pat.search(l)][:5]

    def peak_rss_kib(self):
        """The running daemon's peak resident set size (VmHWM), KiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no VmHWM in /proc/{self.proc.pid}/status")

    def _close_channel(self):
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def stop(self, timeout=30):
        """SIGTERM and wait; returns the exit status (None if it had to be killed)."""
        self._close_channel()
        if not self.proc or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        self._close_channel()
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self):
        """Stops and starts again on the same ports with the same state."""
        self.stop()
        return self.start()

    def channel(self):
        import grpc
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.grpc_addr)
        return self._channel

    def stub(self):
        return stubs()[1].TrainerStub(self.channel())

    def health(self):
        return stubs()[3].HealthStub(self.channel())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# ---- jobs ----------------------------------------------------------------------------------

def error_of(body):
    """The "error" text of an HTTP JSON error body, or "" when the body is not one."""
    try:
        return json.loads(body).get("error", "")
    except ValueError:
        return ""


def write_data(data_root, name="train.txt", data=TEXT):
    """Writes data_root/name unless it already holds `data`. A new version goes in through a
    rename: ranks map their data file, and truncating a mapped file kills them with SIGBUS."""
    path = os.path.join(data_root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return name
    except OSError:
        pass
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return name


def tiny_job(data_root, name="tiny", max_steps=20, log_interval=1, world_size=1, deepspeed=None,
             data_name="train.txt", **train):
    """A job-spec dict (the JSON file format) for a 2-layer, n_embd 32, block 32 GPT-2 on byte
    text, writing that text into data_root. Extra keyword arguments go to "train"."""
    write_data(data_root, data_name)
    t = {"max_steps": max_steps, "log_interval": log_interval, "warmup_steps": 0}
    t.update(train)
    return {"name": name, "world_size": world_size, "device": "cpu",
            "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                      "block_size": 32},
            "data": {"train": data_name},
            "train": t,
            "deepspeed": deepspeed if deepspeed is not None else
            {"train_micro_batch_size_per_gpu": 2,
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}


def spec_proto(job):
    """The JobSpec message for a job-spec dict ("deepspeed" inline or as text)."""
    pb = stubs()[0]
    ds = job.get("deepspeed")
    spec = pb.JobSpec(name=job.get("name", ""), world_size=job.get("world_size", 0),
                      device=job.get("device", ""),
                      deepspeed_json=ds if isinstance(ds, str) else json.dumps(ds or {}))
    if "model" in job:
        spec.model.CopyFrom(pb.ModelSpec(**job["model"]))
    if "data" in job:
        spec.data.CopyFrom(pb.DataSpec(**job["data"]))
    if "train" in job:
        spec.train.CopyFrom(pb.TrainOptions(**job["train"]))
    if "training_args" in job:
        spec.training_args.CopyFrom(pb.TrainingArgs(**job["training_args"]))
    if "events" in job:
        spec.events_json = json.dumps(job["events"])
    if "alerts" in job:
        spec.alerts_json = json.dumps(job["alerts"])
    return spec


def submit(d, job, key=""):
    pb = stubs()[0]
    return d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job), idempotency_key=key),
                              metadata=d.metadata, timeout=30)


def get_job(d, job_id):
    pb = stubs()[0]
    return d.stub().GetJob(pb.GetJobRequest(id=job_id), metadata=d.metadata, timeout=30)


def wait_state(d, job_id, states, timeout=60, poll=0.05):
    """Polls GetJob until the job's state is one of `states` (names like "RUNNING"); returns the
    Job, or the last one seen when the time ran out."""
    deadline = time.monotonic() + timeout
    while True:
        j = get_job(d, job_id)
        if state_name(j.state) in states or time.monotonic() > deadline:
            return j
        time.sleep(poll)


def wait_step(d, job_id, step, timeout=60):
    """Waits until the job reports at least `step` (or ends); returns the Job."""
    deadline = time.monotonic() + timeout
    while True:
        j = get_job(d, job_id)
        if j.step >= step or state_name(j.state) in TERMINAL or time.monotonic() > deadline:
            return j
        time.sleep(0.05)


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def alive(pid):
    """Whether a process exists and is not a zombie (read from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_gone(pids, timeout=10):
    """The pids still alive after waiting up to timeout seconds for them to end."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if p and alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def daemon_ranks(daemon_pid):
    """Pids of the live processes a ztraind with this pid started as ranks: their ZTRAIN_RUN_ID
    is ztraind<pid>-<job id> (supervisor.c), which also tells them from other daemons' ranks."""
    mark = f"\0ZTRAIN_RUN_ID=ztraind{daemon_pid}-".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue
        if mark in env and alive(int(name)):
            found.append(int(name))
    return found


def daemon_shm(daemon_pid):
    """The /dev/shm segments of the shm communicator left by ranks of a ztraind with this pid
    (named /ztrain-<uid>-<ZTRAIN_RUN_ID>, engine/comm/comm_shm.c)."""
    prefix = f"ztrain-{os.getuid()}-ztraind{daemon_pid}-"
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def temp_dir(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return d
