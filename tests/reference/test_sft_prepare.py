"""`ztrain prepare --format chat|prompt-completion` against transformers.

Tokenizers of the Qwen2 (byte-level BPE, <|im_start|>/<|im_end|>) and Llama 2 (SentencePiece
style: Prepend/Replace normalizer, byte fallback, <s>/</s>) kinds are trained here with HF
`tokenizers`, saved beside a tokenizer_config.json holding the family's published chat template
(the ones of test_chat_template.py and test_chat_published.py: Qwen2, Llama 2, Qwen2.5, Llama
3.1 and 3.2). Then:
  - chat: the token stream of each example is tokenizer.apply_chat_template(messages,
    tokenize=True); the trained tokens are those whose character offsets (HF's offset mapping)
    start inside an assistant turn, a turn being the text between the conversation before it
    rendered with the generation prompt and the conversation through it; bit 1 marks each
    example's first token;
  - prompt-completion: tokenizer(prompt + completion) + EOS, trained from the completion's first
    character (by offsets) through the EOS; a prompt whose tokens are not the first of
    prompt + completion's (a trailing space merging into the completion) is refused by line;
  - --max-length truncates or drops, and the summary counts both;
  - a conversation the template refuses (raise_exception) fails naming the file and line;
  - --field names the conversation's list (the same tokens as under "messages"); --lines,
    --separator, and --overlong without --max-length are refused for chat (exit 2), --field for
    prompt-completion; an empty list is said to be empty; a --max-length that leaves no trained
    token fails naming it, writing no shard."""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers,  # noqa: E402
                        pre_tokenizers, processors, trainers)
from transformers import PreTrainedTokenizerFast  # noqa: E402

from chat_templates import LLAMA2, LLAMA31, LLAMA32, QWEN2, QWEN25  # noqa: E402
from ztref import Checker, tool  # noqa: E402

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3, "What is the capital of France?",
          "Paris is the capital of France.", "Name a colour. Blue is a colour, red is too.",
          "héllo wörld — ünïcode", "You are a helpful assistant.", "1 + 2 = 3, 10 * 4 = 40"] * 20


def qwen2_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def llama2_tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60,
        show_progress=False))
    j = json.loads(tok.to_str())
    vocab, n_special = j["model"]["vocab"], len(j["added_tokens"])
    new = {t: (i if i < n_special else i + 256) for t, i in vocab.items()}
    for b in range(256):
        new["<0x%02X>" % b] = n_special + b
    j["model"]["vocab"] = new
    tok = Tokenizer.from_str(json.dumps(j))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


CONVS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris is the capital of France."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another?"}, {"role": "assistant", "content": " Red, \n too. "}],
    [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "wörld ✓"}],
    # Python's strip() removes Unicode whitespace too (Llama 2's template strips the content)
    [{"role": "user", "content": "\u2003It is a test.\u3000"},
     {"role": "assistant", "content": "\u00a0Yes.\u2028"}],
]
PAIRS = [{"prompt": "What is the capital of France?", "completion": " Paris."},
         {"prompt": "1 + 2 =", "completion": " 3"},
         {"prompt": "Name a colour.", "completion": " Blue is a colour."}]


def read_stream(prefix):
    """Tokens and mask bytes of prefix.bin and prefix.bin.mask."""
    data = open(prefix + ".bin", "rb").read()
    magic, _, n = struct.unpack("<3i", data[:12])
    width = 2 if magic == 20240520 else 4
    ids = list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", data[1024:1024 + n * width]))
    mask = open(prefix + ".bin.mask", "rb").read()
    head = struct.unpack("<3i", mask[:12])
    return ids, list(mask[1024:]), head


def assistant_mask(hf, conv, ids_offsets):
    """Trained tokens by offsets: those starting inside an assistant turn's text."""
    spans = []
    for k, m in enumerate(conv):
        if m["role"] == "assistant":
            a = len(hf.apply_chat_template(conv[:k], tokenize=False, add_generation_prompt=True))
            b = len(hf.apply_chat_template(conv[:k + 1], tokenize=False))
            spans.append((a, b))
    return [any(a <= s < b for a, b in spans) and e > s for s, e in ids_offsets]


ck = Checker()
FAMILIES = [("qwen2", qwen2_tokenizer, QWEN2, None, "<|im_end|>"),
            ("llama 2", llama2_tokenizer, LLAMA2, "<s>", "</s>"),
            ("qwen2.5", qwen2_tokenizer, QWEN25, None, "<|im_end|>"),
            ("llama 3.1", qwen2_tokenizer, LLAMA31, "<|endoftext|>", "<|im_end|>"),
            ("llama 3.2", qwen2_tokenizer, LLAMA32, "<|endoftext|>", "<|im_end|>")]
for name, make, template, bos, eos in FAMILIES:
    with tempfile.TemporaryDirectory() as d:
        tok = make()
        tok.save(f"{d}/tokenizer.json")
        cfg = {"chat_template": template, "eos_token": eos}
        if bos:
            cfg["bos_token"] = bos
        json.dump(cfg, open(f"{d}/tokenizer_config.json", "w"))
        hf = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json", chat_template=template,
                                     eos_token=eos, **({"bos_token": bos} if bos else {}))
        with open(f"{d}/chat.jsonl", "w") as f:
            for c in CONVS:
                f.write(json.dumps({"messages": c}) + "\n")
        p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                            "--out", f"{d}/out", "--format", "chat", f"{d}/chat.jsonl"],
                           capture_output=True, text=True)
        ck.check(p.returncode == 0, f"{name} chat: prepare exit {p.returncode} {p.stderr[-300:]}")
        if p.returncode != 0:
            continue
        ids, mask, head = read_stream(f"{d}/out/data_train_000000")
        want_ids, want_mask, want_start = [], [], []
        for c in CONVS:
            text = hf.apply_chat_template(c, tokenize=False)
            enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
            ex = hf.apply_chat_template(c, tokenize=True)
            ck.check(ex == enc["input_ids"], f"{name}: apply_chat_template's ids are the "
                     "rendered text's")
            want_ids += ex
            want_mask += assistant_mask(hf, c, enc["offset_mapping"])
            want_start += [True] + [False] * (len(ex) - 1)
        ck.check(ids == want_ids, f"{name} chat: {len(ids)} tokens equal apply_chat_template's "
                 f"{len(want_ids)}" + ("" if ids == want_ids else f": {ids[:40]} vs {want_ids[:40]}"))
        got_mask = [bool(b & 1) for b in mask]
        got_start = [bool(b & 2) for b in mask]
        # The first token of an example is never a target, so its bit 0 does not matter.
        same = [g == w or s for g, w, s in zip(got_mask, want_mask, want_start)]
        ck.check(len(mask) == len(want_mask) and all(same) and head == (20261204, 1, len(ids)),
                 f"{name} chat: trained tokens are the assistant turns' "
                 f"({sum(want_mask)} of {len(want_mask)}; got {sum(got_mask)}), header {head}")
        ck.check(got_start == want_start, f"{name} chat: bit 1 on each example's first token")
        ck.check("loss on" in p.stdout and "0 truncated, 0 dropped" in p.stdout,
                 f"{name} chat: summary {p.stdout.strip()}")
        ck.check('"format": "masked"' in p.stdout, f"{name} chat: the summary says to train "
                 f"with data.format masked: {p.stdout.strip()[-200:]}")

        def prep(out, *args):
            return subprocess.run([tool("ztrain"), "prepare", "--tokenizer",
                                   f"{d}/tokenizer.json", "--out", f"{d}/{out}", *args],
                                  capture_output=True, text=True)

        # --field names the conversation's list (ShareGPT's "conversations" key)
        with open(f"{d}/conv.jsonl", "w") as f:
            for c in CONVS:
                f.write(json.dumps({"conversations": c, "id": 1}) + "\n")
        p = prep("field", "--format", "chat", "--field", "conversations", f"{d}/conv.jsonl")
        got = read_stream(f"{d}/field/data_train_000000")[0] if p.returncode == 0 else []
        ck.check(got == want_ids, f"{name} chat --field conversations: the ids of "
                 f"apply_chat_template: exit {p.returncode} {p.stderr.strip()[-200:]}")
        # options the chat format does not read are refused by name, exit 2
        for args, opt in ((["--lines"], "--lines"), (["--separator", eos], "--separator"),
                          (["--overlong", "drop"], "--overlong")):
            p = prep("refused", "--format", "chat", *args, f"{d}/chat.jsonl")
            ck.check(p.returncode == 2 and opt in p.stderr and not os.path.exists(f"{d}/refused"),
                     f"{name} chat {' '.join(args)}: exit {p.returncode} "
                     f"{p.stderr.strip()[:200]}")
        p = prep("refused", "--format", "prompt-completion", "--field", "x", f"{d}/chat.jsonl")
        ck.check(p.returncode == 2 and "--field" in p.stderr, f"{name} prompt-completion --field: "
                 f"exit {p.returncode} {p.stderr.strip()[:200]}")
        with open(f"{d}/empty.jsonl", "w") as f:
            f.write(json.dumps({"messages": CONVS[0]}) + "\n" + json.dumps({"messages": []}))
        p = prep("empty", "--format", "chat", f"{d}/empty.jsonl")
        ck.check(p.returncode != 0 and "empty.jsonl:2" in p.stderr and "empty" in
                 p.stderr.split("empty.jsonl:2")[1], f"{name} chat: an empty \"messages\" list "
                 f"is said to be empty: {p.stderr.strip()[-200:]}")
        # a --max-length that keeps no assistant token fails, naming it, and writes nothing
        p = prep("cut", "--format", "chat", "--max-length", "3", f"{d}/chat.jsonl")
        ck.check(p.returncode != 0 and "--max-length 3" in p.stderr and "no trained token" in
                 p.stderr and not os.path.exists(f"{d}/cut/data_train_000000.bin"),
                 f"{name} chat --max-length 3 (no assistant token left): exit {p.returncode} "
                 f"{p.stderr.strip()[-200:]}")

        # prompt-completion: the pairs whose prompt tokens begin prompt + completion's (TRL's
        # condition; the others are refused, below)
        good = [x for x in PAIRS if hf(x["prompt"] + x["completion"])["input_ids"][
            :len(hf(x["prompt"])["input_ids"])] == hf(x["prompt"])["input_ids"]]
        ck.check(len(good) > 0, f"{name}: {len(good)} prompt-completion pairs split cleanly")
        with open(f"{d}/pc.jsonl", "w") as f:
            for x in good:
                f.write(json.dumps(x) + "\n")
        p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                            "--out", f"{d}/pc", "--format", "prompt-completion",
                            "--separator", eos, f"{d}/pc.jsonl"], capture_output=True, text=True)
        ck.check(p.returncode == 0, f"{name} p-c: exit {p.returncode} {p.stderr[-300:]}")
        if p.returncode == 0:
            ids, mask, _ = read_stream(f"{d}/pc/data_train_000000")
            want_ids, want_mask = [], []
            for x in good:
                enc = hf(x["prompt"] + x["completion"], return_offsets_mapping=True)
                want_ids += enc["input_ids"] + [hf.convert_tokens_to_ids(eos)]
                cut = len(x["prompt"])
                want_mask += [s >= cut for s, e in enc["offset_mapping"]] + [True]
            ck.check(ids == want_ids and [bool(b & 1) for b in mask][1:] == want_mask[1:],
                     f"{name} prompt-completion: ids and trained tokens: {ids} {mask} vs "
                     f"{want_ids} {want_mask}")

            with open(f"{d}/pc_bad.jsonl", "w") as f:
                f.write(json.dumps({"prompt": "What is the capital of France? ",
                                    "completion": "Paris."}) + "\n")
            p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                                "--out", f"{d}/pc_bad", "--format", "prompt-completion",
                                "--separator", eos, f"{d}/pc_bad.jsonl"], capture_output=True,
                               text=True)
            # Whether the space merges depends on the tokenizer: refused exactly when HF's
            # prompt tokens are not a prefix of the whole's.
            pt = hf("What is the capital of France? ")["input_ids"]
            full = hf("What is the capital of France? Paris.")["input_ids"]
            merges = full[:len(pt)] != pt
            ck.check((p.returncode != 0 and "pc_bad.jsonl:1" in p.stderr) if merges
                     else p.returncode == 0, f"{name}: prompt with a trailing space (merges: "
                     f"{merges}): exit {p.returncode} {p.stderr.strip()[-200:]}")

        # --max-length: truncation and dropping, counted
        n0 = len(hf.apply_chat_template(CONVS[0], tokenize=True))
        lens = [len(hf.apply_chat_template(c, tokenize=True)) for c in CONVS]
        for mode in ("truncate", "drop"):
            p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                                "--out", f"{d}/ml_{mode}", "--format", "chat", "--max-length",
                                str(n0), "--overlong", mode, f"{d}/chat.jsonl"],
                               capture_output=True, text=True)
            over = sum(n > n0 for n in lens)
            ids, _, _ = read_stream(f"{d}/ml_{mode}/data_train_000000") if p.returncode == 0 \
                else ([], [], None)
            want = sum(min(n, n0) for n in lens) if mode == "truncate" else \
                sum(n for n in lens if n <= n0)
            counted = f"{over} truncated, 0 dropped" if mode == "truncate" else \
                f"0 truncated, {over} dropped"
            ck.check(p.returncode == 0 and len(ids) == want and counted in p.stdout and over > 0,
                     f"{name} --max-length {n0} --overlong {mode}: {len(ids)} tokens (want "
                     f"{want}), summary {p.stdout.strip()[-120:]}")

        if name == "llama 2":
            with open(f"{d}/bad.jsonl", "w") as f:
                f.write(json.dumps({"messages": CONVS[0]}) + "\n")
                f.write(json.dumps({"messages": [{"role": "user", "content": "a"},
                                                 {"role": "user", "content": "b"}]}) + "\n")
            p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                                "--out", f"{d}/bad", "--format", "chat", f"{d}/bad.jsonl"],
                               capture_output=True, text=True)
            ck.check(p.returncode != 0 and "bad.jsonl:2" in p.stderr and "alternate" in p.stderr
                     and not os.path.exists(f"{d}/bad/data_train_000000.bin"),
                     f"raise_exception fails the line: exit {p.returncode} {p.stderr.strip()[-200:]}")
ck.done()
