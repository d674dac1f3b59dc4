"""The Python client (clients/python), installed the way a user installs it and driven against a
real ztraind with a token (run in .venv/ for googleapis-common-protos).

  a. `pip install --no-deps --no-build-isolation --target DIR` of clients/python works offline
     with no compiler, and the rest of the test imports the client from DIR; its generated
     stubs (and google.rpc's descriptors) are what generate.sh makes from proto/ztrain.proto
     today. tests/service/test_python_client_debian.py runs the client without
     googleapis-common-protos.
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
  Watched Metrics carry their record's seq, and watch(after_seq=) resumes after one.
  h. metrics(as_frame=True) of a job that evaluates (train/global_step in a step's train and
     eval records) equals the frame plain pandas makes of its metrics.jsonl (the records of a
     step merged, the later one's value kept); a step recorded twice, as after a restart, keeps
     the later record's values.
  i. Every gRPC status code has its ApiError subclass, named as google-api-core names it, with
     .code, .message and .details: PERMISSION_DENIED (a read-scoped token submitting),
     DEADLINE_EXCEEDED (a call past its timeout) and UNIMPLEMENTED (a method ztraind lacks)
     from this daemon.
  j. A token with a trailing newline (open(f).read()) works; an empty or blank one (which
     ztrain refuses from a token file and from ZTRAIN_TOKEN, checked here) or one with a line
     break inside is InvalidArgument naming token; a closed Client raises ClientClosed, a
     ZtrainError.
  k. A job file whose "deepspeed" file is not JSON is a SpecError naming spec.deepspeed, the
     file, the line and the column.
  l. metrics(id, "train/loss"), one key as a string, is that key's series (metrics.jsonl's);
     tls with a certificate and no key, a key and no certificate (which abort grpc's C core),
     a key where the certificate goes, or a CA file holding no certificate, is InvalidArgument
     naming tls, tls.key or tls.ca, in a child process that then exits normally.
  m. A fork whose fork_from.job is the parent's resource name "jobs/ID" (the form errors name
     it in) forks that job, and Job.spec.fork_from.job is its id.
  e. also covers DeepSpeed's batch rule with two of the three batch keys given (the third
     inferred); tests/deepspeed/test_client_batch_rule.py checks the rule against DeepSpeed."""
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
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cli"))
from cliref import ZTRAIN  # noqa: E402

ck = Checker()
TOKEN = "client-token"
READ_TOKEN = "client-read-token"
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
    for name in ("ztrain_pb2.py", "ztrain_pb2_grpc.py", "rpc_descriptors.py"):
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
    j = tiny_job(d.data_root, deepspeed={"train_batch_size": 8,
                                         "train_micro_batch_size_per_gpu": 3})
    bad.append(("train_batch_size 8 with micro batch 3 (accumulation inferred: 2)", j,
                "spec.deepspeed.train_batch_size"))
    j = tiny_job(d.data_root, world_size=4, deepspeed={"train_batch_size": 4,
                                                       "train_micro_batch_size_per_gpu": 4})
    bad.append(("4 ranks, train_batch_size 4, micro batch 4 (accumulation inferred: 0)", j,
                "spec.deepspeed.gradient_accumulation_steps"))
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


def case_h(ztrain, c, d):
    """metrics(as_frame=True) against plain pandas on the job's own records."""
    import pandas as pd

    job = tiny_job(d.data_root, name="evals", max_steps=6, eval_interval=2, eval_steps=1)
    job["data"]["val"] = job["data"]["train"]
    j = c.submit(job)
    end = c.wait(j.id, timeout=120)
    rows = read_metrics(os.path.join(end.run_dir, "metrics.jsonl"))
    steps = [r["train/global_step"] for r in rows]
    ck.check(len(steps) > len(set(steps)),
             f"h: the job's steps have several records ({len(rows)} records, steps {steps})")
    raw = pd.DataFrame(rows)
    # The records of a step merged, in file order: groupby().last() keeps each column's last
    # non-null value.
    want = raw.select_dtypes("number").groupby(raw["train/global_step"]).last().sort_index()
    try:
        got = c.metrics(j.id, as_frame=True)
        err = None
    except Exception as e:  # noqa: BLE001 - reported by the check
        got, err = None, e
    same = False
    if got is not None:
        cols = sorted(set(got.columns) & set(want.columns))
        same = (list(got.index) == list(want.index) and got.index.name == "step" and
                cols and set(got.columns) <= set(want.columns) and
                all(c_ in got.columns for c_ in ("train/loss", "eval/loss", "train/global_step"))
                and got[cols].astype(float).equals(want[cols].astype(float)))
    ck.check(same, f"h: as_frame of an evaluating job is plain pandas' frame of metrics.jsonl "
                   f"({err!r}; {None if got is None else got.shape} vs {want.shape})")

    # A step recorded twice (a restart from a checkpoint at step 2): the later record wins.
    records = [(1, {"train/loss": 4.0}), (2, {"train/loss": 3.0}), (3, {"train/loss": 2.5}),
               (2, {"train/loss": 3.5}), (3, {"train/loss": 2.0, "eval/loss": 2.2}),
               (4, {"train/loss": 1.5})]
    resp = ztrain.pb.GetMetricsResponse()
    for key in ("train/loss", "eval/loss"):
        pts = [(s_, v[key]) for s_, v in records if key in v]
        resp.series.add(key=key, steps=[p[0] for p in pts], values=[p[1] for p in pts])
    offline = ztrain.Client(d.grpc_addr, token=TOKEN)
    offline._call = lambda method, request, timeout=None: resp
    got = offline.metrics("job-1", as_frame=True)
    offline.close()
    ref = pd.DataFrame([dict(v, step=s_) for s_, v in records]).groupby("step").last()
    ck.check(got.astype(float).equals(ref[list(got.columns)].astype(float)) and
             list(got.columns) == ["train/loss", "eval/loss"],
             f"h: a step recorded twice keeps the later record's values "
             f"({got.to_dict()} vs {ref.to_dict()})")


def case_i(ztrain, c, d):
    """An ApiError subclass per gRPC status code, and three codes from the daemon itself."""
    import grpc

    # google-api-core's names for the codes (google/api_core/exceptions.py).
    api_core = {"CANCELLED": "Cancelled", "UNKNOWN": "Unknown",
                "INVALID_ARGUMENT": "InvalidArgument", "DEADLINE_EXCEEDED": "DeadlineExceeded",
                "NOT_FOUND": "NotFound", "ALREADY_EXISTS": "AlreadyExists",
                "PERMISSION_DENIED": "PermissionDenied",
                "RESOURCE_EXHAUSTED": "ResourceExhausted",
                "FAILED_PRECONDITION": "FailedPrecondition", "ABORTED": "Aborted",
                "OUT_OF_RANGE": "OutOfRange", "UNIMPLEMENTED": "MethodNotImplemented",
                "INTERNAL": "InternalServerError", "UNAVAILABLE": "ServiceUnavailable",
                "DATA_LOSS": "DataLoss", "UNAUTHENTICATED": "Unauthenticated"}
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        cls = getattr(ztrain, api_core.get(code.name, "?"), None)
        ck.check(cls is not None and issubclass(cls, ztrain.ApiError) and
                 cls is not ztrain.ApiError and cls.grpc_status_code == code and
                 ztrain.errors._BY_CODE.get(code.name) is cls,
                 f"i: {code.name} raises ztrain.{api_core.get(code.name)} ({cls})")

    def failure(call):
        try:
            call()
        except ztrain.ZtrainError as e:
            return e
        return None

    job = tiny_job(d.data_root, name="read-scope", max_steps=2)
    with ztrain.Client(d.grpc_addr, token=READ_TOKEN) as reader:
        e = failure(lambda: reader.submit(job))
    ck.check(isinstance(e, ztrain.PermissionDenied) and e.code == "PERMISSION_DENIED" and
             "scope is read" in e.message and isinstance(e.details, list),
             f"i: a read token's submit is PermissionDenied: {e!r}")
    # A watch of a job that runs on past the call's timeout.
    long_job = c.submit(tiny_job(d.data_root, name="outlives-timeout", max_steps=LONG))
    e = failure(lambda: list(c.watch(long_job.id, timeout=1.0)))
    c.cancel(long_job.id, force=True)
    c.wait(long_job.id, timeout=60)
    ck.check(isinstance(e, ztrain.DeadlineExceeded) and e.code == "DEADLINE_EXCEEDED" and
             e.message, f"i: a call past its timeout is DeadlineExceeded: {e!r}")
    channel = grpc.insecure_channel(d.grpc_addr)
    absent = channel.unary_unary("/ztrain.v1.Trainer/NoSuchMethod")
    try:
        absent(b"", metadata=[("authorization", f"Bearer {TOKEN}")], timeout=30)
        e = None
    except grpc.RpcError as rpc:
        e = ztrain.errors.from_rpc_error(rpc)
    channel.close()
    ck.check(isinstance(e, ztrain.MethodNotImplemented) and e.code == "UNIMPLEMENTED" and
             e.details == [], f"i: a method ztraind lacks is MethodNotImplemented: {e!r}")
    e = failure(lambda: c.get("job-777777"))
    ck.check(isinstance(e, ztrain.NotFound) and any(
        type(x).__name__ == "ResourceInfo" and x.resource_name == "jobs/job-777777"
        for x in e.details), f"i: NotFound's .details hold its ResourceInfo: {e!r}")


def case_j(ztrain, c, d):
    """Tokens as files hold them; a closed Client."""
    for form in (TOKEN + "\n", TOKEN + "\r\n", f"  {TOKEN}\n"):
        try:
            with ztrain.Client(d.grpc_addr, token=form) as tc:
                n = len(list(tc.list()))
            err = None
        except Exception as e:  # noqa: BLE001 - reported by the check
            n, err = None, e
        ck.check(err is None and n, f"j: token={form!r} works as the file's token ({err!r})")
    # The CLI is the reference for what an empty or blank token is: an empty --token-file and
    # ZTRAIN_TOKEN="" are refused (exit 1 naming the file or the variable), never a call without
    # a token; the Python client must refuse the same strings as InvalidArgument naming token.
    for form in ("", "\n", "   "):
        path = os.path.join(d.dir, "empty-token")
        with open(path, "w") as f:
            f.write(form)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZTRAIN_TOKEN")}
        by_file = subprocess.run([ZTRAIN, "--server", d.grpc_addr, "--token-file", path, "list"],
                                 capture_output=True, text=True, timeout=60, env=env)
        by_env = subprocess.run([ZTRAIN, "--server", d.grpc_addr, "list"], capture_output=True,
                                text=True, timeout=60, env=dict(env, ZTRAIN_TOKEN=form))
        ck.check(by_file.returncode == 1 and path in by_file.stderr and
                 by_env.returncode == 1 and "ZTRAIN_TOKEN" in by_env.stderr,
                 f"j: ztrain refuses the token {form!r} from a file and from ZTRAIN_TOKEN "
                 f"({by_file.stderr.strip()[:80]} / {by_env.stderr.strip()[:80]})")
    for form in ("", "\n", "   ", TOKEN + "\nother", "tok en"):
        try:
            ztrain.Client(d.grpc_addr, token=form)
            err = None
        except ztrain.InvalidArgument as e:
            err = e
        ck.check(err is not None and err.field == "token" and "token" in str(err),
                 f"j: token={form!r} is InvalidArgument naming token ({err!r})")
    closed = ztrain.Client(d.grpc_addr, token=TOKEN)
    closed.close()
    for what, call in (("get", lambda: closed.get("job-000001")),
                       ("list", lambda: list(closed.list())),
                       ("watch", lambda: list(closed.watch("job-000001")))):
        try:
            call()
            err = None
        except Exception as e:  # noqa: BLE001 - reported by the check
            err = e
        ck.check(isinstance(err, ztrain.ClientClosed) and isinstance(err, ztrain.ZtrainError)
                 and "closed" in str(err), f"j: {what}() on a closed Client: {err!r}")


def case_k(ztrain, c, d):
    """A job file whose "deepspeed" file is not JSON: the client's SpecError naming it."""
    folder = os.path.join(tempfile.mkdtemp(dir=d.dir), "sub")
    os.makedirs(folder)
    with open(os.path.join(folder, "ds_config.json"), "w") as f:
        f.write('{"train_micro_batch_size_per_gpu": 2,\n "optimizer": }\n')
    job = tiny_job(d.data_root, name="j2")
    job["deepspeed"] = "ds_config.json"
    with open(os.path.join(folder, "j2.json"), "w") as f:
        json.dump(job, f)
    ref = None
    try:
        with open(os.path.join(folder, "ds_config.json")) as f:
            json.load(f)
    except json.JSONDecodeError as e:
        ref = e
    try:
        c.submit(os.path.join(folder, "j2.json"))
        err = None
    except Exception as e:  # noqa: BLE001 - reported by the check
        err = e
    ck.check(isinstance(err, ztrain.SpecError) and err.field == "spec.deepspeed" and
             os.path.join(folder, "ds_config.json") in str(err) and
             f"line {ref.lineno} column {ref.colno}" in str(err),
             f"k: a bad ds_config.json beside the job file is a SpecError naming it: {err!r}")


def case_l(ztrain, c, job, d, site):
    """One metric key given as a string; a client certificate without its key."""
    m = c.metrics(job.id, "train/loss")
    ck.check(m == {"train/loss": losses(job)},
             f"l: metrics(id, \"train/loss\") is that key's series, not one per character "
             f"({sorted(m)[:5]})")
    # grpc's C core aborts the process on a certificate without its key: the client refuses
    # it first, naming tls, in a child so that an abort is seen as one.
    certs = os.path.join(d.dir, "certs")
    os.makedirs(certs, exist_ok=True)
    key, cert = os.path.join(certs, "c.key"), os.path.join(certs, "c.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=client"], check=True, capture_output=True)
    for tls, field in (({"ca": cert, "cert": cert}, "tls"), ({"ca": cert, "key": key}, "tls"),
                       ({"ca": cert, "cert": key, "key": cert}, "tls.key"),
                       ({"ca": key}, "tls.ca")):
        code = (f"import ztrain\ntry:\n    list(ztrain.Client({d.grpc_addr!r}, token={TOKEN!r},"
                f" tls={tls!r}, timeout=5).list())\nexcept ztrain.InvalidArgument as e:\n"
                f"    print('field', e.field)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, env=dict(os.environ, PYTHONPATH=site))
        ck.check(out.returncode == 0 and f"field {field}" in out.stdout,
                 f"l: tls={sorted(tls)} is InvalidArgument naming {field} "
                 f"(exit {out.returncode}: {(out.stdout + out.stderr)[-160:]!r})")


def case_m(ztrain, c, d):
    """A fork whose fork_from.job is the parent's resource name "jobs/ID"."""
    parent = c.submit(tiny_job(d.data_root, name="parent", max_steps=4, checkpoint_interval=2))
    c.wait(parent.id, timeout=120)
    try:
        fork = c.submit(ztrain.JobSpec.from_dict(tiny_job(d.data_root, name="fork", max_steps=4))
                        .fork_from(job=f"jobs/{parent.id}", step=2))
        end, err = c.wait(fork.id, timeout=120), None
    except ztrain.ZtrainError as e:
        end, err = None, e
    ck.check(err is None and ztrain.state_name(end.state) == "SUCCEEDED" and
             end.spec.fork_from.job == parent.id and end.spec.fork_from.step == 2,
             f"m: fork_from.job jobs/{parent.id} forks {parent.id} at step 2 "
             f"({err!r}, {end and end.spec.fork_from})")


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
    d = Daemon(BUILD, os.path.join(tmp, "d"), max_ranks=1, token=TOKEN, start=False)
    with open(d.token_file, "a") as f:
        f.write(f"{READ_TOKEN} read\n")
    d.start()
    with d:
        with ztrain.Client(d.grpc_addr, token=TOKEN) as c:
            job = case_b(ztrain, c, d)
            case_c(ztrain, c, job)
            case_d(ztrain, c, d)
            case_e(ztrain, c, d)
            case_h(ztrain, c, d)
            case_i(ztrain, c, d)
            case_j(ztrain, c, d)
            case_k(ztrain, c, d)
            case_l(ztrain, c, job, d, os.path.join(tmp, "site"))
            case_m(ztrain, c, d)
            case_g(ztrain, c, d)
        case_f(d, os.path.join(tmp, "site"))
    ck.done()


if __name__ == "__main__":
    main()
