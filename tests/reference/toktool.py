"""zt_tok_tool from Python: ztrain's encode and decode of a tokenizer.json, for the tests that
compare them with Hugging Face's (tokenizers, AutoTokenizer)."""
import os
import struct
import subprocess
import tempfile

BUILD = os.environ.get("ZTRAIN_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TOOL = os.path.join(BUILD, "zt_tok_tool")


def frame_docs(docs):
    """Documents (bytes) as zt_tok_tool reads them: each a uint32 length and its bytes."""
    return b"".join(struct.pack("<I", len(d)) + d for d in docs)


def frame_ids(lists):
    return b"".join(struct.pack("<I", len(ids)) + struct.pack("<%di" % len(ids), *ids)
                    for ids in lists)


def parse_ids(raw):
    out, off = [], 0
    while off < len(raw):
        (n,) = struct.unpack_from("<I", raw, off)
        out.append(list(struct.unpack_from("<%di" % n, raw, off + 4)))
        off += 4 + 4 * n
    return out


def parse_texts(raw):
    out, off = [], 0
    while off < len(raw):
        (n,) = struct.unpack_from("<I", raw, off)
        out.append(raw[off + 4:off + 4 + n].decode("utf-8"))
        off += 4 + n
    return out


def run_tool(tok_path, mode, payload, *flags):
    """zt_tok_tool's raw output for a framed payload: (bytes, stderr), or (None, stderr) when it
    fails."""
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in"), os.path.join(d, "out")
        with open(src, "wb") as f:
            f.write(payload)
        r = subprocess.run([TOOL, tok_path, mode, src, dst, *flags], capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            return None, r.stderr
        with open(dst, "rb") as f:
            return f.read(), r.stderr


def encode(tok_path, texts, *flags):
    """ztrain's ids of each text (str, or bytes passed as they are), with the template tokens
    unless --no-special is given: (id lists, None), or (None, the refusal) when the library
    refuses."""
    docs = [t if isinstance(t, bytes) else t.encode() for t in texts]
    raw, err = run_tool(tok_path, "encode", frame_docs(docs), *flags)
    return (None, err.strip()) if raw is None else (parse_ids(raw), None)


def decode(tok_path, id_lists, *flags):
    """ztrain's text of each id list (special tokens skipped unless --keep-special is given):
    (texts, None), or (None, the refusal)."""
    raw, err = run_tool(tok_path, "decode", frame_ids(id_lists), *flags)
    return (None, err.strip()) if raw is None else (parse_texts(raw), None)


def offsets(tok_path, texts):
    """ztrain's ids of each text without the template and zt_tokenizer_offsets' ends of its
    tokens (byte offsets), or None where it does not know them exactly: ([(ids, ends)], None),
    or (None, the refusal)."""
    docs = [t if isinstance(t, bytes) else t.encode() for t in texts]
    raw, err = run_tool(tok_path, "offsets", frame_docs(docs))
    if raw is None:
        return None, err.strip()
    out, off = [], 0
    while off < len(raw):
        (n,) = struct.unpack_from("<I", raw, off)
        ids = list(struct.unpack_from("<%di" % n, raw, off + 4))
        exact, *ends = struct.unpack_from("<i%dI" % n, raw, off + 4 + 4 * n)
        out.append((ids, ends if exact else None))
        off += 8 + 8 * n
    return out, None


def train_byte_level(d, corpus, special_tokens, keep_added, normalizer=None):
    """Trains a small byte-level BPE tokenizer on corpus with special_tokens in its vocabulary
    and writes d/tokenizer.json keeping only the added tokens keep_added names ({text:
    special}); returns its model.vocab. The tests of the files beside it (tokenizer_config.json,
    special_tokens_map.json, added_tokens.json) then add the others as transformers would."""
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if normalizer:
        tok.normalizer = normalizer
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=list(special_tokens), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{d}/tokenizer.json")
    with open(f"{d}/tokenizer.json") as f:
        j = json.load(f)
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in keep_added]
    for a in j["added_tokens"]:
        a["special"] = keep_added[a["content"]]
    with open(f"{d}/tokenizer.json", "w") as f:
        json.dump(j, f)
    return j["model"]["vocab"]


def check_against_hf(ck, tok_path, name, hf, texts):
    """Checks zt_tok_tool's ids of texts and its decode of hf's ids (special tokens skipped and
    kept) against hf, a transformers tokenizer of the same directory."""
    want = [hf(t)["input_ids"] for t in texts]
    got, err = encode(tok_path, texts)
    ck.check(got == want, f"{name}: ids equal transformers'"
             + ("" if got == want else f": {got} vs {want} ({err})"))
    for flag, skip in ((), True), (("--keep-special",), False):
        want_text = [hf.decode(ids, skip_special_tokens=skip) for ids in want]
        got_text, err = decode(tok_path, want, *flag)
        ck.check(got_text == want_text, f"{name}: decode skip_special_tokens={skip}"
                 + ("" if got_text == want_text else f": {got_text} vs {want_text} ({err})"))
