"""Content lists: a message's "content" as a list of parts ([{"type": "text", "text": ...}]), as
transformers and TRL pass it, against transformers' apply_chat_template.

- Gemma 3's and Mistral Small 3.1's published templates (chat_templates.py says where each copy
  comes from), which iterate the parts, render varied conversations (string and list content
  mixed, system messages of both kinds, several text parts, a text part holding other keys, an
  empty list) byte for byte as apply_chat_template renders them, with and without the generation
  prompt; a conversation the template refuses is refused with its message.
- `ztrain prepare --format chat` of such conversations gives apply_chat_template(tokenize=True)'s
  ids, trained on the assistant turns (by HF's offsets, as test_sft_prepare checks string
  content), with tokenizers trained here holding each family's special tokens.
- An image, video or audio part, a part of another type, a text part without a string "text" and
  a part that is not an object are refused naming FILE:LINE, the message and the part's index.
- `ztrain sample --chat` of a conversation with a content list replies as transformers' greedy
  decoding of apply_chat_template(conv, add_generation_prompt=True) does (a tiny Qwen2 model);
  one with an image part is refused as prepare refuses it, naming the file."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from chat_templates import GEMMA3, MISTRAL_SMALL31, hf_tokenizer, rendered  # noqa: E402
from llama_ref import base_config, hf_model  # noqa: E402
from ztref import (Checker, read_masked_shard, tool, write_job,  # noqa: E402
                   write_llmc_tokens)

hf_logging.set_verbosity_error()
torch.set_num_threads(2)


def T(text, **more):
    return {"type": "text", "text": text, **more}


# Conversations both templates take (Gemma 3 needs user and assistant to alternate).
CONVS = [
    [{"role": "user", "content": [T("Hello!")]}],
    [{"role": "system", "content": [T(" Be terse. \n"), T("a second system part")]},
     {"role": "user", "content": [T(" part one "), T("part 'two' \"q\" {{ x }}"),
                                  T("\u3000three\n")]},
     {"role": "assistant", "content": "  a string answer\n"},
     {"role": "user", "content": "a plain string"},
     {"role": "assistant", "content": [T("a list answer ✓", cache_control={"type": "ephemeral"}),
                                       T("second")]}],
    [{"role": "system", "content": "a string system message"},
     {"role": "user", "content": []},
     {"role": "assistant", "content": [T("")]}],
    [{"role": "user", "content": [T("a"), T("b")]}, {"role": "assistant", "content": [T("c")]},
     {"role": "user", "content": [T("héllo — 👍")]}],
    [{"role": "user", "content": [T("x")]}, {"role": "user", "content": [T("y")]}],
]
FAMILIES = [("gemma 3", GEMMA3, "<bos>", "<eos>", "<end_of_turn>",
             ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"]),
            ("mistral small 3.1", MISTRAL_SMALL31, "<s>", "</s>", "</s>",
             ["<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]"])]
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["What is the capital of France? Paris is the capital of France.", "Be terse.",
          "a list answer, a string answer, a plain string, part one, part two",
          "héllo — ünïcode ✓", "You are a helpful assistant."] * 20


def byte_bpe(specials, vocab_size=400):
    """A Qwen2-kind byte-level BPE tokenizer trained here, holding the family's specials."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def assistant_mask(hf, conv, offsets):
    """Trained tokens by offsets: those starting inside an assistant turn's text."""
    spans = []
    for k, m in enumerate(conv):
        if m["role"] == "assistant":
            a = len(hf.apply_chat_template(conv[:k], tokenize=False, add_generation_prompt=True))
            b = len(hf.apply_chat_template(conv[:k + 1], tokenize=False))
            spans.append((a, b))
    return [any(a <= s < b for a, b in spans) and e > s for s, e in offsets]


def renders(hf, gen):
    out = []
    for conv in CONVS:
        try:
            out.append((hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen),
                        None))
        except Exception as e:  # the template's raise_exception
            out.append((None, str(e)))
    return out


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/convs.json", "w") as f:
        json.dump(CONVS, f)
    for name, template, bos, eos, stop, specials in FAMILIES:
        cfg = {"chat_template": template, "bos_token": bos, "eos_token": eos}
        json.dump(cfg, open(f"{d}/tokenizer_config.json", "w"))
        hf = hf_tokenizer(template, bos, eos)
        for gen in (False, True):
            # jinja2 renders before and after ztrain: Mistral's strftime_now date matches one of
            # the two even when the renders straddle midnight.
            before = renders(hf, gen)
            out = tempfile.mkdtemp(dir=d)
            p = subprocess.run([tool("zt_chat_render"), f"{d}/tokenizer_config.json",
                                f"{d}/convs.json", out] + (["--generation-prompt"] if gen else []),
                               capture_output=True, text=True)
            ck.check(p.returncode == 0, f"{name}: zt_chat_render exit {p.returncode} "
                     f"{p.stderr.strip()[:300]}")
            after = renders(hf, gen)
            for i in range(len(CONVS) if p.returncode == 0 else 0):
                want, why = after[i]
                got, err = rendered(out, i)
                if got is not None and got == before[i][0]:
                    want = got
                if want is not None:
                    ck.check(got == want, f"{name}, generation prompt {gen}, conversation {i}: "
                             f"{'equal' if got == want else repr(got) + ' vs ' + repr(want)} "
                             f"{err[:200]}")
                else:
                    ck.check(got is None and why in err, f"{name}, generation prompt {gen}, "
                             f"conversation {i}: refused as transformers does ({why!r}): {err!r}")

        # prepare: the ids of apply_chat_template(tokenize=True), trained on the assistant turns
        pd = tempfile.mkdtemp(dir=d)
        byte_bpe(specials).save(f"{pd}/tokenizer.json")
        json.dump(cfg, open(f"{pd}/tokenizer_config.json", "w"))
        hf = PreTrainedTokenizerFast(tokenizer_file=f"{pd}/tokenizer.json", chat_template=template,
                                     bos_token=bos, eos_token=eos)
        good = [c for c, (text, _) in zip(CONVS, renders(hf, False)) if text is not None]
        with open(f"{pd}/chat.jsonl", "w") as f:
            for c in good:
                f.write(json.dumps({"messages": c}) + "\n")
        want_ids, want_mask, first = [], [], []
        for c in good:
            text = hf.apply_chat_template(c, tokenize=False)
            enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
            ex = hf.apply_chat_template(c, tokenize=True)
            ck.check(ex == enc["input_ids"], f"{name}: apply_chat_template's ids are the text's")
            want_ids += ex
            want_mask += assistant_mask(hf, c, enc["offset_mapping"])
            first += [True] + [False] * (len(ex) - 1)
        p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{pd}/tokenizer.json",
                            "--out", f"{pd}/out", "--format", "chat", f"{pd}/chat.jsonl"],
                           capture_output=True, text=True)
        ck.check(p.returncode == 0, f"{name} prepare of content lists: exit {p.returncode} "
                 f"{p.stderr.strip()[-300:]}")
        ids, mask = read_masked_shard(f"{pd}/out/data_train_000000") if p.returncode == 0 else ([], [])
        ck.check(ids == want_ids, f"{name} prepare: {len(ids)} ids equal apply_chat_template's "
                 f"{len(want_ids)}")
        got_mask = [bool(b & 1) for b in mask]
        same = [g == w or s for g, w, s in zip(got_mask, want_mask, first)]
        ck.check(len(mask) == len(want_mask) and all(same) and sum(want_mask) > 0,
                 f"{name} prepare: trained tokens are the assistant turns' ({sum(want_mask)} of "
                 f"{len(want_mask)}; got {sum(got_mask)})")

        # parts a text model cannot train on, or that are not parts, refused by line, message
        # and part
        ok = json.dumps({"messages": good[0]})
        bad = [([{"type": "image", "url": "cat.png"}, T("what is it?")], 0, "image"),
               ([T("see"), {"type": "image_url", "image_url": {"url": "x"}}], 1, "image"),
               ([T("hear"), T("this"), {"type": "input_audio", "input_audio": {}}], 2, "audio"),
               ([{"type": "video", "path": "v.mp4"}], 0, "video"),
               ([T("a"), {"type": "file", "file": {}}], 1, "\"file\""),
               ([T("a"), {"type": "text"}], 1, "\"text\""),
               ([T("a"), {"type": "text", "text": 3}], 1, "a number"),
               ([T("a"), "a bare string"], 1, "a string"),
               ([{"text": "no type"}], 0, "\"type\"")]
        for parts, at, word in bad:
            with open(f"{pd}/bad.jsonl", "w") as f:
                f.write(ok + "\n" + json.dumps({"messages": [
                    {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                    {"role": "user", "content": parts}]}) + "\n")
            p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer", f"{pd}/tokenizer.json",
                                "--out", f"{pd}/bad", "--format", "chat", f"{pd}/bad.jsonl"],
                               capture_output=True, text=True)
            e = p.stderr
            ck.check(p.returncode != 0 and "bad.jsonl:2" in e and "message 2" in e and
                     f"\"content\"[{at}]" in e and word in e and
                     not os.path.exists(f"{pd}/bad/data_train_000000.bin"),
                     f"{name}: part {json.dumps(parts[at])[:60]} refused by line, message and "
                     f"part: exit {p.returncode} {e.strip()[-300:]}")

    # sample --chat with a content list: Gemma 3's template over a tiny Qwen2 model's
    # tokenizer, against transformers' greedy decoding of apply_chat_template's prompt
    specials = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"]
    tok = byte_bpe(specials, 320)
    os.makedirs(f"{d}/hf")
    tok.save(f"{d}/hf/tokenizer.json")
    json.dump({"chat_template": GEMMA3, "bos_token": "<bos>", "eos_token": "<end_of_turn>"},
              open(f"{d}/hf/tokenizer_config.json", "w"))
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=f"{d}/hf/tokenizer.json",
                                     chat_template=GEMMA3, bos_token="<bos>",
                                     eos_token="<end_of_turn>")
    V = tok.get_vocab_size()
    model = hf_model("qwen2", 5, **base_config(vocab_size=V, max_position_embeddings=128,
                                                use_sliding_window=False))
    model.save_pretrained(f"{d}/hf", safe_serialization=True)
    write_llmc_tokens(f"{d}/train.bin", list(range(V)) * 2)
    write_job(f"{d}/job.json", {
        "model": {"init_from": "hf", "block_size": 96},
        "data": {"train": "train.bin", "shuffle": False},
        "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0, "checkpoint_dir": "ckpt"},
        "deepspeed": {"train_micro_batch_size_per_gpu": 1,
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}}})
    p = subprocess.run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 0, f"ztrain run: exit {p.returncode} {p.stderr[-300:]}")
    conv = {"messages": [{"role": "system", "content": [T("You are terse.")]},
                         {"role": "user", "content": [T("What is the capital"),
                                                      T(" of France? ")]}]}
    json.dump(conv, open(f"{d}/conv.json", "w"))
    ids = hf_tok.apply_chat_template(conv["messages"], add_generation_prompt=True,
                                     return_tensors="pt")
    # Greedy decoding as generate(do_sample=False) does it: argmax of the last position's logits.
    out, stop = ids, hf_tok.convert_tokens_to_ids("<end_of_turn>")
    model = model.float().eval()
    with torch.no_grad():
        for _ in range(20):
            nxt = model(input_ids=out).logits[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            if nxt.item() == stop:
                break
    want = hf_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                        f"{d}/hf/tokenizer.json", "--chat", f"{d}/conv.json", "--top-k", "1",
                        "--tokens", "20"], capture_output=True, text=True)
    got = p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout
    ck.check(p.returncode == 0 and got == want and len(want) > 0,
             f"sample --chat with content lists: reply {got!r} vs transformers' greedy {want!r} "
             f"{p.stderr.strip()[-200:]}")
    # sample --chat holds its conversation to chat data's rules: an image part is refused
    # naming the file, the message and the part, before anything is rendered
    conv["messages"][1]["content"].append({"type": "image", "url": "cat.png"})
    json.dump(conv, open(f"{d}/conv_image.json", "w"))
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                        f"{d}/hf/tokenizer.json", "--chat", f"{d}/conv_image.json", "--top-k",
                        "1", "--tokens", "20"], capture_output=True, text=True)
    ck.check(p.returncode != 0 and p.stdout == "" and "conv_image.json: message 1" in p.stderr
             and "\"content\"[2]" in p.stderr and "image" in p.stderr,
             f"sample --chat refuses an image part by file, message and part: exit "
             f"{p.returncode} {p.stderr.strip()[-300:]}")
ck.done()
