"""`ztrain export --hf` keeps what save_pretrained keeps of the model directory a job started from.

A model loaded with from_pretrained and saved with save_pretrained keeps its config.json's
bos_token_id, eos_token_id and pad_token_id and its generation_config.json (Llama 3's list of
stop tokens, sampling defaults), which generate reads. For a GPT-2 and a Qwen2 saved here with
their own special token ids (GPT-2's pad too) and an edited generation_config.json, a job whose
model section is only the directory and block_size, with pretokenized data and no data.tokenizer, runs one step at lr 0;
its export must give the same bos, eos and pad ids (AutoConfig) and the same generation config
(GenerationConfig.from_pretrained) as transformers' own from_pretrained + save_pretrained of the
directory. Before the fix the ids were left out (GPT-2's then read as 50256, past a vocabulary of
101; Qwen2's eos as none) and generation_config.json was not written.

Once the model directory is moved away, export still succeeds but warns on stderr naming that
directory, since what it kept from it (ids, generation_config.json) is then missing: before, it
said nothing."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from transformers import (AutoConfig, AutoModelForCausalLM, GenerationConfig, GPT2Config,  # noqa: E402
                          GPT2LMHeadModel)
from transformers.utils import logging as hf_logging  # noqa: E402

from llama_ref import base_config, hf_model  # noqa: E402
from ztref import Checker, run, tool, write_job, write_llmc_tokens  # noqa: E402

hf_logging.set_verbosity_error()
torch.set_num_threads(2)
BLOCK, B = 8, 2
ck = Checker()


def saved(family, hf_dir):
    if family == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=101,
                                           n_positions=BLOCK, bos_token_id=7, eos_token_id=9,
                                           pad_token_id=8))
    else:
        model = hf_model(family, 3, **base_config(num_key_value_heads=4, use_sliding_window=False,
                                                  bos_token_id=5, eos_token_id=6))
    model.save_pretrained(hf_dir, safe_serialization=True)
    # A generation_config.json apart from config.json, as Llama 3's: several stop tokens and
    # sampling defaults.
    gen = json.load(open(f"{hf_dir}/generation_config.json"))
    gen.update(eos_token_id=[gen["eos_token_id"], 11], do_sample=True, temperature=0.6, top_p=0.9)
    json.dump(gen, open(f"{hf_dir}/generation_config.json", "w"))
    return model.config.vocab_size


def generation(d):
    g = GenerationConfig.from_pretrained(d).to_dict()
    g.pop("transformers_version", None)
    return g


for family in ["gpt2", "qwen2"]:
    with tempfile.TemporaryDirectory() as d:
        V = saved(family, f"{d}/hf")
        AutoModelForCausalLM.from_pretrained(f"{d}/hf").save_pretrained(f"{d}/want")
        tokens = torch.randint(0, V, (B * BLOCK * 4,), generator=torch.Generator().manual_seed(1))
        write_llmc_tokens(f"{d}/train.bin", tokens.tolist())
        write_job(f"{d}/job.json", {
            "model": {"init_from": "hf", "block_size": BLOCK},
            "data": {"train": "train.bin", "shuffle": False},
            "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0,
                      "checkpoint_dir": "ckpt"},
            "deepspeed": {"train_micro_batch_size_per_gpu": B, "optimizer": {
                "type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}}})
        p = run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"], check=False)
        ck.check(p.returncode == 0, f"{family}: ztrain run: exit {p.returncode} {p.stderr[-300:]}")
        p = run([tool("ztrain"), "export", f"{d}/ckpt", "--hf", f"{d}/out"], check=False)
        ck.check(p.returncode == 0, f"{family}: export --hf: exit {p.returncode} {p.stderr[-300:]}")
        if p.returncode != 0:
            continue
        want, got = AutoConfig.from_pretrained(f"{d}/want"), AutoConfig.from_pretrained(f"{d}/out")
        ids = [(k, getattr(got, k), getattr(want, k))
               for k in ("bos_token_id", "eos_token_id", "pad_token_id")]
        ck.check(all(g == w for _, g, w in ids),
                 f"{family}: config.json's token ids (exported, save_pretrained's): {ids}")
        want_gen = generation(f"{d}/want")
        got_gen = generation(f"{d}/out") if os.path.exists(f"{d}/out/generation_config.json") \
            else None
        differ = {k: (got_gen.get(k), v) for k, v in want_gen.items()
                  if got_gen.get(k) != v} if got_gen is not None else "no generation_config.json"
        ck.check(got_gen == want_gen, f"{family}: the generation config save_pretrained writes "
                 f"(exported vs it: {differ})")
        os.rename(f"{d}/hf", f"{d}/hf-moved")
        p = run([tool("ztrain"), "export", f"{d}/ckpt", "--hf", f"{d}/out-moved"], check=False)
        warned = [l for l in p.stderr.splitlines() if "warning" in l and f"{d}/hf" in l]
        ck.check(p.returncode == 0 and warned and
                 not os.path.exists(f"{d}/out-moved/generation_config.json"),
                 f"{family}: with the model directory gone, export warns naming it: exit "
                 f"{p.returncode} {p.stderr.strip()[-300:]!r}")

ck.done()
