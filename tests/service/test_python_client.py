"""The Python client (clients/python), installed the way a user installs it and driven against a
real ztraind with a token (run in .venv/ for googleapis-common-protos).

  a. `pip install --no-deps --no-build-isolation --target DIR` of clients/python works offline
     with no compiler, and the rest of the test imports the client from DIR; its generated
     stubs are what generate.sh makes from proto/ztrain.proto today.
  b. A job built with the typed JobSpec builder, one from a job file's path (with "deepspeed" as
     a path beside it) and one POSTed to /api/v1/jobs as curl would, appear in one list() and
     all SUCCEEDED (wait()).
  c. watch() of a finished job gives typed events: Metrics whose steps and losses are the rank's
     own metrics.jsonl, and its JobUpdate (SUCCEEDED) first and last; metrics(["train/loss"]) equals
     metrics.jsonl; logs(tail=) gives the last lines, logs(follow=True) on a finished job ends.
  d. cancel() of a long job, then wait(): CANCELLED.
  e. Errors: a spec the builder can judge (n_embd not divisible by n_head, a misspelt key, a
     DeepSpeed batch mismatch, eval_interval without data.val) is a SpecError naming the field,
     and no job is made; a spec only the server can judge (a path outside its data root) is
     InvalidArgument with .field "spec.data.train"; a missing job is NotFound with .resource;
     a wrong token is Unauthenticated; a reused idempotency key with another spec is
     AlreadyExists naming the job.
  f. examples/python/quickstart.py, the notebook-style example, runs as written.
  g. list(state=) takes a JobState number, its name and its short name (the server's filter
     gives what get() says), and anything else is InvalidArgument naming state; a job file with
     checkpoint_interval and no checkpoint_dir is submitted (ztraind gives it RUNS/<id>/ckpt);
     wait() of a queued job survives a daemon stopped and started again 3 s later.
  Watched Metrics carry their record's seq, and watch(after_seq=) resumes after one."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyvenv import reexec_in_venv  # noqa: E402

reexec_in_venv()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, LONG, SOURCE, Checker, Daemon, read_metrics, temp_dir, tiny_job  # noqa: E402

ck = Checker()
TOKEN = "client-token"
CLIENT = os.path.join(SOURCE, "clients", "python")


def install(tmp):
    target = os.path.join(tmp, "site")
    # setuptools builds in the source folder (build/, *.egg-info): a copy keeps the tree clean.
    src = os.path.join(tmp, "client-src")
    shutil.copytree(CLIENT, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                               "*.egg-info"))
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "--target", target, src],
                         capture_output=True, text=True, timeout=240, cwd=tmp)
    ck.check(out.returncode == 0 and os.path.exists(os.path.join(target, "ztrain", "client.py")),
             f"a: pip install ./clients/python ({out.returncode}: {out.stderr[-300:]})")
    sys.path.insert(0, target)
    import ztrain
    ck.check(ztrain.__file__.startswith(target), f"a: the installed copy is used ({ztrain.__file__})")
    gen = os.path.join(tmp, "gen")
    os.makedirs(gen)
    subprocess.run([os.path.join(CLIENT, "generate.sh"), gen], check=True, timeout=60)
    for name in ("ztrain_pb2.py", "ztrain_pb2_grpc.py"):
        with open(os.path.join(gen, name), "rb") as a, \
                open(os.path.join(CLIENT, "ztrain", "_gen", name), "rb") as b:
            ck.check(a.read() == b.read(), f"a: the committed {name} is generate.sh's output")
    return ztrain


def losses(job):
    return [(r["train/global_step"], r["train/loss"])
            for r in read_metrics(os.path.join(job.run_dir, "metrics.jsonl")) if "train/loss" in r]


def case_b(ztrain, c, d):
    built = (ztrain.JobSpec(name="built", world_size=1)
             .model(type="gpt2", n_layer=2, n_head=2, n_embd=32, vocab_size=256, block_size=32)
             .data(train=tiny_job(d.data_root)["data"]["train"])
             .train(max_steps=6, log_interval=1, warmup_steps=0)
             .deepspeed({"train_micro_batch_size_per_gpu": 2,
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    j1 = c.submit(built)
    job = tiny_job(d.data_root, name="from-file", max_steps=4)
    folder = tempfile.mkdtemp(dir=d.dir)
    with open(os.path.join(folder, "ds.json"), "w") as f:
        json.dump(job.pop("deepspeed"), f)
    job["deepspeed"] = "ds.json"
    path = os.path.join(folder, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    j2 = c.submit(path)
    body = json.dumps({"spec": tiny_job(d.data_root, name="via-curl", max_steps=4)}).encode()
    req = urllib.request.Request(d.http_url + "/api/v1/jobs", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        j3 = json.loads(r.read())["id"]
    listed = [j.id for j in c.list()]
    ck.check({j1.id, j2.id, j3} <= set(listed), f"b: builder, file and curl jobs listed {listed}")
    for jid in (j1.id, j2.id, j3):
        end = c.wait(jid, timeout=120)
        ck.check(ztrain.state_name(end.state) == "SUCCEEDED",
                 f"b: {jid} ({end.name}) {ztrain.state_name(end.state)}")
    return c.get(j1.id)


def case_c(ztrain, c, job):
    events = list(c.watch(job.id, timeout=60))
    recs = [(e.step, e.values["train/loss"]) for e in events
            if isinstance(e, ztrain.Metrics) and "train/loss" in e.values]
    ref = losses(job)
    # A finished job's stream opens with its state (the current state first, always), replays
    # its history and ends with its terminal update.
    ck.check(isinstance(events[0], ztrain.JobUpdate) and isinstance(events[-1], ztrain.JobUpdate)
             and [e.state for e in events if isinstance(e, ztrain.JobUpdate)] ==
             ["SUCCEEDED", "SUCCEEDED"],
             f"c: watch() of a finished job opens and ends with its JobUpdate "
             f"({type(events[0]).__name__}, {type(events[-1]).__name__})")
    ck.check(len(ref) == 6 and recs == ref, f"c: watched losses are metrics.jsonl's ({recs})")
    seqs = [e.seq for e in events if isinstance(e, ztrain.Metrics)]
    ck.check(seqs == list(range(1, len(seqs) + 1)),
             f"c: each Metrics carries its record's seq 1, 2, ... ({seqs})")
    resumed = [e.seq for e in c.watch(job.id, after_seq=2, timeout=60)
               if isinstance(e, ztrain.Metrics)]
    ck.check(resumed == seqs[2:], f"c: watch(after_seq=2) resumes after record 2 ({resumed})")
    m = c.metrics(job.id, ["train/loss"])
    ck.check(list(m) == ["train/loss"] and m["train/loss"] == ref,
             f"c: metrics() equals metrics.jsonl ({m.get('train/loss')})")
    tail = list(c.logs(job.id, tail=2))
    ck.check(len(tail) == 2 and all(isinstance(l.text, str) for l in tail),
             f"c: logs(tail=2) ({[l.text for l in tail]})")
    followed = list(c.logs(job.id, tail=1, follow=True, timeout=60))
    ck.check(len(followed) == 1, "c: logs(follow=True) of a finished job ends")


def case_d(ztrain, c, d):
    long_job = c.submit(tiny_job(d.data_root, name="long", max_steps=LONG))
    for ev in c.watch(long_job.id, timeout=60):
        if isinstance(ev, ztrain.Metrics):
            break
    c.cancel(long_job.id, force=True)
    end = c.wait(long_job.id, timeout=60)
    ck.check(ztrain.state_name(end.state) == "CANCELLED", "d: cancel() then wait(): CANCELLED")


def case_e(ztrain, c, d):
    before = len(list(c.list()))
    bad = []
    j = tiny_job(d.data_root)
    j["model"].update(n_embd=30, n_head=4)
    bad.append(("n_embd % n_head", j, "spec.model.n_embd"))
    j = tiny_job(d.data_root)
    j["model"]["n_embed"] = 32
    bad.append(("a misspelt key", j, "spec.model.n_embed"))
    j = tiny_job(d.data_root, deepspeed={"train_batch_size": 3, "gradient_accumulation_steps": 1,
                                         "train_micro_batch_size_per_gpu": 2})
    bad.append(("a batch mismatch", j, "spec.deepspeed.train_batch_size"))
    j = tiny_job(d.data_root, eval_interval=5)
    bad.append(("eval_interval without data.val", j, "spec.train.eval_interval"))
    for what, job, field in bad:
        try:
            c.submit(job)
            got = None
        except ztrain.SpecError as e:
            got = e.field
        ck.check(got == field, f"e: {what}: SpecError {got!r}")
    ck.check(len(list(c.list())) == before, "e: no job was made by a refused spec")

    job = tiny_job(d.data_root)
    job["data"]["train"] = "/etc/passwd"
    try:
        c.submit(job)
        err = None
    except ztrain.InvalidArgument as e:
        err = e
    ck.check(err is not None and err.field == "spec.data.train" and err.violations and
             err.violations[0].kind == "field", f"e: a path outside the data root: {err!r}")
    try:
        c.get("job-777777")
        err = None
    except ztrain.NotFound as e:
        err = e
    ck.check(err is not None and err.resource == "jobs/job-777777", f"e: NotFound {err!r}")
    try:
        list(ztrain.Client(d.grpc_addr, token="wrong").list())
        err = None
    except ztrain.Unauthenticated as e:
        err = e
    ck.check(err is not None, f"e: a wrong token: {err!r}")
    first = c.submit(tiny_job(d.data_root, name="keyed", max_steps=2), idempotency_key="key-1")
    same = c.submit(tiny_job(d.data_root, name="keyed", max_steps=2), idempotency_key="key-1")
    try:
        c.submit(tiny_job(d.data_root, name="other", max_steps=2), idempotency_key="key-1")
        err = None
    except ztrain.AlreadyExists as e:
        err = e
    ck.check(same.id == first.id and err is not None and err.resource == f"jobs/{first.id}",
             f"e: idempotency: same job {same.id == first.id}, AlreadyExists {err!r}")
    c.wait(first.id, timeout=120)


def case_g(ztrain, c, d):
    """list()'s state in every documented form; a job with checkpoint_interval and no
    checkpoint_dir, which ztraind accepts (it gives the job RUNS/<id>/ckpt); wait() across a
    daemon restart."""
    every = list(c.list())
    want = [j.id for j in every if j.state == ztrain.pb.JOB_STATE_SUCCEEDED]
    for form in (5, ztrain.pb.JOB_STATE_SUCCEEDED, "SUCCEEDED", "succeeded",
                 "JOB_STATE_SUCCEEDED"):
        got = [j.id for j in c.list(state=form)]
        ck.check(got == want and want, f"g: list(state={form!r}) is the SUCCEEDED jobs ({got})")
    for form in ("bogus", 99, -1, 2.5, True):
        try:
            c.list(state=form)
            err = None
        except ztrain.InvalidArgument as e:
            err = e
        ck.check(err is not None and err.field == "state" and "state" in str(err),
                 f"g: list(state={form!r}) is InvalidArgument naming state ({err!r})")

    job = tiny_job(d.data_root, name="server-ckpt", max_steps=4, checkpoint_interval=2)
    path = os.path.join(tempfile.mkdtemp(dir=d.dir), "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    try:
        j = c.submit(path)
        err = None
    except ztrain.ZtrainError as e:
        j, err = None, e
    end = c.wait(j.id, timeout=120) if j else None
    ckdir = os.path.join(d.runs_root, j.id, "ckpt") if j else ""
    ck.check(err is None and end and ztrain.state_name(end.state) == "SUCCEEDED" and
             os.path.realpath(end.checkpoint_dir) == os.path.realpath(ckdir) and
             os.path.isdir(ckdir),
             f"g: checkpoint_interval without checkpoint_dir is submitted and checkpoints in "
             f"RUNS/<id>/ckpt ({err!r}, {end and end.checkpoint_dir})")

    # wait() on a queued job while the daemon stops (SIGTERM: queued jobs stay queued) and
    # starts again 3 s later on the same ports and state.
    busy = c.submit(tiny_job(d.data_root, name="busy", max_steps=LONG))
    queued = c.submit(tiny_job(d.data_root, name="queued", max_steps=4))
    for ev in c.watch(busy.id, timeout=60):
        if isinstance(ev, ztrain.Metrics):
            break
    result = {}

    def waiter():
        try:
            result["job"] = c.wait(queued.id, timeout=240)
        except Exception as e:  # noqa: BLE001 - reported by the check below
            result["error"] = e
    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.5)
    d.stop()
    time.sleep(3)
    d.start()
    t.join(240)
    got = result.get("job")
    ck.check(got is not None and ztrain.state_name(got.state) == "SUCCEEDED",
             f"g: wait() of a queued job rides out a daemon restart and returns it SUCCEEDED "
             f"({got and ztrain.state_name(got.state)}, {result.get('error')!r})")


def case_f(d, site):
    """The notebook-style example runs as written against this daemon."""
    env = dict(os.environ, ZTRAIN_ADDR=d.grpc_addr, ZTRAIN_TOKEN=TOKEN,
               PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "python",
                                                       "quickstart.py")],
                         capture_output=True, text=True, timeout=180, env=env)
    ck.check(out.returncode == 0 and "SUCCEEDED at step 20" in out.stdout and
             "refused locally: spec.model.n_embd" in out.stdout and
             "NOT_FOUND jobs/job-999999" in out.stdout,
             f"f: examples/python/quickstart.py runs ({out.returncode}): "
             f"{(out.stdout + out.stderr)[-400:]}")


def main():
    tmp = temp_dir("ztrain-pyclient-")
    ztrain = install(tmp)
    with Daemon(BUILD, os.path.join(tmp, "d"), max_ranks=1, token=TOKEN) as d:
        with ztrain.Client(d.grpc_addr, token=TOKEN) as c:
            job = case_b(ztrain, c, d)
            case_c(ztrain, c, job)
            case_d(ztrain, c, d)
            case_e(ztrain, c, d)
            case_g(ztrain, c, d)
        case_f(d, os.path.join(tmp, "site"))
    ck.done()


if __name__ == "__main__":
    main()
