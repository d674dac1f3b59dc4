"""ztrain-worker under torch 2.x's own `torchrun` command (.venv-ds's, the one users run), each
case 2 ranks on this host's loopback, each against the losses `ztrain run` gives the
same job:

  a. the static rendezvous as docs/parallelism.md shows it: two `torchrun --nnodes=2
     --nproc-per-node=1 --node-rank=N --master-addr=127.0.0.1 --master-port=P --no-python
     ztrain-worker job.json` (the agent holds its TCPStore at P, ztrain's store is at P+1);
  b. the c10d rendezvous: two `torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d
     --rdzv-endpoint=127.0.0.1:P --rdzv-id=ID --no-python ...` (torch assigns the ranks; rank 0
     is whichever node it picks);
  c. one node, two ranks: `torchrun --standalone --nproc-per-node=2 --no-python ...` (shm, as
     for any launcher that starts every rank on one host, which prints no transport line).
A missing `--no-python` makes torchrun run ztrain-worker as a Python script: the docs say so.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_torchrun_cli.py (make test-deepspeed)
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from ztref import Checker, read_metrics, tool, write_job  # noqa: E402
from ports import free_port  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TORCHRUN = os.path.join(ROOT, ".venv-ds", "bin", "torchrun")
ZTRAIN = os.path.abspath(tool("ztrain"))
WORKER = os.path.abspath(tool("ztrain-worker"))
# What a launcher around this test may have set, and torchrun sets for its ranks itself.
IDENTITY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "ZTRAIN_COMM",
            "ZTRAIN_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID")
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief.\n" * 80)

ck = Checker()
# What rank 0 says when its store's port (MASTER_PORT + 1) is taken
# (engine/comm/tcp_store_server.c).
BUSY = "is already in use on this host"


def env():
    e = {k: v for k, v in os.environ.items() if k not in IDENTITY}
    e.update(OMP_NUM_THREADS="1", ZTRAIN_COMM_TIMEOUT_S="60")
    return e


def losses(out_dir):
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [r["train/loss"] for r in read_metrics(path) if "train/loss" in r]


def run_nodes(d, name, commands):
    """Starts each command (one per node) at once; returns exit codes and logs."""
    procs = []
    for n, cmd in enumerate(commands):
        log = open(os.path.join(d, f"{name}{n}.log"), "wb")
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(),
                                       cwd=d), log))
    rcs = []
    for p, log in procs:
        try:
            rcs.append(p.wait(timeout=180))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(p.wait())
        log.close()
    logs = []
    for n in range(len(commands)):
        with open(os.path.join(d, f"{name}{n}.log"), errors="replace") as f:
            logs.append(f.read())
    return rcs, logs


def main():
    d = tempfile.mkdtemp(prefix="ztrain-torchrun-")
    with open(os.path.join(d, "train.txt"), "wb") as f:
        f.write(TEXT)
    job = {"name": "torchrun", "world_size": 2,
           "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                     "block_size": 32},
           "data": {"train": "train.txt"},
           "train": {"max_steps": 6, "log_interval": 1, "warmup_steps": 0, "seed": 1},
           "deepspeed": {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}
    write_job(os.path.join(d, "job.json"), job)
    ref = subprocess.run([ZTRAIN, "run", "job.json", "--out", "ref"], capture_output=True,
                         text=True, env=env(), cwd=d, timeout=120)
    want = losses(os.path.join(d, "ref"))
    ck.check(ref.returncode == 0 and len(want) == 6,
             f"`ztrain run` of the job trains ({ref.returncode}) {ref.stderr.strip()[-300:]}")

    port = free_port(2)  # the static agent takes port, ztrain's store port + 1
    static = [[TORCHRUN, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={n}",
               "--master-addr=127.0.0.1", f"--master-port={port}", "--no-python", WORKER,
               "job.json", "--out", "static"] for n in (0, 1)]
    c10d_port = free_port(2)
    c10d = [[TORCHRUN, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{c10d_port}", "--rdzv-id=ztrain-test", "--no-python",
             WORKER, "job.json", "--out", f"c10d{n}"] for n in (0, 1)]
    standalone = [[TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", WORKER,
                   "job.json", "--out", "standalone"]]
    for case, name, transport, commands in (("a", "static", "gloo", static),
                                            ("b", "c10d", "gloo", c10d),
                                            ("c", "standalone", None, standalone)):
        rcs, logs = run_nodes(d, name, commands)
        # Under c10d torch picks MASTER_PORT, and ztrain's store takes MASTER_PORT + 1: another
        # program may hold that port (rank 0 then stops, saying so), and a user runs again.
        for _ in range(2):
            if not any(BUSY in l for l in logs):
                break
            print(f"note  {case}: MASTER_PORT + 1 was in use; torchrun runs again")
            rcs, logs = run_nodes(d, name, commands)
        whole = " | ".join(l.strip()[-500:] for l in logs)
        ok = all(rc == 0 for rc in rcs) and any("done: 6 steps" in l for l in logs)
        ck.check(ok, f"{case}: torchrun's {name} rendezvous trains (exit {rcs})" +
                 ("" if ok else f": {whole}"))
        if transport:
            ck.check(any(f"comm transport {transport}" in l for l in logs),
                     f"{case}: the ranks meet over {transport}")
        # Rank 0 writes the metrics; under c10d it is whichever node torch made rank 0.
        outs = [o for o in ("static", "standalone", "c10d0", "c10d1")
                if o.startswith(name) and losses(os.path.join(d, o))]
        got = losses(os.path.join(d, outs[0])) if len(outs) == 1 else []
        ck.check(len(want) == 6 and got == want,
                 f"{case}: rank 0 alone logs the losses of `ztrain run`: {got} vs {want} "
                 f"(logged in {outs})")

    # The mistake the docs warn about: torchrun runs its program with Python unless told not to.
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=1", WORKER, "job.json"],
                       capture_output=True, text=True, env=env(), cwd=d, timeout=120)
    ck.check(p.returncode != 0 and "SyntaxError" in p.stdout + p.stderr,
             "without --no-python torchrun runs ztrain-worker as a Python script and fails "
             f"(exit {p.returncode})")
    if ck.failed:
        print(f"the nodes' logs are kept in {d}")
    else:
        shutil.rmtree(d)
    ck.done()


main()
