"""scripts/gpu-check.sh's run against a stand-in bundle (no build, no GPU): programs that are
scripts, a fake nvidia-smi, and a `ztrain run` that hangs where asked. What a single run on a
lent GPU must not do is checked here, where it costs nothing:

- test_ops, the ops against the CPU, runs even when test_cuda_host fails, and a process a step
  leaves running (out of its time limit's reach) does not keep the run from ending;
- a run stopped by SIGTERM in a phase ends at once, stopping its step, with the JSON marked
  interrupted, the phase's output so far in gpu-check.log and its logs in logs.tar.gz;
- a throughput run that hangs is stopped after ZT_GPU_RUN_LIMIT seconds too, and the run's
  output ends with a summary of every phase and figure (the device tool returns the output's
  end even when OUTDIR does not come back);
- a training check's run that hangs is stopped after ZT_GPU_RUN_LIMIT seconds (60 by default,
  a GPU's runs taking a few), so the checks after it in the phase still run, rather than the
  one run taking the whole 240 s phase;
- OUTDIR keeps to the few files the device tool brings back (at most 8), the logs packed in
  logs.tar.gz, and the JSON says which check failed and why;
- the machine's CUDA libraries are found where only the environment's LD_LIBRARY_PATH names
  them (as an image may keep them), which the wrappers keep: checked in a private mount
  namespace with the toolkit hidden."""
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import SRC, Checks  # noqa: E402

SCRIPT = os.path.join(SRC, "scripts", "gpu-check.sh")
ck = Checks()
check = ck.check

# `ztrain run JOB --out DIR`: the losses a run logs, the same on every device, so the checks
# that compare runs pass; the job named in HANG never returns, as a run stuck on a GPU.
FAKE_ZTRAIN = r'''#!/usr/bin/env python3
import json, os, sys, time
if sys.argv[1:2] != ["run"]:
    sys.exit(2)
job = json.load(open(sys.argv[2]))
if job["name"] == os.environ.get("HANG"):
    time.sleep(3600)
out = sys.argv[sys.argv.index("--out") + 1]
os.makedirs(out, exist_ok=True)
steps = job["train"].get("bench_steps") or job["train"]["max_steps"]
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for i in range(1, steps + 1):
        f.write(json.dumps({"step": i, "train/loss": 5.0 - 0.1 * i}) + "\n")
'''
NVIDIA_SMI = ("#!/bin/sh\ncase \"$*\" in *--list-gpus*) echo 'GPU 0: NVIDIA H100 80GB HBM3';; "
              "*) echo 'NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB';; esac\n")


def executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


tmp = tempfile.mkdtemp(prefix="zt-gpu-check-run-")
try:
    stage = os.path.join(tmp, "stage")
    os.makedirs(os.path.join(stage, "bin"))
    os.makedirs(os.path.join(stage, "lib"))
    executable(os.path.join(stage, "bin", "ztrain"), FAKE_ZTRAIN)
    executable(os.path.join(stage, "bin", "ztrain-worker"), "#!/bin/sh\nexit 0\n")
    # test_cuda_host leaves a process behind in a session of its own, out of its time limit's
    # reach, holding every descriptor it was given but the standard three.
    executable(os.path.join(stage, "bin", "test_cuda_host"),
               "#!/bin/sh\nsetsid sleep 60 </dev/null >/dev/null 2>&1 &\n"
               "echo $! >\"$TMPDIR/escaped.pid\"\necho 'FAIL  a host check'\nexit 1\n")
    executable(os.path.join(stage, "bin", "test_ops"),
               "#!/bin/sh\necho 'backends: cpu cuda'\necho 'ok    every op'\n")
    open(os.path.join(stage, "lib", "libztrain_cuda.so"), "w").close()
    with open(os.path.join(stage, "bin", "CUDA_VERSION"), "w") as f:
        f.write("13.0\n")
    carry = os.path.join(tmp, "carry")
    os.makedirs(carry)
    with tarfile.open(os.path.join(carry, "bundle.tar.xz"), "w:xz") as tar:
        tar.add(os.path.join(stage, "bin"), "bin")
        tar.add(os.path.join(stage, "lib"), "lib")
    fakebin = os.path.join(tmp, "fakebin")
    os.makedirs(fakebin)
    executable(os.path.join(fakebin, "nvidia-smi"), NVIDIA_SMI)

    out = os.path.join(tmp, "out")
    env = dict(os.environ, ZT_GPU_CARRY=carry, PATH=fakebin + os.pathsep + os.environ["PATH"],
               TMPDIR=tmp, HANG="llama-dev", ZT_GPU_RUN_LIMIT="3")
    p = subprocess.run([SCRIPT, "run", out, "--phases", "train", "--budget", "120"],
                       capture_output=True, text=True, timeout=300, env=env)
    print(p.stdout[-3000:], p.stderr[-1000:])
    try:
        res = json.load(open(os.path.join(out, "gpu-check.json")))
    except (OSError, ValueError) as e:
        res = {}
        check(False, f"run writes valid JSON: {e}")
    if res.get("bundle_ok") is False and "not on this machine" in res.get("bundle_error", ""):
        print(f"skip  {res['bundle_error']}: no CUDA toolkit's libraries to stand in for the "
              "machine's")
        sys.exit(0)
    log = open(os.path.join(out, "gpu-check.log")).read() if os.path.isdir(out) else ""
    check("llama-dev: no result within --timeout 3 s" in log,
          "the hung run is stopped after ZT_GPU_RUN_LIMIT seconds, not the phase's time: "
          + next((line for line in log.splitlines() if "llama-dev:" in line), "(no line)"))
    later = [c for c in ("bf16:", "zero: stage 3", "resume:") if f"ok    {c}" in log]
    check(len(later) == 3, f"the checks after the hung one still run and pass: {later}")
    check(res.get("train_ok") is False and "llama" in res.get("train_error", "") and
          "llama-dev: no result within" in res.get("train_error", ""),
          f"the phase fails naming the check and its run's failure: {res.get('train_error')}")
    names = sorted(os.listdir(out))
    check(len(names) <= 8 and "logs.tar.gz" in names and
          not any(os.path.isdir(os.path.join(out, n)) for n in names),
          f"OUTDIR holds no more than the 8 files the device tool brings back: {names}")

    # Stopped in a phase (SIGTERM to the script alone, as a lease's end may send it): it stops
    # the step it runs, and OUTDIR keeps the phase's output so far, its logs and the JSON.
    out = os.path.join(tmp, "out-stopped")
    run = subprocess.Popen([SCRIPT, "run", out, "--phases", "train", "--budget", "120"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(env, HANG="zero-one", ZT_GPU_RUN_LIMIT="100"),
                           start_new_session=True)
    log = os.path.join(out, "gpu-check.log")
    for _ in range(600):
        if os.path.exists(log) and "ok    bf16: the loss falls" in open(log).read():
            break
        time.sleep(0.1)
    time.sleep(1)  # into the hung run
    run.send_signal(signal.SIGTERM)
    try:
        rc = run.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)  # the script and every step it left running
        run.wait()
        rc = "still running 20 s after SIGTERM"
    run.stdout.close()
    res = json.load(open(os.path.join(out, "gpu-check.json"))) if os.path.isdir(out) else {}
    check(rc == 3 and res.get("interrupted") is True,
          f"a stopped run ends at once with exit 3, its JSON saying so: {rc} "
          f"{res.get('interrupted')}")
    text = open(log).read() if os.path.exists(log) else ""
    with tarfile.open(os.path.join(out, "logs.tar.gz")) as tar:
        logs = [os.path.basename(n) for n in tar.getnames()]
    check("ok    bf16: the loss falls" in text and "train_train.log" in logs,
          f"the stopped phase's output so far is in gpu-check.log and its logs in logs.tar.gz: "
          f"{logs}")

    # The throughput phase: ztrain's run hangs; it is stopped after ZT_GPU_RUN_LIMIT seconds (at
    # most half the phase), leaving the runs after it their time, and the summary closing the
    # log (what the device tool returns when OUTDIR does not come back) names what failed.
    out = os.path.join(tmp, "out-throughput")
    p = subprocess.run([SCRIPT, "run", out, "--phases", "throughput", "--budget", "120"],
                       capture_output=True, text=True, timeout=200,
                       env=dict(env, HANG="bench-gpt2"))
    res = json.load(open(os.path.join(out, "gpu-check.json"))) if os.path.isdir(out) else {}
    z = (res.get("throughput") or {}).get("gpt2", {}).get("ztrain", {})
    check("no result within --timeout 3 s" in z.get("error", "") and
          "torch_eager" in (res.get("throughput") or {}).get("gpt2", {}),
          f"a hung ztrain run is stopped after ZT_GPU_RUN_LIMIT seconds, the next runs still "
          f"run: {res.get('throughput')}")
    tail = p.stdout.split("== summary", 1)[-1]
    check("throughput FAILED" in tail and "throughput gpt2 ztrain: failed: ztrain run "
          "micro-batch 8: no result within --timeout 3 s" in tail,
          f"the summary at the end of the output names the failed phase and run: {tail[-800:]}")

    # test_cuda_host failing does not cost the phase its point, test_ops against the CPU.
    out = os.path.join(tmp, "out-ops")
    t0 = time.monotonic()
    try:
        p = subprocess.run([SCRIPT, "run", out, "--phases", "ops", "--budget", "60"],
                           capture_output=True, text=True, timeout=50, env=env)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = "no exit within 50 s"
    finally:
        escaped = os.path.join(tmp, "escaped.pid")
        if os.path.exists(escaped):
            os.kill(int(open(escaped).read()), signal.SIGKILL)
    check(rc == 1, f"a process a step leaves behind does not keep the run from ending: {rc}, "
          f"{time.monotonic() - t0:.0f} s")
    res = json.load(open(os.path.join(out, "gpu-check.json"))) if os.path.isdir(out) else {}
    check(res.get("ops_ok") is False and "a host check" in res.get("ops_error", "") and
          res.get("ops_failures") == 0 and res.get("ops_flash_failures") == 0,
          f"test_ops runs after a failed test_cuda_host, which names the phase's failure: "
          f"{ {k: v for k, v in res.items() if k.startswith('ops')} }")

    # The toolkit hidden, cuBLASLt and NCCL only in a folder LD_LIBRARY_PATH names.
    machine = os.path.join(tmp, "machine-lib")
    os.makedirs(machine)
    for name in ("libcublasLt.so.13", "libcublas.so.13", "libnccl.so.2"):
        open(os.path.join(machine, name), "w").close()
    cuda = os.path.realpath("/usr/local/cuda")
    script = (f"mount -t tmpfs none {cuda} 2>/dev/null || true; "
              f"LD_LIBRARY_PATH={machine} {SCRIPT} unpack")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120, env=env)
    if "BIN=" not in p.stdout:
        print(f"skip  no private mount namespace here ({p.stderr.strip()[:200]})")
    else:
        check(p.returncode == 0 and f"libcublasLt.so.13 from {machine}" in p.stdout and
              f"libnccl.so.2 from {machine}" in p.stdout,
              f"the machine's libraries found on LD_LIBRARY_PATH: exit {p.returncode} "
              f"{p.stdout.strip()[-400:]} {p.stderr.strip()[-300:]}")
        bin_dir = next(line[4:] for line in p.stdout.splitlines() if line.startswith("BIN="))
        subprocess.run(["rm", "-rf", os.path.dirname(bin_dir)])
finally:
    subprocess.run(["rm", "-rf", tmp])

ck.done()
