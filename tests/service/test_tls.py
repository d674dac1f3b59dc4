"""TLS on both of ztraind's ports, with certificates made here by `openssl`: a CA, a server
certificate for 127.0.0.1 and localhost (subjectAltName), a client certificate, and a second CA
with a client certificate of its own that ztraind must not trust.

  a. Bad TLS files stop ztraind at start, non-zero, with a message naming the flag and the file:
     a missing certificate, a key that is not the certificate's, a key file without a key, a
     client CA file without a certificate; --tls-cert without --tls-key is bad usage (2).
  b. --tls-cert/--tls-key: grpcio over ssl_channel_credentials submits a job that SUCCEEDS; the
     C CLI with --tls-ca (and with ZTRAIN_TLS_CA) lists it; a plaintext grpcio client and a
     plaintext CLI fail (the CLI saying to give --tls-ca); a client trusting another CA fails
     verification (grpcio, the CLI, Python's ssl); HTTPS GET /api/v1/jobs with the CA lists the
     job, and plain HTTP on that port gets no HTTP answer.
  c. --tls-client-ca: a gRPC client without a certificate, or with one another CA signed, is
     refused; with its certificate it is served (grpcio and the CLI). HTTPS the same: no
     certificate or a foreign one is 403 naming the client certificate, its own is 200.
  d. The TLS hint is for a first call only: a `ztrain watch` whose plaintext ztraind is SIGKILLed
     mid-stream and started again on the same state and ports says it is reconnecting, follows
     the job on the new daemon, and blames no TLS, while b's first call to a TLS server without
     --tls-ca still gets the hint.
  b and c also drive the Python client (ztrain.Client) over TLS: tls=the CA's path (str or
  pathlib.Path) lists and waits for the job and reads server_version(); one trusting another CA
  is ServiceUnavailable; with mutual TLS, tls={ca, cert, key} is served and the CA alone is
  refused."""
import http.client
import json
import os
import pathlib
import socket
import ssl
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, SOURCE, Checker, Daemon, error_of, state_name, stubs,  # noqa: E402
                 temp_dir, tiny_job, spec_proto, wait_state, wait_step)
# The Python client from the source tree, as clients/python/README.md runs it.
sys.path.insert(0, os.path.join(SOURCE, "clients", "python"))
import ztrain  # noqa: E402

pb, rpc, health_pb, health_rpc = stubs()
ck = Checker()
ZTRAIN = os.path.join(BUILD, "ztrain")


# ---- certificates -------------------------------------------------------------------------------

def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def make_ca(d, name):
    key, cert = os.path.join(d, f"{name}.key"), os.path.join(d, f"{name}.pem")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN=ztrain test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return key, cert


def make_leaf(d, name, ca_key, ca_cert, extensions):
    """A certificate signed by the CA, for a new P-256 key; returns (cert, key) paths."""
    key, csr, cert = (os.path.join(d, f"{name}.{x}") for x in ("key", "csr", "pem"))
    ext = write(os.path.join(d, f"{name}.ext"),
                "basicConstraints=CA:FALSE\nsubjectKeyIdentifier=hash\n"
                "authorityKeyIdentifier=keyid\n" + extensions)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    openssl("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
            "-out", cert, "-days", "2", "-extfile", ext)
    return cert, key


class Certs:
    def __init__(self, d):
        ca_key, self.ca = make_ca(d, "ca")
        other_key, self.other_ca = make_ca(d, "other-ca")
        self.server, self.server_key = make_leaf(
            d, "server", ca_key, self.ca,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
        self.client, self.client_key = make_leaf(d, "client", ca_key, self.ca,
                                                 "extendedKeyUsage=clientAuth\n")
        self.foreign, self.foreign_key = make_leaf(d, "foreign-client", other_key, self.other_ca,
                                                   "extendedKeyUsage=clientAuth\n")

    def tls_args(self, client_ca=False):
        a = ["--tls-cert", self.server, "--tls-key", self.server_key]
        return a + (["--tls-client-ca", self.ca] if client_ca else [])


def read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- clients ------------------------------------------------------------------------------------

def secure_stub(d, ca, cert=None, key=None):
    creds = grpc.ssl_channel_credentials(root_certificates=read(ca),
                                         private_key=read(key) if key else None,
                                         certificate_chain=read(cert) if cert else None)
    ch = grpc.secure_channel(d.grpc_addr, creds)
    return ch, rpc.TrainerStub(ch)


def rpc_error(fn):
    """(status code, details) of a call that should fail; (None, "") when it succeeded."""
    try:
        fn()
        return None, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def list_jobs(stub):
    return stub.ListJobs(pb.ListJobsRequest(), timeout=10)


def client_sees(d, tls, job_id):
    """(jobs listed, job_id's state after wait(), server_version()) through ztrain.Client with
    that tls; the error's repr in their place when a call fails."""
    try:
        with ztrain.Client(d.grpc_addr, tls=tls, timeout=10) as c:
            return ([j.id for j in c.list()], ztrain.state_name(c.wait(job_id, 120).state),
                    c.server_version())
    except ztrain.ZtrainError as e:
        return repr(e), None, None


def cli(args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("ZTRAIN_")}
    e.update(env or {})
    p = subprocess.run([ZTRAIN, *args], capture_output=True, text=True, env=e, timeout=60)
    return p.returncode, p.stdout, p.stderr


def https_get(d, path, ca, cert=None, key=None):
    """(status, body) of GET path over HTTPS, verifying the server against ca."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    c = http.client.HTTPSConnection("127.0.0.1", d.http_port, context=ctx, timeout=20)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


# ---- cases --------------------------------------------------------------------------------------

def case_bad_files(certs, tmp):
    """a. ztraind refuses to start, naming the flag and the file."""
    missing = os.path.join(tmp, "no-such.pem")
    not_a_key = write(os.path.join(tmp, "not-a-key.pem"), "hello\n")
    cases = [
        ("a missing certificate", ["--tls-cert", missing, "--tls-key", certs.server_key],
         1, ["--tls-cert", missing]),
        ("a key that is not the certificate's", ["--tls-cert", certs.server, "--tls-key",
                                                 certs.client_key],
         1, ["--tls-key", certs.client_key, "--tls-cert", certs.server]),
        ("a key file without a key", ["--tls-cert", certs.server, "--tls-key", not_a_key],
         1, ["--tls-key", not_a_key]),
        ("a missing key", ["--tls-cert", certs.server, "--tls-key", missing],
         1, ["--tls-key", missing]),
        ("a client CA file without a certificate", certs.tls_args() + ["--tls-client-ca",
                                                                       certs.server_key],
         1, ["--tls-client-ca", certs.server_key]),
        ("--tls-cert without --tls-key", ["--tls-cert", certs.server], 2, ["--tls-key"]),
    ]
    for what, args, want_rc, named in cases:
        state = os.path.join(tmp, "state-bad")
        p = subprocess.run([os.path.join(BUILD, "ztraind"), "--grpc-addr", "127.0.0.1:0",
                            "--http-addr", "127.0.0.1:0", "--state-dir", state, *args],
                           capture_output=True, text=True, timeout=30)
        err = p.stderr.strip()
        ck.check(p.returncode == want_rc and all(n in err for n in named) and
                 "ready" not in p.stdout,
                 f"a: {what}: ztraind exits {p.returncode} (want {want_rc}) naming "
                 f"{' '.join(os.path.basename(n) for n in named)} ({err.splitlines()[-1][:150]})")


def case_server_tls(certs, tmp):
    """b. TLS without client certificates."""
    with Daemon(BUILD, temp_dir("ztrain-tls-b-"), extra_args=certs.tls_args()) as d:
        ready = [l for l in d.log().splitlines() if "ready" in l][-1]
        ck.check(f"http=https://127.0.0.1:{d.http_port}" in ready and "tls=on" in ready,
                 f"b: the ready line names https and tls=on ({ready[:120]}...)")
        ch, stub = secure_stub(d, certs.ca)
        job = stub.SubmitJob(pb.SubmitJobRequest(spec=spec_proto(
            tiny_job(d.data_root, name="over-tls", max_steps=10))), timeout=30)
        for _ in stub.WatchJob(pb.WatchJobRequest(id=job.id), timeout=120):
            pass
        state = state_name(stub.GetJob(pb.GetJobRequest(id=job.id), timeout=10).state)
        ck.check(state == "SUCCEEDED",
                 f"b: grpcio over TLS (ssl_channel_credentials) submits {job.id} and it ends "
                 f"{state}")
        hs = health_rpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(), timeout=10)
        ck.check(hs.status == health_pb.HealthCheckResponse.SERVING,
                 "b: grpc.health.v1 Check over TLS is SERVING")
        ch.close()
        for tls in (certs.ca, {"ca": pathlib.Path(certs.ca)}):
            ids, state, version = client_sees(d, tls, job.id)
            ck.check(isinstance(ids, list) and job.id in ids and state == "SUCCEEDED" and
                     version == ztrain.__version__,
                     f"b: ztrain.Client(tls={tls!r}) lists and waits for {job.id} and reads "
                     f"the server's version ({ids}, {state}, {version!r})")
        ids, _, _ = client_sees(d, certs.other_ca, job.id)
        ck.check("ServiceUnavailable" in str(ids),
                 f"b: ztrain.Client trusting another CA fails verification ({ids})")

        rc, out, err = cli(["list", "--server", d.grpc_addr, "--tls-ca", certs.ca])
        ck.check(rc == 0 and job.id in out and "SUCCEEDED" in out,
                 f"b: ztrain list --tls-ca lists {job.id} SUCCEEDED (exit {rc}, {err.strip()})")
        rc, out, err = cli(["status", job.id, "--server", d.grpc_addr],
                           env={"ZTRAIN_TLS_CA": certs.ca})
        ck.check(rc == 0 and "SUCCEEDED" in out,
                 f"b: ztrain status with ZTRAIN_TLS_CA (exit {rc}, {err.strip()})")
        # The certificate's DNS name, not only its address. (grpcio here: gRPC's C resolver
        # leaks a few bytes per name lookup, which a sanitizer build of the CLI reports.)
        creds = grpc.ssl_channel_credentials(root_certificates=read(certs.ca))
        with grpc.secure_channel(f"localhost:{d.grpc_port}", creds) as ch:
            got = rpc.TrainerStub(ch).GetJob(pb.GetJobRequest(id=job.id), timeout=10)
        ck.check(got.id == job.id, "b: a client at localhost:PORT verifies the DNS name")

        plain = grpc.insecure_channel(d.grpc_addr)
        code, details = rpc_error(lambda: list_jobs(rpc.TrainerStub(plain)))
        plain.close()
        ck.check(code == grpc.StatusCode.UNAVAILABLE,
                 f"b: a plaintext grpcio client is not served ({code}: {details[-60:]})")
        rc, out, err = cli(["list", "--server", d.grpc_addr])
        ck.check(rc == 1 and "UNAVAILABLE" in err and "--tls-ca" in err,
                 f"b: the plaintext CLI fails saying to give --tls-ca (exit {rc}, "
                 f"{err.strip()[-120:]})")

        ch, stub = secure_stub(d, certs.other_ca)
        code, details = rpc_error(lambda: list_jobs(stub))
        ch.close()
        ck.check(code == grpc.StatusCode.UNAVAILABLE and "certificate verify failed" in details,
                 f"b: grpcio trusting another CA fails verification ({code}: {details[-60:]})")
        rc, out, err = cli(["list", "--server", d.grpc_addr, "--tls-ca", certs.other_ca])
        ck.check(rc == 1 and "certificate verify failed" in err and "--tls-ca" in err,
                 f"b: the CLI with the wrong --tls-ca fails verification (exit {rc}, "
                 f"{err.strip()[-140:]})")

        status, body = https_get(d, "/api/v1/jobs", certs.ca)
        ids = [j["id"] for j in json.loads(body).get("jobs", [])] if status == 200 else []
        ck.check(status == 200 and job.id in ids,
                 f"b: HTTPS GET /api/v1/jobs verified with the CA lists {job.id} ({status})")
        try:
            https_get(d, "/api/v1/jobs", certs.other_ca)
            verified = "it was served"
        except ssl.SSLCertVerificationError as e:
            verified = f"refused: {e.verify_message}"
        ck.check(verified.startswith("refused"),
                 f"b: HTTPS trusting another CA fails verification ({verified})")
        c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=20)
        try:
            c.request("GET", "/api/v1/jobs")
            r = c.getresponse()
            answer = f"HTTP {r.status} {r.read()[:60]!r}"
        except (http.client.HTTPException, OSError) as e:
            answer = f"no HTTP answer ({type(e).__name__})"
        finally:
            c.close()
        ck.check(answer.startswith("no HTTP answer"),
                 f"b: plain HTTP on the TLS port gets {answer}")
        rc = d.stop()
    ck.check(rc == 0 and not d.sanitizer_errors(),
             f"b: ztraind stops with 0 ({rc}) {d.sanitizer_errors()}")


def case_mutual_tls(certs, tmp):
    """c. --tls-client-ca: client certificates required on both ports."""
    with Daemon(BUILD, temp_dir("ztrain-tls-c-"), extra_args=certs.tls_args(client_ca=True)) as d:
        ck.check("tls=mutual" in d.log(), "c: the ready line says tls=mutual")
        for what, cert, key in (("without a certificate", None, None),
                                ("with a certificate of another CA", certs.foreign,
                                 certs.foreign_key)):
            ch, stub = secure_stub(d, certs.ca, cert, key)
            code, details = rpc_error(lambda: list_jobs(stub))
            ch.close()
            ck.check(code == grpc.StatusCode.UNAVAILABLE,
                     f"c: a gRPC client {what} is refused ({code}: {details[-60:]})")
        ch, stub = secure_stub(d, certs.ca, certs.client, certs.client_key)
        job = stub.SubmitJob(pb.SubmitJobRequest(spec=spec_proto(
            tiny_job(d.data_root, name="mutual", max_steps=2))), timeout=30)
        got = [j.id for j in list_jobs(stub).jobs]
        ch.close()
        ck.check(job.id in got, f"c: with its client certificate it submits and lists {job.id}")
        mutual = {"ca": certs.ca, "cert": certs.client, "key": certs.client_key}
        ids, state, version = client_sees(d, mutual, job.id)
        ck.check(isinstance(ids, list) and job.id in ids and state == "SUCCEEDED" and
                 version == ztrain.__version__,
                 f"c: ztrain.Client with tls ca, cert and key lists and waits for {job.id} "
                 f"({ids}, {state}, {version!r})")
        ids, _, _ = client_sees(d, certs.ca, job.id)
        ck.check("ServiceUnavailable" in str(ids),
                 f"c: ztrain.Client without its certificate is refused ({ids})")

        rc, out, err = cli(["list", "--server", d.grpc_addr, "--tls-ca", certs.ca])
        ck.check(rc == 1 and "--tls-cert" in err,
                 f"c: the CLI without a certificate is refused, saying to give --tls-cert "
                 f"(exit {rc}, {err.strip()[-110:]})")
        rc, out, err = cli(["list", "--server", d.grpc_addr, "--tls-ca", certs.ca, "--tls-cert",
                            certs.client, "--tls-key", certs.client_key])
        ck.check(rc == 0 and job.id in out,
                 f"c: the CLI with --tls-cert/--tls-key lists {job.id} (exit {rc}, {err.strip()})")
        rc, out, err = cli(["list", "--server", d.grpc_addr],
                           env={"ZTRAIN_TLS_CA": certs.ca, "ZTRAIN_TLS_CERT": certs.client,
                                "ZTRAIN_TLS_KEY": certs.client_key})
        ck.check(rc == 0 and job.id in out,
                 f"c: ... and with ZTRAIN_TLS_CA/CERT/KEY (exit {rc}, {err.strip()})")

        status, body = https_get(d, "/api/v1/jobs", certs.ca)
        ck.check(status == 403 and "client certificate" in error_of(body) and
                 job.id.encode() not in body,
                 f"c: HTTPS without a client certificate is 403 ({status} {error_of(body)!r})")
        status, body = https_get(d, "/healthz", certs.ca, certs.foreign, certs.foreign_key)
        ck.check(status == 403 and "client certificate" in error_of(body),
                 f"c: HTTPS with another CA's client certificate is 403 ({status} "
                 f"{error_of(body)!r})")
        status, body = https_get(d, "/api/v1/jobs", certs.ca, certs.client, certs.client_key)
        ck.check(status == 200 and job.id.encode() in body,
                 f"c: HTTPS with the client certificate lists {job.id} ({status})")
        rc = d.stop()
    ck.check(rc == 0 and not d.sanitizer_errors(),
             f"c: ztraind stops with 0 ({rc}) {d.sanitizer_errors()}")


def watch_across_kill(d):
    """Watches a running job while ztraind is SIGKILLed and started again on the same state and
    ports, then cancels the job (whether recovery resumed or failed it); returns the watch's
    (exit status, stdout, stderr)."""
    job = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(
        tiny_job(d.data_root, name="killed-mid-watch", max_steps=LONG))),
        metadata=d.metadata, timeout=30)
    wait_step(d, job.id, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZTRAIN_")}
    watcher = subprocess.Popen([ZTRAIN, "watch", job.id, "--server", d.grpc_addr],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        # A first line: the daemon has answered on the watch's stream. The pause lets the
        # connection go quiet, so that the kernel closes the dead daemon's socket with a FIN
        # ("Socket closed", what a TLS server's close looks like) rather than a reset.
        first = watcher.stdout.readline()
        time.sleep(0.5)
        d.kill()
        time.sleep(1)
        d.start()
        wait_state(d, job.id, {"RUNNING", "QUEUED", "SUCCEEDED", "FAILED", "CANCELLED"})
        rpc_error(lambda: d.stub().CancelJob(pb.CancelJobRequest(id=job.id),
                                              metadata=d.metadata, timeout=10))
        out, err = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    return watcher.returncode, first + out, err


def case_killed_daemon(tmp):
    """d. A plaintext daemon killed mid-watch: a restart, not a TLS server."""
    with Daemon(BUILD, temp_dir("ztrain-tls-d-")) as d:
        # A reset instead of a clean close would not be the case the hint is for: try again (a
        # loaded machine leaves the daemon's socket unread more often, which makes a reset).
        for attempt in range(6):
            rc, out, err = watch_across_kill(d)
            if "Socket closed" in err:
                break
        ck.check("Socket closed" in err and "reconnecting" in err and rc in (1, 3),
                 f"d: watch follows its job across a SIGKILLed ztraind, reconnecting after the "
                 f"socket closed (exit {rc}, attempt {attempt + 1}; {err.strip()[-250:]})")
        ck.check("TLS" not in err and "--tls-ca" not in err,
                 f"d: the reconnect line after the daemon answered blames no TLS "
                 f"({err.strip()[-300:]})")


def main():
    tmp = temp_dir("ztrain-tls-")
    certs = Certs(tmp)
    case_bad_files(certs, tmp)
    case_server_tls(certs, tmp)
    case_mutual_tls(certs, tmp)
    case_killed_daemon(tmp)
    ck.done()


if __name__ == "__main__":
    socket.setdefaulttimeout(60)
    main()
