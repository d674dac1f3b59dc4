"""The CLI behaves as users of kubectl, docker and torchrun expect (issue 30):

a. every command of `ztrain help`'s list answers `CMD --help`, `CMD -h` and `ztrain help CMD`
   with exit 0 and its own usage line; an unknown command is exit 2; `--version` on ztrain,
   ztraind and ztrain-worker prints the version of CMakeLists.txt's project();
b. `--opt=value` and `--opt value` give the same run; `--set` overrides reach every rank (a
   2-rank run stops at the overridden max_steps), go into a "deepspeed" file, and bad ones are
   refused naming the override;
c. `ztrain validate` prints the effective config, the estimate and the verdict, makes nothing,
   and exits 1 for a job this host cannot admit; `submit --dry-run` the same without a server;
d. the bash completion generated from the command table completes commands, options and -o's
   values, and lists every command of the help text (zsh's too, parsed by zsh);
e. `ztrain init --hf DIR` writes a job file that reads back with the directory's model and the
   given DeepSpeed config, and never overwrites one;
f. ztrain-worker takes torch's --local_rank=N and ignores it, and refuses a bad value; the
   options it shares with `ztrain run` (--out, --threads, --set, --profile) take run's forms:
   `--opt=value` and `--opt value` give the same run as `ztrain run` with them, `--profile`,
   `--profile ops` and `--profile=ops` all profile, and its --help lists them; a bad --set, an
   unknown profile and an empty --out are exit 2 as for run, and so are an option without its
   value, an unknown option and --help=x, each said as run says it; `--` ends its options;
g. against a real ztraind with a token: ZTRAIN_TOKEN_FILE names the token's file, both variables
   set is refused naming them; `list -o json|name|wide`, `status -o json|name`; `cancel` of two
   ids cancels both, and an unknown id among them is exit 1 after the others are cancelled; a
   job's resource name jobs/ID (the server's messages name jobs so) works where its id does.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()
import torch  # noqa: E402,F401  (transformers needs it)
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import BUILD, SRC, ZTRAIN, Checks  # noqa: E402
ck = Checks()
check = ck.check


def env_clean(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("ZTRAIN_")}
    e.update(extra)
    return e


def run(args, env=None, cwd=None, timeout=300):
    p = subprocess.run(args, capture_output=True, text=True, env=env or env_clean(), cwd=cwd,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def write_job(d, name="job.json", **over):
    with open(os.path.join(d, "train.txt"), "wb") as f:
        f.write(bytes((i * 7919) % 251 for i in range(20000)))
    job = {"name": "conv", "world_size": 1,
           "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256,
                     "block_size": 16},
           "data": {"train": "train.txt"},
           "train": {"max_steps": 4, "log_interval": 1, "seed": 3},
           "deepspeed": "ds.json"}
    job.update(over)
    with open(os.path.join(d, "ds.json"), "w") as f:
        json.dump({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, f)
    path = os.path.join(d, name)
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def last_step(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return max(r.get("train/global_step", 0) for r in recs)


def part_a():
    rc, usage, _ = run([ZTRAIN, "help"])
    commands = re.findall(r"^  ([a-z][a-z0-9-]+)", usage, re.M)
    check(rc == 0 and len(commands) >= 15, f"a: `ztrain help` lists {len(commands)} commands")
    for c in commands:
        outs = [run([ZTRAIN, c, "--help"]), run([ZTRAIN, c, "-h"]), run([ZTRAIN, "help", c])]
        ok = all(o[0] == 0 and o[1].startswith(f"usage: ztrain {c}") for o in outs)
        check(ok and outs[0][1] == outs[2][1], f"a: {c} --help, -h and `help {c}` exit 0 with "
              "its usage")
    rc, _, err = run([ZTRAIN, "frobnicate"])
    check(rc == 2 and "unknown command 'frobnicate'" in err, "a: an unknown command is exit 2")
    rc, _, err = run([ZTRAIN, "help", "frobnicate"])
    check(rc == 2 and "frobnicate" in err, "a: help for an unknown command is exit 2")
    version = re.search(r"project\(ztrain VERSION ([0-9.]+)",
                        open(os.path.join(SRC, "CMakeLists.txt")).read()).group(1)
    for prog in ("ztrain", "ztraind", "ztrain-worker"):
        rc, out, _ = run([os.path.join(BUILD, prog), "--version"])
        check(rc == 0 and out.strip() == f"{prog} {version}", f"a: {prog} --version: {out.strip()}")
    return commands


def part_b(tmp):
    job = write_job(tmp)
    rc1, _, e1 = run([ZTRAIN, "run", job, "--out=" + os.path.join(tmp, "o1"), "--set=train.max_steps=3"])
    rc2, _, e2 = run([ZTRAIN, "run", job, "--out", os.path.join(tmp, "o2"), "--set", "train.max_steps=3"])
    check(rc1 == 0 and rc2 == 0, f"b: run with --opt=value and --opt value ({e1[-300:]}{e2[-300:]})")
    # The steps_per_print line is DeepSpeed's _report_progress: lr=get_lr(), mom=get_mom(), the
    # param groups' values printed by Python's str(). DeepSpeed hands the config's "betas" list to
    # the optimizer as it is; without one the optimizer's default is the tuple (0.9, 0.999).
    for betas, lr in (([0.5, 0.6], 1e-3), (None, 3e-05)):
        params = {"lr": lr, **({"betas": betas} if betas else {})}
        o = os.path.join(tmp, f"spp{lr}")
        rc, out, err = run([ZTRAIN, "run", job, "--out", o, "--set", "train.max_steps=2",
                            "--set", "deepspeed.steps_per_print=1", "--set",
                            "deepspeed.optimizer=" + json.dumps({"type": "AdamW", "params": params})])
        mom = [betas] if betas else [(0.9, 0.999)]
        want = [f"[ztrain] step={s}, skipped=0, lr={[lr]}, mom={mom}" for s in (1, 2)]
        got = [line for line in (out + err).splitlines() if "step=" in line and "mom=" in line]
        check(rc == 0 and got == want, f"b: the steps_per_print line is DeepSpeed's ({got} vs {want})")
    # Without an optimizer section the Trainer's AdamW holds betas=(adam_beta1, adam_beta2).
    o = os.path.join(tmp, "spp-trainer")
    rc, out, err = run([ZTRAIN, "run", job, "--out", o, "--set", "train.max_steps=1",
                        "--set", 'deepspeed={"train_batch_size": 4, "steps_per_print": 1}',
                        "--set", 'training_args={"learning_rate": 0.002, "adam_beta1": 0.8, '
                        '"per_device_train_batch_size": 4}'])
    want = [f"[ztrain] step=1, skipped=0, lr={[0.002]}, mom={[(0.8, 0.999)]}"]
    got = [line for line in (out + err).splitlines() if "step=" in line and "mom=" in line]
    check(rc == 0 and got == want, f"b: the Trainer's optimizer's betas are a tuple ({got} vs {want}"
          f" {err.strip()[-200:]})")
    # --profile's value is optional: written apart it is taken when it names a profile.
    for form in (["--profile", "ops"], ["--profile=ops"], ["--profile"]):
        o = os.path.join(tmp, "p" + str(len(form)) + form[0][-3:])
        rc, _, err = run([ZTRAIN, "run", job, "--out", o, "--set", "train.max_steps=2"] + form)
        check(rc == 0 and os.path.exists(os.path.join(o, "profile.json")),
              f"b: run {' '.join(form)} profiles ({rc}: {err.strip()[-160:]})")
    if rc1 == 0 and rc2 == 0:
        check(last_step(os.path.join(tmp, "o1")) == 3 == last_step(os.path.join(tmp, "o2")),
              "b: both stop at the overridden max_steps 3 (the file says 4)")
    rc, _, err = run([ZTRAIN, "run", job, "--out", os.path.join(tmp, "o3"), "--set", "world_size=2",
                      "--set", "train.max_steps=2", "--set", "deepspeed.train_batch_size=8"])
    check(rc == 0 and last_step(os.path.join(tmp, "o3")) == 2,
          f"b: a 2-rank run's ranks read the overrides too (exit {rc}) {err[-400:]}")
    rc, _, err = run([ZTRAIN, "validate", job, "--set", "deepspeed.train_batch_size=7"])
    check(rc == 1 and "train_batch_size" in err and "7" in err,
          f"b: an override into the deepspeed file is applied (DeepSpeed's batch check: {err.strip()[-160:]})")
    rc, _, err = run([ZTRAIN, "run", job, "--set", "train.max_steps.x=1"])
    check(rc == 1 and "train.max_steps" in err and "not an object" in err,
          f"b: a path through a number is refused naming it ({err.strip()})")
    rc, _, err = run([ZTRAIN, "run", job, "--set", "nokey"])
    check(rc == 2 and "'nokey'" in err,
          f"b: an override without '=' is bad usage, exit 2 ({rc}: {err.strip()})")
    rc, _, err = run([ZTRAIN, "run", job, "--set", "train.bogus_key=1"])
    check(rc == 1 and "bogus_key" in err, f"b: an unknown key set is refused by the parser ({err.strip()[-120:]})")


def part_c(tmp):
    d = os.path.join(tmp, "c")
    os.makedirs(d)
    job = write_job(d, train={"max_steps": 4, "checkpoint_dir": "ckpt"})
    before = sorted(os.listdir(d))
    rc, out, err = run([ZTRAIN, "validate", job])
    check(rc == 0 and "effective DeepSpeed config" in out and "memory:" in out
          and "admission: fits" in out, f"c: validate prints config, estimate, verdict ({err[-200:]})")
    check(sorted(os.listdir(d)) == before, "c: validate makes nothing (no ckpt, no runs)")
    rc, out, err = run([ZTRAIN, "validate", job, "--set", "model.n_embd=65536",
                        "--set", "model.n_head=1", "--set", "model.n_layer=2"])
    check(rc == 1 and "admission: refused" in out, f"c: a job too big for this host is exit 1 "
          f"({out.strip().splitlines()[-1] if out.strip() else err[-200:]})")
    rc, out, err = run([ZTRAIN, "submit", job, "--dry-run", "--server", "127.0.0.1:1"])
    check(rc == 0 and "admission: fits" in out, f"c: submit --dry-run needs no server ({err[-200:]})")
    # What `run` refuses, validate refuses too: two nodes (run starts every rank here), an nvme
    # offload directory that does not exist (the ranks would fail making theirs).
    rc, out, err = run([ZTRAIN, "validate", job, "--set", "nodes=2", "--set", "world_size=2",
                        "--set", "deepspeed.train_batch_size=8"])
    check(rc == 1 and "2 nodes" in err and "valid;" not in out,
          f"c: validate refuses nodes 2 as run does ({rc}: {err.strip()[-160:]})")
    rc, out, err = run([ZTRAIN, "validate", job, "--set",
                        'deepspeed.zero_optimization={"stage": 3, "offload_param": '
                        '{"device": "nvme", "nvme_path": "/no/such/nvme"}}'])
    check(rc == 1 and "offload_param.nvme_path" in err and "/no/such/nvme" in err
          and "valid;" not in out,
          f"c: validate refuses a missing nvme_path as run does ({rc}: {err.strip()[-160:]})")
    # Warnings go to stderr under validate as under run.
    rc, out, err = run([ZTRAIN, "validate", job, "--set", "deepspeed.dump_state=true"])
    check(rc == 0 and "dump_state has no effect" in err and "dump_state has no effect" not in out,
          f"c: validate's config warnings are on stderr ({rc})")
    # Structured output: -o json in each spelling, and --json where it was.
    outs = [run([ZTRAIN, "estimate", job] + form)
            for form in (["-o", "json"], ["-ojson"], ["-o=json"], ["--output", "json"],
                         ["--output=json"], ["--json"])]
    # The host's available memory moves between runs; the rest is the job's.
    forms = [{k: v for k, v in json.loads(o[1]).items() if k != "available_bytes"}
             if o[0] == 0 else None for o in outs]
    check(all(o[0] == 0 for o in outs) and all(f == forms[0] for f in forms)
          and forms[0]["world_size"] == 1,
          f"c: estimate -o json, -ojson, -o=json, --output json, --output=json, --json agree "
          f"({[o[0] for o in outs]}: {outs[0][2].strip()[-120:]})")
    rc, _, err = run([ZTRAIN, "estimate", job, "-o", "wide"])
    check(rc == 2 and "wide" in err, "c: estimate -o wide is bad usage naming it")
    # validate -o json: one object read by Python's json module, the same in each spelling; the
    # warnings in it rather than on stderr; an invalid job is valid: false with its error.
    outs = [run([ZTRAIN, "validate", job, "--set", "deepspeed.dump_state=true"] + form)
            for form in (["-o", "json"], ["-ojson"], ["-o=json"], ["--output", "json"],
                         ["--json"])]
    docs = [json.loads(o[1]) if o[0] == 0 else None for o in outs]
    v = docs[0] or {}
    check(all(o[0] == 0 and not o[2] for o in outs) and all(d == v for d in docs)
          and sorted(v) == ["effective_config", "errors", "resolved", "valid", "warnings"]
          and v["valid"] is True and v["errors"] == []
          and any("dump_state has no effect" in w for w in v["warnings"])
          and v["effective_config"]["dump_state"] is True
          and isinstance(v["effective_config"]["train_batch_size"], int),
          f"c: validate -o json, -ojson, -o=json, --output json, --json agree and hold the "
          f"warnings ({[o[0] for o in outs]}: {outs[0][2].strip()[-160:]})")
    rc, out, err = run([ZTRAIN, "validate", job, "-o", "json", "--set",
                        'deepspeed.scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 3.0}}'])
    v = json.loads(out) if out.strip() else {}
    check(rc == 1 and v.get("valid") is False and len(v.get("errors", [])) == 1
          and "warmup_num_steps must be a positive integer, got 3.0" in v["errors"][0]
          and v.get("effective_config") is None and not err,
          f"c: validate -o json of an invalid job: valid false with the error, exit 1 ({rc}: "
          f"{out.strip()[-200:]} {err.strip()[-120:]})")
    rc, _, err = run([ZTRAIN, "validate", job, "-o", "yaml"])
    check(rc == 2 and "yaml" in err, "c: validate -o yaml is bad usage naming it")


def part_d(commands):
    rc, script, _ = run([ZTRAIN, "completion", "bash"])
    check(rc == 0 and all(f" {c}) opts=" in script for c in commands),
          "d: the bash completion has a case for every command of the help text")

    def complete(words):
        prog = (script + "\nCOMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + ")\n"
                f"COMP_CWORD={len(words) - 1}\n_ztrain\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
        return subprocess.run(["bash", "-c", prog], capture_output=True, text=True,
                              timeout=30).stdout.split()

    check(complete(["ztrain", "ru"]) == ["run"], "d: `ztrain ru<TAB>` completes to run")
    check("-o" in complete(["ztrain", "list", "-"]), "d: `ztrain list -<TAB>` offers -o")
    check(sorted(complete(["ztrain", "list", "-o", ""])) == ["json", "name", "wide"],
          "d: `ztrain list -o <TAB>` offers json, name, wide")
    check("--set" in complete(["ztrain", "submit", "--s"]) and
          "--server" in complete(["ztrain", "submit", "--s"]), "d: submit's options, --set and "
          "--server")
    rc, zsh, _ = run([ZTRAIN, "completion", "zsh"])
    check(rc == 0 and zsh.startswith("#compdef ztrain") and all(f"\n    {c}) opts=(" in zsh
                                                                  for c in commands),
          "d: the zsh completion has every command")
    # zsh comes with the test profile of scripts/install-deps.sh: a missing one is a failure.
    if check(shutil.which("zsh"), "d: zsh is installed to parse it (install-deps.sh test)"):
        p = subprocess.run(["zsh", "-n"], input=zsh, capture_output=True, text=True)
        check(p.returncode == 0, f"d: zsh parses it ({p.stderr.strip()})")
    rc, _, err = run([ZTRAIN, "completion", "fish"])
    check(rc == 2 and "fish" in err, "d: an unknown shell is exit 2")


def part_e(tmp):
    d = os.path.join(tmp, "e")
    hf = os.path.join(d, "models", "tiny")
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64,
                               vocab_size=300)).save_pretrained(hf, safe_serialization=True)
    with open(os.path.join(d, "ds.json"), "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                   "zero_optimization": {"stage": 1},
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}, f)
    out = os.path.join(d, "job.json")
    rc, o, err = run([ZTRAIN, "init", "--hf", hf, "--deepspeed", os.path.join(d, "ds.json"),
                      "--out", out])
    check(rc == 0 and os.path.exists(out), f"e: init --hf writes {out} ({err.strip()})")
    if rc == 0:
        job = json.load(open(out))
        check(job["model"]["init_from"] == "models/tiny" and job["deepspeed"] == "ds.json"
              and job["model"]["block_size"] == 64,
              "e: init_from and deepspeed relative to the job file; block_size from n_positions")
        rc, o, err = run([ZTRAIN, "estimate", out, "--json"])
        est = json.loads(o) if rc == 0 else {}
        n_params = sum(p.numel() for p in GPT2LMHeadModel.from_pretrained(hf).parameters())
        check(est.get("params") == n_params and est.get("stage") == 1,
              f"e: the job reads back with the directory's {n_params} parameters and ZeRO 1 "
              f"({est.get('params')}, {err.strip()[-200:]})")
    before = open(out).read() if os.path.exists(out) else None
    rc, _, err = run([ZTRAIN, "init", "--hf", hf, "--out", out])
    check(rc == 1 and "kept" in err and open(out).read() == before,
          f"e: an existing job file is never overwritten ({err.strip()})")
    rc, _, err = run([ZTRAIN, "init", "--hf", os.path.join(d, "nope")])
    check(rc == 2 and "nope" in err, f"e: a missing directory is named ({err.strip()})")
    # The model outside the job's directory: init_from climbs out with ../, and resolves (by
    # os.path, not ztrain) to the model; the directory has no tokenizer.json, and the next step
    # printed says so instead of naming a file that is not there.
    os.makedirs(os.path.join(d, "jobs", "a"))
    out2 = os.path.join(d, "jobs", "a", "job.json")
    rc, o, err = run([ZTRAIN, "init", "--hf", hf, "--out", out2])
    init_from = json.load(open(out2))["model"]["init_from"] if rc == 0 else None
    check(rc == 0 and init_from == "../../models/tiny" and os.path.samefile(
          os.path.join(os.path.dirname(out2), init_from), hf),
          f"e: init_from relative with ../ for a model outside the job's directory "
          f"({init_from}, {err.strip()})")
    check("tokenizer.json" in o and "has no tokenizer.json" in o
          and f"{hf}/tokenizer.json" not in o,
          f"e: without a tokenizer.json the next step says so ({o.strip()})")
    # --out in a directory that does not exist is --out's fault, not --hf's.
    rc, _, err = run([ZTRAIN, "init", "--hf", hf, "--out", os.path.join(d, "newdir", "j.json")])
    check(rc == 2 and "--out" in err and "newdir" in err and f"--hf {hf}" not in err,
          f"e: a missing --out directory is named as --out's ({err.strip()})")


def part_f(tmp):
    d = os.path.join(tmp, "f")
    os.makedirs(d)
    job = write_job(d, train={"max_steps": 2, "log_interval": 1})
    worker = os.path.join(BUILD, "ztrain-worker")
    rc, _, err = run([worker, "--local_rank=0", job, "--out", os.path.join(d, "o")])
    check(rc == 0 and last_step(os.path.join(d, "o")) == 2,
          f"f: ztrain-worker --local_rank=0 trains ({err.strip()[-200:]})")
    rc, _, err = run([worker, job, "--local-rank", "0", "--out", os.path.join(d, "o2")])
    check(rc == 0, f"f: --local-rank 0 too ({err.strip()[-200:]})")
    rc, _, err = run([worker, "--local_rank=x", job])
    check(rc == 2 and "--local_rank" in err, f"f: a bad --local_rank is exit 2 ({err.strip()})")

    # The options ztrain-worker shares with `ztrain run`, in each of run's spellings.
    def losses(out_dir):
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            return [(r["train/global_step"], r["train/loss"])
                    for r in map(json.loads, filter(str.strip, f)) if "train/loss" in r]

    o = {k: os.path.join(d, k) for k in ("run", "joined", "apart", "flag")}
    forms = {
        "run": [ZTRAIN, "run", job, "--out", o["run"], "--threads", "1",
                "--set", "train.max_steps=3", "--profile"],
        "joined": [worker, job, "--out=" + o["joined"], "--threads=1", "--set=train.max_steps=3",
                   "--profile=ops"],
        "apart": [worker, job, "--out", o["apart"], "--threads", "1", "--set",
                  "train.max_steps=3", "--profile", "ops"],
        "flag": [worker, "--profile", job, "--out", o["flag"], "--set", "train.max_steps=3"],
    }
    for name, args in forms.items():
        rc, _, err = run(args)
        check(rc == 0 and os.path.exists(os.path.join(o[name], "profile.json")),
              f"f: {' '.join(a.replace(d, '$D') for a in args[1:])} trains and profiles "
              f"({rc}: {err.strip()[-200:]})")
    ref = losses(o["run"]) if os.path.exists(os.path.join(o["run"], "metrics.jsonl")) else None
    for name in ("joined", "apart", "flag"):
        got = losses(o[name]) if os.path.exists(os.path.join(o[name], "metrics.jsonl")) else None
        check(ref and len(ref) == 3 and got == ref,
              f"f: the worker's {name} spelling trains as `ztrain run` does ({got} vs {ref})")
    rc, out, _ = run([worker, "--help"])
    check(rc == 0 and all(opt in out for opt in ("--out", "--threads", "--profile [ops]",
                                                  "--set", "--validated", "--out=DIR")),
          f"f: ztrain-worker --help lists its options and the --opt=VALUE form ({out})")
    for args, what in ((["--set", "nokey"], "--set 'nokey'"),
                       (["--set=nokey"], "--set 'nokey'"),
                       (["--profile=gpu"], "--profile=gpu"),
                       (["--out="], "--out"),
                       (["--threads=0"], "--threads")):
        rc, _, err = run([worker, job] + args)
        rc_run, _, err_run = run([ZTRAIN, "run", job] + args)
        check(rc == 2 and rc_run == 2 and what in err and what in err_run,
              f"f: worker and run refuse {' '.join(args)} with exit 2 naming it "
              f"({rc}: {err.strip()[:120]} | {rc_run}: {err_run.strip()[:120]})")
    # Bad usage is told apart as `ztrain run` tells it: an option without its value, an
    # unknown option, a value given to --help; `--` ends the options of both.
    for args, what in ((["--out"], "--out needs a value"),
                       (["--set"], "--set needs a value"),
                       (["--bogus"], "unknown option '--bogus'"),
                       (["--help=x"], "--help takes no value")):
        rc, _, err = run([worker, job] + args)
        rc_run, _, err_run = run([ZTRAIN, "run", job] + args)
        check(rc == 2 and rc_run == 2 and what in err and what in err_run,
              f"f: worker and run say '{what}' for {' '.join(args)} "
              f"({rc}: {err.strip()[:120]} | {rc_run}: {err_run.strip()[:120]})")
    shutil.copy(job, os.path.join(d, "-job.json"))
    for prog in ([worker], [ZTRAIN, "run"]):
        out = os.path.join(d, "dash-" + os.path.basename(prog[-1]))
        rc, _, err = run(prog + ["--out", out, "--", "-job.json"], cwd=d)
        check(rc == 0 and os.path.exists(os.path.join(out, "metrics.jsonl")) and
              last_step(out) == 2,
              f"f: {' '.join(os.path.basename(p) for p in prog)} --out DIR -- -job.json "
              f"trains the file named -job.json ({rc}: {err.strip()[-160:]})")


def part_g(tmp):
    d = os.path.join(tmp, "g")
    os.makedirs(os.path.join(d, "data"))
    job = write_job(os.path.join(d, "data"), train={"max_steps": 100000, "log_interval": 50})
    token_file = os.path.join(d, "token")
    with open(token_file, "w") as f:
        f.write("tok-g-1\n")
    log = open(os.path.join(d, "ztraind.log"), "w+")
    daemon = subprocess.Popen(
        [os.path.join(BUILD, "ztraind"), "--grpc-addr", "127.0.0.1:0", "--http-addr",
         "127.0.0.1:0", "--state-dir", os.path.join(d, "state"), "--data-root",
         os.path.join(d, "data"), "--runs-root", os.path.join(d, "runs"), "--max-ranks", "1",
         "--threads-per-rank", "1", "--grace", "5"],
        env=env_clean(ZTRAIN_TOKEN_FILE=token_file), stdout=log, stderr=subprocess.STDOUT)
    try:
        m = None
        for _ in range(300):
            log.seek(0)
            m = re.search(r"ready grpc=(\S+)", log.read())
            if m or daemon.poll() is not None:
                break
            time.sleep(0.1)
        log.seek(0)
        check(m is not None and "auth=bearer" in log.read(), "g: ztraind takes its token from "
              "ZTRAIN_TOKEN_FILE")
        if not m:
            return
        server = m.group(1)
        env = env_clean(ZTRAIN_SERVER=server, ZTRAIN_TOKEN_FILE=token_file)
        rc, _, err = run([ZTRAIN, "list"], env=env_clean(ZTRAIN_SERVER=server))
        check(rc == 1 and "UNAUTHENTICATED" in err.upper(), "g: without a token: refused")
        rc, _, err = run([ZTRAIN, "list"], env=env_clean(ZTRAIN_SERVER=server,
                                                          ZTRAIN_TOKEN_FILE=token_file,
                                                          ZTRAIN_TOKEN="tok-g-1"))
        check(rc == 1 and "ZTRAIN_TOKEN_FILE" in err and "ZTRAIN_TOKEN " in err,
              f"g: both variables set is refused naming them ({err.strip()})")
        ids = []
        for _ in range(2):
            rc, out, err = run([ZTRAIN, "submit", job], env=env)
            ids.append(out.strip())
        check(rc == 0 and all(re.match(r"job-\d+$", i) for i in ids),
              f"g: two jobs submitted with the token from ZTRAIN_TOKEN_FILE ({ids}, {err.strip()})")
        rc, out, _ = run([ZTRAIN, "list", "-o", "json"], env=env)
        listed = json.loads(out)["jobs"] if rc == 0 else []
        check(sorted(j["id"] for j in listed) == sorted(ids), "g: list -o json: both jobs")
        for form in (["-ojson"], ["--output", "json"], ["--output=json"], ["--json"]):
            rc, out, _ = run([ZTRAIN, "list"] + form, env=env)
            check(rc == 0 and sorted(j["id"] for j in json.loads(out)["jobs"]) == sorted(ids),
                  f"g: list {' '.join(form)}: as -o json")
        rc, out, _ = run([ZTRAIN, "status", ids[0], "-ojson"], env=env)
        check(rc == 0 and json.loads(out)["id"] == ids[0], "g: status -ojson")
        rc, out, _ = run([ZTRAIN, "list", "-o=name"], env=env)
        check(rc == 0 and sorted(out.split()) == sorted(ids), "g: list -o=name: the ids alone")
        rc, out, _ = run([ZTRAIN, "list", "-o", "wide"], env=env)
        check(rc == 0 and out.split("\n")[0].split()[:8] ==
              ["ID", "STATE", "STEP", "LOSS", "TOKENS/S", "ELAPSED", "RANKS", "DEVICE"]
              and len(out.strip().split("\n")) == 3, "g: list -o wide: more columns, two rows")
        rc, out, _ = run([ZTRAIN, "status", ids[0], "-o", "json"], env=env)
        check(rc == 0 and json.loads(out)["id"] == ids[0], "g: status -o json")
        rc, out, _ = run([ZTRAIN, "status", ids[0], "-o", "name"], env=env)
        check(rc == 0 and out.strip() == ids[0], "g: status -o name")
        # A job's resource name, jobs/ID, as the server's messages write it, names it too.
        rc, out, err = run([ZTRAIN, "status", "jobs/" + ids[0], "-o", "name"], env=env)
        check(rc == 0 and out.strip() == ids[0],
              f"g: status jobs/ID is the job ({out.strip()} {err.strip()})")
        rc, _, err = run([ZTRAIN, "submit", job, "--fork-from", f"jobs/{ids[0]}@7"], env=env)
        check(rc == 1 and f"fork_from.step: jobs/{ids[0]} has no complete checkpoint" in err,
              f"g: --fork-from jobs/ID@STEP names the job ({err.strip()})")
        rc, _, err = run([ZTRAIN, "list", "-o", "yaml"], env=env)
        check(rc == 2 and "yaml" in err, "g: -o yaml is bad usage naming it")
        rc, _, err = run([ZTRAIN, "status", ids[0], "-o", "wide"], env=env)
        check(rc == 2 and "-o wide" in err, "g: status -o wide is bad usage (it has no columns)")
        rc, out, err = run([ZTRAIN, "cancel", ids[0], "job-999999", "jobs/" + ids[1], "--force"],
                           env=env)
        check(rc == 1 and "job-999999" in err and out.count(ids[0]) == 1 and
              out.count(ids[1]) == 1, f"g: cancel of three ids (one as jobs/ID): the unknown one "
              f"fails, the others are cancelled ({out.strip()} | {err.strip()})")
        deadline = time.monotonic() + 60
        states = []
        while time.monotonic() < deadline:
            rc, out, _ = run([ZTRAIN, "list", "-o", "json"], env=env)
            states = [j["state"] for j in json.loads(out)["jobs"]] if rc == 0 else []
            if states and all(s in ("CANCELLED", "JOB_STATE_CANCELLED") for s in states):
                break
            time.sleep(0.5)
        check(states and all("CANCELLED" in s for s in states), f"g: both end CANCELLED ({states})")
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        commands = part_a()
        part_b(tmp)
        part_c(tmp)
        part_d(commands)
        part_e(tmp)
        part_f(tmp)
        part_g(tmp)
    ck.finish()


if __name__ == "__main__":
    main()
