"""The variables a chat template sees (engine/chat/chat_template.c) against transformers 4.46's
apply_chat_template, byte for byte, with the tokenizer loaded by from_pretrained from the same
directory: tools=None and documents=None, and every special token of tokenizer_config.json as
its special_tokens_map gives it (strings and AddedToken objects as text; a missing, null or
empty token undefined; additional_special_tokens as a list).

The templates test `tools is not none`, `tools is defined`, `documents`, `{{ pad_token }}`,
`{{ unk_token }}` and the rest, the guards tool-aware templates (Llama 3.1, Mistral v3) use. Then
`ztrain prepare --format chat` with the `tools` template of the report gives
apply_chat_template(tokenize=True)'s ids."""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from ztref import Checker, tool  # noqa: E402


def added(content):
    """An AddedToken as save_pretrained writes it into tokenizer_config.json."""
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False, "special": True}


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>", "<unk>", "<sep>", "<cls>",
            "<mask>", "<a1>", "<a2>"]
CONFIGS = {
    "strings": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<pad>",
                "unk_token": "<unk>", "sep_token": "<sep>", "cls_token": "<cls>",
                "mask_token": "<mask>", "additional_special_tokens": ["<a1>", "<a2>"]},
    "AddedToken objects": {"bos_token": added("<|endoftext|>"), "eos_token": added("<|im_end|>"),
                           "pad_token": added("<pad>"), "unk_token": added("<unk>"),
                           "mask_token": added("<mask>"),
                           "additional_special_tokens": [added("<a1>"), "<a2>"]},
    "null, empty and missing tokens": {"eos_token": "<|im_end|>", "pad_token": None,
                                       "unk_token": "", "additional_special_tokens": []},
}
NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
         "mask_token", "additional_special_tokens", "tools", "documents"]
TEMPLATES = {
    "tools is not none": "{% if tools is not none %}TOOLS{% endif %}{% if documents is not none %}"
                         "DOCS{% endif %}{% if tools %}T{% endif %}{{ tools is none }}"
                         "{{ documents is none }}.",
    "tools is defined": "{% if tools is defined %}T{% endif %}{% if documents is defined %}D"
                        "{% endif %}{{ tools }}|{{ documents }}|{{ tools == none }}",
    "pad_token and unk_token": "{{ pad_token }}{{ unk_token }}{% for m in messages %}"
                               "{{ m.content }}{{ eos_token }}{% endfor %}",
    "every special token": "".join("{{ '%s:' ~ (%s is defined) }};" % (n, n) for n in NAMES) +
                           "{{ bos_token }}{{ eos_token }}{{ unk_token }}{{ sep_token }}"
                           "{{ pad_token }}{{ cls_token }}{{ mask_token }}"
                           "{{ additional_special_tokens|length }}"
                           "{% for t in additional_special_tokens %}{{ t }}{% endfor %}"
                           "{{ '<a2>' in additional_special_tokens }}",
    "the report's tools template": "{% if tools is not none %}{{ '<|im_start|>system\\nTools are "
                                   "available.<|im_end|>\\n' }}{% endif %}{{ pad_token }}"
                                   "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n'"
                                   " + m['content'] + '<|im_end|>\\n' }}{% endfor %}",
}
CONVS = [[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}],
         [{"role": "system", "content": "s"}, {"role": "user", "content": "what is the weather"},
          {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "hello"}]]

ck = Checker()
with tempfile.TemporaryDirectory() as d:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world", "what is the weather sunny"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{d}/tokenizer.json")
    with open(f"{d}/convs.json", "w") as f:
        json.dump(CONVS, f)
    for cname, cfg in CONFIGS.items():
        for tname, template in TEMPLATES.items():
            with open(f"{d}/tokenizer_config.json", "w") as f:
                json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
                           **cfg}, f)
            hf = PreTrainedTokenizerFast.from_pretrained(d)
            for gen in (False, True):
                out = tempfile.mkdtemp(dir=d)
                p = subprocess.run([tool("zt_chat_render"), f"{d}/tokenizer_config.json",
                                    f"{d}/convs.json", out] + (["--generation-prompt"] if gen else []),
                                   capture_output=True, text=True)
                for i, conv in enumerate(CONVS):
                    want = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
                    path = f"{out}/{i}.txt"
                    got = open(path, encoding="utf-8").read() if os.path.exists(path) else None
                    why = p.stderr.strip() or (open(f"{out}/{i}.err").read()
                                               if os.path.exists(f"{out}/{i}.err") else "")
                    ck.check(got == want, f"{cname}, {tname}, generation prompt {gen}, "
                             f"conversation {i}: " + ("equal" if got == want else
                                                      f"{got!r} vs {want!r} {why[:200]}"))

    # A special token that is neither text nor an AddedToken is refused by name, as
    # transformers refuses it.
    with open(f"{d}/tokenizer_config.json", "w") as f:
        json.dump({"chat_template": "{{ pad_token }}", "pad_token": 7}, f)
    p = subprocess.run([tool("zt_chat_render"), f"{d}/tokenizer_config.json", f"{d}/convs.json",
                        d], capture_output=True, text=True)
    ck.check(p.returncode == 1 and "'pad_token'" in p.stderr,
             f"a number as pad_token: exit {p.returncode}, {p.stderr.strip()[:200]}")

    # ztrain prepare --format chat writes apply_chat_template(tokenize=True)'s ids.
    with open(f"{d}/tokenizer_config.json", "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>",
                   "chat_template": TEMPLATES["the report's tools template"]}, f)
    with open(f"{d}/chats.jsonl", "w") as f:
        for conv in CONVS:
            f.write(json.dumps({"messages": conv}) + "\n")
    p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json", "--out",
                        f"{d}/data", "--format", "chat", f"{d}/chats.jsonl"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 0, f"prepare --format chat: exit {p.returncode} {p.stderr[-300:]}")
    shards = sorted(n for n in os.listdir(f"{d}/data") if n.endswith(".bin")) \
        if os.path.isdir(f"{d}/data") else []
    got = []
    for n in shards:
        if "train" in n:
            with open(f"{d}/data/{n}", "rb") as f:
                head = struct.unpack("<256i", f.read(1024))
                got += list(struct.unpack(f"<{head[2]}H", f.read(2 * head[2])))
    hf = PreTrainedTokenizerFast.from_pretrained(d)
    want = [t for conv in CONVS for t in hf.apply_chat_template(conv, tokenize=True)]
    ck.check(got == want,
             f"prepare's tokens are apply_chat_template's: {len(got)} vs {len(want)} tokens")

ck.done()
