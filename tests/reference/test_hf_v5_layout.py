"""Hugging Face directories whose config.json is in the layout transformers 5 writes, against
transformers.

transformers 5 (5.25, whose configuration_utils.py, modeling_rope_utils.py and
configuration_{llama,mistral,qwen2,gpt2}.py this test re-derives; it needs torch >= 2.6, which
the test venv does not have) writes the rotary base and scaling inside "rope_parameters", "dtype"
for "torch_dtype", and for Qwen2 a per-layer "layer_types" with "sliding_window": null when the
window is off. For each family a model saved by the venv's transformers (4.x) is rewritten into
that layout (to_v5 below), and:
  - zt_model_check's logits of the 5.x directory equal transformers' logits of the 4.x one
    (float64, eager) within 1e-5, and `ztrain run`'s first loss equals transformers' within 1e-5
    (a 5.x Qwen2 read with rope_theta at its default 10000 instead of 1e6 fails both);
  - the directory ztrain exports loads in transformers 4.x to the same logits, and its rotary
    settings as transformers 5 reads them (v5_rope, convert_rope_params_to_dict re-derived)
    equal those of the 5.x directory;
  - a config the two versions would read differently is refused naming the key."""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from llama_ref import CLASSES, base_config, hf_model  # noqa: E402
from ztref import (Checker, first_loss_from_hf, model_check_logits, rel_err, run, tool,  # noqa: E402
                   write_job)

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
torch.set_num_threads(2)
BLOCK, B = 16, 2


def to_v5(cfg):
    """config.json as transformers 5's to_diff_dict writes the same model: rope_theta and
    rope_scaling folded into rope_parameters (rope_type "default" without scaling; llama3's
    original_max_position_embeddings left to default to max_position_embeddings when equal),
    dtype for torch_dtype, Qwen2's layer_types and its window dropped when unused."""
    c = copy.deepcopy(cfg)
    if "torch_dtype" in c:
        c["dtype"] = c.pop("torch_dtype")
    c["transformers_version"] = "5.25.0"
    if c["model_type"] == "gpt2":
        return c
    rp = dict(c.pop("rope_scaling", None) or {})
    rp.setdefault("rope_type", rp.pop("type", "default"))
    rp["rope_theta"] = c.pop("rope_theta", 10000.0)
    if rp["rope_type"] == "llama3" and \
            rp.get("original_max_position_embeddings") == c.get("max_position_embeddings"):
        del rp["original_max_position_embeddings"]
    c["rope_parameters"] = rp
    if c["model_type"] == "qwen2":
        use = c.get("use_sliding_window", False)
        if not use:
            c["sliding_window"] = None
        mwl = c.get("max_window_layers", 28)
        c["layer_types"] = ["sliding_attention" if use and c.get("sliding_window") and i >= mwl
                            else "full_attention" for i in range(c["num_hidden_layers"])]
    return c


def v5_rope(cfg):
    """The rotary dict transformers 5 builds from a config.json: a truthy rope_scaling replaces
    rope_parameters, rope_theta from the dict else the top-level key else 10000, the type from
    rope_type or type, llama3's pre-training length from max_position_embeddings."""
    rp = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rp.setdefault("rope_type", rp.pop("type", "default"))
    rp.pop("type", None)
    if rp["rope_type"] == "llama3":
        rp.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    return rp


def ztrain_logits(d, init_from, inputs):
    return model_check_logits(d, init_from, inputs, tail=300)


def gpt2_model(seed):
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    m = GPT2LMHeadModel(cfg).float()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.add_(0.05 * torch.randn(p.shape))
    return m


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
CASES = [
    ("qwen2, rope_theta 1e6 in rope_parameters", "qwen2",
     base_config(rope_theta=1000000.0, num_key_value_heads=4, use_sliding_window=False)),
    ("llama 3, llama3 scaling in rope_parameters, pre-training length by default", "llama",
     base_config(rope_theta=500000.0, rope_scaling=LLAMA3)),
    ("mistral, rope_theta 20000 in rope_parameters", "mistral",
     base_config(rope_theta=20000.0, sliding_window=None)),
    ("gpt2, dtype for torch_dtype", "gpt2", None),
]

ck = Checker()
for i, (what, family, config) in enumerate(CASES):
    model = gpt2_model(50 + i) if family == "gpt2" else hf_model(family, 50 + i, **config)
    cls = GPT2LMHeadModel if family == "gpt2" else CLASSES[family][1]
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(300 + i)
    tokens = torch.randint(0, V, (B * BLOCK + 1,), generator=g)
    inputs = torch.stack([tokens[j * BLOCK:j * BLOCK + BLOCK] for j in range(B)]).to(torch.int32)
    targets = torch.stack([tokens[j * BLOCK + 1:j * BLOCK + BLOCK + 1] for j in range(B)])
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(f"{d}/hf4", safe_serialization=True)
        shutil.copytree(f"{d}/hf4", f"{d}/hf5")
        v4 = json.load(open(f"{d}/hf4/config.json"))
        v5 = to_v5(v4)
        json.dump(v5, open(f"{d}/hf5/config.json", "w"), indent=2)
        ref = cls.from_pretrained(f"{d}/hf4", attn_implementation="eager").double().eval()
        with torch.no_grad():
            want = ref(input_ids=inputs.long()).logits
        want_loss = torch.nn.functional.cross_entropy(want.reshape(-1, V),
                                                      targets.reshape(-1)).item()

        got, why = ztrain_logits(d, "hf5", inputs)
        e = rel_err(got.view(B, BLOCK, V), want) if got is not None else float("nan")
        ck.check(got is not None and e < 1e-5, f"{what}: logits of the 5.x directory vs "
                 f"transformers' of the 4.x one: rel err {e:.2e} {why}")

        loss, p = first_loss_from_hf(d, "hf5", tokens.tolist() * 4, B, BLOCK)
        e = abs(loss - want_loss) / want_loss
        ck.check(p.returncode == 0 and e < 1e-5, f"{what}: `ztrain run` first loss {loss:.7f} "
                 f"vs transformers {want_loss:.7f} (rel {e:.1e}) {p.stderr.strip()[-200:]}")
        if p.returncode != 0:
            continue
        p = run([tool("ztrain"), "export", f"{d}/ckpt", "--hf", f"{d}/exported"], check=False)
        ck.check(p.returncode == 0, f"{what}: export --hf: exit {p.returncode} "
                 f"{p.stderr.strip()[-200:]}")
        if p.returncode != 0:
            continue
        exp = json.load(open(f"{d}/exported/config.json"))
        back = cls.from_pretrained(f"{d}/exported", attn_implementation="eager").double().eval()
        with torch.no_grad():
            hl = back(input_ids=inputs.long()).logits
        e = rel_err(hl, want)
        ck.check(e < 1e-12, f"{what}: transformers 4 loads the export as the same model: "
                 f"logits rel err {e:.2e}")
        if family != "gpt2":
            ck.check(v5_rope(exp) == v5_rope(v5), f"{what}: transformers 5 reads the export's "
                     f"rotary settings as the 5.x directory's: {v5_rope(exp)} vs {v5_rope(v5)}")
            if family == "qwen2":
                ck.check(exp.get("layer_types") == v5["layer_types"],
                         f"{what}: export's layer_types {exp.get('layer_types')}")

# Files the two versions would read differently, or with keys ztrain does not know, are refused
# when the job is read, naming the key.
REFUSED = [
    ("rope_theta beside a different rope_parameters.rope_theta",
     lambda c: c.update(rope_theta=10000.0), "'rope_theta'"),
    ("yarn rope_parameters", lambda c: c["rope_parameters"].update(rope_type="yarn", factor=4.0),
     "'rope_parameters.rope_type'"),
    ("per-layer-type rope_parameters",
     lambda c: c.update(rope_parameters={"full_attention": c["rope_parameters"]}),
     "'rope_parameters.full_attention'"),
    ("layer_types windowing a layer use_sliding_window leaves full",
     lambda c: c.update(use_sliding_window=True, sliding_window=8,
                        max_window_layers=c["num_hidden_layers"],
                        layer_types=["sliding_attention"] * c["num_hidden_layers"]),
     "'layer_types[0]'"),
    ("an unknown key", lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}),
     "'quantization_config'"),
]
with tempfile.TemporaryDirectory() as d:
    hf_model("qwen2", 60, **base_config(rope_theta=1000000.0)).save_pretrained(f"{d}/hf")
    v5 = to_v5(json.load(open(f"{d}/hf/config.json")))
    write_job(f"{d}/job.json", {"model": {"init_from": "hf", "block_size": BLOCK},
                                "data": {"train": "train.bin"},
                                "deepspeed": {"train_micro_batch_size_per_gpu": 1}})
    for what, change, key in REFUSED:
        c = copy.deepcopy(v5)
        change(c)
        json.dump(c, open(f"{d}/hf/config.json", "w"))
        p = subprocess.run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"],
                           capture_output=True, text=True)
        ck.check(p.returncode == 1 and "config.json" in p.stderr and key in p.stderr
                 and not os.path.exists(f"{d}/run/metrics.jsonl"),
                 f"{what}: exit {p.returncode}, {p.stderr.strip()[:240]}")
ck.done()
