"""/metrics read as a Prometheus server reads it, by the rules of the text exposition format
(version 0.0.4: https://prometheus.io/docs/instrumenting/exposition_formats/), with a real
ztraind and a job whose last step's gradient norm was NaN (a skipped update, as
ZTRAIN_INJECT_NAN_GRAD makes it).
  a. Every line is a comment or a sample `name{labels} value`; a value is a Go float
     (ParseFloat: a number, NaN, +Inf or -Inf); every family has one TYPE line before its
     samples and no series (name and labels) appears twice; a job name with a quote, a
     backslash, a brace and UTF-8 reads back as it was submitted.
  b. The gauges say what the job's last record says (metrics.jsonl, the independent source):
     its step, loss and skipped-steps counter, and ztrain_job_grad_norm is NaN, as the record's
     train/grad_norm (null there: not finite). Before, the series vanished at such a step: a
     diverging job's norm could not be seen nor alerted on.
  c. After a daemon restart the same series have the same values: the counter does not go
     down, and the NaN is still NaN.
  d. A job whose rank is killed at step 20 and restarted (max_restarts) from step 0, having no
     checkpoint yet: while the resumed run is below step 20, ztrain_job_step and GetJob's step
     are the newest record's step and the record-key gauges (learning rate, step time, skipped
     steps) are there. Before, the step stayed at 20 and those series vanished until the
     resumed run passed it.
  e. A job whose eval_interval (3) is not a multiple of its log_interval (5): while its newest
     record is an eval-only one (train/global_step and eval/loss), each record-key gauge keeps
     the value of the newest record that has its key (metrics.jsonl's last train record).
     Before, the loss, learning rate and grad norm vanished from the scrape until the next
     logged step.
prometheus_client's own parser also reads the scrape, where it is installed."""
import json
import math
import os
import re
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import (BUILD, Checker, Daemon, get_job, spec_proto, state_name, stubs, submit,  # noqa: E402
                 temp_dir, tiny_job, wait_state)

ck = Checker()
NAME = 'quote" backslash\\ brace} é 名'
STEPS = 3
METRIC = r'[a-zA-Z_:][a-zA-Z0-9_:]*'
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf'^({METRIC})(?:\{{((?:{LABEL},?)*)\}})? (\S+)$')
# Go's strconv.ParseFloat, which Prometheus reads values with (no JSON null, no "nan").
VALUE = re.compile(r'^([+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|NaN|[+-]Inf)$')


def unescape(v):
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def scrape(d):
    with urllib.request.urlopen(d.http_url + "/metrics", timeout=30) as r:
        return r.read().decode()


def parse(text, tag):
    """{(name, labels as a sorted tuple): value}, checking the format's rules on the way."""
    typed, series, bad = {}, {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if name in typed:
                bad.append(f"a second TYPE line for {name}")
            typed[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        if not m or not VALUE.match(m.group(5)):
            bad.append(f"not a sample line: {line[:100]}")
            continue
        name = m.group(1)
        if name not in typed:
            bad.append(f"{name}: a sample before its family's TYPE line")
        labels = tuple(sorted((k, unescape(v)) for k, v in re.findall(LABEL, m.group(2) or "")))
        if (name, labels) in series:
            bad.append(f"a series twice: {name}{labels}")
        series[(name, labels)] = float(m.group(5))
    ck.check(not bad, f"{tag}: the scrape follows the format's rules ({bad[:3]})")
    return series


def of_job(series, name, job_id):
    return [v for (n, labels), v in series.items() if n == name and ("job_id", job_id) in labels]


def check_job(series, job_id, last, tag):
    names = [dict(labels).get("job_name") for (n, labels) in series
             if n == "ztrain_job_state" and ("job_id", job_id) in labels]
    ck.check(names == [NAME], f"{tag}: the job's name reads back as submitted ({names})")
    for metric, key in (("ztrain_job_step", "train/global_step"), ("ztrain_job_loss", "train/loss"),
                        ("ztrain_job_skipped_steps_total", "train/skipped_steps")):
        got = of_job(series, metric, job_id)
        ck.check(got == [last[key]], f"{tag}: {metric} {got} is the last record's {key} "
                 f"({last[key]})")
    got = of_job(series, "ztrain_job_grad_norm", job_id)
    ck.check(last["train/grad_norm"] is None and len(got) == 1 and math.isnan(got[0]),
             f"{tag}: ztrain_job_grad_norm is NaN, as the last record's train/grad_norm "
             f"({last['train/grad_norm']}): {got}")


def independent_parse(text, tag):
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        print(f"{tag}: prometheus_client is not installed: its parser is not run")
        return
    families = list(text_string_to_metric_families(text))
    ck.check(len({f.name for f in families}) == len(families),
             f"{tag}: prometheus_client reads {len(families)} families, each once")


with Daemon(BUILD, temp_dir("ztrain-promfmt-"), max_ranks=1,
            env={"ZTRAIN_INJECT_NAN_GRAD": str(STEPS)}) as d:
    job = tiny_job(d.data_root, name=NAME, max_steps=STEPS)
    job["events"] = {"nonfinite": {"policy": "skip"}}
    j = submit(d, job)
    wait_state(d, j.id, {"SUCCEEDED", "FAILED"}, timeout=120)
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{j.id}/metrics.jsonl",
                                timeout=30) as r:
        last = json.loads(r.read().decode().splitlines()[-1])["values"]
    ck.check(last.get("train/global_step") == STEPS and last.get("train/skipped_steps") == 1,
             f"the job's last record is step {STEPS}, its update skipped "
             f"({ {k: last.get(k) for k in ('train/global_step', 'train/skipped_steps')} })")

    text = scrape(d)
    check_job(parse(text, "a"), j.id, last, "b")
    independent_parse(text, "a")

    d.restart()
    text = scrape(d)
    check_job(parse(text, "c"), j.id, last, "c")

KILL_AT = 20
with Daemon(BUILD, temp_dir("ztrain-promfmt-"), max_ranks=1,
            env={"ZTRAIN_INJECT_SLOW_RANK": "100"},
            extra_args=["--restart-backoff", "0.1"]) as d:
    spec = spec_proto(tiny_job(d.data_root, name="resumed", max_steps=200,
                               checkpoint_interval=1000))
    spec.max_restarts = 1
    pb = stubs()[0]
    j = d.stub().SubmitJob(pb.SubmitJobRequest(spec=spec), metadata=d.metadata, timeout=30)
    deadline = time.monotonic() + 120
    while get_job(d, j.id).step < KILL_AT and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(get_job(d, j.id).ranks[0].pid, signal.SIGKILL)
    newest = {"step": KILL_AT}
    while time.monotonic() < deadline:
        g = get_job(d, j.id)
        if len(g.attempts) == 2 and state_name(g.state) == "RUNNING":
            with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{j.id}/metrics.jsonl",
                                        timeout=30) as r:
                newest = json.loads(r.read().decode().splitlines()[-1])
            if newest["step"] < KILL_AT:
                break
        time.sleep(0.05)
    series = parse(scrape(d), "d")
    g = get_job(d, j.id)
    step = of_job(series, "ztrain_job_step", j.id)
    ck.check(len(g.attempts) == 2 and newest["step"] < KILL_AT and step and
             newest["step"] <= step[0] <= g.step < KILL_AT,
             f"d: the resumed run is at step {newest['step']} (its newest record) to {g.step} "
             f"(GetJob), and ztrain_job_step says {step}, below {KILL_AT}")
    for metric in ("ztrain_job_learning_rate", "ztrain_job_step_time_seconds",
                   "ztrain_job_skipped_steps_total"):
        ck.check(len(of_job(series, metric, j.id)) == 1,
                 f"d: {metric} is there while the resumed run is below step {KILL_AT} "
                 f"({of_job(series, metric, j.id)})")

def records(d, job_id):
    with urllib.request.urlopen(f"{d.http_url}/api/v1/jobs/{job_id}/metrics.jsonl",
                                timeout=30) as r:
        return [json.loads(line)["values"] for line in r.read().decode().splitlines()]


def scrape_at_eval_only_record(d, job_id, deadline):
    """A scrape taken while the job's newest record is an eval-only one after a logged step (the
    same newest record read before and after it), and the records then; None when none was
    caught in time."""
    while time.monotonic() < deadline:
        before = records(d, job_id)
        if (before and "train/loss" not in before[-1] and "eval/loss" in before[-1] and
                any("train/loss" in r for r in before)):
            text = scrape(d)
            if records(d, job_id)[:len(before) + 1] == before:
                return text, before
        time.sleep(0.02)
    return None, []


with Daemon(BUILD, temp_dir("ztrain-promfmt-"), max_ranks=1,
            env={"ZTRAIN_INJECT_SLOW_RANK": "100"}) as d:
    job = tiny_job(d.data_root, name="eval-only", max_steps=400, log_interval=5,
                   eval_interval=3, eval_steps=1)
    job["data"]["val"] = job["data"]["train"]
    j = submit(d, job)
    text, recs = scrape_at_eval_only_record(d, j.id, time.monotonic() + 120)
    ck.check(text is not None, "e: a scrape was taken while the newest record was eval-only")
    if text is not None:
        series = parse(text, "e")
        train = [r for r in recs if "train/loss" in r][-1]
        ck.check(of_job(series, "ztrain_job_step", j.id) == [recs[-1]["train/global_step"]],
                 f"e: ztrain_job_step is the eval record's step {recs[-1]['train/global_step']}"
                 f" ({of_job(series, 'ztrain_job_step', j.id)})")
        for metric, key in (("ztrain_job_loss", "train/loss"),
                            ("ztrain_job_learning_rate", "train/learning_rate"),
                            ("ztrain_job_grad_norm", "train/grad_norm"),
                            ("ztrain_job_skipped_steps_total", "train/skipped_steps")):
            got = of_job(series, metric, j.id)
            ck.check(got == [train[key]], f"e: at eval-only step {recs[-1]['train/global_step']}"
                     f" {metric} {got} is the last train record's {key} ({train[key]}, "
                     f"step {train['train/global_step']})")
    d.stub().CancelJob(stubs()[0].CancelJobRequest(id=j.id, force=True), metadata=d.metadata,
                       timeout=30)
ck.done()
