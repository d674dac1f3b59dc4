"""Jobs whose ranks sit on two emulated hosts (network namespaces joined by veth links through a
bridge, netns.py), two ranks per host, started as a launcher on each machine would start them
(RANK, WORLD_SIZE=4, LOCAL_WORLD_SIZE=2, MASTER_ADDR = host 0's address), so the ranks pick the
Gloo transport themselves:

  a. a GPT-2 job at ZeRO stages 1 and 3: rank 0 logs the gloo transport, and its losses and final
     weights equal those of the same job on one host (`ztrain run`, 4 ranks over shared memory)
     within 1e-6 (the transports add in the same order, so they are in fact equal);
  b. a killed host (its two ranks SIGKILLed mid-training): both survivors exit 1 within the comm
     timeout, each naming a rank of the dead host and its address;
  c. a cut link (host 1's `ip link set eth0 down` mid-training): all four ranks exit 1 within the
     timeout (plus the store's short last word), each naming a rank of the other host and its
     address;
  d. a rendezvous missing rank 3: the three others time out together, naming rank 3;
  e. a firewall on host 0 that lets only MASTER_PORT through (iptables DROP of every other TCP
     port on its link): the store works but Gloo's own connections between the hosts do not, and
     every rank exits 1 within the timeout (Gloo alone would wait five times it), naming a rank
     of the other host and the ports to open.

    /usr/bin/python3 tests/multihost/test_multihost.py [BUILD_DIR]   (root; `make test-multihost`)"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
if len(sys.argv) > 1:
    os.environ["ZTRAIN_BUILD"] = os.path.abspath(sys.argv[1])
from netns import Hosts  # noqa: E402
from ztref import Checker, read_metrics, run, st_read, tool  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
TIMEOUT_S = 6      # ZTRAIN_COMM_TIMEOUT_S of the failure cases
SLACK_S = 12       # what a failing rank may take past it: the store's last word, loaded CI cores
ck = Checker()


def on_signal(sig, frame):
    raise SystemExit(f"stopped by signal {sig}")


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


def job(name, stage, steps, ckpt=None):
    train = {"max_steps": steps, "log_interval": 1, "seed": 7}
    if ckpt:
        train["checkpoint_dir"] = ckpt
    return {"name": name, "world_size": 4,
            "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                      "block_size": 32},
            "data": {"train": "train.txt", "shuffle": True},
            "train": train,
            "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}},
                          "gradient_clipping": 1.0,
                          "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000}}}


def write(d, name, spec):
    path = f"{d}/{name}.json"
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def start_ranks(hosts, d, job_path, out, port, ranks=range(4), timeout=60):
    """Ranks 0-1 on host 0 and 2-3 on host 1; returns {rank: Popen} (stdout and stderr to files
    in out/, read by log())."""
    os.makedirs(out, exist_ok=True)
    procs = {}
    for r in ranks:
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r % 2),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR=hosts.addr[0], MASTER_PORT=str(port),
                   ZTRAIN_RUN_ID=f"mh{os.getpid()}-{port}", ZTRAIN_COMM_TIMEOUT_S=str(timeout),
                   OMP_NUM_THREADS="1")
        env.pop("ZTRAIN_COMM", None)
        with open(f"{out}/rank{r}.out", "w") as o, open(f"{out}/rank{r}.err", "w") as e:
            procs[r] = hosts.popen(r // 2, [tool("ztrain-worker"), job_path, "--out", out],
                                   env=env, stdout=o, stderr=e, cwd=d)
    return procs


def log(out, r):
    with open(f"{out}/rank{r}.err") as f:
        return f.read()


def wait_all(procs, limit):
    """Waits for every process until limit seconds from now; returns {rank: (rc, seconds)} with
    rc None for one still running (killed then)."""
    t0 = time.monotonic()
    got = {}
    for r, p in procs.items():
        try:
            p.wait(timeout=max(0.1, limit - (time.monotonic() - t0)))
            got[r] = (p.returncode, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            got[r] = (None, time.monotonic() - t0)
    return got


def wait_for_steps(out, n, procs, limit=60):
    """Waits until rank 0 has logged n steps (training is under way on every rank)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        path = f"{out}/metrics.jsonl"
        if os.path.exists(path) and len(read_metrics(path)) >= n:
            return True
        if any(p.poll() is not None for p in procs.values()):
            return False
        time.sleep(0.1)
    return False


def weights(d, ckpt):
    run([tool("ztrain"), "export", f"{d}/{ckpt}", "--out", f"{d}/{ckpt}.safetensors"])
    return st_read(f"{d}/{ckpt}.safetensors")[0]


def parity(hosts, d, stage, port):
    steps = 6
    ref_path = write(d, f"ref{stage}", job(f"ref{stage}", stage, steps, f"ck-ref{stage}"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ZTRAIN_COMM", None)
    run([tool("ztrain"), "run", ref_path, "--out", f"{d}/ref{stage}"], env=env, cwd=d)
    ref_losses = [m["train/loss"] for m in read_metrics(f"{d}/ref{stage}/metrics.jsonl")]
    path = write(d, f"mh{stage}", job(f"mh{stage}", stage, steps, f"ck-mh{stage}"))
    out = f"{d}/mh{stage}"
    got = wait_all(start_ranks(hosts, d, path, out, port), 120)
    ok = all(rc == 0 for rc, _ in got.values())
    ck.check(ok, f"a. stage {stage}: 2 hosts x 2 ranks finish ({got})")
    if not ok:
        for r in range(4):
            print(f"  rank {r}: {log(out, r).strip()[-600:]}")
        return
    ck.check("comm transport gloo" in log(out, 0),
             f"a. stage {stage}: rank 0 logs the gloo transport: "
             f"{log(out, 0).strip().splitlines()[:1]}")
    losses = [m["train/loss"] for m in read_metrics(f"{out}/metrics.jsonl")]
    worst = max((abs(a - b) for a, b in zip(losses, ref_losses)), default=1.0)
    ck.check(len(losses) == steps and worst <= 1e-6,
             f"a. stage {stage}: {len(losses)} losses equal one host's, worst diff {worst:.1e}")
    ref_w, got_w = weights(d, f"ck-ref{stage}"), weights(d, f"ck-mh{stage}")
    diff = max((got_w[k] - ref_w[k]).abs().max().item() for k in ref_w)
    ck.check(set(ref_w) == set(got_w) and diff <= 1e-6,
             f"a. stage {stage}: final weights ({len(got_w)} tensors) equal one host's, "
             f"max diff {diff:.1e}")


def names_other_host(text, other):
    """Whether a rank's message names a rank of the other host and that host's address."""
    ranks = "[23]" if other == 1 else "[01]"
    return bool(re.search(rf"rank {ranks} on host \S+ \({re.escape(HOSTS.addr[other])}\)", text))


def killed_host(d, port):
    path = write(d, "kill", job("kill", 1, 100000))
    out = f"{d}/kill"
    procs = start_ranks(HOSTS, d, path, out, port, timeout=TIMEOUT_S)
    ck.check(wait_for_steps(out, 2, procs), "b. the job trains before host 1 is killed")
    HOSTS.kill(1)
    got = wait_all({r: procs[r] for r in (0, 1)}, TIMEOUT_S + SLACK_S)
    for r in (0, 1):
        rc, took = got[r]
        msg = log(out, r).strip().splitlines()[-1:]
        ck.check(rc == 1 and names_other_host(log(out, r), 1),
                 f"b. killed host: rank {r} exits 1 after {took:.1f} s naming a rank of host 1 "
                 f"and {HOSTS.addr[1]}: {msg}")


def cut_link(d, port):
    path = write(d, "cut", job("cut", 3, 100000))
    out = f"{d}/cut"
    procs = start_ranks(HOSTS, d, path, out, port, timeout=TIMEOUT_S)
    ck.check(wait_for_steps(out, 2, procs), "c. the job trains before the link is cut")
    HOSTS.cut(1)
    try:
        got = wait_all(procs, TIMEOUT_S + SLACK_S)
    finally:
        HOSTS.mend(1)
    for r in range(4):
        rc, took = got[r]
        other = 1 if r < 2 else 0
        msg = log(out, r).strip().splitlines()[-1:]
        ck.check(rc == 1 and names_other_host(log(out, r), other),
                 f"c. cut link: rank {r} exits 1 after {took:.1f} s naming a rank of host "
                 f"{other} and {HOSTS.addr[other]}: {msg}")


def missing_rank(d, port):
    path = write(d, "missing", job("missing", 1, 5))
    out = f"{d}/missing"
    t0 = time.monotonic()
    procs = start_ranks(HOSTS, d, path, out, port, ranks=(0, 1, 2), timeout=TIMEOUT_S)
    got = wait_all(procs, TIMEOUT_S + SLACK_S)
    for r in (0, 1, 2):
        rc, took = got[r]
        text = log(out, r)
        ck.check(rc == 1 and "rank(s) 3 of 4 never joined" in text and
                 f"{HOSTS.addr[0]}:{port}" in text and took >= TIMEOUT_S - 0.5,
                 f"d. rendezvous without rank 3: rank {r} exits 1 after {took:.1f} s naming it: "
                 f"{text.strip().splitlines()[-1:]}")
    ck.check(time.monotonic() - t0 < TIMEOUT_S + SLACK_S, "d. within the timeout")


def firewall(d, port):
    """Host 0 drops every TCP segment on its link but those to MASTER_PORT (iptables-legacy, as
    a host firewall or a NetworkPolicy that opens only the rendezvous port would)."""
    rule = ["INPUT", "-i", "eth0", "-p", "tcp", "!", "--dport", str(port), "-j", "DROP"]
    iptables = ["ip", "netns", "exec", HOSTS.ns[0], "iptables-legacy"]
    if subprocess.run(iptables + ["-A"] + rule, capture_output=True).returncode != 0:
        print("skip  e. no iptables-legacy in a network namespace")
        return
    path = write(d, "fw", job("fw", 1, 5))
    out = f"{d}/fw"
    try:
        procs = start_ranks(HOSTS, d, path, out, port, timeout=TIMEOUT_S)
        got = wait_all(procs, TIMEOUT_S + SLACK_S)
    finally:
        subprocess.run(iptables + ["-D"] + rule, capture_output=True)
    for r in range(4):
        rc, took = got[r]
        other = 1 if r < 2 else 0
        text = log(out, r)
        addr = re.escape(HOSTS.addr[other])
        names = re.search(rf"rank\(s\) [0-9, ]+ on host \S+ \({addr}\)", text)
        ck.check(rc == 1 and (names or names_other_host(text, other)) and
                 "not only MASTER_PORT" in text,
                 f"e. only MASTER_PORT open: rank {r} exits 1 after {took:.1f} s naming a rank of "
                 f"host {other} and the ports: {text.strip().splitlines()[-1:]}")


T0 = time.monotonic()
with tempfile.TemporaryDirectory() as d, Hosts(2) as HOSTS:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    parity(HOSTS, d, 1, 29511)
    parity(HOSTS, d, 3, 29513)
    killed_host(d, 29521)
    cut_link(d, 29531)
    missing_rank(d, 29541)
    firewall(d, 29551)
print(f"test_multihost: {time.monotonic() - T0:.0f} s")
ck.done()
