"""Weights survive the trip Hugging Face file -> `ztrain run` (init_from) -> checkpoint ->
`ztrain export` -> safetensors, bit for bit, under Hugging Face names and layouts; and
`ztrain sample` generates from the checkpoint what the same weights give in PyTorch.

The input file is written the way a Hugging Face GPT2LMHeadModel state dict is named: a
"transformer." prefix, the h.N.attn.bias causal-mask buffers (and the older h.N.attn.masked_bias),
and an lm_head.weight tied to wte. One optimizer step with lr 0 and weight decay 0 leaves every
weight unchanged, so the export must equal the input exactly.

An export interrupted by SIGINT or SIGTERM while its temporary output exists (FILE.tmp for --out,
DIR.tmp-PID/ for --hf) removes it and ends killed by the signal, as `ztrain prepare` does with its
.tmp shards: the process is stopped (SIGSTOP) the moment the temporary name appears, signalled,
and continued."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import torch  # noqa: E402

from ztref import (Checker, gpt2_forward, gpt2_random_params, gpt2_shapes, read_metrics,  # noqa: E402
                   st_read, tool, write_job)

sys.stdout.reconfigure(line_buffering=True)
torch.set_num_threads(2)
ZTRAIN = tool("ztrain")
L, NH, C, V, T = 2, 2, 32, 256, 32
MICRO = 2
TEXT = (b"Call me Ishmael. Some years ago - never mind how long precisely - having little or no "
        b"money in my purse, and nothing particular to interest me on shore.\n" * 40)[:6000]

ck = Checker()


def ztrain(args, timeout=60):
    p = subprocess.run([ZTRAIN] + [str(a) for a in args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def stopped(pid, timeout=10):
    """Waits until the process is in the stopped state (SIGSTOP is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
        except OSError:
            return
        time.sleep(0.001)


def interrupted_export(what, args, tmp_of, sig):
    """Runs `ztrain export ARGS`, stops it once tmp_of(pid) exists and sends sig; checks that it
    dies of sig leaving neither the temporary output nor the final one (args[-1])."""
    final = args[-1]
    for _ in range(20):
        p = subprocess.Popen([ZTRAIN, "export"] + [str(a) for a in args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        tmp = tmp_of(p.pid)
        while p.poll() is None and not os.path.exists(tmp):
            pass
        if p.poll() is None:
            p.send_signal(signal.SIGSTOP)
            stopped(p.pid)
            # Caught only if it was stopped while its temporary output still stood: on a loaded
            # machine it can finish (rename) between the sighting and the stop.
            if os.path.exists(tmp) and not os.path.exists(final):
                break
            p.send_signal(signal.SIGCONT)
        # Finished before it was caught: start again from nothing.
        p.wait()
        for path in (final, tmp):
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    else:
        ck.check(False, f"{what}: the export always finished before its temporary output was seen")
        return
    caught = os.path.exists(tmp)
    p.send_signal(sig)
    p.send_signal(signal.SIGCONT)
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    err = p.stderr.read().decode("utf-8", "replace")
    p.stderr.close()
    ck.check(caught and p.returncode == -sig and not os.path.exists(tmp) and
             not os.path.exists(final),
             f"{what}: killed by signal {-p.returncode if p.returncode < 0 else p.returncode} "
             f"(want {int(sig)}), {os.path.basename(tmp)} "
             f"{'left behind' if os.path.exists(tmp) else 'removed'}, "
             f"{os.path.basename(final)} {'written' if os.path.exists(final) else 'not written'} "
             f"{err.strip()[:200]}")


def bits(t):
    """The raw bit pattern, so -0.0 vs 0.0 and NaN payloads count as differences."""
    return t.contiguous().view(torch.int32)


def st_write_hf(path, tensors):
    """ztref.st_write, extended to 0-dim tensors (HF's attn.masked_bias is a scalar)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().float()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def hf_state_dict(params):
    """params (ztrain/HF short names) as a GPT2LMHeadModel state dict names and holds them."""
    sd = {}
    for name, t in params.items():
        sd["transformer." + name] = t
        if name.endswith("attn.c_proj.bias"):
            layer = name.split(".")[1]
            sd[f"transformer.h.{layer}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
            sd[f"transformer.h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    sd["lm_head.weight"] = params["wte.weight"].clone()
    return sd


top = tempfile.mkdtemp(prefix="ztrain-export-")
try:
    params = gpt2_random_params(L, C, V, T, seed=11)
    st_write_hf(os.path.join(top, "hf_gpt2.safetensors"), hf_state_dict(params))
    with open(os.path.join(top, "train.txt"), "wb") as f:
        f.write(TEXT)
    write_job(os.path.join(top, "job.json"), {
        "name": "export-roundtrip",
        "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
                  "block_size": T, "init_from": "hf_gpt2.safetensors"},
        "data": {"train": "train.txt", "shuffle": False},
        "train": {"max_steps": 1, "log_interval": 1, "warmup_steps": 0, "checkpoint_dir": "ckpt"},
        "deepspeed": {"train_micro_batch_size_per_gpu": MICRO,
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}},
    })
    rc, out, err = ztrain(["run", os.path.join(top, "job.json"), "--out", os.path.join(top, "run"),
                           "--threads", "2"])
    ck.check(rc == 0, f"ztrain run with init_from (HF names, prefix, mask buffers, lm_head): exit {rc}"
             + ("" if rc == 0 else f" -- {err.strip()[-300:]}"))
    if rc != 0:
        raise SystemExit(1)
    ckpt = os.path.join(top, "ckpt")

    # The first step's loss is the loss of the loaded weights on the first two samples (no
    # shuffle: sample i is bytes [i*T, i*T+T]), which shows init_from was really used.
    tokens = torch.tensor(list(TEXT), dtype=torch.long)
    x = torch.stack([tokens[i * T:i * T + T] for i in range(MICRO)])
    y = torch.stack([tokens[i * T + 1:i * T + T + 1] for i in range(MICRO)])
    ref64 = {k: v.double() for k, v in params.items()}
    ref_loss = torch.nn.functional.cross_entropy(gpt2_forward(ref64, x, L, NH).reshape(-1, V),
                                                 y.reshape(-1)).item()
    m = read_metrics(os.path.join(top, "run", "metrics.jsonl"))
    got_loss = m[0]["train/loss"] if m else float("nan")
    e = abs(got_loss - ref_loss) / ref_loss
    ck.check(e < 1e-5, f"step 1 loss {got_loss:.6f} vs PyTorch on the HF weights {ref_loss:.6f} "
             f"(rel {e:.1e})")

    exported_path = os.path.join(top, "model.safetensors")
    rc, out, err = ztrain(["export", ckpt, "--out", exported_path])
    ck.check(rc == 0 and os.path.exists(exported_path), f"ztrain export: exit {rc}"
             + ("" if rc == 0 else f" -- {err.strip()[-300:]}"))
    if rc != 0:
        raise SystemExit(1)

    # The file itself, read by the spec: header length, then tensors packed back to back.
    with open(exported_path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    exported, meta = st_read(exported_path)
    data_bytes = sum(t.numel() * t.element_size() for t in exported.values())
    ck.check(len(raw) == 8 + hlen + data_bytes,
             f"file size {len(raw)} = 8 + header {hlen} + tensor data {data_bytes}")

    want = gpt2_shapes(L, C, V, T)
    ck.check(set(exported) == set(want),
             f"tensor names are exactly the {len(want)} HF GPT-2 parameters, no prefix, no mask "
             f"buffers, no lm_head (extra: {sorted(set(exported) - set(want))[:4]}, "
             f"missing: {sorted(set(want) - set(exported))[:4]})")
    for name in sorted(want):
        t = exported.get(name)
        if t is None:
            continue
        ok = (t.dtype == torch.float32 and tuple(t.shape) == want[name]
              and torch.equal(bits(t), bits(params[name])))
        detail = "" if ok else (f" (dtype {t.dtype}, shape {tuple(t.shape)}, max diff "
                                f"{(t.double() - params[name].double()).abs().max().item() if t.shape == params[name].shape else 'n/a'})")
        ck.check(ok, f"{name} {list(want[name])}: bit-identical to the input{detail}")
    ck.check(tuple(exported.get("h.0.attn.c_attn.weight", torch.empty(0)).shape) == (C, 3 * C),
             f"h.0.attn.c_attn.weight is [in, out] = [{C}, {3 * C}] (HF Conv1D layout)")

    dims = {"n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V, "block_size": T}
    for k, v in dims.items():
        ck.check(str(meta.get(k)) == str(v), f"metadata {k} = {meta.get(k)!r} (want '{v}')")

    # Logits of the exported weights and of the original weights, same code, same input.
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(5))
    if set(exported) == set(want):
        a = gpt2_forward(exported, idx, L, NH)
        b = gpt2_forward(params, idx, L, NH)
        ck.check(torch.equal(a, b), f"logits from the exported weights equal the original's "
                 f"(max diff {(a - b).abs().max().item():.1e})")
    else:
        ck.check(False, "logits from the exported weights (tensors missing, not computed)")

    # Interrupted exports clean up after themselves (one tensor a shard: many files to write).
    cut = os.path.join(top, "cut.safetensors")
    interrupted_export("export --out interrupted by SIGINT", [ckpt, "--out", cut],
                       lambda pid: cut + ".tmp", signal.SIGINT)
    cut_hf = os.path.join(top, "cut-hf")
    interrupted_export("export --hf interrupted by SIGTERM",
                       [ckpt, "--max-shard-size", "1000", "--hf", cut_hf],
                       lambda pid: f"{cut_hf}.tmp-{pid}", signal.SIGTERM)
    interrupted_export("export --hf interrupted by SIGINT",
                       [ckpt, "--max-shard-size", "1000", "--hf", cut_hf],
                       lambda pid: f"{cut_hf}.tmp-{pid}", signal.SIGINT)
    left = [n for n in os.listdir(top) if n.startswith(("cut.", "cut-hf"))]
    ck.check(not left, f"no temporary export is left in the directory ({left})")

    # Sampling from the checkpoint: the prompt echoed, then exactly 20 bytes, then a newline.
    rc, out, err = ztrain(["sample", ckpt, "--prompt", "ab", "--tokens", "20"])
    ck.check(rc == 0 and out[:2] == b"ab" and len(out) == 2 + 20 + 1 and out[-1:] == b"\n",
             f"sample --prompt ab --tokens 20: exit {rc}, prints 'ab' + 20 bytes + newline "
             f"(got {len(out)} bytes: {out[:30]!r})" + ("" if rc == 0 else f" -- {err.strip()}"))
    rc2, out2, _ = ztrain(["sample", ckpt, "--prompt", "ab", "--tokens", "20"])
    ck.check(rc2 == 0 and out2 == out, "sampling again with the same (default) seed gives the same bytes")

    # Greedy decoding (top-k 1) must pick PyTorch's argmax at every position, including past
    # block_size, where the context is the last block_size tokens.
    n_new = 40
    rc, out, err = ztrain(["sample", ckpt, "--prompt", "ab", "--tokens", n_new, "--top-k", "1"])
    seq = [ord("a"), ord("b")]
    with torch.no_grad():
        for _ in range(n_new):
            ctx = torch.tensor([seq[-T:]])
            seq.append(int(gpt2_forward(ref64, ctx, L, NH)[0, -1].argmax()))
    expected = bytes(seq) + b"\n"
    first_diff = next((i for i in range(min(len(out), len(expected))) if out[i] != expected[i]),
                      None)
    ck.check(rc == 0 and out == expected,
             f"greedy sample of {n_new} tokens (past block_size {T}) equals PyTorch's argmax "
             f"decoding" + ("" if out == expected else
                            f" (first difference at byte {first_diff}; got {out[:50]!r}, "
                            f"want {expected[:50]!r}; {err.strip()})"))
finally:
    shutil.rmtree(top, ignore_errors=True)

ck.done()
