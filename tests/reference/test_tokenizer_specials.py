"""Special tokens that tokenizer_config.json names but tokenizer.json's added_tokens lacks,
against AutoTokenizer (transformers 4.46).

PreTrainedTokenizerFast.__init__ adds to the backend tokenizer the tokens of the config's
added_tokens_decoder (or, without it, tokenizer.json's added_tokens again), the keys bos/eos/
unk/sep/pad/cls/mask_token and additional_special_tokens, and the class's default tokens, with
their AddedToken flags: a token is special when it says so or a key names its text. Tiny
byte-level tokenizers hold these texts in their vocabulary (and, for one, under an NFKC
normalizer) with only some of them in added_tokens; for each tokenizer_config.json:
  - zt_tok_tool's ids of texts holding the tokens equal AutoTokenizer's tokenizer(text);
  - its decode of those ids, skipping special tokens and keeping them, equals
    tokenizer.decode(ids, skip_special_tokens=...);
  - a token the vocabulary lacks (transformers gives it a new id past the vocabulary) is refused
    by name in a text that holds it, and texts without it encode as AutoTokenizer's; a token with
    lstrip, rstrip or single_word is refused by name.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_tokenizer_specials.py
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import transformers  # noqa: E402
from tokenizers import Tokenizer, normalizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toktool  # noqa: E402
from checker import Checker  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB_ONLY = ["<pad>", "<sep>", "<x>", "<y>", "<mask>", "<unk>", "<bos>", "<eos>", "<\ufb01>"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "hello world, x and y"] * 20
TEXTS = ["a<pad>b <x> c<y>d<sep> <s>e<mask>", "<pad><pad>x</s>", "no special tokens here",
         "<unk> <bos> <eos>", "<\ufb01> <fi> \ufb01ne", ""]


def make_tokenizer(d, keep_added, normalizer=None):
    """A tokenizer.json whose vocabulary has <s>, </s> and VOCAB_ONLY, with only <s>, </s> and
    keep_added ({text: special}) in its added_tokens."""
    toktool.train_byte_level(d, CORPUS, ["<s>", "</s>"] + VOCAB_ONLY,
                             {"<s>": True, "</s>": True, **keep_added}, normalizer)


def added(content, **flags):
    tok = {"__type": "AddedToken", "content": content, "lstrip": False, "rstrip": False,
           "normalized": False, "single_word": False, "special": True}
    tok.update(flags)
    return tok


def decoder_entry(content, **flags):
    tok = added(content, **flags)
    del tok["__type"]
    return tok


PTF = {"tokenizer_class": "PreTrainedTokenizerFast"}
CASES = [
    # (name, tokenizer.json's added tokens besides <s> </s>, normalizer, tokenizer_config.json,
    # and special_tokens_map.json where there is one)
    ("pad_token string", {}, None, {**PTF, "pad_token": "<pad>"}),
    ("every key as strings", {}, None,
     {**PTF, "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "sep_token": "<sep>",
      "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"}),
    ("pad_token AddedToken normalized", {}, None,
     {**PTF, "pad_token": added("<pad>", normalized=True)}),
    ("additional_special_tokens", {}, None,
     {**PTF, "additional_special_tokens": ["<x>", added("<y>", special=False, normalized=True)]}),
    ("added_tokens_decoder not special", {}, None,
     {**PTF, "added_tokens_decoder": {"4": decoder_entry("<x>", special=False)}}),
    ("added_tokens_decoder bare", {}, None,
     {**PTF, "added_tokens_decoder": {"4": {"content": "<x>"}}}),
    ("added_tokens_decoder special, wrong index", {}, None,
     {**PTF, "added_tokens_decoder": {"99": decoder_entry("<x>"), "7": decoder_entry("<y>")},
      "pad_token": "<pad>", "mask_token": added("<mask>")}),
    ("tokenizer.json's plain <x> named pad_token", {"<x>": False}, None,
     {**PTF, "pad_token": "<x>"}),
    ("... with an added_tokens_decoder", {"<x>": False}, None,
     {**PTF, "pad_token": "<x>", "added_tokens_decoder": {}}),
    ("... in additional_special_tokens", {"<x>": False}, None,
     {**PTF, "additional_special_tokens": ["<x>"]}),
    ("Llama's default tokens", {}, None, {"tokenizer_class": "LlamaTokenizerFast",
                                          "add_bos_token": False}),
    ("Gemma's default tokens", {}, None, {"tokenizer_class": "GemmaTokenizerFast",
                                          "add_bos_token": False, "bos_token": "<s>"}),
    ("Llama's default unk_token null", {}, None,
     {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False, "unk_token": None}),
    ("NFKC, normalized token", {}, normalizers.NFKC(),
     {**PTF, "additional_special_tokens": [added("<\ufb01>", normalized=True)]}),
    ("NFKC, raw token", {}, normalizers.NFKC(),
     {**PTF, "additional_special_tokens": ["<\ufb01>"]}),
    ("NFKC, normalized token in tokenizer.json", {"<\ufb01>": True}, normalizers.NFKC(),
     {**PTF, "additional_special_tokens": [added("<\ufb01>", normalized=True)]}),
    ("CodeLlama's default tokens", {}, None, {"tokenizer_class": "CodeLlamaTokenizerFast",
                                              "add_bos_token": False}),
    # Without added_tokens_decoder, from_pretrained reads special_tokens_map.json, whose keys
    # override the config's (its AddedTokens are special whatever they say).
    ("special_tokens_map.json", {}, None, {**PTF, "pad_token": "<sep>",
                                           "additional_special_tokens": ["<y>"]},
     {"pad_token": "<pad>", "mask_token": {"content": "<mask>", "special": False},
      "additional_special_tokens": [{"content": "<x>", "normalized": True}, "<y>"]}),
    ("special_tokens_map.json beside an added_tokens_decoder", {}, None,
     {**PTF, "added_tokens_decoder": {}, "pad_token": "<sep>"}, {"pad_token": "<pad>"}),
]


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    for name, keep, normalizer, config, *smap in CASES:
        make_tokenizer(d, keep, normalizer)
        json.dump(config, open(f"{d}/tokenizer_config.json", "w"))
        if smap:
            json.dump(smap[0], open(f"{d}/special_tokens_map.json", "w"))
        toktool.check_against_hf(ck, f"{d}/tokenizer.json", name,
                                 AutoTokenizer.from_pretrained(d), TEXTS)
        if smap:
            os.remove(f"{d}/special_tokens_map.json")

    # A token the vocabulary lacks: transformers gives it a new id, the model has no row for it.
    make_tokenizer(d, {})
    json.dump({**PTF, "pad_token": "<pad>", "additional_special_tokens": ["<new>"]},
              open(f"{d}/tokenizer_config.json", "w"))
    hf = AutoTokenizer.from_pretrained(d)
    n_vocab = Tokenizer.from_file(f"{d}/tokenizer.json").get_vocab_size()
    ck.check(hf("a<new>")["input_ids"][-1] == n_vocab,
             f"transformers adds <new> as id {hf('a<new>')['input_ids']} (vocabulary {n_vocab})")
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ck.check(got == [hf(t)["input_ids"] for t in TEXTS], f"texts without <new>: {got} ({err})")
    got, err = toktool.encode(f"{d}/tokenizer.json", ["a<new>"])
    ck.check(got is None and "<new>" in err and "additional_special_tokens[0]" in err
             and "added_tokens" in err, f"a text holding <new> is refused by name: {err}")

    # CodeLlama's default infilling tokens, which this vocabulary lacks, likewise.
    json.dump({"tokenizer_class": "CodeLlamaTokenizerFast"}, open(f"{d}/tokenizer_config.json", "w"))
    hf, pre = AutoTokenizer.from_pretrained(d), "\u2581<PRE>"
    ids = hf(pre, add_special_tokens=False)["input_ids"]
    ck.check(ids[0] >= n_vocab, f"transformers adds {pre} as a new id: {ids}")
    got, err = toktool.encode(f"{d}/tokenizer.json", ["x" + pre])
    ck.check(got is None and pre in err and "prefix_token" in err,
             f"a text holding {pre} is refused by name: {err}")

    # lstrip, rstrip and single_word change what is matched; ztrain refuses them by name.
    for flag in ("lstrip", "rstrip", "single_word"):
        json.dump({**PTF, "pad_token": added("<pad>", **{flag: True})},
                  open(f"{d}/tokenizer_config.json", "w"))
        got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
        ck.check(got is None and flag in err and "pad_token" in err,
                 f"pad_token with {flag} refused by name: {err}")
ck.done()
