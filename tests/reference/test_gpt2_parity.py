"""GPT-2 forward and backward against PyTorch: logits, loss and every parameter gradient of a
small model, relative error under 1e-5 (the reference runs in float64)."""
import tempfile

import torch

from ztref import Checker, gpt2_forward, gpt2_random_params, rel_err, run, st_read, st_write, tool

torch.set_num_threads(2)
L, NH, C, V, BLOCK = 2, 4, 64, 97, 32
B, T = 3, 32  # T = block_size; a second case below uses a shorter T

ck = Checker()
for case, (b, t) in enumerate([(B, T), (2, 17)]):
    with tempfile.TemporaryDirectory() as d:
        params = gpt2_random_params(L, C, V, BLOCK, seed=case)
        st_write(f"{d}/w.safetensors", params)
        g = torch.Generator().manual_seed(100 + case)
        inputs = torch.randint(0, V, (b, t), generator=g, dtype=torch.int32)
        targets = torch.randint(0, V, (b, t), generator=g, dtype=torch.int32)
        with open(f"{d}/batch.i32", "wb") as f:
            f.write(inputs.numpy().tobytes() + targets.numpy().tobytes())
        run([tool("zt_gpt2_check"), f"{d}/w.safetensors", f"{d}/batch.i32", d, L, NH, C, V, BLOCK, b, t])

        ref = {k: v.double().requires_grad_(True) for k, v in params.items()}
        logits = gpt2_forward(ref, inputs.long(), L, NH)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.long().view(-1))
        loss.backward()

        got_logits = torch.from_numpy(
            __import__("numpy").fromfile(f"{d}/logits.f32", dtype="float32")).view(b, t, V)
        e = rel_err(got_logits, logits.detach())
        ck.check(e < 1e-5, f"case {case} B={b} T={t}: logits rel err {e:.2e}")
        got_loss = float(open(f"{d}/loss.txt").read())
        e = abs(got_loss - loss.item()) / abs(loss.item())
        ck.check(e < 1e-5, f"case {case}: loss {got_loss:.7f} vs torch {loss.item():.7f} (rel {e:.2e})")
        grads, _ = st_read(f"{d}/grads.safetensors")
        ck.check(set(grads) == set(params), f"case {case}: gradient tensor names match the parameters")
        worst = max((rel_err(grads[n], ref[n].grad), n) for n in params)
        for n in params:
            e = rel_err(grads[n], ref[n].grad)
            if e >= 1e-5:
                ck.check(False, f"case {case}: grad {n} rel err {e:.2e}")
        ck.check(worst[0] < 1e-5, f"case {case}: all {len(params)} gradients, worst {worst[1]} rel err {worst[0]:.2e}")
ck.done()
