"""ztraind's flags from a config file and in the --flag=value form (docs/service.md):

  a. A config file (comments, blank lines, "name = value", "name value", a switch alone) sets
     the state, data and runs directories and the token file; flags after --config, written
     --flag=value, override its max-ranks. The ready line shows the file's directories and the
     command line's max-ranks, and the HTTP API refuses a request without the file's token and
     answers one with it: the file's flags are really in force. SIGHUP (a "reload") leaves it
     serving and says the file is read only at start.
  b. Each kind of bad file, and --flag=value on a switch, exits 2 with a message that names the
     file and line (or the flag), and ztraind does not start.
  c. A second ztraind on a running one's state directory exits 1 naming the directory and the
     first one's pid, and the first goes on; once the first has stopped, one starts there again.
  d. --launcher slurm's --metrics-host is where ztraind listens for each job's rank 0 (docs/
     deploy/slurm.md): a name that does not resolve (the reserved .invalid domain, RFC 6761), an
     address that is not this host's (10.255.255.1, checked against `ip -o addr` first) and the
     unspecified 0.0.0.0 each exit 2 at startup naming the flag (and the config file's line it
     came from) instead of starting and failing every job; 127.0.0.1 and this host's own name
     start (srun and scancel are stand-ins on PATH: nothing is submitted).
  e. A runs root that ztraind's user cannot write (a volume owned by another uid: docs/deploy/
     docker.md) exits 1 at start naming the directory and the uid, rather than starting "ready"
     and failing every job with "cannot create directory"; made writable, ztraind starts. As
     root (whom permissions do not stop) ztraind runs as nobody (65534) through setpriv.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
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
        # A `kill -HUP` meant as "reload the config" (nginx, sshd) reloads nothing: ztraind goes on
        # and its message says the file is read only at start, not that there is none.
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        log = open(os.path.join(tmp, "ztraind.log"), errors="replace").read()
        ck.check(proc.poll() is None and http_status(url, TOKEN) == 200
                 and "SIGHUP ignored: flags and the --config file are read only at start" in log,
                 f"a: SIGHUP leaves ztraind serving and says the config file is not reloaded: "
                 f"{[l for l in log.splitlines() if 'SIGHUP' in l]}")
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
        # They would print and exit 0: a daemon that never starts, and a supervisor that sees a
        # clean stop.
        "help": ("max-jobs = 3\nhelp\n", r"{f}:2: 'help' is not a setting"),
        "version": ("version\n", r"{f}:1: 'version' is not a setting"),
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


def local_addresses():
    """This host's addresses as the kernel lists them (ip -o addr), independent of ztraind."""
    out = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    return {m.split("/")[0] for m in re.findall(r"\binet6? (\S+)", out)}


def case_d(tmp):
    bin_dir = os.path.join(tmp, "slurm-bin")
    os.makedirs(bin_dir, exist_ok=True)
    for prog in ("srun", "scancel"):
        path = os.path.join(bin_dir, prog)
        with open(path, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(path, 0o755)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    not_local = "10.255.255.1"
    ck.check(not_local not in local_addresses(),
             f"d: {not_local} is not an address of this host (ip -o addr)")
    conf = os.path.join(tmp, "slurm.conf")
    with open(conf, "w") as f:
        f.write(f"launcher = slurm\nmetrics-host = {not_local}\n")
    state = os.path.join(tmp, "never-slurm")
    for args, pattern in (
            (["--metrics-host", "no.such.host.invalid"],
             r"--metrics-host no\.such\.host\.invalid: "),
            (["--metrics-host", not_local],
             rf"--metrics-host {re.escape(not_local)} is not an address of this host"),
            (["--metrics-host=0.0.0.0"], r"--metrics-host 0\.0\.0\.0 is the unspecified address"),
            (["--config", conf], rf"is not an address of this host[\s\S]*"
                                 rf"\(--metrics-host came from {re.escape(conf)}:2\)")):
        full = [tool("ztraind"), "--state-dir", state, "--grpc-addr=127.0.0.1:0",
                "--http-addr=127.0.0.1:0"] + (["--launcher", "slurm"] if args[0] != "--config"
                                              else []) + args
        # Without the check ztraind starts, and would run until stopped.
        p = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=env)
        try:
            _, err = p.communicate(timeout=20)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            rc = "none: it started"
        ck.check(rc == 2 and re.search(pattern, err) is not None,
                 f"d: {' '.join(args)}: exit {rc}, {err.strip()[-240:]!r}")
    ck.check(not os.path.exists(state), "d: no bad --metrics-host started ztraind")
    hosts = ["127.0.0.1"]
    # This host's name too, where it resolves to addresses of this host (not in every container).
    try:
        named = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        named = set()
    if named and named <= local_addresses():
        hosts.append(socket.gethostname())
    for host in hosts:
        proc, ready = None, None
        cwd = os.path.join(tmp, "slurm-" + host.replace(".", "-"))
        os.makedirs(cwd, exist_ok=True)
        log = os.path.join(cwd, "ztraind.log")
        with open(log, "wb") as f:
            proc = subprocess.Popen([tool("ztraind"), "--launcher", "slurm", "--metrics-host", host,
                                     "--state-dir", os.path.join(cwd, "state"),
                                     "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0"],
                                    stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            ready = re.search(r"ztraind: ready .*", open(log, errors="replace").read())
            time.sleep(0.05)
        ck.check(ready is not None, f"d: --metrics-host {host} (this host's) starts "
                 f"({open(log, errors='replace').read().strip()[-200:] if not ready else 'ready'})")
        proc.terminate()
        proc.wait(timeout=30)


def case_e(tmp):
    base = os.path.join(tmp, "perm")
    state, runs = os.path.join(base, "state"), os.path.join(base, "runs")
    for d in (base, state, runs):
        os.makedirs(d)
    os.chmod(tmp, 0o755)
    os.chmod(base, 0o755)
    as_user = []
    if os.geteuid() == 0:
        as_user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        os.chown(state, 65534, 65534)
    os.chmod(runs, 0o555)
    cmd = as_user + [tool("ztraind"), "--state-dir", state, "--runs-root", runs,
                     "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "none: it started", str(e.stderr or "")
    pattern = re.escape(runs) + r": not writable by uid \d+: Permission denied"
    ck.check(rc == 1 and re.search(pattern, err) is not None,
             f"e: an unwritable runs root stops ztraind at start: exit {rc}, {err.strip()[-240:]!r}")
    os.chmod(runs, 0o777)
    log = os.path.join(base, "ok.log")
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    ready, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None and not ready:
        ready = re.search(r"ztraind: ready .*", open(log, errors="replace").read())
        time.sleep(0.05)
    ck.check(ready is not None, f"e: a writable runs root starts "
             f"({open(log, errors='replace').read().strip()[-200:] if not ready else 'ready'})")
    proc.terminate()
    proc.wait(timeout=30)


tmp = temp_dir("ztrain-daemon-config-")
case_a(tmp)
case_b(tmp)
case_d(tmp)
case_e(tmp)
ck.done()
