"""The chat templates' case filters against Python 3.11 and jinja2 3.1.6 (.venv/).

`upper`, `lower` and `capitalize` are Python's str methods (jinja2's do_upper, do_lower,
do_capitalize): every code point but U+0000 (a JSON string cannot hold it in cJSON) and the
surrogates (not UTF-8) goes through the three filters in ztrain, each alone as a message's
content, and must give what str.upper(), str.lower() and str.capitalize() give: full mappings
('ß' to 'SS', 'İ' to 'i̇', 'ᾳ' to 'ΑΙ'), title case for capitalize's first code point ('ǆ' to 'ǅ'); and `lower` of c "Σ" and "ΑΣ" c
for every code point c, so each is read as cased or case-ignorable as CPython's
Final_Sigma reads it. "Every code point" is ztref.code_points(): all of planes 0-3 and 14, one
in 97 of the unassigned planes 4-13 and private-use planes 15-16.
Then strings mixing cased letters, Σ in each Final_Sigma context, combining marks, the
characters whose mappings grow, digits, CJK and jinja2's title separators (- ( { [ < and Python's
whitespace, U+001C and U+3000 among it) go through all four filters, `title` being jinja2's
do_title (words split on ([-\\s({\\[<]+), each item[0].upper() + item[1:].lower()), rendered by
jinja2's sandboxed environment as transformers renders a chat template.

The str methods `.upper()`, `.lower()`, `.capitalize()` and `.title()` are Python's, which are
not jinja2's title filter (str.title starts a word after any code point that is not cased,
"they're".title() being "They'Re"): for every code point c, c·"bA"·c·"b" (c's title mapping at
the start, its lower mapping after a cased letter, whether it is cased by the letter after it)
and "aΣ"·c·"Σ" (Final_Sigma inside a title) go through the four methods and must give Python's
results; the mixed strings go through them too, and a method of a non-string is refused with
jinja2's message.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_chat_case.py
"""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_templates import zt_render  # noqa: E402
from ztref import Checker, code_points, tool  # noqa: E402

FILTERS = ("upper", "lower", "capitalize", "title")
CHUNK = 50000
# Between the filters' results and after each message: two noncharacters, which map to
# themselves; they are checked apart, between two others.
DELIMS = ("\U0010FFFE", "\U0010FFFF")


METHODS = ("upper()", "lower()", "capitalize()", "title()")


def template(filters, delims=DELIMS):
    """Each filter applied to each message's content; a name ending in "()" is called as the
    content's method."""
    return ("{% for m in messages %}" + delims[0].join(
        "{{ m.content.%s }}" % f if f.endswith("()") else "{{ m.content|%s }}" % f
        for f in filters) + delims[1] + "{% endfor %}")


def render(d, filters, texts, delims=DELIMS):
    """ztrain's render of each text through the filters: a list of per-filter results."""
    convs = [[{"role": "user", "content": t} for t in texts[i:i + CHUNK]]
             for i in range(0, len(texts), CHUNK)]
    results = []
    for text, err in zt_render(d, template(filters, delims), convs):
        if text is None:
            return None, err
        results += [item.split(delims[0]) for item in text.split(delims[1])[:-1]]
    return results, None


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    cps = code_points()
    texts = [chr(c) for c in cps]
    got, err = render(d, FILTERS[:3], texts[:-2])
    last, err2 = render(d, FILTERS[:3], texts[-2:], ("\uFDD0", "\uFDD1"))
    got = got + last if got is not None and last is not None else None
    err = err or err2
    ck.check(got is not None and len(got) == len(texts), f"every code point rendered ({err})")
    if got is not None:
        for k, name in enumerate(FILTERS[:3]):
            bad = [c for c, t, g in zip(cps, texts, got) if g[k] != getattr(t, name)()]
            ck.check(not bad, f"{name}: {len(cps) - len(bad)} of {len(cps)} code points as "
                     f"Python's str.{name}()" + (f"; differ: {[hex(c) for c in bad[:20]]} "
                     f"e.g. {chr(bad[0])!r}: {got[cps.index(bad[0])][k]!r} vs "
                     f"{getattr(chr(bad[0]), name)()!r}" if bad else ""))

    # Final_Sigma around every code point: before a Σ (is it skipped as case-ignorable, or
    # cased?) and after one.
    around = [f"{chr(c)}Σ" for c in cps[:-2]] + [f"ΑΣ{chr(c)}" for c in cps[:-2]]
    got, err = render(d, ("lower",), around)
    ck.check(got is not None and [g[0] for g in got] == [t.lower() for t in around],
             f"lower of c·Σ and Α·Σ·c for every code point c as Python's ({err})" +
             ("" if got is None else f"; {sum(g[0] != t.lower() for g, t in zip(got, around))} "
              "differ"))

    # The str methods over every code point, in a context that shows each mapping it uses.
    ctx = [f"{chr(c)}bA{chr(c)}b" for c in cps[:-2]] + [f"aΣ{chr(c)}Σ" for c in cps[:-2]]
    got, err = render(d, METHODS, ctx)
    ck.check(got is not None and len(got) == len(ctx), f"methods: every code point rendered "
             f"({err})")
    if got is not None:
        for k, name in enumerate(METHODS):
            bad = [i for i, t in enumerate(ctx) if got[i][k] != getattr(t, name[:-2])()]
            ck.check(not bad, f"str.{name}: {len(ctx) - len(bad)} of {len(ctx)} strings c·bA·c·b "
                     f"and aΣ·c·Σ as Python's" + (f"; first {ctx[bad[0]]!r}: {got[bad[0]][k]!r} "
                                                 f"vs {getattr(ctx[bad[0]], name[:-2])()!r}"
                                                 if bad else ""))

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    pool = (list("abcXYZ019 ") + list("-({[<\t\n\x1c\x1f\x85\xa0\u2000\u3000\u2028") +
            list("ΣσςΑαΒ\u0345\u0301\u00b7'ßŉǅǆǈİıﬁﬀᾳᾼᾀΐẞꭰ日本Ⓐⓐ𐐀𐐨ᲀ") + ["\u0307"] +
            list("ΣΣΣʰᵃ\u037a\u02b0\u2071\u00aa"))
    rng = random.Random(5)
    mixed = ["ΑΣ", "ΑΣ Β", "ΑΣΒ", "Σ", "ΑΣ\u0345", "Α\u0345Σ", "Α'Σ'", "ΑΣ'Β", "-ΑΣ-", "σ ΑΣ.",
             "hello world", "hELLO-wORLD (x) [y] {z} <w>", "ǆemal ǈubav", "ßtraße ﬁne",
             "\u3000ίΣ\x1cαΣ", "", " ", "a\u0307", "İstanbul ı", "ᾳ ᾼ"]
    mixed += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 12))) for _ in range(5000)]
    got, err = render(d, FILTERS + METHODS, mixed)
    ck.check(got is not None and len(got) == len(mixed), f"mixed strings rendered ({err})")
    if got is not None:
        want = env.from_string(template(FILTERS + METHODS)).render(
            messages=[{"role": "user", "content": t} for t in mixed])
        want = [item.split(DELIMS[0]) for item in want.split(DELIMS[1])[:-1]]
        for k, name in enumerate(FILTERS + METHODS):
            bad = [i for i in range(len(mixed)) if got[i][k] != want[i][k]]
            ck.check(not bad, f"{name}: {len(mixed) - len(bad)} of {len(mixed)} mixed strings as "
                     f"jinja2's" + (f"; first {mixed[bad[0]]!r}: {got[bad[0]][k]!r} vs "
                                    f"{want[bad[0]][k]!r}" if bad else ""))

    # soft_str: numbers, booleans, none and undefined print as jinja2 prints them first.
    tpl = ("{{ 12|upper }}|{{ true|lower }}|{{ none|upper }}|{{ nope|title }}|"
           "{{ 'x'|capitalize }}")
    conv = [{"role": "user", "content": "x"}]
    got, err = zt_render(d, tpl, [conv])[0]
    want = env.from_string(tpl).render(messages=[])
    ck.check(got == want, f"non-strings: {got!r} vs {want!r} {err[:200]}")
    # jinja2's filters take no argument: one is refused when the template is read.
    with open(f"{d}/tokenizer_config.json", "w") as f:
        json.dump({"chat_template": "{{ 'x'|upper(1) }}"}, f)
    p = subprocess.run([tool("zt_chat_render"), f"{d}/tokenizer_config.json", f"{d}/convs.json",
                        tempfile.mkdtemp(dir=d)], capture_output=True, text=True)
    ck.check(p.returncode == 1 and "'upper'" in p.stderr, f"upper(1) refused: {p.stderr.strip()}")
    # The methods are str's: of a number, jinja2 says the int has no such attribute.
    for m in METHODS:
        tpl = "{{ (12).%s }}" % m
        try:
            why = env.from_string(tpl).render(messages=[])
        except Exception as e:  # jinja2's UndefinedError
            why = str(e)
        _, got = zt_render(d, tpl, [conv])[0]
        ck.check(why in got and "has no attribute" in why, f"(12).{m} refused as jinja2 "
                 f"refuses it ({why!r}): {got!r}")
ck.done()
