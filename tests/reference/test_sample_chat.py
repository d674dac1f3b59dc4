"""`ztrain sample --chat` against transformers' generate.

A tiny Qwen2 model with a Qwen2-kind tokenizer trained here (and the published Qwen2 chat
template in its tokenizer_config.json) is loaded by `ztrain run` (one step at lr 0, so its
checkpoint holds the weights). `ztrain sample CKPT --chat conv.json --top-k 1` must print the
reply transformers' greedy generate gives for apply_chat_template(conv, add_generation_prompt=True),
stopping at the template's eos_token (<|im_end|>; and a plain word the model is made to
prefer, so that the stop shows), decoded without special tokens; from a tensor-parallel
checkpoint too, with the job's data.tokenizer and no --tokenizer. An eos_token that is not one
token is warned about; export --hf keeps the source config's bos_token_id and eos_token_id and
copies the job's tokenizer, which AutoTokenizer then loads from the exported directory;
--temperature 0 is refused before the prompt is printed. A conversation
the file does not hold as a list is refused naming the file, and an object's "tools" reach the
template (tools that are not a list are refused), as do its "chat_template_kwargs"."""
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
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from chat_templates import QWEN2  # noqa: E402
from llama_ref import base_config, hf_model  # noqa: E402
from ztref import Checker, tool, write_job, write_llmc_tokens  # noqa: E402

hf_logging.set_verbosity_error()
torch.set_num_threads(2)
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["What is the capital of France? Paris is the capital of France.",
          "You are a helpful assistant.", "Name a colour. Blue, red and green are colours."] * 20

tok = Tokenizer(models.BPE())
tok.normalizer = normalizers.NFC()
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
    vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))

ck = Checker()
with tempfile.TemporaryDirectory() as d:
    os.makedirs(f"{d}/hf")
    tok.save(f"{d}/hf/tokenizer.json")
    json.dump({"chat_template": QWEN2, "eos_token": "<|im_end|>"},
              open(f"{d}/hf/tokenizer_config.json", "w"))
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=f"{d}/hf/tokenizer.json",
                                     chat_template=QWEN2, eos_token="<|im_end|>")
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

    convs = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "Name a colour."},
              {"role": "assistant", "content": "Blue."},
              {"role": "user", "content": "Another?"}]]
    model = model.float().eval()
    for i, conv in enumerate(convs):
        json.dump(conv if i == 0 else {"messages": conv}, open(f"{d}/conv.json", "w"))
        ids = hf_tok.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt")
        # Greedy decoding as generate(do_sample=False) does it (generate itself does not run
        # on Debian's torch 1.13 with this transformers): argmax of the last position's logits.
        out, eos = ids, hf_tok.convert_tokens_to_ids("<|im_end|>")
        with torch.no_grad():
            for _ in range(20):
                nxt = model(input_ids=out).logits[:, -1].argmax(-1, keepdim=True)
                out = torch.cat([out, nxt], dim=1)
                if nxt.item() == eos:
                    break
        want = hf_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                            f"{d}/hf/tokenizer.json", "--chat", f"{d}/conv.json", "--top-k", "1",
                            "--tokens", "20"], capture_output=True, text=True)
        got = p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout
        ck.check(p.returncode == 0 and got == want, f"conversation {i}: reply {got!r} vs "
                 f"transformers' greedy {want!r} ({out.shape[1] - ids.shape[1]} tokens) "
                 f"{p.stderr.strip()[-200:]}")

    # Stopping: with eos_token a plain word the model is made to prefer (its lm_head row
    # raised), the reply is that word once, not max_tokens copies of it.
    word = next(t for t in ["Paris", "ĠParis", "Blue"] if tok.token_to_id(t) is not None)
    wid = tok.token_to_id(word)
    json.dump({"chat_template": QWEN2, "eos_token": word},
              open(f"{d}/hf/tokenizer_config.json", "w"))
    # The directory as transformers now loads it: the word, named as eos_token, is a special
    # token, which the reply's decode skips.
    hf_tok = AutoTokenizer.from_pretrained(f"{d}/hf")
    with torch.no_grad():
        model.lm_head.weight[wid] *= 50.0
    model.save_pretrained(f"{d}/hf", safe_serialization=True)
    p = subprocess.run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run2"],
                       capture_output=True, text=True)
    json.dump(convs[0], open(f"{d}/conv.json", "w"))
    ids = hf_tok.apply_chat_template(convs[0], add_generation_prompt=True, return_tensors="pt")
    out = ids
    with torch.no_grad():
        for _ in range(20):
            nxt = model(input_ids=out).logits[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            if nxt.item() == wid:
                break
    want = hf_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                        f"{d}/hf/tokenizer.json", "--chat", f"{d}/conv.json", "--top-k", "1",
                        "--tokens", "20"], capture_output=True, text=True)
    got = p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout
    ck.check(p.returncode == 0 and got == want and out.shape[1] - ids.shape[1] < 20,
             f"stops at eos_token {word!r}: reply {got!r} vs {want!r} "
             f"({out.shape[1] - ids.shape[1]} tokens) {p.stderr.strip()[-200:]}")

    # A tensor-parallel checkpoint (tp_00/, tp_01/) of the same weights: without --tokenizer the
    # job's data.tokenizer, recorded in shard 0's meta.json, is the one sample uses.
    write_job(f"{d}/tp.json", {
        "world_size": 2,
        "model": {"init_from": "hf", "block_size": 96},
        "data": {"train": "train.bin", "shuffle": False, "tokenizer": "hf/tokenizer.json"},
        "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0,
                  "checkpoint_dir": "ckpt_tp"},
        "deepspeed": {"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2},
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}}})
    p = subprocess.run([tool("ztrain"), "run", f"{d}/tp.json", "--out", f"{d}/run_tp"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 0 and os.path.isdir(f"{d}/ckpt_tp/tp_01"),
             f"a TP 2 run: exit {p.returncode} {p.stderr.strip()[-200:]}")
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt_tp", "--chat", f"{d}/conv.json",
                        "--top-k", "1", "--tokens", "20"], capture_output=True, text=True)
    got = p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout
    ck.check(p.returncode == 0 and got == want, f"the TP 2 checkpoint with the job's tokenizer: "
             f"reply {got!r} vs {want!r}: exit {p.returncode} {p.stderr.strip()[-200:]}")

    # export --hf keeps the source config's special token ids (generation reads them), as
    # save_pretrained does: the config.json beside the job's tokenizer gives them.
    src = json.load(open(f"{d}/hf/config.json"))
    src.update(bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=[
        tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")])
    json.dump(src, open(f"{d}/hf/config.json", "w"))
    p = subprocess.run([tool("ztrain"), "export", f"{d}/ckpt_tp", "--hf", f"{d}/exported"],
                       capture_output=True, text=True)
    got = AutoConfig.from_pretrained(f"{d}/exported") if p.returncode == 0 else None
    want_cfg = AutoConfig.from_pretrained(f"{d}/hf")
    ck.check(got is not None and (got.bos_token_id, got.eos_token_id) ==
             (want_cfg.bos_token_id, want_cfg.eos_token_id),
             f"export --hf keeps bos_token_id and eos_token_id: "
             f"{(got.bos_token_id, got.eos_token_id) if got else None} vs "
             f"{(want_cfg.bos_token_id, want_cfg.eos_token_id)} {p.stderr.strip()[-200:]}")
    # Rewriting config.json with the ids keeps its floats floats (rope_theta 10000.0, not 10000,
    # as save_pretrained writes it; transformers' rope validation warns on an integer factor).
    exp = json.load(open(f"{d}/exported/config.json")) if p.returncode == 0 else {}
    ints = {k: v for k, v in exp.items()
            if isinstance(src.get(k), float) and not isinstance(v, float)}
    ck.check(p.returncode == 0 and not ints,
             f"export --hf with the ids: floats stay floats: {ints}")
    # And the job's tokenizer comes along, as save_pretrained writes it beside the model:
    # AutoTokenizer loads the exported directory as it loads the source one, chat template and
    # all (it failed: the directory had no tokenizer).
    try:
        exported_tok = AutoTokenizer.from_pretrained(f"{d}/exported")
    except Exception as e:  # noqa: BLE001 -- the check reports it
        exported_tok = e
    hf_tok = AutoTokenizer.from_pretrained(f"{d}/hf")
    text = "Hello, world! <|im_end|> 123"
    ck.check(not isinstance(exported_tok, Exception) and "with the job's tokenizer" in p.stdout and
             exported_tok(text)["input_ids"] == hf_tok(text)["input_ids"] and
             exported_tok.apply_chat_template(convs[0], tokenize=False) ==
             hf_tok.apply_chat_template(convs[0], tokenize=False),
             f"export --hf copies the job's tokenizer: AutoTokenizer loads it as the source's: "
             f"{exported_tok if isinstance(exported_tok, Exception) else 'loaded'} "
             f"{p.stdout.strip()[-200:]}")

    # An eos_token that is not one token never stops the reply: said, naming it.
    json.dump({"chat_template": QWEN2, "eos_token": "<|not a token|>"},
              open(f"{d}/hf/tokenizer_config.json", "w"))
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                        f"{d}/hf/tokenizer.json", "--chat", f"{d}/conv.json", "--top-k", "1",
                        "--tokens", "5"], capture_output=True, text=True)
    ck.check(p.returncode == 0 and "<|not a token|>" in p.stderr and "warning" in p.stderr,
             f"an eos_token that is not a single token is warned about: exit {p.returncode} "
             f"{p.stderr.strip()[-200:]}")
    # Options are judged before the prompt is echoed.
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                        f"{d}/hf/tokenizer.json", "--prompt", "What is", "--temperature", "0"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 2 and p.stdout == "" and "--temperature" in p.stderr,
             f"--temperature 0: exit {p.returncode}, stdout {p.stdout!r} {p.stderr.strip()[:200]}")

    json.dump({"conversation": []}, open(f"{d}/bad.json", "w"))
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                        f"{d}/hf/tokenizer.json", "--chat", f"{d}/bad.json"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 1 and "bad.json" in p.stderr and "messages" in p.stderr,
             f"a file without messages: exit {p.returncode} {p.stderr.strip()[-200:]}")
    # the object's tools reach the template, as apply_chat_template(tools=...) takes them: a
    # tools entry that is not a list is refused as chat data's rules refuse it in prepare,
    # naming the file
    json.dump({"messages": convs[0], "tools": {"type": "function"}}, open(f"{d}/bad.json", "w"))
    p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                        f"{d}/hf/tokenizer.json", "--chat", f"{d}/bad.json"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 1 and
             'bad.json: "tools" is an object, not a list of objects' in p.stderr,
             f"tools that are not a list: exit {p.returncode} {p.stderr.strip()[-200:]}")
    # the object's chat_template_kwargs reach the template as apply_chat_template's extra
    # keyword arguments; one of its own arguments is refused by name
    json.dump({"chat_template": "{{ raise_exception(why) if why is defined }}" + QWEN2,
               "eos_token": "<|im_end|>"}, open(f"{d}/hf/tokenizer_config.json", "w"))
    for kwargs, want in [({"why": "the kwargs reached it"}, "the kwargs reached it"),
                         ({"tokenize": True}, "'tokenize'")]:
        json.dump({"messages": convs[0], "chat_template_kwargs": kwargs},
                  open(f"{d}/kw.json", "w"))
        p = subprocess.run([tool("ztrain"), "sample", f"{d}/ckpt", "--tokenizer",
                            f"{d}/hf/tokenizer.json", "--chat", f"{d}/kw.json"],
                           capture_output=True, text=True)
        ck.check(p.returncode == 1 and want in p.stderr,
                 f"chat_template_kwargs {kwargs}: exit {p.returncode} {p.stderr.strip()[-200:]}")
ck.done()
