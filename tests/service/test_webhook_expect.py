"""Webhook bodies over 1 KiB to a receiver that speaks HTTP/1.0, with a real ztraind.

libcurl adds `Expect: 100-continue` to a POST whose body is over 1024 bytes and then waits up to
a second for the interim answer before sending the body. A receiver that speaks HTTP/1.0 (RFC
7231 section 5.1.1: it never sends 100), as Python's http.server does by default, so cost every
such delivery a second, and a second per retry. ztraind sends an empty `Expect:`, which removes
the header (as `curl -H 'Expect:'` does): the receiver gets no Expect header and the whole body.
A job whose training file, under a path of some 1,300 bytes, is removed while it waits in the
queue fails with a reason naming that path: its job.failure body is larger than 1024 bytes.
libcurl 7.88 (Debian 12) already leaves the header out below 1 MiB, so there this test passes
without the empty `Expect:` too (checked: curl 7.88.1 sends the header for a 1.1 MB body, not
for a 2 KB one); it guards builds against older libcurl, whose threshold was 1024 bytes."""
import http.server
import json
import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, stubs, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state)

ck = Checker()
DEEP = "/".join(["d" * 200] * 6)


class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"   # never answers 100 Continue
    seen = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.seen.append((dict(self.headers), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
hook = f"http://127.0.0.1:{server.server_address[1]}/operator"

with Daemon(BUILD, temp_dir("ztrain-hook-expect-"), max_ranks=1,
            extra_args=["--webhook", hook]) as d:
    first = submit(d, tiny_job(d.data_root, name="first", max_steps=100000))
    job = tiny_job(d.data_root, name="deep", max_steps=2)
    os.makedirs(os.path.join(d.data_root, DEEP))
    shutil.copy(os.path.join(d.data_root, job["data"]["train"]),
                os.path.join(d.data_root, DEEP, "t.txt"))
    job["data"]["train"] = DEEP + "/t.txt"
    j = submit(d, job)   # waits for the first job's rank
    os.remove(os.path.join(d.data_root, DEEP, "t.txt"))
    d.stub().CancelJob(stubs()[0].CancelJobRequest(id=first.id, force=True),
                       metadata=d.metadata, timeout=30)
    wait_state(d, j.id, {"FAILED"}, timeout=120)
    deadline = time.monotonic() + 30
    while len(Receiver.seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
server.shutdown()

ends = [(h, b) for h, b in Receiver.seen if json.loads(b).get("job", {}).get("name") == "deep"]
ck.check(len(ends) >= 1 and all(len(b) > 1024 for _, b in ends),
         f"the job's hook bodies are over 1024 bytes ({[len(b) for _, b in ends]})")
expects = [h.get("Expect") for h, _ in ends]
ck.check(ends and not any(expects),
         f"no Expect header reaches an HTTP/1.0 receiver, which never answers 100 Continue "
         f"({expects})")
ck.done()
