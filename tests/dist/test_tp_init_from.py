"""model.init_from (a Hugging Face directory written by transformers' save_pretrained) with tensor
parallelism: every shard reads each whole tensor and takes its own piece (q/k/v, MLP and
vocabulary rows by the grid, kv heads replicated where tp > n_kv_head, norms whole), and the
job follows the tp 1 job started from the same directory: the first loss within 1e-6 relative
(it is computed from the loaded weights alone, before any update), then 10 steps within
test_tp_parity's tolerances (losses 1e-6, gradient norms and final weights 1e-5). The tp 1 job's
first loss is also PyTorch's loss of the Hugging Face model on the same first batch within 1e-5,
so the tp 1 reference itself starts from the directory's weights. GPT-2 (the LM head tied to the
vocabulary-parallel embedding; the file's lm_head.weight checked against it whole) at tp 2 and
dp 2 x tp 2, Llama with grouped-query attention (8 heads, 2 kv heads, untied head) at tp 2 and
tp 4 (each kv head on two ranks)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pyvenv  # noqa: E402

pyvenv.reexec_in_venv()

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker  # noqa: E402
from tpref import GLOBAL, compare, job, train, write_text  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
torch.set_num_threads(1)
T = 16


def save(d, name, model_class, cfg):
    torch.manual_seed(7)
    model = model_class(cfg).float()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.copy_((1.0 if "norm" in pname or "ln_" in pname else 0.0) +
                    0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(f"{d}/{name}")
    return model


def first_batch_loss(d, model):
    """PyTorch's loss on the first step's batch: ztrain's data order with shuffle off is the
    file's sequences in order, each T + 1 bytes (inputs and shifted targets) apart by T."""
    with open(f"{d}/train.txt", "rb") as f:
        data = torch.tensor(list(f.read()[:GLOBAL * T + 1]))
    x = data[:-1].view(GLOBAL, T)
    y = data[1:].view(GLOBAL, T)
    with torch.no_grad():
        logits = model(x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             y.reshape(-1)).item()


def from_hf(name, tp, dp, ckpt, zero=0):
    spec = job({"init_from": name, "block_size": T}, tp, dp, ckpt, zero=zero)
    spec["data"]["shuffle"] = False
    return spec


def first(ck, what, ref, got):
    err = abs(got[0][0] - ref[0][0]) / abs(ref[0][0])
    ck.check(err <= 1e-6, f"{what}: first loss {got[0][0]:.7f} against tp 1's {ref[0][0]:.7f} "
             f"(rel err {err:.1e})")


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    write_text(d)
    gpt2 = save(d, "hf-gpt2", GPT2LMHeadModel,
                GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=256, n_positions=T,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    llama = save(d, "hf-llama", LlamaForCausalLM,
                 LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                             max_position_embeddings=T, rms_norm_eps=1e-5,
                             tie_word_embeddings=False))
    for name, model, grids in (("GPT-2", gpt2, ((2, 1, 0), (2, 2, 1))),
                               ("Llama GQA", llama, ((2, 1, 1), (4, 1, 1)))):
        hf = "hf-" + name.split()[0].lower().replace("-", "")
        ref = train(d, f"{hf}-tp1", from_hf(hf, 1, 1, f"ck-{hf}-tp1"))
        torch_loss = first_batch_loss(d, model)
        err = abs(ref[0][0] - torch_loss) / torch_loss
        ck.check(err <= 1e-5, f"{name} from {hf}, tp 1: first loss {ref[0][0]:.6f}, PyTorch's "
                 f"{torch_loss:.6f} (rel err {err:.1e})")
        for tp, dp, zero in grids:
            got = train(d, f"{hf}-{dp}x{tp}", from_hf(hf, tp, dp, f"ck-{hf}-{dp}x{tp}", zero))
            what = f"{name} from {hf} at dp {dp} x tp {tp} (ZeRO {zero})"
            first(ck, what, ref, got)
            compare(ck, what, ref, got)
ck.done()
