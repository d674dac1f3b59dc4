"""Hugging Face model directories read as transformers reads them, key by key.

Each case saves a tiny Llama, Mistral or Qwen2 with the venv's transformers (4.46), edits its
config.json or weight files, and asks transformers what it builds: from_pretrained (float64,
eager attention) gives the logits ztrain's zt_model_check must equal within 1e-5, or fails, and
then ztrain must refuse the directory naming the key. Where transformers 5 (whose rule is
re-derived here, as in test_hf_v5_layout.py) would read a key differently from 4.x, ztrain must
refuse it too, naming the key.

  rope_scaling's type: 4.x's config classes copy "type" over "rope_type" and fail (KeyError) on
      a scaling that names neither or is not an object; 5.x prefers "rope_type" and reads a falsy
      rope_scaling as none.
  sliding_window 0 (or below) where transformers applies the window (Mistral; Qwen2 with
      use_sliding_window): its mask then covers every key, so each position attends evenly to all
      of them, the future included; ztrain's 0 is no window, so the value is refused.
  hidden_act "swish": transformers' ACT2FN maps it to nn.SiLU, as "silu", so it loads.
  GPT-2 spelling ztrain's model another way: n_inner of exactly 4 * n_embd (GPT2MLP's default
      width, written out) and activation_function gelu_fast or gelu_accurate (ACT2FN's other
      tanh-approximation GELUs) load; exact "gelu" and a float n_inner stay refused by name.
  A 0 where ztrain's 0 means the default: num_key_value_heads 0 (transformers divides by it) and
      Llama's head_dim 0 (LlamaConfig keeps it) fail in transformers and are refused by name;
      Mistral's head_dim 0 is its default (MistralConfig reads it with `or`) and loads.
  rope_scaling.factor below 1: transformers warns ("must be a float >= 1") and builds the model,
      so ztrain loads it too.
  model.safetensors beside model.safetensors.index.json and its shards, holding other weights:
      from_pretrained loads model.safetensors (it looks for it first), and so must ztrain.
  pytorch_model.bin (or its sharded index) alone: from_pretrained reads PyTorch's pickle; ztrain
      does not, and refuses the directory naming the file and how to convert it.
  safetensors headers against the safetensors library (which from_pretrained reads through):
      a file is read by ztrain (zt_st_tool check) exactly when safe_open reads all its tensors;
      shapes and offsets written as floats ("16.0") and a byte-order mark are refused by the
      library, a null __metadata__ is read as none."""
import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from llama_ref import base_config, hf_model  # noqa: E402
from ztref import Checker, model_check_logits, rel_err, run, tool  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
torch.set_num_threads(2)
BLOCK, B = 16, 2
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

ck = Checker()


def inputs_for(vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, BLOCK), generator=g).to(torch.int32)


def ztrain_logits(d, init_from, inputs):
    return model_check_logits(d, init_from, inputs)


def hf_logits(hf_dir, inputs):
    """transformers' logits of the directory (float64, eager), or None and why it fails."""
    try:
        m = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
        with torch.no_grad():
            return m.double().eval()(input_ids=inputs.long()).logits, ""
    except Exception as e:  # noqa: BLE001 - any failure of from_pretrained is the answer
        return None, f"{type(e).__name__}: {str(e)[:120]}"


def saved(d, family, seed=7, **over):
    """A tiny model of `family` saved to d/hf; returns its vocabulary size."""
    model = hf_model(family, seed, **base_config(**over))
    model.save_pretrained(f"{d}/hf", safe_serialization=True)
    return model.config.vocab_size


def saved_gpt2(d, seed=7):
    """A tiny GPT-2 saved to d/hf, its weights moved off their initialisation."""
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    m.save_pretrained(f"{d}/hf", safe_serialization=True)
    return m.config.vocab_size


def edit_config(d, **keys):
    path = f"{d}/hf/config.json"
    c = json.load(open(path))
    c.update(keys)
    json.dump(c, open(path, "w"))


def same_or_refused(what, d, vocab, refuse_key=None, inputs=None,
                    reason="transformers 4 and 5 disagree"):
    """ztrain gives transformers' logits, or, where transformers fails or refuse_key says the
    versions disagree, refuses naming the key (refuse_key, else the one named in `what`)."""
    inputs = inputs_for(vocab) if inputs is None else inputs
    want, hf_why = hf_logits(f"{d}/hf", inputs)
    got, why = ztrain_logits(d, "hf", inputs)
    if want is not None and refuse_key is None:
        e = rel_err(got.view(B, BLOCK, vocab), want) if got is not None else float("nan")
        ck.check(got is not None and e < 1e-5,
                 f"{what}: transformers loads it; ztrain's logits rel err {e:.2e} {why[-200:]}")
        return
    key = refuse_key or what.split()[0]
    ck.check(got is None and key in why,
             f"{what}: refused naming '{key}' ({hf_why or reason}): "
             f"{'loaded' if got is not None else why[-260:]}")


# ---- rope_scaling's type ----------------------------------------------------------------------

def v4_rope_type(rs):
    """The type transformers 4's LlamaConfig / Qwen2Config leave in rope_scaling."""
    rs = dict(rs)
    if "type" in rs:
        rs["rope_type"] = rs["type"]
    return rs.get("rope_type")


def v5_rope_type(rs):
    """The type transformers 5's standardize_rope_params reads: rope_type, else type, else
    default; a falsy rope_scaling is none."""
    if not rs:
        return "default"
    return rs.get("rope_type", rs.get("type", "default"))


def rope_type_case(family, what, rs):
    with tempfile.TemporaryDirectory() as d:
        vocab = saved(d, family)
        edit_config(d, rope_scaling=rs)
        disagree = None
        if isinstance(rs, dict) and v4_rope_type(rs) not in (None, v5_rope_type(rs)):
            disagree = "rope_scaling.rope_type"
        # Where 4.x reads the type, it is the one its config holds.
        try:
            cfg = AutoConfig.from_pretrained(f"{d}/hf")
            ck.check(cfg.rope_scaling["rope_type"] == v4_rope_type(rs),
                     f"{family} {what}: transformers 4 reads rope_type "
                     f"{cfg.rope_scaling['rope_type']!r} ({v4_rope_type(rs)!r} re-derived)")
        except Exception:  # noqa: BLE001 - a failing config is a case of its own below
            pass
        same_or_refused(f"rope_scaling {what} ({family})", d, vocab, refuse_key=disagree)


for family in ("llama", "qwen2"):
    rope_type_case(family, "type linear alone", {"type": "linear", "factor": 2.0})
    rope_type_case(family, "type and rope_type both linear",
                   {"type": "linear", "rope_type": "linear", "factor": 2.0})
    rope_type_case(family, "type linear, rope_type llama3",
                   {"type": "linear", "rope_type": "llama3", **LLAMA3})
    rope_type_case(family, "type llama3, rope_type linear",
                   {"type": "llama3", "rope_type": "linear", **LLAMA3})
    rope_type_case(family, "type default, rope_type linear",
                   {"type": "default", "rope_type": "linear", "factor": 2.0})
    rope_type_case(family, "type linear, rope_type null",
                   {"type": "linear", "rope_type": None, "factor": 2.0})
    rope_type_case(family, "{} (no type)", {})
    rope_type_case(family, "{factor 2.0} (no type)", {"factor": 2.0})
rope_type_case("llama", "false", False)


# ---- a sliding window of 0 ---------------------------------------------------------------------

def sees_the_future(hf_dir, vocab):
    """Whether transformers' model (float32, eager, as from_pretrained builds it) lets the first
    position's logits depend on the last token."""
    m = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    x = inputs_for(vocab).long()
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % vocab
    with torch.no_grad():
        return not torch.allclose(m(input_ids=x).logits[:, 0], m(input_ids=y).logits[:, 0])


def window_case(family, what, applied, **keys):
    with tempfile.TemporaryDirectory() as d:
        vocab = saved(d, family)
        edit_config(d, **keys)
        future = sees_the_future(f"{d}/hf", vocab)
        ck.check(future == applied, f"{family} {what}: transformers' first position "
                 f"{'sees' if future else 'does not see'} the last token")
        same_or_refused(f"sliding_window {what} ({family})", d, vocab,
                        refuse_key="key 'sliding_window'" if applied else None,
                        reason="the window covers every key")


window_case("mistral", "0", True, sliding_window=0)
window_case("mistral", "-1", True, sliding_window=-1)
window_case("qwen2", "0 with use_sliding_window, max_window_layers 0", True,
            use_sliding_window=True, sliding_window=0, max_window_layers=0)
window_case("qwen2", "0 without use_sliding_window", False, use_sliding_window=False,
            sliding_window=0)


# ---- hidden_act "swish" ------------------------------------------------------------------------

for family in ("llama", "mistral", "qwen2"):
    with tempfile.TemporaryDirectory() as d:
        vocab = saved(d, family)
        edit_config(d, hidden_act="swish")
        same_or_refused(f"hidden_act swish ({family})", d, vocab)


# ---- GPT-2's defaults spelled out ---------------------------------------------------------------

for what, keys, key in [("n_inner 128 (4 * n_embd)", {"n_inner": 128}, None),
                        ("n_inner 128.0", {"n_inner": 128.0}, "n_inner"),
                        ("activation_function gelu_fast", {"activation_function": "gelu_fast"},
                         None),
                        ("activation_function gelu_accurate",
                         {"activation_function": "gelu_accurate"}, None),
                        ("activation_function gelu (exact, erf)", {"activation_function": "gelu"},
                         "activation_function")]:
    with tempfile.TemporaryDirectory() as d:
        vocab = saved_gpt2(d)
        edit_config(d, **keys)
        same_or_refused(f"{what} (gpt2)", d, vocab, refuse_key=key,
                        reason="ztrain's GELU is the tanh approximation")

# ---- a 0 that is not transformers' default ------------------------------------------------------

for family, what, over, keys, key in [
        ("llama", "num_key_value_heads 0 (MHA weights)", {"num_key_value_heads": 8},
         {"num_key_value_heads": 0}, "'num_key_value_heads'"),
        ("qwen2", "num_key_value_heads 0 (MHA weights)", {"num_key_value_heads": 8},
         {"num_key_value_heads": 0}, "'num_key_value_heads'"),
        ("mistral", "num_key_value_heads 0 (MHA weights)", {"num_key_value_heads": 8},
         {"num_key_value_heads": 0}, "'num_key_value_heads'"),
        ("llama", "head_dim 0", {}, {"head_dim": 0}, "'head_dim'"),
        ("mistral", "head_dim 0", {}, {"head_dim": 0}, None)]:
    with tempfile.TemporaryDirectory() as d:
        vocab = saved(d, family, **over)
        edit_config(d, **keys)
        same_or_refused(f"{what} ({family})", d, vocab, refuse_key=key)

# ---- a rope factor below 1 ---------------------------------------------------------------------

for family, rs in [("llama", {"rope_type": "linear", "factor": 0.5}),
                   ("llama", {"rope_type": "llama3", **LLAMA3, "factor": 0.5}),
                   ("qwen2", {"rope_type": "linear", "factor": 0.75})]:
    with tempfile.TemporaryDirectory() as d:
        vocab = saved(d, family)
        edit_config(d, rope_scaling=rs)
        same_or_refused(f"rope_scaling {rs['rope_type']} factor {rs['factor']} ({family})", d,
                        vocab)

# ---- which weight files ------------------------------------------------------------------------

for family in ("llama", "qwen2"):
    with tempfile.TemporaryDirectory() as d:
        hf_model(family, 11, **base_config()).save_pretrained(
            f"{d}/hf", max_shard_size="40KB", safe_serialization=True)
        os.makedirs(f"{d}/single")
        vocab = saved(f"{d}/single", family, seed=12)
        x = inputs_for(vocab)
        sharded, _ = hf_logits(f"{d}/hf", x)
        shutil.copy(f"{d}/single/hf/model.safetensors", f"{d}/hf/model.safetensors")
        both, _ = hf_logits(f"{d}/hf", x)
        single, _ = hf_logits(f"{d}/single/hf", x)
        ck.check(torch.equal(both, single) and not torch.allclose(both, sharded),
                 f"{family}: from_pretrained of a directory with both reads model.safetensors")
        same_or_refused(f"model.safetensors beside an index ({family})", d, vocab, inputs=x)
        os.remove(f"{d}/hf/model.safetensors")
        same_or_refused(f"the index alone ({family})", d, vocab, inputs=x)

# PyTorch's pickled weights (save_pretrained with safe_serialization=False, older Hub repos), one
# file or sharded: from_pretrained reads them; ztrain does not, and says so naming the file and
# how to convert it.
for shard in ("5GB", "40KB"):
    with tempfile.TemporaryDirectory() as d:
        model = hf_model("llama", 13, **base_config())
        model.save_pretrained(f"{d}/hf", max_shard_size=shard, safe_serialization=False)
        name = "pytorch_model.bin" + ("" if shard == "5GB" else ".index.json")
        x = inputs_for(model.config.vocab_size)
        want, why = hf_logits(f"{d}/hf", x)
        got, zwhy = ztrain_logits(d, "hf", x)
        ck.check(want is not None and got is None and name in zwhy and "save_pretrained" in zwhy,
                 f"{name}: from_pretrained reads it ({why or 'yes'}); ztrain refuses naming it "
                 f"and the conversion: {zwhy[-300:]}")


# ---- safetensors headers -----------------------------------------------------------------------

def st_blob(header_text, data):
    """A safetensors file: the 8-byte header length, the header text as given, the data."""
    return struct.pack("<Q", len(header_text)) + header_text + data


F4 = struct.pack("<4f", 1, 2, 3, 4)
A = '"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}'
HEADERS = [
    ("a plain header", "{" + A + "}", F4),
    ("a header padded with spaces", "{" + A + "}    ", F4),
    ("a null __metadata__", '{"__metadata__": null, ' + A + "}", F4),
    ("string __metadata__", '{"__metadata__": {"format": "pt"}, ' + A + "}", F4),
    ("offsets written as floats", '{"a": {"dtype": "F32", "shape": [4], '
     '"data_offsets": [0, 16.0]}}', F4),
    ("a shape written as a float", '{"a": {"dtype": "F32", "shape": [4.0], '
     '"data_offsets": [0, 16]}}', F4),
    ("an offset with an exponent", '{"a": {"dtype": "F32", "shape": [4], '
     '"data_offsets": [0, 1.6e1]}}', F4),
    ("a byte-order mark", "\ufeff{" + A + "}", F4),
    ("a metadata number", '{"__metadata__": {"format": 1}, ' + A + "}", F4),
    ("trailing data", "{" + A + "}", F4 + b"\0" * 4),
]
with tempfile.TemporaryDirectory() as d:
    for what, header, data in HEADERS:
        path = f"{d}/m.safetensors"
        with open(path, "wb") as f:
            f.write(st_blob(header.encode("utf-8"), data))
        try:
            with safe_open(path, "pt") as f:
                for k in f.keys():
                    f.get_tensor(k)
            lib = ""
        except Exception as e:  # noqa: BLE001 - the library refusing the file is the answer
            lib = str(e)[:100]
        p = run([tool("zt_st_tool"), "check", path], check=False)
        says = f"refuses ({lib})" if lib else "reads it"
        zt = "reads it" if p.returncode == 0 else "refuses: " + p.stderr.strip()[-160:]
        ck.check((p.returncode == 0) == (not lib),
                 f"safetensors with {what}: the library {says}, ztrain {zt}")

ck.done()
