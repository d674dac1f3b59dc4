"""Anomaly events and their policies in `ztrain run`, against the same training in PyTorch.

A GPT-2 learns a repeating pattern; step 5's gradients are made NaN (ZTRAIN_INJECT_NAN_GRAD) and
step 12's batch is random tokens (a different distribution: a loss spike). With the policy
"skip" for both, every step's loss must equal PyTorch's training that leaves out exactly those two
updates (and not the training that applies the spike's), events.jsonl must name both events, and
train/skipped_steps must count them. With "checkpoint_and_stop" on the spike, the run must fail
naming the event, with a checkpoint of step 12 whose weights are PyTorch's after step 11. A
skipped step's record shows its own train/grad_norm (PyTorch's for the spike, null for the NaN
step), not the step before's."""
import json
import os
import tempfile

import torch

from ztref import (Checker, gpt2_forward, gpt2_random_params, read_metrics, run, st_read,
                   st_write, tool, write_job, write_llmc_tokens)

torch.set_num_threads(1)
L, NH, C, V, T = 2, 4, 64, 97, 32
MICRO, STEPS = 4, 16
LR, MOMENTUM = 0.1, 0.9
NAN_STEP, SPIKE_STEP = 5, 12

ck = Checker()
g = torch.Generator().manual_seed(7)
pattern = torch.randint(0, V, (50,), generator=g)
tokens = pattern.repeat(STEPS * MICRO * T // 50 + 2)
noise = torch.rand(tokens.shape, generator=g) < 0.05
tokens[noise] = torch.randint(0, V, (int(noise.sum()),), generator=g)
lo, hi = (SPIKE_STEP - 1) * MICRO * T, SPIKE_STEP * MICRO * T
tokens[lo:hi] = torch.randint(0, V, (hi - lo,), generator=g)
params = gpt2_random_params(L, C, V, T, seed=3)


def job(d, policy, extra_train=None):
    train = {"max_steps": STEPS, "log_interval": 1, "warmup_steps": 0}
    train.update(extra_train or {})
    return {
        "name": "events",
        "model": {"type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
                  "block_size": T, "init_from": "init.safetensors"},
        "data": {"train": "train.bin", "shuffle": False},
        "train": train,
        "events": {"nonfinite": {"policy": "skip"},
                   "loss_spike": {"zscore": 3, "window": 6, "policy": policy}},
        "deepspeed": {
            "train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 0,
            "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": MOMENTUM}}}}


def torch_run(skip, steps, keep=()):
    """Per-step losses and global gradient norms of the reference, leaving out the updates of the
    steps in `skip` (their gradients are dropped; the momentum buffer is left as it was), and its
    parameters after each step in `keep`."""
    ref = {k: v.double().clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.SGD(list(ref.values()), lr=LR, momentum=MOMENTUM)
    losses, norms, kept = [], [], {}
    for step in range(1, steps + 1):
        starts = [((step - 1) * MICRO + i) * T for i in range(MICRO)]
        x = torch.stack([tokens[s:s + T] for s in starts])
        y = torch.stack([tokens[s + 1:s + T + 1] for s in starts])
        loss = torch.nn.functional.cross_entropy(gpt2_forward(ref, x, L, NH).reshape(-1, V),
                                                 y.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        norms.append(torch.sqrt(sum((v.grad ** 2).sum() for v in ref.values())).item())
        if step not in skip:
            opt.step()
        opt.zero_grad()
        if step in keep:
            kept[step] = {k: v.detach().clone() for k, v in ref.items()}
    return losses, norms, kept


with tempfile.TemporaryDirectory() as d:
    write_llmc_tokens(f"{d}/train.bin", tokens.tolist())
    st_write(f"{d}/init.safetensors", params)
    env = dict(os.environ, ZTRAIN_INJECT_NAN_GRAD=str(NAN_STEP))

    # "skip": both updates left out, the run goes on.
    write_job(f"{d}/skip.json", job(d, "skip"))
    p = run([tool("ztrain"), "run", f"{d}/skip.json", "--out", f"{d}/skip", "--threads", "1"],
            env=env)
    got = read_metrics(f"{d}/skip/metrics.jsonl")
    with open(f"{d}/skip/events.jsonl") as f:
        events = [json.loads(line) for line in f if line.strip()]
    want, want_norms, _ = torch_run({NAN_STEP, SPIKE_STEP}, STEPS)
    applied, _, kept = torch_run({NAN_STEP}, STEPS, keep=(SPIKE_STEP - 1, SPIKE_STEP))
    ck.check(len(got) == STEPS, f"{len(got)} records")
    for step in range(1, STEPS + 1):
        m = got[step - 1]
        e = abs(m["train/loss"] - want[step - 1]) / want[step - 1]
        ck.check(e < 1e-4, f"step {step}: loss {m['train/loss']:.6f} vs torch with steps "
                           f"{NAN_STEP} and {SPIKE_STEP} skipped {want[step - 1]:.6f} (rel {e:.1e})")
    e = abs(got[SPIKE_STEP]["train/loss"] - applied[SPIKE_STEP]) / applied[SPIKE_STEP]
    ck.check(e > 1e-3, f"step {SPIKE_STEP + 1}: applying the spike's update would give another "
                       f"loss ({applied[SPIKE_STEP]:.6f}, rel {e:.1e})")
    ck.check(got[-1]["train/skipped_steps"] == 2, f"skipped_steps {got[-1]['train/skipped_steps']}")
    # A skipped step's record carries its own gradient norm (before: the step before's), and
    # counts itself in skipped_steps.
    spike_norm = got[SPIKE_STEP - 1]["train/grad_norm"]
    ck.check(spike_norm is not None and
             abs(spike_norm - want_norms[SPIKE_STEP - 1]) < 1e-3 * want_norms[SPIKE_STEP - 1],
             f"step {SPIKE_STEP}'s grad_norm is its own: {spike_norm} vs torch "
             f"{want_norms[SPIKE_STEP - 1]:.6f} (step before: {want_norms[SPIKE_STEP - 2]:.6f})")
    ck.check(got[NAN_STEP - 1]["train/grad_norm"] is None,
             f"step {NAN_STEP}'s NaN grad_norm is null: {got[NAN_STEP - 1]['train/grad_norm']}")
    ck.check([m["train/skipped_steps"] for m in got[NAN_STEP - 2:NAN_STEP]] == [0, 1] and
             [m["train/skipped_steps"] for m in got[SPIKE_STEP - 2:SPIKE_STEP]] == [1, 2],
             "each skipped step's record counts it")
    kinds = [(ev["kind"], ev["train/global_step"], ev["policy"]) for ev in events]
    ck.check(kinds == [("nonfinite", NAN_STEP, "skip"), ("loss_spike", SPIKE_STEP, "skip")],
             f"events.jsonl: {kinds}")
    spike = events[-1] if events else {}
    ck.check(spike.get("zscore") is not None and spike["zscore"] > 3 and
             abs(spike["value"] - want[SPIKE_STEP - 1]) < 1e-3 * want[SPIKE_STEP - 1],
             f"the spike event carries the loss and its z-score: {spike}")
    ck.check(f"event loss_spike: step {SPIKE_STEP}:" in p.stdout + p.stderr,
             "the progress output reports the event")

    # "checkpoint_and_stop": the run ends at the spike with a checkpoint of the weights before it.
    write_job(f"{d}/stop.json", job(d, "checkpoint_and_stop", {"checkpoint_dir": "ckpt"}))
    p = run([tool("ztrain"), "run", f"{d}/stop.json", "--out", f"{d}/stop", "--threads", "1"],
            env=env, check=False)
    out = p.stdout + p.stderr
    ck.check(p.returncode != 0, f"the stopped run exits {p.returncode}")
    ck.check(f"stopped at step {SPIKE_STEP} by the loss_spike event (policy checkpoint_and_stop)"
             in out, f"the error names the event: {out[-600:]}")
    with open(f"{d}/ckpt/latest") as f:
        tag = f.read().strip()
    with open(f"{d}/ckpt/{tag}/meta.json") as f:
        meta = json.load(f)
    ck.check(meta.get("global_steps", meta.get("step")) == SPIKE_STEP, f"checkpoint meta {meta}")
    saved, _ = st_read(f"{d}/ckpt/{tag}/model.safetensors")
    before, after = kept[SPIKE_STEP - 1], kept[SPIKE_STEP]
    worst = max((saved[k].double() - before[k]).abs().max().item() for k in before)
    moved = max((after[k] - before[k]).abs().max().item() for k in before)
    ck.check(worst < 1e-4, f"checkpoint weights = torch after step {SPIKE_STEP - 1} "
                           f"(max abs diff {worst:.2e})")
    ck.check(moved > 10 * worst, f"the spike's update would have moved them by {moved:.2e}")
ck.done()
