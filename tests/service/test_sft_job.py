"""Loss-masked data through ztraind: DataSpec.format "masked" submitted over gRPC and over the
HTTP-visible job (proto3 JSON) reaches the ranks, which read the token file's .mask from the data
root; the records carry train/trained_tokens (the mask's count, known here) beside train/tokens;
the same data without its .mask is refused naming the file; an unknown format is refused naming
the field.

Run: ZTRAIN_BUILD=<build dir> python3 tests/service/test_sft_job.py
"""
import json
import os
import struct
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_view import view  # noqa: E402
from svc import (BUILD, Checker, Daemon, get_job, state_name, submit, temp_dir,  # noqa: E402
                 tiny_job, wait_state, write_data)

import grpc  # noqa: E402

ck = Checker()
T, B = 32, 2


def token_file(tokens):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    return struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)


def mask_file(flags):
    header = [0] * 256
    header[0], header[1], header[2] = 20261204, 1, len(flags)
    return struct.pack("<256i", *header) + bytes(flags)


def http_get(d, path):
    with urllib.request.urlopen(d.http_url + path, timeout=30) as r:
        return view(path, json.loads(r.read()))


def main():
    tmp = temp_dir("ztrain-sft-")
    n = 4 * T + 1
    tokens = [(7 * i) % 256 for i in range(n)]
    flags = [1 if (i // 5) % 2 else 0 for i in range(n)]
    # One step of one micro-batch of B windows: its targets are tokens 1..B·T.
    want_trained = sum(flags[1:B * T + 1])
    with Daemon(BUILD, os.path.join(tmp, "d"), max_ranks=1) as d:
        write_data(d.data_root, "sft.bin", token_file(tokens))
        write_data(d.data_root, "sft.bin.mask", mask_file(flags))
        write_data(d.data_root, "plain.bin", token_file(tokens))
        job = tiny_job(d.data_root, name="sft", max_steps=1)
        job["data"] = {"train": "sft.bin", "format": "masked", "shuffle": False}
        r = submit(d, job)
        j = wait_state(d, r.id, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=120)
        ck.check(state_name(j.state) == "SUCCEEDED", f"masked job: {state_name(j.state)} "
                 f"{j.reason}")
        ck.check(get_job(d, r.id).spec.data.format == "masked", "DataSpec.format kept")
        body = http_get(d, f"/api/v1/jobs/{r.id}")
        ck.check(body.get("spec", {}).get("data", {}).get("format") == "masked",
                 f"HTTP job JSON has data.format: {body.get('spec', {}).get('data')}")
        recs = http_get(d, f"/api/v1/jobs/{r.id}/records").get("records", [])
        last = recs[-1] if recs else {}
        vals = last.get("values", last)
        ck.check(vals.get("train/trained_tokens") == want_trained and
                 vals.get("train/tokens") == B * T,
                 f"records: trained_tokens {vals.get('train/trained_tokens')} of "
                 f"{vals.get('train/tokens')} (want {want_trained} of {B * T})")

        job["name"], job["data"]["train"] = "no-mask", "plain.bin"
        try:
            r = submit(d, job)
            j = wait_state(d, r.id, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=120)
            err = j.reason
        except grpc.RpcError as e:
            err = e.details()
        ck.check("plain.bin.mask" in err, f"data without its .mask: {err[:200]}")

        job["name"], job["data"]["format"] = "bad-format", "chat"
        try:
            submit(d, job)
            err = ""
        except grpc.RpcError as e:
            err = e.details()
        ck.check("data.format" in err and "chat" in err, f"unknown format: {err[:200]}")
    ck.done()


main()
