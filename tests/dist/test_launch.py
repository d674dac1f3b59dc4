"""How `ztrain run` starts and supervises the ranks of a multi-rank job, and how `ztrain-worker`
reads its place in a job from a launcher's environment.

Each case trains a tiny GPT-2 (1 layer, n_embd 32, block 32) on byte-level text, in its own
directory, so that `pgrep -f <that job path>` finds exactly this case's processes:

  a. 2 ranks train to completion: exit 0, one metrics record per step (rank 0 writes them), rank 0
     alone prints progress, and no process is left.
  b. SIGKILL of rank 1 mid-run: `ztrain run` fails within 10 s naming rank 1 and signal 9, and takes
     rank 0 down with it. The ranks form their own process group and get the torchrun variables.
  c. SIGSTOP of rank 1 with ZTRAIN_COMM_TIMEOUT_S=3: rank 0's collective times out naming rank 1,
     and the run ends about 3 s later with nothing left (the stopped rank included); the last line
     blames rank 1, not rank 0 that exited first (docs/parallelism.md). The same over gloo with
     rank 0 stopped, and over shm with rank 0 stopped.
  d. ztrain-worker started by hand: torchrun variables for one rank; RANK >= WORLD_SIZE; Slurm's
     SLURM_PROCID/SLURM_NTASKS (two ranks trained together); WORLD_SIZE or SLURM_NTASKS different
     from the job's world_size, named as zt_dist_from_env read it (a stray LOCAL_RANK or an empty
     WORLD_SIZE leaves Slurm's in use); a malformed ZTRAIN_COMM_TIMEOUT_S.
  e. SIGINT to `ztrain run` with a checkpoint_dir: exit 130 and a complete checkpoint (DONE).
  f. ztrain-worker missing next to ztrain: the error names the path it tried.
  g. SIGKILL of `ztrain run` itself: its ranks follow it (they ask for SIGTERM on its death).
  h. A second signal (SIGINT, then SIGINT again) SIGKILLs the ranks: exit 137, not the 130 of a
     checkpointed stop (docs/getting-started.md's table), saying the last step was not
     checkpointed.
  i. A token file truncated while 1 or 2 ranks train from it: the rank that reads past its new end
     fails naming the file and both sizes ("changed size while training: N bytes, was M"), and
     the run exits 1, no rank dying of SIGBUS.
  j. The second signal of h on a job that offloads its optimizer state to NVMe files: the killed
     ranks cannot remove their offload directories, so `ztrain run` removes each one its ranks
     made and says so per rank, while a directory beside them that another run made (named like
     this job's rank 1's) is left as it was.
  k. A SIGTERM less than 1 s after the first is the same stop asked again, as a rank takes it
     (slurmd and supervisors send SIGTERM twice in a row; docs/getting-started.md): the run,
     still stopping when it comes, exits 130 with a complete checkpoint.
  l. SIGTERM to a ztrain-worker still waiting for the other ranks to meet (started by hand, the
     others never come; shm and gloo, rank 0 and rank 1; the default 300 s timeout): it stops
     within 5 s with the stop's exit status 130, naming what it waited for, and rank 0 leaves
     no shared-memory segment (a launcher's SIGTERM, torchrun's or Kubernetes', must not wait
     out the rendezvous timeout).
  m. Rank 0 SIGKILLed while rank 1 is slow to start (a ztrain-worker wrapper delays it), before
     rank 1 attached to its shared-memory segment: `ztrain run` fails naming rank 0, and the
     segment's name, which only rank 0 removes, is removed by `ztrain run` once both ranks ended
     (docs/parallelism.md: nothing is left in /dev/shm however the job ends).

Run: python3 tests/dist/test_launch.py [LETTERS] (e.g. "hj": only those cases)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from ztref import Checker, read_metrics, tool, write_job  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
ZTRAIN = tool("ztrain")
WORKER = tool("ztrain-worker")
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief.\n" * 80)
# Variables through which a launcher tells a process who it is; scrubbed from the tests' own
# environment so that only what a case sets is seen.
IDENTITY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "ZTRAIN_RUN_ID", "ZTRAIN_LAUNCHER_PID", "TORCHELASTIC_RUN_ID", "GROUP_RANK",
            "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_JOB_ID",
            "SLURM_STEP_ID", "SLURM_STEPID", "TORCHELASTIC_USE_AGENT_STORE",
            "SLURM_NODEID", "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
            "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NODELIST",
            "ZTRAIN_COMM_TIMEOUT_S")

ck = Checker()
top = tempfile.mkdtemp(prefix="ztrain-launch-")
counter = [0]


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def new_case(world_size=2, max_steps=10_000_000, log_interval=50, checkpoint=False):
    """A case directory holding train.txt and job.json; returns (dir, job path)."""
    counter[0] += 1
    d = os.path.join(top, f"case{counter[0]:02d}")
    os.makedirs(d)
    with open(os.path.join(d, "train.txt"), "wb") as f:
        f.write(TEXT)
    job = {"name": f"launch-{counter[0]}", "world_size": world_size,
           "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                     "block_size": 32},
           "data": {"train": "train.txt"},
           "train": {"max_steps": max_steps, "log_interval": log_interval, "warmup_steps": 0},
           "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}
    if checkpoint:
        job["train"]["checkpoint_dir"] = "ckpt"
    path = os.path.join(d, "job.json")
    write_job(path, job)
    return d, path


class Run:
    """`ztrain run JOB --out DIR` in the background, its output going to files (a pipe nobody
    reads could block the rank that prints)."""

    def __init__(self, job, env=None, program=ZTRAIN, **popen):
        self.dir = os.path.dirname(job)
        self.out_dir = os.path.join(self.dir, "out")
        self.stdout_path = os.path.join(self.dir, "stdout.txt")
        self.stderr_path = os.path.join(self.dir, "stderr.txt")
        with open(self.stdout_path, "wb") as o, open(self.stderr_path, "wb") as e:
            self.p = subprocess.Popen([program, "run", job, "--out", self.out_dir], stdout=o,
                                      stderr=e, env=env or base_env(), cwd=self.dir, **popen)
        self.ended_at = None

    def stdout(self):
        with open(self.stdout_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait(self, timeout):
        """The exit status, or None if it did not end within timeout seconds."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.ended_at = time.monotonic()
        return rc

    def wait_training(self, timeout=15):
        """Waits until rank 0 has printed a step line (the ranks have met and are training)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(r"^step \d+/", self.stdout(), re.M):
                return True
            if self.p.poll() is not None:
                return False
            time.sleep(0.05)
        return False


def children(pid):
    """Pids whose parent is pid, from /proc/*/stat (field 4, after the parenthesised name)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0") if "=" in kv)


def rank_pids(run, n=2, timeout=10):
    """{rank: pid} of the ztrain-worker children of `ztrain run`, read from RANK in their
    environment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = {}
        for c in children(run.p.pid):
            env = environ_of(c)
            if "RANK" in env:
                ranks[int(env["RANK"])] = c
        if len(ranks) == n:
            return ranks
        time.sleep(0.05)
    return {}


def both_training(case, run):
    """{rank: pid} once both ranks of the run train (checked, naming the case), or {}."""
    started = run.wait_training()
    ranks = rank_pids(run)
    ck.check(started and len(ranks) == 2, f"{case}: both ranks start and train ({ranks})")
    return ranks if len(ranks) == 2 else {}


def checkpoint_complete(case, d):
    """Checks that the case's checkpoint directory d/ckpt has `latest` naming a tag with DONE."""
    ckpt = os.path.join(d, "ckpt")
    tag = ""
    if os.path.exists(os.path.join(ckpt, "latest")):
        with open(os.path.join(ckpt, "latest")) as f:
            tag = f.read().strip()
    ck.check(tag and os.path.exists(os.path.join(ckpt, tag, "DONE")),
             f"{case}: the checkpoint '{tag}' is complete (DONE written)")


def leftovers(job):
    """Processes whose command line names this case's job file (zombies have none)."""
    p = subprocess.run(["pgrep", "-f", job], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()]


def no_leftovers(job, timeout=2.0):
    deadline = time.monotonic() + timeout
    while leftovers(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    return leftovers(job)


def cleanup(job, run=None):
    """Whatever a failed case left behind: continued (it may be stopped) and killed."""
    pids = leftovers(job)
    if run and run.p.poll() is None:
        pids.append(run.p.pid)
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    if run:
        run.wait(5)


def case_a():
    d, job = new_case(max_steps=40, log_interval=1)
    run = Run(job)
    try:
        rc = run.wait(60)
    finally:
        cleanup(job, run)
    out, err = run.stdout(), run.stderr()
    ck.check(rc == 0, f"a: a 2-rank job trains to completion (exit {rc}) {err.strip()}")
    path = os.path.join(run.out_dir, "metrics.jsonl")
    recs = read_metrics(path) if os.path.exists(path) else []
    steps = [r["train/global_step"] for r in recs if "train/loss" in r]
    ck.check(steps == list(range(1, 41)),
             f"a: metrics.jsonl has one train record per step, written once (by rank 0): "
             f"{len(steps)} records")
    ck.check(len(re.findall(r"^step 40/40 ", out, re.M)) == 1 and out.count("done: 40 steps") == 1,
             "a: progress and the final line are printed once (rank 0 only)")
    ck.check("ztrain-worker" not in err, f"a: no rank reports an error ({err.strip()[:200]!r})")
    left = no_leftovers(job)
    ck.check(not left, f"a: no process of the job is left ({left})")


def case_b():
    d, job = new_case()
    # A descriptor that ztrain run inherits must not reach the ranks (they get only 0-2).
    marker = os.path.join(d, "inherited-fd-marker")
    fd = os.open(marker, os.O_CREAT | os.O_WRONLY)
    os.set_inheritable(fd, True)
    try:
        run = Run(job, pass_fds=(fd,))
    finally:
        os.close(fd)
    try:
        ranks = both_training("b", run)
        if not ranks:
            return
        leaked = [pid for pid in ranks.values() for f in os.listdir(f"/proc/{pid}/fd")
                  if os.path.realpath(f"/proc/{pid}/fd/{f}") == marker]
        ck.check(not leaked, f"b: a descriptor open in `ztrain run` is not inherited by the ranks "
                             f"({leaked})")
        env0, env1 = environ_of(ranks[0]), environ_of(ranks[1])
        pgid0, pgid1 = os.getpgid(ranks[0]), os.getpgid(ranks[1])
        ck.check(pgid0 == ranks[0] and pgid1 == ranks[0] and pgid0 != os.getpgid(run.p.pid),
                 "b: the ranks form one new process group led by rank 0")
        # The user's OMP_NUM_THREADS (ctest sets one) wins over the launcher's share of the cores;
        # threads that outnumber the cores must not spin-wait (see launcher.c).
        cpus = len(os.sched_getaffinity(0))
        omp = os.environ.get("OMP_NUM_THREADS") or str(max(1, cpus // 2))
        # The user's OMP_WAIT_POLICY (ctest sets one too) is passed on as it is.
        policy = os.environ.get("OMP_WAIT_POLICY") or \
            ("PASSIVE" if int(omp) * 2 > cpus else None)
        ck.check(env0.get("OMP_NUM_THREADS") == omp and env0.get("OMP_WAIT_POLICY") == policy,
                 f"b: OMP_NUM_THREADS={env0.get('OMP_NUM_THREADS')} (expected {omp}), "
                 f"OMP_WAIT_POLICY={env0.get('OMP_WAIT_POLICY')} on {cpus} cores")
        same = all(env0.get(k) == env1.get(k) for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                        "MASTER_ADDR", "MASTER_PORT",
                                                        "ZTRAIN_RUN_ID", "OMP_NUM_THREADS"))
        ck.check(env0.get("WORLD_SIZE") == "2" and env0.get("LOCAL_WORLD_SIZE") == "2" and
                 env0.get("LOCAL_RANK") == "0" and env1.get("LOCAL_RANK") == "1" and
                 env0.get("MASTER_ADDR") == "127.0.0.1" and
                 env0.get("MASTER_PORT", "").isdigit() and env0.get("ZTRAIN_RUN_ID") and
                 same, "b: the ranks get the torchrun variables (the same job-wide values)")
        os.kill(ranks[1], signal.SIGKILL)
        t0 = time.monotonic()
        rc = run.wait(10)
        elapsed = time.monotonic() - t0
        err = run.stderr()
        ck.check(rc not in (None, 0), f"b: `ztrain run` fails after rank 1 is killed (exit {rc}, "
                                      f"{elapsed:.1f} s)")
        want = f"rank 1 (pid {ranks[1]}) was killed by signal 9 (SIGKILL)"
        ck.check(want in err and "signal 9" in err,
                 f"b: the error names rank 1 and signal 9: {err.strip().splitlines()[-1:]}")
        ck.check(not re.search(r"^ztrain: .*rank 0 \(pid", err, re.M),
                 "b: rank 0, which failed because rank 1 died, is not blamed")
        left = no_leftovers(job)
        ck.check(not left, f"b: no process of the job is left ({left})")
    finally:
        cleanup(job, run)


def case_c():
    stopped_rank_case("shm", 1, check_timing=True)
    stopped_rank_case("gloo", 0)
    stopped_rank_case("shm", 0)


def stopped_rank_case(comm, stopped, check_timing=False):
    d, job = new_case()
    with open(job) as f:
        spec = json.load(f)
    spec["comm"] = comm
    write_job(job, spec)
    run = Run(job, env=base_env(ZTRAIN_COMM_TIMEOUT_S=3))
    try:
        ranks = both_training("c", run)
        if not ranks:
            return
        os.kill(ranks[stopped], signal.SIGSTOP)
        t0 = time.monotonic()
        rc = run.wait(15)
        elapsed = time.monotonic() - t0
        err = run.stderr()
        ck.check(rc not in (None, 0) and (2.5 <= elapsed <= 7.0 or not check_timing),
                 f"c ({comm}, rank {stopped} stopped): the run ends after the 3 s timeout, "
                 f"without waiting out the kill grace (exit {rc}, {elapsed:.1f} s)")
        if check_timing:
            timeout_lines = [l for l in err.splitlines() if "timed out" in l]
            ck.check(any(re.search(r"rank(\(s\)|s)? 1\b", l) for l in timeout_lines),
                     f"c: the timeout error names the stopped rank 1: {timeout_lines[:1]}")
        last = err.strip().splitlines()[-1] if err.strip() else ""
        want = f"rank {stopped} (pid {ranks[stopped]}) stopped answering: it was stopped"
        ck.check(want in last, f"c ({comm}): the verdict blames the stopped rank {stopped}: {last}")
        left = no_leftovers(job)
        ck.check(not left, f"c: no process is left, the stopped rank included ({left})")
    finally:
        cleanup(job, run)


def worker(job, env, timeout=60, args=()):
    d = os.path.dirname(job)
    try:
        p = subprocess.run([WORKER, job, "--out", os.path.join(d, "out")] + list(args),
                           capture_output=True, text=True, env=env, cwd=d, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "(timed out)"
    return p.returncode, p.stdout, p.stderr


def case_d():
    d, job1 = new_case(world_size=1, max_steps=5, log_interval=1)
    torchrun = dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1,
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=29531, TORCHELASTIC_RUN_ID="none")
    rc, out, err = worker(job1, base_env(**torchrun))
    recs = read_metrics(os.path.join(d, "out", "metrics.jsonl")) if rc == 0 else []
    ck.check(rc == 0 and "done: 5 steps" in out and any(r.get("train/global_step") == 5
                                                        for r in recs),
             f"d: ztrain-worker under torchrun's variables (WORLD_SIZE=1) trains (exit {rc}) "
             f"{err.strip()}")

    _, job2 = new_case(world_size=2)
    rc, out, err = worker(job2, base_env(RANK=5, WORLD_SIZE=2, MASTER_PORT=29532))
    ck.check(rc == 1 and err.startswith("ztrain-worker: ") and "RANK=5" in err,
             f"d: RANK=5 WORLD_SIZE=2 fails naming RANK: {err.strip()}")

    rc, out, err = worker(job2, base_env(RANK=0, WORLD_SIZE=3, MASTER_PORT=29533), timeout=20)
    ck.check(rc == 1 and f"WORLD_SIZE=3 but {job2} says world_size 2" in err,
             f"d: WORLD_SIZE=3 against a world_size 2 job fails clearly: {err.strip()}")

    rc, out, err = worker(job2, base_env(SLURM_PROCID=0, SLURM_NTASKS=3), timeout=20)
    ck.check(rc == 1 and f"SLURM_NTASKS=3 but {job2} says world_size 2" in err,
             f"d: SLURM_NTASKS=3 against a world_size 2 job fails clearly: {err.strip()}")

    # The message names the variable that zt_dist_from_env read the world size from: a stray
    # LOCAL_RANK or an empty WORLD_SIZE does not make torchrun's variables the ones in use.
    rc, out, err = worker(job2, base_env(LOCAL_RANK=0, SLURM_PROCID=0, SLURM_NTASKS=4),
                          timeout=20)
    ck.check(rc == 1 and f"SLURM_NTASKS=4 but {job2} says world_size 2" in err,
             f"d: LOCAL_RANK=0 SLURM_PROCID=0 SLURM_NTASKS=4 names SLURM_NTASKS: {err.strip()}")
    rc, out, err = worker(job2, base_env(WORLD_SIZE="", RANK="", SLURM_PROCID=0,
                                         SLURM_NTASKS=3), timeout=20)
    ck.check(rc == 1 and f"SLURM_NTASKS=3 but {job2} says world_size 2" in err,
             f"d: an empty WORLD_SIZE is unset, SLURM_NTASKS=3 is named: {err.strip()}")

    rc, out, err = worker(job2, base_env(SLURM_PROCID=2, SLURM_NTASKS=2), timeout=20)
    ck.check(rc == 1 and "SLURM_PROCID=2" in err,
             f"d: SLURM_PROCID=2 SLURM_NTASKS=2 fails naming SLURM_PROCID: {err.strip()}")

    rc, out, err = worker(job2, base_env(RANK=0, WORLD_SIZE=2, MASTER_PORT=29534,
                                         ZTRAIN_COMM_TIMEOUT_S="soon"), timeout=20)
    ck.check(rc == 1 and "ZTRAIN_COMM_TIMEOUT_S" in err and "rank 0" in err,
             f"d: a malformed ZTRAIN_COMM_TIMEOUT_S fails naming it: {err.strip()}")
    # Past the longest the waits can count (1e9 s, in nanoseconds within int64): named as the
    # variable's fault and with the bound, not "timeout 1e+10 s is not positive".
    rc, out, err = worker(job2, base_env(RANK=0, WORLD_SIZE=2, MASTER_PORT=29534,
                                         ZTRAIN_COMM_TIMEOUT_S="1e10"), timeout=20)
    ck.check(rc == 1 and "ZTRAIN_COMM_TIMEOUT_S='1e10'" in err and "(0, 1e+09]" in err
             and "not positive" not in err,
             f"d: a ZTRAIN_COMM_TIMEOUT_S above 1e9 s fails naming it and the bound: {err.strip()}")

    # Two ranks started the way srun starts them: Slurm's variables only, a job id for the run,
    # and (no launcher dividing the cores here) one thread each.
    d3, job3 = new_case(world_size=2, max_steps=30, log_interval=1)
    job_id = str(100000 + os.getpid() % 900000)
    procs = []
    for r in range(2):
        env = base_env(SLURM_PROCID=r, SLURM_NTASKS=2, SLURM_LOCALID=r, SLURM_JOB_ID=job_id,
                       SLURM_NNODES=1, ZTRAIN_COMM_TIMEOUT_S=30, OMP_NUM_THREADS=1)
        procs.append(subprocess.Popen([WORKER, job3, "--out", os.path.join(d3, "out")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                      cwd=d3))
    results = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=60)
            results.append((p.returncode, o.decode(), e.decode()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    recs = read_metrics(os.path.join(d3, "out", "metrics.jsonl")) \
        if os.path.exists(os.path.join(d3, "out", "metrics.jsonl")) else []
    steps = [r["train/global_step"] for r in recs if "train/loss" in r]
    ck.check(len(results) == 2 and all(rc == 0 for rc, _, _ in results) and
             "done: 30 steps" in results[0][1] and results[1][1] == "" and
             steps == list(range(1, 31)),
             f"d: two ranks under SLURM_PROCID/SLURM_NTASKS train together, rank 0 alone "
             f"reporting ({[(rc, e.strip()) for rc, _, e in results]})")


def case_e():
    d, job = new_case(checkpoint=True)
    run = Run(job)
    try:
        ranks = both_training("e", run)
        if not ranks:
            return
        os.kill(run.p.pid, signal.SIGINT)
        rc = run.wait(20)
        out = run.stdout()
        ck.check(rc == 130, f"e: SIGINT stops `ztrain run` with exit 130 (exit {rc}) "
                            f"{run.stderr().strip()}")
        ck.check(re.search(r"^stopped at step \d+ \(checkpoint written\)", out, re.M) is not None,
                 "e: rank 0 reports the stop and the checkpoint")
        checkpoint_complete("e", d)
        left = no_leftovers(job)
        ck.check(not left, f"e: no process of the job is left ({left})")
    finally:
        cleanup(job, run)


def case_f():
    d, job = new_case()
    bindir = os.path.join(d, "bin")
    os.makedirs(bindir)
    lonely = os.path.join(bindir, "ztrain")
    shutil.copy(ZTRAIN, lonely)
    run = Run(job, program=lonely)
    try:
        rc = run.wait(20)
        err = run.stderr()
        ck.check(rc == 1 and os.path.join(bindir, "ztrain-worker") in err and
                 "No such file" in err,
                 f"f: a missing ztrain-worker is reported with its path: {err.strip()}")
    finally:
        cleanup(job, run)


def case_g():
    d, job = new_case()
    run = Run(job)
    try:
        ranks = both_training("g", run)
        if not ranks:
            return
        os.kill(run.p.pid, signal.SIGKILL)
        run.wait(5)
        left = no_leftovers(job, timeout=10)
        ck.check(not left, f"g: the ranks end when `ztrain run` is SIGKILLed ({left})")
    finally:
        cleanup(job, run)


def token_file(path, n_tokens):
    """An llm.c uint16 token file (magic 20240520, version 1) of byte-level tokens."""
    header = [20240520, 1, n_tokens] + [0] * 253
    body = (TEXT * (n_tokens // len(TEXT) + 1))[:n_tokens]
    with open(path, "wb") as f:
        f.write(b"".join(x.to_bytes(4, "little") for x in header))
        f.write(b"".join(b.to_bytes(2, "little") for b in body))
    return os.path.getsize(path)


def case_i():
    for world_size in (1, 2):
        d, job = new_case(world_size=world_size)
        with open(job) as f:
            spec = json.load(f)
        data = os.path.join(d, "train.bin")
        was = token_file(data, 200_000)
        spec["data"]["train"] = "train.bin"
        write_job(job, spec)
        run = Run(job)
        try:
            started = run.wait_training(timeout=30)
            ck.check(started, f"i: {world_size} rank(s) train from train.bin")
            if not started:
                continue
            os.truncate(data, 2048)
            rc = run.wait(30)
            err = run.stderr()
            want = f"train.bin: changed size while training: 2048 bytes, was {was}"
            ck.check(rc == 1 and want in err and "SIGBUS" not in err and "Bus error" not in err,
                     f"i: {world_size} rank(s): the truncated file is named with its sizes, exit 1 "
                     f"(exit {rc}): {err.strip()[-300:]}")
            left = no_leftovers(job)
            ck.check(not left, f"i: no process of the job is left ({left})")
        finally:
            cleanup(job, run)


def signal_twice(run):
    """A second signal to `ztrain run` while its first is handled: SIGINT, and SIGINT again once
    the first has been taken (a second Ctrl-C; not a SIGTERM, which within 1 s of the first is
    the same request: case k). The run was started with SLOW_RANK so that it is still stopping
    then. Its exit status and stderr."""
    os.kill(run.p.pid, signal.SIGINT)
    time.sleep(0.1)
    os.kill(run.p.pid, signal.SIGINT)
    rc = run.wait(20)
    return rc, run.stderr()


# Rank 0 sleeps this long a batch (ms), so that a run asked to stop is still stopping 0.1 s later.
SLOW_RANK = 300


def case_h():
    d, job = new_case(checkpoint=True, log_interval=1)
    run = Run(job, env=base_env(ZTRAIN_INJECT_SLOW_RANK=SLOW_RANK))
    try:
        ranks = both_training("h", run)
        if not ranks:
            return
        rc, err = signal_twice(run)
        ck.check(rc == 137, f"h: a second signal ends `ztrain run` with exit 137 (exit {rc}) "
                            f"{err.strip()}")
        ck.check("killed on a second signal; their last step was not checkpointed" in err,
                 f"h: it says the last step was not checkpointed: {err.strip()}")
        left = no_leftovers(job)
        ck.check(not left, f"h: no process of the job is left ({left})")
    finally:
        cleanup(job, run)


def case_j():
    d, job = new_case(checkpoint=True, log_interval=1)
    with open(job) as f:
        spec = json.load(f)
    spec["deepspeed"]["zero_optimization"] = {
        "stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "nvme"}}
    write_job(job, spec)
    nvme = os.path.join(d, "nvme")
    # Another run's directory beside this one's, as offload.c names them, with state in it.
    neighbour = os.path.join(nvme, f"ztrain-{spec['name']}-rank1-Other0")
    os.makedirs(neighbour)
    with open(os.path.join(neighbour, "exp_avg.bin"), "wb") as f:
        f.write(b"another run's state")
    tmp = os.path.join(d, "tmp")    # where the launcher keeps its record of the directories
    os.makedirs(tmp)
    run = Run(job, env=base_env(TMPDIR=tmp, ZTRAIN_INJECT_SLOW_RANK=SLOW_RANK))
    try:
        started = run.wait_training()
        ranks = rank_pids(run)
        ours = sorted(set(os.listdir(nvme)) - {os.path.basename(neighbour)})
        ck.check(started and len(ranks) == 2 and len(ours) == 2,
                 f"j: both ranks start, train and make their offload directories ({ranks}, {ours})")
        if len(ranks) != 2:
            return
        rc, err = signal_twice(run)
        ck.check(rc == 137, f"j: a second signal ends `ztrain run` with exit 137 (exit {rc})")
        left = sorted(os.listdir(nvme))
        ck.check(left == [os.path.basename(neighbour)],
                 f"j: the killed ranks' offload directories are removed, the other run's is "
                 f"kept ({left})")
        with open(os.path.join(neighbour, "exp_avg.bin"), "rb") as f:
            kept = f.read()
        ck.check(kept == b"another run's state", "j: the other run's file is untouched")
        for r, name in enumerate(ours):
            said = re.search(rf"rank (\d) was killed before it could remove its NVMe offload "
                             rf"directory: removed {re.escape(os.path.join(nvme, name))}$", err,
                             re.M)
            ck.check(said and said.group(1) == name.split("-rank")[1][0],
                     f"j: it names the directory it removed and its rank: {name} in "
                     f"{err.strip()[-600:]}")
        ck.check(not os.listdir(tmp), f"j: the record of the directories is removed too "
                                      f"({os.listdir(tmp)})")
    finally:
        cleanup(job, run)


def case_k():
    d, job = new_case(checkpoint=True, log_interval=1)
    run = Run(job, env=base_env(ZTRAIN_INJECT_SLOW_RANK=SLOW_RANK))
    try:
        ranks = both_training("k", run)
        if not ranks:
            return
        os.kill(run.p.pid, signal.SIGTERM)
        time.sleep(0.1)
        stopping = run.p.poll() is None
        os.kill(run.p.pid, signal.SIGTERM)
        rc = run.wait(20)
        ck.check(stopping, "k: the run is still stopping when the second SIGTERM comes")
        ck.check(rc == 130, f"k: SIGTERM twice within 1 s stops `ztrain run` with exit 130, as "
                            f"one (exit {rc}) {run.stderr().strip()[-300:]}")
        checkpoint_complete("k", d)
        left = no_leftovers(job)
        ck.check(not left, f"k: no process of the job is left ({left})")
    finally:
        cleanup(job, run)


def case_l():
    d, job = new_case(world_size=2)
    for comm, port in (("shm", 29541), ("gloo", 29542)):
        for rank in (0, 1):
            env = base_env(RANK=rank, WORLD_SIZE=2, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=2,
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port, ZTRAIN_COMM=comm)
            with open(os.path.join(d, "stderr.txt"), "wb") as e:
                p = subprocess.Popen([WORKER, job, "--out", os.path.join(d, "out")], env=env,
                                     cwd=d, stdout=subprocess.DEVNULL, stderr=e)
            time.sleep(1.0)
            p.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            try:
                rc = p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = None
            took = time.monotonic() - t0
            with open(os.path.join(d, "stderr.txt"), encoding="utf-8", errors="replace") as f:
                err = f.read().strip()
            waited_for = "rank(s) 1" if rank == 0 else ("rank 0" if comm == "shm" else
                                                         "127.0.0.1:29542")
            ck.check(rc == 130 and "a stop was asked for" in err and waited_for in err,
                     f"l ({comm}, rank {rank} alone): SIGTERM during the rendezvous stops it with "
                     f"130 in {took:.1f} s, naming {waited_for} (exit {rc}): {err[-300:]!r}")
            segments = [n for n in os.listdir("/dev/shm") if f"port{port}" in n]
            ck.check(not segments, f"l ({comm}, rank {rank}): no segment left ({segments})")


def case_m():
    d, job = new_case()
    bindir = os.path.join(d, "bin")
    os.makedirs(bindir)
    program = os.path.join(bindir, "ztrain")
    shutil.copy(ZTRAIN, program)
    with open(os.path.join(bindir, "ztrain-worker"), "w") as f:
        f.write(f'#!/bin/sh\n[ "$RANK" = 1 ] && sleep 60\nexec {WORKER} "$@"\n')
    os.chmod(os.path.join(bindir, "ztrain-worker"), 0o755)
    run = Run(job, program=program)
    try:
        ranks = rank_pids(run)
        mine = f"-{run.p.pid}-"
        segments = []
        deadline = time.monotonic() + 15
        while not segments and time.monotonic() < deadline:
            segments = [n for n in os.listdir("/dev/shm") if mine in n]
            time.sleep(0.05)
        ck.check(len(ranks) == 2 and segments, f"m: rank 0 made its segment ({segments}) while "
                                               f"rank 1 waits to start ({ranks})")
        if len(ranks) != 2:
            return
        os.kill(ranks[0], signal.SIGKILL)
        rc = run.wait(20)
        err = run.stderr()
        ck.check(rc == 1 and "rank 0" in err and "signal 9" in err,
                 f"m: the run fails naming rank 0 and SIGKILL (exit {rc}): {err.strip()[-200:]}")
        left = [n for n in os.listdir("/dev/shm") if mine in n]
        ck.check(not left, f"m: no shared-memory segment of the run is left ({left})")
    finally:
        for n in os.listdir("/dev/shm"):
            if f"-{run.p.pid}-" in n:
                os.unlink(os.path.join("/dev/shm", n))
        cleanup(job, run)


cases = (case_a, case_b, case_c, case_d, case_e, case_f, case_g, case_h, case_i, case_j, case_k,
         case_l, case_m)
try:
    for case in cases:
        if len(sys.argv) > 1 and case.__name__[-1] not in sys.argv[1]:
            continue
        t = time.monotonic()
        case()
        print(f"      ({case.__name__}: {time.monotonic() - t:.1f} s)")
finally:
    shutil.rmtree(top, ignore_errors=True)
ck.done()
