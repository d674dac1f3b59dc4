"""Hugging Face directories written by transformers 5 itself (the .venv-ds environment, 5.25 with
PyPI's torch), against transformers 5: reference/test_hf_v5_layout re-derives the 5.x layout in
the 4.x test venv; this one takes the files and the readings from the real library.

For GPT-2, Llama 3 (llama3 rotary scaling, its pre-training length left to its default), Qwen2
(rope_theta 1e6, the per-layer layer_types 5.x writes) and Mistral (rope_theta 20000), a model
built from a 5.x config with rope_parameters and saved with save_pretrained:
  - zt_model_check's logits of that directory equal transformers 5's (float64, eager) within
    1e-5, and `ztrain run`'s first loss equals transformers' within 1e-5;
  - the directory `ztrain export --hf` writes loads in transformers 5 to the same logits (1e-5),
    with the same rotary parameters (config.rope_parameters), and for Qwen2 the same
    layer_types.

Run: make test-deepspeed, or ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_hf5_configs.py
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv(".venv-ds", "scripts/install-deps.sh deepspeed")

sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)
from transformers.utils import logging as hf_logging  # noqa: E402

from ztref import Checker, first_loss_from_hf, model_check_logits, rel_err, run, tool  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
torch.set_num_threads(2)
BLOCK, B = 16, 2
SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
CASES = [
    ("gpt2", GPT2LMHeadModel,
     GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    ("llama 3, llama3 scaling", LlamaForCausalLM,
     LlamaConfig(**SIZES, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                           "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0})),
    ("qwen2, rope_theta 1e6", Qwen2ForCausalLM,
     Qwen2Config(**SIZES, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                 use_sliding_window=False)),
    ("mistral, rope_theta 20000", MistralForCausalLM,
     MistralConfig(**SIZES, rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
                   sliding_window=None)),
]


def randomise(model, seed):
    """Weights spread wide enough that every path matters: norms around 1, the rest 0.1·N(0,1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            centre = 1.0 if "norm" in name or name.endswith("ln_1.weight") or \
                name.endswith("ln_2.weight") or name.endswith("ln_f.weight") else 0.0
            p.copy_(centre + 0.1 * torch.randn(p.shape, generator=g))


def logits_of(cls, path, inputs):
    m = cls.from_pretrained(path, attn_implementation="eager").double().eval()
    with torch.no_grad():
        return m(input_ids=inputs.long()).logits, m.config


def ztrain_logits(d, inputs):
    """zt_model_check's logits of the directory d/hf, or (None, its message)."""
    return model_check_logits(d, "hf", inputs, tail=300)


ck = Checker()
for i, (what, cls, cfg) in enumerate(CASES):
    torch.manual_seed(70 + i)
    model = cls(cfg).float()
    randomise(model, 70 + i)
    V = cfg.vocab_size
    g = torch.Generator().manual_seed(400 + i)
    tokens = torch.randint(0, V, (B * BLOCK + 1,), generator=g)
    inputs = torch.stack([tokens[j * BLOCK:j * BLOCK + BLOCK] for j in range(B)]).to(torch.int32)
    targets = torch.stack([tokens[j * BLOCK + 1:j * BLOCK + BLOCK + 1] for j in range(B)])
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(f"{d}/hf")
        want, read = logits_of(cls, f"{d}/hf", inputs)
        want_loss = torch.nn.functional.cross_entropy(want.reshape(-1, V),
                                                      targets.reshape(-1)).item()
        got, why = ztrain_logits(d, inputs)
        e = rel_err(got.view(B, BLOCK, V), want) if got is not None else float("nan")
        ck.check(got is not None and e < 1e-5, f"{what}: ztrain's logits of the directory "
                 f"transformers {transformers.__version__} wrote vs its own: rel err {e:.2e} {why}")

        loss, p = first_loss_from_hf(d, "hf", tokens.tolist() * 4, B, BLOCK)
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
        back, read_back = logits_of(cls, f"{d}/exported", inputs)
        e = rel_err(back, want)
        ck.check(e < 1e-5, f"{what}: transformers 5 loads the export as the same model: logits "
                 f"rel err {e:.2e}")
        if cls is not GPT2LMHeadModel:
            ck.check(read_back.rope_parameters == read.rope_parameters,
                     f"{what}: transformers 5 reads the export's rope_parameters as the "
                     f"original's: {read_back.rope_parameters} vs {read.rope_parameters}")
            ck.check(getattr(read_back, "layer_types", None) == getattr(read, "layer_types", None),
                     f"{what}: the same layer_types: {getattr(read_back, 'layer_types', None)}")
ck.done()
