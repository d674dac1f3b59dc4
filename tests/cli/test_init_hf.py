"""`ztrain init --hf DIR` as a user meets it: the commands it prints, run exactly as printed
(parsed from its output, the input files put where it says TEXT_FILES...), make the data the job
reads and train it, evaluation of data.val included; and the job's "auto" batch keys under
tensor parallelism take the data-parallel world, as the Hugging Face Trainer's world size under
DeepSpeed's AutoTP: world / TP ranks (DeepSpeed's own check, train_batch_size =
micro · accumulation · data-parallel size, then holds), and a train_batch_size given beside
training_args is compared with that same product."""
import json
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import torch  # noqa: E402,F401  (transformers needs it)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from ztref import Checker, read_metrics, tool  # noqa: E402

ck = Checker()
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda"]
LINES = [" ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(6 + i % 5))
         for i in range(400)]


def run(args, cwd=None):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                       timeout=280)
    return p.returncode, p.stdout, p.stderr


with tempfile.TemporaryDirectory() as d:
    hf = os.path.join(d, "models", "tiny")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16,
                               vocab_size=300)).save_pretrained(hf, safe_serialization=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(LINES, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(hf, "tokenizer.json"))
    with open(os.path.join(d, "corpus.jsonl"), "w") as f:
        for line in LINES:
            f.write(json.dumps({"text": line}) + "\n")
    job = os.path.join(d, "job.json")
    rc, out, err = run([tool("ztrain"), "init", "--hf", hf, "--out", job])
    ck.check(rc == 0, f"init --hf: exit {rc} {err.strip()[-200:]}")
    printed = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("ztrain ")]
    ck.check([c.split()[1] for c in printed] == ["prepare", "run"],
             f"init prints a prepare and a run command: {out.strip()}")
    spec = json.load(open(job)) if rc == 0 else {}
    # The commands as printed; TEXT_FILES... is where the user's files go. The job's 1000 steps
    # are the user's to run: here the run is stopped after the first evaluation by --set.
    for cmd in printed:
        argv = shlex.split(cmd)
        if "TEXT_FILES..." in argv:
            at = argv.index("TEXT_FILES...")
            argv[at:at + 1] = [os.path.join(d, "corpus.jsonl")]
        if argv[1] == "run":
            argv += ["--set", "train.max_steps=%d" % spec["train"]["eval_interval"],
                     "--set", "train.checkpoint_interval=0", "--out", os.path.join(d, "run")]
        rc, o, err = run([tool("ztrain")] + argv[1:], cwd=d)
        ck.check(rc == 0, f"`{cmd}` as printed: exit {rc} {err.strip()[-300:]}")
    rows = read_metrics(os.path.join(d, "run", "metrics.jsonl")) \
        if os.path.exists(os.path.join(d, "run", "metrics.jsonl")) else []
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    ck.check(spec.get("data", {}).get("val") and len(evals) == 1 and evals[0] is not None,
             f"the job's data.val is made by the printed prepare and evaluated: {evals}")

    # Tensor parallelism and the "auto" batch keys: per_device_train_batch_size 8 (init's), one
    # accumulation step; the data-parallel world is world_size / autotp_size.
    for world, tp in ((2, 2), (4, 2), (4, 1)):
        rc, o, err = run([tool("ztrain"), "validate", job, "--set", f"world_size={world}",
                          "--set", f"deepspeed.tensor_parallel.autotp_size={tp}"], cwd=d)
        want = 8 * (world // tp)
        ck.check(rc == 0 and f'"auto" train_batch_size = {want} ' in err,
                 f"world_size {world}, autotp_size {tp}: \"auto\" train_batch_size is "
                 f"8 * 1 * {world // tp} = {want}: exit {rc} {err.strip()[-300:]}")
    rc, o, err = run([tool("ztrain"), "validate", job, "--set", "world_size=2", "--set",
                      "deepspeed.tensor_parallel.autotp_size=2", "--set",
                      "deepspeed.train_batch_size=16"], cwd=d)
    ck.check(rc != 0 and "ds train_batch_size=16 vs hf train_batch_size (calculated)=8" in err,
             f"a train_batch_size of 16 beside training_args on 2 TP ranks mismatches the "
             f"Trainer's 8: exit {rc} {err.strip()[-300:]}")
ck.done()
