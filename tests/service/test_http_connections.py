"""ztraind's HTTP connection slots under slowloris and idle floods (issue 19, defect 9).

Every client here is 127.0.0.1, so the flood and the legitimate requests share one address and
its per-address share of the slots. ztraind runs with its defaults but a 4 s header timeout
(--header-timeout; the default 10 s would only make the test wait longer).

  a. 140 slowloris connections (a request head sent a byte a second, never finished) and 5 that
     send their head but trickle the body are all dropped within the header timeout (bound:
     19 s), although each keeps the connection busier than the idle timeout; while they are
     held, GET /healthz and GET /api/v1/jobs from the same address succeed. (Before the fix the
     per-address cap was full for as long as the bytes trickled, and every other request from
     the address was reset.)
  b. While 1,000 idle connections (four times ztraind's 256 slots, or as many as this process may
     open) are held, /healthz and /api/v1/jobs still succeed, two requests on one keep-alive
     connection included, and ztraind's own descriptors stay bounded."""
import http.client
import os
import resource
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, Checker, Daemon, temp_dir  # noqa: E402

ck = Checker()
HEADER_TIMEOUT = 4

_soft, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (HARD, HARD))


def get(d, path, conn=None):
    """(status, error text) of GET path on a new connection (or on conn, kept alive)."""
    c = conn or http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status, ""
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        if conn is None:
            c.close()


def check_requests(d, what):
    for path in ("/healthz", "/api/v1/jobs"):
        status, err = get(d, path)
        ck.check(status == 200, f"{what}: GET {path} from the same address succeeds "
                                f"({status or err})")


class Trickler:
    """Connections that send `head`, then `drip` one byte a second until the server closes
    them; records when each was closed."""

    def __init__(self, port, n, head, drip):
        self.socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
            s.setblocking(False)
            self.socks.append(s)
        self.t0 = time.monotonic()
        self.closed_at = [None] * n
        self.drip = drip
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop and None in self.closed_at:
            for i, s in enumerate(self.socks):
                if self.closed_at[i] is not None:
                    continue
                try:
                    while s.recv(65536):
                        pass
                    gone = True
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if not gone:
                    try:
                        s.send(self.drip)
                    except BlockingIOError:
                        pass
                    except OSError:
                        gone = True
                if gone:
                    self.closed_at[i] = time.monotonic() - self.t0
            time.sleep(1)

    def finish(self, timeout):
        self.thread.join(timeout)
        self.stop = True
        self.thread.join()
        for s in self.socks:
            s.close()
        return [t for t in self.closed_at if t is not None]


with Daemon(BUILD, temp_dir("ztrain-http-conn-"),
            extra_args=["--header-timeout", str(HEADER_TIMEOUT)]) as d:
    # ---- a. slowloris ------------------------------------------------------------------------
    heads = Trickler(d.http_port, 140, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
                     b"a")
    bodies = Trickler(d.http_port, 5,
                      b"POST /api/v1/jobs/j1/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", b" ")
    time.sleep(2)
    check_requests(d, "a: with 145 slow connections held")
    closed = heads.finish(HEADER_TIMEOUT + 15)
    closed_bodies = bodies.finish(5)
    late = max(closed + closed_bodies, default=None)
    ck.check(len(closed) == 140 and len(closed_bodies) == 5,
             f"a: every slowloris connection is dropped within {HEADER_TIMEOUT + 15} s "
             f"({len(closed)} of 140 heads, {len(closed_bodies)} of 5 bodies; the last after "
             f"{late if late is None else round(late, 1)} s)")
    ck.check(sum(t >= HEADER_TIMEOUT - 2 for t in closed) >= 100,
             f"a: most of them by the {HEADER_TIMEOUT} s header timeout, not at once "
             f"({sum(t >= HEADER_TIMEOUT - 2 for t in closed)} after {HEADER_TIMEOUT - 2} s or "
             f"more)")
    check_requests(d, "a: afterwards")

    # ---- b. an idle flood -------------------------------------------------------------------
    n = min(1000, HARD - 200)
    idle = []
    for _ in range(n):
        try:
            idle.append(socket.create_connection(("127.0.0.1", d.http_port), timeout=5))
        except OSError as e:
            print(f"      connection {len(idle) + 1}: {e}")
            break
    ck.check(len(idle) == n, f"b: {len(idle)} idle connections opened")
    time.sleep(1)
    for round_ in range(3):
        check_requests(d, f"b: round {round_ + 1}, while {len(idle)} idle connections are held")
    keep = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=10)
    s1, e1 = get(d, "/healthz", keep)
    s2, e2 = get(d, "/api/v1/jobs", keep)
    keep.close()
    ck.check(s1 == s2 == 200, f"b: two requests on one keep-alive connection ({s1 or e1}, "
                              f"{s2 or e2})")
    fds = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
    ck.check(fds < 800, f"b: ztraind holds {fds} descriptors, not one per idle connection")
    for s in idle:
        s.close()
    check_requests(d, "b: after the flood")

    ck.check(d.stop() == 0, "ztraind stops cleanly")
    errs = d.sanitizer_errors()
    ck.check(not errs, "no sanitizer reports" + "".join("\n      " + e for e in errs))

ck.done()
