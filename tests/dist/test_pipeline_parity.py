"""Pipeline parallelism gives the single-rank trajectory for the same global batch (16
sequences a step): GPT-2 (tied LM head) in 2 stages x data parallel 1 and 2, 4 stages x 1 and
6 stages x 1 on its 4 blocks (stages of the embedding alone and of the head alone, as
DeepSpeed's partition gives them; each stage's checkpoint holds just its layer), with 4 and 8
micro-batches, and Llama (untied) in 2 stages x 2 with ZeRO 1; the 10 losses and the global
gradient norms within 1e-5 relative (the norm counts the tied embedding once: counting
the last stage's copy too would change it), the final weights (exported from the pipeline's
per-stage checkpoint into one model) within 1e-5 per tensor. The reported loss is DeepSpeed's,
the mean over micro-batches averaged over replicas, which equals the single rank's mean over the
16 sequences since every sequence counts the same number of targets.

bf16 (2 stages x dp 2) and fp16 with its loss scaler (2 stages x dp 1) follow the single rank in
the same precision: losses within 2e-3 relative, gradient norms and final weights (per tensor)
within 2e-2. The one difference is where the tied embedding's gradient is rounded to 16 bits: on
each stage before ReduceTiedGrads sums them, where one rank rounds the sum once. That is at most
half a bf16 ulp (2^-9 relative) on one tensor's gradient per micro-batch; through Adam it moves
weights by a few 16-bit ulps at most (bf16's ulp is 2^-8 = 3.9e-3 relative, so 2e-2 is five),
and the loss by far less (2e-3 is half an ulp; 6e-5 measured). The loss scale follows the same
course on every step (every stage sees the global overflow).

Evaluation runs the InferenceSchedule: with the same micro-batch as a non-pipelined run (micro 4,
4 micro-batches, eval_steps 3 on the training text) the eval losses agree within 1e-5; and
pipeline.activation_checkpoint_interval 1 (every block's input kept, the rest recomputed in the
backward) changes nothing: losses, eval losses and weights bit-identical to the run without it."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, rel_err, run, st_read, tool, write_job  # noqa: E402

GLOBAL, STEPS = 16, 10
GPT2 = {"type": "gpt2", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 256,
        "block_size": 16}
LLAMA = {"type": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "intermediate_size": 48, "vocab_size": 256, "block_size": 16,
         "tie_word_embeddings": False}


def job(model, stages, dp, gas, ckpt, zero=0, precision=None, micro=None, ac=0):
    spec = {"name": f"pipe{stages}x{dp}g{gas}", "world_size": stages * dp, "model": model,
            "data": {"train": "train.txt", "shuffle": True},
            "train": {"max_steps": STEPS, "log_interval": 1, "checkpoint_dir": ckpt, "seed": 5},
            "deepspeed": {"train_micro_batch_size_per_gpu": micro or GLOBAL // (dp * gas),
                          "gradient_accumulation_steps": gas,
                          # eps 1e-4: near-zero gradients (the key bias's is exactly 0 in exact
                          # arithmetic) are rounding noise Adam with eps 1e-8 would magnify.
                          "optimizer": {"type": "AdamW",
                                        "params": {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}},
                          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
                          "gradient_clipping": 0.5,
                          "zero_optimization": {"stage": zero}}}
    if precision:
        spec["deepspeed"][precision] = {"enabled": True}
    if stages > 1:
        spec["pipeline"] = {"stages": stages, "partition": "uniform",
                            "activation_checkpoint_interval": ac}
    if micro:  # with evaluation
        spec["data"]["val"] = "train.txt"
        spec["train"].update(eval_interval=5, eval_steps=3)
    return spec


def train(d, name, spec):
    write_job(f"{d}/{name}.json", spec)
    run([tool("ztrain"), "run", f"{d}/{name}.json", "--out", f"{d}/{name}"])
    run([tool("ztrain"), "export", f"{d}/{spec['train']['checkpoint_dir']}", "--out",
         f"{d}/{name}.safetensors"])
    params, _ = st_read(f"{d}/{name}.safetensors")
    records = read_metrics(f"{d}/{name}/metrics.jsonl")
    metrics = [m for m in records if "train/loss" in m]
    evals = [m["eval/loss"] for m in records if "eval/loss" in m]
    return ([m["train/loss"] for m in metrics], [m["train/grad_norm"] for m in metrics], params,
            metrics, evals)


def compare(ck, what, ref, got, tol=1e-5):
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[0], ref[0]))
    ck.check(len(got[0]) == STEPS and worst < tol,
             f"{what}: {len(got[0])} losses, worst rel err {worst:.1e}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[1], ref[1]))
    ck.check(worst < tol * 10, f"{what}: gradient norms, worst rel err {worst:.1e}")
    ck.check(sorted(got[2]) == sorted(ref[2]),
             f"{what}: the exported model has the single-rank tensors "
             f"(extra {sorted(set(got[2]) - set(ref[2]))}, missing {sorted(set(ref[2]) - set(got[2]))})")
    common = [k for k in ref[2] if k in got[2]]
    err, name = max((rel_err(got[2][k], ref[2][k]), k) for k in common)
    ck.check(err < tol * 10, f"{what}: final parameters, worst tensor {name} rel err {err:.1e}")
    bubbles = [m.get("perf/pipeline_bubble") for m in got[3]]
    ck.check(all(b is not None and 0.0 <= b < 1.0 for b in bubbles),
             f"{what}: every step reports a bubble fraction in [0, 1): {bubbles[:3]}...")


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    ref = train(d, "gpt2-single", job(GPT2, 1, 1, 1, "ck-gpt2-single"))
    ck.check(ref[0][-1] < ref[0][0], "the single-rank loss falls")
    for stages, dp, gas in ((2, 1, 4), (2, 1, 8), (2, 2, 4), (4, 1, 8), (6, 1, 8)):
        got = train(d, f"gpt2-{stages}x{dp}g{gas}",
                    job(GPT2, stages, dp, gas, f"ck-gpt2-{stages}x{dp}g{gas}"))
        compare(ck, f"GPT-2, {stages} stages x dp {dp}, {gas} micro-batches", ref, got)
    # 6 stages on 4 blocks: DeepSpeed's partition_uniform of the 6 layers (embed, 4 blocks,
    # head) gives each stage one, so the first holds the embedding alone, the last the head
    # (the final norm and its tied copy of the embedding) alone, the others a block each.
    for s in range(6):
        stage = f"{d}/ck-gpt2-6x1g8/stage_{s:02d}/global_step{STEPS}/model.safetensors"
        names, _ = st_read(stage)
        head = {"ln_f.weight", "ln_f.bias", "wte.weight"}
        want = ({"wte.weight", "wpe.weight"} if s == 0 else head if s == 5
                else {k for k in got[2] if k.startswith(f"h.{s - 1}.")})
        ck.check(set(names) == want, f"6 stages on 4 blocks: stage {s} holds {sorted(names)}")
    ref = train(d, "llama-single", job(LLAMA, 1, 1, 1, "ck-llama-single", zero=1))
    got = train(d, "llama-2x2g4", job(LLAMA, 2, 2, 4, "ck-llama-2x2g4", zero=1))
    compare(ck, "Llama, 2 stages x dp 2 with ZeRO 1, 4 micro-batches", ref, got)
    ref = train(d, "eval-single", job(GPT2, 1, 1, 4, "ck-eval-single", micro=4))
    got = train(d, "eval-pipe", job(GPT2, 2, 1, 4, "ck-eval-pipe", micro=4))
    compare(ck, "GPT-2 2 stages, micro 4, with evaluation", ref, got)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[4], ref[4]))
    ck.check(len(got[4]) == 2 and worst < 1e-5,
             f"InferenceSchedule: {len(got[4])} eval losses, worst rel err {worst:.1e}")
    ac = train(d, "eval-pipe-ac", job(GPT2, 2, 1, 4, "ck-eval-pipe-ac", micro=4, ac=1))
    ck.check(ac[0] == got[0] and ac[1] == got[1] and ac[4] == got[4],
             "activation_checkpoint_interval 1: losses, norms and eval losses bit-identical")
    ck.check(all((ac[2][k] == got[2][k]).all() for k in got[2]),
             "activation_checkpoint_interval 1: final weights bit-identical")
    for precision, stages, dp in (("bf16", 2, 2), ("fp16", 2, 1)):
        ref = train(d, f"{precision}-single", job(GPT2, 1, 1, 1, f"ck-{precision}-single",
                                                 precision=precision))
        got = train(d, f"{precision}-pipe", job(GPT2, stages, dp, 4, f"ck-{precision}-pipe",
                                               precision=precision))
        compare(ck, f"GPT-2 {precision}, {stages} stages x dp {dp}", ref, got, tol=2e-3)
        scales = [[m.get("train/loss_scale") for m in r[3]] for r in (ref, got)]
        ck.check(scales[0] == scales[1], f"{precision}: the same loss scale every step: {scales[1]}")
ck.done()
