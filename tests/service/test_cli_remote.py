"""The ztrain CLI's remote commands (submit, list, status, watch, logs, cancel) against a real
ztraind, with their output and exit statuses as scripts see them (stdout is not a terminal).

  a. `submit JOB.json` prints just the job id; `watch ID` follows it to SUCCEEDED (exit 0) with
     plain progress lines; `status` shows state, step, loss, ranks and directories; `status --json`
     parses and agrees with GetJob; `list` and `list --state` show it; `logs --tail N`.
  b. A job file whose "deepspeed" is a path relative to the job file's directory, submitted from
     another directory with --wait: exit 0; ZTRAIN_SERVER picks the server.
  c. `cancel` answers STOPPING and `watch` then exits 3 (CANCELLED); a job that fails makes
     `watch` exit 1 with the reason on stderr; `logs -f` ends when its job does.
  d. Mistakes: an unknown key in the job file is named (model.n_embed) before anything is sent;
     an unknown id is "NOT_FOUND: jobs/... not found" (exit 1); an unreachable server names its
     address and UNAVAILABLE; a bad option is exit 2.
  e. With a token: no token is UNAUTHENTICATED; --token-file and ZTRAIN_TOKEN both work.
  f. The job file's mapping to JobSpec: false/0 values that differ from the defaults (shuffle,
     seed, warmup_steps) reach the server, null is absent, and wrong types, zeros the proto would
     read as "default", a missing DeepSpeed file and JSON syntax errors are refused locally."""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, LONG, Checker, Daemon, get_job, state_name, stubs, temp_dir,  # noqa: E402
                 tiny_job, wait_state, wait_step, write_data)

pb = stubs()[0]
ck = Checker()
ZTRAIN = os.path.join(BUILD, "ztrain")


def cli(args, d=None, env=None, cwd=None, timeout=120):
    """Runs ztrain with --server of daemon d (when given); returns (exit, stdout, stderr)."""
    e = {k: v for k, v in os.environ.items() if k not in ("ZTRAIN_SERVER", "ZTRAIN_TOKEN")}
    e.update(env or {})
    full = [ZTRAIN] + list(args) + (["--server", d.grpc_addr] if d else [])
    p = subprocess.run(full, capture_output=True, text=True, env=e, cwd=cwd, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def write_job(path, job):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(job, f, indent=1)
    return path


def case_a(d, tmp):
    job = write_job(os.path.join(tmp, "jobs", "a.json"),
                    tiny_job(d.data_root, name="cli-a", max_steps=40, log_interval=1))
    rc, out, err = cli(["submit", job], d)
    job_id = out.strip()
    ck.check(rc == 0 and re.fullmatch(r"job-\d+\n", out) is not None,
             f"a: submit prints just the id ({out!r}, {err.strip()})")
    rc, out, err = cli(["watch", job_id], d)
    lines = out.splitlines()
    ck.check(rc == 0 and lines and lines[-1].startswith(f"{job_id} SUCCEEDED: step 40/40, loss "),
             f"a: watch exits 0 with '{lines[-1] if lines else ''}' ({err.strip()})")
    ck.check(any(re.match(rf"{job_id}: step 40/40  loss \d+\.\d+  .* tok/s  ETA", l)
                 for l in lines) and not any("[#" in l for l in lines),
             "a: without a terminal, watch prints plain progress lines (no bar)")
    rc, out, err = cli(["status", job_id], d)
    j = get_job(d, job_id)
    ck.check(rc == 0 and "SUCCEEDED" in out and "40/40" in out and j.run_dir in out and
             j.checkpoint_dir in out and "exited with status 0" in out and
             f"{j.loss:.4f}" in out, f"a: status is readable:\n{out}")
    rc, out, err = cli(["status", job_id, "--json"], d)
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {}
    ck.check(rc == 0 and doc.get("state") == "SUCCEEDED" and doc.get("step") == 40 and
             doc.get("run_dir") == j.run_dir and doc.get("loss") == j.loss and
             doc.get("id") == job_id and doc.get("spec", {}).get("model", {}).get(
                 "n_embd") == 32 and "train_micro_batch_size_per_gpu" in doc["spec"]["deepspeed"],
             f"a: status --json agrees with GetJob ({sorted(doc)})")
    rc, out, err = cli(["list"], d)
    ck.check(rc == 0 and out.startswith("ID ") and re.search(rf"^{job_id}\s+SUCCEEDED\s+40/40",
                                                              out, re.M) is not None,
             f"a: list shows the job:\n{out}")
    rc, out, err = cli(["list", "--state", "running"], d)
    ck.check(rc == 0 and job_id not in out, "a: list --state running leaves it out")
    rc, out, err = cli(["logs", job_id, "--tail", "2"], d)
    ck.check(rc == 0 and len(out.splitlines()) == 2 and "exited with status 0" in out,
             f"a: logs --tail 2:\n{out}")


def case_b(d, tmp):
    jobdir = os.path.join(tmp, "jobs", "b")
    job = tiny_job(d.data_root, name="cli-b", max_steps=5)
    ds = job["deepspeed"]
    job["deepspeed"] = "conf/ds_config.json"
    write_job(os.path.join(jobdir, "conf", "ds_config.json"), ds)
    path = write_job(os.path.join(jobdir, "job.json"), job)
    rc, out, err = cli(["submit", os.path.relpath(path, tmp), "--wait"], env={
        "ZTRAIN_SERVER": d.grpc_addr}, cwd=tmp)
    ck.check(rc == 0 and re.fullmatch(r"job-\d+\n", out) is not None,
             f"b: submit --wait with a relative deepspeed path and ZTRAIN_SERVER: exit {rc} "
             f"{out.strip()} {err.strip()}")
    if rc == 0:
        j = get_job(d, out.strip())
        ck.check(json.loads(j.spec.deepspeed_json) == ds,
                 "b: the server got the DeepSpeed file's config")


def case_c(d, tmp):
    job = write_job(os.path.join(tmp, "jobs", "c.json"),
                    tiny_job(d.data_root, name="cli-c", max_steps=LONG, log_interval=5))
    rc, out, _ = cli(["submit", job], d)
    job_id = out.strip()
    wait_step(d, job_id, 10)
    follower = subprocess.Popen([ZTRAIN, "logs", job_id, "-f", "--server", d.grpc_addr],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = subprocess.Popen([ZTRAIN, "watch", job_id, "--from-step", "1000000000",
                                "--server", d.grpc_addr],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    rc, out, err = cli(["cancel", job_id, "--grace", "20"], d)
    ck.check(rc == 0 and out.strip() in (f"{job_id}: STOPPING - cancel requested",
                                         f"{job_id}: CANCELLED - cancel requested"),
             f"c: cancel answers '{out.strip()}' {err.strip()}")
    try:
        w_out, w_err = watcher.communicate(timeout=60)
        f_out, f_err = follower.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        watcher.kill()
        follower.kill()
        w_out = w_err = f_out = f_err = "(timed out)"
    ck.check(watcher.returncode == 3 and f"{job_id} CANCELLED at step" in w_out,
             f"c: watch exits 3 for a cancelled job ({watcher.returncode}: {w_out.strip()[-200:]})")
    ck.check(follower.returncode == 0 and "cancel requested" in f_out,
             f"c: logs -f ends with the job ({follower.returncode}, {len(f_out.splitlines())} lines)")

    # A data file too short is refused at submit (issue 20: errors early); init_from naming a file
    # that opens but holds no safetensors fails in the rank.
    write_data(d.data_root, "short.txt", b"tiny")
    bad = tiny_job(d.data_root, name="cli-fail", max_steps=5)
    bad["model"]["init_from"] = "short.txt"
    rc, out, _ = cli(["submit", write_job(os.path.join(tmp, "jobs", "fail.json"), bad)], d)
    rc, out, err = cli(["watch", out.strip()], d)
    ck.check(rc == 1 and "FAILED" in err and "too short for the 8-byte header" in err,
             f"c: watch exits 1 for a failed job, the reason on stderr ({rc}: {err.strip()})")


def case_d(d, tmp):
    job = tiny_job(d.data_root, name="cli-d")
    job["model"]["n_embed"] = job["model"].pop("n_embd")
    path = write_job(os.path.join(tmp, "jobs", "typo.json"), job)
    rc, out, err = cli(["submit", path], d)
    ck.check(rc == 1 and f"{path}: unknown key 'model.n_embed' (did you mean 'model.n_embd'?)"
             in err and not out, f"d: an unknown key is named: {err.strip()}")
    rc, out, err = cli(["status", "job-999999"], d)
    ck.check(rc == 1 and err.strip() == "ztrain: NOT_FOUND: jobs/job-999999 not found",
             f"d: an unknown id: {err.strip()}")
    rc, out, err = cli(["list", "--server", "127.0.0.1:1"])
    ck.check(rc == 1 and err.startswith("ztrain: 127.0.0.1:1: UNAVAILABLE: ") and not out,
             f"d: an unreachable server: {err.strip()[:100]}")
    rc, out, err = cli(["watch", "job-1", "--bogus"], d)
    ck.check(rc == 2 and "unknown option '--bogus'" in err, f"d: a bad option: exit {rc}")
    rc, out, err = cli(["status"], d)
    ck.check(rc == 2 and "the job id is missing" in err, f"d: a missing id: exit {rc}")
    rc, out, err = cli(["--help"])
    ck.check(rc == 0 and all(f"  {c} " in out for c in ("submit", "list", "status", "watch",
                                                          "logs", "cancel", "run", "sample")),
             "d: --help lists the remote commands beside the local ones")


def case_f(d, tmp):
    """The job file -> JobSpec mapping (job_proto.c) as the server ends up seeing it."""
    job = tiny_job(d.data_root, name="cli-f", max_steps=3, seed=0, warmup_steps=0)
    job["data"]["shuffle"] = False
    job["model"]["init_from"] = None
    job["train"]["bench_steps"] = 0
    rc, out, err = cli(["submit", write_job(os.path.join(tmp, "jobs", "f.json"), job)], d)
    spec = get_job(d, out.strip()).spec if rc == 0 else None
    ck.check(spec is not None and spec.data.WhichOneof("shuffle_present") == "shuffle" and
             not spec.data.shuffle and spec.train.WhichOneof("seed_present") == "seed" and
             spec.train.seed == 0 and spec.train.warmup_steps == 0 and
             spec.train.WhichOneof("warmup_steps_present") == "warmup_steps" and
             spec.model.init_from == "",
             f"f: shuffle false, seed 0 and warmup_steps 0 reach the server; null is absent ({err})")
    for mutate, text in (
            (lambda j: j["model"].update(n_layer="2"), "'model.n_layer' must be an integer"),
            (lambda j: j.update(world_size=0), "'world_size' must be >= 1, got 0"),
            (lambda j: j["train"].update(epochs=0), "'train.epochs' must be >= 1, got 0"),
            (lambda j: j["model"].update(n_head=0), "'model.n_head' must be >= 1, got 0"),
            (lambda j: j["model"].update(block_size=-4), "'model.block_size' must be >= 1, got -4"),
            (lambda j: j.update(deepspeed="missing/ds.json"), "deepspeed: "),
            (lambda j: j.update(deepspeed=[1]), "'deepspeed' must be an object or a path"),
            (lambda j: j.update(data="train.txt"), "'data'"),
            (lambda j: j.update(extra=1), "unknown key 'extra'")):
        bad = tiny_job(d.data_root, name="cli-f")
        mutate(bad)
        path = write_job(os.path.join(tmp, "jobs", "f-bad.json"), bad)
        rc, out, err = cli(["submit", path], d)
        ck.check(rc == 1 and not out and err.startswith(f"ztrain: {path}") and text in err,
                 f"f: refused before sending: {err.strip()}")
    with open(os.path.join(tmp, "jobs", "f-syntax.json"), "w") as f:
        f.write('{"name": "x",\n "model": {,}}')
    rc, out, err = cli(["submit", os.path.join(tmp, "jobs", "f-syntax.json")], d)
    ck.check(rc == 1 and "line 2, column" in err, f"f: a JSON syntax error: {err.strip()}")


def case_e(tmp):
    with Daemon(BUILD, os.path.join(tmp, "auth"), token="tok-123") as d:
        rc, out, err = cli(["list"], d)
        ck.check(rc == 1 and "UNAUTHENTICATED" in err, f"e: no token: {err.strip()}")
        rc, out, err = cli(["list", "--token-file", d.token_file], d)
        ck.check(rc == 0 and out.startswith("ID "), f"e: --token-file works ({err.strip()})")
        rc, out, err = cli(["list"], d, env={"ZTRAIN_TOKEN": "tok-123"})
        ck.check(rc == 0, f"e: ZTRAIN_TOKEN works ({err.strip()})")
        rc, out, err = cli(["list"], d, env={"ZTRAIN_TOKEN": "wrong"})
        ck.check(rc == 1 and "UNAUTHENTICATED" in err, "e: a wrong ZTRAIN_TOKEN is refused")


tmp = temp_dir("ztrain-cli-remote-")
with Daemon(BUILD, os.path.join(tmp, "main"), max_ranks=1) as d:
    for case in (case_a, case_b, case_c, case_d, case_f):
        t = time.monotonic()
        case(d, tmp)
        print(f"      ({case.__name__}: {time.monotonic() - t:.1f} s)")
t = time.monotonic()
case_e(tmp)
print(f"      (case_e: {time.monotonic() - t:.1f} s)")
ck.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind {d.sanitizer_errors()}")
ck.done()
