"""{% generation %} blocks with Metaspace/SentencePiece tokenizers, against transformers 4.46.

ztrain's token offsets (zt_tokenizer_offsets) for SentencePiece-style tokenizers trained here
with byte fallback (<0xNN> tokens) must be those of the tokenizers library: in the forms of
Llama 2 (a normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer), Mistral (a Metaspace
pre-tokenizer, prepend_scheme "first", [INST] and [/INST] added tokens), a Metaspace with
prepend_scheme "always" (split and not), Gemma (Replace(" ", "▁"), a Split on " ") and
tokenizers' SentencePieceBPETokenizer (NFKC, a Metaspace "always"). Two checks:

- directly, on many strings (spaces leading, trailing and doubled, added tokens glued to words,
  CJK, emoji, accents, newlines, a literal "▁"), each character's token from ztrain's offsets is
  tokenizers' Encoding.char_to_token, and the offsets are known exactly; where NFKC changes the
  text ("ﬁ") they are not, and prepare keeps its fallback;
- `ztrain prepare --format chat`'s ids and masks equal apply_chat_template(...,
  return_assistant_tokens_mask=True)'s with Llama-2 and Mistral [INST] templates: a reply after
  a space (the token "▁Paris" holds it), right after "[/INST]", a block ending inside a token,
  CJK and emoji over byte-fallback tokens, accented text, </s> right after the block. Before
  exact offsets, a block edge inside a token was refused."""
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tokenizers import (SentencePieceBPETokenizer, Tokenizer, decoders, models,  # noqa: E402
                        normalizers, pre_tokenizers, trainers)
from transformers import PreTrainedTokenizerFast  # noqa: E402

import toktool  # noqa: E402
from ztref import Checker, prepare_chat  # noqa: E402

ck = Checker()

# "ж", "世界", "🦀" and "ï" are not in the corpus: byte-fallback tokens carry them.
CORPUS = ["Paris is the capital of France.", "What is the capital of France?", "héllo café",
          "你好 你好 你好", "😀 😀", "ab abab abab", "Paris Paris", "q a b",
          "[INST] What is the capital of France? [/INST] Paris"] * 30
SPECIAL = ["<unk>", "<s>", "</s>"]
INST = ["[INST]", "[/INST]"]


def with_bytes(path):
    """Adds the 256 byte-fallback tokens <0x00>..<0xFF> to a trained vocabulary, as
    SentencePiece's converted vocabularies hold them."""
    j = json.load(open(path))
    vocab = j["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    json.dump(j, open(path, "w"), ensure_ascii=False)


def trained(d, name, norm=None, pre=None, specials=SPECIAL):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    if norm is not None:
        tok.normalizer = norm
    if pre is not None:
        tok.pre_tokenizer = pre
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=330, special_tokens=specials,
                                                        show_progress=False))
    os.makedirs(f"{d}/{name}")
    tok.save(f"{d}/{name}/tokenizer.json")
    with_bytes(f"{d}/{name}/tokenizer.json")
    return f"{d}/{name}"


def sentencepiece_bpe(d):
    tok = SentencePieceBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=330, special_tokens=SPECIAL, show_progress=False)
    os.makedirs(f"{d}/spbpe")
    tok.save(f"{d}/spbpe/tokenizer.json")
    j = json.load(open(f"{d}/spbpe/tokenizer.json"))
    j["model"]["byte_fallback"] = True
    json.dump(j, open(f"{d}/spbpe/tokenizer.json", "w"), ensure_ascii=False)
    with_bytes(f"{d}/spbpe/tokenizer.json")
    return f"{d}/spbpe"


def strings(seed=7, n=300):
    """Short texts from pieces that meet spaces, added tokens and each other in every order."""
    parts = ["Paris", " Paris", "Paris ", "  ", " ", "is", "the capital", "héllo", "café",
             "naïve", "你好", "世界", "😀", "🦀", "ж", "\n", "\t", "<s>", "</s>", "[INST]",
             "[/INST]", "▁", "ab", "Pa", "ris", ".", "e\u0301"]
    rng = random.Random(seed)
    out = ["", "Paris", " Paris", "Paris ", "<s>Paris", "</s>", "</s> Paris", "[INST] q [/INST]",
           "[INST]q[/INST]Paris</s>", "世界", " 🦀 ", "▁Paris", "  ", "a</s> b</s>"]
    while len(out) < n:
        out.append("".join(rng.choice(parts) for _ in range(rng.randint(1, 7))))
    return out


def token_of_each_char(text, ends):
    """The token char_to_token gives each character, from ztrain's byte ends: the first token
    whose end lies past the character's first byte."""
    out, at = [], 0
    for ch in text:
        out.append(next((k for k, e in enumerate(ends) if e > at), None))
        at += len(ch.encode())
    return out


def direct(d, name, texts, exact=True):
    hf = Tokenizer.from_file(f"{d}/tokenizer.json")
    got, err = toktool.offsets(f"{d}/tokenizer.json", texts)
    if not ck.check(got is not None, f"{name}: zt_tok_tool offsets runs {err}"):
        return
    bad = []
    for text, (ids, ends) in zip(texts, got):
        enc = hf.encode(text, add_special_tokens=False)
        if ids != enc.ids:
            bad.append((text, "ids", ids, enc.ids))
        elif exact and ends is None:
            bad.append((text, "offsets not known", enc.tokens))
        elif exact:
            want = [enc.char_to_token(c) for c in range(len(text))]
            mine = token_of_each_char(text, ends)
            if mine != want:
                bad.append((text, enc.tokens, enc.offsets, ends, mine, want))
        elif ends is not None:
            bad.append((text, "offsets claimed exact", enc.tokens, enc.offsets, ends))
    ck.check(not bad, f"{name}: {len(texts)} texts' ids and per-character tokens equal "
             f"tokenizers' char_to_token" + ("" if exact else " (no exact offsets claimed)") +
             "".join(f"\n  {b!r}" for b in bad[:5]))


# Llama 2: "[INST] q [/INST] answer </s>": the reply after a space
LLAMA2 = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }}"
          " [/INST] {% else %}{% generation %}{{ m.content }}{% endgeneration %}{{ eos_token }}"
          "{% endif %}{% endfor %}")
# Mistral: the reply right after "[/INST]", </s> right after the block
MISTRAL = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}"
           "[/INST]{% else %}{% generation %}{{ m.content }}{% endgeneration %}{{ eos_token }}"
           "{% endif %}{% endfor %}")
# the block ends inside a token: "Pa" in the block, "ris" after it
MIDTOKEN = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }}"
            " [/INST] {% else %}{% generation %}{{ m.content }}{% endgeneration %}ris."
            "{{ eos_token }}{% endif %}{% endfor %}")


def conv(*turns):
    return {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                         for i, t in enumerate(turns)]}


REPLIES = ["Paris", "Paris is the capital of France.", "héllo café", "naïve", "世界", "🦀", "ж",
           "你好 😀", " Paris ", "a\nb", "e\u0301"]
ROWS = {
    "llama2": (LLAMA2, [conv("What is the capital of France?", r) for r in REPLIES] +
               [conv("a", "Paris", "b", "你好")]),
    "mistral": (MISTRAL, [conv("What is the capital of France?", r) for r in REPLIES] +
                [conv("a", "Paris", "b", "世界")]),
    "midtoken": (MIDTOKEN, [conv("q", "Pa"), conv("q", "is Pa"), conv("q", "世界 Pa")]),
}
CONFIG = {"bos_token": "<s>", "eos_token": "</s>"}


def want(d, row, template):
    hf = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json", chat_template=template,
                                 **CONFIG)
    out = hf.apply_chat_template(row["messages"], tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    return out["input_ids"], out["assistant_masks"], hf.convert_ids_to_tokens(out["input_ids"])


def compare(d, name, row, template):
    """prepare's ids and mask of row against transformers'."""
    ids, mask, toks = want(d, row, template)
    p, got = prepare_chat(d, [row], dict(CONFIG, chat_template=template))
    what = f"{name}: {[m['content'] for m in row['messages']]!r}"
    if not ck.check(p.returncode == 0, f"{what}: prepare exit {p.returncode} "
                    f"{p.stderr.strip()[-250:]}"):
        return
    got_mask = [b & 1 for b in got[1]]
    # the example's first token is never a target: its bit does not matter
    same = got[0] == ids and got_mask[1:] == mask[1:]
    ck.check(same, f"{what}: ids and mask equal apply_chat_template's ({sum(mask)} of "
             f"{len(mask)} tokens)" + ("" if same else f"\n  tokens {toks}\n  got  {got_mask}\n"
                                      f"  want {mask}"))


with tempfile.TemporaryDirectory() as work:
    dirs = {
        "llama2 (Prepend+Replace)": trained(work, "llama2", norm=normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])),
        "mistral (Metaspace first)": trained(work, "mistral", pre=pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False), specials=SPECIAL + INST),
        "Metaspace always": trained(work, "always", pre=pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="always", split=True)),
        "Metaspace always, no split": trained(work, "always_nosplit", pre=pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="always", split=False), specials=SPECIAL + INST),
        "gemma (Replace, a Split)": trained(work, "gemma", norm=normalizers.Replace(" ", "▁"),
                                            pre=pre_tokenizers.Split(" ", "merged_with_previous")),
        "SentencePieceBPETokenizer": sentencepiece_bpe(work),
    }
    texts = strings()
    for tname, d in dirs.items():
        # NFKC composes "e" and a combining accent: no exact offsets then (below)
        nfkc = tname == "SentencePieceBPETokenizer"
        direct(d, tname, [t for t in texts if not (nfkc and "\u0301" in t)])
    # NFKC rewrites "ﬁ": no exact offsets then
    direct(dirs["SentencePieceBPETokenizer"], "SentencePieceBPETokenizer, NFKC changes the text",
           ["ﬁne", "a ﬁ", "Paris ①", "e\u0301"], exact=False)

    # The pattern that was refused: the reply after a space starts inside "▁Paris".
    d = dirs["llama2 (Prepend+Replace)"]
    _, _, toks = want(d, conv("q", "Paris"), LLAMA2)
    ck.check("▁Paris" in toks, f"the block after a space starts inside '▁Paris': {toks}")
    _, _, toks = want(d, conv("q", "Pa"), MIDTOKEN)
    ck.check("▁Paris" in toks, f"the block 'Pa' ends inside '▁Paris': {toks}")
    _, _, toks = want(d, conv("q", "世界"), LLAMA2)
    ck.check("<0xE4>" in toks and "<0x8C>" in toks, f"'世界' is split over byte tokens: {toks}")

    for tname, d in dirs.items():
        for pattern, (template, rows) in ROWS.items():
            for row in rows:
                if tname == "SentencePieceBPETokenizer" and any(
                        "\u0301" in m["content"] for m in row["messages"]):
                    continue
                compare(d, f"{tname} {pattern}", row, template)
    # NFKC changes "ﬁ": the fallback maps this block, whose edges are on token boundaries
    compare(dirs["SentencePieceBPETokenizer"], "SentencePieceBPETokenizer NFKC",
            conv("q", "ﬁne"), MISTRAL)
ck.done()
