"""The chat templates people fine-tune now, rendered by ztrain (engine/chat/chat_template.c)
against transformers' apply_chat_template, byte for byte: Qwen2.5-Instruct's (its tools branch
uses tojson), Llama 3.1's (tojson(indent=4), reject('equalto', ...), join, items, `for a, b in`,
tests mapping and iterable) and Llama 3.2's (strftime_now), as chat_templates.py copies them
from the published tokenizer_config.json files, Mistral v0.3's (namespace(), set ns.x,
selectattr, dict.items(), string), DeepSeek-R1-Distill's (str.split), Qwen3's (messages[::-1],
loop.index0 arithmetic, reasoning split from <think>; its tools, reasoning_content and
enable_thinking are rendered in test_chat_generation), and Gemma 2's and Phi-3's.

Each renders varied conversations (with and without a system message, tool results, unicode,
quotes, braces, newlines) with and without the generation prompt; a conversation the template
rejects must be rejected with transformers' message. These conversations pass tools=None;
test_chat_tools renders the tools branches (tool_calls, tool results, the tools list) and
test_chat_template checks each construct on its own. The loss masks of these templates
are checked in test_sft_prepare."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()


from chat_templates import (DEEPSEEK_R1, GEMMA2, LLAMA31, LLAMA32, MISTRAL03, PHI3,  # noqa: E402
                            QWEN25, QWEN3, hf_tokenizer, rendered)
from ztref import Checker, tool  # noqa: E402

FAMILIES = [
    ("qwen2.5", QWEN25, None, "<|im_end|>"),
    ("qwen3", QWEN3, None, "<|im_end|>"),
    ("llama 3.1", LLAMA31, "<|begin_of_text|>", "<|eot_id|>"),
    ("llama 3.2", LLAMA32, "<|begin_of_text|>", "<|eot_id|>"),
    ("mistral v0.3", MISTRAL03, "<s>", "</s>"),
    ("gemma 2", GEMMA2, "<bos>", "<eos>"),
    ("phi-3", PHI3, "<s>", "<|endoftext|>"),
    ("deepseek r1 distill", DEEPSEEK_R1, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": " Be terse. \n"},
     {"role": "user", "content": "Braces {{ x }} and {% if %} and {# c #}, 'quotes' \"too\""},
     {"role": "assistant", "content": "  Sure:\n\n{\"a\": [1, 2]}\t\n"},
     {"role": "user", "content": "héllo — ünïcode ✓ 👍\u3000"},
     {"role": "assistant", "content": "\u2003ok\\n"}],
    [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "calling"},
     {"role": "tool", "content": "{\"temp\": 20, \"unit\": \"°C\"}"},
     {"role": "tool", "content": "second\nresult"},
     {"role": "assistant", "content": "It is 20 °C."}],
    [{"role": "system", "content": "only a system message"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "ipython", "content": "out"}, {"role": "user", "content": "then"}],
    [{"role": "system", "content": "s"}, {"role": "system", "content": "second system"},
     {"role": "user", "content": "u"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "},
     {"role": "user", "content": "c\n{x}"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
     {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nadd</think>\n\n4</think> sure"}],
]


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/convs.json", "w") as f:
        json.dump(CONVERSATIONS, f)
    for name, template, bos, eos in FAMILIES:
        cfg = {"chat_template": template, "eos_token": eos}
        if bos:
            cfg["bos_token"] = bos
        with open(f"{d}/tokenizer_config.json", "w") as f:
            json.dump(cfg, f)
        hf = hf_tokenizer(template, bos, eos)
        def jinja2_renders(gen):
            renders = []
            for conv in CONVERSATIONS:
                try:
                    renders.append((hf.apply_chat_template(conv, tokenize=False,
                                                           add_generation_prompt=gen), None))
                except Exception as e:  # the template's raise_exception
                    renders.append((None, str(e)))
            return renders

        for gen in (False, True):
            # jinja2 renders before and after ztrain: strftime_now's date (Llama 3.2) matches
            # one of the two even when the renders straddle midnight.
            before = jinja2_renders(gen)
            out = tempfile.mkdtemp(dir=d)
            args = [tool("zt_chat_render"), f"{d}/tokenizer_config.json", f"{d}/convs.json", out]
            p = subprocess.run(args + (["--generation-prompt"] if gen else []),
                               capture_output=True, text=True)
            ck.check(p.returncode == 0, f"{name}: zt_chat_render exit {p.returncode} "
                     f"{p.stderr.strip()[:300]}")
            if p.returncode != 0:
                continue
            after = jinja2_renders(gen)
            for i, conv in enumerate(CONVERSATIONS):
                want, why = after[i]
                got, err = rendered(out, i)
                if got == before[i][0]:
                    want = got
                if want is not None:
                    ck.check(got == want, f"{name}, generation prompt {gen}, conversation {i}: "
                             f"{'equal' if got == want else repr(got) + ' vs ' + repr(want)} "
                             f"{err[:200]}")
                else:
                    ck.check(got is None and why in err, f"{name}, generation prompt {gen}, "
                             f"conversation {i}: refused as transformers does ({why!r}): {err!r}")
ck.done()
