"""Checkpoints across ranks: resuming with the same number of ranks is bit-exact; resuming on a
different number (4 -> 2 at stage 1, 2 -> 3 at stage 3) re-partitions the optimizer state
directly and continues within 1e-5 of the uninterrupted run; `ztrain zero-to-fp32` writes the
consolidated weights, equal to a single-rank run's; a job whose model differs from the
checkpoint's is refused with the differing field named, and so is an optimizer partition file
whose partition_offset does not continue the partitions before it."""
import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, rel_err, run, st_read, tool, write_job  # noqa: E402

GLOBAL, STEPS = 12, 10


def job(world, stage, ckpt, resume=False, bench_steps=0):
    return {
        "name": f"resume{stage}-n{world}", "world_size": world,
        "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                  "block_size": 32},
        "data": {"train": "train.txt", "shuffle": True},
        "train": {"max_steps": STEPS, "log_interval": 1, "checkpoint_dir": ckpt, "resume": resume,
                  "bench_steps": bench_steps, "seed": 11},
        "deepspeed": {"train_batch_size": GLOBAL, "train_micro_batch_size_per_gpu": GLOBAL // world,
                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}},
                      "scheduler": {"type": "WarmupDecayLR",
                                    "params": {"warmup_num_steps": 3, "total_num_steps": STEPS}},
                      "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000}}}


def ztrain(d, name, spec, out):
    write_job(f"{d}/{name}.json", spec)
    return run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{out}"])


def losses(d, out):
    return [m["train/loss"] for m in read_metrics(f"{d}/{out}/metrics.jsonl")]


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 5 + i // 11) % 241 for i in range(20000)))
    ztrain(d, "single", job(1, 0, "ck-single"), "single")
    single = losses(d, "single")
    for name, first, second, stage, exact in [("same N", 2, 2, 2, True),
                                              ("4 -> 2", 4, 2, 1, False),
                                              ("2 -> 3", 2, 3, 3, False)]:
        full = f"full{first}{stage}"
        ztrain(d, full, job(first, stage, f"ck-{full}"), full)
        split = f"split{first}{second}{stage}"
        ztrain(d, split + "a", job(first, stage, f"ck-{split}", bench_steps=5), split)
        p = ztrain(d, split + "b", job(second, stage, f"ck-{split}", resume=True), split)
        ck.check("resumed from" in p.stdout, f"{name}: the second run resumed")
        a, b = losses(d, full), losses(d, split)
        ck.check(len(b) == STEPS, f"{name}: metrics for steps 1..{STEPS}")
        if exact:
            ck.check(a == b, f"{name} (stage {stage}): losses bit-identical to the uninterrupted run")
        else:
            worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
            ck.check(worst < 1e-5, f"{name} (stage {stage}): losses within {worst:.1e} of the uninterrupted run")
        worst = max(abs(x - y) / abs(x) for x, y in zip(single, b))
        ck.check(worst < 1e-5, f"{name}: and within {worst:.1e} of the single-rank run")
        run([tool("ztrain"), "zero-to-fp32", f"{d}/ck-{split}", f"{d}/{split}.safetensors"])
        run([tool("ztrain"), "zero-to-fp32", f"{d}/ck-single", f"{d}/single.safetensors"])
        got, _ = st_read(f"{d}/{split}.safetensors")
        ref, _ = st_read(f"{d}/single.safetensors")
        err, tensor = max((rel_err(got[k], ref[k]), k) for k in ref)
        ck.check(err < 1e-5, f"{name}: zero-to-fp32 weights equal the single-rank run's (worst {tensor} {err:.1e})")
    # A job whose model differs from the checkpoint's is refused, naming the field and its value.
    for field, value in [("n_embd", 64), ("block_size", 16)]:
        spec = job(1, 0, "ck-single", resume=True)
        spec["model"][field] = value
        write_job(f"{d}/other.json", spec)
        p = run([tool("ztrain"), "run", f"{d}/other.json", "--out", f"{d}/other"], check=False)
        want = ("ck-single/global_step10: checkpoint holds a GPT-2 (n_layer 2, n_head 2, n_embd 32, "
                f"vocab_size 256, block_size 32) model, but the job's model has {field} {value}")
        ck.check(p.returncode != 0 and want in p.stderr,
                 f"resuming with {field} {value}: exit {p.returncode}, message names the field "
                 f"({p.stderr.strip()[-300:]})")
    # The optimizer partitions tile the flat parameters in rank order, as ZeRO partitions them
    # (rank r's starts where rank r - 1's ends). A file whose partition_offset says otherwise
    # (damaged, or taken from another checkpoint) is refused naming it: its state would land on
    # the wrong parameters, and the parameters it should cover would keep the fresh state.
    def set_metadata(path, key, value):
        with open(path, "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        if value is None:
            header["__metadata__"].pop(key)
        else:
            header["__metadata__"][key] = value
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + raw[8 + n:])

    tagdir = f"{d}/ck-damaged/global_step10"
    # 2 ranks' partitions on 1 rank: rank 1's claiming rank 0's place used to load unnoticed
    # (its values counted as covering the rank's whole range). 4 ranks' on 2: rank 2's claiming
    # rank 1's place, none, or not a number.
    for what, saved, world, rank, value in [
            ("rank 0's offset, on 1 rank", "ck-full22", 1, 1, "0"),
            ("rank 1's offset, on 2 ranks", "ck-full41", 2, 2, "rank1"),
            ("no offset", "ck-full41", 2, 2, None), ("not a number", "ck-full41", 2, 2, "x")]:
        shutil.rmtree(f"{d}/ck-damaged", ignore_errors=True)
        shutil.copytree(f"{d}/{saved}", f"{d}/ck-damaged")
        if value == "rank1":
            with open(f"{tagdir}/optim_rank_00001.safetensors", "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                value = json.loads(f.read(n))["__metadata__"]["partition_offset"]
        set_metadata(f"{tagdir}/optim_rank_{rank:05d}.safetensors", "partition_offset", value)
        spec = job(world, 1, "ck-damaged", resume=True)
        spec["train"]["max_steps"] = STEPS + 1
        write_job(f"{d}/damaged.json", spec)
        p = run([tool("ztrain"), "run", f"{d}/damaged.json", "--out", f"{d}/damaged"],
                check=False)
        ck.check(p.returncode != 0 and f"optim_rank_{rank:05d}.safetensors" in p.stderr and
                 "resumed from" not in p.stdout,
                 f"an optimizer partition with {what}: refused naming the file: "
                 f"{p.stderr.strip()[-300:]}")
ck.done()
