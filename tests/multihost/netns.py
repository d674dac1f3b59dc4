"""Emulated hosts on this machine: network namespaces joined through a switch (a bridge in a
namespace of its own), each host with its own address, routes and loopback, so that processes
in two "hosts" talk over TCP through veth links as processes on two machines would (they still
share the file system, the PID space and /dev/shm).

    with Hosts(2) as hosts:        # root; names carry this process's pid, so runs never collide
        hosts.addr[0]              # "10.77.0.1"
        hosts.popen(0, [...])      # a process on host 0
        hosts.cut(1)               # host 1's link goes down; hosts.mend(1) brings it back
        hosts.kill(1)              # SIGKILL to every process of host 1

Everything is removed on exit, also after a failure or a signal (the caller turns SIGTERM into
SystemExit); namespaces left by an earlier run that died by SIGKILL are removed at the next."""
import os
import re
import signal
import subprocess
import time

PREFIX = "ztmh"
SUBNET = "10.77.0"


def ip(*args, check=True):
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def ns_pids(ns):
    return [int(x) for x in ip("netns", "pids", ns, check=False).split()]


def remove_ns(ns):
    """Kills what runs in the namespace, then deletes it (its veth ends go with it)."""
    for _ in range(50):
        pids = ns_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    ip("netns", "del", ns, check=False)


def sweep_stale():
    """Removes namespaces of earlier runs whose process is gone (killed before cleaning up)."""
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(PREFIX + r"(\d+)-\w+", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            remove_ns(name)


class Hosts:
    def __init__(self, n):
        self.n = n
        self.tag = f"{PREFIX}{os.getpid()}"
        self.sw = f"{self.tag}-sw"
        self.ns = [f"{self.tag}-h{i}" for i in range(n)]
        self.addr = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self.procs = []

    def __enter__(self):
        if os.geteuid() != 0:
            raise SystemExit("this test needs root (ip netns)")
        sweep_stale()
        try:
            ip("netns", "add", self.sw)
            ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
            ip("-n", self.sw, "link", "set", "br0", "up")
            for i, ns in enumerate(self.ns):
                ip("netns", "add", ns)
                ip("-n", ns, "link", "set", "lo", "up")
                # Both ends are made inside their namespaces, so no name is ever taken in the
                # root namespace, where parallel runs would collide.
                ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}",
                   "netns", self.sw)
                ip("-n", self.sw, "link", "set", f"p{i}", "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{self.addr[i]}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in self.ns + [self.sw]:
            remove_ns(ns)
        return False

    def popen(self, i, args, env=None, **kw):
        """Starts args on host i (the process is the program itself: ip netns exec execs it)."""
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[i], *args], env=env, **kw)
        self.procs.append(p)
        return p

    def cut(self, i):
        ip("-n", self.ns[i], "link", "set", "eth0", "down")

    def mend(self, i):
        ip("-n", self.ns[i], "link", "set", "eth0", "up")

    def kill(self, i):
        for pid in ns_pids(self.ns[i]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
