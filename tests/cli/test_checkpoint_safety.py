"""Resume and checkpoint replacement never lose a checkpoint or a run's metrics (issue 19, defects 7
and 8), with `ztrain run` of a one-layer byte-level GPT-2:

  resume, nothing to resume: a checkpoint_dir that does not exist starts from step 0 and says so
      in one line; an earlier metrics.jsonl in the --out directory is kept (appended to).
  resume, `latest` missing, empty or naming a tag that is gone, while complete checkpoints exist:
      the run resumes from the newest complete one and says why in one line; the checkpoints
      already there keep their files (same inodes and times), the earlier records of metrics.jsonl
      stay as they were, and the losses equal an uninterrupted run's.
  resume, `latest` names a checkpoint and none is complete: an error naming the directory and the
      tags found, exit 1, nothing written.
  a kill while a tag is replaced: the state the old code left (the tag's directory deleted, the new
      one still under its temporary name) resumes; and ZTRAIN_INJECT_CKPT_KILL kills rank 0 at each
      point of the replacement (with renameat2's RENAME_EXCHANGE, and as on a filesystem without
      it): `latest` always leads to a complete checkpoint (with RENAME_EXCHANGE: its directory
      holds DONE at every point), the next run resumes from it with the uninterrupted run's losses,
      and the temporary directories are gone after its first save.
  a save that fails (its files cannot be written, as on a full disk): the run fails naming the
      file, and the save's temporary directory is removed at once; the checkpoint before stays.

The reference losses come from one uninterrupted run of the same job (resume is bit-exact, which
tests/reference/test_resume.py checks against an independent run)."""
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cliref import ZTRAIN, Checks  # noqa: E402
TEXT = (b"It was the best of times, it was the worst of times, it was the age of wisdom, "
        b"it was the age of foolishness, it was the epoch of belief.\n" * 40)[:4096]

sys.stdout.reconfigure(line_buffering=True)
checks = Checks()
check = checks.check


top = tempfile.mkdtemp(prefix="ztrain-ckpt-safety-")
with open(os.path.join(top, "train.txt"), "wb") as f:
    f.write(TEXT)


def file_size_limit(limit):
    """For preexec_fn: no file written past limit bytes, a write there failing with EFBIG (as a
    full disk's does with ENOSPC) rather than killing the process with SIGXFSZ."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def run(name, max_steps, ckpt, out, resume=True, interval=0, env=None, preexec=None):
    """Writes TOP/NAME.json and runs it; returns the CompletedProcess."""
    job = {"name": name,
           "model": {"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256,
                     "block_size": 16},
           "data": {"train": "train.txt", "shuffle": True},
           "train": {"max_steps": max_steps, "log_interval": 1, "warmup_steps": 0, "seed": 5,
                     "checkpoint_dir": ckpt, "checkpoint_interval": interval, "resume": resume},
           "deepspeed": {"train_micro_batch_size_per_gpu": 2,
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}}
    path = os.path.join(top, name + ".json")
    with open(path, "w") as f:
        json.dump(job, f)
    e = dict(os.environ, **(env or {}))
    return subprocess.run([ZTRAIN, "run", path, "--out", os.path.join(top, out), "--threads", "1"],
                          capture_output=True, text=True, timeout=120, env=e,
                          preexec_fn=preexec)


def metric_lines(out):
    path = os.path.join(top, out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [l for l in f if l.strip()]


def losses(out):
    return [(r["train/global_step"], r["train/loss"]) for r in map(json.loads, metric_lines(out))]


def latest(ckpt):
    path = os.path.join(top, ckpt, "latest")
    return open(path).read().strip() if os.path.exists(path) else None


def complete(ckpt, tag):
    return tag is not None and os.path.exists(os.path.join(top, ckpt, tag, "DONE"))


def fingerprint(ckpt, tag):
    """(name, inode, mtime_ns) of every file of a checkpoint: a rewrite changes them."""
    d = os.path.join(top, ckpt, tag)
    return sorted((n, os.stat(os.path.join(d, n)).st_ino, os.stat(os.path.join(d, n)).st_mtime_ns)
                  for n in os.listdir(d))


def hidden(ckpt):
    return sorted(n for n in os.listdir(os.path.join(top, ckpt)) if n.startswith("."))


def exchange_supported(directory):
    """Whether renameat2(RENAME_EXCHANGE) works in this directory's filesystem."""
    a, b = os.path.join(directory, ".probe-a"), os.path.join(directory, ".probe-b")
    os.mkdir(a)
    os.mkdir(b)
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    ok = libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0
    os.rmdir(a)
    os.rmdir(b)
    return ok


p = run("reference", 9, "ck-ref", "ref", resume=False)
check(p.returncode == 0, f"the uninterrupted 9-step run succeeds ({p.stderr.strip()[-200:]})")
REF = losses("ref")
check([s for s, _ in REF] == list(range(1, 10)), "it logs steps 1..9")

# ---- resume with nothing to resume ----------------------------------------------------------
p = run("fresh", 3, "ck-fresh", "fresh")
notice = [l for l in p.stdout.splitlines() if "ck-fresh" in l and "step 0" in l]
check(p.returncode == 0 and len(notice) == 1,
      f"resume with a checkpoint_dir that does not exist: exit {p.returncode}, one line says it "
      f"starts from step 0: {notice}")
check(losses("fresh") == REF[:3], "and it trains from step 0")
before = metric_lines("fresh")
p = run("typo", 2, "ck-typo", "fresh")
after = metric_lines("fresh")
check(p.returncode == 0 and after[:len(before)] == before and len(after) == len(before) + 2,
      f"a fresh start with resume true appends to the earlier metrics.jsonl instead of "
      f"truncating it ({len(before)} lines before, {len(after)} after)")

# ---- latest missing, empty or dangling ------------------------------------------------------
for damage in ("missing", "empty", "dangling"):
    ck, out = f"ck-{damage}", f"out-{damage}"
    p = run(f"{damage}-a", 6, ck, out, interval=3)
    check(p.returncode == 0 and latest(ck) == "global_step6" and complete(ck, "global_step3"),
          f"{damage}: the first run leaves global_step3 and global_step6, latest names the second")
    prints = {t: fingerprint(ck, t) for t in ("global_step3", "global_step6")}
    first = metric_lines(out)
    latest_path = os.path.join(top, ck, "latest")
    if damage == "missing":
        os.unlink(latest_path)
    else:
        with open(latest_path, "w") as f:
            f.write("" if damage == "empty" else "global_step99\n")
    p = run(f"{damage}-b", 9, ck, out, interval=3)
    said = [l for l in p.stdout.splitlines() if "latest" in l and "global_step6" in l]
    check(p.returncode == 0 and len(said) == 1,
          f"{damage}: the run says in one line that it resumes from global_step6 "
          f"(exit {p.returncode}): {said or p.stdout[-300:] + p.stderr[-300:]}")
    check("resumed from" in p.stdout and "at step 6" in p.stdout,
          f"{damage}: it resumed at step 6")
    check(losses(out) == REF, f"{damage}: steps 1..9 with the uninterrupted run's losses")
    check(metric_lines(out)[:6] == first, f"{damage}: the first run's records are kept as written")
    check(all(fingerprint(ck, t) == prints[t] for t in prints),
          f"{damage}: global_step3 and global_step6 were not rewritten")
    check(latest(ck) == "global_step9" and complete(ck, "global_step9"),
          f"{damage}: latest names the new global_step9 ({latest(ck)})")

# ---- latest names a checkpoint, none is complete --------------------------------------------
p = run("gone-a", 3, "ck-gone", "out-gone")
os.unlink(os.path.join(top, "ck-gone", "global_step3", "DONE"))
first = metric_lines("out-gone")
p = run("gone-b", 6, "ck-gone", "out-gone")
err = p.stderr
check(p.returncode == 1 and "ck-gone" in err and "global_step3" in err,
      f"latest naming an incomplete checkpoint: exit {p.returncode}, the message names the "
      f"directory and the tag: {err.strip()[-300:]}")
check(metric_lines("out-gone") == first and not os.path.exists(
      os.path.join(top, "ck-gone", "global_step3", "DONE")), "and nothing was written")

# ---- a kill while a tag is replaced ---------------------------------------------------------
# What the old code left when killed between deleting the tag and renaming the new one in.
p = run("window-a", 3, "ck-window", "out-window")
os.rename(os.path.join(top, "ck-window", "global_step3"),
          os.path.join(top, "ck-window", ".global_step3.tmp"))
p = run("window-b", 6, "ck-window", "out-window")
check(p.returncode == 0 and "at step 3" in p.stdout,
      f"latest naming a tag whose new directory was not renamed in yet: the run resumes at step 3 "
      f"(exit {p.returncode}: {p.stderr.strip()[-300:]})")
check(losses("out-window") == REF[:6], "with the uninterrupted run's losses")
check(hidden("ck-window") == [] and latest("ck-window") == "global_step6",
      f"the temporary directory is gone after the next save ({hidden('ck-window')})")

exchange = exchange_supported(top)
print(f"renameat2(RENAME_EXCHANGE) in {top}: {'supported' if exchange else 'not supported'}")
variants = [("exchange", {}, ("written", "placed", "latest"))] if exchange else []
variants.append(("two renames", {"ZTRAIN_INJECT_NO_RENAME_EXCHANGE": "1"},
                 ("written", "aside", "placed", "latest")))
for variant, env, points in variants:
    for point in points:
        ck, out = f"ck-kill-{variant[0]}-{point}", f"out-kill-{variant[0]}-{point}"
        p = run("kill-a", 3, ck, out)
        # The second run resumes at its max_steps and saves global_step3 again: the tag exists.
        p = run("kill-b", 3, ck, out, env=dict(env, ZTRAIN_INJECT_CKPT_KILL=f"3:{point}"))
        name = f"{variant}, killed at '{point}'"
        check(p.returncode == -9, f"{name}: rank 0 was killed (exit {p.returncode}: "
              f"{p.stderr.strip()[-200:]})")
        tag = latest(ck)
        leftovers = hidden(ck)
        if variant == "exchange" or point != "aside":
            check(tag == "global_step3" and complete(ck, tag),
                  f"{name}: latest names {tag}, whose directory holds DONE ({leftovers})")
        else:
            check(tag == "global_step3" and not complete(ck, tag) and
                  ".global_step3.old" in leftovers and ".global_step3.tmp" in leftovers,
                  f"{name}: latest names {tag}, moved aside as .global_step3.old, the new one "
                  f"complete under .global_step3.tmp ({leftovers})")
        p = run("kill-c", 6, ck, out)
        check(p.returncode == 0 and "at step 3" in p.stdout and losses(out) == REF[:6],
              f"{name}: the next run resumes at step 3 with the uninterrupted run's losses "
              f"(exit {p.returncode}: {p.stderr.strip()[-200:]})")
        check(hidden(ck) == [] and latest(ck) == "global_step6" and complete(ck, "global_step3"),
              f"{name}: after its first save no temporary directory is left and global_step3 "
              f"is complete ({hidden(ck)})")

# ---- a save that fails ----------------------------------------------------------------------
# Its files cannot be written (no file may grow past 4 KiB; the model's are larger): the run fails
# naming the file, and removes the temporary directory it was writing (before: left until the
# next save), keeping the checkpoint before it.
p = run("full-a", 3, "ck-full", "out-full", interval=3)
p = run("full-b", 6, "ck-full", "out-full-b", interval=3, preexec=file_size_limit(4096))
check(p.returncode == 1 and "ck-full/.global_step6.tmp/" in p.stderr and
      "File too large" in p.stderr,
      f"a save that cannot write its files fails naming the file (exit {p.returncode}: "
      f"{p.stderr.strip()[-300:]})")
check(hidden("ck-full") == [] and latest("ck-full") == "global_step3" and
      complete("ck-full", "global_step3"),
      f"and leaves no temporary directory, global_step3 complete ({hidden('ck-full')})")

shutil.rmtree(top, ignore_errors=True)
checks.finish()
