"""The special-token variables of a chat template as transformers 4.46 resolves them
(engine/tokenizer's zt_tokenizer_special_tokens_map, read by zt_chat_template_load), against
AutoTokenizer.from_pretrained(dir).apply_chat_template, byte for byte.

apply_chat_template renders with the tokenizer's special_tokens_map: the keys of
tokenizer_config.json, special_tokens_map.json's (read only without added_tokens_decoder) and the
class's __init__ defaults (LlamaTokenizerFast's "<s>", GemmaTokenizerFast's "<pad>", ...), and
additional_special_tokens as from_pretrained builds the list. Directories of several classes
render a template that prints every special-token variable and whether it is defined: a Llama
directory without bos_token, a Gemma one without pad_token, one whose class comes from
config.json's model_type, legacy directories whose tokens are in special_tokens_map.json, configs
overriding a default with a string and an AddedToken, null and empty tokens, CodeLlama's and
Qwen2's defaults. Then `ztrain prepare --format chat` on the Llama directory gives
apply_chat_template(tokenize=True)'s ids (its BOS from the class default).

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_chat_specials.py
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from ztref import Checker, tool  # noqa: E402

transformers.logging.set_verbosity_error()

SPECIALS = ["<s>", "</s>", "<unk>", "<bos>", "<eos>", "<pad>", "<sep>", "<cls>", "<mask>", "<x>",
            "<y>", "<z>", "<|endoftext|>"]
NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
         "mask_token", "additional_special_tokens"]
# Every variable, whether it is defined, and the list item by item.
TEMPLATE = ("".join("{{ '%s=' ~ (%s is defined) ~ ':' }}{{ %s }};" % (n, n, n) for n in NAMES) +
            "{% if additional_special_tokens is defined %}"
            "{% for t in additional_special_tokens %}[{{ t }}]{% endfor %}{% endif %}|"
            "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")


def added(content, **flags):
    """An AddedToken as save_pretrained writes it into tokenizer_config.json."""
    tok = {"__type": "AddedToken", "content": content, "lstrip": False, "rstrip": False,
           "normalized": False, "single_word": False, "special": True}
    tok.update(flags)
    return tok


# (name, tokenizer_config.json without its chat_template, special_tokens_map.json or None,
#  config.json or None)
CASES = [
    ("LlamaTokenizerFast without bos_token", {"tokenizer_class": "LlamaTokenizerFast"}, None,
     None),
    ("GemmaTokenizerFast without pad_token",
     {"tokenizer_class": "GemmaTokenizerFast", "eos_token": "<z>"}, None, None),
    ("the class of config.json's model_type", {}, None, {"model_type": "llama"}),
    ("a config overriding the defaults",
     {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<x>", "eos_token": added("<y>"),
      "pad_token": "<pad>", "additional_special_tokens": ["<z>", added("<sep>")]}, None, None),
    ("null and empty tokens",
     {"tokenizer_class": "LlamaTokenizerFast", "unk_token": None, "eos_token": "",
      "mask_token": None, "additional_special_tokens": None}, None, None),
    ("a legacy directory: special_tokens_map.json only",
     {"tokenizer_class": "PreTrainedTokenizerFast"},
     {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": False},
      "unk_token": "<unk>", "pad_token": "<pad>", "cls_token": "<cls>",
      "additional_special_tokens": ["<x>", {"content": "<y>", "normalized": True}]}, None),
    ("a legacy directory: the map over the config and the class default",
     {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<x>", "eos_token": "<y>",
      "additional_special_tokens": ["<x>", "<z>", added("<y>")]},
     {"bos_token": "<bos>", "unk_token": None,
      "additional_special_tokens": ["<z>", "<sep>", "<sep>", {"content": "<y>"},
                                    {"content": "<y>"}, {"content": "<cls>"}]}, None),
    ("special_tokens_map.json beside an added_tokens_decoder (not read)",
     {"tokenizer_class": "LlamaTokenizerFast", "added_tokens_decoder": {}, "eos_token": "<y>"},
     {"bos_token": "<bos>", "eos_token": "<eos>", "additional_special_tokens": ["<z>"]}, None),
    ("CodeLlamaTokenizerFast's infilling tokens",
     {"tokenizer_class": "CodeLlamaTokenizerFast", "suffix_token": None,
      "additional_special_tokens": ["\u2581<PRE>", "<x>"]}, None, None),
    ("Qwen2TokenizerFast's defaults", {"tokenizer_class": "Qwen2TokenizerFast"}, None, None),
]
CONVS = [[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]]


def make_dir(d, cfg, smap, mc, template=TEMPLATE):
    os.makedirs(d)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world", "the weather is sunny"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{d}/tokenizer.json")
    json.dump({**cfg, "chat_template": template}, open(f"{d}/tokenizer_config.json", "w"))
    if smap is not None:
        json.dump(smap, open(f"{d}/special_tokens_map.json", "w"))
    if mc is not None:
        json.dump(mc, open(f"{d}/config.json", "w"))
    with open(f"{d}/convs.json", "w") as f:
        json.dump(CONVS, f)


ck = Checker()
with tempfile.TemporaryDirectory() as root:
    for k, (name, cfg, smap, mc) in enumerate(CASES):
        d = f"{root}/{k}"
        make_dir(d, cfg, smap, mc)
        hf = AutoTokenizer.from_pretrained(d)
        out = f"{d}/out"
        os.makedirs(out)
        p = subprocess.run([tool("zt_chat_render"), f"{d}/tokenizer_config.json",
                            f"{d}/convs.json", out], capture_output=True, text=True)
        for i, conv in enumerate(CONVS):
            want = hf.apply_chat_template(conv, tokenize=False)
            path = f"{out}/{i}.txt"
            got = open(path, encoding="utf-8").read() if os.path.exists(path) else None
            why = p.stderr.strip() or (open(f"{out}/{i}.err").read()
                                       if os.path.exists(f"{out}/{i}.err") else "")
            ck.check(got == want, f"{name}: " + ("equal" if got == want else
                                                f"{got!r} vs {want!r} {why[:300]}"))

    # prepare --format chat on the Llama directory without bos_token writes
    # apply_chat_template(tokenize=True)'s ids, the class default's <s> first.
    d = f"{root}/prepare"
    make_dir(d, {"tokenizer_class": "LlamaTokenizerFast"}, None, None,
             "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    with open(f"{d}/chats.jsonl", "w") as f:
        for conv in CONVS * 2:
            f.write(json.dumps({"messages": conv}) + "\n")
    p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json", "--out",
                        f"{d}/data", "--format", "chat", f"{d}/chats.jsonl"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 0, f"prepare --format chat: exit {p.returncode} {p.stderr[-300:]}")
    got = []
    for n in sorted(os.listdir(f"{d}/data")) if os.path.isdir(f"{d}/data") else []:
        if n.endswith(".bin") and "train" in n:
            with open(f"{d}/data/{n}", "rb") as f:
                head = struct.unpack("<256i", f.read(1024))
                got += list(struct.unpack(f"<{head[2]}H", f.read(2 * head[2])))
    hf = AutoTokenizer.from_pretrained(d)
    want = [t for conv in CONVS * 2 for t in hf.apply_chat_template(conv, tokenize=True)]
    ck.check(got == want, f"prepare's tokens are apply_chat_template's: {got} vs {want}")

ck.done()
