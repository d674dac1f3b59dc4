"""Admission in `ztrain run` (issue 19, defect 5): a job that cannot fit in the memory this host has
available is refused before any rank starts, with the estimate and the limit, and a spec whose
sizes overflow is refused naming the field, without undefined behaviour (the sanitizer build runs
this test too); an ordinary job still runs. `ztrain estimate --json` reports the figures, checked
here against GPT-2's parameter count and the ZeRO paper's fp32 formula. A "cuda" job (on the
emulated CUDA device) above the GPU's memory or `--max-device-memory` is refused by `ztrain run`
before a rank starts and reported by `ztrain estimate`, with the single changes that would fit.

Every run is watched: the run and its children together may not pass 1 GiB of resident memory or
60 s, else they are killed and the case fails, so a refusal that does not happen cannot take the
machine down."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()  # transformers' LlamaConfig, the reference for the banner's head_dim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, ZTRAIN, Checks  # noqa: E402
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief.\n" * 40)
sys.stdout.reconfigure(line_buffering=True)
ck = Checks()
check = ck.check


def tree_rss_mb(root):
    """Resident memory of a process and all its descendants, from /proc."""
    children, rss = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        children.setdefault(int(fields["PPid"]), []).append(int(pid))
        rss[int(pid)] = int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
    total, todo = 0.0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0.0)
        todo += children.get(p, [])
    return total


def watched(args, limit_mb=1024, limit_s=60, env=None):
    """(exit status, stdout, stderr, peak MB of the process tree); killed past the limits."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=env)
    peak, t0 = 0.0, time.monotonic()
    while p.poll() is None:
        peak = max(peak, tree_rss_mb(p.pid))
        if peak > limit_mb or time.monotonic() - t0 > limit_s:
            os.killpg(p.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    out, err = p.communicate()
    return p.returncode, out, err, peak


def write_job(d, name, world_size=1, micro_batch=2, stage=0, device="cpu", **model):
    m = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
         "block_size": 32}
    m.update(model)
    job = {"name": name, "world_size": world_size, "device": device, "model": m,
           "data": {"train": "train.txt"},
           "train": {"max_steps": 3, "log_interval": 1, "warmup_steps": 0},
           "deepspeed": {"train_micro_batch_size_per_gpu": micro_batch,
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                         "zero_optimization": {"stage": stage}}}
    path = os.path.join(d, f"{name}.json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def estimate(path, *opts, env=None):
    """The JSON report, with the exit status as "rc": 0 when it fits, 1 when it does not (the
    report still printed) or the job is bad, 2 bad usage."""
    out = subprocess.run([ZTRAIN, "estimate", "--json", path, *opts], capture_output=True,
                         text=True, timeout=60, env=env)
    try:
        report = json.loads(out.stdout)
    except ValueError:
        report = {"error": out.stderr}
    report["rc"] = out.returncode
    return report


with tempfile.TemporaryDirectory(prefix="ztrain-admission-") as d:
    with open(os.path.join(d, "train.txt"), "wb") as f:
        f.write(TEXT)

    for world in (1, 2):
        job = write_job(d, f"big{world}", world_size=world, n_layer=1, n_head=1, n_embd=65536)
        out_dir = os.path.join(d, f"out-big{world}")
        rc, out, err, peak = watched([ZTRAIN, "run", job, "--out", out_dir])
        check(rc == 1 and "the job does not fit" in err and "GiB per rank" in err and
              ("(MemAvailable)" in err or "memory cgroup" in err),
              f"n_embd 65536 on {world} rank(s): exit {rc}, refused with the estimate and the "
              f"limit: {err.strip()[:300]}")
        check(not os.path.exists(out_dir) and "metrics in" not in out and peak < 200,
              f"n_embd 65536 on {world} rank(s): nothing started (peak {peak:.0f} MB)")

    for what, kw, fact in (
            ("n_embd 600000000", {"n_layer": 1, "n_head": 1, "n_embd": 600000000},
             "model.n_embd (600000000) is too large"),
            ("16 layers of n_embd 536870908", {"n_layer": 16, "n_head": 4, "n_embd": 536870908},
             "model.n_layer (16) blocks")):
        rc, out, err, peak = watched([ZTRAIN, "run", write_job(d, "overflow", **kw), "--out",
                                      os.path.join(d, "out-overflow")])
        check(rc == 1 and fact in err and "runtime error" not in err and "Sanitizer" not in err,
              f"{what}: refused naming the field, no undefined behaviour: {err.strip()[:300]}")

    # The banner names the model as it is built: a Llama job without head_dim or n_kv_head
    # gets transformers' LlamaConfig defaults for both (hidden_size // num_attention_heads, and
    # num_attention_heads), not the 0 that stands for them in the job file.
    from transformers import LlamaConfig
    ref = LlamaConfig(hidden_size=48, num_attention_heads=4, num_hidden_layers=1)
    llama = write_job(d, "llama", n_layer=1, n_head=4, n_embd=48, type="llama",
                      intermediate_size=64)
    rc, out, err, _ = watched([ZTRAIN, "run", llama, "--out", os.path.join(d, "out-llama"),
                               "--set", "train.max_steps=1"])
    banner = out.splitlines()[0] if out else ""
    check(rc == 0 and f"head_dim {ref.head_dim}," in banner and
          f"n_kv_head {ref.num_key_value_heads}," in banner,
          f"run: the banner names head_dim {ref.head_dim} and n_kv_head "
          f"{ref.num_key_value_heads} as LlamaConfig does: exit {rc}: {banner}")

    small = write_job(d, "small", world_size=2, stage=1)
    rc, out, err, _ = watched([ZTRAIN, "run", small, "--out", os.path.join(d, "out-small")])
    check(rc == 0 and "done: 3 steps" in out, f"an ordinary job runs: exit {rc} {err[-300:]}")

    # The estimate against formulas written here: GPT-2's parameter count (L=2, C=32, V=256,
    # T=32) and the fp32 ZeRO stage-1 terms 4Ψ + 4Ψ + 8Ψ/N for N = 2 (Ψ padded to 32).
    e = estimate(small)
    psi = 12 * 2 * 32 * 32 + 13 * 2 * 32 + 256 * 32 + 32 * 32 + 2 * 32
    padded = -(-psi // 32) * 32
    check(e.get("params") == psi and e.get("padded") == padded,
          f"estimate: {psi} parameters, {padded} padded: {e}")
    check(e.get("param_bytes") == 4 * padded and e.get("grad_bytes") == 4 * padded and
          e.get("optimizer_bytes") == 8 * padded // 2 and e.get("stage") == 1,
          "estimate: stage 1 holds 4Ψ + 4Ψ + 8Ψ/N")
    parts = ("param_bytes", "grad_bytes", "optimizer_bytes", "offload_bytes", "workspace_bytes",
             "activation_bytes", "overhead_bytes")
    check(e.get("rank_bytes") == sum(e.get(k, 0) for k in parts) and
          e.get("host_bytes") == 2 * e.get("rank_bytes", 0) and e.get("fits") is True,
          "estimate: the parts add up, two ranks on this host, and it fits")
    check(e.get("rc") == 0, f"estimate: a job that fits exits 0 ({e.get('rc')})")
    big = estimate(os.path.join(d, "big1.json"))
    check(big.get("fits") is False and big.get("rc") == 1 and big.get("rank_bytes", 0) > 0,
          f"estimate -o json: n_embd 65536 does not fit: exit {big.get('rc')}, after the whole "
          f"report")
    text = subprocess.run([ZTRAIN, "estimate", os.path.join(d, "big1.json")],
                          capture_output=True, text=True, timeout=60)
    check(text.returncode == 1 and "does not fit" in text.stdout and "parameters" in text.stdout,
          f"estimate (text): n_embd 65536 exits 1 after the report: exit {text.returncode}: "
          f"{text.stdout.strip()[-200:]}")
    for args, want, what in ((["/nonexistent/job.json"], 1, "a missing job file"),
                             ([small, "--bogus"], 2, "an unknown option")):
        p = subprocess.run([ZTRAIN, "estimate"] + args, capture_output=True, text=True,
                           timeout=60)
        check(p.returncode == want and not p.stdout,
              f"estimate: {what} still exits {want}, with no report ({p.returncode})")
    helptext = subprocess.run([ZTRAIN, "help", "estimate"], capture_output=True, text=True,
                              timeout=60).stdout
    check("1 when it does not" in helptext, "ztrain help estimate names exit status 1")

    # A "cuda" job's device memory, judged on the emulated CUDA device (an H100 of 80 GB,
    # docs/gpu.md) when this build has it: a job above the GPU, or above --max-device-memory,
    # is refused before any rank starts, naming the figure, the limit and what would fit.
    if os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
        emu = dict(os.environ, ZTRAIN_CUDA_EMU="1")
        gpu = write_job(d, "gpu", world_size=2, stage=1, device="cuda")
        e = estimate(gpu, env=emu)
        check(e.get("device_bytes", 0) > 32 << 20 and e.get("gpu_total_bytes") == 85520809984
              and e.get("fits") is True,
              f"estimate: a small cuda job has a device figure above cuBLASLt's 32 MiB "
              f"workspace and fits the emulated H100: {e}")
        e = estimate(gpu, "--max-device-memory", "16M", env=emu)
        check(e.get("fits") is False and e.get("rc") == 1 and
              e.get("max_device_bytes") == 16 << 20,
              f"estimate --max-device-memory 16M: does not fit: {e}")
        text = subprocess.run([ZTRAIN, "estimate", gpu, "--max-device-memory", "16M"],
                              capture_output=True, text=True, timeout=60, env=emu).stdout
        check("device memory:" in text and "does not fit on the GPU" in text and
              "--max-device-memory, 16.0 MiB" in text,
              f"estimate --max-device-memory 16M: the text says so: {text[-600:]}")
        out_dir = os.path.join(d, "out-gpu")
        rc, out, err, _ = watched([ZTRAIN, "run", gpu, "--max-device-memory", "16M", "--out",
                                   out_dir], env=emu)
        figure = json.dumps(e.get("device_bytes"))
        check(rc == 1 and "the job does not fit on the GPU" in err and
              "--max-device-memory, 16.0 MiB" in err and "MiB per rank on the GPU" in err and
              "none of a higher ZeRO stage" in err and not os.path.exists(out_dir),
              f"run --max-device-memory 16M: exit {rc}, refused before a rank starts "
              f"({figure} bytes estimated): {err.strip()[:500]}")
        # 6.4 G parameters: 16 bytes each at stage 0 is above the 80 GB GPU, ZeRO 3 over 8
        # ranks is not; the emulated device shows 8 GPUs, one a rank.
        big = write_job(d, "gpu-big", world_size=8, stage=0, device="cuda", n_layer=8,
                        n_head=64, n_embd=8192)
        emu8 = dict(emu, ZTRAIN_CUDA_EMU_DEVICES="8")
        rc, out, err, peak = watched([ZTRAIN, "run", big, "--out", os.path.join(d, "out-gb")],
                                     env=emu8)
        check(rc == 1 and "does not fit on the GPU" in err and
              "GPU 0 (NVIDIA H100 80GB HBM3" in err and "ZeRO stage 3 (" in err and
              "for the CUDA context" in err and peak < 200,
              f"run: 6.4 G parameters at stage 0 refused against the emulated H100, ZeRO 3 "
              f"named as fitting: exit {rc}: {err.strip()[:600]}")
        # On one GPU the 8 ranks share it: each must fit an eighth of it with its reserve.
        # 1.6 G parameters at stage 1: about 14 GiB a rank, which one GPU holds but an eighth
        # of it does not.
        small_gpu = write_job(d, "gpu-shared", world_size=8, stage=1, device="cuda", n_layer=8,
                              n_head=32, n_embd=4096)
        rc, out, err, _ = watched([ZTRAIN, "estimate", small_gpu], env=emu)
        check(rc == 1 and "does not fit on the GPU" in err + out and
              "a 1/8 share of GPU 0 (NVIDIA H100 80GB HBM3" in err + out and
              "which 8 ranks share" in err + out,
              f"estimate: 8 ranks on one GPU are judged against an eighth of it each: exit {rc}: "
              f"{(err + out).strip()[-600:]}")
        rc, out, err, _ = watched([ZTRAIN, "estimate", small_gpu],
                                  env=dict(emu, ZTRAIN_CUDA_EMU_DEVICES="8"))
        # The GPUs are judged apart from this host's memory, which 8 such ranks may exceed:
        # the exit status is then the host's verdict.
        host_fits = re.search(r"ranks on this host: .*: fits$", out, re.M) is not None
        check(rc == (0 if host_fits else 1) and "does not fit on the GPU" not in err + out,
              f"estimate: the same job fits 8 GPUs, one a rank: exit {rc}: "
                       f"{(err + out).strip()[-400:]}")
        rc, out, err, _ = watched([ZTRAIN, "run", small, "--max-device-memory", "1M", "--out",
                                   os.path.join(d, "out-small2")])
        check(rc == 0, f"a cpu job is not judged by --max-device-memory: exit {rc} "
                       f"{err[-300:]}")
        rc, out, err, _ = watched([ZTRAIN, "estimate", gpu, "--max-device-memory", "lots"],
                                  env=emu)
        check(rc == 2 and "--max-device-memory expects a positive size" in err,
              f"a bad --max-device-memory is a usage error: {rc} {err.strip()[:200]}")
        # "comm": "nccl" needs a GPU per rank: two ranks on the one emulated GPU are refused by
        # validate and run before a rank starts, naming the key; on two GPUs the job runs.
        with open(gpu) as f:
            nccl_job = json.load(f)
        nccl_job.update(name="gpu-nccl", comm="nccl")
        nccl = os.path.join(d, "gpu-nccl.json")
        with open(nccl, "w") as f:
            json.dump(nccl_job, f)
        for cmd in (["validate", nccl], ["run", nccl, "--out", os.path.join(d, "out-nccl1")]):
            rc, out, err, _ = watched([ZTRAIN] + cmd, env=emu)
            check(rc == 1 and "key 'comm' is \"nccl\"" in out + err and
                  "the 2 ranks on one host would share 1 GPU(s)" in out + err and
                  "pid" not in err,
                  f"{cmd[0]}: 2 nccl ranks on 1 emulated GPU refused naming comm: exit {rc}: "
                  f"{(out + err).strip()[-400:]}")
        rc, out, err, _ = watched([ZTRAIN, "run", nccl, "--out", os.path.join(d, "out-nccl2")],
                                  env=dict(emu, ZTRAIN_CUDA_EMU_DEVICES="2"))
        check(rc == 0, f"run: 2 nccl ranks on 2 emulated GPUs train: exit {rc} {err[-300:]}")
        # CUDA_VISIBLE_DEVICES narrows the emulated GPUs as on a GPU host.
        rc, out, err, _ = watched([ZTRAIN, "validate", nccl],
                                  env=dict(emu, ZTRAIN_CUDA_EMU_DEVICES="2",
                                           CUDA_VISIBLE_DEVICES="1"))
        check(rc == 1 and "share 1 GPU(s)" in out + err,
              f"validate: CUDA_VISIBLE_DEVICES=1 of 2 emulated GPUs leaves one: exit {rc}: "
              f"{(out + err).strip()[-300:]}")
    else:
        print("skipped: the device checks (this build has no emulated CUDA device)")

ck.finish()
