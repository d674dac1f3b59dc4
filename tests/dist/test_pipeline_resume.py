"""A pipelined job's checkpoints, faults and bad specs. GPT-2 in 2 stages x data parallel 2:
stopped at step 5 (bench_steps) and resumed, it reproduces steps 6-10 of the uninterrupted run
bit for bit, and `ztrain export` / `zero-to-fp32` read the per-stage checkpoint as one model with
the single-stage tensor names (the last stage's tied copy of the embedding not duplicated) and
the uninterrupted run's weights bit for bit. pipeline.json records the stages, the partition and
its boundaries (checked against the blocks each stage saved); a resume at another data-parallel
size follows the uninterrupted run, and one at another stage count, partition, without a
pipeline, or of a pipelined job on a checkpoint saved without one is refused naming the key and
leaves the checkpoint alone. A stage killed mid-schedule (SIGKILL after its first
forward, micro-batches in flight) ends the job promptly with a message naming its rank, never a
hang. Bad pipeline specs are refused naming the key, by `validate` as by `run`; ZeRO 2 with
DeepSpeed's message."""
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, run, st_read, tool, write_job  # noqa: E402

GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 16}


def job(ckpt, stages=2, world=4, resume=False, bench_steps=0, zero=1, partition="parameters"):
    return {"name": "piperes", "world_size": world, "model": GPT2,
            "data": {"train": "train.txt", "shuffle": True},
            "pipeline": {"stages": stages, "partition": partition},
            "train": {"max_steps": 10, "log_interval": 1, "checkpoint_dir": ckpt,
                      "resume": resume, "bench_steps": bench_steps, "seed": 5},
            "deepspeed": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}},
                          "gradient_clipping": 0.5,
                          "zero_optimization": {"stage": zero}}}


def train(d, name, spec, check=True, env=None, timeout=None):
    write_job(f"{d}/{name}.json", spec)
    return run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/out-{name}"],
               check=check, env=dict(os.environ, **(env or {})), timeout=timeout)


def losses(d, name):
    return [m["train/loss"] for m in read_metrics(f"{d}/out-{name}/metrics.jsonl")
            if "train/loss" in m]


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    train(d, "whole", job("ck-whole"))
    whole = losses(d, "whole")
    train(d, "half", job("ck-half", bench_steps=5))
    ck.check(len(losses(d, "half")) == 5, "the interrupted run stops after 5 steps")
    with open(f"{d}/ck-half/pipeline.json") as f:
        marker = json.load(f)
    ck.check(marker.get("stages") == 2 and marker.get("partition") == "parameters",
             f"pipeline.json records the stages and the partition: {marker}")
    # The boundaries (DeepSpeed's parts over embed, 2 blocks, head) against what each stage
    # saved: stage s holds the blocks of layers [parts[s], parts[s + 1]), layer i being block i - 1.
    parts = marker.get("parts") or [0, 0, 0]
    for s in (0, 1):
        w, _ = st_read(f"{d}/ck-half/stage_{s:02d}/global_step5/model.safetensors")
        blocks = sorted({int(k.split(".")[1]) for k in w if k.startswith("h.")})
        want = [i - 1 for i in range(parts[s], parts[s + 1]) if 1 <= i <= 2]
        ck.check(blocks == want, f"stage {s} saved blocks {blocks}; pipeline.json's parts "
                 f"{parts} say {want}")
    # Another data-parallel size resumes the same stages: dp 1 with twice the micro-batches
    # per step trains the same batches (fp32; the sums are taken in another order).
    shutil.copytree(f"{d}/ck-half", f"{d}/ck-dp1")
    spec = job("ck-dp1", world=2, resume=True)
    spec["deepspeed"]["gradient_accumulation_steps"] = 8
    train(d, "dp1", spec)
    got = losses(d, "dp1")
    ck.check(len(got) == 5 and max(abs(a - b) / abs(b) for a, b in zip(got, whole[5:])) < 1e-5,
             f"resumed at dp 1, steps 6-10 follow the uninterrupted run: {got} vs {whole[5:]}")
    # Another pipeline shape is refused naming its key, the saved and the asked values, and the
    # checkpoint is left as it was.
    shapes = [("4 stages", job("ck-half", stages=4, resume=True),
               ["pipeline.stages is 4", "pipeline of 2 stages", "set pipeline.stages to 2"]),
              ("another partition", job("ck-half", resume=True, partition="type:embed"),
               ["pipeline.partition \"type:embed\"", f"cut at {parts}",
                "set pipeline.partition to \"parameters\""]),
              ("no pipeline", {**job("ck-half", world=2, resume=True), "pipeline": None},
               ["checkpoint of a pipeline of 2 stages", "set pipeline.stages to 2"])]
    for what, spec, words in shapes:
        if spec.get("pipeline") is None:
            del spec["pipeline"]
        p = train(d, "shape", spec, check=False)
        ck.check(p.returncode != 0 and all(w in p.stderr for w in words) and
                 "delete" not in p.stderr and "does not exist" not in p.stderr,
                 f"{what}: refused naming {words}: {p.stderr.strip()[-500:]}")
    ck.check(sorted(os.listdir(f"{d}/ck-half")) == ["pipeline.json", "stage_00", "stage_01"],
             f"the refused resumes left the checkpoint alone: {os.listdir(f'{d}/ck-half')}")
    # A checkpoint saved without a pipeline is not resumed from step 0 beside itself (its
    # pipeline.json would hide it): refused naming pipeline.stages and the checkpoint.
    train(d, "plain", {**{k: v for k, v in job("ck-plain", world=2).items() if k != "pipeline"},
                       "train": {**job("ck-plain")["train"], "max_steps": 2}})
    p = train(d, "onplain", job("ck-plain", resume=True), check=False)
    ck.check(p.returncode != 0 and "pipeline.stages 2" in p.stderr and
             "saved without a pipeline" in p.stderr and "global_step2" in p.stderr,
             f"a pipelined resume on a plain checkpoint is refused: {p.stderr.strip()[-500:]}")
    ck.check(sorted(os.listdir(f"{d}/ck-plain")) == ["global_step2", "latest"],
             f"and the plain checkpoint is left alone: {os.listdir(f'{d}/ck-plain')}")
    # A job that does not resume still saves into its checkpoint_dir, where one layout beside
    # the other hides a checkpoint (pipeline.json sends every reader to the stages): refused
    # before anything is written, in both directions.
    p = train(d, "overplain", job("ck-plain"), check=False)
    ck.check(p.returncode != 0 and "saved without a pipeline" in p.stderr and
             "train.resume false" in p.stderr and "another checkpoint_dir" in p.stderr,
             f"a pipelined job without resume on a plain checkpoint is refused: "
             f"{p.stderr.strip()[-500:]}")
    spec = job("ck-half", world=2)
    del spec["pipeline"]
    p = train(d, "overpipe", spec, check=False)
    ck.check(p.returncode != 0 and "pipeline of 2 stages" in p.stderr and
             "train.resume false" in p.stderr and "another checkpoint_dir" in p.stderr,
             f"a job without a pipeline or resume on a pipeline's checkpoint is refused: "
             f"{p.stderr.strip()[-500:]}")
    ck.check(sorted(os.listdir(f"{d}/ck-plain")) == ["global_step2", "latest"] and
             sorted(os.listdir(f"{d}/ck-half")) == ["pipeline.json", "stage_00", "stage_01"],
             f"and both checkpoints are left alone: {os.listdir(f'{d}/ck-plain')}, "
             f"{os.listdir(f'{d}/ck-half')}")
    ck.check(all(os.path.exists(f"{d}/ck-half/stage_{s:02d}/global_step5/DONE") for s in (0, 1)),
             "each stage has its checkpoint of step 5")
    train(d, "half", job("ck-half", resume=True))
    got = losses(d, "half")
    ck.check(got == whole, f"resumed losses equal the uninterrupted run's bit for bit: "
             f"{got[5:]} vs {whole[5:]}")
    run([tool("ztrain"), "export", f"{d}/ck-whole", "--out", f"{d}/whole.safetensors"])
    run([tool("ztrain"), "zero-to-fp32", f"{d}/ck-half", f"{d}/half.safetensors"])
    a, meta = st_read(f"{d}/whole.safetensors")
    b, _ = st_read(f"{d}/half.safetensors")
    names = sorted(a)
    ck.check(names == sorted(["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"] +
                             [f"h.{i}.{t}" for i in range(2) for t in (
                                 "ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                                 "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                 "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                                 "mlp.c_proj.weight", "mlp.c_proj.bias")]),
             f"the export holds GPT-2's tensors once each: {names}")
    ck.check(sorted(b) == names and all((a[k] == b[k]).all() for k in names),
             "the resumed run's weights equal the uninterrupted run's bit for bit")
    ck.check(meta.get("model_type") == "gpt2", f"export metadata names the model: {meta}")

    t0 = time.time()
    p = train(d, "killed", job("ck-killed"), check=False, env={"ZTRAIN_INJECT_PIPE_KILL": "3:1"},
              timeout=120)
    took = time.time() - t0
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0 and "rank 1" in out and took < 60,
             f"a killed stage ends the job naming rank 1 in {took:.0f} s (exit {p.returncode}): "
             f"{out[-600:]}")

    bad = [({"pipeline": {"stages": 3}}, "pipeline.stages"),
           ({"pipeline": {"stages": 2, "partition": "balanced"}}, "pipeline.partition"),
           ({"pipeline": {"stages": 2, "activation_checkpoint_interval": -1}},
            "pipeline.activation_checkpoint_interval"),
           ({"pipeline": {"stages": 2, "bogus": 1}}, "bogus"),
           ({"pipeline": {"stages": 2, "partition": "type:nothing"}}, "type:nothing"),
           ({"pipeline": {"stages": 2, "partition": "type:("}}, "does not compile"),
           ({"pipeline": {"stages": 2, "partition": "type:"}}, "needs a pattern")]
    for change, key in bad:
        spec = job("ck-bad")
        spec.update(change)
        write_job(f"{d}/bad.json", spec)
        p = run([tool("ztrain"), "run", f"{d}/bad.json", "--out", f"{d}/out-bad"], check=False)
        ck.check(p.returncode != 0 and key in p.stderr,
                 f"{change} is refused naming {key}: {p.stderr.strip()[-300:]}")
        # Before any rank starts: `ztrain validate` (ztraind's admission reads it alike).
        p = run([tool("ztrain"), "validate", f"{d}/bad.json"], check=False)
        ck.check(p.returncode != 0 and key in p.stderr,
                 f"validate refuses {change} naming {key}: {p.stderr.strip()[-300:]}")
    spec = job("ck-bad", zero=2)
    write_job(f"{d}/bad.json", spec)
    p = run([tool("ztrain"), "run", f"{d}/bad.json", "--out", f"{d}/out-bad"], check=False)
    ck.check(p.returncode != 0 and
             "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in p.stderr,
             f"ZeRO 2 is refused with DeepSpeed's message: {p.stderr.strip()[-300:]}")
ck.done()
