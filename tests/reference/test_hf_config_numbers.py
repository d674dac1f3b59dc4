"""config.json numbers and weight dtypes, decided by what transformers does with them.

Each integer key of GPT-2, Llama, Mistral and Qwen2 configs is written as a whole float ("4.0",
which Python's json reads as a float). transformers' from_pretrained and a forward pass say which
of them load: the keys that size a tensor or count layers fail (TypeError), the others load as
the same model. ztrain must refuse exactly the ones transformers fails on, naming the key, and
give transformers' logits for the others. Weights saved in float64 load, with transformers'
logits; an I64 tensor is refused with a message that lists the float types ztrain reads.

The boolean keys ztrain reads (tie_word_embeddings, attention_bias, mlp_bias, use_sliding_window,
GPT-2's scale_attn_weights, scale_attn_by_inverse_layer_idx, add_cross_attention) written as 0,
1, 0.0, null or a string: transformers stores them as given and tests them with `if`, so each
loads by its truth (0 and null false, 1 and "false" true). ztrain must load the same model
(transformers' logits) or, where that model is one ztrain does not have (an untied GPT-2),
refuse it as it refuses the JSON boolean of the same truth, naming the key."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from llama_ref import CLASSES, base_config, hf_model  # noqa: E402
from ztref import Checker, model_check_logits, rel_err  # noqa: E402

hf_logging.set_verbosity_error()
torch.set_num_threads(2)
BLOCK, B = 16, 2
INT_KEYS = ["num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
            "num_key_value_heads", "intermediate_size", "max_position_embeddings"]
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
FAMILIES = {
    "gpt2": (None, ["n_layer", "n_head", "n_embd", "vocab_size", "n_positions"]),
    "llama": (base_config(head_dim=8, rope_scaling=LLAMA3),
              INT_KEYS + ["head_dim", "rope_scaling.original_max_position_embeddings"]),
    "mistral": (base_config(head_dim=8, sliding_window=5),
                INT_KEYS + ["head_dim", "sliding_window"]),
    "qwen2": (base_config(use_sliding_window=True, sliding_window=64, max_window_layers=0),
              INT_KEYS + ["sliding_window", "max_window_layers"]),
}


def gpt2_model(seed):
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    m = GPT2LMHeadModel(cfg).float()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    return m


def ztrain_logits(d, inputs):
    """zt_model_check's logits of the directory d/hf, or (None, its message)."""
    return model_check_logits(d, "hf", inputs, tail=300)


def hf_logits(d, cls, inputs):
    """transformers' logits of d/hf (float64, eager), or the exception it raises."""
    try:
        m = cls.from_pretrained(f"{d}/hf", attn_implementation="eager").double().eval()
        with torch.no_grad():
            return m(input_ids=inputs.long()).logits, None
    except Exception as e:  # what from_pretrained raises is the reference's answer
        return None, e


def set_key(cfg, key, value):
    if "." in key:
        a, b = key.split(".")
        cfg[a][b] = value
    else:
        cfg[key] = value


def get_key(cfg, key):
    return cfg[key.split(".")[0]][key.split(".")[1]] if "." in key else cfg[key]


def saved_model(family, config, seed, d):
    """A random model of the family saved to d/hf, its model class, a batch of inputs and the
    config.json it was saved with."""
    model = gpt2_model(seed) if family == "gpt2" else hf_model(family, seed, **config)
    cls = GPT2LMHeadModel if family == "gpt2" else CLASSES[family][1]
    g = torch.Generator().manual_seed(300 + seed)
    inputs = torch.randint(0, model.config.vocab_size, (B, BLOCK), generator=g).to(torch.int32)
    model.save_pretrained(f"{d}/hf", safe_serialization=True)
    with open(f"{d}/hf/config.json") as f:
        return cls, inputs, json.load(f)


ck = Checker()
for i, (family, (config, keys)) in enumerate(FAMILIES.items()):
    with tempfile.TemporaryDirectory() as d:
        cls, inputs, src = saved_model(family, config, 90 + i, d)
        for key in keys:
            c = json.loads(json.dumps(src))
            set_key(c, key, float(get_key(c, key)))
            with open(f"{d}/hf/config.json", "w") as f:
                json.dump(c, f)
            want, err = hf_logits(d, cls, inputs)
            got, why = ztrain_logits(d, inputs)
            if want is None:
                ck.check(got is None and f"'{key}'" in why and "float" in why,
                         f"{family} {key} {get_key(c, key)}: transformers fails "
                         f"({type(err).__name__}); ztrain refuses it naming the key: {why}")
            else:
                e = rel_err(got.view(want.shape), want) if got is not None else float("nan")
                ck.check(got is not None and e < 1e-5,
                         f"{family} {key} {get_key(c, key)}: transformers loads it; ztrain's "
                         f"logits rel err {e:.2e} {why}")
        with open(f"{d}/hf/config.json", "w") as f:
            json.dump(src, f)

# Float64 weights: transformers loads them; so does ztrain, converting to fp32.
with tempfile.TemporaryDirectory() as d:
    model = hf_model("llama", 95, **base_config())
    model.double().save_pretrained(f"{d}/hf", safe_serialization=True)
    inputs = torch.randint(0, 97, (B, BLOCK), generator=torch.Generator().manual_seed(5))
    inputs = inputs.to(torch.int32)
    want, err = hf_logits(d, CLASSES["llama"][1], inputs)
    got, why = ztrain_logits(d, inputs)
    e = rel_err(got.view(want.shape), want) if got is not None and want is not None else None
    ck.check(e is not None and e < 1e-5, f"F64 weights: logits vs transformers' rel err {e} {why}")
    # An integer tensor is not weights: refused, the message listing what is read.
    sd = load_file(f"{d}/hf/model.safetensors")
    sd["model.norm.weight"] = sd["model.norm.weight"].to(torch.int64)
    save_file(sd, f"{d}/hf/model.safetensors", metadata={"format": "pt"})
    got, why = ztrain_logits(d, inputs)
    ck.check(got is None and "I64" in why and "F64" in why and "model.norm.weight" in why,
             f"an I64 tensor is refused, listing the float types read: {why}")

# Boolean keys as other JSON values, decided by transformers (its config's value and logits).
BOOLEANS = {
    "gpt2": (None, {"tie_word_embeddings": [1, 0, None], "scale_attn_weights": [1, 0, None],
                    "scale_attn_by_inverse_layer_idx": [0, None, 1],
                    "add_cross_attention": [0, None]}),
    "llama": (base_config(), {"tie_word_embeddings": [0, 0.0, None, 1, "false"],
                              "attention_bias": [0, None], "mlp_bias": [0, None, 1]}),
    "qwen2": (base_config(sliding_window=64, max_window_layers=0),
              {"use_sliding_window": [0, None, 1], "tie_word_embeddings": [0, 1]}),
}
for i, (family, (config, keys)) in enumerate(BOOLEANS.items()):
    with tempfile.TemporaryDirectory() as d:
        cls, inputs, src = saved_model(family, config, 70 + i, d)
        for key, values in keys.items():
            for value in values:
                c = dict(src, **{key: value})
                with open(f"{d}/hf/config.json", "w") as f:
                    json.dump(c, f)
                truth = bool(AutoConfig.from_pretrained(f"{d}/hf").to_dict().get(key))
                want, err = hf_logits(d, cls, inputs)
                got, why = ztrain_logits(d, inputs)
                what = f"{family} {key} {json.dumps(value)} (transformers: {truth})"
                if got is not None:
                    e = rel_err(got.view(want.shape), want) if want is not None else float("nan")
                    ck.check(e < 1e-5, f"{what}: ztrain loads transformers' model, logits rel "
                             f"err {e:.2e}")
                    continue
                # Refused: only where ztrain refuses the boolean of the same truth too, naming
                # the key (or for the same reason: a tied model whose file has a distinct
                # lm_head.weight, which ztrain refuses rather than drop).
                with open(f"{d}/hf/config.json", "w") as f:
                    json.dump(dict(src, **{key: truth}), f)
                got_bool, why_bool = ztrain_logits(d, inputs)
                ck.check(got_bool is None and (f"'{key}'" in why or why == why_bool),
                         f"{what}: refused as {json.dumps(truth)} is: {why} | {why_bool}")
ck.done()
