"""A Hugging Face directory as a submitted job's model.init_from, against a real ztraind.

ztraind reads the job spec through the same function as `ztrain run`, so a directory is resolved
before any rank starts: a spec that gives only init_from and block_size is taken and trains; a
spec whose n_layer disagrees with config.json, a directory whose index names a shard that is not
there, and one whose shard is a link to a file outside the data root are INVALID_ARGUMENT naming
the field or the shard, and make no job."""
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, stubs, submit, temp_dir, tiny_job,  # noqa: E402
                 wait_state)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
L, C, V, NPOS = 2, 32, 256, 64


def gpt2_tensors():
    """GPT-2 parameters under save_pretrained's names (random values; shapes are what matter)."""
    shapes = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [NPOS, C],
              "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
    for i in range(L):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C],
                       p + "attn.c_attn.weight": [C, 3 * C], p + "attn.c_attn.bias": [3 * C],
                       p + "attn.c_proj.weight": [C, C], p + "attn.c_proj.bias": [C],
                       p + "ln_2.weight": [C], p + "ln_2.bias": [C],
                       p + "mlp.c_fc.weight": [C, 4 * C], p + "mlp.c_fc.bias": [4 * C],
                       p + "mlp.c_proj.weight": [4 * C, C], p + "mlp.c_proj.bias": [C]})
    rng = random.Random(7)
    return {k: (s, [rng.gauss(0, 0.02) for _ in range(s[0] * (s[1] if len(s) > 1 else 1))])
            for k, s in shapes.items()}


def write_shard(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (shape, values) in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_hf_dir(d, drop_second=False):
    """d/config.json, two shards and the index, as save_pretrained lays them out."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L,
                   "n_head": 2, "n_embd": C, "vocab_size": V, "n_positions": NPOS}, f)
    names = list(gpt2_tensors().items())
    halves = [dict(names[:len(names) // 2]), dict(names[len(names) // 2:])]
    weight_map = {}
    for k, part in enumerate(halves):
        shard = f"model-{k + 1:05d}-of-00002.safetensors"
        if not (drop_second and k == 1):
            write_shard(os.path.join(d, shard), part)
        weight_map.update({n: shard for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


def n_jobs(d):
    return len(d.stub().ListJobs(pb.ListJobsRequest(page_size=1000), metadata=d.metadata,
                                 timeout=30).jobs)


def main():
    tmp = temp_dir("ztrain-hf-submit-")
    with Daemon(BUILD, tmp, max_ranks=1) as d:
        write_hf_dir(os.path.join(d.data_root, "hf"))
        write_hf_dir(os.path.join(d.data_root, "hf_missing"), drop_second=True)
        # A shard that is a link to a file outside the data root (a valid one).
        outside = os.path.join(tmp, "outside")
        write_hf_dir(outside)
        linked = os.path.join(d.data_root, "hf_link")
        write_hf_dir(linked)
        shard = "model-00002-of-00002.safetensors"
        os.remove(os.path.join(linked, shard))
        os.symlink(os.path.join(outside, shard), os.path.join(linked, shard))

        job = tiny_job(d.data_root, name="from-hf", max_steps=2)
        job["model"] = {"init_from": "hf", "block_size": 32}
        try:
            j = submit(d, job)
            j = wait_state(d, j.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
            ck.check(j.state == pb.JOB_STATE_SUCCEEDED,
                     f"a spec with only init_from (a directory) and block_size is taken and "
                     f"trains: {j.state} {j.reason}")
        except grpc.RpcError as e:
            ck.check(False, f"a spec with only init_from and block_size: {e.code()} {e.details()}")

        before = n_jobs(d)
        for what, model, fragments in (
                ("n_layer disagreeing with config.json", {"init_from": "hf", "block_size": 32,
                                                          "n_layer": 3},
                 ["model.n_layer", "3", "hf/config.json", "gives 2"]),
                ("an index naming a shard that is not there",
                 {"init_from": "hf_missing", "block_size": 32},
                 ["hf_missing/model.safetensors.index.json", "model-00002-of-00002.safetensors",
                  "No such file"]),
                ("a shard linked to a file outside the data root",
                 {"init_from": "hf_link", "block_size": 32},
                 ["model.init_from", "hf_link/model-00002-of-00002.safetensors",
                  "outside the server's data root"])):
            job = tiny_job(d.data_root, name="bad-hf", max_steps=2)
            job["model"] = model
            try:
                submit(d, job)
                ck.check(False, f"{what}: the job was taken")
            except grpc.RpcError as e:
                missing = [f for f in fragments if f not in e.details()]
                ck.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and not missing,
                         f"{what}: {e.code().name}, {e.details()[:200]}"
                         + (f" (lacks {missing})" if missing else ""))
        ck.check(n_jobs(d) == before, f"the refused specs made no job ({n_jobs(d)} vs {before})")
    errors = d.sanitizer_errors()
    ck.check(not errors, f"no sanitizer report in ztraind's log: {errors}")
    ck.done()


main()
