"""Datasets of several files through ztraind: a weighted mixture of globs and a tokenizer path
reach the server (the CLI's job file, and DataSpec.mixture sent with grpcio), are resolved inside
the data root, and train; a pattern reaching out of the root, a pattern with no match and a
weight of 0 are refused naming the field.

Run: ZTRAIN_BUILD=<build dir> python3 tests/service/test_data_mixture.py
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, get_job, state_name, stubs, submit, temp_dir,  # noqa: E402
                 tiny_job, wait_state, write_data)

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()
ZTRAIN = os.path.join(BUILD, "ztrain")


def mixture_job(d, name, sources):
    job = tiny_job(d.data_root, name=name, max_steps=3)
    job["data"] = {"train": sources}
    return job


def main():
    tmp = temp_dir("ztrain-mix-")
    with Daemon(BUILD, os.path.join(tmp, "d"), max_ranks=1) as d:
        for i in range(3):
            write_data(d.data_root, f"web/part_{i}.txt", bytes(range(32, 127)) * (20 + i))
        write_data(d.data_root, "code/a.txt", b"int main(void) { return 0; }\n" * 40)
        # The smallest tokenizer.json ztrain reads (a BPE of two tokens): submit checks it.
        write_data(d.data_root, "tok.json",
                   b'{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}')
        write_data(d.data_root, "empty-tok.json", b"{}")

        # The C CLI: a job file whose data.train is a mixture, with a tokenizer path.
        job = mixture_job(d, "cli-mix", [{"path": "web/part_*.txt", "weight": 3},
                                         {"path": "code/*.txt", "weight": 1}])
        job["data"]["tokenizer"] = "tok.json"
        path = os.path.join(tmp, "job.json")
        with open(path, "w") as f:
            json.dump(job, f)
        p = subprocess.run([ZTRAIN, "submit", path, "--wait", "--server", d.grpc_addr],
                           capture_output=True, text=True, timeout=180)
        ck.check(p.returncode == 0, f"CLI submit of a mixture: {p.returncode} {p.stderr.strip()}")
        if p.returncode == 0:
            j = get_job(d, p.stdout.strip())
            mix = [(s.path, s.weight) for s in j.spec.data.mixture]
            ck.check(mix == [(os.path.join(os.path.realpath(d.data_root), "web", "part_*.txt"), 3),
                             (os.path.join(os.path.realpath(d.data_root), "code", "*.txt"), 1)],
                     f"the server resolved the mixture's paths in its data root: {mix}")
            ck.check(j.spec.data.tokenizer.endswith("/tok.json"), "the tokenizer path arrived")

        # grpcio: DataSpec.mixture directly.
        job = mixture_job(d, "grpc-mix", "unused")
        del job["data"]
        spec = pb.JobSpec(name="grpc-mix", device="cpu", deepspeed_json=json.dumps(
            tiny_job(d.data_root)["deepspeed"]))
        spec.model.CopyFrom(pb.ModelSpec(**tiny_job(d.data_root)["model"]))
        spec.train.CopyFrom(pb.TrainOptions(max_steps=3, log_interval=1))
        spec.data.CopyFrom(pb.DataSpec(mixture=[pb.DataSource(path="web/part_*.txt", weight=1),
                                                pb.DataSource(path="code/a.txt", weight=1)]))
        j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)
        j = wait_state(d, j.id, ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=120)
        ck.check(state_name(j.state) == "SUCCEEDED", f"grpc mixture job: {state_name(j.state)} "
                 f"{j.reason}")

        # Refusals.
        cases = [([{"path": "../*.txt", "weight": 1}], "data.train[0].path"),
                 ([{"path": "web/nothing_*.bin", "weight": 1}], "no file under the data root"),
                 ([{"path": "web/*/part.txt", "weight": 1}], "only the file name may be a pattern"),
                 ([{"path": "web/part_0.txt", "weight": 1}, {"path": "code/a.txt", "weight": 0}],
                  "data.train[1].weight")]
        for sources, expect in cases:
            job = mixture_job(d, "bad-mix", sources)
            with open(path, "w") as f:
                json.dump(job, f)
            p = subprocess.run([ZTRAIN, "submit", path, "--server", d.grpc_addr],
                               capture_output=True, text=True, timeout=60)
            ck.check(p.returncode != 0 and expect in p.stderr,
                     f"refused {sources}: {p.returncode} {p.stderr.strip()}")
        # A tokenizer.json ztrain cannot read is refused at submit, naming data.tokenizer.
        job = mixture_job(d, "bad-tok", "code/a.txt")
        job["data"]["tokenizer"] = "empty-tok.json"
        with open(path, "w") as f:
            json.dump(job, f)
        p = subprocess.run([ZTRAIN, "submit", path, "--server", d.grpc_addr],
                           capture_output=True, text=True, timeout=60)
        ck.check(p.returncode != 0 and "data.tokenizer" in p.stderr
                 and "empty-tok.json" in p.stderr,
                 f"refused an unreadable data.tokenizer: {p.returncode} {p.stderr.strip()}")
        try:
            submit(d, mixture_job(d, "glob-out", "../../*"))
            ck.check(False, "a data.train glob outside the data root was accepted")
        except grpc.RpcError as e:
            ck.check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "data.train" in e.details(),
                     f"glob outside the root: {e.code()} {e.details()}")
    ck.done()


if __name__ == "__main__":
    main()
