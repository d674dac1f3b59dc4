"""Tuples and dict views in a chat template against transformers' jinja2 (.venv/).

The subset holds a tuple ((a, b), items()' pairs) and a dict view (keys(), values(), items()) as a
list with a mark; where Python's answer differs from a list's, ztrain must give Python's or refuse
naming the construct, never the list's answer:
- a tuple never equals a list, two tuples compare by items; a dict view never equals a list or a
  tuple, keys() and items() equal another view as sets, values() only itself;
- a tuple is a sequence, a dict view is not; |tojson writes a tuple as a list and refuses a view;
- a dict view has no items by index (undefined) nor slices (TypeError); a tuple's slice is a tuple;
- `in`, |list, |first, |last, |join, |length, truth, loops, |map and |select are a list's;
- `+`: a tuple adds only to a tuple, a list only to a list, a view to nothing;
- values() equals itself wherever it is held (in a list, a tuple, a dict, a namespace), empty too,
  and items() == keys() raises Python's TypeError where it hashes a pair holding a list or dict.
Each render is compared with apply_chat_template's; each refusal must name the construct.

Run: ZTRAIN_BUILD=<build dir> python3 tests/reference/test_chat_tuples.py
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_templates import jinja2_result, zt_render  # noqa: E402
from ztref import Checker  # noqa: E402

CONV = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c", "d": {"k": 1, "j": [2]}, "e": {}}]
D = "{% set d = messages[2].d %}"
V = D + "{% set v = messages[2].e.values() %}"  # an empty values() view: only its identity tells it
PRINTED = "printing a tuple, a generator"


def e(expr):
    """A template printing the expression with d set to {'k': 1, 'j': [2]}."""
    return D + "{{ " + expr + " }}"


# (what, template, None when ztrain must render jinja2's text, else what its refusal must say)
CASES = [
    # ==
    ("a tuple is not a list", e("(1, 2) == [1, 2]"), None),
    ("a tuple != a list", e("(1, 2) != [1, 2]"), None),
    ("() is not []", e("() == []"), None),
    ("two tuples by items", e("(1, 2) == (1, 2)") + e("(1, 2) == (1, 3)"), None),
    ("a tuple in a list against a list in a list", e("[(1, 2)] == [[1, 2]]"), None),
    ("tuples in lists", e("[(1, 2)] == [(1, 2)]"), None),
    ("a tuple in a dict", e("{'a': (1, 2)} == {'a': [1, 2]}"), None),
    ("items()' pairs are tuples", e("d.items()|first == ['k', 1]") + e("d.items()|first == "
                                                                          "('k', 1)"), None),
    ("|items' pairs are tuples", e("(d|items|first) == ['k', 1]"), None),
    ("keys() is not a list", e("d.keys() == ['k', 'j']") + e("d.keys() == ('k', 'j')"), None),
    ("keys() == keys()", e("d.keys() == d.keys()"), None),
    ("keys() as a set", e("d.keys() == {'j': 0, 'k': 5}.keys()") +
     e("d.keys() == {'k': 0}.keys()"), None),
    ("values() only itself", e("d.values() == d.values()") + e("d.values() == [1, [2]]") +
     D + "{% set v = d.values() %}{{ v == v }}", None),
    ("items() == items()", e("d.items() == d.items()") +
     e("d.items() == {'j': [2], 'k': 1}.items()") + e("d.items() == {'j': [3], 'k': 1}.items()"),
     None),
    # values() is itself wherever it is held, empty too (Python's lists, tuples and dicts
    # compare an item with itself by identity)
    ("an empty values() in a list", V + "{{ [v] == [v] }}{{ [[v]] == [[v]] }}{{ v in [v] }}"
     "{{ [v] == [messages[2].e.values()] }}", None),
    ("an empty values() in a tuple, a dict, a namespace", V + "{{ (v,) == (v,) }}"
     "{{ {'a': v} == {'a': v} }}{% set n = namespace(x=v) %}{{ n.x == v }}{{ [n.x] == [v] }}",
     None),
    ("an empty values() taken out of a list", V + "{{ [v, v]|first == [v, v]|last }}"
     "{{ v is equalto([v]|first) }}{{ [v]|select('equalto', v)|list|length }}", None),
    # items() == keys() looks items()' first pair up among the keys, hashing it
    ("items() == keys() with a list value", e("{'a': [1]}.items() == {'a': [1]}.keys()"),
     "unhashable type: 'list'"),
    ("items() != keys() with a dict value", e("{'a': {}}.items() != {'b': 1}.keys()"),
     "unhashable type: 'dict'"),
    ("items() == keys(): the first pair's value", e("{'a': [1], 'b': 1}.items() == "
                                                   "{'a': 1, 'b': 2}.keys()"),
     "unhashable type: 'list'"),
    ("items() == keys(): a list in a tuple", e("{'a': ([1],)}.items() == {'b': 1}.keys()"),
     "unhashable type: 'list'"),
    ("items() == keys() inside lists and dicts", e("[{'a': [1]}.items()] == [{'a': [1]}.keys()]"),
     "unhashable type: 'list'"),
    ("items() == keys() by 'in'", e("{'a': [1]}.keys() in [{'a': [1]}.items()]"),
     "unhashable type: 'list'"),
    ("items() == keys() by a test", e("[{'a': [1]}.items()]|select('equalto', "
                                      "{'a': [1]}.keys())|list"), "unhashable type: 'list'"),
    ("items() == keys() that hash or stop early", e("d.items() == d.keys()") +
     e("{'a': (1,)}.items() == {'b': 1}.keys()") + e("{'a': 1, 'b': [1]}.items() == "
                                                     "{'a': 1, 'b': 2}.keys()") +
     e("{'a': [1]}.keys() == {'a': [1]}.items()") + e("{'a': [1]}.items() in "
                                                       "[{'a': [1]}.keys()]") +
     e("[1, {'a': [1]}.items()] == [2, {'a': [1]}.keys()]") +
     e("{'a': [1]}.items() == {'a': [1], 'b': 1}.keys()"), None),
    ("items() is not a list of tuples", e("d.items() == [('k', 1), ('j', [2])]"), None),
    ("nested tuples", e("(1, (2, 3)) == (1, (2, 3))") + e("(1, (2, 3)) == (1, [2, 3])"), None),
    ("a tuple in a namespace", e("namespace(t=(1, 2)).t == (1, 2)") +
     e("namespace(t=(1, 2)).t == [1, 2]"), None),
    ("|list of items() holds tuples", e("d.items()|list == [('k', 1), ('j', [2])]") +
     e("d.items()|list|first == ['k', 1]") + e("d.keys()|list == ['k', 'j']"), None),
    ("a view in a list", e("[d.keys()] == [['k', 'j']]") + e("[d.keys()] == [d.keys()]"), None),
    ("a tuple in a list, by 'in'", e("[1, 2] in [(1, 2)]") + e("(1, 2) in [[1, 2]]") +
     e("(1, 2) in [(1, 2)]"), None),
    # tests
    ("a tuple is a sequence", e("(1, 2) is sequence") + e("() is iterable"), None),
    ("a dict view is no sequence", e("d.items() is sequence") + e("d.keys() is sequence") +
     e("d.values() is sequence"), None),
    ("a dict view is iterable, not a mapping", e("d.items() is iterable") +
     e("d.keys() is mapping"), None),
    # tojson
    ("|tojson of a tuple", e("(1, 'a')|tojson") + e("[(1, 2)]|tojson") +
     e("{'a': (1, 2)}|tojson"), None),
    ("|tojson of items()", e("d.items()|tojson"),
     "Object of type dict_items is not JSON serializable"),
    ("|tojson of keys()", e("d.keys()|tojson"),
     "Object of type dict_keys is not JSON serializable"),
    ("|tojson of values()", e("d.values()|tojson"),
     "Object of type dict_values is not JSON serializable"),
    ("|tojson of a list holding a view", e("[d.keys()]|tojson"),
     "Object of type dict_keys is not JSON serializable"),
    ("|tojson of a dict holding a view", e("{'a': d.values()}|tojson"),
     "Object of type dict_values is not JSON serializable"),
    ("|tojson of items()' pairs", e("d.items()|list|tojson"), None),
    # in
    ("in keys(), values(), items()", e("'k' in d.keys()") + e("1 in d.values()") +
     e("('k', 1) in d.items()") + e("['k', 1] in d.items()") + e("('k', 2) in d.items()") +
     e("'x' not in d.keys()") + e("1 in (1, 2)"), None),
    ("a list in keys()", e("[1] in d.keys()"), "unhashable type: 'list'"),
    ("a list as a key in items()", e("([1], 2) in d.items()"), "unhashable type: 'list'"),
    ("a list in a dict", e("[1] in d"), "unhashable type: 'list'"),
    ("a dict in a dict", e("{'a': 1} in d"), "unhashable type: 'dict'"),
    ("a list in a tuple in a dict", e("(1, [2]) in d"), "unhashable type: 'list'"),
    ("keys() in a dict", e("d.keys() in d"), "unhashable type: 'dict_keys'"),
    ("what hashes in a dict", e("(1, 2) in d") + e("none in d") + e("d.values() in d") +
     e("'k' in d") + e("1 in d"), None),
    ("a list in a tuple as a key in items()", e("(([1],), 2) in d.items()"),
     "unhashable type: 'list'"),
    # what iterates as a list
    ("|list, |first, |last, |join, |length", e("d.keys()|list") + e("d.keys()|first") +
     e("d.keys()|last") + e("d.values()|last") + e("d.keys()|join(',')") +
     e("d.items()|length") + e("(1, 2)|last") + e("(1, 2)|list"), None),
    ("truth", e("not {}.keys()") + e("not d.values()") + e("not ()") + e("not (1,)"), None),
    ("loop over a view and a tuple", D + "{% for k, v in d.items() %}{{ k }}{{ loop.index }}"
     "{{ loop.length }}{{ loop.last }}{% endfor %}{% for x in (1, 2) %}{{ x }}"
     "{{ loop.revindex }}{% endfor %}{% for x in d.values() %}{{ x is number }}"
     "{% endfor %}", None),
    ("|map and |select over them", e("d.keys()|map('upper')|list") + e("d.keys()|select|list") +
     e("d.items()|map('first')|list") + e("(0, 1, 2)|select|list"), None),
    # subscripts and slices
    ("a view has no item 0", e("d.keys()[0]") + "|" + e("d.keys()[0] is defined") +
     e("d.items()[-1] is defined") + e("d.values()[0] is defined"), None),
    ("an item of a view's item 0 raises", e("d.keys()[0].x"), "dict_keys object has no element 0"),
    ("a view's attribute", e("d.keys().x is defined") + e("(1, 2).x is defined") +
     e("(1, 2).append is defined"), None),
    ("a slice of a view", e("d.keys()[0:1]|list"), "'dict_keys' object is not subscriptable"),
    ("a slice of items()", e("d.items()[:]|list"), "'dict_items' object is not subscriptable"),
    ("a tuple's item and slice", e("(1, 2)[1]") + e("(1, 2)[0:1] == [1]") +
     e("(1, 2)[0:1] == (1,)") + e("(1, 2)[::-1] == (2, 1)") + e("(1, 2, 3)[1:]|list"), None),
    # +
    ("a tuple + a tuple", e("(1, 2) + (3,) == (1, 2, 3)") + e("((1,) + (2,))|list"), None),
    ("a tuple + a list", e("(1, 2) + [3]"),
     "can only concatenate tuple (not \"list\") to tuple"),
    ("a list + a tuple", e("[1] + (2,)"), "can only concatenate list (not \"tuple\") to list"),
    ("a view + a list", e("d.keys() + ['x']"),
     "unsupported operand type(s) for +: 'dict_keys' and 'list'"),
    ("a string + a tuple", e("'x' + (1, 2)"), "can only concatenate str (not \"tuple\") to str"),
    # printing stays refused
    ("printing a tuple", e("(1, 2)"), PRINTED),
    ("printing a view", e("d.keys()"), PRINTED),
]


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    for what, template, refusal in CASES:
        want, jerr = jinja2_result(template, CONV)
        got, err = zt_render(d, template, [CONV])[0]
        if refusal is None:
            ck.check(want is not None and got == want,
                     f"{what}: {got!r:.160} (jinja2: {want!r:.160} {jerr[:120]}) {err[:200]}")
            continue
        # jinja2 fails with that message too, or (printing) gives what the subset refuses
        ck.check(got is None and refusal in err and
                 (refusal in jerr if refusal != PRINTED else want is not None),
                 f"{what} is refused naming it: {got!r:.80} {err[:260]} "
                 f"(jinja2: {want!r:.80} {jerr[:160]})")
        # the refusal points at the template
        ck.check(got is not None or "chat_template at offset" in err,
                 f"{what}: the refusal gives the offset: {err[:160]}")
ck.done()
