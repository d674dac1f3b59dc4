"""Shared pieces of the Llama-family reference tests: tiny Hugging Face models (transformers from
.venv, run in float64 with eager attention) for each variant ztrain supports, with weights spread
wide enough that every gradient path matters, and the ztrain job spec that describes the same
model. Import after tests/pyvenv.py's reexec_in_venv()."""
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

CLASSES = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
           "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def hf_model(family, seed, **config):
    """A float32 model of `family` from config keys, eager attention, with random weights: norms
    around 1, biases and matrices of a size that keeps the softmaxes away from uniform."""
    cfg_cls, model_cls = CLASSES[family]
    cfg = cfg_cls(**config)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(cfg).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def spec_of(family, cfg, block_size, init_from):
    """The ztrain model section for a Hugging Face config (the agreed field names)."""
    s = {"type": family, "n_layer": cfg.num_hidden_layers, "n_head": cfg.num_attention_heads,
         "n_embd": cfg.hidden_size, "vocab_size": cfg.vocab_size, "block_size": block_size,
         "n_kv_head": cfg.num_key_value_heads, "intermediate_size": cfg.intermediate_size,
         "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
         "max_position_embeddings": cfg.max_position_embeddings,
         "tie_word_embeddings": bool(cfg.tie_word_embeddings)}
    if init_from:
        s["init_from"] = init_from
    if getattr(cfg, "head_dim", None):
        s["head_dim"] = cfg.head_dim
    rs = getattr(cfg, "rope_scaling", None)
    if rs:
        s["rope_scaling"] = rs.get("rope_type", rs.get("type"))
        s["rope_factor"] = rs["factor"]
        if s["rope_scaling"] == "llama3":
            s["rope_low_freq_factor"] = rs["low_freq_factor"]
            s["rope_high_freq_factor"] = rs["high_freq_factor"]
            s["rope_original_max_position"] = rs["original_max_position_embeddings"]
    if family == "llama":
        s["qkv_bias"] = s["o_bias"] = bool(cfg.attention_bias)
    if family == "mistral" and cfg.sliding_window:
        s["sliding_window"] = cfg.sliding_window
    return s


def base_config(**over):
    """A tiny model: 2 layers, width 64, 8 query heads of 8 over 2 key/value heads."""
    c = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    c.update(over)
    return c
