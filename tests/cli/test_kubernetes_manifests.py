"""examples/kubernetes/ztraind.yaml without a cluster (issue 30): the manifest is read with
python3-yaml and checked against what the image does (docker/entrypoint.sh: the paths it gives
ztraind, where it reads the token), then ztraind is started the way the pod starts it (the
entrypoint's command with the container's args, the mounts mapped to a temporary directory) and
probed as the kubelet and the Service would: every pod of the example manifests meets the "restricted" Pod Security Standard
(a namespace that enforces it admits them); the startup probe (a TCP connection to the gRPC
port), the readiness and liveness probes (GET /healthz, no token, the pod address as Host), the API through the Service's name with the
Secret's token, and a stop with SIGTERM within terminationGracePeriodSeconds.
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

import grpc
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, Checks  # noqa: E402
MANIFEST = os.path.join(SRC, "examples", "kubernetes", "ztraind.yaml")
ENTRYPOINT = os.path.join(SRC, "docker", "entrypoint.sh")
ck = Checks()
check = ck.check


def entrypoint_command():
    """The ztraind argv of the image's entry point (its exec line), and its token file."""
    text = open(ENTRYPOINT).read()
    m = re.search(r"^exec (/\S+ztraind .*?)\"\$@\"", text, re.S | re.M)
    argv = shlex.split(m.group(1).replace("\\\n", " "))
    token = re.search(r"(/run/secrets/\w+)", text).group(1)
    return argv, token


def http_status(port, path, host, token=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Host": host}
    if token:
        headers["Authorization"] = "Bearer " + token
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    r.read()
    return r.status


# The Pod Security Standards' "restricted" profile, as kubernetes/pod-security-admission's
# policy checks it (policy/check_*.go): a namespace labelled
# pod-security.kubernetes.io/enforce=restricted refuses a pod that breaks any of these rules.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(pod):
    """What in a pod spec the "restricted" Pod Security Standard refuses (empty: none)."""
    bad = []
    psc = pod.get("securityContext", {})
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        bad.append("pod runAsUser 0")
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        sc, name = c.get("securityContext", {}), c["name"]
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            bad.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: capabilities.add {caps['add']}")
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile.type {seccomp}")
    return bad


def pod_templates():
    """(where, pod spec) of every pod the example manifests make."""
    for path in (MANIFEST, os.path.join(SRC, "examples", "kubernetes", "pytorchjob.yaml")):
        for d in yaml.safe_load_all(open(path)):
            if d and d["kind"] == "Deployment":
                yield f"{os.path.basename(path)} Deployment", d["spec"]["template"]["spec"]
            if d and d["kind"] == "PyTorchJob":
                for role, rs in d["spec"]["pytorchReplicaSpecs"].items():
                    yield f"{os.path.basename(path)} {role}", rs["template"]["spec"]


def main():
    for where, pod in pod_templates():
        bad = restricted_violations(pod)
        check(not bad, f"{where}: the pod meets the restricted Pod Security Standard {bad}")
    docs = {d["kind"]: d for d in yaml.safe_load_all(open(MANIFEST)) if d}
    check(set(docs) == {"PersistentVolumeClaim", "Deployment", "Service"},
          f"the manifest has a PVC, a Deployment and a Service ({sorted(docs)})")
    dep = docs["Deployment"]["spec"]
    check(dep["replicas"] == 1 and dep["strategy"]["type"] == "Recreate",
          "one replica, Recreate: the SQLite state has one writer")
    pod = dep["template"]["spec"]
    check(dep["selector"]["matchLabels"].items() <= dep["template"]["metadata"]["labels"].items()
          and docs["Service"]["spec"]["selector"].items()
          <= dep["template"]["metadata"]["labels"].items(),
          "the Deployment's and the Service's selectors match the pod's labels")
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    argv, token_path = entrypoint_command()
    grpc_port = int(argv[argv.index("--grpc-addr") + 1].rsplit(":", 1)[1])
    http_port = int(argv[argv.index("--http-addr") + 1].rsplit(":", 1)[1])
    check(ports == {"grpc": grpc_port, "http": http_port},
          f"the container's ports are the entry point's ({ports})")
    check(all(p["targetPort"] in ports for p in docs["Service"]["spec"]["ports"]),
          "the Service targets the container's named ports")
    rp, lp, sp = c["readinessProbe"], c["livenessProbe"], c["startupProbe"]
    for name, probe in (("readiness", rp), ("liveness", lp)):
        check(probe["httpGet"]["path"] == "/healthz" and probe["httpGet"]["port"] in ports,
              f"{name}: GET /healthz on the HTTP port (no token needed there)")
    check(sp["tcpSocket"]["port"] == "grpc", "startup: the gRPC port accepts connections")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for flag in ("--state-dir", "--data-root", "--runs-root"):
        path = argv[argv.index(flag) + 1]
        check(path in mounts and mounts[path]["name"] == "state",
              f"the entry point's {flag} {path} is on the persistent volume")
    check(docs["PersistentVolumeClaim"]["metadata"]["name"] in
          [v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]],
          "the pod mounts the manifest's PVC")
    tm = mounts.get(token_path, {})
    secret_vol = [v for v in pod["volumes"] if v["name"] == tm.get("name")]
    check(bool(secret_vol) and "secret" in secret_vol[0] and tm.get("readOnly"),
          f"the token is a Secret mounted read-only at {token_path}, where the entry point "
          "reads it")
    grace = float(argv[argv.index("--grace") + 1])
    tgps = pod["terminationGracePeriodSeconds"]
    check(tgps > grace, f"terminationGracePeriodSeconds {tgps} outlasts ztraind's --grace {grace:g}")

    with tempfile.TemporaryDirectory() as tmp:
        token = "k8s-secret-token"
        mapped = {}
        for path in list(mounts):
            local = os.path.join(tmp, path.strip("/").replace("/", "_"))
            if path == token_path:
                with open(local, "w") as f:
                    f.write(token + "\n")
            else:
                os.makedirs(local, exist_ok=True)
            mapped[path] = local
        # The entry point's command as the pod runs it: its own flags, the token file it finds,
        # then the container's args. Ports: free ones, still on every address as in the pod.
        cmd = [os.path.join(BUILD, "ztraind")]
        for a in argv[1:]:
            a = mapped.get(a, a)
            a = a.replace("/usr/share/ztrain/web", os.path.join(SRC, "web"))
            a = re.sub(r"^0\.0\.0\.0:\d+$", "0.0.0.0:0", a)
            cmd.append(a)
        cmd = cmd[:1] + ["--token-file", mapped[token_path]] + cmd[1:] + c["args"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZTRAIN_")}
        log = open(os.path.join(tmp, "ztraind.log"), "w+")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            m = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and p.poll() is None and not m:
                log.seek(0)
                m = re.search(r"ready grpc=\S+:(\d+) http=http://\S+:(\d+)", log.read())
                time.sleep(0.1)
            log.seek(0)
            check(m is not None, "ztraind starts with the pod's command line "
                  + ("" if m else log.read()[-2000:]))
            if m:
                g, h = int(m.group(1)), int(m.group(2))
                import socket
                with socket.create_connection(("127.0.0.1", g), timeout=10):
                    check(True, "startup: the gRPC port accepts a TCP connection")
                # What a gRPC probe would meet: with a token, the health check needs it too.
                with grpc.insecure_channel(f"127.0.0.1:{g}") as ch:
                    call = ch.unary_unary("/grpc.health.v1.Health/Check",
                                          request_serializer=lambda b: b,
                                          response_deserializer=lambda b: b)
                    # HealthCheckRequest{} is empty; HealthCheckResponse{status: SERVING} is
                    # field 1, varint 1.
                    got = call(b"", timeout=10, metadata=[("authorization", "Bearer " + token)])
                    check(got == b"\x08\x01", "grpc.health.v1 Check with the token: SERVING")
                check(http_status(h, "/healthz", f"10.244.1.7:{http_port}") == 200,
                      "liveness: /healthz answers the kubelet (Host: the pod's address)")
                check(http_status(h, "/api/v1/jobs", f"ztraind:{http_port}") == 401,
                      "through the Service without the token: 401")
                check(http_status(h, "/api/v1/jobs", f"ztraind:{http_port}", token) == 200,
                      "through the Service (Host: ztraind) with the Secret's token: 200")
                check(http_status(h, "/api/v1/jobs", f"elsewhere:{http_port}", token) == 421,
                      "another name is 421: the --http-host arg is what lets the Service in")
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=tgps)
            except subprocess.TimeoutExpired:
                rc = "still running"
            check(rc == 0, f"SIGTERM stops it with exit 0 within terminationGracePeriodSeconds "
                           f"(exit {rc} after {time.monotonic() - t0:.1f} s)")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    ck.finish()


if __name__ == "__main__":
    main()
