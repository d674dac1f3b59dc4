"""Idempotency keys are each token's own (security.md, "Roles"), with a real ztraind, two submit
tokens (A, B) and grpcio and HTTP clients.

  a. A submits with key "nightly-1": a new job. A's retry (same key, same spec) returns that job,
     over gRPC and over HTTP (Idempotency-Key header): the AIP-155 promise, unchanged.
  b. B submits the same spec with the same key: a new job of B's own (its submitter is B's
     identity, "sha256:" and 16 hex digits of B's SHA-256, computed here with hashlib), not A's.
     On main B got A's job back, and A could then cancel the job B believed it had submitted.
  c. B submits another spec with A's other key "nightly-2": taken as a new job. On main it was
     ALREADY_EXISTS naming A's job: a token that guessed another's keys could block its submits.
  d. Each token's retry still answers its own job, and another spec under its own key is still
     ALREADY_EXISTS."""
import hashlib
import json
import os
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, LONG, Checker, Daemon, spec_proto, stubs, temp_dir, tiny_job  # noqa: E402

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
A, B = "a" * 24 + "1", "b" * 24 + "2"


def identity(token):
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:16]


def grpc_submit(d, job, token, key):
    try:
        j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec_proto(job), idempotency_key=key),
                               metadata=[("authorization", f"Bearer {token}")], timeout=30)
        return "OK", j.id, j.submitter
    except grpc.RpcError as e:
        return e.code().name, e.details(), ""


def http_submit(d, job, token, key):
    req = urllib.request.Request(d.http_url + "/api/v1/jobs", method="POST",
                                 data=json.dumps({"spec": job}).encode(),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json",
                                          "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            j = json.load(r)
            return "OK", j["id"], j.get("submitter", "")
    except urllib.error.HTTPError as e:
        return str(e.code), e.read().decode(errors="replace"), ""


tmp = temp_dir("ztrain-idem-tokens-")
tokens = os.path.join(tmp, "tokens")
with open(tokens, "w") as f:
    f.write(f"{A} submit\n{B} submit\n")
with Daemon(BUILD, tmp, extra_args=["--token-file", tokens, "--max-jobs", "20"]) as d:
    job = tiny_job(d.data_root, name="nightly", max_steps=LONG)
    other = tiny_job(d.data_root, name="other", max_steps=LONG, seed=7)

    first = grpc_submit(d, job, A, "nightly-1")
    ck.check(first[0] == "OK" and first[2] == identity(A), f"a: A's submit: {first}")
    for how, fn in (("gRPC", grpc_submit), ("HTTP", http_submit)):
        again = fn(d, job, A, "nightly-1")
        ck.check(again == first, f"a: A's retry over {how} returns A's job: {again}")

    b = grpc_submit(d, job, B, "nightly-1")
    ck.check(b[0] == "OK" and b[1] != first[1] and b[2] == identity(B),
             f"b: B with A's key and spec gets a job of its own, not {first[1]}: {b}")
    a2 = grpc_submit(d, job, A, "nightly-2")
    b2 = http_submit(d, other, B, "nightly-2")
    ck.check(a2[0] == "OK" and b2[0] == "OK" and b2[1] != a2[1] and b2[2] == identity(B),
             f"c: B's other spec under A's key nightly-2 ({a2[1]}) is taken: {b2}")

    for token, mine, spec in ((A, first, job), (B, b, job)):
        for how, fn in (("gRPC", grpc_submit), ("HTTP", http_submit)):
            again = fn(d, spec, token, "nightly-1")
            ck.check(again == mine, f"d: {'A' if token == A else 'B'}'s retry over {how} "
                                    f"answers its own job {mine[1]}: {again}")
    clash = grpc_submit(d, other, B, "nightly-1")
    ck.check(clash[0] == "ALREADY_EXISTS" and b[1] in clash[1],
             f"d: another spec under B's own key is ALREADY_EXISTS naming {b[1]}: {clash}")
ck.done()
