"""How ztrain-worker ranks meet when a multi-node launcher starts them (engine/comm/dist_env.c,
comm_gloo_rdzv.cc, docs/parallelism.md), each case on this host's loopback:

  a. torchrun's static rendezvous (--nnodes=2 --node_rank=N --master_addr --master_port),
     through torch's own launcher API as torchrun calls it (elastic_launch, rdzv_backend
     "static"; torch 1.13 under Debian's python3, and torch 2.x when run by a Python that has
     it): 2 "nodes" x 1 rank, whose agent already serves its TCPStore at MASTER_PORT and sets
     TORCHELASTIC_USE_AGENT_STORE=True. Both nodes train over gloo (ztrain's store one port up)
     to the losses `ztrain run` gives the same job. Then 1 node x 2 ranks with ZTRAIN_COMM=gloo.
  b. Two ranks over gloo whose job files (in different directories, as on two nodes) differ in
     the optimizer's lr, then in the model's width: both fail at once (well within the timeout),
     naming rank 0, rank 1 and the key (deepspeed.optimizer.params.lr, model.n_embd).
  c. A MASTER_ADDR that never resolves (".invalid", RFC 6761) with ZTRAIN_COMM_TIMEOUT_S=2: the
     rank waits for it the whole timeout, as PyTorch does, then fails naming the name.
  d. Two srun steps of one Slurm allocation at once (the same SLURM_JOB_ID, SLURM_STEP_ID 0 and
     1), 2 ranks each on this host: both train, neither taking the other's run id or port."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from ztref import Checker, read_metrics, tool, write_job  # noqa: E402
from ports import free_port  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
ZTRAIN = os.path.abspath(tool("ztrain"))
WORKER = os.path.abspath(tool("ztrain-worker"))
PYTHON = sys.executable
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief.\n" * 80)
IDENTITY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "ZTRAIN_RUN_ID", "ZTRAIN_LAUNCHER_PID", "TORCHELASTIC_RUN_ID", "GROUP_RANK",
            "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS",
            "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_NODEID",
            "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
            "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST",
            "SLURM_NODELIST", "ZTRAIN_COMM", "ZTRAIN_COMM_TIMEOUT_S", "GLOO_SOCKET_IFNAME")


# What torchrun runs in its static form (--nnodes=N --node_rank=R --master_addr --master_port,
# no --rdzv_backend): torch's launcher API with rdzv_backend "static". Called directly because
# Debian's torch 1.13 command line fails under Python 3.11 before it starts anything (its
# default redirects are None); argv: node rank, port, nodes, ranks per node, then the program.
LAUNCH = """
import inspect, sys
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
node, port, nodes, per_node = (int(a) for a in sys.argv[1:5])
kw = {}
if "redirects" in inspect.signature(LaunchConfig).parameters:  # torch 1.x
    from torch.distributed.elastic.multiprocessing import Std
    kw = dict(redirects=Std.NONE, tee=Std.NONE, log_dir=None)
cfg = LaunchConfig(min_nodes=nodes, max_nodes=nodes, nproc_per_node=per_node, run_id="none",
                   role="default", rdzv_endpoint=f"127.0.0.1:{port}", rdzv_backend="static",
                   rdzv_configs={"rank": node, "timeout": 60}, max_restarts=0,
                   monitor_interval=1, start_method="spawn", **kw)
elastic_launch(cfg, entrypoint=sys.argv[5])(*sys.argv[6:])
"""


def torchrun(node, port, nodes, per_node, *args):
    return [PYTHON, "-c", LAUNCH, str(node), str(port), str(nodes), str(per_node), *args]


ck = Checker()
top = tempfile.mkdtemp(prefix="ztrain-rdzv-")
counter = [0]


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY}
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def new_case(lr=1e-3, max_steps=6, sub=None):
    counter[0] += 1
    d = os.path.join(top, f"case{counter[0]:02d}")
    if sub:
        d = os.path.join(d, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "train.txt"), "wb") as f:
        f.write(TEXT)
    job = {"name": "rdzv", "world_size": 2,
           "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                     "block_size": 32},
           "data": {"train": "train.txt"},
           "train": {"max_steps": max_steps, "log_interval": 1, "warmup_steps": 0, "seed": 1},
           "deepspeed": {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                         "optimizer": {"type": "AdamW", "params": {"lr": lr}}}}
    path = os.path.join(d, "job.json")
    write_job(path, job)
    return d, path


def start(args, env, cwd, log):
    f = open(os.path.join(cwd, log), "wb")
    return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd), f


def finish(procs, timeout):
    """Exit statuses (None for a process killed at the timeout)."""
    deadline = time.monotonic() + timeout
    out = []
    for p, f in procs:
        try:
            out.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            out.append(None)
        f.close()
    return out


def text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def losses(out_dir):
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [r["train/loss"] for r in read_metrics(path) if "train/loss" in r]


def case_a():
    d, job = new_case()
    ref = subprocess.run([ZTRAIN, "run", job, "--out", os.path.join(d, "ref")],
                         capture_output=True, text=True, env=base_env(), cwd=d, timeout=120)
    want = losses(os.path.join(d, "ref"))
    ck.check(ref.returncode == 0 and len(want) == 6, f"a: `ztrain run` of the job trains "
             f"({ref.returncode}) {ref.stderr.strip()[-300:]}")

    port = free_port(2)
    out = os.path.join(d, "tr")
    procs = [start(torchrun(node, port, 2, 1, WORKER, job, "--out", out),
                   base_env(ZTRAIN_COMM_TIMEOUT_S=60), d, f"node{node}.log") for node in (0, 1)]
    rcs = finish(procs, 150)
    logs = [text(os.path.join(d, f"node{n}.log")) for n in (0, 1)]
    ok = rcs == [0, 0] and "done: 6 steps" in logs[0]
    ck.check(ok, f"a: torchrun's static rendezvous, 2 nodes x 1 rank, trains (exit {rcs})" +
             ("" if ok else f": {logs[0].strip()[-600:]} | {logs[1].strip()[-300:]}"))
    ck.check("comm transport gloo" in logs[0] and f"rendezvous at 127.0.0.1:{port + 1}" in logs[0],
             f"a: rank 0 meets the others at MASTER_PORT+1 = {port + 1}, beside the agent's "
             f"store at {port}")
    got = losses(out)
    ck.check(len(want) == 6 and got == want,
             f"a: the losses equal `ztrain run`'s on one host: {got} vs {want}")

    port = free_port(2)
    out = os.path.join(d, "tr1")
    procs = [start(torchrun(0, port, 1, 2, WORKER, job, "--out", out),
                   base_env(ZTRAIN_COMM="gloo", ZTRAIN_COMM_TIMEOUT_S=60), d, "one.log")]
    rcs = finish(procs, 150)
    log = text(os.path.join(d, "one.log"))
    ok = rcs == [0] and "done: 6 steps" in log and losses(out) == want
    ck.check(ok, f"a: 1 node x 2 ranks with ZTRAIN_COMM=gloo trains to the same losses "
             f"(exit {rcs})" + ("" if ok else f": {log.strip()[-600:]}"))


def pair(jobs, env_of, timeout):
    procs = []
    for r, job in enumerate(jobs):
        d = os.path.dirname(job)
        procs.append(start([WORKER, job, "--out", os.path.join(d, "out")], env_of(r), d,
                           f"rank{r}.log"))
    t0 = time.monotonic()
    rcs = finish(procs, timeout)
    logs = [text(os.path.join(os.path.dirname(j), f"rank{r}.log")) for r, j in enumerate(jobs)]
    return rcs, logs, time.monotonic() - t0


def case_b():
    # The job files sit in different directories, as on two nodes: their paths differ, which is
    # allowed; the lr, then the model's width, is not.
    for what, key, second in (("lr", "deepspeed.optimizer.params.lr", {"lr": 5e-2}),
                              ("model size", "model.n_embd", {"n_embd": 64})):
        _, job0 = new_case(sub="node0")
        counter[0] -= 1
        _, job1 = new_case(sub="node1")
        with open(job1) as f:
            spec = json.load(f)
        if "lr" in second:
            spec["deepspeed"]["optimizer"]["params"]["lr"] = second["lr"]
        else:
            spec["model"].update(second)
        write_job(job1, spec)
        counter[0] += 1
        port = free_port()
        rcs, logs, took = pair([job0, job1], lambda r: base_env(
            RANK=r, WORLD_SIZE=2, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port, ZTRAIN_COMM_TIMEOUT_S=30), 60)
        ck.check(rcs == [1, 1] and took < 15,
                 f"b: ranks whose job files differ in {what} both fail at once, well within the "
                 f"30 s timeout (exit {rcs}, {took:.1f} s)")
        for r in (0, 1):
            last = logs[r].strip().splitlines()[-1] if logs[r].strip() else ""
            ck.check("rank 0" in last and "rank 1" in last and key in last,
                     f"b: rank {r} names both ranks and {key}: {last}")


def case_c():
    _, job = new_case()
    d = os.path.dirname(job)
    env = base_env(RANK=1, WORLD_SIZE=2, MASTER_ADDR="master-0.no-such-job.invalid",
                   MASTER_PORT=29500, ZTRAIN_COMM="gloo", ZTRAIN_COMM_TIMEOUT_S=2)
    t0 = time.monotonic()
    p = subprocess.run([WORKER, job, "--out", os.path.join(d, "out")], capture_output=True,
                       text=True, env=env, cwd=d, timeout=60)
    took = time.monotonic() - t0
    ck.check(p.returncode == 1 and "'master-0.no-such-job.invalid' did not resolve within 2 s"
             in p.stderr and took >= 2.0,
             f"c: an unresolvable MASTER_ADDR is retried for the 2 s timeout, then named "
             f"(exit {p.returncode}, {took:.2f} s): {p.stderr.strip()}")


def case_d():
    job_id = str(100000 + os.getpid() % 900000)
    jobs = [new_case(max_steps=30)[1] for _ in (0, 1)]
    procs = []
    for step, job in enumerate(jobs):
        d = os.path.dirname(job)
        for r in (0, 1):
            env = base_env(SLURM_PROCID=r, SLURM_NTASKS=2, SLURM_LOCALID=r, SLURM_NNODES=1,
                           SLURM_JOB_ID=job_id, SLURM_STEP_ID=step, ZTRAIN_COMM_TIMEOUT_S=30)
            procs.append(start([WORKER, job, "--out", os.path.join(d, "out")], env, d,
                               f"rank{r}.log"))
    rcs = finish(procs, 120)
    logs = [text(os.path.join(os.path.dirname(j), "rank0.log")) for j in jobs]
    ok = rcs == [0, 0, 0, 0] and all("done: 30 steps" in log for log in logs)
    ck.check(ok, f"d: two srun steps of Slurm job {job_id} at once both train (exit {rcs})" +
             ("" if ok else f": {[log.strip()[-300:] for log in logs]}"))


try:
    for case in (case_a, case_b, case_c, case_d):
        t = time.monotonic()
        case()
        print(f"      ({case.__name__}: {time.monotonic() - t:.1f} s)")
finally:
    shutil.rmtree(top, ignore_errors=True)
ck.done()
