"""What the host issues to the GPU in one training step, counted on the emulated CUDA device
(issue 28, item 5: "CUDA graphs where they pay"). A CUDA graph replaces a step's launches with one;
it pays when the host's time to issue the step's kernels, matmuls, copies, memsets, event records
and stream waits one by one is a visible part of the step, i.e. when the GPU would wait for the
host. The number of those calls depends on the model's depth and the job's shape (micro-batches,
ZeRO stage, precision), not on its widths or token counts, so the emulator counts it on models of
the benchmark's depth and head layout at two small widths, with VMM granules of 64 KiB so that
each layer's buffers span many granules as the real model's do in 2 MiB ones, and refuses counts
that differ between the widths by more than 5% (a call per granule of memory, say, which the
real widths would multiply):

    python3 bench/launch_count.py                 counts per step, printed
    python3 bench/launch_count.py --write         also bench/emu/launches-<model>.json, which
                                                  bench/perf_model.py turns into host issue time

Each model trains 2 and then 3 steps (bf16, one rank, ZeRO 0, clipping, AdamW, as
bench/bench_gpu.py's jobs) with ZTRAIN_CUDA_EMU_ISSUE_LOG set; the difference is one step from
the third on, the first's plans and scratch growth left out. Every allocation is a VMM range
(ZTRAIN_CUDA_VMM_MIN_BYTES=0), as the real models' large buffers are. Needs a build with the
emulated device (build/libztrain_cuda_emu.so); takes a few minutes on two cores."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The benchmark's models (bench/perf_model.py) at their depth and head counts, narrow (T 64, B 2),
# each at two widths. GPT-2 124M: 12 layers of 12 heads; TinyLlama 1.1B: 22 layers, 32 heads over
# 4 kv heads (MLP 2.75 × the width).
MODELS = {
    "gpt2": [{"type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": c, "vocab_size": 512,
              "block_size": 64} for c in (96, 192)],
    "llama": [{"type": "llama", "n_layer": 22, "n_head": 32, "n_kv_head": 4, "n_embd": c,
               "intermediate_size": c * 11 // 4, "vocab_size": 512, "block_size": 64,
               "tie_word_embeddings": False} for c in (128, 256)],
}
MICRO = 2

# What each issued call is, by the name the emulator records (emu_issue_log.cc): the runtime's
# and libraries' calls by name, everything else a kernel of ours.
CLASSES = {"cublasLtMatmul": "matmul", "cudaMemcpyAsync": "copy", "cudaMemcpy": "copy",
           "cudaMemsetAsync": "memset", "cudaMemset": "memset", "cudaEventRecord": "event record",
           "cudaStreamWaitEvent": "stream wait"}


def classify(name):
    if name in CLASSES:
        return CLASSES[name]
    if name.startswith("nccl") or name.startswith("ncclGroup"):
        return "nccl"
    return "kernel"


def job(model, steps):
    ds = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
          "bf16": {"enabled": True}, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}},
          "zero_optimization": {"stage": 0}}
    return {"name": f"launches-{model['type']}", "world_size": 1, "device": "cuda",
            "model": model, "data": {"train": "train.txt"},
            "train": {"max_steps": steps, "log_interval": 1, "seed": 1}, "deepspeed": ds}


def issued(build, work, model, steps):
    """{name: count} the host issued over a run of `steps` steps."""
    name = f"{model['type']}-{model['n_embd']}-{steps}"
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(job(model, steps), f)
    log = os.path.join(work, name + ".issues.json")
    env = dict(os.environ, ZTRAIN_CUDA_EMU="1", ZTRAIN_CUDA_EMU_ISSUE_LOG=log,
               ZTRAIN_CUDA_VMM_MIN_BYTES="0", ZTRAIN_CUDA_EMU_VMM_GRANULE="65536")
    p = subprocess.run([os.path.join(build, "ztrain"), "run", path, "--out",
                        os.path.join(work, name)], cwd=work, env=env, capture_output=True,
                       text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"launch_count: ztrain run {name} failed (exit {p.returncode}):\n"
                 f"{(p.stderr or p.stdout)[-2000:]}")
    with open(log) as f:
        return json.load(f)


def one_step(build, work, model):
    """One steady step's calls, by name."""
    two, three = issued(build, work, model, 2), issued(build, work, model, 3)
    names = {n: three.get(n, 0) - two.get(n, 0) for n in set(two) | set(three)}
    return {n: c for n, c in sorted(names.items()) if c}


def per_step(build, work, key):
    """One steady step's calls, by name and by class, the same at both widths."""
    narrow, wide = (one_step(build, work, m) for m in MODELS[key])
    differ = {n: (narrow.get(n, 0), wide.get(n, 0)) for n in set(narrow) | set(wide)
              if narrow.get(n, 0) != wide.get(n, 0)}
    if abs(sum(wide.values()) - sum(narrow.values())) > 0.05 * sum(narrow.values()):
        sys.exit(f"launch_count: {key}'s calls a step depend on its width "
                 f"({MODELS[key][0]['n_embd']} → {MODELS[key][1]['n_embd']}: {differ}), so "
                 "they say nothing of the real model's")
    names, model = wide, MODELS[key][1]
    classes = {}
    for n, c in names.items():
        classes[classify(n)] = classes.get(classify(n), 0) + c
    return {"model": key, "n_layer": model["n_layer"], "micro_batches": 1, "precision": "bf16",
            "zero_stage": 0, "ranks": 1, "widths": [m["n_embd"] for m in MODELS[key]],
            "totals": [sum(narrow.values()), sum(wide.values())], "total": sum(names.values()),
            "classes": dict(sorted(classes.items())), "by_name": names}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder")
    ap.add_argument("--write", action="store_true",
                    help="write bench/emu/launches-<model>.json")
    ap.add_argument("--model", choices=sorted(MODELS), action="append",
                    help="only this model (repeatable; default both)")
    args = ap.parse_args(argv)
    if not os.path.exists(os.path.join(args.build, "libztrain_cuda_emu.so")):
        sys.exit(f"launch_count: {args.build} has no emulated CUDA device "
                 "(libztrain_cuda_emu.so): build with the CUDA headers")
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "train.txt"), "w") as f:
            f.write("".join(chr(32 + (i * 7 + i // 13) % 90) for i in range(64 * 1024)))
        for key in args.model or sorted(MODELS):
            r = per_step(args.build, work, key)
            print(f"{key} ({r['n_layer']} layers, bf16, ZeRO 0, one micro-batch): "
                  f"{r['totals'][0]} calls a step at width {r['widths'][0]}, "
                  f"{r['totals'][1]} at {r['widths'][1]}: " +
                  ", ".join(f"{c} {n}" for n, c in r["classes"].items()))
            if args.write:
                os.makedirs(os.path.join(HERE, "emu"), exist_ok=True)
                with open(os.path.join(HERE, "emu", f"launches-{key}.json"), "w") as f:
                    json.dump(r, f, indent=1)
                    f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
