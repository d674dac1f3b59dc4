"""ztraind's Slurm launcher on a real Slurm 22.05 cluster of two emulated nodes (n1, n2) on this
host, n2 in a network namespace of its own (cluster.py), driven over gRPC and HTTP as the service tests drive the local launcher:

  a. a 2-node, 4-rank job through `ztraind --launcher slurm` succeeds; ranks 0-1 run on n1 and
     2-3 on n2 (each rank says where, and the job's ranks carry those pids); its log has lines of
     ranks 0-3 and its metrics arrive over the per-job TCP endpoint; n2 being a network namespace
     of its own, the ranks use the gloo transport (the job's record and rank 0's log say so,
     rendezvous at n1's address, which `scontrol show node` gives); its losses equal, exactly,
     those of the same job on a second ztraind with the local launcher (shared memory);
  b. examples/slurm/ztrain.sbatch runs the same job with sbatch (no ztraind), same losses;
  c. a graceful cancel of a running job: CANCELLED with a checkpoint (DONE), every rank exited
     130, no Slurm job and no ztrain-worker left; before it, while the job runs: every rank's
     environment holds the same rendezvous secret (32 hex digits, ZTRAIN_RDZV_SECRET, fresh per
     job as under the local launcher), and rank 0's store at the address and port its log names
     drops a client that does not send it (a GET of "world" alone, or AUTH with another secret)
     and answers one that does;
  d. SIGKILL to one task (rank 2, on n2, by the pid it reported): FAILED naming the rank, the
     node and the signal, nothing left;
  e. `scancel` from outside ztraind: CANCELLED, the reason says Slurm cancelled it, checkpoint;
  f. a job Slurm cannot place (3 nodes on a 2-node partition) waits STARTING with Slurm's reason
     and can be cancelled while pending;
  g. ztraind killed with SIGKILL: its srun follows (setpriv --pdeathsig), nothing is left in
     Slurm, and the restarted daemon marks the job FAILED;
  i. ztraind stopped with SIGTERM: the running Slurm job is cancelled with a checkpoint first;
  h. a local-launcher ztraind refuses nodes > 1 with INVALID_ARGUMENT.

Every daemon it starts is stopped at the end, also when a check or the setup fails.

    /usr/bin/python3 tests/slurm/test_slurm.py [BUILD_DIR]     (root; `make test-slurm`)"""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
if len(sys.argv) > 1:
    os.environ["ZTRAIN_BUILD"] = os.path.abspath(sys.argv[1])
from api_view import view  # noqa: E402
from svc import (BUILD, SOURCE, Checker, Daemon, get_job, read_metrics, spec_proto,  # noqa: E402
                 state_name, stubs, temp_dir, tiny_job, wait_state, wait_step, write_data)
from cluster import Cluster, live_pids, missing_programs, read_proc  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
c = Checker()
pb = stubs()[0]
WORKER = os.path.join(BUILD, "ztrain-worker")
T0 = time.monotonic()


class TiedDaemon(Daemon):
    """A Daemon that gets SIGTERM when this test dies, even by SIGKILL (setpriv --pdeathsig):
    it then cancels its jobs and exits, and its sruns follow it."""

    def args(self):
        return ["setpriv", "--pdeathsig", "TERM", "--"] + super().args()


def on_signal(sig, frame):
    raise SystemExit(f"stopped by signal {sig}")


def elapsed():
    return f"{time.monotonic() - T0:.1f} s"


def http_json(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=10) as r:
        return view(path, json.loads(r.read()))


def losses(d, job_id):
    r = d.stub().GetMetrics(pb.GetMetricsRequest(id=job_id, keys=["train/loss"]),
                            metadata=d.metadata, timeout=10)
    return dict(zip(r.series[0].steps, r.series[0].values)) if r.series else {}


def submit_spec(d, job, nodes=0):
    spec = spec_proto(job)
    spec.nodes = nodes
    return d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)


def cancel(d, job_id, force=False):
    return d.stub().CancelJob(pb.CancelJobRequest(id=job_id, force=force, grace_seconds=30),
                              metadata=d.metadata, timeout=30)


def slurm_name(d, job_id):
    """The Slurm job name ztraind gave the job (its log says it)."""
    for l in http_json(d, f"/api/v1/jobs/{job_id}/logs?tail=1000")["lines"]:
        if "as Slurm job " in l["text"]:
            return l["text"].split("as Slurm job ")[1].split()[0].rstrip(",")
    return None


def workers_of(run_dir):
    """pids of live ztrain-worker processes working for run_dir (read from /proc)."""
    def is_worker(p):
        argv = read_proc(p, "cmdline").split(b"\0")
        return argv[0].endswith(b"ztrain-worker") and any(run_dir.encode() in a for a in argv)
    return live_pids(is_worker)


def nothing_left(cluster, d, job_id, run_dir, timeout=15):
    """Waits until Slurm has no job of this name and no worker of the run is alive; returns what
    is still there after timeout."""
    name = slurm_name(d, job_id)
    deadline = time.monotonic() + timeout
    while True:
        left = (cluster.jobs(name) if name else ["(no Slurm name in the log)"]) + \
            [f"ztrain-worker pid {p}" for p in workers_of(run_dir)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def job_log(d, job_id):
    return http_json(d, f"/api/v1/jobs/{job_id}/logs?tail=2000")["lines"]


def case_two_nodes(cluster, sd, ld):
    job = tiny_job(sd.data_root, name="two-nodes", world_size=4, max_steps=20)
    j = submit_spec(sd, job, nodes=2)
    j = wait_state(sd, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    c.check(state_name(j.state) == "SUCCEEDED",
            f"a: 2-node 4-rank job SUCCEEDED under Slurm ({state_name(j.state)} {j.reason!r}) "
            f"at {elapsed()}")
    c.check(j.spec.nodes == 2 and j.spec.world_size == 4, "a: the job's spec keeps nodes 2")
    lines = job_log(sd, j.id)
    ranks = {l["rank"] for l in lines}
    c.check({0, 1, 2, 3} <= ranks, f"a: the log has lines of ranks 0-3 (ranks {sorted(ranks)})")
    placed = {}
    for l in lines:
        if l["rank"] == -1 and " runs on " in l["text"]:
            r, rest = l["text"].removeprefix("rank ").split(" runs on ")
            placed[int(r)] = rest.split()[0]
    c.check(placed == {0: "n1", 1: "n1", 2: "n2", 3: "n2"},
            f"a: ranks 0-1 ran on n1 and 2-3 on n2: {placed}")
    c.check(all(r.pid > 0 and not r.running and r.exit_code == 0 for r in j.ranks),
            f"a: every rank has its pid and exited 0: "
            f"{[(r.pid, r.exit_code, r.signal) for r in j.ranks]}")
    c.check(any(l["rank"] == 0 and l["text"].startswith("done: 20 steps") for l in lines),
            "a: rank 0's final line is in the log")
    # n2 is a network namespace of its own: the ranks meet over TCP, and say so.
    chose = [l["text"] for l in lines if l["rank"] == 0 and "comm transport" in l["text"]]
    c.check(j.comm == "gloo" and chose and chose[0].startswith("ztrain-worker: comm transport "
            f"gloo") and cluster.addr["n1"] in chose[0],
            f"a: the job records the gloo transport ({j.comm!r}) and rank 0 logged it with "
            f"n1's address: {chose[:1]}")
    slurm_loss = losses(sd, j.id)
    c.check(len(slurm_loss) == 20, f"a: 20 loss records reached ztraind over TCP "
            f"({len(slurm_loss)})")

    local = submit_spec(ld, tiny_job(ld.data_root, name="two-nodes", world_size=4, max_steps=20))
    local = wait_state(ld, local.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    c.check(state_name(local.state) == "SUCCEEDED", f"a: the same job on the local launcher "
            f"SUCCEEDED ({local.reason!r})")
    local_loss = losses(ld, local.id)
    diff = max((abs(slurm_loss[s] - local_loss.get(s, float("nan"))) for s in slurm_loss),
               default=float("nan"))
    c.check(slurm_loss == local_loss and len(local_loss) == 20,
            f"a: losses equal the local run's exactly (max |diff| {diff:.3g}; step 20: "
            f"{slurm_loss.get(20)} vs {local_loss.get(20)})")
    c.check(not nothing_left(cluster, sd, j.id, j.run_dir), "a: nothing left in Slurm")
    return job, local_loss


def case_sbatch(cluster, job, local_loss):
    d = temp_dir("ztrain-slurm-sbatch-")
    write_data(d)
    job = dict(job, name="sbatch")
    with open(os.path.join(d, "job.json"), "w") as f:
        json.dump(job, f)
    env = cluster.env()
    env["ZTRAIN_WORKER"] = WORKER
    t = time.monotonic()
    # sbatch --wait polls every 10 s or so; scontrol answers at once.
    r = subprocess.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=2", f"--chdir={d}",
                        f"--output={d}/slurm-%j.out",
                        os.path.join(SOURCE, "examples", "slurm", "ztrain.sbatch"), "job.json",
                        "out"], env=env, capture_output=True, text=True, timeout=60)
    batch_id = r.stdout.strip().split(";")[0]
    state, exit_code = "?", "?"
    deadline = time.monotonic() + 180
    while r.returncode == 0 and time.monotonic() < deadline:
        show = subprocess.run(["scontrol", "show", "job", batch_id], env=env, capture_output=True,
                              text=True).stdout
        fields = dict(w.split("=", 1) for w in show.split() if "=" in w)
        state, exit_code = fields.get("JobState", "?"), fields.get("ExitCode", "?")
        if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            break
        time.sleep(0.2)
    out = "".join(open(os.path.join(d, f)).read() for f in os.listdir(d) if f.startswith("slurm-"))
    ok = state == "COMPLETED" and exit_code == "0:0"
    c.check(ok, f"b: sbatch -N2 --ntasks-per-node=2 examples/slurm/ztrain.sbatch: job {batch_id} "
            f"{state} {exit_code} in {time.monotonic() - t:.1f} s"
            + ("" if ok else f" ({r.stderr.strip()}; output: {out[-600:]!r})"))
    recs = read_metrics(os.path.join(d, "out", "metrics.jsonl")) if ok else []
    got = {int(x["train/global_step"]): x["train/loss"] for x in recs if "train/loss" in x}
    c.check(len(got) == 20 and all(abs(got[s] - local_loss[s]) <= 1e-6 * abs(local_loss[s])
                                   for s in got),
            f"b: its 20 losses equal the local run's (step 20: {got.get(20)} vs "
            f"{local_loss.get(20)})")
    c.check("0: done: 20 steps" in out, "b: the output file has rank 0's labelled final line")


def long_job(sd, name):
    # Long enough to be cancelled, bounded (about two minutes here) should a killed test leave
    # its ranks behind.
    return submit_spec(sd, tiny_job(sd.data_root, name=name, world_size=4, max_steps=100_000,
                                    log_interval=5), nodes=2)


def running(sd, job_id):
    j = wait_step(sd, job_id, 10, timeout=120)
    ok = c.check(state_name(j.state) == "RUNNING" and all(r.pid > 0 for r in j.ranks),
                 f"{j.name}: RUNNING at step {j.step} with every rank placed "
                 f"({state_name(j.state)} {j.reason!r})")
    return j if ok else None


def store_ask(host, port, secret):
    """The status byte of rank 0's store's reply to a GET of "world" (after AUTH with secret when
    there is one), or None when the store closed the connection instead. The frames are
    engine/comm/tcp_store.h's: op, key length (4 bytes), key, an 8-byte argument, big-endian."""
    def frame(op, key):
        return struct.pack(">BI", op, len(key)) + key + struct.pack(">Q", 0)

    def reply(s):
        head = b""
        while len(head) < 9:
            got = s.recv(9 - len(head))
            if not got:
                return None
            head += got
        status, n = struct.unpack(">BQ", head)
        while n > 0:
            got = s.recv(min(n, 4096))
            if not got:
                return None
            n -= len(got)
        return status

    try:
        with socket.create_connection((host, port), timeout=10) as s:
            if secret is not None:
                s.sendall(frame(4, secret.encode()))
                if reply(s) != 0:
                    return None
            s.sendall(frame(2, b"world"))
            return reply(s)
    except (ConnectionResetError, BrokenPipeError):
        return None


def check_rdzv_secret(sd, j):
    secrets = set()
    for r in j.ranks:
        env = dict(e.split(b"=", 1) for e in read_proc(r.pid, "environ").split(b"\0") if b"=" in e)
        secrets.add(env.get(b"ZTRAIN_RDZV_SECRET", b"").decode())
    secret = next(iter(secrets))
    c.check(len(secrets) == 1 and re.fullmatch("[0-9a-f]{32}", secret),
            f"c: the {len(j.ranks)} ranks share one rendezvous secret of 32 hex digits "
            f"({len(secrets)} distinct, {len(secret)} characters)")
    said = [l["text"] for l in job_log(sd, j.id) if l["rank"] == 0 and "rendezvous at " in l["text"]]
    if not c.check(said, "c: rank 0 logs where its rendezvous store is"):
        return
    host, port = said[0].rsplit("rendezvous at ", 1)[1].strip().rsplit(":", 1)
    bare, wrong, right = (store_ask(host, int(port), x) for x in (None, "0" * 32, secret))
    c.check(bare is None and wrong is None and right == 0,
            f"c: rank 0's store at {host}:{port} drops a client without the secret ({bare}) or "
            f"with another ({wrong}), and answers the job's (status {right})")


def case_cancel(cluster, sd):
    j = running(sd, long_job(sd, "c-cancel").id)
    if not j:
        return
    check_rdzv_secret(sd, j)
    t = time.monotonic()
    cancel(sd, j.id)
    j = wait_state(sd, j.id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
    took = time.monotonic() - t
    c.check(state_name(j.state) == "CANCELLED" and "checkpoint" in j.reason,
            f"c: graceful cancel -> CANCELLED in {took:.1f} s: {j.reason!r}")
    c.check(all(r.exit_code == 130 and r.signal == 0 for r in j.ranks),
            f"c: every rank stopped with 130: {[(r.exit_code, r.signal) for r in j.ranks]}")
    latest = open(os.path.join(j.checkpoint_dir, "latest")).read().strip() \
        if os.path.exists(os.path.join(j.checkpoint_dir, "latest")) else ""
    c.check(latest and os.path.exists(os.path.join(j.checkpoint_dir, latest, "DONE")),
            f"c: the checkpoint {latest!r} is complete (DONE)")
    left = nothing_left(cluster, sd, j.id, j.run_dir)
    c.check(not left, f"c: no Slurm job and no ztrain-worker left: {left}")


def case_killed_rank(cluster, sd):
    j = running(sd, long_job(sd, "d-kill").id)
    if not j:
        return
    t = time.monotonic()
    os.kill(j.ranks[2].pid, signal.SIGKILL)
    j = wait_state(sd, j.id, {"FAILED", "CANCELLED", "SUCCEEDED"}, timeout=60)
    took = time.monotonic() - t
    c.check(state_name(j.state) == "FAILED", f"d: SIGKILL of rank 2 -> FAILED in {took:.1f} s "
            f"({state_name(j.state)})")
    c.check(j.reason.startswith("rank 2 on n2") and "signal 9 (SIGKILL)" in j.reason,
            f"d: the reason names the rank, the node and the signal: {j.reason!r}")
    c.check(j.ranks[2].signal == 9, "d: rank 2 recorded as killed by signal 9")
    left = nothing_left(cluster, sd, j.id, j.run_dir)
    c.check(not left, f"d: nothing left: {left}")


def case_outside_scancel(cluster, sd):
    j = running(sd, long_job(sd, "e-scancel").id)
    if not j:
        return
    name = slurm_name(sd, j.id)
    subprocess.run(["scancel", f"--name={name}"], env=cluster.env(), check=True)
    j = wait_state(sd, j.id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
    c.check(state_name(j.state) == "CANCELLED" and "cancelled from outside ztraind" in j.reason
            and "checkpoint" in j.reason,
            f"e: scancel from outside -> CANCELLED, said so, with a checkpoint: {j.reason!r}")
    left = nothing_left(cluster, sd, j.id, j.run_dir)
    c.check(not left, f"e: nothing left: {left}")


def case_unplaceable(cluster, sd):
    j = submit_spec(sd, tiny_job(sd.data_root, name="f-three", world_size=3, max_steps=5),
                    nodes=3)
    deadline = time.monotonic() + 30
    while "waiting in Slurm's queue" not in j.reason and time.monotonic() < deadline:
        time.sleep(0.1)
        j = get_job(sd, j.id)
    c.check(state_name(j.state) == "STARTING" and "waiting in Slurm's queue" in j.reason,
            f"f: 3 nodes of 2: STARTING, reason {j.reason!r}")
    cancel(sd, j.id)
    j = wait_state(sd, j.id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=30)
    c.check(state_name(j.state) == "CANCELLED" and "before Slurm started" in j.reason,
            f"f: cancelled while pending: {state_name(j.state)} {j.reason!r}")
    left = nothing_left(cluster, sd, j.id, j.run_dir)
    c.check(not left, f"f: nothing left: {left}")


def case_daemon_killed(cluster, sd):
    j = running(sd, long_job(sd, "g-orphan").id)
    if not j:
        return
    name = slurm_name(sd, j.id)
    sd.kill()      # SIGKILL, and a fresh gRPC channel for the restarted daemon
    deadline = time.monotonic() + 15
    while (cluster.jobs(name) or workers_of(j.run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    c.check(not cluster.jobs(name) and not workers_of(j.run_dir),
            f"g: ztraind SIGKILLed: its srun, Slurm job and ranks are gone "
            f"({cluster.jobs(name)}, {workers_of(j.run_dir)})")
    sd.start()
    j = get_job(sd, j.id)
    c.check(state_name(j.state) == "FAILED" and "restarted" in j.reason,
            f"g: the restarted daemon marks it FAILED: {j.reason!r}")
    c.check(any("scancel --name=" in l["text"] for l in job_log(sd, j.id)),
            "g: and cancelled what could be left of it in Slurm")


def case_daemon_stopped(cluster, sd):
    j = running(sd, long_job(sd, "i-sigterm").id)
    if not j:
        return
    name = slurm_name(sd, j.id)
    t = time.monotonic()
    rc = sd.stop()
    took = time.monotonic() - t
    c.check(rc == 0, f"i: ztraind stopped with SIGTERM while a Slurm job runs: exit {rc} in "
            f"{took:.1f} s")
    left = cluster.jobs(name) + [f"ztrain-worker pid {p}" for p in workers_of(j.run_dir)]
    c.check(not left, f"i: nothing left once it has exited: {left}")
    sd.start()
    j = get_job(sd, j.id)
    c.check(state_name(j.state) == "CANCELLED" and "stopped with a checkpoint" in j.reason,
            f"i: the job was cancelled with a checkpoint: {state_name(j.state)} {j.reason!r}")


def case_local_refuses_nodes(ld):
    import grpc
    try:
        submit_spec(ld, tiny_job(ld.data_root, name="h", world_size=2, max_steps=5), nodes=2)
        c.check(False, "h: the local launcher took a 2-node job")
    except grpc.RpcError as e:
        # A valid spec this server cannot run: FAILED_PRECONDITION, as admission answers it.
        c.check(e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                "--launcher slurm" in e.details(),
                f"h: local launcher: nodes 2 -> {e.code().name}: {e.details()}")


def main():
    missing = missing_programs()
    if missing:
        raise SystemExit(f"missing {missing}: run scripts/install-deps.sh slurm")
    if os.geteuid() != 0:
        raise SystemExit("the Slurm test runs slurmd and munged, which needs root")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)     # so that the cleanup below runs
    cluster = Cluster(temp_dir("ztrain-slurm-cluster-"))
    daemons = []
    try:
        cluster.start()
        print(f"cluster: n1, n2 idle after {cluster.start_s:.2f} s", flush=True)
        sd = TiedDaemon(BUILD, temp_dir("ztrain-slurm-d-"), max_ranks=8, grace=30,
                    extra_args=["--launcher", "slurm", "--slurm-partition", "debug"])
        daemons.append(sd)
        ld = TiedDaemon(BUILD, temp_dir("ztrain-slurm-local-"), max_ranks=4)
        daemons.append(ld)
        job, local_loss = case_two_nodes(cluster, sd, ld)
        case_sbatch(cluster, job, local_loss)
        case_local_refuses_nodes(ld)
        ld.stop()
        case_cancel(cluster, sd)
        case_killed_rank(cluster, sd)
        case_outside_scancel(cluster, sd)
        case_unplaceable(cluster, sd)
        case_daemon_killed(cluster, sd)
        case_daemon_stopped(cluster, sd)
        c.check(not cluster.jobs(), f"nothing of any job is left in Slurm: {cluster.jobs()}")
        print(f"done in {elapsed()}")
    finally:
        for d in daemons:
            d.stop()
        for d in daemons:
            c.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind "
                    f"{d.sanitizer_errors()}")
        left = cluster.jobs() if cluster.procs else []
        if left:
            subprocess.run(["scancel", "--full"] + [l.split()[0] for l in left],
                           env=cluster.env())
        killed = cluster.stop()
        c.check(not killed, f"nothing had to be killed at the end: {killed}")
    c.done()


if __name__ == "__main__":
    main()
