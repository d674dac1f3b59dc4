"""ztraind's gRPC port under connection floods and file-descriptor exhaustion (issue 19, defect 6).

Each daemon runs under `prlimit --nofile=SOFT:HARD`; the flood is idle TCP connections that never
speak HTTP/2; the judge is a real grpcio Health/Check on a fresh channel.

  a. Soft limit 256 under a higher hard limit: ztraind raises its soft limit to the hard one (read
     from /proc/PID/limits), then holds more idle connections than 256 descriptors could while
     calls still succeed.
  b. soft = hard = 256, default bound: of 400 idle connections ztraind keeps fewer than it has
     descriptors and closes the rest at once; once they are gone a call succeeds within seconds.
     (Before the fix gRPC's listener died at the first EMFILE and every later call hung.)
  c. soft = hard = 256 with a bound above it: descriptors run out for real; once the idle
     connections close, a call succeeds within seconds and /healthz answers.
  d. Timeouts free slots: with the bound full of idle connections a new client is refused; the
     header timeout closes connections that never start HTTP/2, the idle timeout those that
     did and make no call, and then calls succeed without the flood ever closing anything."""
import os
import resource
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, Checker, Daemon, stubs, temp_dir  # noqa: E402

import grpc  # noqa: E402

pb, rpc, hpb, hrpc = stubs()
ck = Checker()

# This process holds the flood's sockets: let it use every descriptor it may.
_soft, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (HARD, HARD))


class LimitedDaemon(Daemon):
    """A Daemon started under prlimit's open-file limits."""

    def __init__(self, tmp, soft, hard, extra_args=()):
        self.nofile = f"--nofile={soft}:{hard}"
        super().__init__(BUILD, tmp, extra_args=extra_args)

    def args(self):
        return ["prlimit", self.nofile, "--"] + super().args()


def nofile_limits(pid):
    """(soft, hard) "Max open files" of a process, from /proc."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise RuntimeError("no 'Max open files' in /proc/PID/limits")


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def flood(port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        socks.append(s)
    return socks


def closed_by_server(s):
    """Whether the server has closed the connection (whatever it sent before is read away)."""
    try:
        while True:
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def wait_closed(socks, timeout):
    """How many of socks the server closes within timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        n = sum(closed_by_server(s) for s in socks)
        if n == len(socks) or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def close_all(socks):
    for s in socks:
        s.close()


def health_call(d, timeout):
    """(ok, seconds) of one Health/Check on a new channel that waits for the server."""
    t0 = time.monotonic()
    with grpc.insecure_channel(d.grpc_addr) as ch:
        try:
            r = hrpc.HealthStub(ch).Check(hpb.HealthCheckRequest(), timeout=timeout,
                                          wait_for_ready=True)
            return r.status == hpb.HealthCheckResponse.SERVING, time.monotonic() - t0
        except grpc.RpcError as e:
            print(f"      Health/Check: {e.code()} {e.details()}")
            return False, time.monotonic() - t0


def healthz(d):
    try:
        with urllib.request.urlopen(d.http_url + "/healthz", timeout=10) as r:
            return r.status == 200
    except OSError as e:
        print(f"      /healthz: {e}")
        return False


def check_clean_stop(d, part):
    ck.check(d.stop() == 0, f"{part}: ztraind stops cleanly")
    errs = d.sanitizer_errors()
    ck.check(not errs, f"{part}: no sanitizer reports" + "".join("\n      " + e for e in errs))


# ---- a. the soft limit is raised ----------------------------------------------------------

if HARD < 1024:
    print(f"skip  a: the hard open-file limit here is {HARD}, too low to raise 256 past 400")
else:
    with LimitedDaemon(temp_dir("ztrain-conn-a-"), 256, HARD,
                       ("--max-grpc-connections", "1000")) as d:
        soft, hard = nofile_limits(d.proc.pid)
        ck.check(soft == hard == HARD, f"a: soft open-file limit raised from 256 to the hard "
                                       f"{HARD} (now {soft}:{hard})")
        socks = flood(d.grpc_port, 400)
        time.sleep(0.5)
        held = sum(not closed_by_server(s) for s in socks)
        fds = open_fds(d.proc.pid)
        ok, dt = health_call(d, 10)
        ck.check(held == 400 and fds > 400 and ok,
                 f"a: 400 idle connections held ({held} open, ztraind has {fds} fds, more than "
                 f"256) and a call still succeeds ({dt:.2f} s)")
        close_all(socks)

# ---- b. the default bound keeps descriptors in hand -------------------------------------------

with LimitedDaemon(temp_dir("ztrain-conn-b-"), 256, 256) as d:
    socks = flood(d.grpc_port, 400)
    refused = wait_closed(socks, 3)
    held = len(socks) - refused
    fds = open_fds(d.proc.pid)
    ck.check(held < 256 - 16 and refused >= 400 - held and fds < 256,
             f"b: of 400 idle connections under a 256-fd limit {held} are held and {refused} "
             f"closed at once (ztraind has {fds} fds open)")
    close_all(socks)
    ok, dt = health_call(d, 10)
    ck.check(ok and dt < 5, f"b: once they close, a call succeeds ({dt:.2f} s)")
    ok, dt = health_call(d, 10)
    ck.check(ok, "b: and the next one too")
    check_clean_stop(d, "b")

# ---- c. descriptors really run out ------------------------------------------------------------

with LimitedDaemon(temp_dir("ztrain-conn-c-"), 256, 256,
                   ("--max-grpc-connections", "5000")) as d:
    socks = flood(d.grpc_port, 400)
    time.sleep(1)
    fds = open_fds(d.proc.pid)
    ck.check(fds >= 250, f"c: with the bound above the limit, 400 connections exhaust ztraind's "
                         f"descriptors ({fds} of 256 open)")
    wait_closed(socks, 2)
    close_all(socks)
    ok, dt = health_call(d, 10)
    ck.check(ok and dt < 5, f"c: once they close, gRPC accepts again: a call succeeds "
                            f"({dt:.2f} s)")
    ck.check(healthz(d), "c: /healthz answers too")
    ok, _ = health_call(d, 10)
    ck.check(ok, "c: and a second call succeeds")
    check_clean_stop(d, "c")

# ---- d. timeouts free the slots ---------------------------------------------------------------

with Daemon(BUILD, temp_dir("ztrain-conn-d-"),
            extra_args=("--max-grpc-connections", "20", "--header-timeout", "2",
                        "--idle-timeout", "3")) as d:
    t0 = time.monotonic()
    idle = flood(d.grpc_port, 19)
    # One connection that speaks HTTP/2 (the client preface and an empty SETTINGS) and then
    # makes no call: only the idle timeout applies to it.
    h2 = socket.create_connection(("127.0.0.1", d.grpc_port), timeout=5)
    h2.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    h2.setblocking(False)
    time.sleep(0.3)
    extra = flood(d.grpc_port, 1)
    ck.check(wait_closed(extra, 2) == 1, "d: with 20 idle connections at the bound of 20, a "
                                         "21st is closed at once")
    n = wait_closed(idle, 15)
    dt_idle = time.monotonic() - t0
    ck.check(n == 19 and 1.5 < dt_idle < 12,
             f"d: 19 connections that never start HTTP/2 are closed by the 2 s header timeout "
             f"({n} closed after {dt_idle:.1f} s)")
    n = wait_closed([h2], 15)
    dt_h2 = time.monotonic() - t0
    ck.check(n == 1 and 2.5 < dt_h2 < 15,
             f"d: a connection that started HTTP/2 and made no call is closed by the 3 s idle "
             f"timeout ({dt_h2:.1f} s)")
    ok, dt = health_call(d, 10)
    ck.check(ok, f"d: the slots are free again: a call succeeds ({dt:.2f} s) with the flood's "
                 f"sockets still open on the client side")
    close_all(idle + extra + [h2])
    check_clean_stop(d, "d")

ck.done()
