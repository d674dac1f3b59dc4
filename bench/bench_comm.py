"""Collective bandwidth: ztrain's gloo transport vs its shm transport vs torch.distributed with its
Gloo backend (the same library), all-reduce and reduce-scatter of fp32 buffers, 2 and 4 ranks,
over loopback (every rank on this host) and over a veth link between two emulated hosts
(network namespaces, tests/multihost/netns.py; root only, else skipped).

    /usr/bin/python3 bench/bench_comm.py [--build build] [--sizes 65536,1048576,16777216,67108864]
                                         [--iters 10] [--worlds 2,4] [--links loopback,veth]
                                         [--train-steps 12]

ztrain's side is tests/tools/zt_comm_bench (one process per rank, launched with torchrun's
variables); torch's a script with the same loop: 5 warm-up calls, then --iters timed ones, more
for small sizes (up to 64 MiB moved, at most 200), so that first-use costs wash out. Each prints
the slowest rank's mean time per call and, in brackets, the slowest rank's median call (on a
shared machine the mean carries the scheduler's tail, the median what a call costs); the table
gives them and the bus bandwidth as nccl-tests define it (all-reduce: bytes × 2(N-1)/N per time,
reduce-scatter: bytes × (N-1)/N per time), the bytes every rank must move. Debian's
torch 1.13 has no Gloo reduce-scatter: its column says n/a there. With the veth link it also
times a 4-rank GPT-2 job on one host (shared memory) against the same job on the two emulated
hosts (tokens/s).
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "multihost"))

TORCH_BENCH = r'''
import datetime, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
r, w = dist.get_rank(), dist.get_world_size()
iters = int(sys.argv[1])
for nbytes in [int(x) for x in sys.argv[2:]]:
    t = torch.ones(nbytes // 4)
    rounds = max(iters, min(200, (64 << 20) // nbytes))
    for _ in range(5):
        dist.all_reduce(t)
    dist.barrier()
    each = []
    t0 = time.perf_counter()
    for _ in range(rounds):
        a = time.perf_counter()
        dist.all_reduce(t)
        each.append(time.perf_counter() - a)
    each.sort()
    el = torch.tensor([(time.perf_counter() - t0) / rounds, each[rounds // 2]],
                      dtype=torch.float64)
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    if r == 0:
        print("all_reduce", nbytes, el[0].item(), el[1].item(), flush=True)
'''


def launch(cmds_envs, hosts=None):
    """Starts one process per (cmd, env, host index); returns rank 0's stdout."""
    procs = []
    for cmd, env, h in cmds_envs:
        if hosts is None:
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        else:
            procs.append(hosts.popen(h, cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"bench_comm: {' '.join(p.args)} exited {p.returncode}: {e.strip()}")
    return outs[0][0]


def run_side(kind, world, link, args, hosts, port):
    """{(collective, bytes): (mean, median) seconds} for one transport at one placement."""
    addr = hosts.addr[0] if link == "veth" else "127.0.0.1"
    jobs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR=addr,
                   MASTER_PORT=str(port), ZTRAIN_RUN_ID=f"bc{os.getpid()}-{port}",
                   OMP_NUM_THREADS="1",
                   LOCAL_RANK=str(r % (world // 2) if link == "veth" else r),
                   LOCAL_WORLD_SIZE=str(world // 2 if link == "veth" else world),
                   # torch's Gloo otherwise listens on the address of the host's name, which is
                   # not in a namespace's network; both sides then use the same interface.
                   GLOO_SOCKET_IFNAME="eth0" if link == "veth" else "lo")
        if kind == "torch":
            cmd = [sys.executable, args.torch_script, str(args.iters)] + [str(s) for s in args.sizes]
        else:
            cmd = [os.path.join(args.build, "zt_comm_bench"), kind] + \
                  [str(s) for s in args.sizes] + ["--iters", str(args.iters)]
        host = (0 if r < world // 2 else 1) if link == "veth" else None
        jobs.append((cmd, env, host))
    out = launch(jobs, hosts if link == "veth" else None)
    got = {}
    for line in out.splitlines():
        op, nbytes, mean, median = line.split()
        got[(op, int(nbytes))] = (float(mean), float(median))
    return got


def train_rate(args, hosts, d, two_hosts):
    """tokens/s of a 4-rank GPT-2 job (ZeRO 1): on one host (`ztrain run`, shm) or on the two
    emulated hosts, 2 ranks each (gloo over the veth link); the mean of the timed steps."""
    import json
    spec = {"name": "rate", "world_size": 4,
            "model": {"type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 128,
                      "vocab_size": 256, "block_size": 128},
            "data": {"train": "train.txt"},
            "train": {"max_steps": args.train_steps, "log_interval": 1, "warmup_steps": 2},
            "deepspeed": {"train_micro_batch_size_per_gpu": 4,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                          "zero_optimization": {"stage": 1}}}
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(200000)))
    path = f"{d}/rate.json"
    with open(path, "w") as f:
        json.dump(spec, f)
    out = f"{d}/rate-{'two' if two_hosts else 'one'}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ZTRAIN_COMM", None)
    if two_hosts:
        jobs = []
        for r in range(4):
            jobs.append(([os.path.join(args.build, "ztrain-worker"), path, "--out", out],
                         dict(env, RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r % 2),
                              LOCAL_WORLD_SIZE="2", MASTER_ADDR=hosts.addr[0],
                              MASTER_PORT="29700", ZTRAIN_RUN_ID=f"rate{os.getpid()}"), r // 2))
        launch(jobs, hosts)
    else:
        subprocess.run([os.path.join(args.build, "ztrain"), "run", path, "--out", out],
                       env=env, check=True, capture_output=True)
    with open(f"{out}/metrics.jsonl") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    rates = [r["perf/tokens_per_second"] for r in recs[2:] if r.get("perf/tokens_per_second")]
    return sum(rates) / len(rates)


def fmt_size(n):
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--sizes", default="65536,1048576,16777216,67108864")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--links", default="loopback,veth")
    ap.add_argument("--train-steps", type=int, default=12,
                    help="steps of the 4-rank training comparison (veth only; 0: none)")
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    links = args.links.split(",")
    if "veth" in links and os.geteuid() != 0:
        print("bench_comm: not root, so no veth link (network namespaces need root)")
        links = [x for x in links if x != "veth"]
    with tempfile.TemporaryDirectory() as d:
        args.torch_script = os.path.join(d, "torch_bench.py")
        with open(args.torch_script, "w") as f:
            f.write(TORCH_BENCH)
        hosts = None
        if "veth" in links:
            from netns import Hosts
            hosts = Hosts(2).__enter__()
        try:
            port = 29600
            print("| link | ranks | collective | size | ztrain gloo | ztrain shm | torch gloo |"
                  " torch time / gloo time: mean (median) |")
            print("|---|---:|---|---:|---:|---:|---:|---:|")
            for link in links:
                for world in [int(w) for w in args.worlds.split(",")]:
                    res = {}
                    for kind in ("gloo", "shm", "torch"):
                        if kind == "shm" and link == "veth":
                            continue
                        port += 1
                        res[kind] = run_side(kind, world, link, args, hosts, port)
                    for op, factor in (("all_reduce", 2 * (world - 1) / world),
                                       ("reduce_scatter", (world - 1) / world)):
                        for n in args.sizes:
                            cells = []
                            for kind in ("gloo", "shm", "torch"):
                                t = res.get(kind, {}).get((op, n))
                                cells.append(f"{t[0] * 1e3:.2f} ms ({t[1] * 1e3:.2f}), "
                                             f"{n * factor / t[0] / 1e9:.2f} GB/s"
                                             if t else "n/a")
                            g, t = res["gloo"].get((op, n)), res["torch"].get((op, n))
                            ratio = (f"{t[0] / g[0]:.2f}× ({t[1] / g[1]:.2f}×)"
                                     if g and t else "n/a")
                            print(f"| {link} | {world} | {op} | {fmt_size(n)} | "
                                  f"{' | '.join(cells)} | {ratio} |", flush=True)
            if hosts and args.train_steps:
                one = train_rate(args, hosts, d, False)
                two = train_rate(args, hosts, d, True)
                print(f"\nGPT-2 (2 layers, n_embd 128, seq 128, micro 4, ZeRO 1), 4 ranks, "
                      f"1 thread each: one host (shm) {one:.0f} tokens/s, two emulated hosts "
                      f"(gloo over veth) {two:.0f} tokens/s ({two / one:.2f}×)")
        finally:
            if hosts:
                hosts.__exit__(None, None, None)


if __name__ == "__main__":
    main()
