"""ZeRO-Offload and ZeRO-Infinity on 2 ranks: the same training with the optimizer state (and at
stage 3 the parameters) offloaded gives bit-identical losses and final parameters to the run kept
in memory, for stages 1-3 in fp32 and bf16, for Adam and SGD with momentum, with io_uring and
with the pread/pwrite threads, pipelined or not, with one buffer or several, and for the variants
DeepSpeed configs use: offload_optimizer "cpu", offload_param "cpu", ratio 0.5 (partial offload),
offload_param "nvme" alone. (Bit-identical is the bar: the offloaded update runs the same kernel
on the same elements, only tile by tile, and every element's update depends on that element
alone.)

Resuming from the checkpoint of an offloaded run is bit-exact, also across offload and
in-memory runs in both directions, and continues within 1e-5 on 3 ranks (re-partitioned).

The per-run directories under nvme_path are gone after every run, also after failed ones. A
nvme_path that does not exist fails the job before any rank starts, naming the key and the path;
one on a read-only filesystem and one on a full filesystem (a tiny tmpfs, mounted in a private
mount namespace when this machine allows it) fail it at startup naming the path and the rank; a filesystem that refuses O_DIRECT (ramfs) falls back
to the page cache with the same bits; a disk that fills up mid-run
(ZTRAIN_INJECT_NVME_FULL, a write failing with ENOSPC on rank 1 at step 3) fails that step on every
rank before any parameter is published: the last checkpoint is step 2's.

The update as a GPU runs it (ZTRAIN_OFFLOAD_STAGED=1 on the CPU: each tile's gradients and
parameters copied to host buffers, the optimizer on a host backend, the parameters copied back)
is bit-identical too, fp32 and bf16, Adam and SGD."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from ztref import Checker, read_metrics, rel_err, run, st_read, tool, write_job  # noqa: E402

GLOBAL, STEPS = 12, 6
ADAM = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}}
SGD = {"type": "SGD", "params": {"lr": 5e-2, "momentum": 0.9, "weight_decay": 0.01}}


def job(name, world, stage, nvme, optimizer=None, param=None, precision=None, opt=ADAM,
        ckpt=None, bench_steps=0, resume=False, interval=0):
    zero = {"stage": stage, "reduce_bucket_size": 3000, "stage3_param_persistence_threshold": 100,
            # Tiles of 2048 elements: a rank's slice (17,344 elements) is 9 tiles, the last partial.
            "sub_group_size": 2048}
    for key, section in (("offload_optimizer", optimizer), ("offload_param", param)):
        if section:
            section = dict(section)
            if section["device"] == "nvme":
                section["nvme_path"] = nvme
            zero[key] = section
    ds = {"train_batch_size": GLOBAL, "train_micro_batch_size_per_gpu": GLOBAL // world,
          "optimizer": opt, "gradient_clipping": 0.5,
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
          "zero_optimization": zero}
    if opt["type"] == "SGD":
        ds["zero_allow_untested_optimizer"] = True  # torch.optim.SGD is not among ZeRO's tested
    if precision:
        ds[precision] = {"enabled": True}
    return {"name": name, "world_size": world,
            "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256,
                      "block_size": 32},
            "data": {"train": "train.txt", "shuffle": True},
            "train": {"max_steps": STEPS, "log_interval": 1, "checkpoint_dir": ckpt or f"ck-{name}",
                      "checkpoint_interval": interval, "bench_steps": bench_steps,
                      "resume": resume, "seed": 7},
            "deepspeed": ds}


def ztrain_run(d, spec, env=None, check=True):
    write_job(f"{d}/{spec['name']}.json", spec)
    e = dict(os.environ, **(env or {}))
    return run([tool("ztrain"), "run", f"{d}/{spec['name']}.json", "--out", f"{d}/out-{spec['name']}"],
               check=check, env=e)


def result(d, name, ckpt=None):
    """Losses of the run's metrics and the final parameters of its checkpoint."""
    run([tool("ztrain"), "export", f"{d}/{ckpt or 'ck-' + name}", "--out", f"{d}/{name}.safetensors"])
    params, _ = st_read(f"{d}/{name}.safetensors")
    return [m["train/loss"] for m in read_metrics(f"{d}/out-{name}/metrics.jsonl")], params


def identical(a, b):
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(
        bool((a[1][k] == b[1][k]).all()) for k in a[1])


def left_in(nvme):
    return sorted(os.listdir(nvme))


def try_private_mount():
    """The command prefix that runs a command in a private mount namespace where it may mount a
    tmpfs, or None when this machine forbids it (no root, no user namespaces)."""
    for prefix in (["unshare", "--mount"], ["unshare", "--mount", "--map-root-user"]):
        if shutil.which("unshare") is None:
            return None
        script = 'd=$(mktemp -d) || exit 1; mount -t tmpfs -o size=64k tmpfs "$d"; rc=$?; ' \
                 'umount "$d" 2>/dev/null; rmdir "$d"; exit $rc'
        probe = subprocess.run(prefix + ["sh", "-c", script], capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


ck = Checker()
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/train.txt", "wb") as f:
        f.write(bytes((i * 7 + i // 13) % 251 for i in range(20000)))
    nvme = f"{d}/nvme"
    os.makedirs(nvme)

    def offloaded(name, spec, ref, env=None, what="", expect=()):
        """expect: fragments of the startup line, which tell that the options were applied (the
        bits are the same whether they were or not)."""
        p = ztrain_run(d, spec, env)
        line = next((l for l in p.stdout.splitlines() if l.startswith("[ztrain] offload:")), None)
        missing = [f for f in expect if line is None or f not in line]
        ck.check(line is not None and not missing,
                 f"{name}: {line[18:] if line else 'no offload line at startup'}"
                 + (f" lacks {missing}" if missing else ""))
        got = result(d, name)
        ck.check(identical(ref, got), f"{name}{what}: {STEPS} losses and final parameters "
                                      f"bit-identical to the in-memory run")
        ck.check(left_in(nvme) == [], f"{name}: nothing left under nvme_path ({left_in(nvme)})")
        return got

    # ---- parity -------------------------------------------------------------------------------
    NV = {"device": "nvme"}
    refs = {}
    for stage in (1, 2, 3):
        ztrain_run(d, job(f"mem{stage}", 2, stage, nvme))
        refs[stage] = result(d, f"mem{stage}")
    ck.check(refs[1][0][-1] < refs[1][0][0], "the in-memory loss falls")
    offloaded("nvme1", job("nvme1", 2, 1, nvme, dict(NV, pipeline_read=True, pipeline_write=True,
                                                     buffer_count=2)), refs[1],
              what=" (2 buffers, pipelined reads and writes)",
              expect=["optimizer nvme, params in memory", "tiles of 2048 elements", "2 buffers,",
                      "pipelined reads", "pipelined writes"])
    offloaded("nvme1b", job("nvme1b", 2, 1, nvme, dict(NV, buffer_count=1, pipeline_write=True)),
              refs[1], what=" (1 buffer)",
              expect=["1 buffer,", "serial reads", "pipelined writes"])
    offloaded("nvme2", job("nvme2", 2, 2, nvme, NV), refs[2], what=" (serial reads and writes)",
              expect=["4 buffers,", "serial reads", "serial writes"])
    offloaded("nvme2t", job("nvme2t", 2, 2, nvme, dict(NV, pipeline_read=True, pipeline_write=True)),
              refs[2], env={"ZTRAIN_AIO": "threads"}, what=" (ZTRAIN_AIO=threads, pipelined)",
              expect=["(threads,", "pipelined reads", "pipelined writes"])
    offloaded("cpu2", job("cpu2", 2, 2, nvme, {"device": "cpu", "pin_memory": True}), refs[2],
              what=" (offload_optimizer cpu)", expect=["optimizer cpu, params in memory (host memory"])
    offloaded("nvme3", job("nvme3", 2, 3, nvme, NV), refs[3])
    offloaded("inf3", job("inf3", 2, 3, nvme, dict(NV, pipeline_read=True, pipeline_write=True,
                                                   buffer_count=3), param=NV), refs[3],
              what=" (optimizer and parameters on NVMe)",
              expect=["optimizer nvme, params nvme", "3 buffers,"])
    offloaded("param3", job("param3", 2, 3, nvme, None, param=NV), refs[3],
              what=" (offload_param nvme alone)",
              expect=["optimizer none, params nvme", "5 buffers,", "pipelined reads",
                      "pipelined writes"])
    offloaded("ratio3", job("ratio3", 2, 3, nvme, dict(NV, ratio=0.5)), refs[3],
              what=" (ratio 0.5: half the tiles in the file)")
    # ratio 0.5: int(0.5 × 9 tiles) = 4 tiles of each moment in the file, the rest (9,152 of the
    # 17,344 elements) in host memory, which the optimizer bytes count on top of the buffers.
    opt_bytes = {n: read_metrics(f"{d}/out-{n}/metrics.jsonl")[-1]["memory/rank0/optimizer_bytes"]
                 for n in ("mem3", "ratio3", "nvme3")}
    host = opt_bytes["ratio3"] - opt_bytes["nvme3"]
    ck.check(opt_bytes["mem3"] == 17344 * 8 and host == (17344 - 4 * 2048) * 8,
             f"rank 0's optimizer bytes: in memory {opt_bytes['mem3']:.0f}, all in files "
             f"{opt_bytes['nvme3']:.0f} (the buffers), ratio 0.5 {host:.0f} more (the host part)")
    offloaded("cpu3", job("cpu3", 2, 3, nvme, {"device": "cpu"}, param={"device": "cpu"}), refs[3],
              what=" (offload_optimizer and offload_param cpu)",
              expect=["optimizer cpu, params in memory (host memory"])
    for stage in (2, 3):
        ztrain_run(d, job(f"bmem{stage}", 2, stage, nvme, precision="bf16"))
        bref = result(d, f"bmem{stage}")
        offloaded(f"bnvme{stage}", job(f"bnvme{stage}", 2, stage, nvme, NV, precision="bf16",
                                       param=NV if stage == 3 else None), bref,
                  what=" (bf16: fp32 masters" + (" and 16-bit parameters" if stage == 3 else "")
                       + " in files)")
        # The GPU's way (ZTRAIN_OFFLOAD_STAGED: gradients copied to host tiles, the update on a
        # host backend, the parameters copied back) gives the same bits.
        offloaded(f"bcpu{stage}s", job(f"bcpu{stage}s", 2, stage, nvme, {"device": "cpu"},
                                       precision="bf16", param=NV if stage == 3 else None), bref,
                  env={"ZTRAIN_OFFLOAD_STAGED": "1"},
                  what=" (bf16, staged through host tiles as on a GPU)")
    ztrain_run(d, job("smem2", 2, 2, nvme, opt=SGD))
    offloaded("snvme2", job("snvme2", 2, 2, nvme, NV, opt=SGD), result(d, "smem2"),
              what=" (SGD momentum buffer in a file)")
    offloaded("cpu2s", job("cpu2s", 2, 2, nvme, {"device": "cpu"}), refs[2],
              env={"ZTRAIN_OFFLOAD_STAGED": "1"}, what=" (fp32, staged through host tiles)")
    offloaded("scpu2s", job("scpu2s", 2, 2, nvme, {"device": "cpu"}, opt=SGD),
              result(d, "smem2"), env={"ZTRAIN_OFFLOAD_STAGED": "1"},
              what=" (SGD fp32, staged through host tiles)")

    # ---- resume -------------------------------------------------------------------------------
    INF = dict(optimizer=NV, param=NV)
    for name, first, second, world2, ref in [
            ("offload -> offload", INF, INF, 2, "inf3"),
            ("in memory -> offload", {}, INF, 2, "mem3"),
            ("offload -> in memory", INF, {}, 2, "mem3")]:
        tag = "r" + "".join(c for c in name if c.isalpha())[:12]
        ztrain_run(d, job(f"{tag}a", 2, 3, nvme, ckpt=f"ck-{tag}", bench_steps=3, **first))
        p = ztrain_run(d, job(f"{tag}b", world2, 3, nvme, ckpt=f"ck-{tag}", resume=True, **second))
        ck.check("resumed from" in p.stdout and "global_step3" in p.stdout,
                 f"resume {name}: the second run resumed at step 3")
        losses = ([m["train/loss"] for m in read_metrics(f"{d}/out-{tag}a/metrics.jsonl")] +
                  [m["train/loss"] for m in read_metrics(f"{d}/out-{tag}b/metrics.jsonl")])
        _, params = result(d, f"{tag}b", ckpt=f"ck-{tag}")
        ck.check(identical((losses, params), refs[3] if ref == "mem3" else result(d, ref)),
                 f"resume {name} (stage 3): losses and final parameters bit-identical to the "
                 f"uninterrupted run")
    ztrain_run(d, job("rw2a", 2, 3, nvme, ckpt="ck-rw2", bench_steps=3, **INF))
    ztrain_run(d, job("rw2b", 3, 3, nvme, ckpt="ck-rw2", resume=True, **INF))
    losses = ([m["train/loss"] for m in read_metrics(f"{d}/out-rw2a/metrics.jsonl")] +
              [m["train/loss"] for m in read_metrics(f"{d}/out-rw2b/metrics.jsonl")])
    _, params = result(d, "rw2b", ckpt="ck-rw2")
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, refs[3][0]))
    err, tensor = max((rel_err(params[k], refs[3][1][k]), k) for k in params)
    ck.check(len(losses) == STEPS and worst < 1e-5 and err < 1e-5,
             f"resume offload 2 ranks -> 3 ranks (re-partitioned): losses within {worst:.1e}, "
             f"parameters within {err:.1e} ({tensor})")
    ck.check(left_in(nvme) == [], f"nothing left under nvme_path after the resumed runs ({left_in(nvme)})")

    # ---- failures -----------------------------------------------------------------------------
    def fails(what, p, fragments, startup=True):
        out = p.stdout + p.stderr
        missing = [f for f in fragments if f not in out]
        ck.check(p.returncode != 0 and not missing and (not startup or "step 1/" not in out),
                 f"{what}: exit {p.returncode}" + (f", output lacks {missing}" if missing else "")
                 + (f"\n{out}" if missing else ""))
        line = next((l for l in out.splitlines() if "nvme" in l.lower() and "rank" in l), "")
        print(f"      {line.strip()}")

    missing_path = f"{d}/no/such/nvme"
    # A path that does not exist is found with the job's files, before any rank starts.
    fails("nvme_path that does not exist",
          ztrain_run(d, job("missing", 2, 2, missing_path, NV), check=False),
          ["offload_optimizer.nvme_path", missing_path, "No such file or directory"])
    fails("offload_param nvme_path that does not exist",
          ztrain_run(d, job("pmissing", 2, 3, missing_path, None, param=NV), check=False),
          ["offload_param.nvme_path", missing_path, "No such file or directory"])

    # A disk that fills up mid-run: rank 1's write of step 3 fails; no rank publishes step 3.
    p = ztrain_run(d, job("full3", 2, 2, nvme, NV, interval=1),
                   env={"ZTRAIN_INJECT_NVME_FULL": "3:1"}, check=False)
    fails("disk full at step 3 on rank 1 (ZTRAIN_INJECT_NVME_FULL)", p,
          ["rank 1", "No space left on device", f"{nvme}/ztrain-full3-rank1-", "exp_avg"],
          startup=False)
    with open(f"{d}/ck-full3/latest") as f:
        latest = f.read().strip()
    steps = [m["train/global_step"] for m in read_metrics(f"{d}/out-full3/metrics.jsonl")]
    ck.check(latest == "global_step2" and steps == [1, 2],
             f"disk full at step 3: the last checkpoint is {latest}, metrics for steps {steps}")
    ck.check(left_in(nvme) == [], f"disk full at step 3: nothing left under nvme_path ({left_in(nvme)})")

    # With tensor parallelism or a pipeline a rank's ZeRO partition is its place in its
    # data-parallel group, not its rank: the grid (docs/parallelism-tp.md) puts job rank 3 at
    # replica 1 of shard 1 (dp 2 x tp 2; its replica partner is rank 1) and at replica 1 of
    # stage 1 (pp 2 x dp 2; partner rank 2). The fault, the directory and every message go by
    # the job's rank.
    for name, grid, stage, partner in [
            ("fulltp", {"deepspeed": {"tensor_parallel": {"autotp_size": 2}}}, 3, 1),
            ("fullpp", {"pipeline": {"stages": 2}}, 1, 2)]:
        spec = job(name, 4, stage, nvme, NV, param=NV if stage == 3 else None, interval=1)
        spec["deepspeed"]["train_micro_batch_size_per_gpu"] = GLOBAL // 2
        spec["deepspeed"].update(grid.get("deepspeed", {}))
        spec.update({k: v for k, v in grid.items() if k != "deepspeed"})
        p = ztrain_run(d, spec, env={"ZTRAIN_INJECT_NVME_FULL": "3:3"}, check=False)
        fails(f"{name}: disk full at step 3 on rank 3 (ZTRAIN_INJECT_NVME_FULL)", p,
              [f"rank 3: writing {nvme}/ztrain-{name}-rank3-", "No space left on device",
               f"rank {partner}: rank 3 could not update its offloaded state"], startup=False)
        out = p.stdout + p.stderr
        ck.check(f"ztrain-{name}-rank1-" not in out and "rank 1 could not" not in out,
                 f"{name}: no message blames rank 1, the failing rank's replica index")
        ck.check(left_in(nvme) == [], f"{name}: nothing left under nvme_path ({left_in(nvme)})")

    # A read-only and a full filesystem, for real where a private mount namespace is allowed.
    prefix = try_private_mount()
    if prefix is None:
        print("      (no private mount namespace here: the read-only and full tmpfs cases are "
              "covered by the non-root read-only directory below and ZTRAIN_INJECT_NVME_FULL)")
    for what, opts, fragments in [("read-only filesystem", "ro,size=1m", ["Read-only file system"]),
                                  ("full filesystem (64 KiB tmpfs)", "size=64k",
                                   ["No space left on device", "no room"])]:
        if prefix is None:
            break
        mnt = f"{d}/mnt-{'ro' if 'ro' in opts else 'full'}"
        os.makedirs(mnt)
        spec = job(os.path.basename(mnt), 2, 2, mnt, NV)
        write_job(f"{d}/{spec['name']}.json", spec)
        script = (f'mount -t tmpfs -o {opts} tmpfs "{mnt}" || exit 99; '
                  f'"{tool("ztrain")}" run "{d}/{spec["name"]}.json" --out "{d}/out-{spec["name"]}"; '
                  f'rc=$?; echo "left: [$(ls -A "{mnt}")]"; exit $rc')
        p = subprocess.run(prefix + ["sh", "-c", script], capture_output=True, text=True)
        fails(what, p, ["offload_optimizer.nvme_path", mnt, "rank 0", "rank 1"] + fragments)
        ck.check("left: []" in p.stdout, f"{what}: nothing left on the filesystem")
        if "no room" in fragments:
            # Each file is a few KiB here: its size in a binary unit that shows it (a decimal
            # "0.0 MB" did not, for a file below 50 kB).
            need = re.search(r"needs ([0-9.]+ (B|KiB|MiB|GiB|TiB))\)", p.stderr)
            ck.check(need and not need.group(1).startswith("0.0"),
                     f"{what}: the file's size is given readably "
                     f"({need.group(1) if need else p.stderr.strip()[-200:]!r})")
    if prefix is not None:
        # ramfs refuses O_DIRECT (and has no fallocate): the files go through the page cache.
        mnt = f"{d}/mnt-ram"
        os.makedirs(mnt)
        spec = job("ramfs", 2, 2, mnt, NV)
        write_job(f"{d}/ramfs.json", spec)
        script = (f'mount -t ramfs ramfs "{mnt}" || exit 99; '
                  f'"{tool("ztrain")}" run "{d}/ramfs.json" --out "{d}/out-ramfs"; '
                  f'rc=$?; echo "left: [$(ls -A "{mnt}")]"; exit $rc')
        p = subprocess.run(prefix + ["sh", "-c", script], capture_output=True, text=True)
        line = next((l for l in p.stdout.splitlines() if l.startswith("[ztrain] offload:")), "")
        ck.check(p.returncode == 0 and "page cache" in line and "left: []" in p.stdout and
                 identical(result(d, "ramfs"), refs[2]),
                 f"ramfs (no O_DIRECT): {line[18:]}; bit-identical to the in-memory run, nothing left"
                 + ("" if p.returncode == 0 else "\n" + p.stdout + p.stderr))
    if os.geteuid() != 0:
        ro = f"{d}/ro-dir"
        os.makedirs(ro)
        os.chmod(ro, 0o555)
        fails("read-only directory",
              ztrain_run(d, job("rodir", 2, 2, ro, NV), check=False),
              ["offload_optimizer.nvme_path", ro, "not writable", "rank 0"])
ck.done()
