"""added_tokens.json beside a tokenizer.json, against AutoTokenizer (transformers 4.46).

Without an added_tokens_decoder in tokenizer_config.json, from_pretrained's legacy branch reads
added_tokens.json ({"text": id}): each entry becomes an AddedToken, special when a key or
additional_special_tokens of tokenizer_config.json / special_tokens_map.json names its text,
normalized when not, which PreTrainedTokenizerFast.__init__ adds after tokenizer.json's own, in
the order of their ids; tokenizers gives each text the id it already has, else the next free
one, whatever the file says. On tiny byte-level tokenizers (one under NFKC), for each directory:
  - zt_tok_tool's ids of texts holding the entries equal AutoTokenizer's tokenizer(text), and its
    decode of them (special tokens skipped and kept) equals tokenizer.decode;
  - with added_tokens_decoder the file is not read, as transformers does not;
  - an entry whose id is not the one transformers gives its text (another token's id, a text
    tokenizer.json has under another id, a new text past the next free id) is refused naming the
    file and the entry, transformers' own result checked to differ from the file;
  - so is the key from_pretrained swaps for the file's last entry (it files the entries under a
    stale variable), and a malformed file: not an object, an id that is not an integer >= 0, a
    text or an id given twice, an empty text.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_tokenizer_added_json.py
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import transformers  # noqa: E402
from tokenizers import normalizers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toktool  # noqa: E402
from checker import Checker  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB_ONLY = ["<pad>", "<sep>", "<x>", "<y>", "<mask>", "<unk>", "<\ufb01>"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "hello world, x and y"] * 20
TEXTS = ["a<pad>b <x> c<y>d<sep> <s>e<mask>", "<pad><pad>x</s>", "no special tokens here",
         "<unk> <new> a<new2>b", "<\ufb01> <fi> \ufb01ne", ""]
FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def make_tokenizer(d, keep_added=(), normalizer=None):
    """A tokenizer.json whose vocabulary has <s>, </s> and VOCAB_ONLY, with only <s>, </s> and
    keep_added in its added_tokens (all special); its model.vocab."""
    return toktool.train_byte_level(d, CORPUS, ["<s>", "</s>"] + VOCAB_ONLY,
                                    dict.fromkeys(("<s>", "</s>", *keep_added), True),
                                    normalizer)


def write_dir(d, config=None, smap=None, added=None, keep_added=(), normalizer=None):
    """The directory: tokenizer.json and, where given, the side files (added: a dict, or the
    file's text as it is)."""
    for name in FILES:
        if os.path.exists(f"{d}/{name}"):
            os.remove(f"{d}/{name}")
    vocab = make_tokenizer(d, keep_added, normalizer)
    for name, value in zip(FILES, (config, smap, added)):
        if value is not None:
            with open(f"{d}/{name}", "w") as f:
                f.write(value if isinstance(value, str) else json.dumps(value))
    return vocab


def added(content, **flags):
    tok = {"__type": "AddedToken", "content": content, "lstrip": False, "rstrip": False,
           "normalized": False, "single_word": False, "special": True}
    tok.update(flags)
    return tok


def refused(ck, d, name, *words):
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ok = got is None and "added_tokens.json" in err and all(w in err for w in words)
    ck.check(ok, f"{name}: refused naming added_tokens.json and {words}: {err or got}")


PTF = {"tokenizer_class": "PreTrainedTokenizerFast"}
ck = Checker()
with tempfile.TemporaryDirectory() as d:
    vocab = make_tokenizer(d)
    V = {t: vocab[t] for t in VOCAB_ONLY}
    N = len(vocab)  # the next free id: the vocabulary's size (<s>, </s> are inside it)
    CASES = [
        # (name, tokenizer_config.json, special_tokens_map.json, added_tokens.json, more)
        ("repeats tokenizer.json's added tokens", PTF, None,
         {"<s>": 0, "</s>": 1, "<x>": V["<x>"]}, {"keep_added": ("<x>",)}),
        ("repeats them, Llama class", {"tokenizer_class": "LlamaTokenizerFast",
                                       "add_bos_token": False, "pad_token": "<pad>"},
         None, {"<s>": 0, "</s>": 1, "<pad>": V["<pad>"]}, {"keep_added": ("<pad>",)}),
        ("a vocabulary text, not special", PTF, None, {"<x>": V["<x>"]}, {}),
        ("special by tokenizer_config's pad_token", {**PTF, "pad_token": "<x>"}, None,
         {"<y>": V["<y>"], "<x>": V["<x>"]}, {}),
        ("special by an AddedToken pad_token", {**PTF, "pad_token": added("<x>")}, None,
         {"<x>": V["<x>"]}, {}),
        ("special by additional_special_tokens", {**PTF, "additional_special_tokens": ["<y>"]},
         None, {"<y>": V["<y>"], "<sep>": V["<sep>"]}, {}),
        ("special by special_tokens_map.json", {**PTF, "pad_token": "<sep>"},
         {"pad_token": "<pad>", "additional_special_tokens": [{"content": "<mask>"}]},
         {"<pad>": V["<pad>"], "<mask>": V["<mask>"], "<sep>": V["<sep>"]}, {}),
        ("a new text at the next free id", PTF, None, {"<new>": N}, {}),
        ("two new texts, one special", {**PTF, "additional_special_tokens": ["<new2>"]}, None,
         {"<new2>": N + 1, "<new>": N, "<x>": V["<x>"]}, {}),
        ("a new text after tokenizer.json's own past the vocabulary", PTF, None,
         {"<new>": N + 1}, {"extra_added": "<zz>"}),
        ("Llama's default <unk>, special but normalized",
         {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False}, None,
         {"<unk>": V["<unk>"]}, {}),
        ("NFKC, a vocabulary text", PTF, None, {"<\ufb01>": V["<\ufb01>"]},
         {"normalizer": normalizers.NFKC()}),
        ("NFKC, a special vocabulary text (raw)", {**PTF, "pad_token": "<\ufb01>"}, None,
         {"<\ufb01>": V["<\ufb01>"]}, {"normalizer": normalizers.NFKC()}),
        ("not read beside an added_tokens_decoder", {**PTF, "added_tokens_decoder": {}}, None,
         {"<x>": V["<x>"], "<new>": N + 5, "<y>": "bad"}, {}),
        ("the last entry filed under pad_token's own text", PTF,
         {"pad_token": "<pad>", "additional_special_tokens": ["<pad>"]},
         {"<x>": V["<x>"], "<pad>": V["<pad>"]}, {}),
        ("filed under a text tokenizer.json has", PTF,
         {"pad_token": "<s>", "additional_special_tokens": ["<s>"]},
         {"<x>": V["<x>"], "<y>": V["<y>"]}, {}),
        ("without tokenizer_config.json", None, None, {"<x>": V["<x>"], "<new>": N}, {}),
    ]
    for name, config, smap, entries, more in CASES:
        extra = more.pop("extra_added", None)
        write_dir(d, config, smap, entries, **more)
        if extra:
            # tokenizer.json with an added token past the vocabulary, at N
            j = json.load(open(f"{d}/tokenizer.json"))
            j["added_tokens"].append({"id": N, "content": extra, "single_word": False,
                                      "lstrip": False, "rstrip": False, "normalized": False,
                                      "special": False})
            json.dump(j, open(f"{d}/tokenizer.json", "w"))
        # Without either config file AutoTokenizer cannot pick a class; the fast base class
        # reads the directory.
        hf = (AutoTokenizer if config else PreTrainedTokenizerFast).from_pretrained(d)
        if "added_tokens_decoder" not in (config or {}):
            # the entries are read: each text is one token of the id the file gives it
            ids = {t: hf.convert_tokens_to_ids(t) for t in entries}
            single = all(hf(t, add_special_tokens=False)["input_ids"] == [i]
                         for t, i in entries.items())
            ck.check(ids == entries and single, f"{name}: transformers takes the entries: {ids}")
        toktool.check_against_hf(ck, f"{d}/tokenizer.json", name, hf, TEXTS)

    # Ids the file gives that transformers does not: refused by name, transformers' result
    # shown to differ.
    for name, entries, keep, text, words in [
        ("a vocabulary text under another id", {"<x>": V["<x>"] + 1}, (), "<x>",
         ("\"<x>\"", str(V["<x>"]))),
        ("a new text past the next free id", {"<new>": N + 3}, (), "<new>",
         ("\"<new>\"", str(N))),
        ("a new text under a vocabulary text's id", {"<new>": V["<y>"]}, (), "<new>",
         ("\"<new>\"", "\"<y>\"")),
        ("a new text under an added token's id", {"<new>": 1}, (), "<new>",
         ("\"<new>\"", "\"</s>\"")),
        ("an added token under another id", {"<x>": V["<x>"] + 1}, ("<x>",), "<x>",
         ("\"<x>\"", "added_tokens")),
    ]:
        write_dir(d, PTF, None, entries, keep_added=keep)
        hf = AutoTokenizer.from_pretrained(d)
        ids = hf(text, add_special_tokens=False)["input_ids"]
        ck.check(ids != [entries[text]], f"{name}: transformers gives {text} {ids}, not the "
                 f"file's {entries[text]}")
        refused(ck, d, name, *words)

    # from_pretrained files each entry under a stale `token` (here the map's last
    # additional_special_tokens item, <pad>): pad_token becomes the last entry, <y>.
    write_dir(d, PTF, {"pad_token": "<pad>", "additional_special_tokens": ["<pad>"]},
              {"<x>": V["<x>"], "<y>": V["<y>"]})
    hf = AutoTokenizer.from_pretrained(d)
    ck.check(hf.pad_token == "<y>", f"transformers swaps pad_token <pad> for {hf.pad_token}")
    refused(ck, d, "pad_token swapped for the last entry", "pad_token", "\"<pad>\"", "\"<y>\"")

    # Malformed files: refused naming the file and the entry.
    for name, text, words in [
        ("not an object", '["<x>"]', ("object",)),
        ("not JSON", '{"<x>": 4', ()),
        ("a string id", '{"<x>": "%d"}' % V["<x>"], ("\"<x>\"",)),
        ("a negative id", '{"<x>": -1}', ("\"<x>\"",)),
        ("a fractional id", '{"<x>": 4.5}', ("\"<x>\"",)),
        ("a boolean id", '{"<x>": true}', ("\"<x>\"",)),
        ("a text given twice", '{"<x>": %d, "<x>": %d}' % (V["<x>"], V["<x>"]), ("\"<x>\"",)),
        ("an id given twice", '{"<x>": %d, "<y>": %d}' % (V["<x>"], V["<x>"]),
         ("\"<x>\"", "\"<y>\"")),
        ("an empty text", '{"": %d}' % N, ("empty",)),
    ]:
        write_dir(d, PTF, None, text)
        refused(ck, d, name, *words)
    # beside an added_tokens_decoder the same file is not read at all
    write_dir(d, {**PTF, "added_tokens_decoder": {}}, None, '["<x>"]')
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ck.check(got == [AutoTokenizer.from_pretrained(d)(t)["input_ids"] for t in TEXTS],
             f"a malformed file beside an added_tokens_decoder is not read: {err}")
ck.done()
