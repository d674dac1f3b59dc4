"""Chat templates rendered by ztrain (engine/data/chat_template.c) against transformers'
tokenizer.apply_chat_template, byte for byte.

The templates are the published ones of Llama 3 (Meta-Llama-3-8B-Instruct), Llama 2
(Llama-2-7b-chat-hf), Mistral (Mistral-7B-Instruct-v0.2) and Qwen2 (Qwen2-7B-Instruct), copied
from their tokenizer_config.json files, plus Zephyr's multi-line one, which exercises jinja2's
trim_blocks and lstrip_blocks as transformers sets them. Each renders a set of conversations
(system prompts, several turns, whitespace that trim and strip remove, escapes), with and without
the generation prompt; a conversation the template rejects with raise_exception must be rejected
by ztrain with the same message. Templates using what the subset lacks are refused by name."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tokenizers import Tokenizer, models  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from chat_templates import LLAMA2, LLAMA3, MISTRAL, QWEN2, ZEPHYR  # noqa: E402
from ztref import Checker, tool  # noqa: E402

FAMILIES = [
    ("llama 3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    ("llama 2", LLAMA2, "<s>", "</s>"),
    ("mistral", MISTRAL, "<s>", "</s>"),
    ("qwen2", QWEN2, None, "<|im_end|>"),
    ("zephyr (multi-line, trim_blocks/lstrip_blocks)", ZEPHYR, "<s>", "</s>"),
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "  Name a colour.\n"},
     {"role": "assistant", "content": " Blue. \n"},
     {"role": "user", "content": "Another, with 'quotes' and \"doubles\" and \\ backslash"},
     {"role": "assistant", "content": "Red\n\nand green."}],
    [{"role": "user", "content": "héllo — ünïcode ✓"}, {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],  # not alternating
    [{"role": "system", "content": "sys only"}, {"role": "user", "content": "hi"}],
]


def hf_tokenizer(template, bos, eos):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    kw = {"tokenizer_object": tok, "chat_template": template, "eos_token": eos}
    if bos:
        kw["bos_token"] = bos
    return PreTrainedTokenizerFast(**kw)


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/convs.json", "w") as f:
        json.dump(CONVERSATIONS, f)
    for name, template, bos, eos in FAMILIES:
        cfg = {"chat_template": template, "eos_token": {"content": eos, "special": True}}
        if bos:
            cfg["bos_token"] = bos
        with open(f"{d}/tokenizer_config.json", "w") as f:
            json.dump(cfg, f)
        hf = hf_tokenizer(template, bos, eos)
        for gen in (False, True):
            out = tempfile.mkdtemp(dir=d)
            args = [tool("zt_chat_render"), f"{d}/tokenizer_config.json", f"{d}/convs.json", out]
            p = subprocess.run(args + (["--generation-prompt"] if gen else []),
                               capture_output=True, text=True)
            ck.check(p.returncode == 0, f"{name}: zt_chat_render exit {p.returncode} "
                     f"{p.stderr.strip()[:300]}")
            if p.returncode != 0:
                continue
            for i, conv in enumerate(CONVERSATIONS):
                try:
                    want, why = hf.apply_chat_template(conv, tokenize=False,
                                                       add_generation_prompt=gen), None
                except Exception as e:  # the template's raise_exception
                    want, why = None, str(e)
                got = open(f"{out}/{i}.txt", encoding="utf-8").read() \
                    if os.path.exists(f"{out}/{i}.txt") else None
                err = open(f"{out}/{i}.err").read() if os.path.exists(f"{out}/{i}.err") else ""
                if want is not None:
                    ck.check(got == want, f"{name}, generation prompt {gen}, conversation {i}: "
                             f"{'equal' if got == want else repr(got) + ' vs ' + repr(want)} "
                             f"{err[:200]}")
                else:
                    ck.check(got is None and why in err, f"{name}, generation prompt {gen}, "
                             f"conversation {i}: refused as transformers does ({why!r}): {err!r}")

    # What the subset does not implement is refused when the template is read, by name.
    for what, template, key in [
            ("a macro", "{% macro f() %}x{% endmacro %}{{ f() }}", "'macro'"),
            ("an unknown filter", "{{ messages[0]['content'] | tojson }}", "'tojson'"),
            ("inline if", "{{ 'a' if add_generation_prompt else 'b' }}", "inline 'if"),
            ("a method", "{{ messages[0]['content'].upper() }}", "'upper'"),
            ("an untaken branch", "{% if false %}{{ x | wordcount }}{% endif %}", "'wordcount'"),
            ("an unclosed block", "{% for m in messages %}x", "never closed")]:
        with open(f"{d}/tokenizer_config.json", "w") as f:
            json.dump({"chat_template": template}, f)
        p = subprocess.run([tool("zt_chat_render"), f"{d}/tokenizer_config.json",
                            f"{d}/convs.json", d], capture_output=True, text=True)
        ck.check(p.returncode == 1 and key in p.stderr and "tokenizer_config.json" in p.stderr,
                 f"{what}: exit {p.returncode}, {p.stderr.strip()[:200]}")
ck.done()
