"""tokenizer_config.json's add_bos_token / add_eos_token against AutoTokenizer (transformers 4.46).

AutoTokenizer picks a class (tokenizer_config.json's tokenizer_class, else config.json's
model_type), and the Llama, CodeLlama, Gemma, GPTNeoX and Cohere fast classes replace
tokenizer.json's post-processor with "[bos] $A [eos]" built from the two flags and the bos/eos
tokens (their update_post_processor); PreTrainedTokenizerFast, GPT2 and Qwen2 keep tokenizer.json's.
A tiny byte-level tokenizer holding every class's default special tokens, with a "<s> $A"
template in tokenizer.json, is saved beside a tokenizer_config.json for each class and each
combination of the flags (absent, true, false, null) and the tokens (given or the class default),
and:
  - zt_tok_tool's ids (encode with the template tokens) must equal
    AutoTokenizer.from_pretrained(dir)(text)["input_ids"] for each text;
  - for the Llama class, `ztrain prepare --format prompt-completion` must give
    tokenizer(prompt + completion)["input_ids"] + [</s>] per example, and `ztrain prepare` of text
    each document's tokenizer(doc)["input_ids"] (or the separator and the bare ids when the
    template is empty);
  - where transformers raises (add_bos_token true with bos_token null) or would add a new token
    (a default bos_token the tokenizer lacks), ztrain refuses, naming the key; so it does
    where a class's add_prefix_space would rewrite the pre-tokenizer (GPT2, GPTNeoX, Cohere) or
    convert tokenizer.model (Llama); a tokenizer_class ztrain does not know is refused by name.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_tokenizer_config.py
"""
import itertools
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
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toktool  # noqa: E402
from ztref import Checker, tool  # noqa: E402

transformers.logging.set_verbosity_error()

SPECIALS = ["<unk>", "<s>", "</s>", "<bos>", "<eos>", "<|endoftext|>", "<BOS_TOKEN>",
            "<|END_OF_TURN_TOKEN|>"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "What is the capital of France?",
          "Paris is the capital of France.", "héllo wörld", "1 + 2 = 3"] * 20
TEXTS = ["Hello world", "What is the capital of France? Paris.", "", " x", "a</s>b<s>"]
PAIRS = [{"prompt": "What is the capital of France?", "completion": " Paris."},
         {"prompt": "1 + 2 =", "completion": " 3"}]
CLASSES = ["LlamaTokenizerFast", "LlamaTokenizer", "CodeLlamaTokenizerFast", "GemmaTokenizerFast",
           "GPTNeoXTokenizerFast", "CohereTokenizerFast", "PreTrainedTokenizerFast",
           "GPT2TokenizerFast", "Qwen2TokenizerFast"]
FLAG = {"absent": None, "true": True, "false": False, "null": "null"}


def make_tokenizer(specials, template=True):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def write_config(d, cls, bos, eos, tokens, model_type=None):
    cfg = {}
    if cls:
        cfg["tokenizer_class"] = cls
    for key, v in (("add_bos_token", bos), ("add_eos_token", eos)):
        if FLAG[v] is not None:
            cfg[key] = None if FLAG[v] == "null" else FLAG[v]
    cfg.update(tokens)
    json.dump(cfg, open(f"{d}/tokenizer_config.json", "w"))
    if model_type:
        json.dump({"model_type": model_type}, open(f"{d}/config.json", "w"))
    elif os.path.exists(f"{d}/config.json"):
        os.remove(f"{d}/config.json")


def hf_load(d):
    try:
        return AutoTokenizer.from_pretrained(d), None
    except Exception as e:  # noqa: BLE001 -- the reference's refusal is the expected result
        return None, f"{type(e).__name__}: {e}"


def read_tokens(prefix):
    data = open(prefix + ".bin", "rb").read()
    magic, _, n = struct.unpack("<3i", data[:12])
    return list(struct.unpack(f"<{n}H", data[1024:1024 + n * 2]))


def prepare(d, out, *args):
    return subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                           "--out", f"{d}/{out}", "--overwrite", *args],
                          capture_output=True, text=True)


def check_prepare(ck, d, hf, what):
    """prompt-completion and text through `ztrain prepare`, against the reference's ids."""
    with open(f"{d}/pc.jsonl", "w") as f:
        for x in PAIRS:
            f.write(json.dumps(x) + "\n")
    p = prepare(d, "pc", "--format", "prompt-completion", "--separator", "</s>", f"{d}/pc.jsonl")
    want = sum((hf(x["prompt"] + x["completion"])["input_ids"] + [hf.convert_tokens_to_ids("</s>")]
                for x in PAIRS), [])
    got = read_tokens(f"{d}/pc/data_train_000000") if p.returncode == 0 else p.stderr.strip()
    ck.check(got == want, f"{what}: prompt-completion {got} vs {want}")
    docs = ["Hello world", "What is the capital of France?"]
    with open(f"{d}/t.jsonl", "w") as f:
        for x in docs:
            f.write(json.dumps({"text": x}) + "\n")
    p = prepare(d, "text", f"{d}/t.jsonl")
    templated = any(hf(x)["input_ids"] != hf(x, add_special_tokens=False)["input_ids"]
                    for x in docs)
    sep = [] if templated else [hf.convert_tokens_to_ids("<|endoftext|>")]
    want = sum((sep + hf(x)["input_ids"] for x in docs), [])
    got = read_tokens(f"{d}/text/data_train_000000") if p.returncode == 0 else p.stderr.strip()
    ck.check(got == want, f"{what}: text {got} vs {want}")


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    make_tokenizer(SPECIALS).save(f"{d}/tokenizer.json")
    compared = 0
    for cls, bos, eos, tok_keys in itertools.product(
            CLASSES + [None], FLAG, ("absent", "true", "false"), ("default", "given", "null")):
        tokens = {"default": {}, "given": {"bos_token": "<|endoftext|>", "eos_token": "<eos>"},
                  "null": {"bos_token": None}}[tok_keys]
        model_type = "llama" if cls is None else None
        write_config(d, cls, bos, eos, tokens, model_type)
        what = (f"{cls or 'model_type llama'} add_bos_token {bos} add_eos_token {eos} "
                f"tokens {tok_keys}")
        hf, hf_err = hf_load(d)
        got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
        if hf is None:
            flag = "add_bos_token" if "add_bos_token" in hf_err else "add_eos_token"
            ck.check(got is None and flag in err,
                     f"{what}: transformers raises ({hf_err[:80]}); ztrain refuses naming "
                     f"{flag}: {err}")
            continue
        want = [hf(t)["input_ids"] for t in TEXTS]
        ck.check(got == want, f"{what}: ids equal AutoTokenizer's"
                 + ("" if got == want else f": {got} vs {want} ({err})"))
        compared += 1
        if cls == "LlamaTokenizerFast" and tok_keys != "null":
            check_prepare(ck, d, hf, what)
    ck.check(compared > 200, f"{compared} configurations compared id for id")

    # A class default token the tokenizer lacks: transformers adds it as a new token past the
    # vocabulary (an id the model has no row for); ztrain refuses, naming it.
    make_tokenizer([t for t in SPECIALS if t != "<bos>"]).save(f"{d}/tokenizer.json")
    write_config(d, "GemmaTokenizerFast", "absent", "absent", {})
    hf, _ = hf_load(d)
    n_vocab = Tokenizer.from_file(f"{d}/tokenizer.json").get_vocab_size()
    ck.check(hf is not None and hf("x")["input_ids"][0] == n_vocab,
             f"Gemma without <bos>: transformers adds it as id {hf and hf('x')['input_ids'][0]}")
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ck.check(got is None and "bos_token" in err and "<bos>" in err,
             f"Gemma without <bos>: ztrain refuses naming it: {err}")

    # A tokenizer.json without a post-processor gains the class's template.
    make_tokenizer(SPECIALS, template=False).save(f"{d}/tokenizer.json")
    for cls, eos in (("LlamaTokenizerFast", "true"), ("PreTrainedTokenizerFast", "true")):
        write_config(d, cls, "absent", eos, {})
        hf, _ = hf_load(d)
        got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
        want = [hf(t)["input_ids"] for t in TEXTS]
        ck.check(got == want, f"no post-processor, {cls}: {got} vs {want} ({err})")

    # add_prefix_space, which the classes apply to the pre-tokenizer and ztrain does not, is
    # refused where transformers would encode otherwise than tokenizer.json (or raise).
    make_tokenizer(SPECIALS).save(f"{d}/tokenizer.json")
    bare = Tokenizer.from_file(f"{d}/tokenizer.json")
    for cls, value in (("GPT2TokenizerFast", True), ("GPTNeoXTokenizerFast", True),
                       ("CohereTokenizerFast", True), ("LlamaTokenizerFast", False)):
        write_config(d, cls, "false", "absent", {"add_prefix_space": value})
        hf, hf_err = hf_load(d)
        differs = hf is None or any(hf(t)["input_ids"] != bare.encode(t).ids for t in TEXTS)
        got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
        ck.check(differs and got is None and "add_prefix_space" in err,
                 f"{cls} add_prefix_space {value}: transformers "
                 f"{'raises' if hf is None else 'differs' if differs else 'agrees'}; ztrain "
                 f"refuses: {err}")
    write_config(d, "GPT2TokenizerFast", "absent", "absent", {"add_prefix_space": False})
    hf, _ = hf_load(d)
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ck.check(got == [hf(t)["input_ids"] for t in TEXTS], f"GPT2 add_prefix_space false as "
             f"tokenizer.json's: {err}")

    # Classes ztrain does not know are refused by name; with no tokenizer_config.json nor
    # config.json beside it, tokenizer.json's template is followed.
    write_config(d, "BertTokenizerFast", "absent", "absent", {})
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ck.check(got is None and "BertTokenizerFast" in err, f"unknown class refused: {err}")
    write_config(d, None, "absent", "absent", {}, "t5")
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ck.check(got is None and "t5" in err and "config.json" in err,
             f"unknown model_type refused: {err}")
    os.remove(f"{d}/tokenizer_config.json")
    os.remove(f"{d}/config.json")
    make_tokenizer(SPECIALS).save(f"{d}/tokenizer.json")
    bare = Tokenizer.from_file(f"{d}/tokenizer.json")
    got, err = toktool.encode(f"{d}/tokenizer.json", TEXTS)
    ck.check(got == [bare.encode(t).ids for t in TEXTS], f"bare tokenizer.json: {got} ({err})")
ck.done()
