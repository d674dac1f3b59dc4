"""The environment contract of examples/kubernetes/pytorchjob.yaml: ztrain-worker started the way
the Kubeflow training operator starts each pod of a PyTorchJob.

The manifest is read (PyYAML): its Master and Worker containers must be the same program with the
same arguments and environment, named "pytorch" (the operator finds the container by that name), and
the job in its ConfigMap must have world_size = Master + Worker replicas; every volume claim the
pods mount is a PersistentVolumeClaim of the manifest, ReadWriteMany where the pods write
(ReadOnlyMany or ReadWriteMany where they only read), and holds the job's paths. Then one process
per replica runs the container's command (tini dropped, paths moved into a temporary directory) with
exactly the environment such a pod has: the container's env, the operator's RANK, WORLD_SIZE,
MASTER_ADDR (<job>-master-0), MASTER_PORT (the pytorchjob-port) and PYTHONUNBUFFERED, what
Kubernetes itself adds (HOSTNAME, KUBERNETES_SERVICE_*), PATH and HOME (and this host's OPENBLAS_*
kernel choice, which the reference run also has); no LOCAL_RANK, LOCAL_WORLD_SIZE or ZTRAIN_RUN_ID.
The cluster's DNS resolves <job>-master-0 to the master pod; this host's cannot, so the pods'
MASTER_ADDR is that name only in a first start (with ZTRAIN_COMM_TIMEOUT_S=2), which must fail
after that timeout saying that it did not resolve, and "localhost" afterwards. Pods are separate
hosts, so the ranks must pick the gloo transport themselves (rank 0 says so) and train together over TCP, rank 0 alone reporting, to
exactly the losses of `ztrain run` on the same job (the launcher that sets the full torchrun
environment, over shared memory). A pod whose RANK is missing fails at once, naming it.

The model and step count are shrunk so that the case takes seconds; the environment is not."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
from svc import SOURCE, TEXT, Checker, read_metrics, tool  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
c = Checker()
MANIFEST = os.path.join(SOURCE, "examples", "kubernetes", "pytorchjob.yaml")


def load_manifest():
    with open(MANIFEST) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    job = next(d for d in docs if d["kind"] == "PyTorchJob")
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    return json.loads(config["data"]["job.json"]), job, claims


def container(spec):
    return spec["template"]["spec"]["containers"][0]


def contract_checks(job_spec, pj):
    replicas = pj["spec"]["pytorchReplicaSpecs"]
    master, worker = container(replicas["Master"]), container(replicas["Worker"])
    n = replicas["Master"]["replicas"] + replicas["Worker"]["replicas"]
    c.check(master["name"] == "pytorch" and worker["name"] == "pytorch",
            "manifest: both containers are named 'pytorch'")
    same = all(master.get(k) == worker.get(k) for k in ("image", "command", "args", "env"))
    c.check(same, "manifest: Master and Worker run the same image, command, args and env")
    c.check(job_spec["world_size"] == n, f"manifest: the job's world_size "
            f"{job_spec['world_size']} = Master + Worker replicas {n}")
    c.check(master["command"][-1] == "ztrain-worker" and master["image"] == "ztrain:latest",
            f"manifest: runs ztrain-worker from ztrain:latest ({master['command']})")
    port = next(p["containerPort"] for p in master["ports"] if p["name"] == "pytorchjob-port")
    return master, n, port


def volume_checks(job_spec, pj, claims):
    """Every claim a pod mounts is made by the manifest itself (kubectl apply of the file alone
    gives pods that can start), shared by pods on different nodes with the access mode that
    allows it (Kubernetes' PersistentVolume access modes), and holds the job's paths."""
    for role, replica in pj["spec"]["pytorchReplicaSpecs"].items():
        pod = replica["template"]["spec"]
        mounts = {m["name"]: m for m in container(replica)["volumeMounts"]}
        for v in pod["volumes"]:
            if "persistentVolumeClaim" not in v:
                continue
            name = v["persistentVolumeClaim"]["claimName"]
            claim = claims.get(name)
            c.check(claim is not None, f"manifest: {role}'s claim {name} is a "
                    f"PersistentVolumeClaim of the manifest ({sorted(claims)})")
            if claim is None:
                continue
            modes = set(claim["spec"]["accessModes"])
            read_only = mounts[v["name"]].get("readOnly", False)
            # Pods on several nodes: ReadWriteOnce binds the volume to one node.
            want = {"ReadWriteMany"} if not read_only else {"ReadOnlyMany", "ReadWriteMany"}
            c.check(bool(modes & want) and "storage" in claim["spec"]["resources"]["requests"],
                    f"manifest: {role}'s {'read-only' if read_only else 'written'} claim {name} "
                    f"has an access mode for pods on several nodes ({sorted(modes)}) and a size")
    pod_mounts = {m["mountPath"]: m["name"] for m in container(
        pj["spec"]["pytorchReplicaSpecs"]["Master"])["volumeMounts"]}
    paths = [job_spec["data"]["train"], job_spec["data"]["val"],
             job_spec["train"]["checkpoint_dir"]]
    on_claims = all(any(p.startswith(m + "/") for m in pod_mounts if pod_mounts[m] in
                        ("data", "runs")) for p in paths)
    c.check(on_claims, f"manifest: the job's data and checkpoint paths are on the claimed "
            f"volumes ({paths})")


def pod_env(master, name, rank, world, port):
    """What the process of replica `rank` sees in its pod."""
    env = {e["name"]: str(e["value"]) for e in master.get("env", [])}
    # Two cores here, not the four the manifest asks for per pod.
    env["OMP_NUM_THREADS"] = "1"
    # This host's OpenBLAS settings choose its kernels (and so the last bits of every sum), as an
    # image's own would: the reference run below has them too.
    env.update({k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")})
    env.update({
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/var/lib/ztrain",
        "HOSTNAME": f"{name}-{'master' if rank == 0 else 'worker'}-{max(rank - 1, 0)}",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
        # The training operator's variables, all of them.
        "MASTER_ADDR": f"{name}-master-0", "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world), "RANK": str(rank), "PYTHONUNBUFFERED": "1",
    })
    return env


def main():
    job_spec, pj, claims = load_manifest()
    master, world, port = contract_checks(job_spec, pj)
    volume_checks(job_spec, pj, claims)
    top = tempfile.mkdtemp(prefix="ztrain-worker-env-")
    try:
        data, runs = os.path.join(top, "data"), os.path.join(top, "runs")
        os.makedirs(data)
        os.makedirs(runs)
        for name in ("train.txt", "val.txt"):
            with open(os.path.join(data, name), "wb") as f:
                f.write(TEXT)
        # Paths under the pods' mount points move here; the model and the run shrink.
        text = json.dumps(job_spec).replace('"/data/', f'"{data}/').replace('"/runs/',
                                                                           f'"{runs}/')
        job = json.loads(text)
        job["model"].update(n_layer=1, n_head=2, n_embd=32, block_size=32)
        job["train"].update(max_steps=30, log_interval=1, eval_interval=10, eval_steps=2,
                            checkpoint_interval=0)
        job["deepspeed"].update(train_batch_size=4, train_micro_batch_size_per_gpu=2)
        job_dir = os.path.join(top, "etc-ztrain")
        os.makedirs(job_dir)
        job_path = os.path.join(job_dir, "job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)

        argv = [a.replace("/etc/ztrain/", job_dir + "/").replace("/runs/", runs + "/")
                for a in master["args"]]
        # The image runs the worker under tini; here the build's worker runs directly.
        cmd = [tool("ztrain-worker")] + argv
        pj_name = pj["metadata"]["name"]
        # Rank 0 serves the rendezvous at the port: a port of this test's own keeps it apart
        # from concurrent tests.
        port = 20000 + os.getpid() % 10000
        # As PyTorch does, the name is asked for again until the rendezvous timeout (a pod's
        # DNS name may appear after the pod that looks it up starts): a short one here.
        p = subprocess.run(cmd, env=dict(pod_env(master, pj_name, 1, world, port),
                                         ZTRAIN_COMM_TIMEOUT_S="2"),
                           capture_output=True, text=True, timeout=60, cwd=top)
        c.check(p.returncode == 1 and f"MASTER_ADDR '{pj_name}-master-0' did not resolve "
                "within 2 s" in p.stderr, f"a pod whose MASTER_ADDR never resolves fails "
                f"saying so after the timeout: {p.stderr.strip()}")
        procs = []
        for r in range(world):
            out = open(os.path.join(top, f"rank{r}.out"), "wb")
            err = open(os.path.join(top, f"rank{r}.err"), "wb")
            env = dict(pod_env(master, pj_name, r, world, port), MASTER_ADDR="localhost")
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, cwd=top, env=env))
            out.close()
            err.close()
        rcs = []
        try:
            for p in procs:
                rcs.append(p.wait(timeout=120))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outs = [open(os.path.join(top, f"rank{r}.out")).read() for r in range(world)]
        errs = [open(os.path.join(top, f"rank{r}.err")).read() for r in range(world)]
        c.check(rcs == [0] * world,
                f"pods: every rank exited 0 ({rcs}; {[e.strip() for e in errs]})")
        c.check("done: 30 steps" in outs[0] and all(o == "" for o in outs[1:]),
                "pods: rank 0 alone reports progress")
        c.check("comm transport gloo" in errs[0],
                f"pods: rank 0 picked the gloo transport ({errs[0].strip()[:200]})")
        out_dir = argv[argv.index("--out") + 1]
        pods = read_metrics(os.path.join(out_dir, "metrics.jsonl")) if rcs == [0] * world else []

        # The same job (but its own checkpoint directory: the pods' final checkpoint would be
        # resumed) under `ztrain run`.
        ref_dir = os.path.join(top, "ref")
        ref_job = os.path.join(job_dir, "ref.json")
        job["train"]["checkpoint_dir"] = os.path.join(ref_dir, "ckpt")
        with open(ref_job, "w") as f:
            json.dump(job, f)
        r = subprocess.run([tool("ztrain"), "run", ref_job, "--out", ref_dir, "--threads", "1"],
                           capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items()
                                if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                             "MASTER_PORT", "ZTRAIN_RUN_ID")})
        c.check(r.returncode == 0,
                f"ztrain run of the same job exited 0 ({r.stderr.strip()[-300:]})")
        ref = read_metrics(os.path.join(ref_dir, "metrics.jsonl")) if r.returncode == 0 else []

        def series(recs, key):
            return [(x["train/global_step"], x[key]) for x in recs if key in x]
        got, want = series(pods, "train/loss"), series(ref, "train/loss")
        c.check(len(got) == 30 and got == want,
                f"pods: 30 losses equal ztrain run's exactly (last {got[-1:]} vs {want[-1:]})")
        got, want = series(pods, "eval/loss"), series(ref, "eval/loss")
        c.check(len(got) >= 3 and got == want, f"pods: eval losses equal too ({got} vs {want})")
        leftover = [n for n in os.listdir("/dev/shm") if n.endswith(f"port{port}")]
        c.check(not leftover, f"pods: no shared-memory segment left ({leftover})")

        # A pod spec that lost RANK (say, an operator that is not Kubeflow's): a clear error.
        env = pod_env(master, pj_name, 1, world, port)
        del env["RANK"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30, cwd=top)
        c.check(p.returncode == 1 and "WORLD_SIZE is set but RANK is not" in p.stderr,
                f"a pod without RANK fails naming it: {p.stderr.strip()}")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    c.done()


if __name__ == "__main__":
    main()
