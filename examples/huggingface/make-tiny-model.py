"""A tiny GPT-2 model directory, laid out as transformers' save_pretrained writes it (config.json,
model.safetensors) with a byte-level BPE tokenizer.json trained on a text file: a stand-in for
the Hugging Face model you would fine-tune, small enough to train on a laptop CPU in seconds.
It needs transformers and tokenizers (`pip install transformers tokenizers`); nothing is
downloaded.

    python3 examples/huggingface/make-tiny-model.py --text FILE OUT_DIR
"""
import argparse
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, help="a text file to train the tokenizer on")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("out", help="the model directory to write (must not exist or be empty)")
    a = ap.parse_args()
    if os.path.isdir(a.out) and os.listdir(a.out):
        sys.exit(f"make-tiny-model.py: {a.out} is not empty")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([a.text], trainer)

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128,
                     vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(a.out, safe_serialization=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    n = sum(p.numel() for p in model.parameters())
    print(f"make-tiny-model.py: {a.out}: GPT-2, {n} parameters, vocabulary {cfg.vocab_size}")


if __name__ == "__main__":
    main()
