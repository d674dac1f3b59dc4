"""data.sample_tokens (a text sample at each evaluation) with tensor parallelism: rank 0's TP
group runs the sampling forward together, gathers the last position's vocabulary-parallel
logits (each shard holds vocab_size / tp of them) into whole rows, and every shard draws the
same token from them (zt_model_logits, sampler.c); rank 0 prints the line. The samples (12
tokens after a fixed prompt, temperature 0.8, top-k 40, seed 1234, at steps 5 and 10) equal the
tp 1 job's text for text: GPT-2 at tp 2 and dp 2 x tp 2, Llama with grouped-query attention at
tp 2 and tp 4 (kv heads replicated), and GPT-2 at tp 2 on the CUDA backend (the emulated device,
when the build has it). The runs' logits differ from the single rank's in the last
bits (row-parallel sums in another order), far below what moves a draw between tokens.

The sample lines are also checked to be what `ztrain sample` draws from the tp 1 job's final
checkpoint with the same settings, so the reference is not only the code under test."""
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from prepdata import train_bpe  # noqa: E402
import tokcorpus  # noqa: E402
from ztref import BUILD, Checker, run, tool, write_job  # noqa: E402
from tpref import job  # noqa: E402

PROMPT = "the city of"
GPT2 = {"type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 512,
        "block_size": 16}
LLAMA = {"type": "llama", "n_layer": 2, "n_head": 8, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 512, "block_size": 16,
         "tie_word_embeddings": False}


def sampled(d, name, model, tp, dp, device="cpu"):
    spec = job(model, tp, dp, f"ck-{name}", zero=1)
    spec["device"] = device
    spec["data"] = {"train": "shards/web_train_*.bin", "val": "shards/web_train_000000.bin",
                    "tokenizer": "tokenizer.json", "shuffle": True, "sample_tokens": 12,
                    "sample_prompt": PROMPT}
    spec["train"].update(eval_interval=5, eval_steps=1)
    write_job(f"{d}/{name}.json", spec)
    env = dict(os.environ, ZTRAIN_CUDA_EMU="1") if device == "cuda" else None
    p = run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"], check=False,
            env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
    return [x for x in p.stdout.splitlines() if " | sample: " in x]


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    train_bpe(200, 400, ["<|endoftext|>"]).save(f"{d}/tokenizer.json")
    rng = random.Random(4)
    with open(f"{d}/web.jsonl", "w") as f:
        for _ in range(300):
            f.write(json.dumps({"text": tokcorpus.sentence(rng)}) + "\n")
    run([tool("ztrain"), "prepare", "--tokenizer", f"{d}/tokenizer.json", "--out",
         f"{d}/shards", "--name", "web", "--shard-size", "1500", f"{d}/web.jsonl"])
    for name, model, grids in (("gpt2", GPT2, ((2, 1), (2, 2))),
                               ("llama", LLAMA, ((2, 1), (4, 1)))):
        ref = sampled(d, f"{name}-tp1", model, 1, 1)
        ck.check([x.split(" |")[0] for x in ref] == ["step 5", "step 10"],
                 f"{name} tp 1: a sample at each evaluation: {ref}")
        p = run([tool("ztrain"), "sample", f"{d}/ck-{name}-tp1", "--prompt", PROMPT, "--tokens",
                 "12", "--seed", "1234", "--temperature", "0.8", "--top-k", "40"], check=False)
        text = p.stdout[:-1]
        escaped = "".join("\\x%02x" % ord(c) if (ord(c) < 32 and c != "\t") or ord(c) == 127
                          else c for c in text)
        ck.check(ref and ref[-1].split(" | sample: ", 1)[1] == escaped,
                 f"{name} tp 1: the last sample is `ztrain sample`'s from the final checkpoint "
                 f"({escaped!r})")
        for tp, dp in grids:
            got = sampled(d, f"{name}-{dp}x{tp}", model, tp, dp)
            ck.check(got == ref and len(got) == 2,
                     f"{name} at dp {dp} x tp {tp}: the samples equal tp 1's ({got})")
        # On the CUDA backend (the emulated device): the shards' logits gathered from device
        # memory.
        if name == "gpt2" and os.path.exists(os.path.join(BUILD, "libztrain_cuda_emu.so")):
            got = sampled(d, f"{name}-cuda-tp2", model, 2, 1, device="cuda")
            ck.check(got == ref and len(got) == 2,
                     f"{name} at tp 2 on cuda: the samples equal the CPU tp 1 job's ({got})")
ck.done()
