"""What the tests of `ztrain prepare` and of jobs on prepared shards share: a small byte-level
BPE tokenizer trained here with Hugging Face `tokenizers` (the caller runs under .venv/, see
tests/pyvenv.py), and a reader of llm.c token shards written independently of ztrain's C code."""
import os
import struct
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "reference"))
import tokcorpus  # noqa: E402


def train_bpe(n_texts, vocab_size, special, bos=None):
    """A GPT-2-style byte-level BPE trained on n_texts of tokcorpus' training corpus, with the
    given special tokens; with bos, a post-processor putting that token before each document
    (Llama-style)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(tokcorpus.training_texts(n_texts), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def read_shard(path):
    """(tokens, bytes per token) of an llm.c token file: version 1 (uint16) or 7 (uint32)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack_from("<3i", data)
    if magic == 20240520 and version == 1:
        fmt, size = "H", 2
    elif magic == 20240801 and version == 7:
        fmt, size = "I", 4
    else:
        raise ValueError(f"{path}: bad header {magic} {version}")
    if len(data) != 1024 + n * size:
        raise ValueError(f"{path}: size {len(data)} for {n} tokens")
    return list(struct.unpack_from("<%d%s" % (n, fmt), data, 1024)), size
