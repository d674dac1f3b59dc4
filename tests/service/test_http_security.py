"""ztraind's HTTP server against web pages that attack it (issue 19, defect 2): real daemons, a
real job, headless Chromium (selenium, Debian's chromium-driver) and a second local HTTP server
that serves the attacker's page on another origin.

  a. A default daemon (no token, loopback): a page on another origin cannot read
     /api/v1/jobs (the daemon answers 403 naming the Origin header, and no response carries
     Access-Control-Allow-Origin) nor cancel the running job with a text/plain POST, a "simple"
     request that needs no preflight (415 naming Content-Type). A page the browser reached
     through a name that resolves to 127.0.0.1, as after DNS rebinding, gets 421 naming the
     Host header. Over raw HTTP: a foreign Host is 421 on every route; 127.0.0.1, localhost
     and [::1] in any case, with or without a port, are served, and so is an HTTP/1.0 request
     without Host; a same-origin POST with Origin and application/json; charset=utf-8 cancels.
  b. --http-allow-origin http://localhost:P and --http-host ztraind.example: the page on that
     origin reads the job list (its origin echoed, with Vary: Origin) and cancels the job with
     a JSON POST after a preflight, while its text/plain POST is still 415; the same page on
     http://127.0.0.1:P (another origin) is still refused; the named Host is served.
  c. Listening on 0.0.0.0: any IP address and localhost as Host are served, any other name is
     421 unless it was given with --http-host.
  e. The dashboard's pages carry a Content-Security-Policy (its own scripts only, no framing
     by other sites) and X-Frame-Options DENY: Chromium refuses to show it in another origin's
     iframe, and the dashboard on its own origin loads without a CSP refusal.
  d. Malformed flag values (a wildcard origin, an origin with a path, a Host with a port) stop
     ztraind at start with a message naming the value."""
import http.client
import json
import os
import shutil
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, LONG, TERMINAL, Checker, Daemon, error_of, state_name,  # noqa: E402
                 submit, temp_dir, tiny_job, wait_state)

sys.stdout.reconfigure(line_buffering=True)
ck = Checker()
# A name the browser resolves to 127.0.0.1 without DNS: what an attacker's name becomes once a
# rebinding DNS server has switched it to the victim's loopback.
REBIND = "rebind.test"
NAMED = "ztraind.example"


# ---- raw HTTP -----------------------------------------------------------------------------------

def raw(port, method, path, host=None, headers=None, body=None):
    """(status, headers, body) of one request to 127.0.0.1:port; host replaces the Host header
    http.client would send."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest(method, path, skip_host=host is not None, skip_accept_encoding=True)
        if host is not None:
            c.putheader("Host", host)
        for k, v in (headers or {}).items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return r.status, r.headers, r.read()
    finally:
        c.close()


def job_state(d, job_id):
    s, _, body = raw(d.http_port, "GET", f"/api/v1/jobs/{job_id}")
    return view(f"/api/v1/jobs/{job_id}", json.loads(body))["state"] if s == 200 else f"HTTP {s}"


def running_job(d, name):
    job_id = submit(d, tiny_job(d.data_root, name=name, max_steps=LONG)).id
    wait_state(d, job_id, {"RUNNING"} | set(TERMINAL), timeout=60)
    return job_id


# ---- the attacker's web server and the browser ----------------------------------------------------

class Page(BaseHTTPRequestHandler):
    """Any path: an empty page, from which the browser then runs the test's fetches."""

    def do_GET(self):
        body = b"<!doctype html><title>another site</title><p>nothing to see"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def start_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    o = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--host-resolver-rules=MAP {REBIND} 127.0.0.1",
              "--disable-features=HttpsUpgrades"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})   # CSP refusals are logged there
    drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
    drv.set_script_timeout(30)
    return drv


FETCH_JS = """
const [url, opts, done] = arguments;
fetch(url, opts).then(async r => done({status: r.status, type: r.type, body: await r.text()}))
                .catch(e => done({error: String(e)}));"""


def fetch_from(drv, page, url, **opts):
    """Loads `page` and runs fetch(url, opts) in it: what a script on that page gets back."""
    if drv.current_url.rstrip("/") != page.rstrip("/"):
        drv.get(page)
    return drv.execute_async_script(FETCH_JS, url, opts)


def text_post(body='{"force": true}'):
    """A "simple" cross-origin request: no preflight, the browser sends it whatever the answer."""
    return dict(method="POST", mode="no-cors", headers={"Content-Type": "text/plain"}, body=body)


# ---- cases --------------------------------------------------------------------------------------

def case_default(drv, page_port):
    with Daemon(BUILD, temp_dir("ztrain-websec-a-")) as d:
        api = f"http://127.0.0.1:{d.http_port}"
        evil = f"http://127.0.0.1:{page_port}/"
        job_id = running_job(d, "victim")
        ck.check(job_state(d, job_id) == "RUNNING", f"a: the victim job runs ({job_state(d, job_id)})")

        r = fetch_from(drv, evil, api + "/api/v1/jobs")
        ck.check("error" in r and job_id not in r.get("body", ""),
                 f"a: a page on {evil} cannot read /api/v1/jobs ({str(r)[:160]})")
        s, h, body = raw(d.http_port, "GET", "/api/v1/jobs", headers={"Origin": evil.rstrip("/")})
        ck.check(s == 403 and "Origin" in error_of(body) and job_id.encode() not in body and
                 "Access-Control-Allow-Origin" not in h,
                 f"a: its request is 403 naming the Origin header, without CORS headers "
                 f"({s} {error_of(body)!r})")

        r = fetch_from(drv, evil, f"{api}/api/v1/jobs/{job_id}/cancel", **text_post())
        state = job_state(d, job_id)
        ck.check("error" not in r and state == "RUNNING",
                 f"a: the page's text/plain POST to cancel was sent ({r}) and the job still "
                 f"runs ({state})")
        s, _, body = raw(d.http_port, "POST", f"/api/v1/jobs/{job_id}/cancel",
                         headers={"Content-Type": "text/plain"}, body=b'{"force": true}')
        s2, _, body2 = raw(d.http_port, "POST", f"/api/v1/jobs/{job_id}/cancel", body=b"{}")
        ck.check(s == 415 and s2 == 415 and "Content-Type" in error_of(body) and
                 job_state(d, job_id) == "RUNNING",
                 f"a: a text/plain or untyped POST is 415 naming Content-Type, even without an "
                 f"Origin ({s} {s2} {error_of(body)!r})")

        rebound = f"http://{REBIND}:{d.http_port}/"
        r = fetch_from(drv, rebound, "/api/v1/jobs")
        ck.check(r.get("status") == 421 and "Host" in error_of(r.get("body", "")) and
                 job_id not in r.get("body", ""),
                 f"a: DNS rebinding: a page at {rebound} reading /api/v1/jobs from its own origin "
                 f"gets 421 naming the Host header ({r.get('status')} {r.get('body', r)[:120]!r})")

        foreign = f"evil.example:{d.http_port}"
        for path in ("/api/v1/jobs", "/healthz", "/", "/metrics"):
            s, h, body = raw(d.http_port, "GET", path, host=foreign)
            ck.check(s == 421 and "Host" in error_of(body) and foreign in error_of(body) and
                     h.get("Content-Type") == "application/problem+json",
                     f"a: GET {path} with Host {foreign} is 421 naming the header ({s} "
                     f"{error_of(body)!r})")
        s, _, _ = raw(d.http_port, "POST", f"/api/v1/jobs/{job_id}/cancel", host=foreign,
                      headers={"Content-Type": "application/json"}, body=b'{"force": true}')
        ck.check(s == 421 and job_state(d, job_id) == "RUNNING",
                 f"a: a JSON cancel with a foreign Host is 421 and does nothing ({s})")
        served = []
        for host in (f"127.0.0.1:{d.http_port}", f"localhost:{d.http_port}",
                     f"LocalHost:{d.http_port}", f"[::1]:{d.http_port}", "127.0.0.1", "localhost"):
            s, _, _ = raw(d.http_port, "GET", "/api/v1/jobs", host=host)
            served.append((host, s))
        ck.check(all(s == 200 for _, s in served),
                 f"a: loopback names as Host are served, with or without a port ({served})")
        with socket.create_connection(("127.0.0.1", d.http_port), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            head = sock.recv(4096).split(b"\r\n", 1)[0]
        ck.check(b" 200 " in head + b" ", f"a: an HTTP/1.0 request without Host is served ({head})")

        wild = []
        for path in ("/healthz", "/api/v1/jobs", "/"):
            for origin in (None, api):
                s, h, _ = raw(d.http_port, "GET", path,
                              headers={"Origin": origin} if origin else None)
                wild.append((path, origin is not None, s, h.get("Access-Control-Allow-Origin"),
                             "Origin" in (h.get("Vary") or "")))
        ck.check(all(w[2] == 200 and w[3] is None and w[4] for w in wild),
                 f"a: same-origin and Origin-less answers carry no Access-Control-Allow-Origin "
                 f"and say Vary: Origin ({wild})")

        s, _, body = raw(d.http_port, "POST", f"/api/v1/jobs/{job_id}/cancel",
                         headers={"Origin": api, "Content-Type": "application/json; charset=utf-8"},
                         body=b'{"force": true}')
        j = wait_state(d, job_id, TERMINAL, timeout=30)
        ck.check(s == 200 and state_name(j.state) == "CANCELLED",
                 f"a: a same-origin JSON POST (Origin {api}, charset given) cancels the job ({s} "
                 f"{error_of(body)!r})")


def case_allowed(drv, page_port):
    friend = f"http://localhost:{page_port}"
    other = f"http://127.0.0.1:{page_port}"
    args = ["--http-allow-origin", friend, "--http-allow-origin", "https://dash.example",
            "--http-host", NAMED]
    with Daemon(BUILD, temp_dir("ztrain-websec-b-"), extra_args=args) as d:
        api = f"http://127.0.0.1:{d.http_port}"
        job_id = running_job(d, "shared")

        r = fetch_from(drv, friend + "/", api + "/api/v1/jobs")
        s, h, _ = raw(d.http_port, "GET", "/api/v1/jobs", headers={"Origin": friend})
        ck.check(r.get("status") == 200 and job_id in r.get("body", "") and s == 200 and
                 h.get("Access-Control-Allow-Origin") == friend and "Origin" in (h.get("Vary") or ""),
                 f"b: a page on the allowed origin {friend} reads /api/v1/jobs ({r.get('status')}); "
                 f"the answer echoes the origin with Vary: Origin ({h.get('Access-Control-Allow-Origin')})")
        r = fetch_from(drv, other + "/", api + "/api/v1/jobs")
        ck.check("error" in r, f"b: the same page on {other} is another origin: refused ({r})")

        s, h, _ = raw(d.http_port, "OPTIONS", f"/api/v1/jobs/{job_id}/cancel",
                      headers={"Origin": friend, "Access-Control-Request-Method": "POST",
                               "Access-Control-Request-Headers": "content-type,authorization"})
        ck.check(s == 204 and h.get("Access-Control-Allow-Origin") == friend and
                 "Origin" in (h.get("Vary") or "") and
                 "POST" in (h.get("Access-Control-Allow-Methods") or "") and
                 "Content-Type" in (h.get("Access-Control-Allow-Headers") or "") and
                 "Authorization" in (h.get("Access-Control-Allow-Headers") or "") and
                 h.get("Access-Control-Max-Age"),
                 f"b: a preflight from {friend} is 204 with its origin, methods, headers, Max-Age "
                 f"({s} {dict(h)})")
        s, h, body = raw(d.http_port, "OPTIONS", "/api/v1/jobs",
                         headers={"Origin": other, "Access-Control-Request-Method": "POST"})
        ck.check(s == 403 and "Access-Control-Allow-Origin" not in h and "Origin" in error_of(body),
                 f"b: a preflight from {other} is 403 without CORS headers ({s})")
        s, h, _ = raw(d.http_port, "GET", "/healthz", headers={"Origin": "https://dash.example"})
        ck.check(s == 200 and h.get("Access-Control-Allow-Origin") == "https://dash.example",
                 f"b: the second allowed origin is echoed too ({s})")

        r = fetch_from(drv, friend + "/", f"{api}/api/v1/jobs/{job_id}/cancel",
                       method="POST", headers={"Content-Type": "text/plain"}, body="{}")
        ck.check(r.get("status") == 415 and job_state(d, job_id) == "RUNNING",
                 f"b: the allowed origin's text/plain POST is 415 too ({r.get('status')})")
        r = fetch_from(drv, friend + "/", f"{api}/api/v1/jobs/{job_id}/cancel",
                       method="POST", headers={"Content-Type": "application/json"},
                       body='{"force": true}')
        body = json.loads(r.get("body") or "{}") if r.get("status") == 200 else {}
        ck.check(r.get("status") == 200 and body.get("id") == job_id and
                 body.get("state") in ("JOB_STATE_STOPPING", "JOB_STATE_CANCELLED"),
                 f"b: its JSON POST (after a preflight) cancels the job ({r.get('status')} "
                 f"{body.get('state')})")
        wait_state(d, job_id, TERMINAL, timeout=30)

        served = [(h, raw(d.http_port, "GET", "/healthz", host=h)[0])
                  for h in (f"{NAMED}:{d.http_port}", f"{NAMED.upper()}.", NAMED)]
        s, _, body = raw(d.http_port, "GET", "/healthz", host=f"x.{NAMED}:{d.http_port}")
        ck.check(all(s == 200 for _, s in served) and s == 421,
                 f"b: --http-host {NAMED} is served ({served}), x.{NAMED} is not ({s})")


def case_wildcard():
    with Daemon(BUILD, temp_dir("ztrain-websec-c-"),
                extra_args=["--http-addr", "0.0.0.0:0"]) as d:
        served = [(h, raw(d.http_port, "GET", "/healthz", host=h)[0])
                  for h in ("10.1.2.3:8080", "192.168.0.7", "[fe80::1]:80",
                            f"localhost:{d.http_port}", f"127.0.0.1:{d.http_port}")]
        ck.check(all(s == 200 for _, s in served),
                 f"c: on 0.0.0.0, IP addresses and localhost as Host are served ({served})")
        refused = [(h, raw(d.http_port, "GET", "/healthz", host=h)[0])
                   for h in (f"gpu-box:{d.http_port}", "evil.example", "10.1.2.3.evil.example",
                             "[fe80::1", "")]
        ck.check(all(s == 421 for _, s in refused),
                 f"c: names that were not given with --http-host are 421 ({refused})")
    with Daemon(BUILD, temp_dir("ztrain-websec-c2-"),
                extra_args=["--http-addr", "0.0.0.0:0", "--http-host", "gpu-box"]) as d:
        s, _, _ = raw(d.http_port, "GET", "/healthz", host=f"gpu-box:{d.http_port}")
        s2, _, _ = raw(d.http_port, "GET", "/healthz", host=f"evil.example:{d.http_port}")
        ck.check(s == 200 and s2 == 421,
                 f"c: with --http-host gpu-box that name is served ({s}), others not ({s2})")


def case_flags():
    for flag, value in (("--http-allow-origin", "*"), ("--http-allow-origin", "null"),
                        ("--http-allow-origin", "http://a.example/"),
                        ("--http-allow-origin", "ftp://a.example"),
                        ("--http-host", "a.example:8080"), ("--http-host", "a b")):
        d = Daemon(BUILD, temp_dir("ztrain-websec-d-"), extra_args=[flag, value], start=False)
        try:
            d.start(timeout=20)
            err = None
        except RuntimeError as e:
            err = str(e)
        d.stop(5)
        last = (err or "it started").strip().splitlines()[-1]
        ck.check(err is not None and value in err and flag in err,
                 f"d: {flag} {value!r} stops ztraind at start ({last})")


FRAME_JS = """
const [url, done] = arguments;
const f = document.createElement('iframe');
f.src = url;
f.onload = () => setTimeout(() => done(true), 1500);
document.body.append(f);"""


def csp_directives(value):
    """{directive: [sources]} of a Content-Security-Policy header (CSP Level 3, 2.2.1)."""
    out = {}
    for part in (value or "").split(";"):
        words = part.split()
        if words:
            out.setdefault(words[0].lower(), words[1:])
    return out


def case_framing(drv, page_port):
    """e. The dashboard's pages carry a Content-Security-Policy that runs only its own scripts and
    lets no other site frame them (frame-ancestors 'none', and X-Frame-Options DENY for older
    browsers): a page on another origin that puts the dashboard in an iframe, to take a click
    on Cancel through a transparent frame, gets it refused by the browser; the dashboard on its
    own origin loads with no CSP refusal in the console."""
    with Daemon(BUILD, temp_dir("ztrain-websec-e-")) as d:
        api = f"http://127.0.0.1:{d.http_port}"
        for path in ("/", "/static/app.js"):
            s, h, _ = raw(d.http_port, "GET", path)
            csp = csp_directives(h.get("Content-Security-Policy"))
            ck.check(s == 200 and csp.get("frame-ancestors") == ["'none'"] and
                     csp.get("script-src") == ["'self'"] and csp.get("object-src") == ["'none'"]
                     and (h.get("X-Frame-Options") or "").upper() == "DENY",
                     f"e: GET {path}: CSP {h.get('Content-Security-Policy')!r}, X-Frame-Options "
                     f"{h.get('X-Frame-Options')!r}")
        drv.get_log("browser")
        drv.get(f"http://localhost:{page_port}/")
        drv.execute_async_script(FRAME_JS, api + "/")
        refused = [e["message"] for e in drv.get_log("browser") if "frame" in e["message"] and
                   "frame-ancestors" in e["message"]]
        ck.check(bool(refused), f"e: the browser refuses to show the dashboard in another "
                 f"site's frame ({refused[:1]})")
        drv.get(api + "/")
        drv.execute_async_script("setTimeout(arguments[0], 1500)")
        csp_errors = [e["message"] for e in drv.get_log("browser")
                      if "Content Security Policy" in e["message"]]
        ck.check(not csp_errors and "ztrain" in drv.title.lower(),
                 f"e: the dashboard itself loads ({drv.title!r}) without CSP refusals "
                 f"({csp_errors[:2]})")


def main():
    page = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    drv = start_browser()
    try:
        case_default(drv, page.server_address[1])
        case_allowed(drv, page.server_address[1])
        case_framing(drv, page.server_address[1])
    finally:
        drv.quit()
        page.shutdown()
    case_wildcard()
    case_flags()
    ck.done()


if __name__ == "__main__":
    if not shutil.which("/usr/bin/chromedriver"):
        raise SystemExit("FAIL: /usr/bin/chromedriver is missing (scripts/install-deps.sh installs it)")
    main()
