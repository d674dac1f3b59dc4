"""A webhook receiver for ztraind's alerts, to see what it sends: it checks each delivery's
X-Ztrain-Signature (HMAC-SHA256 of the body with the shared secret, as GitHub signs webhooks),
prints one line per delivery and answers 204. Standard library only.

    python3 examples/anomaly/receiver.py --port 8765 --secret "$ZTRAIN_HOOK_SECRET"
"""
import argparse
import hashlib
import hmac
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--secret", required=True)
    a = ap.parse_args()
    secret = a.secret.encode()

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            want = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
            ok = hmac.compare_digest(self.headers.get("X-Ztrain-Signature", ""), want)
            msg = json.loads(body)
            event = msg.get("event") or {}
            print(f"{msg['type']} job={msg['job']['id']} state={msg['job']['state']}"
                  f"{' event=' + event['kind'] + ' step=' + str(event.get('train/global_step')) if event else ''}"
                  f" signature={'ok' if ok else 'BAD'}", flush=True)
            self.send_response(204 if ok else 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", a.port), Hook).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
