"""The ztrain CLI's remote commands (submit, list, status, watch, logs, cancel) against a real
ztraind, with their output and exit statuses as scripts see them (stdout is not a terminal).

  a. `submit JOB.json` prints just the job id; `watch ID` follows it to SUCCEEDED (exit 0) with
     plain progress lines; `status` shows state, step, loss, ranks and directories; `status
     --json` and `-o json` are the HTTP body of GET /api/v1/jobs/{id}, which json_format.Parse
     reads into GetJob's Job; `list` and `list --state` show it; `logs --tail N`.
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
     read as "default", a missing DeepSpeed file and JSON syntax errors are refused locally.
  g. --server and --token-file before the command (`ztrain --server HOST:PORT list`); an
     address that is not HOST:PORT with a port 1-65535 (or unix:PATH), from --server or
     ZTRAIN_SERVER, is exit 2 naming its source; `list -o json` against an unreachable server
     prints nothing on stdout; `submit --dry-run` of a job with checkpoint_interval and no
     checkpoint_dir passes as the server accepts it (`validate`, judging a local run, refuses
     it); `watch` prints eval records as eval lines with metrics.jsonl's eval loss; `watch` of
     a queued job survives ztraind stopping and starting again."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

from google.protobuf import json_format

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
    # -o json is the API object, as kubectl prints it: the HTTP body of GET /api/v1/jobs/{id},
    # which is the proto3 JSON mapping of GetJob's Job. protobuf's own parser (strict: an
    # unknown or misspelt field is an error) reads it, and protobuf's own printer gives the same
    # JSON from the Job gRPC answers with (its NaN figures as "NaN").
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}", timeout=30) as r:
        body = json.loads(r.read())
    want = json_format.MessageToDict(j)
    for form in (["--json"], ["-o", "json"]):
        rc, out, err = cli(["status", job_id] + form, d)
        try:
            doc = json.loads(out)
            json_format.Parse(out, pb.Job())
            parsed = "parses"
        except (ValueError, json_format.ParseError) as e:
            doc, parsed = {}, f"{type(e).__name__}: {e}"
        ck.check(rc == 0 and doc == body,
                 f"a: status {' '.join(form)} is GET /api/v1/jobs/{job_id}'s body "
                 f"({sorted(doc)} vs {sorted(body)})")
        differ = sorted(k for k in set(doc) | set(want) if doc.get(k) != want.get(k))
        ck.check(parsed == "parses" and doc == want,
                 f"a: status {' '.join(form)}: json_format.Parse reads it as a Job ({parsed}) "
                 f"and it is json_format.MessageToDict of GetJob's Job (differing: {differ})")
    ck.check(doc.get("state") == "JOB_STATE_SUCCEEDED" and doc.get("step") == "40" and
             doc.get("runDir") == j.run_dir and doc.get("comm", "") == j.comm and
             "createTime" in doc and "created_unix_ms" not in doc,
             "a: status -o json spells the mapping's names (state JOB_STATE_SUCCEEDED, step "
             f"\"40\", runDir, comm {j.comm!r}, createTime)")
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


def case_g(d, tmp):
    """Defects found by exploratory testing: global options before the command, the address
    checked, `list -o json` on failure, dry-run as the server judges, eval lines in `watch`, and
    `watch` riding out a daemon restart."""
    e = {k: v for k, v in os.environ.items() if k not in ("ZTRAIN_SERVER", "ZTRAIN_TOKEN")}

    def bare(args, env=None):
        p = subprocess.run([ZTRAIN] + args, capture_output=True, text=True, timeout=120,
                           env=dict(e, **(env or {})))
        return p.returncode, p.stdout, p.stderr
    for args in (["--server", d.grpc_addr, "list"], [f"--server={d.grpc_addr}", "list"],
                 ["--server", d.grpc_addr, "list", "-o", "name"]):
        rc, out, err = bare(args)
        ck.check(rc == 0 and (out.startswith("ID ") or re.match(r"job-\d+\n", out)),
                 f"g: ztrain {' '.join(args)}: the global option before the command works "
                 f"({rc}: {err.strip()})")
    rc, out, err = bare(["--server", d.grpc_addr, "run", "job.json"])
    ck.check(rc == 2 and "--server is an option of the commands that talk to ztraind" in err,
             f"g: --server before a local command is a usage error ({rc}: {err.strip()})")
    for bad in ("127.0.0.1:99999", "", "127.0.0.1", "127.0.0.1:0", "host:50x", ":50051"):
        rc, out, err = bare(["list", "--server", bad])
        ck.check(rc == 2 and not out and f"--server '{bad}' is not an address" in err and
                 "UNAVAILABLE" not in err and "UNKNOWN" not in err,
                 f"g: --server {bad!r} is refused by name, exit 2 ({rc}: {err.strip()})")
        rc, out, err = bare(["list"], env={"ZTRAIN_SERVER": bad} if bad else None)
        if bad:
            ck.check(rc == 2 and f"ZTRAIN_SERVER '{bad}' is not an address" in err,
                     f"g: ZTRAIN_SERVER={bad!r} is refused by name ({rc}: {err.strip()})")
    for good in ("[::1]:1", "localhost:1", "unix:/nonexistent/ztraind.sock"):
        rc, out, err = bare(["list", "--server", good])
        ck.check(rc == 1 and "is not an address" not in err,
                 f"g: --server {good} is an address (dialled, unreachable: {err.strip()[:80]})")
    rc, out, err = bare(["list", "-o", "json", "--server", "127.0.0.1:1"])
    ck.check(rc == 1 and out == "" and "UNAVAILABLE" in err,
             f"g: list -o json with the server unreachable prints nothing on stdout ({out!r})")
    rc, out, err = cli(["list", "-o", "json"], d)
    try:
        listed = json.loads(out)["jobs"]
    except (ValueError, KeyError):
        listed = None
    ck.check(rc == 0 and listed, f"g: list -o json is one JSON document ({rc}, {out[:60]!r})")

    # A job with checkpoint_interval and no checkpoint_dir: ztraind gives it RUNS/<id>/ckpt, so
    # neither the dry run nor the submit refuses it.
    job = tiny_job(d.data_root, name="cli-g", max_steps=20, log_interval=5, eval_interval=10,
                   eval_steps=1, checkpoint_interval=10)
    job["data"]["val"] = job["data"]["train"]
    # Beside its data, so that the dry run's local file checks find it.
    path = write_job(os.path.join(d.data_root, "g.json"), job)
    rc, out, err = cli(["submit", path, "--dry-run"], d)
    ck.check(rc == 0 and "checkpoint_dir is not set:" in err and "but train.checkpoint_dir"
             not in err,
             f"g: submit --dry-run of a job without checkpoint_dir passes ({rc}: "
             f"{err.strip()[-200:]})")
    rc, out, err = cli(["validate", path])
    ck.check(rc == 1 and "train.checkpoint_interval is 10 but train.checkpoint_dir is not set"
             in err, f"g: the local validate still refuses it ({rc}: {err.strip()[-120:]})")
    rc, out, err = cli(["submit", path], d)
    job_id = out.strip()
    rc, out, err = cli(["watch", job_id], d)
    j = get_job(d, job_id)
    recs = [json.loads(x) for x in open(os.path.join(j.run_dir, "metrics.jsonl")) if x.strip()]
    evals = [f"{job_id}: step {r['train/global_step']}/20  eval loss {r['eval/loss']:.4f}"
             for r in recs if "eval/loss" in r]
    lines = out.splitlines()
    progress = [l for l in lines if re.match(rf"{job_id}: step \d+/20  loss ", l)]
    ck.check(rc == 0 and evals and [l for l in lines if " eval loss " in l] == evals and
             len(progress) == sum("train/loss" in r for r in recs),
             f"g: watch prints each eval record as an eval line ({evals}) and one progress line "
             f"per train record ({len(progress)}):\n{out}")

    # watch of a queued job while ztraind stops (its queued jobs stay queued) and starts again
    # 3 s later: it reconnects and follows the job to its end.
    busy = cli(["submit", write_job(os.path.join(tmp, "jobs", "g-busy.json"),
                                     tiny_job(d.data_root, name="g-busy", max_steps=LONG))],
               d)[1].strip()
    queued = cli(["submit", write_job(os.path.join(tmp, "jobs", "g-queued.json"),
                                       tiny_job(d.data_root, name="g-queued", max_steps=4))],
                 d)[1].strip()
    wait_step(d, busy, 1)
    watcher = subprocess.Popen([ZTRAIN, "watch", queued, "--server", d.grpc_addr],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    d.stop()
    time.sleep(3)
    d.start()
    try:
        w_out, w_err = watcher.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        watcher.kill()
        w_out, w_err = watcher.communicate()
    ck.check(watcher.returncode == 0 and f"{queued} SUCCEEDED: step 4/4" in w_out and
             "reconnecting" in w_err,
             f"g: watch rides out a daemon restart ({watcher.returncode}: {w_out.strip()[-120:]} "
             f"{w_err.strip()[-200:]})")
    # The daemon answered before it went away: a closed socket is a restart, not a TLS server
    # (the TLS hint is for a first call that a TLS server closes: test_tls).
    ck.check("TLS" not in w_err, f"g: the reconnect line does not blame TLS ({w_err.strip()[-300:]})")


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
    for case in (case_a, case_b, case_c, case_d, case_f, case_g):
        t = time.monotonic()
        case(d, tmp)
        print(f"      ({case.__name__}: {time.monotonic() - t:.1f} s)")
t = time.monotonic()
case_e(tmp)
print(f"      (case_e: {time.monotonic() - t:.1f} s)")
ck.check(not d.sanitizer_errors(), f"no sanitizer report from ztraind {d.sanitizer_errors()}")
ck.done()
