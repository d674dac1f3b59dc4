"""{% generation %} blocks mapped to tokens by the tokens' offsets, against transformers 4.46.

`ztrain prepare --format chat` with templates whose blocks start or end inside a token gives
apply_chat_template(..., tokenize=True, return_dict=True, return_assistant_tokens_mask=True)'s
input_ids and assistant_masks (char_to_token of each span's first and last character): a block
after a space (the token " Paris" covers it), after a newline, a block whose last character sits
inside a multi-character token or is split over byte tokens (accented, CJK, emoji, combining
characters), a block that starts inside a token, with byte-level tokenizers trained here in the
styles of GPT-2 (ByteLevel's own regex), Llama 3 (a Split before ByteLevel) and Qwen2 (NFC, a
Split, ByteLevel). A block whose last character is in token 0 marks token 0 only (transformers'
range runs to len(input_ids), 1 for one conversation), with or without offsets. A Metaspace
(SentencePiece-style) tokenizer has offsets too (test_chat_generation_metaspace.py covers them):
a block after a space, inside its "▁Paris" token, gives transformers' mask; but where the text
holds an <unk> token (a newline this vocabulary lacks, without byte fallback) it has none, and
that block is still refused naming the line, while one that starts on a token boundary gives
transformers' mask."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402,E501
from transformers import PreTrainedTokenizerFast  # noqa: E402

from ztref import Checker, prepare_chat  # noqa: E402

ck = Checker()

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                  r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# "héllo café", "你好", "Paris" and "😀" are merged into tokens; "ж" and "🦀" are not, so they
# stay split over byte tokens.
CORPUS = ["Paris is the capital of France.", "What is the capital of France?", "héllo café",
          "你好 你好 你好", "User: Assistant: Paris", "e\u0301 e\u0301 cafe\u0301", "😀 😀",
          "ab abab abab"] * 30
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level(d, name, pre, norm=None):
    tok = Tokenizer(models.BPE())
    if norm:
        tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=420, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(f"{d}/{name}")
    tok.save(f"{d}/{name}/tokenizer.json")
    return f"{d}/{name}"


def metaspace(d):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>"] + SPECIAL, show_progress=False))
    os.makedirs(f"{d}/metaspace")
    tok.save(f"{d}/metaspace/tokenizer.json")
    return f"{d}/metaspace"


# the block after "Assistant: ", the reply's first word taking the space
SPACE = ("{% for m in messages %}{% if m.role == 'user' %}User: {{ m.content }}\n{% else %}"
         "Assistant: {% generation %}{{ m.content }}{% endgeneration %}\n{% endif %}{% endfor %}")
# ChatML with <|im_end|> outside the block: the block after a newline, ending on the reply's
# last character
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' }}{% if m.role == 'assistant' "
          "%}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
          "{{ '<|im_end|>\n' }}{% endfor %}")
# the text before the block runs straight into it: a block that starts inside a token
GLUED = ("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% else %}"
         "{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}")


def conv(*turns):
    return {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                         for i, t in enumerate(turns)]}


REPLIES = ["Paris", "héllo café", "你好", "😀", "ж", "🦀", "e\u0301", "cafe\u0301", "a ж",
           "Paris is the capital of France.", " Paris ", "你好 😀\n"]
ROWS = {
    "space": (SPACE, [conv("What is the capital of France?", r) for r in REPLIES] +
              [conv("a", "Paris", "b", "你好")]),
    "chatml": (CHATML, [conv("What is the capital of France?", r) for r in REPLIES] +
               [conv("a", "\n\nParis"), conv("a", "héllo café", "b", "ж")]),
    "glued": (GLUED, [conv("q Par", "is"), conv("q 你", "好"), conv("q hél", "lo"),
                      conv("q caf", "é"), conv("q e", "\u0301"), conv("q ab", "ab"),
                      conv("Paris is", " the capital")]),
}


def prepare(d, rows, template):
    p, got = prepare_chat(d, rows, {"chat_template": template, "eos_token": "<|im_end|>"})
    return p, got and (got[0], [b & 1 for b in got[1]])


def want(d, row, template):
    hf = PreTrainedTokenizerFast(tokenizer_file=f"{d}/tokenizer.json", chat_template=template,
                                 eos_token="<|im_end|>")
    out = hf.apply_chat_template(row["messages"], tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    return out["input_ids"], out["assistant_masks"], hf.convert_ids_to_tokens(out["input_ids"])


def compare(d, name, row, template, more=()):
    """prepare's ids and mask of row (then of the rows in more) against transformers'."""
    ids, mask, toks, first = [], [], [], []
    for r in [row, *more]:
        i, m, t = want(d, r, template)
        ids, mask, toks, first = ids + i, mask + m, toks + t, first + [len(ids)]
    p, got = prepare(d, [row, *more], template)
    what = f"{name}: {[m['content'] for m in row['messages']]!r}"
    if not ck.check(p.returncode == 0, f"{what}: prepare exit {p.returncode} "
                    f"{p.stderr.strip()[-250:]}"):
        return
    # an example's first token is never a target: its bit does not matter
    same = got[0] == ids and all(g == w or k in first
                                 for k, (g, w) in enumerate(zip(got[1], mask)))
    ck.check(same, f"{what}: ids and mask equal apply_chat_template's ({sum(mask)} of "
             f"{len(mask)} tokens)" + ("" if same else f"\n  tokens {toks}\n  got  {got}\n"
                                      f"  want {mask}"))


with tempfile.TemporaryDirectory() as work:
    dirs = {
        "gpt2": byte_level(work, "gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False)),
        "llama3": byte_level(work, "llama3", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),
        "qwen2": byte_level(work, "qwen2", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            normalizers.NFC()),
    }
    for tname, d in dirs.items():
        for pattern, (template, rows) in ROWS.items():
            for row in rows:
                # NFC changes a combining character: no offsets then (covered below)
                if tname == "qwen2" and any("\u0301" in m["content"] for m in row["messages"]):
                    continue
                compare(d, f"{tname} {pattern}", row, template)

    # The patterns the review found refused, each shown to sit inside a token with transformers.
    d = dirs["gpt2"]
    _, _, toks = want(d, conv("q", "Paris"), SPACE)
    ck.check("ĠParis" in toks, f"the block after a space starts inside the token ' Paris': {toks}")
    _, _, toks = want(d, conv("q", "ж"), CHATML)
    ck.check("ж".encode().hex() not in [t.encode("latin-1", "replace").hex() for t in toks] and
             len(toks) > len(want(d, conv("q", "a"), CHATML)[2]),
             f"'ж' is split over byte tokens: {toks}")

    # A block whose last character is in token 0: transformers' range then runs to
    # len(input_ids), the length of the list around one conversation's ids (1), so only token 0
    # is marked, not the text's end; an empty block after a character of token 0 marks nothing.
    # (A second line gives the split a trained token.)
    head = [{"role": "assistant", "content": "Paris"}, {"role": "user", "content": " is nice"}]
    for what, template in [
            ("a block ending in token 0", "{{ '' }}" + GLUED),
            ("an empty block after token 0", "{% for m in messages %}{{ m.content }}{% if m.role "
             "== 'assistant' %}{% generation %}{{ m.reply }}{% endgeneration %}{% endif %}"
             "{% endfor %}")]:
        for tname in ("gpt2", "llama3"):
            compare(dirs[tname], f"{tname} {what}", {"messages": [dict(head[0], reply=""),
                                                                  head[1]]}, template,
                    [conv("q", "Paris"), {"messages": [dict(head[0], reply=" Paris"), head[1]]}])

    # NFC changes the text: prepare falls back to encoding the text before each edge, which
    # finds this block's edges on token boundaries.
    row = conv("q", "e\u0301 x")
    compare(dirs["qwen2"], "qwen2 (NFC changes the text)", row, CHATML)

    # Metaspace: the block after a space starts inside "▁Paris", which its offsets map. With the
    # newline (<unk> here) the text has no offsets: that block is still refused, naming the line;
    # one after a newline that is its own token gives transformers' mask.
    d = metaspace(work)
    compare(d, "metaspace, offsets", conv("What is the capital of France?", "Paris"),
            SPACE.replace("\n", " "))
    _, _, toks = want(d, conv("q", "Paris"), SPACE)
    p, _ = prepare(d, [conv("q", "Paris")], SPACE)
    ck.check("▁Paris" in toks and "<unk>" in toks and p.returncode != 0 and
             "chat.jsonl:1" in p.stderr and "inside a token" in p.stderr,
             f"metaspace with <unk>: a block inside '▁Paris' is refused: {toks} "
             f"{p.stderr.strip()[-200:]}")
    compare(d, "metaspace chatml", conv("q", "Paris"), CHATML)
    # without offsets too, an end in token 0 marks token 0 only
    two = {"messages": [{"role": "assistant", "content": "Paris is"},
                        {"role": "user", "content": " nice"}]}
    compare(d, "metaspace, a block ending in token 0", {"messages": head}, "{{ '' }}" + GLUED,
            [two])
ck.done()
