# %% [markdown]
# # ztrain from Python
#
# A notebook-style walk through the client (`pip install ./clients/python`): build a job spec,
# submit it to a running `ztraind`, follow it, read its metrics and logs. Each `# %%` is a cell
# (Jupyter, VS Code and `jupytext` read them); `python examples/python/quickstart.py` runs them
# all. The server's address and token come from ZTRAIN_ADDR and ZTRAIN_TOKEN, and the training
# text is `train.txt` under the server's data root (`ztraind --data-root`).

# %%
import os

import ztrain

client = ztrain.Client(os.environ.get("ZTRAIN_ADDR", "127.0.0.1:50051"),
                       token=os.environ.get("ZTRAIN_TOKEN"))

# %% [markdown]
# A job spec, typed: misspelt keys, bad shapes and DeepSpeed's batch rule are refused here,
# before anything is sent, with the field's path (`spec.model.n_embd`).

# %%
spec = (ztrain.JobSpec(name="quickstart", world_size=1)
        .model(type="gpt2", n_layer=2, n_head=2, n_embd=32, vocab_size=256, block_size=32)
        .data(train="train.txt")
        .train(max_steps=20, log_interval=2)
        .deepspeed({"train_micro_batch_size_per_gpu": 2,
                    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
try:
    ztrain.JobSpec().model(n_layer=2, n_head=3, n_embd=32).data(train="x").validate()
except ztrain.SpecError as e:
    print("refused locally:", e.field)

# %%
job = client.submit(spec, idempotency_key="quickstart-1")
print(job.id, ztrain.state_name(job.state))

# %% [markdown]
# Follow it: `watch()` yields typed events (JobUpdate, Metrics, Log, Anomaly) until the job ends.

# %%
for ev in client.watch(job.id):
    if isinstance(ev, ztrain.Metrics) and "train/loss" in ev.values:
        print(f"step {ev.step:3d}  loss {ev.values['train/loss']:.4f}")
    elif isinstance(ev, ztrain.JobUpdate):
        print("state", ev.state)

# %%
final = client.wait(job.id)
print(ztrain.state_name(final.state), "at step", final.step)
loss = client.metrics(job.id, ["train/loss"])["train/loss"]
print("first and last loss:", loss[0], loss[-1])
for line in client.logs(job.id, tail=3):
    print(f"[rank {line.rank}] {line.text}")

# %% [markdown]
# Errors carry the server's structured detail: the code, the field or the resource.

# %%
try:
    client.get("job-999999")
except ztrain.NotFound as e:
    print(e.code, e.resource)
