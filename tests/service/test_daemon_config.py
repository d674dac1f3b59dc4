"""ztraind's flags from a config file and in the --flag=value form (docs/service.md):

  a. A config file (comments, blank lines, "name = value", "name value", a switch alone) sets
     the state, data and runs directories and the token file; flags after --config, written
     --flag=value, override its max-ranks. The ready line shows the file's directories and the
     command line's max-ranks, and the HTTP API refuses a request without the file's token and
     answers one with it: the file's flags are really in force.
  b. Each kind of bad file, and --flag=value on a switch, exits 2 with a message that names the
     file and line (or the flag), and ztraind does not start.
  c. A second ztraind on a running one's state directory exits 1 naming the directory and the
     first one's pid, and the first goes on; once the first has stopped, one starts there again.
"""
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import Checker, temp_dir, tool

ck = Checker()
TOKEN = "config-file-token-0123456789"


def start(args, cwd, timeout=30):
    """ztraind with args; (process, ready line) or (process, None) when it exits first."""
    log = os.path.join(cwd, "ztraind.log")
    with open(log, "wb") as f:
        proc = subprocess.Popen([tool("ztraind")] + args, stdout=f, stderr=subprocess.STDOUT,
                                cwd=cwd)
    try:
        proc.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
        pass
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = open(log, encoding="utf-8", errors="replace").read()
        m = re.search(r"ztraind: ready .*", text)
        if m:
            return proc, m.group(0)
        if proc.poll() is not None:
            return proc, None
        time.sleep(0.05)
    proc.kill()
    return proc, None


def http_status(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def case_a(tmp):
    state = os.path.join(tmp, "state from file")
    runs = os.path.join(tmp, "runs")
    data = os.path.join(tmp, "data")
    token_file = os.path.join(tmp, "tokens")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    conf = os.path.join(tmp, "ztraind.conf")
    with open(conf, "w") as f:
        f.write(f"""# ztraind for the config test

state-dir = {state}
data-root   {data}
runs-root={runs}
token-file = {token_file}
max-ranks = 1
webhook-allow-private
""")
    proc, ready = start(["--config", conf, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0",
                         "--max-ranks=2"], tmp)
    try:
        ck.check(ready is not None, f"a: ztraind starts from the config file ({ready})")
        if ready is None:
            print(open(os.path.join(tmp, "ztraind.log")).read())
            return
        ck.check(f"state={state}/ztraind.db" in ready and f"data={data}" in ready
                 and f"runs={runs}" in ready,
                 "a: the state, data and runs directories are the file's (a value keeps its "
                 "inner spaces)")
        ck.check("max_ranks=2" in ready,
                 "a: --max-ranks=2 after --config overrides the file's max-ranks = 1")
        port = re.search(r"http=http://\S+:(\d+)", ready).group(1)
        url = f"http://127.0.0.1:{port}/api/v1/jobs"
        without, with_token = http_status(url), http_status(url, TOKEN)
        ck.check(without == 401 and with_token == 200,
                 f"a: the file's token file is in force: {without} without the token, "
                 f"{with_token} with it")
        # c. A second daemon on the same state directory would take the first's running jobs
        #    for a crash's orphans: it is refused, naming the directory and the first's pid.
        r = subprocess.run([tool("ztraind"), "--state-dir", state, "--grpc-addr=127.0.0.1:0",
                            "--http-addr=127.0.0.1:0"], capture_output=True, text=True,
                           timeout=30, cwd=tmp)
        ck.check(r.returncode == 1 and f"--state-dir {state} is in use by another ztraind "
                 f"(pid {proc.pid}," in r.stderr,
                 f"c: a second ztraind on the state directory exits {r.returncode}: "
                 f"{r.stderr.strip()[-200:]!r}")
        ck.check(http_status(url, TOKEN) == 200, "c: the first daemon still answers")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    proc, ready = start(["--config", conf, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0"],
                        tmp)
    ck.check(ready is not None, "c: once the first has stopped, a daemon starts on its state "
             "directory again")
    proc.terminate()
    proc.wait(timeout=30)


def case_b(tmp):
    bad = {
        "unknown flag": ("# limits\nbogus = 1\n", r"{f}:2: unknown key 'bogus'"),
        "bad value": ("# limits\nmax-jobs = 0\n",
                      r"--max-jobs expects an integer[\s\S]*came from {f}:2"),
        "dashes": ("--max-jobs = 3\n", r"{f}:1: write the flag without its dashes"),
        "no value": ("\nmax-jobs\n", r"{f}:2: 'max-jobs' needs a value"),
        "switch with value": ("webhook-allow-private = yes\n",
                              r"{f}:1: 'webhook-allow-private' takes no value"),
        "nested": ("config = other.conf\n", r"{f}:1: config files do not nest"),
        "NUL byte": ("max-jobs = 3\0\n", r"{f}:1: a NUL byte"),
    }
    for what, (text, pattern) in bad.items():
        conf = os.path.join(tmp, what.replace(" ", "-") + ".conf")
        with open(conf, "w") as f:
            f.write(text)
        r = subprocess.run([tool("ztraind"), "--config", conf, "--state-dir",
                            os.path.join(tmp, "never")], capture_output=True, text=True,
                           timeout=30)
        ok = r.returncode == 2 and re.search(pattern.format(f=re.escape(conf)), r.stderr)
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        ck.check(bool(ok), f"b: {what}: exit {r.returncode}, {last!r}")
    for args, pattern in (
            (["--config", os.path.join(tmp, "missing.conf")],
             r"--config .*missing\.conf: No such file"),
            (["--config"], r"--config needs a file"),
            (["--webhook-allow-private=1"], r"--webhook-allow-private takes no value"),
            (["--max-jobs=x"], r"--max-jobs expects an integer .* got 'x'")):
        r = subprocess.run([tool("ztraind")] + args, capture_output=True, text=True, timeout=30)
        ck.check(r.returncode == 2 and re.search(pattern, r.stderr) is not None,
                 f"b: {' '.join(args)}: exit {r.returncode}, "
                 f"{r.stderr.strip().splitlines()[:1]}")
    ck.check(not os.path.exists(os.path.join(tmp, "never")),
             "b: no bad config started ztraind (no state directory made)")


tmp = temp_dir("ztrain-daemon-config-")
case_a(tmp)
case_b(tmp)
ck.done()
