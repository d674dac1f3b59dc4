"""Integers past 2**53 in chat data against Python's json and jinja2 3.1.6 (.venv/).

Python's json.loads keeps every integer exact and jinja2 prints it exactly; cJSON reads a number
as a double. For 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64,
10**30, -10**30, 12345678901234567891 and "-0", each conversation's JSON text is read by both
(zt_chat_render for ztrain, json.loads and apply_chat_template for the reference) and:
- printed ({{ }}, |string, ~, |trim, |tojson), tested (is integer, float, number), printed
  inside a list and as a message (Python's repr), as a tool call's arguments (tojson with and
  without indent and sort_keys, and as a dict), and the whole conversation through tojson, must
  render byte for byte as jinja2's;
- kept in lists, objects and namespaces the template builds, and compared (==, !=, in, <, <=,
  >, >=) with themselves, another of them, 64-bit integers and the float nearest them, must give
  jinja2's text too;
- arithmetic (+, -, *, //, %, unary -) gives jinja2's result within 64 bits and is refused
  naming "an integer beyond 64 bits" where an operand or the result is past them;
- `ztrain prepare --format chat` of rows holding them writes the ids transformers gives.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_chat_bigint.py
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_templates import hf_tokenizer, zt_render  # noqa: E402
from ztref import Checker, prepare_chat  # noqa: E402

# The integers as written in the JSON text ("-0" is Python's 0).
NUMBERS = ["9007199254740991", "9007199254740992", "9007199254740993", "9223372036854775807",
           "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
           "18446744073709551616", "1000000000000000000000000000000",
           "-1000000000000000000000000000000", "12345678901234567891", "-0"]
I64 = range(-2**63, 2**63)


def conversation(k):
    """The JSON text of conversation k: NUMBERS[k] as message 0's x, in a tool call's arguments,
    beside the float nearest it (y) and the next of NUMBERS (z)."""
    x, z = NUMBERS[k], NUMBERS[(k + 1) % len(NUMBERS)]
    y = repr(float(int(x)))
    return ('[{"role": "user", "content": "n", "x": %s, "y": %s, "z": %s}, {"role": "assistant", '
            '"content": "", "tool_calls": [{"type": "function", "function": {"name": "get", '
            '"arguments": {"id": %s, "ids": [%s, -1], "tag": "t"}}}]}]' % (x, y, z, x, x))


TEXTS = [conversation(k) for k in range(len(NUMBERS))]
CONVS = [json.loads(t) for t in TEXTS]


def render(d, template):
    """ztrain's render of every conversation (their JSON text as written, the integers' digits
    kept): a list of (text or None, error)."""
    return zt_render(d, template, "[" + ",\n".join(TEXTS) + "]", len(CONVS))


def jinja(template):
    hf = hf_tokenizer(template, None, "</s>")
    return [hf.apply_chat_template(c, tokenize=False) for c in CONVS]


M = "{% set m = messages[0] %}{% set a = messages[1].tool_calls[0].function.arguments %}"
SAME = [
    ("printed", M + "{{ m.x }}|{{ m.x|string }}|{{ 'a' ~ m.x ~ 'b' }}|{{ m.x|tojson }}|"
     "{{ m.x|trim }}|{{ m.x is integer }}{{ m.x is float }}{{ m.x is number }}"),
    ("repr in a list and a message", M + "{{ [m.x, 1] }}|{{ m }}|{{ messages[1] }}"),
    ("tool call arguments", M + "{{ a|tojson }}|{{ a }}|{{ a|tojson(indent=2, sort_keys=true) }}|"
     "{{ a.id }}|{{ a.ids|tojson }}"),
    ("the conversation through tojson", "{{ messages|tojson }}"),
    ("kept in what the template builds", M + "{% set ns = namespace(v=m.x) %}{{ ns.v }}|"
     "{% set ns.w = [m.x] %}{{ ns.w }}|{{ {'k': m.x}|tojson }}|{{ [m.x] + [1] }}|"
     "{{ ([m.x] + a.ids)|tojson }}|{{ [m.x]|first }}"),
    ("compared for equality", M + "{{ m.x == m.x }}{{ m.x == a.id }}{{ m.x == m.y }}"
     "{{ m.x != m.y }}{{ m.x == m.z }}{{ m.x == 9223372036854775807 }}{{ m.x == 0 }}"
     "{{ m.x in [m.x] }}{{ m.x in a.ids }}{{ m.z in a.ids }}{{ [m.x] == a.ids[:1] }}"),
    ("ordered", M + "{{ m.x < 0 }}{{ m.x > 9223372036854775807 }}"
     "{{ m.x >= -9223372036854775807 - 1 }}{{ m.x <= m.x }}{{ m.x < m.z }}{{ m.x >= m.z }}"
     "{{ m.x > a.ids[1] }}{{ m.x > true }}"),
]
ARITH = [("+ 1", lambda x, z: x + 1), ("- 1", lambda x, z: x - 1), ("* 2", lambda x, z: x * 2),
         ("// 7", lambda x, z: x // 7), ("% 7", lambda x, z: x % 7),
         ("+ m.z", lambda x, z: x + z)]

ck = Checker()
with tempfile.TemporaryDirectory() as d:
    for what, template in SAME:
        for k, ((got, err), want) in enumerate(zip(render(d, template), jinja(template))):
            ck.check(got == want, f"{what}, {NUMBERS[k]}: " + (
                "equal" if got == want else f"{got!r:.300} vs {want!r:.300} {err[:200]}"))

    # Arithmetic: jinja2's result within 64 bits, else refused by name.
    for op, f in ARITH + [("unary -", None)]:
        template = M + ("{{ -m.x }}" if f is None else "{{ m.x " + op + " }}")
        for k, ((got, err), want) in enumerate(zip(render(d, template), jinja(template))):
            x, z = json.loads(NUMBERS[k]), json.loads(NUMBERS[(k + 1) % len(NUMBERS)])
            result = -x if f is None else f(x, z)
            exact = x in I64 and result in I64 and (op != "+ m.z" or z in I64)
            if exact:
                ok, why = got == want, f"{got!r} vs jinja2's {want!r} {err[:200]}"
            else:
                ok = got is None and "beyond 64 bits" in err
                why = f"refused ({err[:160]}), jinja2 gives {want!r:.60}: {got!r:.60}"
            ck.check(ok, f"m.x {op}, {NUMBERS[k]}: {why}")

    # `ztrain prepare --format chat` reads the same way: its ids are transformers'.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["user assistant get id ids tag 0123456789 -"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{d}/tokenizer.json")
    template = ("{% for m in messages %}{{ m.role }}: {% if m.tool_calls %}"
                "{{ m.tool_calls[0].function.arguments|tojson }}{% else %}{{ m.x }} {{ m }}"
                "{% endif %}</s>{% endfor %}")
    rows = [{"messages": c} for c in CONVS]
    p, got = prepare_chat(d, rows, {"chat_template": template, "eos_token": "</s>"})
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json", chat_template=template,
                                 eos_token="</s>")
    want = [i for r in rows for i in hf.apply_chat_template(r["messages"], tokenize=True)]
    ck.check(got is not None and got[0] == want,
             "prepare's ids are transformers' " + (
                 "" if got is None else f"({len(got[0])} vs {len(want)} ids)") + p.stderr[-300:])
ck.done()
