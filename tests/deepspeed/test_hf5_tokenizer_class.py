"""Tokenizer directories that transformers 5 writes, read by ztrain as transformers 5 reads them
(.venv-ds): a fast tokenizer saved by 5.x names its class "TokenizersBackend", and 5.x's
from_pretrained drops add_bos_token/add_eos_token whenever tokenizer.json is there, so
tokenizer.json's post-processor is the template. For each flag combination written into the
saved tokenizer_config.json (absent, true, false), ztrain's ids (zt_tok_tool, the loader every
encoder uses) must equal AutoTokenizer.from_pretrained(dir)(text)["input_ids"] of transformers
5, and `ztrain prepare` must accept the directory.

Run: ZTRAIN_BUILD=<build dir> python3 tests/deepspeed/test_hf5_tokenizer_class.py
(make test-deepspeed)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv(".venv-ds", "scripts/install-deps.sh deepspeed")
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

import toktool  # noqa: E402
from ztref import Checker, tool  # noqa: E402

transformers.logging.set_verbosity_error()
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France."] * 20
TEXTS = ["Hello world", "What is the capital of France? Paris.", " x"]


def make_dir(d):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(d)


def main():
    ck = Checker()
    top = tempfile.mkdtemp(prefix="ztrain-hf5-tokclass-")
    base = os.path.join(top, "saved")
    make_dir(base)
    with open(f"{base}/tokenizer_config.json") as f:
        saved = json.load(f)
    ck.check(saved.get("tokenizer_class") == "TokenizersBackend",
             f"transformers {transformers.__version__} names the class TokenizersBackend "
             f"({saved.get('tokenizer_class')})")
    for bos in (None, True, False):
        for eos in (None, True, False):
            what = f"add_bos_token {bos}, add_eos_token {eos}"
            cfg = dict(saved)
            for key, v in (("add_bos_token", bos), ("add_eos_token", eos)):
                if v is not None:
                    cfg[key] = v
            with open(f"{base}/tokenizer_config.json", "w") as f:
                json.dump(cfg, f)
            hf = AutoTokenizer.from_pretrained(base)
            want = [hf(t)["input_ids"] for t in TEXTS]
            got, err = toktool.encode(f"{base}/tokenizer.json", TEXTS)
            ck.check(got == want, f"{what}: ztrain's ids are transformers 5's ({got or err} vs "
                     f"{want})")
            p = subprocess.run([tool("ztrain"), "prepare", "--tokenizer",
                                f"{base}/tokenizer.json", "--out", f"{top}/out", "--overwrite",
                                f"{base}/tokenizer_config.json"], capture_output=True, text=True)
            ck.check(p.returncode == 0, f"{what}: ztrain prepare takes the directory "
                     f"({p.stderr.strip()[-300:]})")
    ck.done()


main()
