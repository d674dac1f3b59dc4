"""ztrain's C tokenizer against Hugging Face `tokenizers` (the PyPI wheel in .venv/).

Tokenizers of each family ztrain supports are trained here, on generated text, with HF itself,
and saved as tokenizer.json:
  gpt2      byte-level BPE with GPT-2's regex (ByteLevel pre-tokenizer and decoder), <|endoftext|>
  llama3    a Split with Llama 3's pattern then ByteLevel without regex, ignore_merges, a
            TemplateProcessing BOS, extra special tokens and a normalized (non-special) added token
  llama2    SentencePiece-style BPE: Prepend/Replace normalizers, byte_fallback (<0xNN> tokens in
            the vocabulary), fuse_unk, the Replace/ByteFallback/Fuse/Strip decoder, BOS template
  metaspace the same model with a Metaspace pre-tokenizer (prepend_scheme "first") and decoder
  qwen2     Qwen2's NFC normalizer and split pattern, then ByteLevel without regex
  prefix    an NFKC normalizer, ByteLevel with add_prefix_space and a Digits pre-tokenizer
Then a varied corpus (ASCII, accents, CJK, emoji, whitespace runs, digits, code, controls, and
invalid UTF-8, which HF is given as Python's errors="replace" decoding) is encoded by both, with
and without special tokens, on one and two threads: the ids must be identical. HF's ids, and
random id sequences (partial byte tokens among them), are decoded by both with and without
skip_special_tokens: the texts must be identical. tokenizer.json files with components the C
library does not implement must be refused with a message naming the component.

Variants of those tokenizers check single components against HF on targeted text: added tokens
with normalized true (matched by their normalized content in the normalized text) mixed with raw
ones under Llama 2's and Qwen2's normalizers; Split by a string with each behaviour, inverted or
not; Metaspace with split true and false under each prepend_scheme; and regexes written for
Oniguruma (the escapes w W s S d D h H b B v, options, anchors), each as a Split that
removes what it matches, over every code point Unicode 14 assigns, so ids differ wherever ztrain's
PCRE2 translation matches a different set than Oniguruma.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_tokenizer.py
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

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,  # noqa: E402
                        normalizers, pre_tokenizers, processors, trainers)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokcorpus  # noqa: E402
import toktool  # noqa: E402

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def train_gpt2(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def train_llama3(texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=900, special_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.add_tokens(["hello world"])  # normalized, not special
    # One special token a prefix of another: HF matches leftmost-longest.
    tok.add_special_tokens(["<|a|>", "<|a|><|b|>"])
    return tok


def with_byte_tokens(tok):
    """Llama 2 keeps <0x00>..<0xFF> in the model's vocabulary (not as added tokens): insert them
    after the special tokens, renumbering the rest (merges are by text, so they are unaffected)."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    n_special = len(j["added_tokens"])
    new = {}
    for t, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        new[t] = i if i < n_special else i + 256
    for b in range(256):
        new["<0x%02X>" % b] = n_special + b
    j["model"]["vocab"] = new
    return Tokenizer.from_str(json.dumps(j))


def train_llama2(texts, metaspace):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # A small alphabet leaves most CJK and emoji out of the vocabulary: they take the byte path.
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=70,
        show_progress=False))
    tok = with_byte_tokens(tok)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def train_qwen2(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def train_prefix(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)])
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def compare_encodings(name, tok, path, docs, specials=(True, False), thread_counts=("1", "2")):
    texts = [d.decode("utf-8", errors="replace") for d in docs]
    for special in specials:
        want = [e.ids for e in tok.encode_batch(texts, add_special_tokens=special)]
        for threads in thread_counts:
            flags = ["--threads", threads] + ([] if special else ["--no-special"])
            got, err = toktool.encode(path, docs, *flags)
            if not check(got is not None, f"{name}: encode failed: {err}"):
                return
            bad = [i for i in range(len(docs)) if got[i] != want[i]]
            check(not bad, f"{name}: special={special} threads={threads}: {len(bad)} of "
                  f"{len(docs)} documents differ; first {docs[bad[0]]!r}: ztrain "
                  f"{got[bad[0]][:40]} HF {want[bad[0]][:40]}" if bad else "")
    return [e.ids for e in tok.encode_batch(texts)]


def compare_decodings(name, tok, path, id_lists):
    for skip in (True, False):
        want = tok.decode_batch(id_lists, skip_special_tokens=skip)
        got, err = toktool.decode(path, id_lists, *([] if skip else ["--keep-special"]))
        if not check(got is not None, f"{name}: decode failed: {err}"):
            return
        bad = [i for i in range(len(id_lists)) if got[i] != want[i]]
        check(not bad, f"{name}: decode skip_special={skip}: {len(bad)} of {len(id_lists)} "
              f"differ; first ids {id_lists[bad[0]][:20]}: ztrain {got[bad[0]]!r} HF "
              f"{want[bad[0]]!r}" if bad else "")


def variant(tok, mutate):
    """A copy of tok with its tokenizer.json changed by mutate(j)."""
    j = json.loads(tok.to_str())
    mutate(j)
    return Tokenizer.from_str(json.dumps(j))


def compare_variant(d, name, tok, docs, quick=False):
    """quick: one encoding (special tokens, two threads) for a component the template and the
    threads do not touch."""
    path = os.path.join(d, "variant.json")
    tok.save(path)
    docs = [x if isinstance(x, bytes) else x.encode() for x in docs]
    if quick:
        compare_encodings(name, tok, path, docs, (True,), ("2",))
    else:
        compare_encodings(name, tok, path, docs)


ADDED_DOCS = ["hello world", "say hello world now", "hello worldhello world", "a<x>hello world",
              "<x>b c", "a b c", " b c", "b c", "hel lo world", "lo world", "<s>hello world</s>",
              "e\u0301té", "été", "xe\u0301téx", "o\u0301 ó", "n\u0303 ñ", "ñn\u0303"]


def check_added_normalized(d, tokenizers, docs):
    """HF matches raw added tokens in the raw text first, then normalized ones, by their
    normalized content, in each normalized stretch between."""
    llama2 = Tokenizer.from_str(tokenizers["llama2"].to_str())
    llama2.add_tokens([AddedToken("hello world", normalized=True)])
    compare_variant(d, "llama2 + normalized 'hello world'", llama2, ADDED_DOCS + docs[:60])
    llama2.add_tokens([AddedToken("<x>", normalized=False), AddedToken("lo w", normalized=False),
                       AddedToken("b c", normalized=True)])
    compare_variant(d, "llama2 + normalized and raw added tokens", llama2, ADDED_DOCS + docs[:60])
    qwen2 = Tokenizer.from_str(tokenizers["qwen2"].to_str())
    qwen2.add_tokens([AddedToken("e\u0301té", normalized=True)])
    compare_variant(d, "qwen2 + normalized 'e\\u0301té'", qwen2, ADDED_DOCS)
    qwen2.add_tokens([AddedToken("o\u0301", normalized=False),
                      AddedToken("n\u0303", normalized=True)])
    compare_variant(d, "qwen2 + normalized and raw added tokens", qwen2, ADDED_DOCS + docs[:60])


def check_split_string(d, tokenizers, docs):
    extra = ["a, b,, c , d", ", leading", "trailing, ", ",,,", "no commas here", "  two  spaces  "]
    for pattern in (", ", " "):
        for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next",
                         "contiguous"):
            for invert in (False, True):
                def mutate(j, pattern=pattern, behavior=behavior, invert=invert):
                    split = pre_tokenizers.Split(pattern, behavior=behavior, invert=invert)
                    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                        json.loads(split.__getstate__()), j["pre_tokenizer"]["pretokenizers"][1]]}
                tok = variant(tokenizers["qwen2"], mutate)
                compare_variant(d, f"Split String {pattern!r} {behavior} invert={invert}", tok,
                                extra + docs[:40], quick=True)


def check_metaspace(d, tokenizers, docs):
    extra = ["hello world", " hello", "  two", "▁already▁", "x<s>y z", "<s> a", "a  b   c "]
    for split in (True, False):
        for scheme in ("always", "first", "never"):
            def mutate(j, split=split, scheme=scheme):
                j["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace(
                    replacement="▁", prepend_scheme=scheme, split=split).__getstate__())
            tok = variant(tokenizers["metaspace"], mutate)
            compare_variant(d, f"Metaspace split={split} prepend_scheme={scheme}", tok,
                            extra + docs[:60], quick=True)


# Each construct whose Oniguruma meaning PCRE2 spells differently, alone and in a class.
ONIG_PATTERNS = [r"\w", r"\W", r"\s", r"\S", r"\d", r"\D", r"\h", r"\H", r"[\w-]", r"[^\w\s]",
                 r"[\h\s]", r"[^\h]", r"[\S]", r"[\d.]", r"\b\w", r"\w\b", r"\B.", r".\B", r"\v",
                 r"\u00e9|\u2460", r"(?m)a.b", r"(?i:k|[a-z]|'s|'re)", r"^.", r".$", r"\n^", r"$\n",
                 r"[\b]", r"\p{Han}", r"[\p{Common}\p{Lu}]", r"\P{Latin}", r"\p{^Hiragana}"]
ONIG_DOCS = ["deadBEEF ok 0x1f G", " ① ② Ⓐ Ⅻ ²³¹¼½¾ ½", "a\u200db a\u200cb",
             "a\u180eb\x85c\u2028d", "a\x0bb\x0cc", "word_under score-dash", "a\nb\n\n", "ab\ncd\n",
             "a\r\nb", "é ① ß SS ſ", "\u0660\u0966\uff10 ٣", "x\u0301y \u0301",
             "'S 'RE 'ſ K \u212a"]


def every_code_point(chunk=2000):
    """Every code point Unicode 14 (this Python's database) assigns, in documents of `chunk`."""
    import unicodedata
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000 and c != 0
           and unicodedata.category(chr(c)) != "Cn"]
    return ["".join(map(chr, cps[i:i + chunk])) for i in range(0, len(cps), chunk)]


def check_onig_classes(d, tokenizers, docs):
    everything = every_code_point()
    for pat in ONIG_PATTERNS:
        def mutate(j, pat=pat):
            # No normalizer, and no merges: each kept byte is its own id, and BPE stays linear
            # on the long pieces a removing split leaves.
            j["normalizer"] = None
            j["model"]["merges"] = []
            j["pre_tokenizer"]["pretokenizers"][0] = {
                "type": "Split", "pattern": {"Regex": pat}, "behavior": "Removed",
                "invert": False}
        tok = variant(tokenizers["qwen2"], mutate)
        compare_variant(d, f"Split Regex /{pat}/ (Oniguruma)", tok, ONIG_DOCS + everything,
                        quick=True)


def check_refused(d, base_json, mutate, expect):
    j = json.loads(base_json)
    mutate(j)
    path = os.path.join(d, "bad.json")
    with open(path, "w") as f:
        json.dump(j, f)
    r = subprocess.run([toktool.TOOL, path, "vocab"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and expect in r.stderr,
          f"refusal: expected exit 1 with {expect!r}, got {r.returncode}: {r.stderr.strip()}")


def main():
    texts = tokcorpus.training_texts()
    docs = tokcorpus.test_documents() + [
        b"say hello world now", b"x<|a|><|b|>y<|a|>z<|a|><|b", b"<|a|><|a|><|b|><|b|>",
        b"hello worldhello world",
        # Unicode normalization: decomposed accents, Hangul jamo, a ligature, the Ohm and
        # Angstrom signs, full-width and superscript digits, a compatibility CJK character.
        "cafe\u0301 A\u030a \u1100\u1161\u11a8 \ufb01 \u2126 \u212b \uff11\uff12 x\u00b2 \uf900".encode(),
        "e\u0301\u0301 \u0041\u0308\u0304 \u1e9b\u0323 \u2460 \u3300".encode()]
    rng = random.Random(3)
    tokenizers = {
        "gpt2": train_gpt2(texts),
        "llama3": train_llama3(texts),
        "llama2": train_llama2(texts, metaspace=False),
        "metaspace": train_llama2(texts, metaspace=True),
        "qwen2": train_qwen2(texts),
        "prefix": train_prefix(texts),
    }
    with tempfile.TemporaryDirectory() as d:
        for name, tok in tokenizers.items():
            path = os.path.join(d, name + ".json")
            tok.save(path)
            hf_ids = compare_encodings(name, tok, path, docs)
            if hf_ids is None:
                continue
            vocab = tok.get_vocab_size(with_added_tokens=True)
            randoms = [[rng.randrange(vocab) for _ in range(rng.randint(0, 30))]
                       for _ in range(200)]
            compare_decodings(name, tok, path, hf_ids + randoms)
            # Byte-level families give back exactly the (repaired) text, through ztrain's
            # decoder too.
            if name in ("gpt2", "llama3"):
                want = [x.decode("utf-8", errors="replace") for x in docs]
                plain = [e.ids for e in tok.encode_batch(want, add_special_tokens=False)]
                back, err = toktool.decode(path, plain, "--keep-special")
                back = back or []
                n_bad = sum(1 for a, b in zip(back, want) if a != b) + len(want) - len(back)
                check(n_bad == 0, f"{name}: {n_bad} documents do not round-trip: {err}")
            print(f"{name}: {len(docs)} documents, vocab {vocab}: encode and decode agree")

        check_added_normalized(d, tokenizers, docs)
        check_split_string(d, tokenizers, docs)
        check_metaspace(d, tokenizers, docs)
        check_onig_classes(d, tokenizers, docs)
        print("variants: normalized added tokens, Split String, Metaspace, Oniguruma classes")

        base = tokenizers["gpt2"].to_str()
        check_refused(d, base, lambda j: j["model"].update(type="WordPiece"),
                      "model type WordPiece is not supported")
        check_refused(d, base, lambda j: j.update(normalizer={"type": "BertNormalizer"}),
                      "normalizer type BertNormalizer is not supported")
        check_refused(d, base, lambda j: j.update(pre_tokenizer={"type": "Whitespace"}),
                      "pre_tokenizer type Whitespace is not supported")
        check_refused(d, base, lambda j: j.update(decoder={"type": "WordPiece", "prefix": "##"}),
                      "decoder type WordPiece is not supported")
        check_refused(d, base, lambda j: j.update(post_processor={"type": "BertProcessing"}),
                      "post_processor type BertProcessing is not supported")
        check_refused(d, base, lambda j: j["model"].update(dropout=0.1),
                      "model.dropout 0.1 is not supported")
        check_refused(d, base, lambda j: j["added_tokens"][0].update(lstrip=True),
                      "lstrip true is not supported")
        check_refused(d, base, lambda j: j["model"]["merges"].append(["zzqq", "xxyy"]),
                      "is not in model.vocab")
        check_refused(d, base, lambda j: j.update(truncation={"max_length": 5}),
                      "truncation is set")
        # Oniguruma constructs with no exact PCRE2 spelling are refused by name.
        qwen2 = tokenizers["qwen2"].to_str()
        for pat, expect in [(r"[[:alpha:]]+", "POSIX bracket"),
                            (r"[a-z&&[^aeiou]]", "intersection"),
                            (r"[a[0-9]]", "a class inside a class"), (r"[\W]", r"\W inside"),
                            (r"[\H]", r"\H inside"), (r"\Qa\E", r"\Q"), (r"(?x) a", "option (?x)"),
                            (r"(?s)a.b", "option (?s)"), (r"(?i:ss)", "under (?i)"),
                            (r"(?i)é", "under (?i)")]:
            def mutate(j, pat=pat):
                j["pre_tokenizer"]["pretokenizers"][0].update(pattern={"Regex": pat})
            check_refused(d, qwen2, mutate, expect)
    if failures:
        print(f"{len(failures)} failures", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
