"""Llama, Mistral and Qwen2 directories in and out, against transformers.

For each variant (Llama 3 with GQA, llama3 rope scaling, head_dim apart from n_embd / n_head and
attention biases; Mistral with a sliding window; Qwen2 with q/k/v biases and a tied head), a
model saved by save_pretrained in shards (fp32 or bf16) is a job's whole model section with only
block_size beside it: zt_model_check's logits of the directory equal transformers' (float64,
eager) within 1e-5, and `ztrain run`'s first loss equals transformers' loss on the same batch.
The run's checkpoint exported with `ztrain export --hf --max-shard-size` is read back by
from_pretrained: the same config (every architecture key), the same tensors bit for bit (lr 0),
and logits equal to ztrain's own of the exported directory within 1e-5. A rope_scaling of type
"default" (as rope_type or type; Llama, Qwen2, Mistral) gives transformers' plain-RoPE logits."""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from llama_ref import CLASSES, base_config, hf_model  # noqa: E402
from ztref import (Checker, first_loss_from_hf, model_check_logits, read_metrics, rel_err, run,  # noqa: E402
                   tool, write_job, write_llmc_tokens)

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
torch.set_num_threads(2)
BLOCK, B = 16, 2
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
CASES = [
    ("llama3 GQA, head_dim 16, attention_bias, bf16 shards", "llama", torch.bfloat16,
     base_config(head_dim=16, rope_scaling=LLAMA3, rope_theta=500000.0, attention_bias=True)),
    ("mistral sliding window 5", "mistral", torch.float32, base_config(sliding_window=5)),
    ("qwen2 q/k/v biases, tied head", "qwen2", torch.float32,
     base_config(num_key_value_heads=4, tie_word_embeddings=True, use_sliding_window=False)),
]
# The keys from_pretrained builds the architecture from; export must give them back.
ARCH_KEYS = ["model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "hidden_size", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta",
             "rope_scaling", "tie_word_embeddings", "head_dim", "attention_bias", "mlp_bias",
             "hidden_act", "sliding_window", "use_sliding_window"]

ck = Checker()


def ztrain_logits(d, init_from, inputs):
    return model_check_logits(d, init_from, inputs, tail=300)


for i, (what, family, dtype, config) in enumerate(CASES):
    model = hf_model(family, 30 + i, **config)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(200 + i)
    tokens = torch.randint(0, V, (B * BLOCK + 1,), generator=g)
    inputs = torch.stack([tokens[j * BLOCK:j * BLOCK + BLOCK] for j in range(B)]).to(torch.int32)
    targets = torch.stack([tokens[j * BLOCK + 1:j * BLOCK + BLOCK + 1] for j in range(B)])
    with tempfile.TemporaryDirectory() as d:
        hf_dir = f"{d}/hf"
        model.to(dtype).save_pretrained(hf_dir, max_shard_size="40KB", safe_serialization=True)
        n_shards = len(glob.glob(f"{hf_dir}/model-*.safetensors"))
        ck.check(n_shards > 1, f"{what}: save_pretrained wrote {n_shards} shards")
        cls = CLASSES[family][1]
        ref = cls.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="eager")
        ref = ref.double().eval()
        with torch.no_grad():
            want = ref(input_ids=inputs.long()).logits
        want_loss = torch.nn.functional.cross_entropy(want.reshape(-1, V), targets.reshape(-1)).item()

        got, why = ztrain_logits(d, "hf", inputs)
        e = rel_err(got.view(B, BLOCK, V), want) if got is not None else float("nan")
        ck.check(got is not None and e < 1e-5, f"{what}: logits of the directory, config.json "
                 f"filling the spec: rel err {e:.2e} {why}")

        # One step at lr 0 through `ztrain run`: the first loss is transformers', and the
        # checkpoint holds the loaded weights.
        write_llmc_tokens(f"{d}/train.bin", tokens.tolist() * 4)
        write_job(f"{d}/job.json", {
            "model": {"init_from": "hf", "block_size": BLOCK},
            "data": {"train": "train.bin", "shuffle": False},
            "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0,
                      "checkpoint_dir": "ckpt"},
            "deepspeed": {"train_micro_batch_size_per_gpu": B,
                          "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}}})
        p = run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"], check=False)
        m = read_metrics(f"{d}/run/metrics.jsonl") if p.returncode == 0 else []
        loss = m[0]["train/loss"] if m else float("nan")
        e = abs(loss - want_loss) / want_loss
        ck.check(p.returncode == 0 and e < 1e-5, f"{what}: `ztrain run` first loss {loss:.6f} vs "
                 f"transformers {want_loss:.6f} (rel {e:.1e}) {p.stderr.strip()[-200:]}")
        if p.returncode != 0:
            continue

        out = f"{d}/exported"
        p = run([tool("ztrain"), "export", f"{d}/ckpt", "--hf", out, "--max-shard-size", "40KB"],
                check=False)
        ck.check(p.returncode == 0 and len(glob.glob(f"{out}/model-*.safetensors")) > 1,
                 f"{what}: export --hf, sharded: exit {p.returncode} {p.stderr.strip()[-200:]}")
        if p.returncode != 0:
            continue
        src = json.load(open(f"{hf_dir}/config.json"))
        exp = json.load(open(f"{out}/config.json"))
        # head_dim and num_key_value_heads are written resolved; transformers resolves them too.
        differ = {k: (src.get(k), exp.get(k)) for k in ARCH_KEYS
                  if k in src and src.get(k) != exp.get(k)}
        ck.check(not differ and exp["architectures"] == [cls.__name__],
                 f"{what}: config.json gives back every architecture key ({differ}), "
                 f"architectures {exp.get('architectures')}")
        # A float stays a float (8.0, not 8): transformers' rope validation warns on an int.
        def flat(c):
            return {**c, **{"rope_scaling." + k: v
                            for k, v in (c.get("rope_scaling") or {}).items()}}
        not_float = {k: flat(exp)[k] for k, v in flat(src).items()
                     if isinstance(v, float) and k in flat(exp)
                     and not isinstance(flat(exp)[k], float)}
        ck.check(not not_float, f"{what}: the source's floats are floats in the export, not "
                 f"integers: {not_float}")
        back = cls.from_pretrained(out, attn_implementation="eager").eval()
        orig = cls.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="eager")
        sd_back, sd_orig = back.state_dict(), orig.state_dict()
        same = set(sd_back) == set(sd_orig) and all(torch.equal(sd_back[k], sd_orig[k])
                                                    for k in sd_orig)
        ck.check(same, f"{what}: from_pretrained(exported) holds the loaded weights bit for bit")
        with torch.no_grad():
            hl = back.double()(input_ids=inputs.long()).logits
        zl, why = ztrain_logits(d, "exported", inputs)
        e = rel_err(zl.view(B, BLOCK, V), hl) if zl is not None else float("nan")
        ck.check(zl is not None and e < 1e-5, f"{what}: from_pretrained(exported) logits vs "
                 f"ztrain's of the same directory: rel err {e:.2e} {why}")

# Qwen2's sliding window covers layer i when use_sliding_window and i >= max_window_layers: the
# rule of transformers' flash-attention path (modeling_qwen2 4.46, Qwen2FlashAttention2) and of
# transformers 5's layer_types. max_window_layers at num_hidden_layers (or the default 28 above
# a 2-layer model) windows no layer; 0 windows every one. 4.46's eager and sdpa paths window
# every layer whatever max_window_layers says ("Sliding Window Attention is enabled but not
# implemented for `eager`"), so the reference for "no layer" is the same weights with
# use_sliding_window false, and for "every layer" the eager model as saved. A window of 4 under
# a 16-token block changes the logits, so each case tells the two apart.
for i, (what, mwl, windowed) in enumerate([
        ("qwen2 use_sliding_window, max_window_layers = num_hidden_layers", 2, False),
        ("qwen2 use_sliding_window, max_window_layers absent (28)", None, False),
        ("qwen2 use_sliding_window, max_window_layers 0", 0, True)]):
    cfg = base_config(num_key_value_heads=4, use_sliding_window=True, sliding_window=4)
    if mwl is not None:
        cfg["max_window_layers"] = mwl
    model = hf_model("qwen2", 70 + i, **cfg)
    cls = CLASSES["qwen2"][1]
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(270 + i)
    tokens = torch.randint(0, V, (B * BLOCK + 1,), generator=g)
    inputs = torch.stack([tokens[j * BLOCK:j * BLOCK + BLOCK] for j in range(B)]).to(torch.int32)
    targets = torch.stack([tokens[j * BLOCK + 1:j * BLOCK + BLOCK + 1] for j in range(B)])
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(f"{d}/hf", safe_serialization=True)
        if mwl is None:
            c = json.load(open(f"{d}/hf/config.json"))
            del c["max_window_layers"]
            json.dump(c, open(f"{d}/hf/config.json", "w"))
        # from_pretrained sets its keyword arguments after Qwen2Config.__init__, so the window
        # goes by sliding_window=None (what __init__ makes of use_sliding_window false).
        with torch.no_grad():
            every, none = (cls.from_pretrained(f"{d}/hf", attn_implementation="eager", **over)
                           .double().eval()(input_ids=inputs.long()).logits
                           for over in ({}, {"sliding_window": None}))
        want, wrong = (every, none) if windowed else (none, every)
        want_loss = torch.nn.functional.cross_entropy(want.reshape(-1, V),
                                                      targets.reshape(-1)).item()
        got, why = ztrain_logits(d, "hf", inputs)
        e = rel_err(got.view(B, BLOCK, V), want) if got is not None else float("nan")
        ck.check(got is not None and e < 1e-5 and rel_err(wrong, want) > 1e-3,
                 f"{what}: logits with {'every' if windowed else 'no'} layer windowed: rel err "
                 f"{e:.2e} (the other reading differs by {rel_err(wrong, want):.1e}) {why}")
        loss, p = first_loss_from_hf(d, "hf", tokens.tolist() * 4, B, BLOCK)
        e = abs(loss - want_loss) / want_loss
        ck.check(p.returncode == 0 and e < 1e-5, f"{what}: `ztrain run` first loss {loss:.7f} vs "
                 f"transformers {want_loss:.7f} (rel {e:.1e}) {p.stderr.strip()[-200:]}")
        if p.returncode != 0:
            continue
        p = run([tool("ztrain"), "export", f"{d}/ckpt", "--hf", f"{d}/exported"], check=False)
        ck.check(p.returncode == 0, f"{what}: export --hf: {p.stderr.strip()[-200:]}")
        if p.returncode != 0:
            continue
        exp = json.load(open(f"{d}/exported/config.json"))
        # What the export says, read by transformers 4's flash rule and 5's layer_types.
        use = exp.get("use_sliding_window") and exp.get("sliding_window") is not None
        rule = [bool(use) and j >= exp.get("max_window_layers", 28) for j in range(2)]
        five = [t == "sliding_attention" for t in exp.get("layer_types", [])]
        ck.check(rule == [windowed] * 2 and five == rule,
                 f"{what}: the export windows {rule} by max_window_layers, {five} by "
                 f"layer_types (want {[windowed] * 2})")
        back = cls.from_pretrained(f"{d}/exported", attn_implementation="eager").double().eval()
        with torch.no_grad():
            e = rel_err(back(input_ids=inputs.long()).logits, want)
        ck.check(e < 1e-12, f"{what}: transformers loads the export as the same model: logits "
                 f"rel err {e:.2e}")

# rope_scaling of type "default" (under either name, with a member the type does not read) is
# plain RoPE in transformers (ROPE_INIT_FUNCTIONS["default"]; 4.46's Mistral reads no
# rope_scaling at all): ztrain reads it as no scaling, like null.
for i, (family, rs) in enumerate([("llama", {"rope_type": "default"}),
                                  ("llama", {"type": "default"}),
                                  ("qwen2", {"rope_type": "default", "factor": 4.0}),
                                  ("mistral", {"rope_type": "default"})]):
    model = hf_model(family, 80 + i, **base_config(rope_theta=500.0))
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(280 + i)
    inputs = torch.randint(0, V, (B, BLOCK), generator=g).to(torch.int32)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(f"{d}/hf", safe_serialization=True)
        c = json.load(open(f"{d}/hf/config.json"))
        c["rope_scaling"] = rs
        json.dump(c, open(f"{d}/hf/config.json", "w"))
        ref = CLASSES[family][1].from_pretrained(f"{d}/hf", attn_implementation="eager")
        with torch.no_grad():
            want = ref.double().eval()(input_ids=inputs.long()).logits
        got, why = ztrain_logits(d, "hf", inputs)
        e = rel_err(got.view(B, BLOCK, V), want) if got is not None else float("nan")
        ck.check(got is not None and e < 1e-5, f"{family} rope_scaling {rs}: logits vs "
                 f"transformers: rel err {e:.2e} {why}")

# A directory of a configuration ztrain refuses fails when the job is read, naming the key.
with tempfile.TemporaryDirectory() as d:
    hf_model("llama", 40, **base_config(mlp_bias=True)).save_pretrained(f"{d}/hf")
    write_job(f"{d}/job.json", {"model": {"init_from": "hf", "block_size": BLOCK},
                                "data": {"train": "train.bin"},
                                "deepspeed": {"train_micro_batch_size_per_gpu": 1}})
    p = subprocess.run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run"],
                       capture_output=True, text=True)
    ck.check(p.returncode == 1 and "config.json" in p.stderr and "'mlp_bias'" in p.stderr
             and not os.path.exists(f"{d}/run/metrics.jsonl"),
             f"mlp_bias true: exit {p.returncode}, {p.stderr.strip()[:200]}")

ck.done()
