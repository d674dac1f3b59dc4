"""What `ztrain` does with bad input: every broken job, config, data or weights file must give a
clear message naming the file and the key or value at fault, a non-zero exit that is not a crash,
and no output that looks complete (no metrics records, no checkpoint `latest`).

Each case writes a small valid job (1 layer, 2 heads, n_embd 16, byte-level text, AdamW, 2 steps)
in its own directory, breaks one thing, and runs `ztrain run job.json --out OUT`. A first case runs
the unbroken job and checks that it does train and checkpoint, so the other cases fail for the
reason they break and not for another."""
import copy
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from ztref import Checker, gpt2_random_params, st_write, tool, write_job  # noqa: E402

ZTRAIN = tool("ztrain")
L, NH, C, V, T = 1, 2, 16, 256, 16
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief.\n" * 40)[:4096]

BASE_JOB = {
    "name": "bad-input",
    "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
              "block_size": T},
    "data": {"train": "train.txt"},
    "train": {"max_steps": 2, "log_interval": 1, "warmup_steps": 0, "checkpoint_dir": "ckpt"},
    "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}},
}

sys.stdout.reconfigure(line_buffering=True)
ck = Checker()
top = tempfile.mkdtemp(prefix="ztrain-bad-")
counter = [0]


def new_case_dir():
    counter[0] += 1
    d = os.path.join(top, f"case{counter[0]:02d}")
    os.makedirs(d)
    with open(os.path.join(d, "train.txt"), "wb") as f:
        f.write(TEXT)
    return d


def ztrain(args, timeout=60):
    """(returncode, stdout, stderr); a hang is reported as returncode None."""
    try:
        p = subprocess.run([ZTRAIN] + [str(a) for a in args], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "(timed out)"
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def metrics_records(out_dir):
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def find_latest(root):
    return [os.path.join(dp, "latest") for dp, _, files in os.walk(root) if "latest" in files]


def expect_failure(what, result, fragments, root=None, out_dir=None, exit_code=None,
                   forbidden_files=()):
    """One check line: a clean failure whose stderr holds every fragment and which left nothing
    that looks like a finished run behind."""
    rc, out, err = result
    problems = []
    if rc is None:
        problems.append("hung (killed after the timeout)")
    elif exit_code is not None and rc != exit_code:
        problems.append(f"exit status {rc}, expected {exit_code}")
    elif not (0 < rc < 128):
        problems.append(f"exit status {rc} (0 is success, < 0 or >= 128 is a crash/signal)")
    # A tuple fragment is a set of alternatives (a key may be quoted either way).
    missing = [f for f in fragments
               if not (any(a in err for a in f) if isinstance(f, tuple) else f in err)]
    if missing:
        problems.append("stderr lacks " + ", ".join(repr(f) for f in missing))
    if "Segmentation" in err or "AddressSanitizer" in err or "assertion failed" in err:
        problems.append("stderr shows a crash")
    if "done:" in out:
        problems.append("stdout claims the run finished")
    if out_dir and metrics_records(out_dir):
        problems.append(f"{out_dir}/metrics.jsonl has {metrics_records(out_dir)} record(s)")
    if root:
        for p in find_latest(root):
            problems.append(f"a checkpoint 'latest' was written: {p}")
    for p in forbidden_files:
        if os.path.exists(p):
            problems.append(f"output file was written: {p}")
    line = f"{what}: exit {rc}"
    if problems:
        first = err.strip().splitlines()[0] if err.strip() else "(empty stderr)"
        line += " -- " + "; ".join(problems) + f" -- stderr: {first[:300]}"
    else:
        line += ", message: " + (err.strip().splitlines()[0][:200] if err.strip() else "")
    ck.check(not problems, line)


def run_job(what, mutate, fragments, extra_files=None, raw_job=None, exit_code=None):
    """Writes the base job changed by mutate(job, dir) (or raw_job text), runs it, checks it fails."""
    d = new_case_dir()
    job = copy.deepcopy(BASE_JOB)
    if mutate:
        mutate(job, d)
    for name, content in (extra_files or {}).items():
        with open(os.path.join(d, name), "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
    job_path = os.path.join(d, "job.json")
    if raw_job is not None:
        with open(job_path, "w") as f:
            f.write(raw_job)
    else:
        write_job(job_path, job)
    out_dir = os.path.join(d, "out")
    expect_failure(what, ztrain(["run", job_path, "--out", out_dir]), fragments, root=d,
                   out_dir=out_dir, exit_code=exit_code)


def q(key):
    """The key quoted, either way: a bare substring would also match a longer correct key."""
    return (f"'{key}'", f'"{key}"')


def setter(section_path, key, value):
    """A mutation that sets job[a][b]...[key] = value, creating sections as needed."""
    def mutate(job, d):
        node = job
        for part in section_path:
            node = node.setdefault(part, {})
        node[key] = value
    return mutate


try:
    # ---- the unbroken job trains, writes metrics and a checkpoint ------------------------------
    good = new_case_dir()
    write_job(os.path.join(good, "job.json"), BASE_JOB)
    rc, out, err = ztrain(["run", os.path.join(good, "job.json"), "--out", os.path.join(good, "out")])
    ok = (rc == 0 and metrics_records(os.path.join(good, "out")) == 2
          and os.path.exists(os.path.join(good, "ckpt", "latest")))
    ck.check(ok, f"baseline: the valid job exits {rc}, writes 2 metrics records and ckpt/latest"
             + ("" if ok else f" -- stderr: {err.strip()[-300:]}"))
    if not ok:
        raise SystemExit("the valid baseline job does not run; the bad-input cases would say nothing")

    # ---- malformed JSON ------------------------------------------------------------------------
    bad_job = ('{\n'
               '  "name": "bad",\n'
               '  "model": {"type": "gpt2", "n_layer": 1 "n_head": 2}\n'
               '}\n')
    # Python's json module is the reference for the position: line 3, column 42.
    try:
        json.loads(bad_job)
        raise AssertionError("the malformed job text parses")
    except json.JSONDecodeError as e:
        assert (e.lineno, e.colno) == (3, 42), (e.lineno, e.colno)
    run_job("malformed JSON in job.json (missing comma)", None,
            ["job.json", "line 3", "column 42"], raw_job=bad_job)

    bad_ds = ('{\n'
              '  "train_micro_batch_size_per_gpu": 2,\n'
              '  "optimizer": {"type": "AdamW", "params": {"lr" 0.001}}\n'
              '}\n')
    try:
        json.loads(bad_ds)
        raise AssertionError("the malformed ds config parses")
    except json.JSONDecodeError as e:
        assert (e.lineno, e.colno) == (3, 50), (e.lineno, e.colno)
    run_job("malformed JSON in ds_config.json referenced by path (missing colon)",
            setter([], "deepspeed", "ds_config.json"),
            ["ds_config.json", "line 3", "column 50"], extra_files={"ds_config.json": bad_ds})
    # A trailing comma: Python 3.13's json points at the comma itself ("Illegal trailing comma
    # before end of object", column 45 here); older Pythons point one past it. Either is a
    # position a user can act on.
    trailing = ('{\n'
                ' "name": "bad",\n'
                ' "train": {"max_steps": 2, "log_interval": 1,}\n'
                '}\n')
    assert trailing.splitlines()[2][44] == ","
    run_job("malformed JSON in job.json (trailing comma)", None,
            ["job.json", "line 3", ("column 45", "column 46")], raw_job=trailing)
    run_job("deepspeed config path that does not exist",
            setter([], "deepspeed", "no_such_ds.json"), ["no_such_ds.json"])
    run_job("empty job file", None, ["job.json"], raw_job="")
    run_job("job file that is a JSON array, not an object", None, ["job.json"], raw_job="[1, 2]\n")
    dup = json.dumps(BASE_JOB).replace(
        '"train_micro_batch_size_per_gpu": 2',
        '"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 4')
    assert dup.count("train_micro_batch_size_per_gpu") == 2
    run_job("duplicate key in the deepspeed section", None,
            ["job.json", "Duplicate keys", "train_micro_batch_size_per_gpu"], raw_job=dup)

    # ---- wrong types ---------------------------------------------------------------------------
    run_job('wrong type: model.n_layer "four"', setter(["model"], "n_layer", "four"),
            ["job.json", "n_layer", "four"])
    run_job("wrong type: train.max_steps 1.5", setter(["train"], "max_steps", 1.5),
            ["job.json", "max_steps", "1.5"])
    run_job('wrong type: deepspeed.train_micro_batch_size_per_gpu "two"',
            setter(["deepspeed"], "train_micro_batch_size_per_gpu", "two"),
            ["job.json", "train_micro_batch_size_per_gpu", "two"])
    run_job("wrong type: model is a string", setter([], "model", "gpt2"), ["job.json", "model"])

    # ---- DeepSpeed batch rules, with DeepSpeed's texts -----------------------------------------
    def batch(tb=None, mb=None, gas=None):
        def mutate(job, d):
            ds = job["deepspeed"]
            ds.pop("train_micro_batch_size_per_gpu", None)
            for k, v in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                         ("gradient_accumulation_steps", gas)):
                if v is not None:
                    ds[k] = v
        return mutate

    run_job("inconsistent batch triple 10 / 2 / 4", batch(10, 2, 4),
            ["Check batch related parameters. train_batch_size is not equal to "
             "micro_batch_per_gpu * gradient_acc_step * world_size 10 != 2 * 4 * 1"])
    # A config without train_batch_size and train_micro_batch_size_per_gpu, which DeepSpeed refuses,
    # gets them from the job's training_args as a script's DataLoader supplies them (issue 20;
    # tests/cli/test_config_corpus.py, hf_no_batch_keys).
    run_job("micro batch 0 (train 4, gas 1)", batch(4, 0, 1),
            ["Micro batch size per gpu: 0 has to be greater than 0"])

    # ---- unknown keys inside sections ----------------------------------------------------------
    run_job("unknown key model.n_layers", setter(["model"], "n_layers", 1),
            ["job.json", "n_layers"])
    run_job("unknown key train.max_step", setter(["train"], "max_step", 2),
            ["job.json", q("max_step")])
    run_job("unknown key data.validation", setter(["data"], "validation", "train.txt"),
            ["job.json", "validation"])
    run_job("unknown top-level job key max_steps", setter([], "max_steps", 2),
            ["job.json", "max_steps"])
    run_job("unknown key optimizer.params.weight_decey",
            setter(["deepspeed", "optimizer", "params"], "weight_decey", 0.1),
            ["job.json", "weight_decey"])

    def with_scheduler(job, d):
        job["deepspeed"]["scheduler"] = {"type": "WarmupLR",
                                         "params": {"warmup_num_steps": 10, "warmup_max_lrr": 1e-3}}
    run_job("unknown key scheduler.params.warmup_max_lrr", with_scheduler,
            ["job.json", "warmup_max_lrr"])
    run_job("unknown key zero_optimization.stag",
            setter(["deepspeed"], "zero_optimization", {"stage": 0, "stag": 0}),
            ["job.json", q("stag"), "zero_optimization"])
    run_job("unknown key fp16.loss_scal",
            setter(["deepspeed"], "fp16", {"enabled": False, "loss_scal": 0}),
            ["job.json", q("loss_scal"), "fp16"])

    # ---- model dimensions ----------------------------------------------------------------------
    run_job("n_embd 15 not divisible by n_head 2", setter(["model"], "n_embd", 15),
            ["job.json", "n_embd", "n_head", "15", "divisible"])
    run_job("n_layer 0", setter(["model"], "n_layer", 0), ["job.json", "n_layer"])
    run_job("unknown model type falcon", setter(["model"], "type", "falcon"), ["falcon"])
    run_job("llama without intermediate_size", setter(["model"], "type", "llama"),
            ["job.json", "model.intermediate_size", "required"])
    run_job("llama n_head 2 over n_kv_head 3",
            lambda job, d: job["model"].update(type="llama", intermediate_size=64, n_kv_head=3),
            ["job.json", "model.n_head (2) must be a multiple of model.n_kv_head (3)"])
    # No "optimizer" section trains with the Trainer's AdamW and a warning (issue 20;
    # tests/cli/test_config_corpus.py, hf_no_optimizer).
    # Batch keys that do not fit world_size: DeepSpeed's own text, with the world size in it.
    run_job("batch keys inconsistent with world_size 2",
            lambda job, d: (job.update(world_size=2),
                            job["deepspeed"].update(train_batch_size=6, gradient_accumulation_steps=2)),
            ["job.json", "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step "
             "* world_size 6 != 2 * 2 * 2"])

    # ---- missing files -------------------------------------------------------------------------
    d = new_case_dir()
    expect_failure("missing job file",
                   ztrain(["run", os.path.join(d, "nope.json"), "--out", os.path.join(d, "out")]),
                   ["nope.json", "No such file"], root=d, out_dir=os.path.join(d, "out"))
    run_job("missing data file", setter(["data"], "train", "missing.txt"), ["missing.txt"])
    run_job("missing validation file", lambda j, d: (j["data"].update(val="missing_val.txt"),
                                                     j["train"].update(eval_interval=1)),
            ["missing_val.txt"])
    # A checkpoint_dir that cannot be a directory must be refused before training, not after
    # hours of work when the first checkpoint is written.
    run_job("checkpoint_dir is an existing file", setter(["train"], "checkpoint_dir", "ckpt_file"),
            ["ckpt_file"], extra_files={"ckpt_file": "not a directory\n"})
    # A job file or DeepSpeed config that is not a regular file is refused unread: /dev/zero
    # would be read until memory ran out, a FIFO without a writer would hang.
    d = new_case_dir()
    expect_failure("job file /dev/zero", ztrain(["validate", "/dev/zero"], timeout=20),
                   ["/dev/zero", "not a regular file"])
    fifo = os.path.join(d, "fifo.json")
    os.mkfifo(fifo)
    expect_failure("job file that is a FIFO", ztrain(["run", fifo, "--out", os.path.join(d, "o")],
                                                     timeout=20),
                   [fifo, "not a regular file"], root=d)
    run_job("deepspeed config that is a FIFO",
            lambda j, d: (os.mkfifo(os.path.join(d, "ds.json")), j.update(deepspeed="ds.json")),
            ["ds.json", "not a regular file"])
    big = os.path.join(d, "big.json")
    with open(big, "wb") as f:
        f.truncate(65 << 20)
    expect_failure("job file over 64 MiB", ztrain(["validate", big], timeout=20),
                   [big, "larger than 64 MiB"])
    # Numbers beyond a double's range are refused by key, in files and in --set (where they
    # would print back as null, "absent").
    run_job("lr 1e999 (not finite)", lambda j, d: j["deepspeed"]["optimizer"]["params"].update(
        lr=float("inf")), ["job.json", "optimizer.params.lr", "not a finite number"],
        raw_job=json.dumps(BASE_JOB).replace('"lr": 0.001', '"lr": 1e999'))
    expect_failure("--set world_size=1e999",
                   ztrain(["validate", os.path.join(good, "job.json"), "--set", "world_size=1e999"]),
                   ["world_size", "not a finite number"])
    # "auto" outside the DeepSpeed keys the Hugging Face Trainer fills is refused by key.
    run_job('train.max_steps "auto"', setter(["train"], "max_steps", "auto"),
            ["job.json", "train.max_steps", '"auto"'])
    run_job('zero_optimization.stage "auto"', setter(["deepspeed"], "zero_optimization",
                                                     {"stage": "auto"}),
            ["job.json", "zero_optimization.stage", '"auto"'])
    # The name is the default run directory runs/<name>: it is one path component.
    for bad_name in ("../../esc", "", "a/b", ".hidden"):
        d = new_case_dir()
        os.makedirs(os.path.join(d, "w", "x"))
        write_job(os.path.join(d, "job.json"), dict(BASE_JOB, name=bad_name))
        p = subprocess.run([ZTRAIN, "run", os.path.join(d, "job.json")], capture_output=True,
                           timeout=60, cwd=os.path.join(d, "w", "x"))
        expect_failure(f"name {bad_name!r} (the default run directory runs/<name>)",
                       (p.returncode, p.stdout.decode(), p.stderr.decode()), ["job.json", "name"],
                       root=d)
        ck.check(sorted(os.listdir(d)) == ["job.json", "train.txt", "w"] and
                 os.listdir(os.path.join(d, "w")) == ["x"] and
                 os.listdir(os.path.join(d, "w", "x")) == [],
                 f"name {bad_name!r}: nothing was written")
    d = new_case_dir()
    write_job(os.path.join(d, "job.json"), BASE_JOB)
    with open(os.path.join(d, "out_file"), "w") as f:
        f.write("a file where the output directory should go\n")
    expect_failure("--out names an existing file",
                   ztrain(["run", os.path.join(d, "job.json"), "--out", os.path.join(d, "out_file")]),
                   ["out_file"], root=d)
    run_job("data shorter than one sample", setter(["data"], "train", "tiny.txt"), ["tiny.txt"],
            extra_files={"tiny.txt": b"0123456789"})

    # ---- llm.c token files ---------------------------------------------------------------------
    def token_file(magic=20240520, version=1, count=None, tokens=None, extra=b""):
        tokens = list(tokens if tokens is not None else (i % 200 for i in range(2000)))
        header = [0] * 256
        header[0], header[1] = magic, version
        header[2] = len(tokens) if count is None else count
        return (struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens) + extra)

    run_job("token file with a bad magic", setter(["data"], "train", "train.bin"),
            ["train.bin", "magic", "12345"], extra_files={"train.bin": token_file(magic=12345)})
    run_job("token file with a bad version", setter(["data"], "train", "train.bin"),
            ["train.bin", "version", "3"], extra_files={"train.bin": token_file(version=3)})
    run_job("token file whose size does not match the header", setter(["data"], "train", "train.bin"),
            ["train.bin", "2500"], extra_files={"train.bin": token_file(count=2500)})
    run_job("token file shorter than its header", setter(["data"], "train", "train.bin"),
            ["train.bin"], extra_files={"train.bin": b"\x01\x02\x03"})
    run_job("token >= vocab_size in a token file", setter(["data"], "train", "train.bin"),
            ["train.bin", "300", "vocab_size"],
            extra_files={"train.bin": token_file(tokens=[5] * 1000 + [300] + [7] * 999)})

    # ---- init_from weights that do not fit the model -------------------------------------------
    def init_case(what, change, fragments, name="init.safetensors"):
        def mutate(job, d):
            params = gpt2_random_params(L, C, V, T, seed=1)
            change(params)
            st_write(os.path.join(d, "init.safetensors"), params)
            job["model"]["init_from"] = name
        run_job(what, mutate, fragments)

    init_case("init_from with a transposed c_attn weight",
              lambda p: p.update({"h.0.attn.c_attn.weight": p["h.0.attn.c_attn.weight"].t().contiguous()}),
              ["init.safetensors", "h.0.attn.c_attn.weight", "shape"])
    init_case("init_from missing ln_f.bias", lambda p: p.pop("ln_f.bias"),
              ["init.safetensors", "ln_f.bias", "missing"])
    init_case("init_from with an extra unknown tensor",
              lambda p: p.update({"h.0.attn.rotary.inv_freq": torch.zeros(8)}),
              ["init.safetensors", "h.0.attn.rotary.inv_freq"])
    init_case("init_from with a second layer the 1-layer model lacks",
              lambda p: p.update({"h.1.ln_1.weight": torch.ones(C)}),
              ["init.safetensors", "h.1.ln_1.weight"])
    # GPT-2 ties the LM head to wte, so ztrain keeps no lm_head of its own; a file whose
    # lm_head.weight differs from wte (an untied head) cannot be loaded without losing it.
    init_case("init_from with an lm_head.weight that differs from wte",
              lambda p: p.update({"lm_head.weight": p["wte.weight"] + 0.5}),
              ["init.safetensors", "lm_head.weight"])
    # "wte.weight" and "transformer.wte.weight" are the same parameter once the HF prefix is
    # dropped; a file holding both (with different values) is ambiguous and must not load.
    init_case("init_from holding wte.weight twice (with and without transformer.)",
              lambda p: p.update({"transformer.wte.weight": p["wte.weight"] * 2}),
              ["init.safetensors", "wte.weight"])
    init_case("init_from path that does not exist", lambda p: None, ["absent.safetensors"],
              name="absent.safetensors")
    # Non-finite weights are damage, refused at load naming the tensor, not blamed on the lr
    # when the first step's gradient norm comes out NaN.
    init_case("init_from with a NaN in h.0.mlp.c_fc.weight",
              lambda p: p["h.0.mlp.c_fc.weight"].view(-1).__setitem__(5, float("nan")),
              ["init.safetensors", "h.0.mlp.c_fc.weight", "nan", "element 5"])
    init_case("init_from with an infinity in ln_f.weight",
              lambda p: p["ln_f.weight"].view(-1).__setitem__(0, float("-inf")),
              ["init.safetensors", "ln_f.weight", "-inf", "element 0"])

    def not_safetensors(job, d):
        with open(os.path.join(d, "weights.safetensors"), "w") as f:
            f.write("this is a text file, not safetensors\n" * 10)
        job["model"]["init_from"] = "weights.safetensors"
    run_job("init_from that is not a safetensors file", not_safetensors, ["weights.safetensors"])

    # ---- options that are valid DeepSpeed but not implemented yet ------------------------------
    run_job("zero_optimization.stage 4 (outside 0-3)",
            setter(["deepspeed"], "zero_optimization", {"stage": 4}),
            ["job.json", "stage", "4"])
    run_job("zero_optimization.reduce_bucket_size 0",
            setter(["deepspeed"], "zero_optimization", {"stage": 2, "reduce_bucket_size": 0}),
            ["job.json", "reduce_bucket_size", "0"])
    run_job("fp16.loss_scale_window 0 (must be > 0 when dynamic)",
            setter(["deepspeed"], "fp16", {"enabled": True, "loss_scale_window": 0}),
            ["job.json", "loss_scale_window"])
    run_job("offload_optimizer nvme with an nvme_path that does not exist",
            setter(["deepspeed"], "zero_optimization",
                   {"stage": 1, "offload_optimizer": {"device": "nvme",
                                                      "nvme_path": "/no/such/nvme"}}),
            ["job.json", "offload_optimizer.nvme_path", "/no/such/nvme"])
    # Without the CUDA backend the spec is refused; with it, on this host without a GPU, the
    # backend's creation is: either way the message names the file and the field's value.
    run_job('device "cuda" (no CUDA backend, or no GPU here)', setter([], "device", "cuda"),
            ["job.json", 'device "cuda"'])
    run_job('device "tpu" (unknown)', setter([], "device", "tpu"), ["job.json", "tpu"])
    run_job("fp16 and bf16 both enabled",
            lambda j, d: j["deepspeed"].update(fp16={"enabled": True}, bf16={"enabled": True}),
            ["bfloat16 and fp16 modes cannot be simultaneously enabled"])

    # ---- command-line usage --------------------------------------------------------------------
    rc, out, err = ztrain(["run"])
    ck.check(rc == 2 and "usage" in err,
             f"`ztrain run` with no job: exit {rc} (want 2) and usage on stderr: {'usage' in err}")
    rc, out, err = ztrain(["run", os.path.join(good, "job.json"), "--bogus"])
    ck.check(rc == 2 and "usage" in err and "--bogus" in err,
             f"`ztrain run JOB --bogus`: exit {rc} (want 2), usage and the option named: "
             f"{'usage' in err and '--bogus' in err}")
    rc, out, err = ztrain([])
    ck.check(rc == 0 and "usage" in out,
             f"bare `ztrain`: exit {rc} (want 0, as bare docker and kubectl) and usage on stdout")
    rc, out, err = ztrain(["validate", os.path.join(good, "job.json"), "--set", "train.max_steps"])
    ck.check(rc == 2 and "train.max_steps" in err and "KEY.PATH=VALUE" in err,
             f"`--set train.max_steps` (no '='): exit {rc} (want 2), the override named")
    rc, out, err = ztrain(["run", os.path.join(good, "job.json"), "--out", ""])
    ck.check(rc == 2 and "--out" in err,
             f"`run --out ''`: exit {rc} (want 2), --out named: {err.strip()[:120]}")
    rc, out, err = ztrain(["estimate", os.path.join(good, "job.json"), "--max-device-memory"])
    ck.check(rc == 2 and "--max-device-memory needs a value" in err,
             f"`estimate JOB --max-device-memory`: exit {rc} (want 2), 'needs a value': "
             f"{err.strip()[:120]}")
    rc, out, err = ztrain(["frobnicate"])
    ck.check(rc == 2 and "frobnicate" in err and "usage" in err,
             f"`ztrain frobnicate`: exit {rc} (want 2), command named with usage")
    rc, out, err = ztrain(["run", os.path.join(good, "job.json"), "--threads", "many"])
    ck.check(rc == 2 and "--threads" in err and "many" in err,
             f"`ztrain run JOB --threads many`: exit {rc} (want 2), value named")

    # ---- sample options a valid checkpoint cannot honour ----------------------------------------
    good_ckpt = os.path.join(good, "ckpt")
    expect_failure("sample --prompt-tokens 999 (>= vocab_size 256)",
                   ztrain(["sample", good_ckpt, "--prompt-tokens", "1,999", "--tokens", "5"]),
                   ["999", "vocab_size"])
    expect_failure("sample --prompt-tokens -5",
                   ztrain(["sample", good_ckpt, "--prompt-tokens", "-5", "--tokens", "5"]), ["-5"])
    expect_failure("sample --temperature 0",
                   ztrain(["sample", good_ckpt, "--temperature", "0", "--tokens", "5"]),
                   ["temperature"])
    expect_failure("sample --tokens 0",
                   ztrain(["sample", good_ckpt, "--tokens", "0"]), ["--tokens", "0"], exit_code=2)
    # A prompt longer than the old 4096-byte buffer is kept whole, not cut to its first 4096
    # bytes: the model sees its last block_size tokens, as nanoGPT crops idx[:, -block_size:],
    # so the continuation is the one of those T bytes alone (same seed), and stderr says so.
    long_prompt = "the best of times " * 300 + "it was the age of"
    rc, out, err = ztrain(["sample", good_ckpt, "--prompt", long_prompt, "--tokens", "8",
                           "--seed", "5"])
    rc2, out2, _ = ztrain(["sample", good_ckpt, "--prompt", long_prompt[-T:], "--tokens", "8",
                           "--seed", "5"])
    ck.check(rc == 0 and rc2 == 0 and out.startswith(long_prompt) and
             out[len(long_prompt):] == out2[T:] and f"block_size {T}" in err,
             f"sample with a {len(long_prompt)}-byte prompt: kept whole, the last {T} bytes as "
             f"context ({rc}, {rc2}: {err.strip()[:160]})")
    rc, out, err = ztrain(["sample", good_ckpt, "--prompt", "x", "--prompt-tokens", "1"])
    ck.check(rc == 2 and "--prompt" in err and "--prompt-tokens" in err,
             f"sample --prompt with --prompt-tokens: exit {rc} (want 2), both named")
    rc, out, err = ztrain(["zero-to-fp32", good_ckpt])
    ck.check(rc == 2 and err.startswith("ztrain: zero-to-fp32:") and "usage: ztrain zero-to-fp32"
             in err, f"zero-to-fp32 without OUT speaks as itself: exit {rc}: {err.strip()[:120]}")
    rc, out, err = ztrain(["zero-to-fp32", good_ckpt, os.path.join(good, "z.safetensors"),
                           "--hf", os.path.join(good, "hf")])
    ck.check(rc == 2 and "--hf" in err and not os.path.exists(os.path.join(good, "hf")),
             f"zero-to-fp32 refuses export's --hf: exit {rc}: {err.strip()[:120]}")
    expect_failure("sample --prompt-tokens 1,,2",
                   ztrain(["sample", good_ckpt, "--prompt-tokens", "1,,2"]), ["1,,2"], exit_code=2)

    rc, out, err = ztrain(["export", good_ckpt, "--out",
                           os.path.join(good, "no", "such", "dir", "m.safetensors")])
    expect_failure("export to a directory that does not exist", (rc, out, err),
                   [os.path.join(good, "no", "such", "dir"), "--out", "no such directory"])
    ck.check(".tmp" not in err, f"export --out names the missing directory, not its temporary "
             f"file ({err.strip()[:200]})")
    # An existing file is replaced, as zero_to_fp32 and torch.save replace theirs, and the
    # export says so; a directory at that path is refused and left as it was.
    older = os.path.join(good, "older.safetensors")
    with open(older, "w") as f:
        f.write("an older export")
    rc, out, err = ztrain(["export", good_ckpt, "--out", older])
    with open(older, "rb") as f:
        head = f.read(8)
    ck.check(rc == 0 and f"--out {older} exists: it is replaced" in err
             and len(head) == 8 and int.from_bytes(head, "little") > 0,
             f"export --out onto an existing file replaces it and says so: exit {rc}, "
             f"{err.strip()[:160]!r}")
    busy = os.path.join(good, "a-directory.safetensors")
    os.makedirs(busy)
    expect_failure("export --out onto a directory",
                   ztrain(["export", good_ckpt, "--out", busy]), [busy, "not a regular file"])
    ck.check(os.listdir(busy) == [], "export --out left the directory as it was")

    # ---- a checkpoint whose saved values were overwritten with NaN ------------------------------
    def damaged_checkpoint(what, file, tensor, element, value_bytes, fragments):
        d = new_case_dir()
        shutil.copytree(good_ckpt, os.path.join(d, "ckpt"))
        with open(os.path.join(good_ckpt, "latest")) as f:
            tag = f.read().strip()
        path = os.path.join(d, "ckpt", tag, file)
        with open(path, "r+b") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            assert header[tensor]["dtype"] == "F32", header[tensor]
            f.seek(8 + n + header[tensor]["data_offsets"][0] + 4 * element)
            f.write(value_bytes)
        job = copy.deepcopy(BASE_JOB)
        job["train"].update({"resume": True, "max_steps": 4})
        write_job(os.path.join(d, "job.json"), job)
        out_dir = os.path.join(d, "out")
        rc, out, err = ztrain(["run", os.path.join(d, "job.json"), "--out", out_dir])
        expect_failure(what, (rc, out, err), [path, f"'{tensor}'"] + fragments, out_dir=out_dir)
        ck.check("learning rate" not in err and " lr" not in err and "gradient norm" not in err,
                 f"{what}: not blamed on the learning rate: {err.strip()[:200]}")

    damaged_checkpoint("a checkpoint's model.safetensors with a NaN in h.0.attn.c_proj.weight",
                       "model.safetensors", "h.0.attn.c_proj.weight", 7,
                       struct.pack("<I", 0x7FC00000), ["nan", "element 7"])
    damaged_checkpoint("a checkpoint's optimizer state with an infinity in exp_avg_sq",
                       "optim_rank_00000.safetensors", "exp_avg_sq", 3, struct.pack("<f", float("inf")),
                       ["inf", "element 3"])

    # ---- sample / export on missing or unfinished checkpoints ----------------------------------
    empty = new_case_dir()
    expect_failure("sample on a directory with no checkpoint",
                   ztrain(["sample", empty, "--tokens", "5"]), [empty])
    rc, out, err = ztrain(["sample", empty, "--tokens", "5"])
    ck.check(out == "", f"sample with no checkpoint prints nothing on stdout (got {out[:40]!r})")

    ckpt = good_ckpt
    with open(os.path.join(ckpt, "latest")) as f:
        tag = f.read().strip()
    tagdir = os.path.join(ckpt, tag)
    os.remove(os.path.join(tagdir, "DONE"))
    rc, out, err = ztrain(["sample", ckpt, "--tokens", "5"])
    expect_failure("sample on a checkpoint without its DONE marker", (rc, out, err),
                   [tagdir, "DONE"])
    ck.check(out == "", f"sample of an unfinished checkpoint prints nothing (got {out[:40]!r})")
    exported = os.path.join(good, "exported.safetensors")
    expect_failure("export of a checkpoint without its DONE marker",
                   ztrain(["export", ckpt, "--out", exported]), [tagdir, "DONE"],
                   forbidden_files=[exported])
    expect_failure("sample with a tag that does not exist",
                   ztrain(["sample", ckpt, "--tag", "global_step99", "--tokens", "5"]),
                   ["global_step99"])
    # A tag is a name inside CKPT_DIR: one that climbs out would read another checkpoint (here a
    # complete copy beside it), or the directory itself. Refused as a usage error naming --tag.
    shutil.copytree(ckpt, os.path.join(good, "other"))
    with open(os.path.join(good, "other", tag, "DONE"), "w") as f:
        f.write(tag)
    for bad_tag in (f"../other/{tag}", "..", ".", ""):
        for cmd in (["sample", ckpt, "--tokens", "5"], ["export", ckpt, "--out", exported]):
            rc, out, err = ztrain(cmd + ["--tag", bad_tag])
            expect_failure(f"{cmd[0]} --tag '{bad_tag}'", (rc, out, err),
                           ["--tag", f"'{bad_tag}'", ckpt], exit_code=2,
                           forbidden_files=[exported])
            ck.check(out == "", f"{cmd[0]} --tag '{bad_tag}' prints nothing (got {out[:40]!r})")
finally:
    shutil.rmtree(top, ignore_errors=True)

ck.done()
