"""A job on prepared shards: a weighted mixture of two globs, its resume bit-exact, and
`ztrain sample` printing text through the job's tokenizer.

A byte-level BPE tokenizer is trained here with Hugging Face `tokenizers`; `ztrain prepare` turns
two generated corpora ("web" and "code") into small shards. A tiny GPT-2 trains 12 steps on
data.train = [{web_*.bin, 0.7}, {code_*.bin, 0.3}] with shuffling, in one run and in a run stopped
after 5 steps and resumed from its checkpoint: losses, learning rates and gradient norms must be
identical to the last bit (the mixture's draws and each source's position come back exactly).
Then `ztrain sample --prompt TEXT` (tokenizer from the checkpoint) must print exactly what HF
decodes from the prompt's HF ids followed by the ids the same sampling produces with
--prompt-tokens; a job with data.sample_tokens logs a text sample at each evaluation, the last
one what `ztrain sample` draws from its final checkpoint; and a mixture weight of 0 is refused
naming the key.

Run: ZTRAIN_BUILD=<build dir> python3 tests/cli/test_dataset_mix.py
"""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from prepdata import train_bpe  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "reference"))
import tokcorpus  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import ZTRAIN, Checks  # noqa: E402

ck = Checks()
check = ck.check


def run(*args):
    r = subprocess.run([ZTRAIN, *args], capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        print(r.stdout + r.stderr, file=sys.stderr)
    return r


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    rng = random.Random(4)
    with tempfile.TemporaryDirectory() as d:
        tok = train_bpe(400, 500, ["<|endoftext|>"])
        tok_path = os.path.join(d, "tokenizer.json")
        tok.save(tok_path)
        for name, docs in (("web", [tokcorpus.sentence(rng) for _ in range(300)]),
                           ("code", [rng.choice(tokcorpus.CODE) for _ in range(200)])):
            with open(os.path.join(d, name + ".jsonl"), "w") as f:
                for x in docs:
                    f.write(json.dumps({"text": x}) + "\n")
            r = run("prepare", "--tokenizer", tok_path, "--out", os.path.join(d, "shards"),
                    "--name", name, "--shard-size", "1500", os.path.join(d, name + ".jsonl"))
            check(r.returncode == 0, f"prepare {name}")

        def job(ckpt, resume, bench_steps, weights=(0.7, 0.3)):
            return {
                "name": "mix",
                "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16,
                          "vocab_size": 512, "block_size": 16},
                "data": {"train": [{"path": "shards/web_train_*.bin", "weight": weights[0]},
                                   {"path": "shards/code_train_*.bin", "weight": weights[1]}],
                         "tokenizer": "tokenizer.json", "shuffle": True},
                "train": {"max_steps": 12, "log_interval": 1, "checkpoint_dir": ckpt,
                          "resume": resume, "bench_steps": bench_steps, "seed": 7},
                "deepspeed": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}}

        for name, j in (("full", job("ckpt-full", False, 0)), ("first", job("ckpt-split", False, 5)),
                        ("second", job("ckpt-split", True, 0)),
                        ("bad", job("ckpt-bad", False, 0, (0.7, 0)))):
            with open(os.path.join(d, name + ".json"), "w") as f:
                json.dump(j, f)
        out = lambda n: os.path.join(d, n)  # noqa: E731
        check(run("run", out("full.json"), "--out", out("full")).returncode == 0, "full run")
        check(run("run", out("first.json"), "--out", out("split")).returncode == 0, "first part")
        r = run("run", out("second.json"), "--out", out("split"))
        check(r.returncode == 0 and "resumed from" in r.stdout, "resumed run")
        full, split = metrics(out("full/metrics.jsonl")), metrics(out("split/metrics.jsonl"))
        check([m["train/global_step"] for m in split] == list(range(1, 13)),
              f"resumed steps {[m['train/global_step'] for m in split]}")
        for a, b in zip(full, split):
            same = all(a[k] == b[k] for k in ("train/loss", "train/learning_rate",
                                              "train/grad_norm"))
            check(same, f"step {a['train/global_step']}: loss {a['train/loss']!r} vs "
                  f"{b['train/loss']!r}")

        r = run("run", out("bad.json"), "--out", out("bad"))
        check(r.returncode != 0 and "data.train[1].weight" in r.stderr and "must be > 0" in r.stderr,
              f"weight 0: {r.stderr.strip()}")

        # data.tokenizer is checked where the job is checked (validate, run), by name: a file
        # that is missing, not JSON, a tokenizer ztrain does not read, or one with more tokens
        # than the model's vocab_size (counted by `tokenizers` itself) fails before training.
        from tokenizers import Tokenizer
        from tokenizers.models import WordPiece
        Tokenizer(WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(out("wordpiece.json"))
        with open(out("notjson.json"), "w") as f:
            f.write("this is not JSON\n")
        n_tok = tok.get_vocab_size(with_added_tokens=True)
        for what, path, vocab, words in (
                ("missing", "nope.json", 512, ["nope.json"]),
                ("not JSON", "notjson.json", 512, ["notjson.json"]),
                ("WordPiece", "wordpiece.json", 512, ["wordpiece.json", "WordPiece"]),
                ("too many tokens", "tokenizer.json", n_tok - 1,
                 ["tokenizer.json", str(n_tok), f"model.vocab_size is {n_tok - 1}"])):
            bj = job("ckpt-tok", False, 0)
            bj["data"]["tokenizer"] = path
            bj["model"]["vocab_size"] = vocab
            with open(out("tok.json"), "w") as f:
                json.dump(bj, f)
            for cmd in (["validate", out("tok.json")],
                        ["run", out("tok.json"), "--out", out("tok-run")]):
                r = subprocess.run([ZTRAIN, *cmd], capture_output=True, text=True, timeout=240)
                check(r.returncode == 1 and "data.tokenizer" in r.stderr
                      and all(w in r.stderr for w in words)
                      and not os.path.exists(out("tok-run/metrics.jsonl")),
                      f"data.tokenizer {what}: `ztrain {cmd[0]}` exit {r.returncode}, "
                      f"{r.stderr.strip()[-300:]}")
        bj["model"]["vocab_size"] = n_tok
        with open(out("tok.json"), "w") as f:
            json.dump(bj, f)
        r = subprocess.run([ZTRAIN, "validate", out("tok.json")], capture_output=True, text=True,
                           timeout=240)
        check(r.returncode == 0, f"a tokenizer of exactly vocab_size {n_tok} tokens is accepted: "
              f"{r.stderr.strip()[-300:]}")

        # A job that asks for a text sample at each evaluation: rank 0 logs it; at the last step
        # it is what `ztrain sample` draws from the final checkpoint with the same settings.
        prompt = "the city of café"
        sj = job("ckpt-sampled", False, 0)
        sj["data"].update(val="shards/web_train_000000.bin", sample_tokens=12, sample_prompt=prompt)
        sj["train"].update(eval_interval=6, eval_steps=2)
        with open(out("sampled.json"), "w") as f:
            json.dump(sj, f)
        r = run("run", out("sampled.json"), "--out", out("sampled"))
        lines = [x for x in r.stdout.splitlines() if " | sample: " in x]
        print("\n".join(lines))
        check(r.returncode == 0 and [x.split(" |")[0] for x in lines] == ["step 6", "step 12"],
              f"sample lines at evaluation: {lines} {r.stderr.strip()}")
        r3 = run("sample", out("ckpt-sampled"), "--prompt", prompt, "--tokens", "12", "--seed",
                 "1234", "--temperature", "0.8", "--top-k", "40")
        want = r3.stdout[:-1]
        esc = "".join("\\x%02x" % ord(c) if (ord(c) < 32 and c != "\t") or ord(c) == 127 else c
                      for c in want)
        logged = lines[-1].split(" | sample: ", 1)[1] if lines else ""
        check(logged == esc or ("\\u" in logged and logged.startswith(prompt)),
              f"the last evaluation's sample {logged!r} is `ztrain sample`'s {esc!r}")

        r = run("sample", out("ckpt-full"), "--prompt", prompt, "--tokens", "30", "--seed", "3")
        check(r.returncode == 0, "sample with the checkpoint's tokenizer")
        text = r.stdout
        ids = tok.encode(prompt).ids
        r2 = run("sample", out("ckpt-full"), "--prompt-tokens", ",".join(map(str, ids)),
                 "--tokens", "30", "--seed", "3")
        generated = [int(x) for x in r2.stdout.split()]
        check(len(generated) == 30, f"--prompt-tokens printed {r2.stdout!r}")
        want = tok.decode(ids + generated) + "\n"
        check(text == want, f"sample text {text!r}, HF decodes {want!r}")
        check(text.startswith(prompt), f"the sample starts with its prompt: {text!r}")
    ck.done()


if __name__ == "__main__":
    main()
