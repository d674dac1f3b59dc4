"""scripts/gpu-check.sh on a machine without a GPU (issue 27, defect 8): what travels to the GPU
machine is proven here, where it is made.

- `pack` bundles this build's programs, the CUDA module, the CUDA runtime and the Debian
  libraries they need; the bundle fits the 64 MiB a GPU machine takes.
- The bundle is self-contained: in a mount namespace where /usr/local/cuda and /usr/local/lib
  are empty, `ldd` of every program and of the module with only the bundle's lib/ finds every
  library except the ones the GPU machine must supply (the driver's libcuda, cuBLASLt and NCCL,
  too large to carry), and ztrain starts from the bundle.
- `unpack` finds those on this machine (the toolkit), writes wrappers that give the bundle's
  libraries to ztrain's programs alone, and the bundle's test_cuda_host runs through them,
  loading the bundled CUDA module.
- `run` without a GPU stops after its device phase with exit 1, and its JSON says so: the
  device phase failed naming the reason, every later phase is marked skipped with that reason,
  and the JSON is valid. Without the bundle it stops at once, saying to carry it.
- The plan (round 4, D2): `plan`'s phases and limits are docs/gpu.md's table's, the default
  plan (command 1) fits the device tool's 600 s command with a minute to spare, and the second
  command's phases are the table's command 2.
- With a fake nvidia-smi and the emulated device (D1, D6), `run --phases ops --budget 20` with
  its first test_ops stalled (SIGSTOP once it has printed its backends line, as a hung one on a
  GPU): test_ops is stopped at its time and says so in ops_error, keeping the line
  it printed before, the later steps are skipped and named, never given a limit of 0 or less;
  the unpacked bundle is removed; every "%p" of ZTRAIN_CUDA_EMU_ISSUE_LOG is the process id.
- In PyTorch's wheel layout (a private mount namespace: the toolkit hidden, its libraries bound
  into nvidia/cu13/lib and nvidia/cudnn/lib of a virtual environment's site-packages), cuDNN is
  found and on the wrappers' library path (D3); without it the JSON says so and the ops phase
  fails naming it.
A build without libztrain_cuda.so (no CUDA toolkit) has nothing to bundle: the test says so."""
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, Checks  # noqa: E402

SCRIPT = os.path.join(SRC, "scripts", "gpu-check.sh")
MACHINE = {"libcuda.so.1", "libcublasLt.so.13", "libcublas.so.13", "libnccl.so.2"}
ck = Checks()
check = ck.check


def sh(args, env=None, timeout=240):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(args, -1, out, f"timed out after {timeout} s")


def logs_of(out):
    """{name: text} of OUT/logs.tar.gz, the run's phase and tool logs; {} without it."""
    try:
        with tarfile.open(os.path.join(out, "logs.tar.gz")) as tar:
            return {os.path.basename(m.name): tar.extractfile(m).read().decode(errors="replace")
                    for m in tar.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError):
        return {}


def check_brought_back(out, what):
    """OUT as the device tool brings it back: at most 8 files, each no more than 2 folders down
    (/work/.library/device/README.md, its Limits); the run's own: files alone, no folders."""
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    folders = [n for n in names if os.path.isdir(os.path.join(out, n))]
    check(names and len(names) <= 8 and not folders and
          {"gpu-check.json", "gpu-check.log"} <= set(names),
          f"{what}: OUTDIR holds at most the 8 files the device tool brings back: {names}")


def load_json(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError) as e:
        check(False, f"{path} is valid JSON: {e}")
        return {}


if not os.path.exists(os.path.join(BUILD, "libztrain_cuda.so")):
    print("skip  no libztrain_cuda.so in this build (no CUDA toolkit): nothing to bundle")
    sys.exit(0)

tmp = tempfile.mkdtemp(prefix="zt-gpu-bundle-")
carry = os.path.join(tmp, "carry")
env = {"ZT_GPU_CARRY": carry, "XZ_OPT": "-1 -T2"}
try:
    p = sh([SCRIPT, "pack", BUILD, carry], env)
    tar = os.path.join(carry, "bundle.tar.xz")
    check(p.returncode == 0 and os.path.exists(tar), f"pack: exit {p.returncode} "
          f"{p.stderr.strip()[-300:]}")
    size = os.path.getsize(tar) if os.path.exists(tar) else 0
    check(0 < size <= 64 << 20, f"the bundle is {size / 2**20:.1f} MiB, within the 64 MiB carry")

    unpacked = os.path.join(tmp, "unpacked")
    os.makedirs(unpacked)
    subprocess.run(["tar", "-C", unpacked, "-xJf", tar], check=True, timeout=120)
    binaries = [os.path.join(unpacked, "bin", n) for n in
                ("ztrain", "ztrain-worker", "test_ops", "test_cuda_host")]
    module = os.path.join(unpacked, "lib", "libztrain_cuda.so")
    check(all(os.path.exists(b) for b in binaries + [module]),
          "the bundle holds the programs and the CUDA module")
    check(os.path.exists(os.path.join(unpacked, "lib", "libcudart.so.13")),
          "the bundle carries the CUDA runtime")

    # Without the toolkit: an empty /usr/local/cuda (and /usr/local/lib, where a runtime copy
    # may sit), in a private mount namespace.
    cuda = os.path.realpath("/usr/local/cuda")
    lib = os.path.join(unpacked, "lib")
    script = (f"mount -t tmpfs none {cuda} && mount -t tmpfs none /usr/local/lib && "
              f"test -z \"$(ls {cuda})\" && "
              f"LD_LIBRARY_PATH={lib} ldd {' '.join(binaries)} {module}; "
              f"echo '--- ztrain'; LD_LIBRARY_PATH={lib} {binaries[0]} --version; "
              f"echo \"rc=$?\"")
    p = sh(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    if "--- ztrain" not in p.stdout:
        print(f"skip  no private mount namespace here ({p.stderr.strip()[:200]}): the bundle is "
              "checked with the toolkit present")
        p = sh(["sh", "-c", script.split("&& ", 3)[3]], {"LD_LIBRARY_PATH": lib})
    ldd_out, _, run_out = p.stdout.partition("--- ztrain")
    missing = {line.split()[0] for line in ldd_out.splitlines() if "not found" in line}
    check(missing <= MACHINE, f"without the toolkit, only what the GPU machine supplies is "
          f"missing: {sorted(missing)} (allowed: {sorted(MACHINE)})")
    check("rc=0" in run_out and "error while loading" not in p.stderr,
          f"ztrain starts from the bundle alone: {run_out.strip()[-200:]} {p.stderr[-300:]}")

    # unpack: the wrappers, with the machine's libraries found.
    p = sh([SCRIPT, "unpack"], env)
    bin_dir = next((line[4:] for line in p.stdout.splitlines() if line.startswith("BIN=")), "")
    check(p.returncode == 0 and os.path.isdir(bin_dir),
          f"unpack: exit {p.returncode}, BIN={bin_dir}: {p.stderr.strip()[-300:]}")
    check("libnccl.so.2 from " in p.stdout and "libcublasLt.so.13 from " in p.stdout,
          f"unpack names where NCCL and cuBLASLt come from: {p.stdout.strip()[:300]}")
    if os.path.isdir(bin_dir):
        wrapper = open(os.path.join(bin_dir, "ztrain")).read()
        check(wrapper.startswith("#!/bin/sh") and "LD_LIBRARY_PATH=" in wrapper and
              os.path.join(os.path.dirname(bin_dir), "bin", "ztrain") in wrapper,
              f"the wrapper gives the bundle's libraries to ztrain alone: {wrapper!r}")
        q = sh([os.path.join(bin_dir, "test_cuda_host")], {"LD_LIBRARY_PATH": ""})
        check(q.returncode == 0 and "CUDA backend built" in q.stdout,
              f"the bundle's test_cuda_host runs through its wrapper and loads the module: "
              f"exit {q.returncode} {q.stdout.strip()[-300:]} {q.stderr.strip()[-300:]}")
        shutil.rmtree(os.path.dirname(bin_dir), ignore_errors=True)

    # run, without a GPU here: the device phase fails, the rest are skipped, the JSON says so.
    out = os.path.join(tmp, "out")
    path = dict(os.environ)["PATH"]
    # nvidia-smi is absent on this machine; a PATH without it makes that certain.
    clean = ":".join(d for d in path.split(":") if not os.path.exists(os.path.join(d,
                                                                                   "nvidia-smi")))
    p = sh([SCRIPT, "run", out], dict(env, PATH=clean), timeout=120)
    check(p.returncode == 1, f"run without a GPU exits 1 (got {p.returncode})")
    try:
        res = json.load(open(os.path.join(out, "gpu-check.json")))
    except (OSError, ValueError) as e:
        res = {}
        check(False, f"run writes valid JSON: {e}")
    check(res.get("device_ok") is False and "phase device" in res.get("device_error", "") and
          "nvidia-smi" in res.get("device_error", ""),
          f"the device phase failed, saying why: {res.get('device_error')}")
    check_brought_back(out, "run without a GPU")
    check("phase-device.log" in logs_of(out),
          f"logs.tar.gz holds the phase's log: {sorted(logs_of(out))}")
    skipped = [k for k in ("bundle", "ops", "curve", "throughput", "train", "profile")
               if res.get(f"{k}_ok", "absent") is None and
               res.get(f"{k}_error", "").startswith(f"phase {k}: skipped: ")]
    check(len(skipped) == 6, f"every later phase is marked skipped with the reason: {skipped}")
    check(res.get("plan") == "device bundle ops curve throughput train profile" and
          "bench_ok" not in res and res.get("budget_seconds") == 540,
          f"the default plan leaves bench to the second command: {res.get('plan')}, "
          f"budget {res.get('budget_seconds')}")

    # Without the bundle: at once, saying to carry it (not a build of up to 900 s).
    out = os.path.join(tmp, "out-nobundle")
    p = sh([SCRIPT, "run", out], dict(env, ZT_GPU_CARRY=os.path.join(tmp, "none")), timeout=60)
    res = load_json(os.path.join(out, "gpu-check.json"))
    check(p.returncode == 2 and "build-gpu-carry" in p.stdout and "carry" in
          res.get("bundle_error", "") and "device_ok" not in res,
          f"without the bundle run stops at once, saying to carry it: exit {p.returncode} "
          f"{p.stdout.strip()[-300:]}")

    # The plan against docs/gpu.md's table: | `phase` | N s | commands | ... |
    docs = open(os.path.join(SRC, "docs", "gpu.md")).read()
    table = {}
    for line in docs.split("## Running the GPU check", 1)[-1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`") and cells[1].endswith(" s"):
            table[cells[0].strip("`")] = (int(cells[1][:-2]), cells[2].replace(" ", ""))

    def plan_of(*args):
        p = sh([SCRIPT, "plan", *args], timeout=30)
        rows = [line.split() for line in p.stdout.splitlines()[1:-1]]
        return {r[0]: int(r[1]) for r in rows}, p.stdout.splitlines()[-1:]
    every, _ = plan_of("--phases", "all")
    check(every and every == {k: v[0] for k, v in table.items()} and list(every) == list(table),
          f"plan's phases, order and limits are docs/gpu.md's: {every} against {table}")
    first, total = plan_of()
    check(first and list(first) == [k for k, v in table.items() if "1" in v[1].split(",")],
          f"the default plan is the table's command 1: {list(first)}")
    check(first and sum(first.values()) <= 540 <= 600 - 60 and
          "within the 540 s budget" in "".join(total),
          f"the default plan fits one 600 s command with a minute left: {sum(first.values())} s")
    second, _ = plan_of("--phases", "bench,ops_perf")
    check(second and list(second) == [k for k, v in table.items() if "2" in v[1].split(",")] and
          "--phases bench,ops_perf" in docs,
          f"the second command's phases are the table's command 2: {list(second)}")
    train_row = next((line for line in docs.splitlines() if line.startswith("| `train`")), "")
    check("two GPUs" in train_row and "skip nccl" in train_row,
          f"the train phase's row says the NCCL check needs two GPUs: {train_row[-200:]}")

    # The emulated device behind a fake nvidia-smi, its first test_ops stalled: the budget runs out.
    fakebin = os.path.join(tmp, "fakebin")
    os.makedirs(fakebin)
    with open(os.path.join(fakebin, "nvidia-smi"), "w") as f:
        f.write("#!/bin/sh\ncase \"$*\" in *--list-gpus*) echo 'GPU 0: NVIDIA H100 80GB HBM3';;\n"
                "  *memory.used*) echo 1000;; *) echo 'NVIDIA H100 80GB HBM3, 580.65.06, "
                "81559 MiB';; esac\n")
    os.chmod(os.path.join(fakebin, "nvidia-smi"), 0o755)
    bundles = os.path.join(tmp, "bundles")
    issues = os.path.join(tmp, "issues")
    os.makedirs(bundles)
    os.makedirs(issues)
    emu = dict(env, PATH=fakebin + ":" + path, ZTRAIN_CUDA_EMU="1", TMPDIR=bundles,
               ZTRAIN_CUDA_EMU_ISSUE_LOG=os.path.join(issues, "n-%p-%p.json"))

    # PyTorch's wheel layout in a private mount namespace: the toolkit hidden, the libraries the
    # machine supplies bound one by one into a virtual environment's nvidia/cu13/lib, and cuDNN
    # (when asked) into nvidia/cudnn/lib, a directory no linker cache names.
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    site = subprocess.run([os.path.join(venv, "bin", "python3"), "-c",
                           "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    wheel_cu13 = os.path.join(site, "nvidia", "cu13", "lib")
    wheel_cudnn = os.path.join(site, "nvidia", "cudnn", "lib")
    os.makedirs(wheel_cu13)
    os.makedirs(wheel_cudnn)

    def in_wheels(args, with_cudnn, run_env, timeout=90):
        steps = []
        for name, where in [(n, wheel_cu13) for n in ("libcublasLt.so.13", "libcublas.so.13",
                                                      "libnccl.so.2", "libnvrtc.so.13")] + \
                [("libcudnn.so.9", wheel_cudnn)] * with_cudnn:
            dest = os.path.join(where, name)
            steps += [f"touch {dest}", f"mount --bind "
                      f"{os.path.realpath(os.path.join(cuda, 'lib64', name))} {dest}"]
        if not with_cudnn:
            steps.append(f"rm -f {os.path.join(wheel_cudnn, 'libcudnn.so.9')}")
        steps += [f"mount -t tmpfs none {cuda}", "mount -t tmpfs none /usr/local/lib",
                  f"PATH={os.path.join(venv, 'bin')}:$PATH {shlex.join(args)}"]
        return sh(["unshare", "-m", "--propagation", "private", "sh", "-c", " && ".join(steps)],
                  run_env, timeout=timeout)

    p = in_wheels([SCRIPT, "unpack"], True, dict(env, TMPDIR=bundles))
    namespace = "BIN=" in p.stdout
    if not namespace:
        print(f"skip  no private mount namespace here ({p.stderr.strip()[:200]}): PyTorch's "
              "wheel layout is not checked")
    else:
        bin_dir = next((line[4:] for line in p.stdout.splitlines() if line.startswith("BIN=")))
        wrapper = open(os.path.join(bin_dir, "test_ops")).read() if os.path.isdir(bin_dir) else ""
        check(p.returncode == 0 and f"libcudnn.so.9 from {wheel_cudnn}" in p.stdout and
              wheel_cudnn in wrapper,
              f"cuDNN found in PyTorch's wheels and on the wrappers' path: exit {p.returncode} "
              f"{p.stdout.strip()[-600:]} {p.stderr.strip()[-300:]}")
        shutil.rmtree(os.path.dirname(bin_dir), ignore_errors=True)

    def stall_test_ops(out, stop):
        """Stops (SIGSTOP) the first test_ops once the run's log has its backends line (the
        log is written as the step prints, or a run killed in a phase would bring back nothing
        of it): a test_ops that hangs on a GPU, made certain here, where the emulated run may
        well finish within the budget on a quick machine. The phase's timeout then kills it."""
        log = os.path.join(out, "gpu-check.log")
        while not stop.wait(0.05):
            try:
                if "backends:" not in open(log, errors="replace").read():
                    continue
            except OSError:
                continue
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                if argv and os.path.basename(argv[0]) == b"test_ops":
                    os.kill(int(pid), signal.SIGSTOP)
                    return

    def emu_ops_run(out):
        args = [SCRIPT, "run", out, "--phases", "ops", "--budget", "20"]
        stop = threading.Event()
        staller = threading.Thread(target=stall_test_ops, args=(out, stop), daemon=True)
        staller.start()
        try:
            return in_wheels(args, False, emu) if namespace else sh(args, emu, timeout=90)
        finally:
            stop.set()
            staller.join()
    # The rest drives the emulated device, which a build without it (the sanitizer's) lacks.
    if not os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
        print("skip  the emulated ops phase: this build has no emulated CUDA device")
    else:
        out = os.path.join(tmp, "out-emu")
        p = emu_ops_run(out)
        res = load_json(os.path.join(out, "gpu-check.json"))
        if namespace:
            check(res.get("cudnn_found") is False and res.get("lib_libcudnn", 0) is None and
                  "libcudnn.so.9" in res.get("ops_cudnn", "") and res.get("ops_ok") is False,
                  f"without cuDNN the JSON says so and the ops phase fails naming it: "
                  f"{res.get('cudnn_found')} {res.get('ops_cudnn')}")
        print(p.stdout[-1500:])
        err = res.get("ops_error", "")
        check(res.get("ops_ok") is False and "test_ops timed out after" in err and
              "did not run" not in err,
              f"ops_error names test_ops's timeout: {err}")
        logs = logs_of(out)
        bad = [n for n, text in logs.items() if "invalid option" in text]
        check(res.get("ops_skipped") == "test_ops_flash test_ops_bias_sums" and
              res.get("ops_flash_failures", 0) is None and
              res.get("ops_bias_sums_failures", 0) is None and not bad,
              f"the steps left no time are skipped and named, timeout never misread: "
              f"{res.get('ops_skipped')!r} {bad}")
        check("backends: cpu cuda" in logs.get("test_ops.log", ""),
              f"test_ops's stdout survives its kill (line-buffered): {sorted(logs)}")
        check_brought_back(out, "the emulated ops run")
        # The budget bounds the phase through timeout's limits: 20 s, plus the 5 s timeout grants a
        # killed step and a few for the script's own work on a loaded machine.
        check(res.get("plan") == "device bundle ops" and "curve_ok" not in res and
              res.get("ops_seconds", 99) <= 35,
              f"--phases ops runs device, bundle and ops within --budget 20: {res.get('plan')}, "
              f"ops {res.get('ops_seconds')} s")
        unpacked = next((line.split(" through ")[1][:-len("/wrap")]
                         for line in p.stdout.splitlines()
                         if line.startswith("using the carried build")), "")
        check(unpacked.startswith(bundles + os.sep) and not os.path.exists(unpacked) and
              os.listdir(bundles) == [],
              f"the bundle was unpacked in $TMPDIR and removed: {unpacked!r} {os.listdir(bundles)}")
        names = os.listdir(issues)
        check(names and all(n.startswith("n-") and n.count("%p") == 0 and
                            n[2:-5].split("-")[0] == n[2:-5].split("-")[1] for n in names),
              f"every %p of ZTRAIN_CUDA_EMU_ISSUE_LOG is the process id: {names}")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

ck.done()
