"""The gloo transport under `ztrain run` on one host (loopback TCP): a job with "comm": "gloo" and
the same job over shared memory give exactly the same losses and final weights, in fp32 at ZeRO 2
(reduce-scatter during the backward) and in bf16 at ZeRO 1 (16-bit all-reduces, summed in fp32 by
both transports); ZTRAIN_COMM=gloo overrides a job's "shm"; rank 0 logs the transport and why;
a bad ZTRAIN_COMM or "comm" fails at once naming it. Skipped when the build has no gloo transport
(libgloo-dev absent)."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, st_read, tool  # noqa: E402


def job(name, stage, comm=None, bf16=False):
    spec = {"name": name, "world_size": 3,
            "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                      "block_size": 32},
            "data": {"train": "train.txt", "shuffle": True},
            "train": {"max_steps": 5, "log_interval": 1, "checkpoint_dir": f"ck-{name}",
                      "seed": 3},
            "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}},
                          "zero_optimization": {"stage": stage, "reduce_bucket_size": 2000}}}
    if comm:
        spec["comm"] = comm
    if bf16:
        spec["deepspeed"]["bf16"] = {"enabled": True}
    return spec


def train(d, spec, **env_extra):
    path = f"{d}/{spec['name']}.json"
    with open(path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, **env_extra)
    if "ZTRAIN_COMM" not in env_extra:
        env.pop("ZTRAIN_COMM", None)
    p = subprocess.run([tool("ztrain"), "run", path, "--out", f"{d}/{spec['name']}"], cwd=d,
                       env=env, capture_output=True, text=True, timeout=240)
    return p


def result(d, name):
    subprocess.run([tool("ztrain"), "export", f"{d}/ck-{name}", "--out", f"{d}/{name}.st"],
                   check=True, capture_output=True)
    losses = [m["train/loss"] for m in read_metrics(f"{d}/{name}/metrics.jsonl")]
    return losses, st_read(f"{d}/{name}.st")[0]


def same(ck, what, a, b):
    la, wa = a
    lb, wb = b
    ck.check(len(la) == 5 and la == lb, f"{what}: losses equal exactly ({la[-1:]} vs {lb[-1:]})")
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    ck.check(set(wa) == set(wb) and diff == 0, f"{what}: final weights equal (max diff {diff})")


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    probe = train(d, job("probe", 0, "gloo") | {"train": {"max_steps": 1}})
    if "lacks transport \"gloo\"" in probe.stderr:
        print("skipped: this build has no gloo transport")
        sys.exit(0)
    for stage, bf16 in ((2, False), (1, True)):
        tag = f"s{stage}{'-bf16' if bf16 else ''}"
        p = train(d, job(f"shm-{tag}", stage, "shm", bf16))
        ck.check(p.returncode == 0 and "comm transport shm" in p.stderr,
                 f"{tag}: over shm ({p.stderr.strip()[-300:]})")
        g = train(d, job(f"gloo-{tag}", stage, "gloo", bf16))
        ck.check(g.returncode == 0 and "comm transport gloo (the job's \"comm\" names it)" in
                 g.stderr, f"{tag}: over gloo, and rank 0 says why ({g.stderr.strip()[-300:]})")
        if p.returncode == 0 and g.returncode == 0:
            same(ck, tag, result(d, f"shm-{tag}"), result(d, f"gloo-{tag}"))
    p = train(d, job("env", 2, "shm"), ZTRAIN_COMM="gloo")
    ck.check(p.returncode == 0 and "comm transport gloo (ZTRAIN_COMM names it)" in p.stderr,
             f"ZTRAIN_COMM=gloo overrides the job's shm ({p.stderr.strip()[-200:]})")
    if p.returncode == 0:
        same(ck, "ZTRAIN_COMM=gloo", result(d, "shm-s2"), result(d, "env"))
    p = train(d, job("badenv", 2), ZTRAIN_COMM="mpi")
    ck.check(p.returncode != 0 and "ZTRAIN_COMM='mpi'" in p.stderr,
             f"a bad ZTRAIN_COMM fails naming it ({p.stderr.strip()[-200:]})")
    p = train(d, job("badspec", 2, "tcp"))
    ck.check(p.returncode != 0 and "'comm'" in p.stderr,
             f"a bad \"comm\" fails naming it ({p.stderr.strip()[-200:]})")
ck.done()
