"""{% generation %} blocks and chat_template_kwargs against transformers 4.46.

  - spans: zt_chat_render's generation spans (bytes, made characters here) equal the character
    spans transformers' AssistantTracker records (_render_with_assistant_indices, what
    apply_chat_template(return_assistant_tokens_mask=True) maps to tokens), renders byte for
    byte, over QWEN3_GEN (Qwen3's published template with generation blocks), CHATML_GEN and
    constructs on their own: a block before any output (not recorded), an empty block, a block's
    own scope, whitespace control; nested and unclosed blocks, a stray endgeneration and a break
    out of a block are refused naming the offset; a tokenizer whose ByteLevel post-processor
    trims offsets (transformers then maps a block that starts on a space to no token) is
    refused with such templates;
  - masks: `ztrain prepare --format chat` with those templates gives apply_chat_template(...,
    tokenize=True, return_dict=True, return_assistant_tokens_mask=True)'s input_ids and
    assistant_masks for multi-turn conversations, reasoning in <think> and in
    reasoning_content, tool calls and tool results: no prefix rule, so Qwen3's conversations with
    several assistant turns (which the published template, without blocks, renders differently
    as they grow, and prepare refuses) are prepared, as are Mistral v0.3's with a system
    message (MISTRAL03_GEN; the published one moves it into the last user turn);
  - kwargs: Qwen3's published template with enable_thinking false and true, Llama 3.1's with
    builtin_tools (its <|python_tag|> calls), tools_in_user_message and date_string, rendered with
    apply_chat_template's extra keyword arguments byte for byte; the keys apply_chat_template
    takes itself are refused by name; prepare's per-line "chat_template_kwargs" (an object,
    null or absent) gives the ids of apply_chat_template(messages, **kwargs) and its masks;
    anything else is refused naming the line;
  - Qwen3's published template renders as transformers does (conversations with tools, tool
    calls, reasoning, system messages, with and without the generation prompt)."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402,E501
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.utils.chat_template_utils import (_compile_jinja_template,  # noqa: E402
                                                    _render_with_assistant_indices)

from chat_templates import (CHATML_GEN, LLAMA31, MISTRAL03, MISTRAL03_GEN, QWEN3,  # noqa: E402
                            QWEN3_GEN, hf_tokenizer)
from ztref import Checker, prepare_chat, read_masked_shard, tool  # noqa: E402

ck = Checker()
WORK = tempfile.mkdtemp()

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "What is the capital of France?",
          "Paris is the capital of France.", "Let me think about the weather in Paris.",
          "héllo wörld — ünïcode ✓", "You are a helpful assistant.", "get_weather city",
          '{"name": "get_weather", "arguments": {"city": "Paris"}}', "1 + 2 = 3",
          "a\n\n\nb\n\n\n"] * 20
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>", "<tool_response>", "</tool_response>", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
           "<|python_tag|>"]


def tokenizer_file(d):
    """A Qwen2-style byte-level BPE with Qwen3's and Llama 3's added tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{d}/tokenizer.json")
    return f"{d}/tokenizer.json"


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}

CONVS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "Paris is the capital of France."}]},
    # several assistant turns, reasoning inside the content and beside it
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 1 + 2?"},
                  {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\n3"},
                  {"role": "user", "content": "And héllo?"},
                  {"role": "assistant", "content": "wörld ✓",
                   "reasoning_content": "\nünïcode\n"}]},
    # tool calls and their results, with the tools list
    {"messages": [{"role": "user", "content": "The weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [CALL]},
                  {"role": "tool", "content": '{"temp": 20}'},
                  {"role": "assistant", "content": "It is 20 °C in Paris.",
                   "reasoning_content": "The tool said 20."},
                  {"role": "user", "content": "Thanks"},
                  {"role": "assistant", "content": "<think>ok</think>You are welcome.",
                   "tool_calls": [CALL, CALL]}],
     "tools": TOOLS},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""},
                  {"role": "user", "content": "b"}, {"role": "assistant", "content": " c\n"}]},
]


def render_spans(template, convs, gen=False, cfg=None):
    """zt_chat_render's (text, spans as character pairs, error) per conversation, and its
    exit status and stderr."""
    d = tempfile.mkdtemp(dir=WORK)
    json.dump({"chat_template": template, "eos_token": "<|im_end|>", **(cfg or {})},
              open(f"{d}/tokenizer_config.json", "w"))
    json.dump(convs, open(f"{d}/convs.json", "w"))
    p = subprocess.run([tool("zt_chat_render"), f"{d}/tokenizer_config.json", f"{d}/convs.json",
                        d] + (["--generation-prompt"] if gen else []),
                       capture_output=True, text=True)
    out = []
    for i in range(len(convs)):
        text = open(f"{d}/{i}.txt", encoding="utf-8").read() \
            if os.path.exists(f"{d}/{i}.txt") else None
        err = open(f"{d}/{i}.err").read() if os.path.exists(f"{d}/{i}.err") else ""
        spans = None
        if os.path.exists(f"{d}/{i}.spans") and text is not None:
            raw = text.encode()
            spans = [(len(raw[:a].decode()), len(raw[:b].decode()))
                     for a, b in json.load(open(f"{d}/{i}.spans"))]
        out.append((text, spans, err))
    return p.returncode, p.stderr, out


def hf_spans(template, conv, gen=False, **kw):
    c = _compile_jinja_template(template)
    return _render_with_assistant_indices(
        c, messages=conv["messages"], tools=conv.get("tools"), documents=None,
        add_generation_prompt=gen, eos_token="<|im_end|>", **kw)


# ---- spans --------------------------------------------------------------------------------

CONSTRUCTS = [
    # the first block is reached before any output: transformers records no span for it
    "{% generation %}a{% endgeneration %}b{% generation %}c{% endgeneration %}",
    # an output that prints nothing makes the tracker active; a branch not taken does not
    "{{ '' }}{% generation %}a{% endgeneration %}{% if false %}x{% endif %}",
    "{% if false %}x{% endif %}{% set y = 1 %}{% generation %}a{% endgeneration %}",
    # an empty block is recorded, and makes the tracker active
    "x{% generation %}{% endgeneration %}b{% generation %}c{% endgeneration %}",
    # a variable set in a block ends with it; a namespace's attribute does not
    "{% set x = 1 %}{% set ns = namespace(n=0) %}{% for m in messages %}{% generation %}"
    "{% set x = 2 %}{% set ns.n = ns.n + 1 %}{{ m.content }}{{ x }}{% endgeneration %}{{ x }}"
    "{{ ns.n }}{% endfor %}",
    # whitespace control around the tags, a loop inside a block with its own break
    "s {%- generation -%}  a  {%- endgeneration %} \n b{% generation %}{% for m in messages %}"
    "{{ m.role }}{% if loop.index == 2 %}{% break %}{% endif %}{% endfor %}{% endgeneration %}",
]
for name, template in [("qwen3+generation", QWEN3_GEN), ("chatml+generation", CHATML_GEN)] + \
        [(f"construct {i}", t) for i, t in enumerate(CONSTRUCTS)]:
    for gen in (False, True):
        rc, err, got = render_spans(template, CONVS, gen)
        if not ck.check(rc == 0, f"{name}: zt_chat_render exit {rc} {err.strip()[:300]}"):
            continue
        for i, conv in enumerate(CONVS):
            text, spans = hf_spans(template, conv, gen)
            ck.check(got[i][0] == text and got[i][1] == spans,
                     f"{name}, generation prompt {gen}, conversation {i}: text and spans "
                     f"{spans} equal transformers'" +
                     ("" if got[i][:2] == (text, spans) else f": {got[i][:2]!r} {got[i][2]}"))

REFUSED = [
    ("{% for m in messages %}{% generation %}{% generation %}a{% endgeneration %}"
     "{% endgeneration %}{% endfor %}", "offset 39", "inside another"),
    ("x{% generation %}a", "offset 1", "never closed"),
    ("x{% if true %}{% generation %}a{% endif %}{% endgeneration %}", "offset 31",
     "misplaced 'endif'"),
    ("x{% endgeneration %}", "offset 1", "misplaced 'endgeneration'"),
    ("{% for m in messages %}{% generation %}{% break %}{% endgeneration %}{% endfor %}",
     "offset 39", "'break' outside a loop of its own generation block"),
    ("x{% generation foo %}a{% endgeneration %}", "offset 1", "unexpected text"),
]
for template, where, why in REFUSED:
    rc, err, _ = render_spans(template, CONVS[:1])
    try:
        _compile_jinja_template(template)
        jinja_refuses = False
    except Exception:
        jinja_refuses = True
    ck.check(rc == 1 and where in err and why in err and
             (jinja_refuses or "inside another" in why),
             f"refused {template[:50]!r}: {err.strip()[:200]}")


# ---- masks --------------------------------------------------------------------------------

def prepare(d, rows, template, bos=None, eos="<|im_end|>"):
    return prepare_chat(d, rows, {"chat_template": template, "eos_token": eos,
                                  **({"bos_token": bos} if bos else {})})


def prefix_mask(hf, conv, kw):
    """The prefix rule's trained tokens (test_sft_prepare's reference): those whose offsets
    start inside an assistant turn's text."""
    msgs, tools = conv["messages"], conv.get("tools")
    text = hf.apply_chat_template(msgs, tools=tools, tokenize=False, **kw)
    offs = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans = []
    for k, m in enumerate(msgs):
        if m["role"] == "assistant":
            a = len(hf.apply_chat_template(msgs[:k], tools=tools, tokenize=False,
                                           add_generation_prompt=True, **kw))
            b = len(hf.apply_chat_template(msgs[:k + 1], tools=tools, tokenize=False, **kw))
            spans.append((a, b))
    return [int(any(a <= s < b for a, b in spans) and e > s) for s, e in offs]


def compare(name, hf, rows, got, generation):
    want_ids, want_mask, first = [], [], []
    for row in rows:
        kw = row.get("chat_template_kwargs") or {}
        conv = {"messages": row["messages"], "tools": row.get("tools")}
        if generation:
            out = hf.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=True,
                                         return_dict=True, return_assistant_tokens_mask=True,
                                         **kw)
            ids, mask = out["input_ids"], out["assistant_masks"]
        else:
            ids = hf.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=True,
                                         **kw)
            mask = prefix_mask(hf, conv, kw)
        want_ids += ids
        want_mask += mask
        first += [True] + [False] * (len(ids) - 1)
    ids, flags = got
    ck.check(ids == want_ids, f"{name}: {len(ids)} ids equal apply_chat_template's "
             f"{len(want_ids)}")
    got_mask = [b & 1 for b in flags]
    # an example's first token is never a target: its bit 0 does not matter
    same = len(got_mask) == len(want_mask) and all(
        g == w or f for g, w, f in zip(got_mask, want_mask, first))
    ck.check(same, f"{name}: trained tokens equal transformers' mask ({sum(want_mask)} of "
             f"{len(want_mask)}; got {sum(got_mask)})" +
             ("" if same else f"\n  got  {got_mask}\n  want {want_mask}"))


with tempfile.TemporaryDirectory() as d:
    tokenizer_file(d)
    for name, template in [("qwen3+generation", QWEN3_GEN), ("chatml+generation", CHATML_GEN)]:
        hf = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json",
                                     chat_template=template, eos_token="<|im_end|>")
        p, got = prepare(d, CONVS, template)
        if ck.check(p.returncode == 0, f"{name}: prepare exit {p.returncode} "
                    f"{p.stderr.strip()[-300:]}"):
            compare(name, hf, CONVS, got, True)
    # Mistral v0.3's template moves the system message into the last user turn: the prefix
    # rule refuses such a conversation; with blocks its ids and mask are transformers'.
    bos = "<|endoftext|>"
    mistral = [{"messages": [{"role": "system", "content": "Be terse."},
                             {"role": "user", "content": "What is the capital of France?"},
                             {"role": "assistant", "content": " Paris. "},
                             {"role": "user", "content": "And héllo?"},
                             {"role": "assistant", "content": "wörld ✓"}]},
               # (its tool-result branch reads an undefined tool_call: jinja2 fails there too)
               {"messages": [{"role": "user", "content": "The weather in Paris?"},
                             {"role": "assistant", "tool_calls": [dict(CALL, id="abcdef123")]}],
                "tools": TOOLS}]
    hfm = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json",
                                  chat_template=MISTRAL03_GEN, eos_token="<|im_end|>",
                                  bos_token=bos)
    p, got = prepare(d, mistral, MISTRAL03_GEN, bos)
    if ck.check(p.returncode == 0, f"mistral v0.3+generation: prepare exit {p.returncode} "
                f"{p.stderr.strip()[-300:]}"):
        compare("mistral v0.3+generation", hfm, mistral, got, True)
    p, _ = prepare(d, mistral[:1], MISTRAL03, bos)
    ck.check(p.returncode != 0 and "chat.jsonl:1" in p.stderr and "generation" in p.stderr,
             f"mistral v0.3 without blocks: a system message and two turns refused by the "
             f"prefix rule: {p.stderr.strip()[-200:]}")
    # A block that starts inside a token (the header's newline merges with the reply's): the
    # byte-level tokens' offsets place it as char_to_token does (test_chat_generation_offsets
    # has more), so it gets transformers' mask.
    row = {"messages": [{"role": "user", "content": "a"},
                        {"role": "assistant", "content": "\n\nc"}]}
    enc = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json")
    merged = len(enc("assistant\n\n\nc")["input_ids"]) < len(enc("assistant\n")["input_ids"]) + 3
    hfc = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json", chat_template=CHATML_GEN,
                                  eos_token="<|im_end|>")
    p, got = prepare(d, [CONVS[0], row], CHATML_GEN)
    if ck.check(merged and p.returncode == 0, f"a block starting inside a token: prepare exit "
                f"{p.returncode} {p.stderr.strip()[-250:]}"):
        compare("a block starting inside a token", hfc, [CONVS[0], row], got, True)
    # A ByteLevel post-processor that trims offsets (tokenizers' default) makes transformers
    # map a block starting on a space to no token: refused naming the key; trim_offsets false
    # gives transformers' mask.
    for trim in (True, False):
        t = json.load(open(f"{d}/tokenizer.json"))
        t["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim,
             "use_regex": False}]}
        os.makedirs(f"{d}/trim", exist_ok=True)
        json.dump(t, open(f"{d}/trim/tokenizer.json", "w"))
        template = CHATML_GEN.replace("message.content + '<|im_end|>'",
                                      "' ' + message.content + '<|im_end|>'")
        json.dump({"chat_template": template, "eos_token": "<|im_end|>"},
                  open(f"{d}/trim/tokenizer_config.json", "w"))
        with open(f"{d}/trim/chat.jsonl", "w") as f:
            f.write(json.dumps(CONVS[0]) + "\n")
        p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/trim/tokenizer.json",
                            "--out", f"{d}/trim/out", "--overwrite", "--format", "chat",
                            f"{d}/trim/chat.jsonl"], capture_output=True, text=True)
        hft = PreTrainedTokenizerFast(tokenizer_file=f"{d}/trim/tokenizer.json",
                                      chat_template=template, eos_token="<|im_end|>")
        if trim:
            out = hft.apply_chat_template(CONVS[0]["messages"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            ck.check(p.returncode != 0 and "trim_offsets" in p.stderr and
                     "trim/tokenizer.json" in p.stderr and sum(out["assistant_masks"]) == 0,
                     f"trim_offsets true: refused (transformers marks no token: "
                     f"{sum(out['assistant_masks'])}): {p.stderr.strip()[-200:]}")
        elif ck.check(p.returncode == 0, f"trim_offsets false: prepare exit {p.returncode} "
                      f"{p.stderr.strip()[-200:]}"):
            compare("trim_offsets false", hft, CONVS[:1],
                    read_masked_shard(f"{d}/trim/out/data_train_000000"), True)
    # Without blocks, Qwen3's template is not a prefix of itself once a conversation has two
    # assistant turns: refused, pointing at generation blocks.
    p, _ = prepare(d, CONVS[1:2], QWEN3)
    ck.check(p.returncode != 0 and "chat.jsonl:1" in p.stderr and "generation" in p.stderr,
             f"qwen3 without blocks: multi-turn refused by the prefix rule: "
             f"{p.stderr.strip()[-200:]}")

    # ---- kwargs -------------------------------------------------------------------------------
    KW_CONVS = [
        {"messages": [{"role": "user", "content": "Hi"}],
         "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [{"role": "user", "content": "Hi"}],
         "chat_template_kwargs": {"enable_thinking": True}},
        {"messages": [{"role": "user", "content": "Hi"}]},
    ]
    for gen in (False, True):
        rc, err, got = render_spans(QWEN3, KW_CONVS, gen)
        hf = hf_tokenizer(QWEN3, None, "<|im_end|>")
        for i, conv in enumerate(KW_CONVS):
            want = hf.apply_chat_template(conv["messages"], tokenize=False,
                                          add_generation_prompt=gen,
                                          **conv.get("chat_template_kwargs", {}))
            ck.check(rc == 0 and got[i][0] == want, f"qwen3 kwargs {conv.get('chat_template_kwargs')}"
                     f", generation prompt {gen}: {got[i][0]!r} vs {want!r} {got[i][2]}")

    LLAMA_CALL = {"type": "function", "function": {"name": "brave_search",
                                                   "arguments": {"query": "Paris weather"}}}
    LLAMA_ROWS = [
        {"messages": [{"role": "user", "content": "Search the weather."},
                      {"role": "assistant", "content": "", "tool_calls": [LLAMA_CALL]},
                      {"role": "ipython", "content": "sunny"},
                      {"role": "assistant", "content": "It is sunny."}],
         "chat_template_kwargs": {"builtin_tools": ["brave_search", "wolfram_alpha"],
                                  "date_string": "01 Jan 2025"}},
        {"messages": [{"role": "system", "content": "Be terse."},
                      {"role": "user", "content": "Weather?"},
                      {"role": "assistant", "content": "Sunny."}],
         "tools": TOOLS, "chat_template_kwargs": {"tools_in_user_message": False,
                                                  "date_string": "26 Jul 2024"}},
        {"messages": [{"role": "user", "content": "Weather?"},
                      {"role": "assistant", "content": "Sunny."}],
         "tools": TOOLS, "chat_template_kwargs": {"tools_in_user_message": True,
                                                  "date_string": "26 Jul 2024"}},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
         "chat_template_kwargs": None},
    ]
    bos, eot = "<|begin_of_text|>", "<|eot_id|>"
    hf = hf_tokenizer(LLAMA31, bos, eot)
    rc, err, got = render_spans(LLAMA31, LLAMA_ROWS, False, {"bos_token": bos, "eos_token": eot})
    for i, row in enumerate(LLAMA_ROWS):
        want = hf.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=False,
                                      **(row.get("chat_template_kwargs") or {}))
        ck.check(rc == 0 and got[i][0] == want, f"llama 3.1 kwargs row {i}: "
                 f"{'equal' if got[i][0] == want else repr(got[i][0]) + ' vs ' + repr(want)} "
                 f"{got[i][2][:200]}")
    ck.check(rc == 0 and "<|python_tag|>brave_search.call(query=\"Paris weather\")" in got[0][0],
             "llama 3.1 builtin_tools: the call is written as <|python_tag|>brave_search.call")

    # keys apply_chat_template takes itself
    for key, why in [("messages", "multiple values"), ("add_generation_prompt", "multiple values"),
                     ("tokenize", "own arguments"), ("chat_template", "own arguments")]:
        rc, err, got = render_spans(QWEN3, [{"messages": [{"role": "user", "content": "x"}],
                                             "chat_template_kwargs": {key: True}}])
        ck.check(rc == 0 and got[0][0] is None and f"'{key}'" in got[0][2] and why in got[0][2],
                 f"kwargs {key!r} refused: {got[0][2].strip()[:200]}")
    # a kwargs key overrides a special token, as {**special_tokens_map, **kwargs}
    rc, err, got = render_spans("{{ eos_token }}", [{"messages": [],
                                                     "chat_template_kwargs": {"eos_token": "E"}}])
    ck.check(rc == 0 and got[0][0] == "E", f"kwargs override a special token: {got[0]}")

    hfl = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json", chat_template=LLAMA31,
                                  eos_token=eot, bos_token=bos)
    p, got = prepare(d, LLAMA_ROWS, LLAMA31, bos, eot)
    if ck.check(p.returncode == 0, f"llama 3.1 kwargs prepare exit {p.returncode} "
                f"{p.stderr.strip()[-300:]}"):
        compare("llama 3.1 kwargs prepare", hfl, LLAMA_ROWS, got, False)
    rows = [dict(CONVS[1], chat_template_kwargs={"enable_thinking": False}), CONVS[2]]
    hfq = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json", chat_template=QWEN3_GEN,
                                  eos_token="<|im_end|>")
    p, got = prepare(d, rows, QWEN3_GEN)
    if ck.check(p.returncode == 0, f"qwen3+generation kwargs prepare exit {p.returncode} "
                f"{p.stderr.strip()[-300:]}"):
        compare("qwen3+generation kwargs prepare", hfq, rows, got, True)
    for bad, why in [("yes", "\"chat_template_kwargs\" is a string, not an object"),
                     ({"tokenize": False}, "'tokenize'"),
                     ({"tools": "x"}, "\"tools\" is a string")]:
        p, _ = prepare(d, [CONVS[0], dict(CONVS[0], chat_template_kwargs=bad)], QWEN3_GEN)
        ck.check(p.returncode != 0 and "chat.jsonl:2" in p.stderr and why in p.stderr,
                 f"prepare refuses chat_template_kwargs {bad!r}: {p.stderr.strip()[-200:]}")

# ---- Qwen3's published template -----------------------------------------------------------

PUBLISHED = CONVS + [
    {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                  {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
                  {"role": "assistant", "content": "b", "reasoning_content": "r"}]},
    {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                  {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"},
                  {"role": "system", "content": "late"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "q"},
                  {"role": "assistant", "content": "x</think>\n\ny", "tool_calls": [
                      {"function": {"name": "f", "arguments": '{"a": 1}'}}]}]},
]
for gen in (False, True):
    rc, err, got = render_spans(QWEN3, PUBLISHED, gen)
    hf = hf_tokenizer(QWEN3, None, "<|im_end|>")
    for i, conv in enumerate(PUBLISHED):
        want = hf.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                      add_generation_prompt=gen)
        ck.check(rc == 0 and got[i][0] == want, f"qwen3 published, generation prompt {gen}, "
                 f"conversation {i}: "
                 f"{'equal' if got[i][0] == want else repr(got[i][0]) + ' vs ' + repr(want)} "
                 f"{got[i][2][:200]}")
ck.done()
