"""The CPU and CUDA images, built and run for real (make test-container): build docker/Dockerfile with podman
on a Debian base made locally (no registry is reachable), run ztraind in it with its state, data
and runs on host directories and its ports published on 127.0.0.1, submit the embedded default job
(examples/demo, shortened) from the host with the host-built `ztrain` CLI, watch it to SUCCEEDED,
read its metrics over HTTP and compare them with the run directory's metrics.jsonl, stop the
container with SIGTERM while a second job (2 ranks) runs, start a new container on the same
directories and find both jobs and their history there. Also: the processes run as uid 10001,
the HEALTHCHECK passes, the token is required. Then docker/Dockerfile.cuda, built with this
machine's CUDA toolkit mounted for the build (cuda_image: its own checks, skipped without a
toolkit). Needs root (rootful podman, debootstrap, chown).

    /usr/bin/python3 tests/container/test_container.py [BUILD_DIR]

It installs what it needs through scripts/install-deps.sh (the `container` profile), and keeps the
Debian base as a tar file under $ZTRAIN_CONTAINER_CACHE (default /var/tmp/ztrain-container), made
again each ISO week, and as the image localhost/debian:bookworm-slim; everything else it creates
(containers, the test images, the builds' layers, temporary directories) is removed at the end.
ZTRAIN_CONTAINER_KEEP=1 keeps the image and the host directories for a look afterwards."""
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_ports  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                        os.environ.get("ZTRAIN_BUILD", os.path.join(SOURCE, "build")))
CACHE = os.environ.get("ZTRAIN_CONTAINER_CACHE", "/var/tmp/ztrain-container")
KEEP = os.environ.get("ZTRAIN_CONTAINER_KEEP") == "1"
BASE = "localhost/debian:bookworm-slim"
BASE_ALIAS = "docker.io/library/debian:bookworm-slim"
BASE_LABEL = "org.ztrain.debian-base"
UID = 10001
TOKEN = "container-test-token"
STEPS = 100           # the demo job's 300 steps, shortened
STOP_TIMEOUT = 30     # longer than the image's --grace 20

# Podman on this kind of host (reference/containers_slurm.md §1): crun rejects the hybrid cgroup
# layout, so runc; root lacks CAP_SYS_RESOURCE, so ulimits within the hard limits; netavark named
# because the Debian package also ships a CNI config that podman would otherwise pick up.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
[network]
network_backend = "netavark"
"""

T0 = time.monotonic()
failed = 0


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def check(ok, what):
    global failed
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    failed += 0 if ok else 1
    return ok


def run(cmd, timeout=120, check_rc=True, **kw):
    """Runs a command; returns (rc, stdout+stderr). A non-zero status raises when check_rc."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, **kw)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout[-4000:]}")
    return p.returncode, p.stdout


def podman(*args, **kw):
    return run(["podman", *args], **kw)


def http_get(url, token=None, timeout=10):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def base_image():
    """localhost/debian:bookworm-slim (and its docker.io alias) from this week's debootstrap tar,
    made with docker/debian-base.sh when missing."""
    key = datetime.date.today().strftime("%G-W%V")
    old_id = ""
    rc, out = podman("image", "inspect", "--format", "{{index .Labels \"%s\"}}" % BASE_LABEL, BASE,
                     check_rc=False)
    if rc == 0 and out.strip() == key:
        log(f"base: {BASE} of {key} is there")
    else:
        os.makedirs(CACHE, exist_ok=True)
        tar = os.path.join(CACHE, f"debian-bookworm-slim-{key}.tar")
        if not os.path.exists(tar):
            log(f"base: debootstrap into {tar} (once a week)")
            run([os.path.join(SOURCE, "docker", "debian-base.sh"), tar], timeout=600)
            for old in glob.glob(os.path.join(CACHE, "debian-bookworm-slim-*.tar")):
                if old != tar:
                    os.remove(old)
        old_id = podman("image", "inspect", "--format", "{{.Id}}", BASE,
                        check_rc=False)[1].strip() if rc == 0 else ""
        podman("import", "--change", f"LABEL {BASE_LABEL}={key}", "--change", 'CMD ["bash"]', tar,
               BASE, timeout=300)
        log(f"base: imported {tar} as {BASE}")
    # The Dockerfile says FROM debian:bookworm-slim, which docker resolves to the docker.io name.
    # A real image of that name (where a registry is reachable) is left alone.
    rc, out = podman("image", "inspect", "--format", "{{index .Labels \"%s\"}}" % BASE_LABEL,
                     BASE_ALIAS, check_rc=False)
    if rc != 0 or out.strip() not in ("", "<no value>"):
        podman("tag", BASE, BASE_ALIAS)
    if old_id:
        podman("rmi", old_id, check_rc=False)   # last week's base, now untagged


def image_ids():
    """Every image podman holds, intermediate layers' images included."""
    out = podman("images", "--all", "--quiet", "--no-trunc", check_rc=False)[1]
    return {w for w in out.split() if re.fullmatch(r"(sha256:)?[0-9a-f]{64}", w)}


def remove_images_since(before):
    """Removes the images made after `before` was taken (the builds' layers); children first,
    so a few passes."""
    for _ in range(4):
        new = image_ids() - before
        if not new:
            return
        podman("rmi", "-f", *sorted(new), check_rc=False)
    log(f"left behind: {len(image_ids() - before)} image(s) this test made")


def make_job_files(job_dir, data_dir):
    """The demo's data (scripts/demo.sh: ztrain's own C sources as bytes, the last tenth held out)
    in the data directory, and the demo job with fewer steps plus a long job to stop."""
    corpus = b""
    for sub in ("engine", "kernels", "service"):
        for path in sorted(glob.glob(os.path.join(SOURCE, sub, "**", "*.[ch]"), recursive=True)):
            with open(path, "rb") as f:
                corpus += f.read()
    cut = len(corpus) * 9 // 10
    with open(os.path.join(data_dir, "train.txt"), "wb") as f:
        f.write(corpus[:cut])
    with open(os.path.join(data_dir, "val.txt"), "wb") as f:
        f.write(corpus[cut:])
    shutil.copy(os.path.join(SOURCE, "examples", "demo", "ds_config.json"), job_dir)
    with open(os.path.join(SOURCE, "examples", "demo", "job.json")) as f:
        job = json.load(f)
    job["train"].update(max_steps=STEPS, eval_interval=50, checkpoint_interval=50)
    demo = os.path.join(job_dir, "job.json")
    with open(demo, "w") as f:
        json.dump(job, f, indent=2)
    # The job that SIGTERM stops runs on 2 ranks, so the ranks' shared-memory communicator works
    # inside the container too (Docker's default /dev/shm is 64 MiB).
    with open(os.path.join(SOURCE, "examples", "demo", "ds_config.json")) as f:
        ds = json.load(f)
    ds["train_micro_batch_size_per_gpu"] = ds["train_batch_size"] // 2
    job.update(name="stopped-by-sigterm", world_size=2, deepspeed=ds)
    job["train"].update(max_steps=100000, checkpoint_interval=100000, checkpoint_dir="ckpt-stop")
    long = os.path.join(job_dir, "long.json")
    with open(long, "w") as f:
        json.dump(job, f, indent=2)
    return demo, long


class Container:
    def __init__(self, image, name, dirs, grpc_port, http_port):
        self.image, self.name, self.dirs = image, name, dirs
        self.grpc_port, self.http_port = grpc_port, http_port
        self.url = f"http://127.0.0.1:{http_port}"
        self.server = f"127.0.0.1:{grpc_port}"

    def start(self):
        d = self.dirs
        # This host has no systemd to time the periodic healthcheck (podman would log an error at
        # each start and stop); `podman healthcheck run` still runs the image's check on demand.
        podman("run", "-d", "--name", self.name, "--label", "org.ztrain.test=container",
               "-p", f"127.0.0.1:{self.grpc_port}:50051", "-p", f"127.0.0.1:{self.http_port}:8080",
               "-v", f"{d['state']}:/var/lib/ztrain/state", "-v", f"{d['data']}:/data",
               "-v", f"{d['runs']}:/runs", "-v", f"{d['token']}:/run/secrets/ztrain_token:ro",
               "--stop-timeout", str(STOP_TIMEOUT), "--health-interval", "disable", self.image)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = self.logs()
            if "ztraind: ready" in out:
                try:
                    if http_get(self.url + "/healthz", timeout=2)[0] == 200:
                        return out
                except OSError:
                    pass
            if podman("inspect", "--format", "{{.State.Running}}", self.name)[1].strip() != "true":
                raise RuntimeError(f"the container stopped:\n{out}")
            time.sleep(0.1)
        raise RuntimeError(f"ztraind did not get ready in 30 s:\n{self.logs()}")

    def healthy(self):
        """Runs the image's HEALTHCHECK once; whether it passed and podman recorded it."""
        rc, out = podman("healthcheck", "run", self.name, check_rc=False)
        status = podman("inspect", "--format", "{{.State.Health.Status}}", self.name,
                        check_rc=False)[1].strip()
        if rc != 0 or status != "healthy":
            print(f"      healthcheck: status {rc} {out.strip()!r}, recorded {status!r}")
        return rc == 0 and status == "healthy"

    def logs(self):
        return podman("logs", self.name, check_rc=False)[1]

    def cli(self, *args, timeout=120, check_rc=True):
        return run([os.path.join(BUILD, "ztrain"), args[0], "--server", self.server,
                    "--token-file", self.dirs["token"], *args[1:]], timeout=timeout,
                   check_rc=check_rc)

    def job(self, job_id):
        """`ztrain status ID -o json`: the proto3 JSON mapping of Job (docs/api.md), so the
        state is the enum's full name and the 64-bit step a string, absent while 0."""
        return json.loads(self.cli("status", job_id, "-o", "json")[1])

    def stop(self):
        t = time.monotonic()
        podman("stop", "-t", str(STOP_TIMEOUT), self.name, timeout=STOP_TIMEOUT + 30)
        return time.monotonic() - t

    def remove(self):
        podman("rm", "-f", "-t", "0", self.name, check_rc=False)


def state(j):
    """A Job's state without the enum's prefix: "SUCCEEDED" for "JOB_STATE_SUCCEEDED"."""
    return j.get("state", "JOB_STATE_UNSPECIFIED").removeprefix("JOB_STATE_")


def step(j):
    return int(j.get("step", "0"))


def loss_series(c, job_id, keys="train/loss,eval/loss"):
    status, body = http_get(f"{c.url}/api/v1/jobs/{job_id}/metrics?keys={keys}", TOKEN)
    if status != 200:
        raise RuntimeError(f"GET metrics: {status} {body}")
    # GetMetricsResponse in proto3 JSON: int64 steps are strings, NaN is "NaN".
    return {s["key"]: list(zip(map(int, s.get("steps", [])), map(float, s.get("values", []))))
            for s in json.loads(body).get("series", [])}


def jsonl_series(path, key):
    out = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if key in rec:
                out.append((rec["train/global_step"], rec[key]))
    return out


def same_series(a, b):
    return len(a) == len(b) and all(sa == sb and abs(va - vb) <= 1e-6 * max(1.0, abs(vb))
                                    for (sa, va), (sb, vb) in zip(a, b))


def cuda_image(tmp, timings):
    """docker/Dockerfile.cuda, built with this machine's CUDA toolkit mounted for the build: the
    module and the three CUDA libraries are in the image and resolve; ztraind starts and serves;
    a CPU job runs to SUCCEEDED; a cuda job is refused at submit, saying the server has no GPUs;
    and a cuda rank started in the image loads the CUDA module and reports the missing GPU."""
    toolkit = os.path.realpath("/usr/local/cuda")
    if not os.path.exists(os.path.join(toolkit, "bin", "nvcc")):
        print("skip  the CUDA image: no CUDA toolkit at /usr/local/cuda on this machine")
        return
    tag = f"localhost/ztrain-test:cuda-{os.getpid()}"
    name = f"ztrain-test-cuda-{os.getpid()}"
    c = None
    try:
        t = time.monotonic()
        log(f"build: docker/Dockerfile.cuda -> {tag} (toolkit {toolkit})")
        podman("build", "--format", "docker", "--build-arg", "JOBS=2",
               "--build-arg", "CUDA_ARCHITECTURES=90", "-v", f"{toolkit}:/usr/local/cuda:ro",
               "-f", os.path.join(SOURCE, "docker", "Dockerfile.cuda"), "-t", tag, SOURCE,
               timeout=3000)
        timings["cuda image build"] = time.monotonic() - t
        size_mb = json.loads(podman("image", "inspect", tag)[1])[0]["Size"] / 1e6
        log(f"build: the CUDA image is {size_mb:.0f} MB, built in "
            f"{timings['cuda image build']:.0f} s")
        # podman build -v leaves the mount point behind as an empty directory in each stage.
        _, out = podman("run", "--rm", "--entrypoint", "sh", tag, "-c",
                        "ldd /usr/local/lib/libztrain_cuda.so; echo ---; "
                        "find /usr/local/cuda -mindepth 1 2>/dev/null | head -3", check_rc=False)
        libs, _, toolkit_ls = out.partition("---")
        check("not found" not in libs, f"every library of the module resolves in the image:\n"
              f"{libs[-1500:]}")
        check(all(re.search(rf"{lib} => /usr/local/lib/ztrain-cuda/", libs)
                  for lib in ("libcudart.so.13", "libcublasLt.so.13", "libnccl.so.2")),
              "cudart, cuBLASLt and NCCL come from the image's /usr/local/lib/ztrain-cuda")
        check(not toolkit_ls.strip(), f"no toolkit in the image (nothing under /usr/local/cuda: "
              f"{toolkit_ls.strip()[:200]})")

        dirs = {k: os.path.join(tmp, "cuda-" + k) for k in ("state", "data", "runs", "jobs")}
        for d in dirs.values():
            os.makedirs(d)
        for k in ("state", "data", "runs"):
            os.chown(dirs[k], UID, UID)
        dirs["token"] = os.path.join(tmp, "cuda-token")
        with open(dirs["token"], "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(dirs["token"], 0o644)
        demo_job, _ = make_job_files(dirs["jobs"], dirs["data"])
        with open(demo_job) as f:
            job = json.load(f)
        job["train"].update(max_steps=20, eval_interval=10, checkpoint_interval=20)
        with open(demo_job, "w") as f:
            json.dump(job, f)
        cuda_job = os.path.join(dirs["jobs"], "cuda.json")
        with open(cuda_job, "w") as f:
            json.dump(dict(job, name="on-a-gpu", device="cuda"), f)
        grpc_port, http_port = free_ports(2)
        c = Container(tag, name, dirs, grpc_port, http_port)
        c.start()
        check(http_get(c.url + "/healthz")[0] == 200, "the CUDA image's ztraind starts and serves")
        job_id = c.cli("submit", demo_job)[1].strip()
        rc, _ = c.cli("watch", job_id, timeout=300, check_rc=False)
        j = c.job(job_id)
        check(rc == 0 and state(j) == "SUCCEEDED" and step(j) == 20,
              f"a CPU job in the CUDA image: {j.get('state')} at step {j.get('step')}")
        rc, out = c.cli("submit", cuda_job, check_rc=False)
        check(rc != 0 and 'device "cuda"' in out and "no GPUs to give" in out,
              f"a cuda job on this host without a GPU is refused at submit: {out.strip()[-300:]}")
        # A rank started as a launcher would (torchrun, srun) loads the module in the image and
        # says what is missing: the GPU, not the module.
        for f in ("cuda.json", "ds_config.json"):
            shutil.copy(os.path.join(dirs["jobs"], f), os.path.join(dirs["data"], f))
        rc, out = podman("exec", name, "ztrain-worker", "/data/cuda.json", "--out",
                         "/runs/cuda-rank", check_rc=False)
        check(rc != 0 and "no CUDA device is visible" in out and "cannot load" not in out,
              f"a cuda rank in the image loads the CUDA module and names the missing GPU: "
              f"{out.strip()[-400:]}")
        c.stop()
        timings["cuda image size MB"] = size_mb
    finally:
        if c:
            c.remove()
        if not KEEP:
            podman("rmi", "-f", tag, check_rc=False)


def main():
    timings = {}
    if os.geteuid() != 0:
        raise SystemExit("test_container: needs root (rootful podman, debootstrap, chown of the "
                         "volume directories to uid 10001)")
    os.environ["DEBIAN_FRONTEND"] = "noninteractive"
    out = run([os.path.join(SOURCE, "scripts", "install-deps.sh"), "container"], timeout=600)[1]
    log(out.strip().splitlines()[-1])
    if not os.access(os.path.join(BUILD, "ztrain"), os.X_OK):
        raise SystemExit(f"{BUILD}/ztrain is missing: build the project first (make build)")
    tmp = tempfile.mkdtemp(prefix="ztrain-container-")
    conf = os.path.join(tmp, "containers.conf")
    with open(conf, "w") as f:
        f.write(CONTAINERS_CONF)
    os.environ["CONTAINERS_CONF"] = conf
    tag = f"localhost/ztrain-test:cpu-{os.getpid()}"
    name = f"ztrain-test-{os.getpid()}"
    c = None
    images_before = set()
    try:
        t = time.monotonic()
        base_image()
        timings["base image"] = time.monotonic() - t

        # The image, the way a user builds it. podman keeps each step's layer, so the CUDA image
        # below takes the dependencies' layers of both stages from this build (its Dockerfile
        # starts as this one does); the finally clause removes every image the test made.
        images_before.update(image_ids())
        t = time.monotonic()
        log(f"build: docker/Dockerfile -> {tag}")
        podman("build", "--format", "docker", "--build-arg", "JOBS=2",
               "-f", os.path.join(SOURCE, "docker", "Dockerfile"), "-t", tag, SOURCE, timeout=600)
        timings["image build"] = time.monotonic() - t
        cfg = json.loads(podman("image", "inspect", tag)[1])[0]
        size_mb = cfg["Size"] / 1e6
        image_cfg = cfg["Config"]
        log(f"build: {size_mb:.0f} MB in {timings['image build']:.0f} s")
        user = image_cfg.get("User")
        check(user == "ztrain", f"the image runs as user ztrain ({user})")
        check(image_cfg.get("StopSignal") == "SIGTERM", "STOPSIGNAL SIGTERM")
        check("/usr/local/lib/ztrain/healthcheck" in json.dumps(cfg.get("Healthcheck")),
              "the image keeps its HEALTHCHECK (docker format)")
        check(set(image_cfg.get("ExposedPorts", {})) >= {"50051/tcp", "8080/tcp"},
              "EXPOSE 50051 8080")
        check(size_mb < 250, f"image size {size_mb:.0f} MB < 250 MB")

        dirs = {k: os.path.join(tmp, k) for k in ("state", "data", "runs", "jobs")}
        for d in dirs.values():
            os.makedirs(d)
        for k in ("state", "data", "runs"):
            os.chown(dirs[k], UID, UID)
        dirs["token"] = os.path.join(tmp, "token")
        with open(dirs["token"], "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(dirs["token"], 0o644)
        demo_job, long_job = make_job_files(dirs["jobs"], dirs["data"])
        grpc_port, http_port = free_ports(2)

        t = time.monotonic()
        c = Container(tag, name, dirs, grpc_port, http_port)
        ready = c.start()
        timings["first start"] = time.monotonic() - t
        log(f"run: {name} grpc 127.0.0.1:{grpc_port} http 127.0.0.1:{http_port}")
        check("grpc=0.0.0.0:50051" in ready and "auth=bearer" in ready,
              "ztraind listens on all interfaces in the container, with the mounted token")
        rc, out = podman("top", name, "user", "huser", "args")
        users = {line.split()[0] for line in out.splitlines()[1:] if line.strip()}
        check(users == {"ztrain"}, f"every process in the container runs as ztrain ({users})")
        check("/usr/bin/tini -- " in out and "/usr/local/bin/ztraind " in out,
              "tini is PID 1 and ztraind its child")
        check(c.healthy(), "podman healthcheck run: healthy")
        rc, _ = podman("exec", "-e", "ZTRAIN_HEALTH_PORT=1", name,
                       "/usr/local/lib/ztrain/healthcheck", check_rc=False)
        check(rc != 0, "and the same check fails where nothing answers")
        rc, out = run([os.path.join(BUILD, "ztrain"), "list", "--server", c.server],
                      check_rc=False, env={k: v for k, v in os.environ.items()
                                           if k != "ZTRAIN_TOKEN"})
        check(rc != 0 and "UNAUTHENTICATED" in out.upper(), "gRPC without the token is refused")
        check(http_get(c.url + "/api/v1/jobs")[0] == 401, "HTTP API without the token: 401")
        check(http_get(c.url + "/vendor/chart.js/chart.min.js")[0] == 200 and
              "ztrain" in http_get(c.url + "/")[1].lower(),
              "the dashboard and Debian's Chart.js are served")

        t = time.monotonic()
        job_id = c.cli("submit", demo_job)[1].strip()
        rc, out = c.cli("watch", job_id, timeout=300, check_rc=False)
        timings["job"] = time.monotonic() - t
        j = c.job(job_id)
        log(f"job: {job_id} {j.get('state')} step {j.get('step')} in {timings['job']:.1f} s")
        check(rc == 0 and state(j) == "SUCCEEDED" and step(j) == STEPS,
              f"{job_id} submitted from the host watched to SUCCEEDED at step {STEPS}")
        jsonl = os.path.join(dirs["runs"], job_id, "metrics.jsonl")
        http_series = loss_series(c, job_id)
        file_loss = jsonl_series(jsonl, "train/loss")
        check(len(file_loss) == STEPS // 10 and same_series(http_series.get("train/loss", []),
                                                            file_loss),
              f"HTTP train/loss equals the volume's metrics.jsonl ({len(file_loss)} points)")
        check(same_series(http_series.get("eval/loss", []), jsonl_series(jsonl, "eval/loss"))
              and len(http_series.get("eval/loss", [])) == 2, "and so does eval/loss")
        status, prom = http_get(c.url + "/metrics", TOKEN)
        check(status == 200 and re.search(r'ztrain_job_step\{[^}]*"%s"[^}]*\} %d\b' %
                                          (job_id, STEPS), prom) is not None,
              "Prometheus /metrics has the job's step")
        logs_before = c.cli("logs", job_id)[1]

        # SIGTERM while a job runs: ztraind cancels it with a checkpoint and exits 0.
        long_id = c.cli("submit", long_job)[1].strip()
        deadline = time.monotonic() + 60
        while step(c.job(long_id)) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        timings["stop"] = c.stop()
        exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", name)[1].strip()
        logs = c.logs()
        log(f"stop: podman stop took {timings['stop']:.1f} s, exit code {exit_code}")
        check(exit_code == "0" and "ztraind: stopped" in logs,
              "podman stop (SIGTERM): ztraind stopped gracefully with status 0")
        ckpt = os.path.join(dirs["runs"], "ckpt-stop")
        latest = open(os.path.join(ckpt, "latest")).read().strip() \
            if os.path.exists(os.path.join(ckpt, "latest")) else ""
        parts = sorted(os.listdir(os.path.join(ckpt, latest))) if latest else []
        check(os.path.exists(os.path.join(ckpt, latest or "-", "DONE")) and
              len([p for p in parts if p.startswith("optim_rank_")]) == 2,
              f"the running 2-rank job left a complete checkpoint ({latest or 'none'}: {parts})")

        # A new container on the same directories: the state is on the volume, not in the
        # container.
        c.remove()
        t = time.monotonic()
        c.start()
        timings["second start"] = time.monotonic() - t
        j2 = c.job(job_id)
        check(state(j2) == "SUCCEEDED" and step(j2) == STEPS,
              f"after the restart GetJob {job_id}: {j2.get('state')} step {j2.get('step')}")
        check(loss_series(c, job_id) == http_series, "the same metric history over HTTP")
        check(c.cli("logs", job_id)[1] == logs_before, "the same logs")
        jl = c.job(long_id)
        check(state(jl) == "CANCELLED",
              f"the job running at the stop is {jl.get('state')}: {jl.get('reason', '')}")
        listed = c.cli("list")[1]
        check(job_id in listed and long_id in listed, "ztrain list shows both jobs")
        rc, inside = podman("exec", name, "ztrain", "list", "--server", "127.0.0.1:50051",
                            "--token-file", "/run/secrets/ztrain_token", check_rc=False)
        check(rc == 0 and job_id in inside, "and so does the image's own ztrain, inside")
        check(c.healthy(), "healthy after the restart")
        c.stop()
        c.remove()
        c = None
        cuda_image(tmp, timings)
    finally:
        if c and not KEEP:
            c.remove()
        elif c:
            podman("stop", "-t", str(STOP_TIMEOUT), name, check_rc=False)
        if not KEEP:
            podman("rmi", "-f", tag, check_rc=False)
            remove_images_since(images_before)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept: image {tag}, container {name}, directories {tmp}")
    total = time.monotonic() - T0
    log("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()) +
        f"; total {total:.0f} s")
    if failed:
        raise SystemExit(f"{failed} check(s) failed")
    print("all checks passed")


if __name__ == "__main__":
    main()
