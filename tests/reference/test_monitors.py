"""DeepSpeed's "tensorboard" and "csv_monitor" sections, read back by TensorBoard's own reader
(EventAccumulator, from PyPI in .venv) and by Python's csv module.

A 2-rank fp16 job with a WarmupLR schedule, wall_clock_breakdown, both monitors and wandb enabled.
What DeepSpeed's engine.step() writes (deepspeed/runtime/engine.py, monitor/tensorboard.py,
monitor/csv_monitor.py), checked against the job's own metrics.jsonl:
- the directory is os.path.join(output_path, job_name), relative to the job's directory: an explicit
  output_path/job_name for TensorBoard, the defaults ("" and "DeepSpeedJobName") for CSV;
- only rank 0 writes: one event file, named as SummaryWriter names one, and one row per step;
- every record's length and data CRC-32C (masked) verify, computed here from the CRC's definition;
- the first event is file_version "brain.Event:2";
- the x-axis is the global sample count (metrics' train/samples), one point per optimizer step;
- Train/Samples/train_loss is the step's loss; Train/Samples/lr is the lr after the scheduler
  stepped (the next step's train/learning_rate: DeepSpeed logs after lr_scheduler.step());
  Train/Samples/loss_scale is fp16's scale after the step; elapsed_time_ms_{forward,backward,step}
  with wall_clock_breakdown, and backward_inner + backward_allreduce = backward, backward_inner
  being the record's perf/rank0/bwd_ms;
- the CSV files are Train_Samples_<name>.csv with header "step,<name>" and the same values;
- "wandb" enabled draws a warning pointing at the HTTP API and does not stop the job;
- wall_clock_breakdown prints DeepSpeed's two timer lines from rank 0 only, "[Rank 0] time (ms) |
  fwd_microstep: ..." after every micro-step and "[Rank 0] time (ms) | fwd: ..." at the boundary,
  whose fwd/bwd sum the micro-steps' and equal TensorBoard's."""
import csv
import glob
import os
import re
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from ztref import Checker, read_metrics, run, tool, write_job, write_llmc_tokens  # noqa: E402

STEPS, MICRO, GAS, WORLD = 6, 2, 2, 2
BATCH = MICRO * GAS * WORLD
TAGS = ["Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/loss_scale",
        "Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
        "Train/Samples/elapsed_time_ms_backward_inner",
        "Train/Samples/elapsed_time_ms_backward_allreduce", "Train/Samples/elapsed_time_ms_step"]


def crc32c(data):
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit from its definition."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records_verify(path):
    """The number of TFRecords in the file if every length and CRC is right, else None."""
    data, pos, n = open(path, "rb").read(), 0, 0
    while pos < len(data):
        if pos + 12 > len(data):
            return None
        length, = struct.unpack_from("<Q", data, pos)
        len_crc, = struct.unpack_from("<I", data, pos + 8)
        body = data[pos + 12:pos + 12 + length]
        data_crc, = struct.unpack_from("<I", data, pos + 12 + length)
        if masked(crc32c(data[pos:pos + 8])) != len_crc or masked(crc32c(body)) != data_crc:
            return None
        pos += 12 + length + 4
        n += 1
    return n


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    tokens = [(7 * i + i // 5) % 89 for i in range(4000)]
    write_llmc_tokens(f"{d}/train.bin", tokens)
    write_job(f"{d}/job.json", {
        "name": "monitors", "world_size": WORLD,
        "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 89,
                  "block_size": 16},
        "data": {"train": "train.bin", "shuffle": False},
        "train": {"max_steps": STEPS, "log_interval": 1, "warmup_steps": 0},
        "deepspeed": {
            "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                         "warmup_num_steps": 10,
                                                         "warmup_type": "linear"}},
            "fp16": {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 2},
            "wall_clock_breakdown": True,
            "tensorboard": {"enabled": True, "output_path": "tb_out/", "job_name": "tb_job"},
            "csv_monitor": {"enabled": True},
            "wandb": {"enabled": True, "project": "p"}}})
    p = run([tool("ztrain"), "run", f"{d}/job.json", "--out", f"{d}/run", "--threads", "1"])
    ck.check("wandb.enabled: nothing is sent" in p.stderr and "/api/v1/jobs/{id}/metrics" in p.stderr,
             "wandb enabled: warned, pointing at the HTTP API, and the job ran")
    metrics = [m for m in read_metrics(f"{d}/run/metrics.jsonl") if "train/loss" in m]
    ck.check(len(metrics) == STEPS, f"{len(metrics)} metric records")

    # ---- TensorBoard ----
    files = glob.glob(f"{d}/tb_out/tb_job/*")
    ck.check(len(files) == 1, f"one event file in output_path/job_name (rank 0 only): {files}")
    name = os.path.basename(files[0]) if files else ""
    ck.check(re.fullmatch(r"events\.out\.tfevents\.\d{10}\.[^.]+(\.[^.]+)*\.\d+\.0", name) is not None,
             f"SummaryWriter's file name: {name}")
    n_records = records_verify(files[0]) if files else None
    ck.check(n_records == 1 + STEPS * len(TAGS),
             f"every record's masked CRC-32Cs verify ({n_records} records)")
    acc = EventAccumulator(f"{d}/tb_out/tb_job", size_guidance={"scalars": 0})
    acc.Reload()
    # The reader parses "brain.Event:<n>" into the number n.
    ck.check(acc.file_version == 2.0, f"file_version brain.Event:2 (read as {acc.file_version!r})")
    ck.check(sorted(acc.Tags()["scalars"]) == sorted(TAGS), f"tags {sorted(acc.Tags()['scalars'])}")
    tb = {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}
    samples = [m["train/samples"] for m in metrics]
    ck.check(samples == [BATCH * s for s in range(1, STEPS + 1)], f"train/samples {samples}")
    for tag in TAGS:
        steps = [e.step for e in tb.get(tag, [])]
        ck.check(steps == samples, f"{tag}: x-axis = global samples {steps}")

    def f32_close(a, b):
        return abs(a - b) <= 1e-6 * max(abs(b), 1e-30)

    loss = [e.value for e in tb["Train/Samples/train_loss"]]
    ck.check(all(f32_close(a, m["train/loss"]) for a, m in zip(loss, metrics)),
             f"train_loss = the step's train/loss: {loss}")
    lr = [e.value for e in tb["Train/Samples/lr"]]
    nxt = [m["train/learning_rate"] for m in metrics[1:]]
    ck.check(all(f32_close(a, b) for a, b in zip(lr, nxt)) and
             any(not f32_close(a, m["train/learning_rate"]) for a, m in zip(lr, metrics)),
             f"lr = the lr after the scheduler's step (the next step's): {lr[:-1]} vs {nxt}")
    scale = [e.value for e in tb["Train/Samples/loss_scale"]]
    ck.check(scale == [m["train/loss_scale"] for m in metrics] and len(set(scale)) > 1,
             f"loss_scale = train/loss_scale after each step (and it moves): {scale}")
    fwd = [e.value for e in tb["Train/Samples/elapsed_time_ms_forward"]]
    ck.check(all(v > 0 for v in fwd), f"elapsed_time_ms_forward > 0: {fwd}")
    bwd, inner, allreduce = ([e.value for e in tb[f"Train/Samples/elapsed_time_ms_{t}"]]
                             for t in ("backward", "backward_inner", "backward_allreduce"))
    # Without ZeRO 2/3 the gradients are reduced in the step, so the backward's share is 0 here.
    ck.check(all(abs(i + a - b) <= 1e-5 * b for i, a, b in zip(inner, allreduce, bwd)) and
             all(a >= 0 for a in allreduce) and len(bwd) == STEPS,
             f"backward = backward_inner + backward_allreduce: {allreduce}")
    # Rank 0's record has the same step's backward less its communication as perf/rank0/bwd_ms.
    ck.check(all(f32_close(i, m["perf/rank0/bwd_ms"]) for i, m in zip(inner, metrics)),
             f"backward_inner = perf/rank0/bwd_ms: {inner} vs {[m['perf/rank0/bwd_ms'] for m in metrics]}")

    # ---- wall_clock_breakdown's lines (engine.py step(), utils/timer.py SynchronizedWallClockTimer.log) ----
    # After every micro-step print_dist(ranks=[0]) prints the micro timers, and at the boundary
    # the global ones, each "[Rank 0] time (ms)" then " | {name}: {:.2f}" per timer in
    # EngineTimers' order; rank 1 prints nothing.
    num = r"(\d+\.\d\d)"
    def timer_line(suffix):
        names = ["fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"]
        return re.compile(r"\[Rank 0\] time \(ms\)" +
                          "".join(rf" \| {n}{suffix}: {num}" for n in names))
    micro_re, global_re = timer_line("_microstep"), timer_line("")
    lines = [l for l in (p.stdout + p.stderr).splitlines() if "time (ms)" in l]
    kinds = ["m" if micro_re.fullmatch(l) else "g" if global_re.fullmatch(l) else "?" for l in lines]
    ck.check(kinds == (["m"] * GAS + ["g"]) * STEPS,
             f"wall_clock_breakdown: per step {GAS} micro-step lines then one global line, "
             f"DeepSpeed's format, rank 0 only: {kinds} {[l for l, k in zip(lines, kinds) if k == '?'][:2]}")
    if kinds == (["m"] * GAS + ["g"]) * STEPS:
        vals = [[float(v) for v in (micro_re if k == "m" else global_re).fullmatch(l).groups()]
                for l, k in zip(lines, kinds)]
        sums_ok, tb_ok = True, True
        for step in range(STEPS):
            micro, total = vals[step * (GAS + 1):step * (GAS + 1) + GAS], vals[step * (GAS + 1) + GAS]
            # The global fwd and bwd sum the step's micro-steps (each rounded to 0.01 ms).
            for col in (0, 1):
                sums_ok &= abs(sum(m[col] for m in micro) - total[col]) <= 0.006 * (GAS + 1)
            # The boundary's micro step timer times the same step() call as the global one.
            sums_ok &= micro[-1][4] == total[4]
            tb_ok &= abs(total[0] - fwd[step]) <= 0.006 and abs(total[1] - bwd[step]) <= 0.006
        ck.check(sums_ok, "wall_clock_breakdown: the global fwd/bwd are the sums of the micro-steps'")
        ck.check(tb_ok, "wall_clock_breakdown: the global line's fwd/bwd are TensorBoard's "
                        "elapsed_time_ms_forward/backward of the step")

    # ---- CSV ----
    csv_dir = f"{d}/DeepSpeedJobName"
    listed = sorted(os.listdir(csv_dir)) if os.path.isdir(csv_dir) else []
    want_files = sorted(t.replace("/", "_") + ".csv" for t in TAGS)
    ck.check(listed == want_files, f"CSV files in <job dir>/DeepSpeedJobName: {listed}")
    for tag in TAGS:
        path = os.path.join(csv_dir, tag.replace("/", "_") + ".csv")
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        header, body = rows[0], rows[1:]
        ck.check(header == ["step", tag.split("/")[-1]] and len(body) == STEPS,
                 f"{os.path.basename(path)}: header {header}, {len(body)} rows")
        ck.check([int(r[0]) for r in body] == samples, f"{os.path.basename(path)}: steps = samples")
        values = [float(r[1]) for r in body]
        tbv = [e.value for e in tb[tag]]
        ck.check(all(f32_close(a, b) for a, b in zip(tbv, values)),
                 f"{os.path.basename(path)}: values equal TensorBoard's")
        ck.check(all(repr(v) == r[1] for v, r in zip(values, body)),
                 f"{os.path.basename(path)}: values written as Python's repr")
ck.done()
