"""A Slurm cluster of two emulated nodes, n1 and n2, on this host, for tests: munged, slurmctld
and two slurmd's in the foreground as children of the test, with every file (munge key and
socket, slurm.conf, state, spool, logs, pid files) in one temporary directory, so /etc/slurm,
/etc/munge and /run are left alone. Slurm's programs find the configuration through SLURM_CONF,
which env() returns and start() also puts in os.environ for the test's own children (ztraind,
srun, scancel, squeue); the munge socket is named in slurm.conf (AuthInfo=socket=...).

    with Cluster(tmpdir) as c:          # start() on entry, stop() on exit, even after a failure
        subprocess.run(["srun", "-N2", "-n4", "hostname"], env=c.env())

Node n2 runs in a network namespace of its own, joined to this host's by a veth pair (n1 is this
host at the pair's root end, n2 the namespace's end; slurmctld listens on the root end), so the
two nodes are separate network hosts: their ranks cannot share one loopback and meet over TCP,
through the gloo transport. They still share the file system, the PID space and /dev/shm. The
pair's addresses and the namespace's name follow this process's pid, so parallel runs do not
collide; stop() deletes the namespace (and with it the pair).

The daemons get SIGTERM when the test process dies, even by SIGKILL (PR_SET_PDEATHSIG); stop()
also kills whatever else still runs with this cluster's SLURM_CONF (slurmstepd, tasks, a
ztraind the test started), so a failed test leaves nothing behind.

Needs root (slurmd runs tasks as any user, munged runs as the `munge` user), Debian's slurmctld,
slurmd, slurm-client and munge (scripts/install-deps.sh slurm). Known noise in slurmd's log:
"mpi/pmix_v4: ... can not load PMIx library" (the plugin is installed, libpmix is not)."""
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402

PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue",
            "sinfo", "scontrol", "setpriv", "nsenter", "ip")


def missing_programs():
    """The programs this cluster needs that are not installed."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in PROGRAMS if not shutil.which(p, path=path)]


def which(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def read_proc(pid, name):
    """The bytes of /proc/PID/NAME (OSError when the process is gone)."""
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def live_pids(wanted):
    """pids of the live (not zombie) processes, other than this one, for which wanted(pid) is
    true; a process that ends while it is looked at (OSError) is left out."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            if not wanted(p) or read_proc(p, "stat").rsplit(b")", 1)[1].split()[0] == b"Z":
                continue
        except OSError:
            continue
        found.append(int(p))
    return found


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_test():
    """In a daemon's child before exec: SIGTERM when the test process dies, so that a test killed
    by a timeout leaves no Slurm daemon behind either."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Cluster:
    NODES = ("n1", "n2")
    CPUS = 2          # per node: 2 tasks of one CPU each

    def __init__(self, tmpdir):
        pid = os.getpid()
        self.netns = f"ztslurm{pid}-n2"
        self.veth = f"zs{pid}"[:15]
        net = f"10.{200 + pid % 50}.{pid // 50 % 250}"
        # n1 is this host at the pair's root end; n2 the namespace's end.
        self.addr = {"n1": f"{net}.1", "n2": f"{net}.2"}
        self.dir = tmpdir
        os.chmod(tmpdir, 0o755)          # munged checks every directory up to its socket
        self.conf = os.path.join(tmpdir, "slurm.conf")
        self.munge_dir = os.path.join(tmpdir, "munge")
        self.munge_socket = os.path.join(self.munge_dir, "munge.socket")
        self.procs = {}                  # name -> Popen, in start order
        self.host = socket.gethostname().split(".")[0]

    def env(self):
        e = dict(os.environ)
        e["SLURM_CONF"] = self.conf
        return e

    def log(self, name):
        """The stdout/stderr of one daemon (munged, slurmctld, slurmd-n1, slurmd-n2)."""
        try:
            with open(os.path.join(self.dir, f"{name}.out"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _spawn(self, name, argv):
        out = open(os.path.join(self.dir, f"{name}.out"), "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env(),
                                            cwd=self.dir, preexec_fn=_die_with_test)
        out.close()

    def _start_munge(self):
        munge = pwd.getpwnam("munge")
        os.makedirs(self.munge_dir)
        os.chown(self.munge_dir, munge.pw_uid, munge.pw_gid)
        os.chmod(self.munge_dir, 0o755)
        as_munge = [which("setpriv"), f"--reuid={munge.pw_uid}", f"--regid={munge.pw_gid}",
                    "--init-groups"]
        key = os.path.join(self.munge_dir, "munge.key")
        subprocess.run(as_munge + [which("mungekey"), "--create", f"--keyfile={key}"],
                       check=True, capture_output=True)
        # setpriv drops the parent-death signal with the uid change; it sets it again after.
        self._spawn("munged", as_munge + ["--pdeathsig", "TERM", "--",
            which("munged"), "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--log-file={self.munge_dir}/munged.log", f"--pid-file={self.munge_dir}/munged.pid",
            f"--seed-file={self.munge_dir}/munged.seed"])
        self._wait(lambda: os.path.exists(self.munge_socket), 10, "munged's socket")

    def _make_netns(self):
        """n2's network namespace: the veth pair, addresses, and a default route to this host."""
        def ip(*args):
            subprocess.run(["ip", *args], check=True, capture_output=True, text=True)
        ip("netns", "add", self.netns)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("addr", "add", f"{self.addr['n1']}/30", "dev", self.veth)
        ip("link", "set", self.veth, "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        ip("-n", self.netns, "addr", "add", f"{self.addr['n2']}/30", "dev", "eth0")
        ip("-n", self.netns, "link", "set", "eth0", "up")
        ip("-n", self.netns, "route", "add", "default", "via", self.addr["n1"])

    def _remove_netns(self):
        for _ in range(50):
            r = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
            pids = [int(x) for x in r.stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)

    def _write_conf(self):
        d = self.dir
        for sub in ("state", "spool", "log", "run"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        lines = [
            "ClusterName=ztraintest",
            f"SlurmctldHost={self.host}({self.addr['n1']})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            # No cgroups: CI containers often have a read-only cgroupfs.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "ReturnToService=2", "MailProg=/bin/true",
            f"SlurmctldPort={free_port()}",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid", f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd-%n.log",
        ]
        for n in self.NODES:
            lines.append(f"NodeName={n} NodeHostname={self.host} NodeAddr={self.addr[n]} "
                         f"Port={free_port()} CPUs={self.CPUS} Sockets=1 "
                         f"CoresPerSocket={self.CPUS} ThreadsPerCore=1 RealMemory=1000 "
                         "State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.NODES)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _wait(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while not ready():
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for "
                                       f"{what}:\n{self.log(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {timeout} s")
            time.sleep(0.05)

    def node_states(self):
        r = subprocess.run([which("sinfo"), "-h", "-N", "-o", "%N %t"], env=self.env(),
                           capture_output=True, text=True)
        return dict(l.split() for l in r.stdout.splitlines() if len(l.split()) == 2)

    def start(self, timeout=30):
        """munged, slurmctld, the slurmd's; returns once both nodes are idle."""
        t0 = time.monotonic()
        self._start_munge()
        self._make_netns()
        self._write_conf()
        os.environ["SLURM_CONF"] = self.conf
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-i"])
        self._wait(lambda: subprocess.run([which("scontrol"), "ping"], env=self.env(),
                                          capture_output=True, text=True).stdout.find("UP") >= 0,
                   timeout, "slurmctld answering")
        for n in self.NODES:
            # nsenter, not `ip netns exec`: that one also mounts a fresh /sys, without the
            # cgroup file system slurmd looks for.
            netns = [which("nsenter"), f"--net=/run/netns/{self.netns}", "--"] if n == "n2" else []
            self._spawn(f"slurmd-{n}", netns + [which("slurmd"), "-D", "-N", n])
        self._wait(lambda: self.node_states() == {n: "idle" for n in self.NODES}, timeout,
                   "both nodes idle")
        self.start_s = time.monotonic() - t0
        return self

    def jobs(self, name=None):
        """squeue's lines (job id, name, state) for every job, or the jobs called name."""
        argv = [which("squeue"), "-h", "-o", "%i %j %T"]
        if name:
            argv.append(f"--name={name}")
        r = subprocess.run(argv, env=self.env(), capture_output=True, text=True)
        return r.stdout.split("\n")[:-1] if r.stdout else []

    def leftovers(self):
        """pids of live processes, other than this one, that run with this cluster's SLURM_CONF
        in their environment: whatever Slurm (slurmstepd, tasks) or the test (ztraind, srun)
        started for it."""
        mark = f"SLURM_CONF={self.conf}".encode()
        return live_pids(lambda p: mark in read_proc(p, "environ").split(b"\0"))

    def stop(self):
        """Every daemon, newest first: SIGTERM, then SIGKILL after 5 s; then SIGKILL to anything
        still running for this cluster (returned: what had to be killed)."""
        for name, p in reversed(list(self.procs.items())):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        killed = self.leftovers()
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self._remove_netns()
        if os.environ.get("SLURM_CONF") == self.conf:
            del os.environ["SLURM_CONF"]
        return killed

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
