"""Two processes with one RANK on one host, over the shm transport (issue: exploratory testing).

ztrain-worker processes started by hand the way a launcher starts them (RANK, WORLD_SIZE=2,
LOCAL_WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT, a 5 s ZTRAIN_COMM_TIMEOUT_S): RANK=0, a second
RANK=0 0.5 s later, RANK=1 0.5 s after that. The second rank 0 must fail within a second saying
that two processes have RANK=0, without touching the first one's segment: the job of the first
rank 0 and rank 1 then trains to exactly the losses `ztrain run` gives the same job. Then, while
a job runs (past its rendezvous, when the segment's name is gone from /dev/shm), a second RANK=1
must fail within a second saying so, and the job must finish."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, run, tool, write_job  # noqa: E402

PORT = 58100 + os.getpid() % 100
TIMEOUT_S = 5


def job(steps):
    return {"name": "dup", "world_size": 2,
            "model": {"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 64,
                      "vocab_size": 256, "block_size": 32},
            "data": {"train": "train.txt"}, "train": {"max_steps": steps, "log_interval": 1,
                                                      "seed": 1},
            "deepspeed": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}


def start(d, rank, out, port, tag):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               ZTRAIN_COMM_TIMEOUT_S=str(TIMEOUT_S))
    env.pop("ZTRAIN_RUN_ID", None)
    return subprocess.Popen([tool("ztrain-worker"), f"{d}/job.json", "--out", f"{d}/{out}"],
                            env=env, stdout=open(f"{d}/{tag}.out", "w"),
                            stderr=open(f"{d}/{tag}.err", "w"))


def finish(procs):
    try:
        return [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def timed_wait(p):
    t0 = time.monotonic()
    rc = p.wait(timeout=60)
    return rc, time.monotonic() - t0


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    write_job(f"{d}/job.json", job(8))

    # A second rank 0 while the first waits for rank 1.
    first = start(d, 0, "job", PORT, "first0")
    time.sleep(0.5)
    second = start(d, 0, "dup", PORT, "second0")
    rc, took = timed_wait(second)
    err = open(f"{d}/second0.err").read()
    ck.check(rc != 0 and "two processes have RANK=0" in err and took < 1.0,
             f"a second RANK=0 fails at once saying so ({rc}, {took:.2f} s): {err.strip()}")
    rank1 = start(d, 1, "job", PORT, "rank1")
    rcs = finish([first, rank1])
    ck.check(rcs == [0, 0], f"the first rank 0 and rank 1 train on ({rcs}: "
             f"{open(f'{d}/first0.err').read().strip()[-300:]})")
    got = [m["train/loss"] for m in read_metrics(f"{d}/job/metrics.jsonl")] if rcs == [0, 0] \
        else []
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                            "MASTER_ADDR", "MASTER_PORT")}
    run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/ref"], env=env)
    want = [m["train/loss"] for m in read_metrics(f"{d}/ref/metrics.jsonl")]
    ck.check(len(got) == 8 and got == want, f"their losses are ztrain run's: {got} vs {want}")

    # A second rank 1 once the job runs: its first step is logged.
    write_job(f"{d}/job.json", job(100000))
    procs = [start(d, r, "long", PORT + 1, f"long{r}") for r in (0, 1)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "step" not in open(f"{d}/long0.out").read():
        time.sleep(0.05)
    late = start(d, 1, "late", PORT + 1, "late1")
    rc, took = timed_wait(late)
    err = open(f"{d}/late1.err").read()
    ck.check(rc != 0 and "two processes have RANK=1" in err and took < 1.0,
             f"a second RANK=1 while the job runs fails at once saying so ({rc}, {took:.2f} s): "
             f"{err.strip()}")
    ck.check(all(p.poll() is None for p in procs), "the job still runs")
    for p in procs:
        p.terminate()
    finish(procs)
ck.done()
