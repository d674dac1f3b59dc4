"""`ztrain zero-to-fp32` (and `export --out`, `export --hf`) of a mixed-precision checkpoint write
the fp32 master weights the optimizer files hold, as DeepSpeed's zero_to_fp32.py rebuilds the
state dict from the fp32 partitions, not the 16-bit working weights widened.

The reference is put together here, from the files alone: each optim_rank file's "fp32_master"
slice placed at its partition_offset, cut into tensors by meta.json's "params" layout, a
tensor-parallel job's shards joined by tp.json's split (dimension, groups) and a pipeline's stages
united (the first stage's copy of a tied embedding). Each export must equal it bit for bit, for
ZeRO 0-3 on 2 ranks in bf16, ZeRO 2 in fp16, tp 2 and 2 pipeline stages in bf16. The masters are
checked to be the right values in the right places by an independent property: rounded to the
training's 16-bit type (round to nearest even, torch's cast) they give the working weights
(model.safetensors, or a ZeRO-3 run's model_rank shards) bit for bit. Where there are no fp32
masters the export is the working weights: fp32 training (they are the masters) and bf16
masters (bf16_master_weights_and_grads)."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, run, st_read, tool  # noqa: E402
from tpref import GPT2, job, tp_join, train, write_text  # noqa: E402

STEPS = 3


def tag_dir(d):
    with open(f"{d}/latest") as f:
        return f"{d}/{f.read().strip()}"


def flat(tdir, stem, tensor):
    """The slices `tensor` of tdir's <stem>_<r> files at their partition_offset, one flat tensor;
    None when the first file has no such tensor."""
    with open(f"{tdir}/meta.json") as f:
        world = json.load(f)["world_size"]
    parts = []
    for r in range(world):
        t, meta = st_read(f"{tdir}/{stem}_{r:05d}.safetensors")
        if tensor not in t:
            return None
        parts.append((int(meta["partition_offset"]), int(meta["n_params"]), t[tensor]))
    out = torch.full((parts[0][1],), float("nan"))
    for off, _, t in parts:
        out[off:off + t.numel()] = t
    assert not out.isnan().any(), f"{tdir}: the {stem} slices leave parameters out"
    return out


def by_layout(tdir, buf):
    """buf cut by meta.json's "params"; {} where there is none (a checkpoint without the layout,
    which the checks then fail on)."""
    with open(f"{tdir}/meta.json") as f:
        params = json.load(f).get("params", [])
    return {name: buf[off:off + torch.Size(shape).numel()].reshape(shape).clone()
            for name, off, shape in params}


def plain(d, what):
    """Tensors of the checkpoint directory d: "master" or "working"."""
    tdir = tag_dir(d)
    if what == "master":
        buf = flat(tdir, "optim_rank", "fp32_master")
        return None if buf is None else by_layout(tdir, buf)
    if os.path.exists(f"{tdir}/model.safetensors"):
        return {k: v.float() for k, v in st_read(f"{tdir}/model.safetensors")[0].items()}
    return by_layout(tdir, flat(tdir, "model_rank", "params"))


def tp_whole(d, what):
    """A tensor-parallel directory's shards ("master" or "working") joined by tp.json."""
    return tp_join(d, lambda t: plain(f"{d}/tp_{t:02d}", what))


def pipeline_union(d, stages, what):
    out = {}
    for s in range(stages):
        for k, v in plain(f"{d}/stage_{s:02d}", what).items():
            out.setdefault(k, v)
    return out


def same_bits(a, b):
    return bool(a) and sorted(a) == sorted(b) and all(
        a[k].shape == b[k].shape and torch.equal(a[k].view(torch.int32), b[k].view(torch.int32))
        for k in a)


def exports(ck, d, ckpt, what, ref):
    """zero-to-fp32, export --out and export --hf of d/ckpt against ref, bit for bit."""
    run([tool("ztrain"), "zero-to-fp32", f"{d}/{ckpt}", f"{d}/{ckpt}.z2f.safetensors"])
    run([tool("ztrain"), "export", f"{d}/{ckpt}", "--out", f"{d}/{ckpt}.out.safetensors"])
    run([tool("ztrain"), "export", f"{d}/{ckpt}", "--hf", f"{d}/{ckpt}.hf"])
    z2f = st_read(f"{d}/{ckpt}.z2f.safetensors")[0]
    ck.check(same_bits(z2f, ref), f"{ckpt}: zero-to-fp32 is {what} bit for bit ({len(ref)} "
             "tensors)")
    ck.check(same_bits(st_read(f"{d}/{ckpt}.out.safetensors")[0], ref),
             f"{ckpt}: export --out is {what} bit for bit")
    # GPT-2's HF files name the blocks "transformer.h.0..." (save_pretrained's names).
    hf = {k.removeprefix("transformer."): v
          for k, v in st_read(f"{d}/{ckpt}.hf/model.safetensors")[0].items()}
    hf.pop("lm_head.weight", None)
    ck.check(same_bits(hf, ref), f"{ckpt}: export --hf is {what} bit for bit")


def rounds_to(ck, ckpt, master, working, dtype):
    ok = bool(master) and sorted(master) == sorted(working) and all(
        torch.equal(master[k].to(dtype).float(), working[k]) for k in master)
    differ = sum(int((master[k] != working[k]).sum()) for k in master) if ok else 0
    ck.check(ok and differ > 0, f"{ckpt}: the masters rounded to {dtype} are the working "
             f"weights, which differ from them in {differ} values")


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_text(d)
    cases = [(f"bf16-z{z}", job(GPT2, 1, 2, f"ck-bf16-z{z}", zero=z, precision="bf16",
                                steps=STEPS), torch.bfloat16) for z in (0, 1, 2, 3)]
    cases.append(("fp16-z2", job(GPT2, 1, 2, "ck-fp16-z2", zero=2, precision="fp16",
                                 steps=STEPS), torch.float16))
    for name, spec, dtype in cases:
        train(d, name, spec, export=False)
        ckpt = f"ck-{name}"
        master, working = plain(f"{d}/{ckpt}", "master"), plain(f"{d}/{ckpt}", "working")
        rounds_to(ck, ckpt, master, working, dtype)
        exports(ck, d, ckpt, "the fp32 masters", master)

    # A checkpoint whose meta.json has no "params" (saved before every one recorded them; ZeRO
    # 3's always did): its model.safetensors' tensors lie back to back in the flat buffer.
    shutil.copytree(f"{d}/ck-bf16-z2", f"{d}/ck-bf16-z2-old")
    meta_path = f"{tag_dir(f'{d}/ck-bf16-z2-old')}/meta.json"
    with open(meta_path) as f:
        meta = json.load(f)
    meta.pop("params", None)
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    exports(ck, d, "ck-bf16-z2-old", "the fp32 masters", plain(f"{d}/ck-bf16-z2", "master"))

    # Tensor parallelism: each shard's masters over its own flat buffer, joined by tp.json.
    train(d, "bf16-tp2", job(GPT2, 2, 1, "ck-bf16-tp2", zero=1, precision="bf16", steps=STEPS),
          export=False)
    master, working = tp_whole(f"{d}/ck-bf16-tp2", "master"), tp_whole(f"{d}/ck-bf16-tp2",
                                                                      "working")
    rounds_to(ck, "ck-bf16-tp2", master, working, torch.bfloat16)
    exports(ck, d, "ck-bf16-tp2", "the fp32 masters", master)

    # A pipeline: the stages' masters, the last stage's tied copy of wte left to the first's.
    train(d, "bf16-pp2", job(GPT2, 1, 1, "ck-bf16-pp2", zero=1, precision="bf16", steps=STEPS,
                             pp=2), export=False)
    master = pipeline_union(f"{d}/ck-bf16-pp2", 2, "master")
    rounds_to(ck, "ck-bf16-pp2", master, pipeline_union(f"{d}/ck-bf16-pp2", 2, "working"),
              torch.bfloat16)
    exports(ck, d, "ck-bf16-pp2", "the fp32 masters", master)

    # No fp32 masters: fp32 training, whose weights are the masters, and bf16 masters.
    train(d, "fp32-z2", job(GPT2, 1, 2, "ck-fp32-z2", zero=2, steps=STEPS), export=False)
    ck.check(plain(f"{d}/ck-fp32-z2", "master") is None, "fp32 training saves no fp32_master")
    exports(ck, d, "ck-fp32-z2", "the model's weights", plain(f"{d}/ck-fp32-z2", "working"))
    spec = job(GPT2, 1, 2, "ck-bf16-masters", zero=1, precision="bf16", steps=STEPS)
    spec["deepspeed"]["bf16"].update(bf16_master_weights_and_grads=True,
                                     bf16_optimizer_states=True)
    train(d, "bf16-masters", spec, export=False)
    ck.check(plain(f"{d}/ck-bf16-masters", "master") is None,
             "bf16 masters: the optimizer files hold no fp32_master")
    exports(ck, d, "ck-bf16-masters", "the bf16 weights widened",
            plain(f"{d}/ck-bf16-masters", "working"))
ck.done()
