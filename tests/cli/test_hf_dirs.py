"""Hugging Face model directories in and out, against transformers itself.

In: a GPT2LMHeadModel saved by save_pretrained (config.json, shards model-0000k-of-0000n and
model.safetensors.index.json) in fp32, bf16 and fp16 is the whole model section of a job
(`init_from` and `block_size` only: config.json gives the dimensions), and ztrain's first loss
equals the loss transformers computes with the same weights on the same batch.

Out: `ztrain export CKPT --hf DIR --max-shard-size S` writes a directory that from_pretrained
loads, whose logits equal ztrain's own logits of the checkpoint (the zt_gpt2_check tool), sharded
as save_pretrained shards; without --max-shard-size it is one model.safetensors. The job resumes
from its checkpoint with the directory still its init_from, and a ZeRO-3 job on two ranks
exports a directory with the starting logits (lr 0).

Bad input: a model_type ztrain lacks, a refused config key, a missing shard, a tensor the index
lists but its shard lacks, a tensor of the wrong shape, a config that disagrees with the job, a
block_size past n_positions, dtypes that are not floats (I64, F8_E4M3): each exits non-zero with
a message naming the file and the tensor or field, with no metrics and no checkpoint; an export
into a non-empty directory leaves it as it was, and one onto a symbolic link or a mount point
(empty, but not a directory rename() can replace) is refused before anything is written."""
import copy
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from ztref import Checker, read_metrics, tool, write_job  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
sys.stdout.reconfigure(line_buffering=True)
torch.set_num_threads(2)
ZTRAIN = tool("ztrain")
CHECK = tool("zt_gpt2_check")
L, NH, C, V, NPOS, T, MICRO = 2, 2, 32, 256, 64, 32, 2
SHARD = "20KB"  # 2 layers of 32-wide GPT-2 in fp32 are ~110 KB: several shards
TEXT = (b"It is a truth universally acknowledged, that a single man in possession of a good "
        b"fortune, must be in want of a wife.\n" * 40)[:5000]

ck = Checker()
top = tempfile.mkdtemp(prefix="ztrain-hfdir-")


def ztrain(args, timeout=120):
    p = subprocess.run([ZTRAIN] + [str(a) for a in args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def hf_model(seed):
    """A tiny GPT-2 with transformers' initialisation, its norms randomised too so that a norm
    that failed to load would show."""
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=L, n_head=NH, n_embd=C, vocab_size=V, n_positions=NPOS)
    m = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return m


def batch():
    """The first micro-batch of an unshuffled run: sample i is bytes [i*T, i*T+T]."""
    tokens = torch.tensor(list(TEXT), dtype=torch.long)
    x = torch.stack([tokens[i * T:i * T + T] for i in range(MICRO)])
    y = torch.stack([tokens[i * T + 1:i * T + T + 1] for i in range(MICRO)])
    return x, y


def job_for(d, init_from, **model):
    spec = {
        "name": "hf-dir",
        "model": dict({"init_from": init_from, "block_size": T}, **model),
        "data": {"train": "train.txt", "shuffle": False},
        "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0, "checkpoint_dir": "ckpt"},
        "deepspeed": {"train_micro_batch_size_per_gpu": MICRO,
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}},
    }
    with open(os.path.join(d, "train.txt"), "wb") as f:
        f.write(TEXT)
    path = os.path.join(d, "job.json")
    write_job(path, spec)
    return path


def shards_of(d):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "model-*.safetensors")))


def ztrain_logits(weights, x):
    """ztrain's own logits for x from a weights file or directory (zt_gpt2_check)."""
    out = tempfile.mkdtemp(dir=top)
    b = os.path.join(out, "batch.i32")
    with open(b, "wb") as f:
        f.write(x.to(torch.int32).numpy().tobytes() * 2)  # inputs, then targets (unused here)
    args = [CHECK, weights, b, out, L, NH, C, V, T, x.shape[0], x.shape[1]]
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()
    raw = open(os.path.join(out, "logits.f32"), "rb").read()
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).view(x.shape[0], x.shape[1], V), ""


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


try:
    x, y = batch()
    model = hf_model(seed=3)

    # ---- in: sharded directories in three dtypes -------------------------------------------
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        d = os.path.join(top, f"in_{name}")
        os.makedirs(d)
        hf_dir = os.path.join(d, "hf")
        copy.deepcopy(model).to(dtype).save_pretrained(hf_dir, max_shard_size=SHARD,
                                                       safe_serialization=True)
        shards = shards_of(hf_dir)
        ck.check(len(shards) > 1 and os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")),
                 f"{name}: save_pretrained wrote {len(shards)} shards and an index (the case under test)")
        # The reference: transformers on the same (rounded) weights, in float64.
        ref = GPT2LMHeadModel.from_pretrained(hf_dir, torch_dtype=torch.float32).double().eval()
        with torch.no_grad():
            ref_loss = torch.nn.functional.cross_entropy(ref(x).logits.reshape(-1, V),
                                                         y.reshape(-1)).item()
        rc, out, err = ztrain(["run", job_for(d, "hf"), "--out", os.path.join(d, "run"),
                               "--threads", "2"])
        m = read_metrics(os.path.join(d, "run", "metrics.jsonl")) if rc == 0 else []
        got = m[0]["train/loss"] if m else float("nan")
        e = abs(got - ref_loss) / ref_loss
        ck.check(rc == 0 and e < 1e-5, f"{name}: `ztrain run` with init_from = the directory and no "
                 f"dimensions: first loss {got:.6f} vs transformers {ref_loss:.6f} (rel {e:.1e})"
                 + ("" if rc == 0 else f" -- exit {rc}: {err.strip()[-300:]}"))
        if name == "fp32":
            ck.check("n_layer 2, n_head 2, n_embd 32, vocab_size 256, block_size 32" in out,
                     f"the run describes the model config.json gave: {out.splitlines()[0][:160]!r}")
        if name == "bf16":
            # zt_gpt2_check reads the directory through the same loader; the logits must be
            # transformers' on the same weights.
            zl, why = ztrain_logits(hf_dir, x)
            with torch.no_grad():
                hl = ref(x).logits
            ck.check(zl is not None and rel(zl, hl) < 1e-5,
                     f"bf16: logits of the directory through ztrain's loader vs transformers "
                     f"(rel {rel(zl, hl) if zl is not None else why})")

    # ---- out: export the fp32 run's checkpoint --------------------------------------------
    ckpt = os.path.join(top, "in_fp32", "ckpt")
    src_dir = os.path.join(top, "in_fp32", "hf")
    out_dir = os.path.join(top, "exported")
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        orig = GPT2LMHeadModel.from_pretrained(src_dir).eval()(idx).logits
        hl = orig
    rc, out, err = ztrain(["export", ckpt, "--hf", out_dir, "--max-shard-size", SHARD])
    ck.check(rc == 0, f"export --hf --max-shard-size {SHARD}: exit {rc} {out.strip()} {err.strip()[-300:]}")
    files = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    shards = shards_of(out_dir)
    # save_pretrained writes a generation_config.json beside the model; export carries the
    # source directory's along, unchanged (docs/huggingface.md).
    gen = "generation_config.json"
    has_gen = os.path.exists(os.path.join(src_dir, gen))
    meta = ["config.json", "model.safetensors.index.json"] + ([gen] if has_gen else [])
    ck.check(len(shards) > 1 and all(f in files for f in meta)
             and len(files) == len(shards) + len(meta),
             f"the directory holds {', '.join(meta)} and {len(shards)} shards, nothing else "
             f"(no temporary files): {files}")
    if has_gen and gen in files:
        ck.check(json.load(open(os.path.join(out_dir, gen))) ==
                 json.load(open(os.path.join(src_dir, gen))),
                 "generation_config.json is the source directory's")
    ck.check(not glob.glob(out_dir + ".tmp*"), "no temporary directory is left beside it")
    if rc == 0:
        index = json.load(open(os.path.join(out_dir, "model.safetensors.index.json")))
        wm = index["weight_map"]
        on_disk = {}
        for s in shards:
            for k in load_file(os.path.join(out_dir, s)):
                on_disk[k] = s
        ck.check(wm == on_disk, "the index's weight_map names every tensor of every shard, and "
                 "only those")
        sizes = {s: sum(t.numel() * t.element_size()
                        for t in load_file(os.path.join(out_dir, s)).values()) for s in shards}
        ck.check(index["metadata"]["total_size"] == sum(sizes.values()),
                 f"metadata.total_size {index['metadata']['total_size']} = the shards' data "
                 f"{sum(sizes.values())}")
        limit = 20000
        big = [s for s, b in sizes.items() if b > limit
               and len(load_file(os.path.join(out_dir, s))) > 1]
        ck.check(not big, f"no shard of several tensors is over {limit} bytes ({big})")
        src_names = set(json.load(open(os.path.join(src_dir, "model.safetensors.index.json")))
                        ["weight_map"])
        # save_pretrained leaves out the tied lm_head.weight and the attn.bias buffers.
        ck.check(set(wm) == src_names, f"tensor names are save_pretrained's "
                 f"(extra {sorted(set(wm) - src_names)[:3]}, missing {sorted(src_names - set(wm))[:3]})")
        cfg = json.load(open(os.path.join(out_dir, "config.json")))
        ck.check(cfg.get("model_type") == "gpt2" and cfg.get("architectures") == ["GPT2LMHeadModel"]
                 and cfg.get("n_positions") == T and cfg.get("torch_dtype") == "float32",
                 f"config.json: model_type, architectures, n_positions = block_size, torch_dtype "
                 f"({ {k: cfg.get(k) for k in ('model_type', 'architectures', 'n_positions', 'torch_dtype')} })")
        # The job trained at block_size T of the directory's NPOS positions: the loader crops
        # the position table to T rows, so that is what the checkpoint holds and the export
        # writes, and export says so rather than cut the table without a word.
        rows = [t.shape[0] for s in shards for k, t in load_file(os.path.join(out_dir, s)).items()
                if k.endswith("wpe.weight")]
        ck.check(rows == [T] and f"n_positions is {T}, the job's block_size" in out,
                 f"export writes the {T} position rows the checkpoint holds ({rows}) and says "
                 f"n_positions is block_size: {out.strip()}")
        exp = GPT2LMHeadModel.from_pretrained(out_dir).eval()
        ck.check(exp.config.n_layer == L and exp.config.n_embd == C and exp.config.vocab_size == V,
                 "from_pretrained builds the same architecture")
        with torch.no_grad():
            hl = exp(idx).logits
        zl, why = ztrain_logits(os.path.join(ckpt, "global_step1", "model.safetensors"), idx)
        ck.check(zl is not None and rel(zl, hl) < 1e-5,
                 f"from_pretrained(exported) logits vs ztrain's logits of the checkpoint (rel "
                 f"{rel(zl, hl) if zl is not None else why})")
        ck.check(torch.equal(hl, orig), "and equal, bit for bit, the logits of the directory the "
                 "job started from (lr 0: the weights did not move)")
        # And the exported directory goes back in: a job starts from it.
        d = os.path.join(top, "reload")
        os.makedirs(d)
        shutil.copytree(out_dir, os.path.join(d, "hf"))
        rc, out, err = ztrain(["run", job_for(d, "hf"), "--out", os.path.join(d, "run")])
        ck.check(rc == 0, f"the exported directory is a job's init_from: exit {rc} {err.strip()[-200:]}")

    single = os.path.join(top, "single")
    os.makedirs(single)  # an empty directory may be the target: it is replaced
    rc, out, err = ztrain(["export", ckpt, "--hf", single])
    ck.check(rc == 0 and sorted(os.listdir(single)) ==
             sorted(["config.json", "model.safetensors"] + ([gen] if has_gen else []))
             and "1 shard" in out,
             f"export --hf with the default 5GB shards into an empty directory: config.json, "
             f"model.safetensors{' and ' + gen if has_gen else ''} only "
             f"({sorted(os.listdir(single)) if os.path.isdir(single) else err.strip()})")
    if rc == 0:
        with torch.no_grad():
            a = GPT2LMHeadModel.from_pretrained(single).eval()(idx).logits
        ck.check(torch.equal(a, hl), "the one-file directory gives the same logits")

    # ---- resume, and a ZeRO-3 job on two ranks ---------------------------------------------
    # The job whose init_from is a directory resumes from its checkpoint: the spec config.json
    # fills is the one the checkpoint recorded.
    d = os.path.join(top, "in_fp32")
    job_path = os.path.join(d, "job.json")
    job = json.load(open(job_path))
    job["train"].update({"max_steps": 2, "resume": True})
    write_job(job_path, job)
    rc, out, err = ztrain(["run", job_path, "--out", os.path.join(d, "run")])
    ck.check(rc == 0 and "resumed from" in out and "global_step1" in out,
             f"the job resumes from its checkpoint: exit {rc} "
             f"{[l for l in out.splitlines() if 'resum' in l][:1]} {err.strip()[-200:]}")

    d = os.path.join(top, "zero3")
    os.makedirs(d)
    shutil.copytree(src_dir, os.path.join(d, "hf"))
    job_path = job_for(d, "hf")
    job = json.load(open(job_path))
    job["world_size"] = 2
    job["deepspeed"]["zero_optimization"] = {"stage": 3}
    write_job(job_path, job)
    rc, out, err = ztrain(["run", job_path, "--out", os.path.join(d, "run")])
    ck.check(rc == 0, f"2 ranks, ZeRO-3, init_from the directory: exit {rc} {err.strip()[-200:]}")
    z3 = os.path.join(d, "exported")
    rc, out, err = ztrain(["export", os.path.join(d, "ckpt"), "--hf", z3, "--max-shard-size", SHARD])
    ck.check(rc == 0, f"export --hf of the ZeRO-3 checkpoint: exit {rc} {err.strip()[-200:]}")
    if rc == 0:
        with torch.no_grad():
            z = GPT2LMHeadModel.from_pretrained(z3).eval()(idx).logits
        ck.check(torch.equal(z, orig), "its directory gives the logits of the one the job "
                 "started from, bit for bit")

    # ---- bad input ------------------------------------------------------------------------
    n = [0]

    def bad_case(what, change, fragments, **model):
        """A copy of the fp32 directory broken by change(hf_dir); the run must fail cleanly."""
        n[0] += 1
        d = os.path.join(top, f"bad{n[0]:02d}")
        os.makedirs(d)
        hf_dir = os.path.join(d, "hf")
        shutil.copytree(src_dir, hf_dir)
        change(hf_dir)
        run = os.path.join(d, "run")
        rc, out, err = ztrain(["run", job_for(d, "hf", **model), "--out", run])
        problems = []
        if not (0 < rc < 128):
            problems.append(f"exit status {rc}")
        missing = [f for f in fragments if f not in err]
        if missing:
            problems.append(f"stderr lacks {missing}")
        if "done:" in out:
            problems.append("stdout says it finished")
        recs = len(read_metrics(os.path.join(run, "metrics.jsonl"))) \
            if os.path.exists(os.path.join(run, "metrics.jsonl")) else 0
        if recs:
            problems.append(f"{recs} metric records")
        if glob.glob(os.path.join(d, "**", "latest"), recursive=True):
            problems.append("a checkpoint was written")
        first = err.strip().splitlines()[0][:240] if err.strip() else "(empty stderr)"
        ck.check(not problems, f"{what}: " + ("; ".join(problems) + " -- " if problems else "")
                 + first)

    def edit_config(**kv):
        def change(hf_dir):
            p = os.path.join(hf_dir, "config.json")
            cfg = json.load(open(p))
            cfg.update(kv)
            json.dump(cfg, open(p, "w"))
        return change

    def index_of(hf_dir):
        return json.load(open(os.path.join(hf_dir, "model.safetensors.index.json")))

    def shard_holding(hf_dir, tensor):
        return index_of(hf_dir)["weight_map"][tensor]

    bad_case("model_type ztrain lacks", edit_config(model_type="falcon"),
             ["config.json", "model_type", "falcon"])
    bad_case("a config key ztrain cannot represent", edit_config(activation_function="relu"),
             ["config.json", "activation_function", "relu"])
    bad_case("config disagreeing with the job", lambda h: None,
             ["job.json", "model.n_layer", "is 3", "config.json", "gives 2 (n_layer)"],
             n_layer=3)
    bad_case("job type disagreeing with model_type", lambda h: None,
             ["job.json", "model.type", "config.json", "gpt2"], type="llama")
    bad_case("block_size above n_positions", edit_config(n_positions=16),
             ["job.json", "block_size", "32", "config.json", "n_positions", "16"])

    def drop_shard(hf_dir):
        os.remove(os.path.join(hf_dir, shards_of(hf_dir)[1]))
    second = shards_of(src_dir)[1]
    bad_case("a missing shard", drop_shard,
             ["model.safetensors.index.json", second, "No such file"])

    def phantom(hf_dir):
        idx = index_of(hf_dir)
        idx["weight_map"]["transformer.h.0.mlp.c_gate.weight"] = shards_of(hf_dir)[0]
        json.dump(idx, open(os.path.join(hf_dir, "model.safetensors.index.json"), "w"))
    bad_case("a tensor listed in the index but absent from its shard", phantom,
             [shards_of(src_dir)[0], "transformer.h.0.mlp.c_gate.weight", "does not hold"])

    def rewrite(tensor, fn):
        def change(hf_dir):
            p = os.path.join(hf_dir, shard_holding(hf_dir, tensor))
            sd = load_file(p)
            sd[tensor] = fn(sd[tensor])
            save_file(sd, p, metadata={"format": "pt"})
        return change
    attn = "transformer.h.0.attn.c_attn.weight"
    bad_case("a tensor of the wrong shape", rewrite(attn, lambda t: t.t().contiguous()),
             [shard_holding(src_dir, attn), attn, "shape", f"[{3 * C}, {C}]"])
    wpe = "transformer.wpe.weight"
    bad_case("an I64 tensor", rewrite(wpe, lambda t: t.long()),
             [shard_holding(src_dir, wpe), wpe, "I64"])

    def f8(hf_dir):
        """Rewrites the shard holding wpe with wpe as F8_E4M3 (one byte per element)."""
        p = os.path.join(hf_dir, shard_holding(hf_dir, wpe))
        with open(p, "rb") as f:
            raw = f.read()
        (hlen,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + hlen])
        data = raw[8 + hlen:]
        meta = header.pop("__metadata__", None)
        new, blobs, off = {}, [], 0
        for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            b, e = v["data_offsets"]
            blob = data[b:e]
            if k == wpe:
                blob = bytes(len(blob) // 4)
                v = dict(v, dtype="F8_E4M3")
            new[k] = dict(v, data_offsets=[off, off + len(blob)])
            blobs.append(blob)
            off += len(blob)
        if meta:
            new["__metadata__"] = meta
        h = json.dumps(new).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    bad_case("an F8_E4M3 tensor", f8, [shard_holding(src_dir, wpe), wpe, "F8_E4M3"])

    # Export into a directory that holds something: refused, and the file is untouched.
    busy = os.path.join(top, "busy")
    os.makedirs(busy)
    with open(os.path.join(busy, "keep.txt"), "w") as f:
        f.write("mine")
    rc, out, err = ztrain(["export", ckpt, "--hf", busy])
    ck.check(0 < rc < 128 and "busy" in err and "not empty" in err
             and os.listdir(busy) == ["keep.txt"] and not glob.glob(busy + ".tmp*"),
             f"export into a non-empty directory: exit {rc}, left as it was -- {err.strip()[:200]}")
    # A symbolic link to an empty directory, and a mount point, are empty but cannot be renamed
    # over: refused before anything is written, saying what to give instead (the rename failed
    # once the whole model had been written, "Not a directory", "Device or resource busy").
    empty = os.path.join(top, "empty")
    os.makedirs(empty)
    link = os.path.join(top, "link")
    os.symlink(empty, link)
    for given in (link, link + "/"):
        rc, out, err = ztrain(["export", ckpt, "--hf", given])
        ck.check(0 < rc < 128 and "is a symbolic link" in err and f"{link}/model" in err and
                 os.listdir(empty) == [] and os.path.islink(link) and
                 not glob.glob(link + ".tmp*"),
                 f"export to a link to an empty directory ({given}): refused before writing, "
                 f"exit {rc} -- {err.strip()[:200]}")
    mount = os.path.join(top, "mount")
    os.makedirs(mount)
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                             mount], capture_output=True).returncode == 0:
        try:
            rc, out, err = ztrain(["export", ckpt, "--hf", mount])
            ck.check(0 < rc < 128 and "is a mount point" in err and f"{mount}/model" in err and
                     os.listdir(mount) == [] and not glob.glob(mount + ".tmp*"),
                     f"export to an empty mount point: refused before writing, exit {rc} -- "
                     f"{err.strip()[:200]}")
            rc, out, err = ztrain(["export", ckpt, "--hf", f"{mount}/model"])
            ck.check(rc == 0 and os.path.exists(f"{mount}/model/config.json"),
                     f"and a new directory inside it is written: exit {rc} {err.strip()[:200]}")
        finally:
            subprocess.run(["umount", mount])
    else:
        print("skip  export to a mount point: needs root to mount a tmpfs")
    rc, out, err = ztrain(["export", ckpt, "--hf", os.path.join(top, "x"), "--max-shard-size", "lots"])
    ck.check(rc == 2 and "--max-shard-size" in err and not os.path.exists(os.path.join(top, "x")),
             f"--max-shard-size lots: usage error, nothing written (exit {rc})")
finally:
    shutil.rmtree(top, ignore_errors=True)

ck.done()
