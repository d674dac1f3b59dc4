"""Printing a list or a dict in a chat template against Python 3.11 and jinja2 (.venv/).

`{{ x }}` of a list or dict (and `~`, `|string`, `|join` of lists, the case filters and `trim` of
one) prints str(x), which is Python's repr of its items:
- every code point but U+0000 (a JSON string cannot hold it in cJSON) and the surrogates (not
  UTF-8; one in 97 of the unassigned and private-use planes 4-13 and 15-16, ztref.code_points),
  alone in a string and between quotes of both kinds, printed inside a list must give
  str() of that list: the quote repr chooses, \\ \\' \\n \\t \\r and \\xHH escapes, and \\xHH,
  \\uHHHH or \\UHHHHHHHH for what str.isprintable() rejects;
- strings of quotes, backslashes, control characters and unprintable code points drawn at
  random, nested lists and dicts of them, floats (repr: 1e+16, -0.0, 1e-05), None, True, False,
  empty lists and dicts render through apply_chat_template's jinja2 byte for byte;
- what jinja2 does not print as a list — a generator (select, map, items), a tuple, a dict view
  (items()) — is refused by name rather than printed as one; |list of it prints as Python's;
- an integer past 64 bits in the data prints inside a list as jinja2 prints it.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_chat_print.py
"""
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_templates import hf_tokenizer, zt_render  # noqa: E402
from ztref import Checker, code_points  # noqa: E402

CHUNK = 50000


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    # Every code point, printed inside a list: one line per message.
    cps = code_points()
    items = [[chr(c), f"'{chr(c)}", f"\"{chr(c)}'"] for c in cps]
    convs = [[{"role": "user", "content": "", "x": x} for x in items[i:i + CHUNK]]
             for i in range(0, len(items), CHUNK)]
    got = zt_render(d, "{% for m in messages %}{{ m.x }}\n{% endfor %}", convs)
    lines = []
    for text, err in got:
        lines += text.split("\n")[:-1] if text is not None else [None] * CHUNK
    bad = [i for i, x in enumerate(items) if i >= len(lines) or lines[i] != str(x)]
    ck.check(not bad, f"{len(items) - len(bad)} of {len(items)} code points printed in a list as "
             "Python's str()" + (f"; first U+{cps[bad[0]]:04X}: {lines[bad[0]]!r} vs "
                                 f"{str(items[bad[0]])!r} ({got[0][1][:200]})" if bad else ""))

    # Adversarial strings and nesting, through transformers' jinja2.
    rng = random.Random(7)
    pool = list("ab'\"\\ \n\t\r\x01\x1b\x7f\x80\x9f\xa0\xad\u00e9\u0378\u2028\u2029\u200b\u3000"
                "\ufeff\ue000\U0001f600\U000e0001\U0010ffff")
    strings = ["", "'", "\"", "'\"", "\\", "\\'", "a'b", "a\"b", "it's \"x\"", "\\n", "\n"]
    strings += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 8))) for _ in range(300)]
    values = [strings, {"k": strings[:5], "'q'": {"n": [None, True, False]}, "\n": []},
              [1, -2, 2.5, 1e16, 1e-05, -0.0, 0.1, 123456789.125, 1.5e-07, 100.0], [], {},
              [[[]], [{}], {"a": [{"b": "c'd"}]}]]
    conv = [{"role": "user", "content": s, "x": values} for s in strings[:3]]
    checks = [
        ("a list, a dict and nesting", "{{ messages[0].x }}|{{ messages[0].x[1] }}|"
         "{{ messages[0].x[2] }}|{{ messages[0].x[3] }}{{ messages[0].x[4] }}"),
        ("every message object", "{% for m in messages %}{{ m }}\n{% endfor %}"),
        ("a slice and a list literal", "{{ messages[0].x[0][::-2] }}|{{ ['x', \"y'\", 1, none] }}"
         "|{{ {'a': [1, 'b'], 'c': {}} }}"),
        ("'~', string, join, upper and trim of lists", "{{ 'p' ~ messages[0].x[2] ~ 'q' }}|"
         "{{ messages[0].x[1]|string }}|{{ [messages[0].x[2], 'a']|join('/') }}|"
         "{{ messages[0].x[1].k|upper }}|{{ messages[0].x[5]|trim }}"),
        ("|list of a generator, a tuple and items()",
         "{{ messages|map(attribute='role')|list }}{{ messages[0].x[1].items()|list|length }}"
         "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}"),
    ]
    for what, template in checks:
        want = hf_tokenizer(template, None, "</s>").apply_chat_template(conv, tokenize=False)
        got, err = zt_render(d, template, [conv])[0]
        ck.check(got == want, f"{what}: " + ("equal" if got == want else
                                             f"{got!r:.300} vs {want!r:.300} {err[:200]}"))

    # What jinja2 holds as a generator, a tuple or a dict view is not a list: refused by name.
    for what, template in [("a generator", "{{ messages|selectattr('role') }}"),
                           ("a map", "{{ messages|map(attribute='role') }}"),
                           ("a tuple", "{{ (1, 2) }}"), ("a tuple in a list", "{{ [(1, 2)] }}"),
                           ("items()", "{{ messages[0].x[1].items() }}"),
                           ("items", "{{ messages[0].x[1]|items }}"),
                           ("a pair of items()", "{{ (messages[0].x[1].items()|list)[0] }}")]:
        got, err = zt_render(d, template, [conv])[0]
        ck.check(got is None and "printing a tuple, a generator or a dict view" in err,
                 f"{what} is refused by name: {got!r:.100} {err[:200]}")
    # ... and through the filters that print, the reason is that one, not the list's
    for what, template in [("upper of items()", "{{ messages[0].x[1].items()|upper }}"),
                           ("trim of a map", "{{ messages|map(attribute='role')|trim }}"),
                           ("join of tuples", "{{ messages[0].x[1]|items|join(',') }}")]:
        got, err = zt_render(d, template, [conv])[0]
        ck.check(got is None and "printing a tuple, a generator or a dict view" in err,
                 f"{what} is refused with the reason: {got!r:.100} {err[:200]}")
    # '+' keeps a tuple a tuple, and fails on a generator or a dict view, in jinja2: the
    # subset makes a tuple, which it refuses to print rather than print a list, and fails with
    # jinja2's TypeError
    for what, template in [("tuple + tuple", "{{ (1, 2) + (3,) }}"),
                           ("generator + list", "{{ messages|map(attribute='role') + ['x'] }}"),
                           ("keys() + list", "{{ messages[0].x[1].keys() + ['x'] }}")]:
        got, err = zt_render(d, template, [conv])[0]
        want, jerr = None, ""
        try:
            want = hf_tokenizer(template, None, "</s>").apply_chat_template(conv, tokenize=False)
        except Exception as e:  # noqa: BLE001 (the template's TypeError)
            jerr = str(e)
        ck.check(got is None and (jerr in err if want is None else
                                  want.startswith("(") and "printing a tuple" in err),
                 f"{what} is refused (jinja2: {want!r:.60}): {got!r:.100} {err[:200]}")
    # An integer past 64 bits in the data prints whole in jinja2, inside a list too, from the
    # digits it was written with (test_chat_bigint.py checks more)
    big = [{"role": "user", "content": "", "f": 12345678901234567890}]
    for template in ["{{ [messages[0].f] }}", "{{ messages[0] }}"]:
        want = hf_tokenizer(template, None, "</s>").apply_chat_template(big, tokenize=False)
        got, err = zt_render(d, template, [big])[0]
        ck.check(got == want and "12345678901234567890" in want,
                 f"{template}: {got!r:.80} vs jinja2's {want!r:.80} {err[:120]}")
ck.done()
