"""Text for the tokenizer tests and the prepare benchmark: a training corpus to train small
Hugging Face tokenizers on, and a varied test corpus (ASCII, accents, CJK, emoji, whitespace
runs, digits, code, control characters, invalid UTF-8), all generated here from a seed so the
tests need no downloads."""
import random

WORDS = ("the of and to in is was for on that with as by at from his her it an were are which "
         "this be or has had not but have one their new first after who two its all also time "
         "into year can there would other more people state school city may between used such "
         "during only world later some over under these both many most where well being while "
         "don't it's we'll they've I'm you'd she'll isn't").split()
ACCENTED = "café naïve résumé Zürich Ångström façade señor über crème brûlée Øresund Łódź déjà-vu".split()
CJK = ["東京都", "北京大学", "日本語のテキスト", "こんにちは世界", "한국어 문장", "中文分词测试", "ｶﾀｶﾅ", "漢字かな混じり文"]
EMOJI = ["😀", "👍🏽", "🇫🇷", "👨‍👩‍👧", "🚀🔥", "❤️", "🤖", "✨"]
CODE = [
    "def f(x):\n    return x ** 2 + 1\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "if (a && b || !c) { return -1; } // done\n",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>\n",
    "SELECT id, name FROM users WHERE age >= 18;\n",
    "x = {'key': [1, 2, 3], \"other\": None}\n",
    "    \t  indented\t\ttabs\n\n\n",
]
PUNCT = list(".,;:!?()[]{}-_'\"/\\@#$%^&*+=<>|~`") + ["...", "--", "—", "–", "«", "»", "“", "”", "‘", "’"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\x85", "\u200b"]


def sentence(rng):
    parts = []
    for _ in range(rng.randint(3, 14)):
        r = rng.random()
        if r < 0.6:
            w = rng.choice(WORDS)
            parts.append(w.capitalize() if rng.random() < 0.1 else w)
        elif r < 0.7:
            parts.append(rng.choice(ACCENTED))
        elif r < 0.77:
            parts.append(rng.choice(CJK))
        elif r < 0.82:
            parts.append(rng.choice(EMOJI))
        elif r < 0.9:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        else:
            parts.append(rng.choice(PUNCT))
    out = parts[0]
    for p in parts[1:]:
        out += (rng.choice(SPACES) if rng.random() < 0.1 else " ") + p
    return out + rng.choice([".", "!", "?", "", "\n"])


def document(rng):
    n = rng.randint(1, 6)
    chunks = []
    for _ in range(n):
        chunks.append(rng.choice(CODE) if rng.random() < 0.2 else sentence(rng))
    return rng.choice(["\n", " ", "\n\n"]).join(chunks)


def training_texts(n=1500, seed=1):
    rng = random.Random(seed)
    return [document(rng) for _ in range(n)]


def random_chars(rng, n):
    pool = (list("abcXYZ019 \t\n'sdtmlrve") + ["é", "ß", "ø", "中", "語", "😀", "👍🏽", "\u0301",
            "\x00", "\x7f", "\u00a0", "\x85", "\u2028", "\ufeff", "▁", "Ġ", "<", ">", "|"])
    return "".join(rng.choice(pool) for _ in range(n))


def test_documents(seed=7):
    """Strings and byte strings (invalid UTF-8) to encode."""
    rng = random.Random(seed)
    docs = [
        "", " ", "  ", "\n", "Hello world", " Hello world", "Hello  world  ", "   leading spaces",
        "trailing spaces   ", "tabs\tand\ttabs", "line\nbreaks\n\nand\r\nCRLF", "I'm you'll they've IT'S",
        "1234567890 12 123 1234 3.14159 -42 1e10 ١٢٣ ²³", "café naïve résumé Zürich",
        "東京都は日本の首都です。", "中文，标点！", "한국어도 있어요", "emoji 😀👍🏽🇫🇷👨‍👩‍👧 end",
        "mixed 東京 and café 😀 123", "a\u00a0b\u3000c\u2028d\x85e\u200bf", "\x00\x01\x02 controls \x7f",
        "<|endoftext|>", "text<|endoftext|>more", "<s>hello</s>", "▁already▁metaspace", "ĠĠ Ġ",
        "   \n\n\t  \n", "a" * 300, " " * 50 + "x", "ab" * 200, "😀" * 40, "東" * 100,
    ] + CODE
    docs += [document(rng) for _ in range(150)]
    docs += [random_chars(rng, rng.randint(1, 60)) for _ in range(150)]
    docs = [d.encode("utf-8") for d in docs]
    docs += [b"\xff", b"abc\xffdef", b"\xc3", b"caf\xc3", b"\xe6\x9d", b"\xe6\x9dx\x80\x80",
             b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80 too big", b"\xc0\xaf overlong",
             b"\xf0\x9f\x98 cut emoji", b"ok \xfe\xfe ok", b"\x80\x81\x82"]
    for _ in range(40):
        b = bytearray(document(rng).encode("utf-8"))
        for _ in range(rng.randint(1, 4)):
            b.insert(rng.randint(0, len(b)), rng.randint(0x80, 0xff))
        docs.append(bytes(b))
    return docs
