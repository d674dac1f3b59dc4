"""`ztrain prepare` against Hugging Face `tokenizers` (the PyPI wheel in .venv/).

Tokenizers trained here with HF (a GPT-2-style byte-level BPE whose documents are separated by
<|endoftext|> before each one, as llm.c's shards have it; a Llama-style one whose post-processor
puts BOS before each document) prepare text files, JSONL files, a directory and a glob into
shards. The shards' tokens, read back from the llm.c format, must equal HF's encoding of every
document in input order with the separators; shards are exactly --shard-size tokens but the last;
the validation split takes about --val-fraction of the documents and the two splits partition
them. Then bad input: a line that is not JSON and one without the field (errors naming file and
line, or counted under --skip-bad-lines; a field given twice, which json.loads reads as the
last; prompt-completion lines with a second object or a key given twice), a vocabulary too large for uint16 (refused; uint32
shards chosen by default), an unknown tokenizer model, existing shards — none of which may leave
a shard or a temporary file behind. A directory prepared into itself twice reads its text, never
its own shards (skipped in a directory or glob, refused when named). Empty documents (a JSONL
field "", an empty text file) are skipped and counted in the summary.

Run: ZTRAIN_BUILD=<build dir> python3 tests/cli/test_prepare.py
"""
import glob
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()


from prepdata import read_shard, train_bpe  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "reference"))
import tokcorpus  # noqa: E402

BUILD = os.environ.get("ZTRAIN_BUILD", "build")
ZTRAIN = os.path.join(BUILD, "ztrain")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def train(bos):
    return train_bpe(600, 700, ["<|begin_of_text|>"] if bos else ["<|endoftext|>"],
                     "<|begin_of_text|>" if bos else None)


def shards(out, name, split):
    return sorted(glob.glob(os.path.join(out, f"{name}_{split}_*.bin")))


def prepare(*args):
    return subprocess.run([ZTRAIN, "prepare", *args], capture_output=True, text=True, timeout=120)


def split_docs(tokens, sep):
    docs = []
    for t in tokens:
        if t == sep:
            docs.append([])
        else:
            docs[-1].append(t)
    return docs


def main():
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as d:
        gpt2 = os.path.join(d, "gpt2.json")
        llama = os.path.join(d, "llama.json")
        tok_gpt2, tok_llama = train(False), train(True)
        tok_gpt2.save(gpt2)
        tok_llama.save(llama)

        # Inputs: a JSONL file (with a blank line and another field), text files in a
        # directory tree and text files named by a glob (one document per file).
        docs = [tokcorpus.document(rng) for _ in range(300)]
        docs = [x for x in docs if "<|" not in x]
        jsonl = os.path.join(d, "a.jsonl")
        with open(jsonl, "w") as f:
            for i, x in enumerate(docs[:200]):
                f.write(json.dumps({"id": i, "body": x}) + "\n")
                if i == 50:
                    f.write("\n")
        os.makedirs(os.path.join(d, "dir", "sub"))
        dir_docs = docs[200:230]
        for i, x in enumerate(dir_docs):
            sub = "sub" if i % 2 else ""
            with open(os.path.join(d, "dir", sub, "%03d.txt" % i), "w") as f:
                f.write(x)
        glob_docs = docs[230:]
        for i, x in enumerate(glob_docs):
            with open(os.path.join(d, "g%03d.md" % i), "w") as f:
                f.write(x)
        # A directory's files are taken in name order, whatever their depth.
        dir_order = sorted(((os.path.join(d, "dir", "sub" if i % 2 else "", "%03d.txt" % i), x)
                            for i, x in enumerate(dir_docs)), key=lambda p: p[0])
        expected_docs = docs[:200] + [x for _, x in dir_order] + glob_docs
        inputs = [jsonl, os.path.join(d, "dir"), os.path.join(d, "g*.md")]

        out = os.path.join(d, "out")
        r = prepare("--tokenizer", gpt2, "--out", out, "--name", "t", "--field", "body",
                    "--shard-size", "3000", "--threads", "2", *inputs)
        check(r.returncode == 0, f"prepare failed: {r.stderr}")
        print(r.stdout.strip())
        sep = tok_gpt2.token_to_id("<|endoftext|>")
        want = []
        for e in tok_gpt2.encode_batch(expected_docs):
            want += [sep] + e.ids
        got, sizes = [], []
        for p in shards(out, "t", "train"):
            toks, size = read_shard(p)
            check(size == 2, f"{p}: uint16 expected for a vocabulary of 700")
            sizes.append(len(toks))
            got += toks
        check(got == want, f"gpt2 shards: {len(got)} tokens, HF {len(want)}; first difference at "
              f"{next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))}")
        check(sizes and all(s == 3000 for s in sizes[:-1]) and 0 < sizes[-1] <= 3000,
              f"shard sizes {sizes}")
        check(f"prepared {len(expected_docs)} documents: {len(want)} tokens" in r.stdout,
              f"summary: {r.stdout}")
        check(not glob.glob(os.path.join(out, "*.tmp")), "temporary files left")

        # A Llama-style tokenizer: BOS from the post-processor separates documents; a
        # validation split of 25%.
        r = prepare("--tokenizer", llama, "--out", out, "--name", "l", "--field", "body",
                    "--val-fraction", "0.25", "--seed", "5", *inputs)
        check(r.returncode == 0, f"prepare (llama) failed: {r.stderr}")
        bos = tok_llama.token_to_id("<|begin_of_text|>")
        want_docs = [e.ids for e in tok_llama.encode_batch(expected_docs)]
        train_docs = split_docs(sum((read_shard(p)[0] for p in shards(out, "l", "train")), []), bos)
        val_docs = split_docs(sum((read_shard(p)[0] for p in shards(out, "l", "val")), []), bos)
        # Each split keeps input order, so walking the expected documents assigns each to one.
        ti = vi = 0
        ok = True
        for w in want_docs:
            w = w[1:]
            if ti < len(train_docs) and train_docs[ti] == w:
                ti += 1
            elif vi < len(val_docs) and val_docs[vi] == w:
                vi += 1
            else:
                ok = False
                break
        check(ok and ti == len(train_docs) and vi == len(val_docs),
              f"llama: train {len(train_docs)} + val {len(val_docs)} documents are not a "
              f"partition of HF's {len(want_docs)} in order")
        n = len(want_docs)
        # Binomial(n, 0.25): 5 standard deviations either side.
        sd = (n * 0.25 * 0.75) ** 0.5
        check(abs(len(val_docs) - 0.25 * n) < 5 * sd, f"val documents {len(val_docs)} of {n}")

        # Bad JSONL lines: an error naming file and line, nothing written; or skipped and counted.
        bad = os.path.join(d, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps({"text": "fine"}) + "\n")
            f.write("{not json\n")
            f.write(json.dumps({"other": "x"}) + "\n")
            f.write(json.dumps({"text": "also fine"}) + " trailing\n")
        bout = os.path.join(d, "bout")
        r = prepare("--tokenizer", gpt2, "--out", bout, bad)
        check(r.returncode == 1 and f"{bad}:2: not JSON" in r.stderr, f"bad line: {r.stderr}")
        check(not glob.glob(os.path.join(bout, "*")), f"files left after a failure: "
              f"{glob.glob(os.path.join(bout, '*'))}")
        r = prepare("--tokenizer", gpt2, "--out", bout, "--skip-bad-lines", bad)
        check(r.returncode == 0 and "skipped 3 bad JSONL lines" in r.stdout,
              f"--skip-bad-lines: {r.returncode} {r.stdout} {r.stderr}")
        toks = read_shard(shards(bout, "data", "train")[0])[0]
        check(toks == [sep] + tok_gpt2.encode("fine").ids, f"skip-bad-lines tokens {toks}")
        # Empty documents (a JSONL field "", an empty text file) have no tokens: skipped, and
        # counted apart from the documents and the bad lines.
        records = [{"text": "a"}, {"text": ""}, {"text": "b"}, {"text": ""}]
        ej, et = os.path.join(d, "empties.jsonl"), os.path.join(d, "empty-doc.txt")
        with open(ej, "w") as f:
            f.writelines(json.dumps(rec) + "\n" for rec in records)
        open(et, "w").close()
        n_empty = sum(rec["text"] == "" for rec in records) + 1
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "eout"), ej, et)
        check(r.returncode == 0 and f"prepared {len(records) + 1 - n_empty} documents" in r.stdout
              and f"skipped {n_empty} empty documents" in r.stdout,
              f"empty documents counted ({n_empty}): {r.returncode} {r.stdout} {r.stderr}")
        r = prepare("--tokenizer", gpt2, "--out", bout, bad, "--skip-bad-lines")
        check(r.returncode == 1 and "already exists" in r.stderr and "--overwrite" in r.stderr,
              f"existing shards: {r.stderr}")
        with open(bad, "w") as f:
            f.write(json.dumps({"text": 5}) + "\n")
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "b2"), bad)
        check(r.returncode == 1 and f'{bad}:1: no string field "text"' in r.stderr,
              f"missing field: {r.stderr}")

        # A vocabulary past uint16: uint32 shards by default, a refusal when uint16 is asked for.
        j = json.loads(tok_gpt2.to_str())
        j["added_tokens"].append({"id": 70000, "content": "<|big|>", "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
        big = os.path.join(d, "big.json")
        with open(big, "w") as f:
            json.dump(j, f)
        r = prepare("--tokenizer", big, "--out", os.path.join(d, "o16"), "--dtype", "uint16", jsonl,
                    "--field", "body")
        check(r.returncode == 1 and "does not fit uint16" in r.stderr, f"uint16: {r.stderr}")
        o32 = os.path.join(d, "o32")
        r = prepare("--tokenizer", big, "--out", o32, jsonl, "--field", "body")
        check(r.returncode == 0, f"uint32: {r.stderr}")
        toks, size = read_shard(shards(o32, "data", "train")[0])
        want32 = []
        for e in tok_gpt2.encode_batch(docs[:200]):
            want32 += [sep] + e.ids
        check(size == 4 and toks == want32, "uint32 shard tokens differ from HF")

        j["model"]["type"] = "Unigram"
        with open(big, "w") as f:
            json.dump(j, f)
        r = prepare("--tokenizer", big, "--out", os.path.join(d, "o3"), jsonl)
        check(r.returncode == 1 and "model type Unigram is not supported" in r.stderr,
              f"unknown model: {r.stderr}")
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "o4"), os.path.join(d, "nope*.txt"))
        check(r.returncode == 1 and "no file matches" in r.stderr, f"empty glob: {r.stderr}")
        # The command names itself once.
        empty = os.path.join(d, "empty.txt")
        open(empty, "w").close()
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "o5"), empty)
        check(r.returncode == 1 and r.stderr.startswith("ztrain: prepare: the inputs hold no "
                                                        "documents"), f"empty input: {r.stderr}")

        # Preparing a directory into itself: a second run (--overwrite) reads the text again,
        # not the first run's shards; a shard named as an input is refused by name.
        own = os.path.join(d, "own")
        os.makedirs(own)
        with open(os.path.join(own, "a.txt"), "w") as f:
            f.write(docs[0])
        want_own = [sep] + tok_gpt2.encode(docs[0]).ids
        for run in (1, 2):
            r = prepare("--tokenizer", gpt2, "--out", own, own, "--overwrite")
            got = [read_shard(p)[0] for p in shards(own, "data", "train")]
            check(r.returncode == 0 and got == [want_own] and "invalid UTF-8" not in r.stdout,
                  f"--out inside the input, run {run}: {r.returncode} {r.stdout} {r.stderr}; "
                  f"{sum(map(len, got))} tokens, HF {len(want_own)}")
        r = prepare("--tokenizer", gpt2, "--out", own, os.path.join(own, "*"), "--overwrite")
        got = [read_shard(p)[0] for p in shards(own, "data", "train")]
        check(r.returncode == 0 and got == [want_own], f"glob over --out: {r.stderr}")
        shard0 = os.path.join(own, "data_train_000000.bin")
        r = prepare("--tokenizer", gpt2, "--out", own, shard0, "--overwrite")
        check(r.returncode == 1 and shard0 in r.stderr and "--out" in r.stderr,
              f"a shard as input: {r.returncode} {r.stderr}")

        # --lines: a line ends at "\n", "\r\n" or a lone "\r" and is read without it, as
        # Python's universal newlines (and so HF datasets' "text" loader) read the file; empty
        # lines (of any ending) are skipped. Lines with spaces only are documents.
        mixed = os.path.join(d, "mixed.txt")
        with open(mixed, "wb") as f:
            f.write(b"hello world\r\n\r\nsecond line\r\nthird\rfourth\n\rfifth\r\r\n  \r\n"
                    b"tab\tend\r\n" + docs[1].encode() + b"\r\nno newline")
        with open(mixed, encoding="utf-8") as f:
            want_lines = [x.rstrip("\n") for x in f.readlines()]
        want_lines = [x for x in want_lines if x]
        want = []
        for e in tok_gpt2.encode_batch(want_lines):
            want += [sep] + e.ids
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "lines"), "--lines", mixed)
        got = sum((read_shard(p)[0] for p in shards(os.path.join(d, "lines"), "data", "train")), [])
        check(r.returncode == 0 and got == want and
              f"prepared {len(want_lines)} documents" in r.stdout,
              f"--lines on a file with CRLF and CR endings: {r.stdout.strip()} {r.stderr}; got "
              f"{[tok_gpt2.decode(x) for x in split_docs(got, sep)]}, Python reads {want_lines}")
        # JSONL lines end at "\n" only; a CRLF file and its blank CRLF lines read as with LF.
        crlf = os.path.join(d, "crlf.jsonl")
        with open(crlf, "wb") as f:
            f.write(b"\r\n".join(json.dumps({"text": x}).encode() for x in docs[:3]) + b"\r\n\r\n")
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "crlf"), crlf)
        got = sum((read_shard(p)[0] for p in shards(os.path.join(d, "crlf"), "data", "train")), [])
        want = []
        for e in tok_gpt2.encode_batch(docs[:3]):
            want += [sep] + e.ids
        check(r.returncode == 0 and got == want, f"a CRLF JSONL file: {r.stdout} {r.stderr}")
        # A whole text file is one document read byte for byte: its "\r\n" stays, where
        # Python's open() in text mode (and HF datasets' sample_by="document") reads "\n".
        whole = os.path.join(d, "whole.txt")
        raw = b"first line\r\nsecond\rthird\n\r\n" + docs[1].encode() + b"\r"
        with open(whole, "wb") as f:
            f.write(raw)
        want = [sep] + tok_gpt2.encode(raw.decode()).ids
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "whole"), whole)
        got = sum((read_shard(p)[0] for p in shards(os.path.join(d, "whole"), "data", "train")), [])
        check(r.returncode == 0 and got == want, f"a whole CRLF text file: {r.stderr}")

        # A JSONL line that gives the field twice: json.loads keeps the last, cJSON the first;
        # refused naming file, line and field rather than one of the two taken silently.
        twice = os.path.join(d, "twice.jsonl")
        line = '{"text": "first", "text": "second"}'
        with open(twice, "w") as f:
            f.write('{"text": "fine"}\n' + line + "\n")
        check(json.loads(line)["text"] == "second", "json.loads keeps the last of two keys")
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "twice"), twice)
        check(r.returncode == 1 and f'{twice}:2: the field "text" is given twice' in r.stderr
              and not glob.glob(f"{d}/twice/*"), f"a field given twice: {r.stderr}")
        r = prepare("--tokenizer", gpt2, "--out", os.path.join(d, "twice"), "--skip-bad-lines",
                    twice)
        got = sum((read_shard(p)[0] for p in shards(os.path.join(d, "twice"), "data", "train")), [])
        check(r.returncode == 0 and got == [sep] + tok_gpt2.encode("fine").ids,
              f"a field given twice under --skip-bad-lines: {r.stdout} {r.stderr}")

        # prompt-completion lines as json.loads reads them: a second object after the first
        # ("Extra data") and a key given twice are bad lines, not a line half read.
        pc = os.path.join(d, "pc.jsonl")
        bad_pc = ['{"prompt": "a", "completion": "b"} {"prompt": "c", "completion": "d"}',
                  '{"prompt": "a", "completion": "b", "completion": "c"}',
                  '{"prompt": "a", "completion": "b"} x']
        for i, text in enumerate(bad_pc):
            with open(pc, "w") as f:
                f.write('{"prompt": "p", "completion": "q"}\n' + text + "\n")
            try:
                json.loads(text)
                loads = "ok"
            except json.JSONDecodeError as e:
                loads = e.msg
            check(loads == "Extra data" or json.loads(text)["completion"] == "c",
                  f"json.loads reads {text} so: {loads}")
            out = os.path.join(d, "pc%d" % i)
            r = prepare("--tokenizer", gpt2, "--out", out, "--format", "prompt-completion", pc)
            check(r.returncode == 1 and f"{pc}:2: " in r.stderr and not glob.glob(f"{out}/*"),
                  f"prompt-completion line {text}: {r.returncode} {r.stdout} {r.stderr}")
            r = prepare("--tokenizer", gpt2, "--out", out, "--format", "prompt-completion",
                        "--skip-bad-lines", pc)
            got = sum((read_shard(p)[0] for p in shards(out, "data", "train")), [])
            check(r.returncode == 0 and got == tok_gpt2.encode("pq").ids + [sep],
                  f"prompt-completion line {text} skipped: {got} {r.stdout} {r.stderr}")
    if failures:
        print(f"{len(failures)} failures", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
