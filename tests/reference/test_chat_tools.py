"""Tool-calling chat data against transformers' apply_chat_template(messages, tools=tools,
documents=documents), byte for byte and token for token.

Renders (zt_chat_render): the tool-using templates of chat_templates.py, Qwen2.5 (tools in the
system prompt, <tool_call>/<tool_response>, consecutive tool messages merged), Llama 3.1 and 3.2
(tools in the first user message, the ipython role, one tool call per message), Mistral v0.3
([AVAILABLE_TOOLS], [TOOL_CALLS], 9-character ids, and its tool results, which always raise: the
published template reads tool_call.id where no tool_call is in scope), a Hermes-style list of
named templates ("default" and "tool_use": get_chat_template takes "tool_use" when tools are
given, an empty list included; a list without "default" fails without tools with transformers'
message) and a RAG template that reads documents. The conversations: several tool calls in one
turn, arguments as an object and as a string, unicode, integers, floats (5.0 too), booleans and
null in arguments,
a call followed by its result and a final answer, content null or absent beside tool_calls, tools
given but unused, no tools. A conversation the template refuses must be refused with its message.

Then `ztrain prepare --format chat` on JSONL lines {"messages", "tools", "documents"} with a tiny
byte-level BPE tokenizer whose tokenizer_config.json holds each template: the ids must be
apply_chat_template(tokenize=True, tools=...)'s; the trained tokens those starting inside an
assistant turn (the conversation before it rendered with the generation prompt, to the
conversation through it, every render given the tools), so a turn that only calls tools is
trained, its end-of-turn token included, and tool results are not; and the trained tokens decode
to exactly those pieces of jinja2's text. Bad shapes are refused naming FILE:LINE and the field."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from chat_templates import LLAMA31, LLAMA32, MISTRAL03, QWEN25, hf_tokenizer, rendered  # noqa: E402
from ztref import Checker, read_masked_shard, tool  # noqa: E402

# A Hermes-2-Pro-style pair of named templates (the published one needs macros, which the subset
# does not have): ChatML without tools, and the tools in the system prompt with <tool_call> and
# <tool_response> when tools are given.
HERMES_DEFAULT = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
                  "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
HERMES_TOOL_USE = r"""{{- bos_token }}
{{- '<|im_start|>system\nYou are a function calling AI model. You are provided with function signatures within <tools></tools> XML tags. Here are the available tools: <tools> ' }}
{%- for tool in tools %}
    {%- if tool.function is defined %}{% set tool = tool.function %}{% endif %}
    {{- '{"type": "function", "function": ' + tool | tojson + '}' }}
    {%- if not loop.last %}{{- ' ' }}{% endif %}
{%- endfor %}
{{- ' </tools>\nFor each function call return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>\n' }}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" or (message.role == "assistant" and message.tool_calls is not defined) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content is not none and message.content is defined %}{{- '\n' + message.content }}{% endif %}
        {%- for tool_call in message.tool_calls %}
            {{- '\n<tool_call>\n' }}
            {%- if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}
            {{- '{' }}
            {{- '"arguments": ' }}
            {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{% else %}{{- tool_call.arguments | tojson }}{% endif %}
            {{- ', "name": "' + tool_call.name + '"}' }}
            {{- '\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}{{- '<|im_start|>tool\n' }}{% endif %}
        {{- '<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}{{- '<|im_end|>' }}{% elif loop.last %}{{- '<|im_end|>' }}{% endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{% endif %}"""
HERMES = [{"name": "default", "template": HERMES_DEFAULT},
          {"name": "tool_use", "template": HERMES_TOOL_USE}]
HERMES_NO_DEFAULT = [{"name": "tool_use", "template": HERMES_TOOL_USE},
                     {"name": "rag", "template": HERMES_DEFAULT}]
# A Command-R-style use of documents (RAG): each document's keys and values in the system turn.
RAG = r"""{{- bos_token }}
{%- if documents is not none %}
    {{- '<|im_start|>system\n<documents>' }}
    {%- for doc in documents %}
        {{- '\nDocument: ' ~ loop.index0 }}
        {%- for key, value in doc | items %}{{- '\n' + key + ': ' + value | string }}{% endfor %}
    {%- endfor %}
    {{- '\n</documents><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone — ünïcode ✓",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                   "required": ["tz"]}}}
TOOLS = [WEATHER, TIME]


def call(name, args, id_="call12345"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


# (name, messages, tools, documents); ids are 9 characters, as Mistral requires
CONVS = [
    ("call, result, answer",
     [{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"})]},
      {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
       "content": "{\"temp\": 20, \"unit\": \"°C\"}"},
      {"role": "assistant", "content": "It is 20 °C in Paris."}], TOOLS, None),
    ("two calls in one turn, content null, merged results",
     [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather and time in Tokyo?"},
      {"role": "assistant", "content": None, "tool_calls": [
          call("get_weather", {"city": "Tokyo", "days": 3, "metric": True, "note": None},
               "abcdefghi"),
          call("get_time", {"tz": "Asia/Tokyo"}, "ABCDEFGHI")]},
      {"role": "tool", "tool_call_id": "abcdefghi", "content": "sunny"},
      {"role": "tool", "tool_call_id": "ABCDEFGHI", "content": "09:00"},
      {"role": "assistant", "content": "Sunny, and it is 9 am."}], TOOLS, None),
    ("arguments as a string",
     [{"role": "user", "content": "Weather in Rome?"},
      {"role": "assistant", "content": None,
       "tool_calls": [call("get_weather", "{\"city\": \"Rome\"}")]}], TOOLS, None),
    ("unicode arguments, content beside the call",
     [{"role": "user", "content": "Météo à São Paulo ?"},
      {"role": "assistant", "content": "Je regarde.",
       "tool_calls": [call("get_weather", {"city": "São Paulo ✓ 東京 👍", "q": "\"quoted\"\n"})]}],
     TOOLS, None),
    ("float arguments (21.0 stays a float, as json.loads reads it)",
     [{"role": "user", "content": "Weather at 48.8566, 2.3522?"},
      {"role": "assistant", "tool_calls": [call("get_weather", {
          "lat": 48.8566, "lon": 2.3522, "min_temp": 21.0, "eps": 1e-05, "big": 1e+16,
          "list": [0.1, -0.0, 3, 2.5e-300]})]}], TOOLS, None),
    ("tools given, unused",
     [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi there."}],
     TOOLS, None),
    ("no tools",
     [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4"}], None, None),
    ("tools as an empty list",
     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}], [], None),
    ("a call without tools",
     [{"role": "user", "content": "Time in UTC?"},
      {"role": "assistant", "tool_calls": [call("get_time", {"tz": "UTC"})]}], None, None),
    ("a bare tool call (no function wrapper), ipython result",
     [{"role": "user", "content": "Time?"},
      {"role": "assistant", "tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"},
                                            "id": "xyz123456"}]},
      {"role": "ipython", "content": "12:00"},
      {"role": "assistant", "content": "Noon."}], [TIME], None),
    ("an ipython result",
     [{"role": "user", "content": "Time?"},
      {"role": "assistant", "tool_calls": [call("get_time", {"tz": "UTC"})]},
      {"role": "ipython", "content": "12:00"},
      {"role": "assistant", "content": "Noon."}], [TIME], None),
    ("a short tool call id",
     [{"role": "user", "content": "Time?"},
      {"role": "assistant", "tool_calls": [call("get_time", {"tz": "UTC"}, "short")]}],
     TOOLS, None),
    ("documents",
     [{"role": "user", "content": "What does the report say?"},
      {"role": "assistant", "content": "Sales rose."}], None,
     [{"title": "Report", "text": "Sales rose 5% — «bien»."}, {"title": "Memo", "text": "x\ny"}]),
]

# How the messages' JSON reads in jinja2: null, absent, nested objects, numbers, booleans, and
# tojson of arguments given as an object or as a string.
PROBE = r"""{%- for m in messages %}
{{- m.role }}: content defined {{ m.content is defined }} none {{ m.content is none }} string {{ m.content is string }}
{%- if m.tool_calls is defined and m.tool_calls is not none %} calls {{ m.tool_calls | length }} mapping {{ m.tool_calls[0] is mapping }}
{%- for c in m.tool_calls %} [{{ c.id }} {{ c.function.name }} args-mapping {{ c.function.arguments is mapping }} {{ c.function.arguments | tojson }} {{ c | tojson(sort_keys=true) }}
{%- if c.function.arguments is mapping %}{% for k, v in c.function.arguments | items %} {{ k }}={% if v is string or v is not iterable %}{{ v }}{% else %}{{ v | tojson }}{% endif %}:{{ v is number }}{{ v is none }}{{ v is boolean }}{{ v is integer }}{% endfor %}{% endif %}]{% endfor %}
{%- endif %}
{%- for k in m %} {{ k }}{% endfor %} {{ m.get('name', '-') }} {{ m.tool_call_id is defined }}
{% endfor %}
{%- if tools is not none %}tools {{ tools | length }} {{ tools | map(attribute='function') | map(attribute='name') | join(',') }} {{ tools[0].function.parameters.required | tojson }}{% else %}no tools{% endif %}
{%- if documents is not none %} docs {{ documents | tojson }}{% endif %}"""
PLAIN = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi there."}]

FAMILIES = [
    # name, chat_template (string or named list), hf template, bos, eos
    ("qwen2.5", QWEN25, QWEN25, None, "<|im_end|>"),
    ("llama 3.1", LLAMA31, LLAMA31, "<|begin_of_text|>", "<|eot_id|>"),
    ("llama 3.2", LLAMA32, LLAMA32, "<|begin_of_text|>", "<|eot_id|>"),
    ("mistral v0.3", MISTRAL03, MISTRAL03, "<s>", "</s>"),
    ("hermes tool_use", HERMES, {x["name"]: x["template"] for x in HERMES}, "<s>", "<|im_end|>"),
    ("named, no default", HERMES_NO_DEFAULT,
     {x["name"]: x["template"] for x in HERMES_NO_DEFAULT}, "<s>", "<|im_end|>"),
    ("rag", RAG, RAG, "<s>", "<|im_end|>"),
    ("probe", PROBE, PROBE, None, "</s>"),
]


def hf_render(hf, msgs, tools, docs, gen, tokenize=False):
    try:
        return hf.apply_chat_template(msgs, tools=tools, documents=docs, tokenize=tokenize,
                                      add_generation_prompt=gen), None
    except Exception as e:  # the template's raise_exception, or get_chat_template's error
        return None, str(e)


def write_tokenizer_config(d, template, bos, eos):
    cfg = {"chat_template": template, "eos_token": eos}
    if bos:
        cfg["bos_token"] = bos
    with open(f"{d}/tokenizer_config.json", "w") as f:
        json.dump(cfg, f)


ck = Checker()
d = tempfile.mkdtemp()
with open(f"{d}/convs.json", "w") as f:
    json.dump([{"messages": m, "tools": t, "documents": docs} for _, m, t, docs in CONVS], f)
refusals = {}
for fam, cfg_template, hf_template, bos, eos in FAMILIES:
    write_tokenizer_config(d, cfg_template, bos, eos)
    hf = hf_tokenizer(hf_template, bos, eos)
    for gen in (False, True):
        out = tempfile.mkdtemp(dir=d)
        args = [tool("zt_chat_render"), f"{d}/tokenizer_config.json", f"{d}/convs.json", out]
        p = subprocess.run(args + (["--generation-prompt"] if gen else []), capture_output=True,
                           text=True)
        ck.check(p.returncode == 0, f"{fam}: zt_chat_render exit {p.returncode} "
                 f"{p.stderr.strip()[:300]}")
        if p.returncode != 0:
            continue
        for i, (name, msgs, tools, docs) in enumerate(CONVS):
            want, why = hf_render(hf, msgs, tools, docs, gen)
            got, err = rendered(out, i)
            if want is not None:
                ck.check(got == want, f"{fam}, generation prompt {gen}, {name}: "
                         f"{'equal' if got == want else repr(got) + ' vs ' + repr(want)} "
                         f"{err[:300]}")
            else:
                refusals[(fam, name)] = why
                ck.check(got is None and why in err, f"{fam}, generation prompt {gen}, {name}: "
                         f"refused as transformers does ({why!r}): {err[:300]!r}")
# The cases the brief names are among those checked: make sure they were refused by the
# reference, so the checks above covered the refusal and not a render.
for fam, name, words in (("llama 3.1", "two calls in one turn, content null, merged results",
                          "single tool-calls"),
                         ("mistral v0.3", "a short tool call id", "length 9"),
                         # a tool result reads tool_call.id with no tool_call in scope
                         ("mistral v0.3", "call, result, answer", "'tool_call' is undefined"),
                         ("named, no default", "no tools", "no default specified")):
    ck.check(words in refusals.get((fam, name), ""), f"{fam}, {name}: transformers refuses it "
             f"({refusals.get((fam, name))!r})")


# ---- ztrain prepare --format chat ------------------------------------------------------------

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|begin_of_text|>",
            "<|eot_id|>", "<|eom_id|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|python_tag|>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]


def bpe_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [json.dumps(m, ensure_ascii=False) for _, m, _, _ in CONVS] * 10 + \
        [json.dumps(TOOLS)] * 10 + ["You are a helpful assistant. The weather in Paris."] * 10
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def turn_spans(hf, msgs, tools, docs):
    """The assistant turns' character spans by the rule, every render given tools/documents."""
    spans = []
    for k, m in enumerate(msgs):
        if m["role"] == "assistant":
            a = len(hf.apply_chat_template(msgs[:k], tools=tools, documents=docs, tokenize=False,
                                           add_generation_prompt=True))
            b = len(hf.apply_chat_template(msgs[:k + 1], tools=tools, documents=docs,
                                           tokenize=False))
            spans.append((a, b))
    return spans


tok = bpe_tokenizer()
tok.save(f"{d}/tokenizer.json")
PREP_FAMILIES = [f for f in FAMILIES if f[0] in ("qwen2.5", "llama 3.1", "mistral v0.3",
                                                 "hermes tool_use", "rag")]
for fam, cfg_template, hf_template, bos, eos in PREP_FAMILIES:
    write_tokenizer_config(d, cfg_template, bos, eos)
    hf = hf_tokenizer(hf_template, bos, eos, f"{d}/tokenizer.json")
    # the conversations the template renders (the others are refused, below) and whose turns
    # the rule locates: Mistral's system message joins only the last user message, so a
    # conversation before an assistant turn is not the start of the whole (refused, below)
    def locatable(msgs, tools, docs):
        full = hf.apply_chat_template(msgs, tools=tools, documents=docs, tokenize=False)
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                a = hf.apply_chat_template(msgs[:k], tools=tools, documents=docs,
                                           tokenize=False, add_generation_prompt=True)
                b = hf.apply_chat_template(msgs[:k + 1], tools=tools, documents=docs,
                                           tokenize=False)
                if not (full.startswith(b) and b.startswith(a)):
                    return False
        return True
    renders = [c for c in CONVS if hf_render(hf, c[1], c[2], c[3], False)[0] is not None]
    convs = [c for c in renders if locatable(*c[1:])]
    unlocatable = [c for c in renders if c not in convs]
    ck.check(len(unlocatable) <= 1, f"{fam}: {len(unlocatable)} conversations the rule cannot "
             "locate")
    with open(f"{d}/chat.jsonl", "w") as f:
        for _, msgs, tools, docs in convs:
            line = {"messages": msgs}
            if tools is not None:
                line["tools"] = tools
            if docs is not None:
                line["documents"] = docs
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                        "--out", f"{d}/out_{len(fam)}", "--overwrite", "--format", "chat",
                        f"{d}/chat.jsonl"], capture_output=True, text=True)
    ck.check(p.returncode == 0, f"{fam} prepare ({len(convs)} conversations): exit "
             f"{p.returncode} {p.stderr[-300:]}")
    if p.returncode != 0:
        continue
    ids, mask = read_masked_shard(f"{d}/out_{len(fam)}/data_train_000000")
    at = 0
    for name, msgs, tools, docs in convs:
        text = hf.apply_chat_template(msgs, tools=tools, documents=docs, tokenize=False)
        want = hf.apply_chat_template(msgs, tools=tools, documents=docs, tokenize=True)
        enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        ck.check(want == enc["input_ids"], f"{fam}, {name}: apply_chat_template's ids are the "
                 "rendered text's")
        got = ids[at:at + len(want)]
        got_mask = [bool(b & 1) for b in mask[at:at + len(want)]]
        at += len(want)
        ck.check(got == want, f"{fam}, {name}: {len(got)} ids equal apply_chat_template's "
                 f"{len(want)}" + ("" if got == want else f": {got[:30]} vs {want[:30]}"))
        spans = turn_spans(hf, msgs, tools, docs)
        want_mask = [any(a <= s < b for a, b in spans) and e > s
                     for s, e in enc["offset_mapping"]]
        # the first token of an example is never a target
        ck.check(got_mask[1:] == want_mask[1:], f"{fam}, {name}: trained tokens "
                 f"{sum(got_mask[1:])}, by the rule {sum(want_mask[1:])}")
        # independently of offsets: the trained tokens, run by run, decode to the turns' text
        runs, cur = [], []
        for i, m in zip(want, got_mask):
            if m:
                cur.append(i)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        pieces = [text[a:b] for a, b in spans if b > a]
        decoded = [hf.decode(r) for r in runs]
        ck.check(decoded == pieces, f"{fam}, {name}: the trained tokens decode to the assistant "
                 f"turns {pieces!r}: {decoded!r}")
        calls_only = [m for m in msgs if m["role"] == "assistant" and not m.get("content")]
        if calls_only and fam != "rag":
            ck.check(any(eos in p or "[TOOL_CALLS]" in p for p in pieces), f"{fam}, {name}: "
                     f"the turn that only calls tools is trained, its end included: {pieces!r}")
    ck.check(at == len(ids), f"{fam}: {len(ids)} tokens in all, {at} expected")

    # refused conversations fail naming the line and the template's message
    for name, msgs, tools, docs in CONVS:
        if (name, msgs, tools, docs) in unlocatable:
            with open(f"{d}/refused.jsonl", "w") as f:
                f.write(json.dumps({"messages": msgs, "tools": tools, "documents": docs}) + "\n")
            p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                                "--out", f"{d}/refused", "--format", "chat", f"{d}/refused.jsonl"],
                               capture_output=True, text=True)
            ck.check(p.returncode != 0 and "refused.jsonl:1" in p.stderr and
                     "cannot be located" in p.stderr, f"{fam}, {name}: refused as the rule "
                     f"cannot locate its turn: exit {p.returncode} {p.stderr.strip()[-300:]}")
        if (fam, name) in refusals:
            with open(f"{d}/refused.jsonl", "w") as f:
                f.write(json.dumps({"messages": PLAIN}) + "\n")
                f.write(json.dumps({"messages": msgs, "tools": tools, "documents": docs}) + "\n")
            p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                                "--out", f"{d}/refused", "--format", "chat", f"{d}/refused.jsonl"],
                               capture_output=True, text=True)
            ck.check(p.returncode != 0 and "refused.jsonl:2" in p.stderr and
                     refusals[(fam, name)] in p.stderr and
                     not os.path.exists(f"{d}/refused/data_train_000000.bin"),
                     f"{fam}, {name}: refused by line with the template's message: "
                     f"exit {p.returncode} {p.stderr.strip()[-300:]}")

# bad shapes, refused naming the file, line and field
with open(f"{d}/tokenizer_config.json", "w") as f:
    json.dump({"chat_template": QWEN25, "eos_token": "<|im_end|>"}, f)
GOOD = CONVS[0][1]
BAD = [
    ({"messages": GOOD, "tools": {"type": "function"}}, ['"tools" is an object', "list"]),
    ({"messages": GOOD, "tools": ["get_weather"]}, ['"tools"[0] is a string']),
    ({"messages": GOOD, "documents": "text"}, ['"documents" is a string']),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "tool_calls": {"name": "f"}}]},
     ['message 1', '"tool_calls" is an object, not a list']),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "tool_calls": ["f"]}]},
     ['message 1', '"tool_calls"[0] is a string']),
    ({"messages": [{"role": "user", "content": 5}]}, ['message 0', '"content" is a number']),
    ({"messages": [{"role": "user"}]}, ['message 0', '"content" is missing']),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]},
     ['message 1', '"content" is null', 'tool_calls']),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "content": ["part"], "tool_calls": [call("f", {})]}]},
     ['message 1', '"content"[0] is a string, not a part object']),
    ({"messages": [{"role": 1, "content": "a"}]}, ['message 0', '"role" is a number']),
    ({"messages": [{"content": "a"}]}, ['message 0', '"role" is missing']),
    ({"messages": ["hello"]}, ['"messages"[0] is a string']),
]
for line, words in BAD:
    with open(f"{d}/bad.jsonl", "w") as f:
        f.write(json.dumps({"messages": GOOD, "tools": TOOLS}) + "\n" + json.dumps(line) + "\n")
    p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json",
                        "--out", f"{d}/bad", "--format", "chat", f"{d}/bad.jsonl"],
                       capture_output=True, text=True)
    ck.check(p.returncode != 0 and "bad.jsonl:2" in p.stderr and all(w in p.stderr for w in words)
             and not os.path.exists(f"{d}/bad/data_train_000000.bin"),
             f"refused {json.dumps(line)[:80]} naming {words}: exit {p.returncode} "
             f"{p.stderr.strip()[-300:]}")
ck.done()
