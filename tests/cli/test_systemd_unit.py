"""examples/systemd/ztraind.service runs (issue 30), as far as it can without systemd: the unit's
ExecStart= command, with the installed paths mapped to this build and a temporary directory and
its ports to free ones, starts a ztraind that serves /healthz, refuses the API without the token
that the unit passes through ZTRAIN_TOKEN_FILE and accepts it with it, and stops with exit 0 on
the unit's KillSignal within its TimeoutStopSec; `systemd-analyze security --offline` rates its
sandboxing 5.0 or better (OK) where it is installed. Also: every key of the unit is one this test
knows the meaning of, so a new setting is looked at here before it ships.
"""
import http.client
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, Checks  # noqa: E402
UNIT = os.path.join(SRC, "examples", "systemd", "ztraind.service")
KNOWN = {
    "Unit": {"Description", "Documentation", "After", "Wants"},
    "Service": {"Type", "DynamicUser", "StateDirectory", "LoadCredential", "Environment",
                "ExecStart", "KillSignal", "KillMode", "TimeoutStopSec", "Restart", "RestartSec",
                "LimitNOFILE", "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp",
                "CapabilityBoundingSet", "RestrictAddressFamilies", "ProtectKernelTunables",
                "ProtectKernelModules", "ProtectControlGroups", "ProtectHostname",
                "LockPersonality", "RestrictRealtime", "RestrictNamespaces",
                "SystemCallArchitectures", "UMask"},
    "Install": {"WantedBy"},
}
ck = Checks()
check = ck.check


def read_unit():
    sections, cur = {}, None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"\[(\w+)\]$", line)
            if m:
                cur = sections.setdefault(m.group(1), {})
                continue
            key, _, value = line.partition("=")
            cur.setdefault(key, []).append(value)
    return sections


def http_get(port, path, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    r.read()
    return r.status


def exposure():
    """systemd's own rating of the unit's sandboxing (systemd-analyze security, 0 to 10, lower is
    safer), or None where this systemd-analyze cannot rate a unit file offline."""
    try:
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", UNIT],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout)
    return float(m.group(1)) if m else None


def main():
    unit = read_unit()
    level = exposure()
    if level is None:
        print("skip  systemd-analyze security --offline (systemd 250 or later) is not here")
    else:
        check(level <= 5.0, f"systemd-analyze security rates the unit {level} (at most 5.0, "
              "\"OK\": the unit is sandboxed, not just run as another user)")
    for section, keys in unit.items():
        unknown = set(keys) - KNOWN.get(section, set())
        check(not unknown, f"[{section}]: every key is known ({sorted(unknown) or 'none unknown'})")
    svc = unit["Service"]
    check(svc["KillMode"] == ["mixed"] and svc["KillSignal"] == ["SIGTERM"],
          "SIGTERM goes to ztraind alone (KillMode=mixed): the ranks are its to stop")
    stop_s = float(svc["TimeoutStopSec"][0])
    argv = shlex.split(svc["ExecStart"][0])
    grace = float(argv[argv.index("--grace") + 1])
    check(stop_s > grace, f"TimeoutStopSec {stop_s:g} s outlasts --grace {grace:g} s")
    check(argv[0] == "/usr/bin/ztraind", f"ExecStart runs the packaged ztraind ({argv[0]})")
    state_dirs = svc["StateDirectory"][0].split()
    for flag in ("--state-dir", "--data-root", "--runs-root"):
        path = argv[argv.index(flag) + 1]
        check(path.startswith("/var/lib/") and path[len("/var/lib/"):] in state_dirs,
              f"{flag} {path} is one of the unit's StateDirectory= directories")
    cred_name, _, cred_file = svc["LoadCredential"][0].partition(":")
    env = dict(e.split("=", 1) for e in svc["Environment"])
    check(env.get("ZTRAIN_TOKEN_FILE") == "%d/" + cred_name,
          "ZTRAIN_TOKEN_FILE names the credential the unit loads")

    with tempfile.TemporaryDirectory() as tmp:
        creds = os.path.join(tmp, "credentials")
        os.makedirs(creds)
        token = "unit-token-4711"
        with open(os.path.join(creds, cred_name), "w") as f:
            f.write(token + "\n")
        os.chmod(os.path.join(creds, cred_name), 0o600)
        for d in state_dirs:
            os.makedirs(os.path.join(tmp, "var", "lib", d), exist_ok=True)
        mapped = []
        for a in argv:
            a = a.replace("/usr/bin/", BUILD + "/").replace("/usr/share/ztrain/web",
                                                                os.path.join(SRC, "web"))
            a = a.replace("/var/lib/", os.path.join(tmp, "var", "lib") + "/")
            a = re.sub(r"^127\.0\.0\.1:\d+$", "127.0.0.1:0", a)
            mapped.append(a)
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("ZTRAIN_")}
        run_env["ZTRAIN_TOKEN_FILE"] = env["ZTRAIN_TOKEN_FILE"].replace("%d", creds)
        log = open(os.path.join(tmp, "ztraind.log"), "w+")
        p = subprocess.Popen(mapped, env=run_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            ready = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and p.poll() is None:
                log.seek(0)
                m = re.search(r"ztraind: ready .*http=http://[^:]+:(\d+)", log.read())
                if m:
                    ready = int(m.group(1))
                    break
                time.sleep(0.1)
            log.seek(0)
            check(ready is not None, "the unit's command starts ztraind "
                  + ("" if ready else "(log: " + log.read()[-2000:] + ")"))
            if ready:
                log.seek(0)
                check("auth=bearer" in log.read(), "the token reached ztraind (auth=bearer)")
                check(http_get(ready, "/healthz") == 200, "/healthz answers without the token")
                check(http_get(ready, "/api/v1/jobs") == 401, "the API refuses a request "
                      "without the token")
                check(http_get(ready, "/api/v1/jobs", {"Authorization": "Bearer " + token})
                      == 200, "the API takes the credential's token")
            t0 = time.monotonic()
            p.send_signal(getattr(signal, svc["KillSignal"][0]))
            try:
                rc = p.wait(timeout=stop_s)
            except subprocess.TimeoutExpired:
                rc = "still running"
            check(rc == 0, f"KillSignal stops it with exit 0 within TimeoutStopSec "
                           f"(exit {rc} after {time.monotonic() - t0:.1f} s)")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    ck.finish()


if __name__ == "__main__":
    main()
