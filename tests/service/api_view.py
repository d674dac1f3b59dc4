"""Plain Python values of the HTTP API's bodies, for tests that check what a job did rather than
how the API spells it (test_api_parity checks the spelling: every body is the proto3 JSON of a
proto/ztrain.proto message, parsed strictly by json_format).

view(path, body) turns the proto3 JSON of a route's body into what such a test reads: steps and
other int64 values as ints, times as milliseconds since the epoch (0 when unset), NaN and
absent figures as None, the state without its JOB_STATE_ prefix, member names in snake_case,
and a job's spec in the job file's form ("deepspeed", "events" and "alerts" as objects). It
knows the routes by their paths; other bodies (problems, /healthz) come back unchanged."""
import json
import math
import re
from datetime import datetime

TIME_FIELDS = {"createTime": "created_unix_ms", "startTime": "started_unix_ms",
               "endTime": "finished_unix_ms"}


def snake(key):
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), key)


def time_ms(v):
    """An RFC 3339 Timestamp as milliseconds since the epoch; 0 when unset."""
    if not v:
        return 0
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?Z$", v)
    t = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
    secs = (t - datetime(1970, 1, 1)).total_seconds()
    return int(round((secs + float(m.group(2) or 0)) * 1000))


def duration_ms(v):
    return int(round(float(v[:-1]) * 1000)) if v else 0


def num(v):
    """A double: None for NaN, infinities and absent values."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def plain(v):
    if isinstance(v, dict):
        return {snake(k): plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def spec(s):
    out = plain(s or {})
    for field, section in (("deepspeed_json", "deepspeed"), ("events_json", "events"),
                           ("alerts_json", "alerts")):
        if field in out:
            out[section] = json.loads(out.pop(field))
    if "max_steps" in out.get("train", {}):
        out["train"]["max_steps"] = int(out["train"]["max_steps"])
    if "step" in out.get("fork_from", {}):
        out["fork_from"]["step"] = int(out["fork_from"]["step"])
    return out


FIGURES = ("stepTimeMs", "dataMs", "fwdMs", "bwdMs", "stepMs", "commMs", "computeMs", "cpuUtil",
           "rssBytes", "peakRssBytes", "gpuUtil", "gpuMemoryUsedBytes", "gpuPowerWatts",
           "gpuTemperatureC")


def rank(r):
    out = {"rank": r.get("rank", 0), "pid": r.get("pid", 0), "running": r.get("running", False),
           "exit_code": r.get("exitCode", 0), "signal": r.get("signal", 0),
           "exit_unknown": r.get("exitUnknown", False)}
    for k in FIGURES:
        out[snake(k)] = num(r.get(k, 0))
    return out


def attempt(a):
    return {"attempt": a.get("attempt", 0), "started_unix_ms": time_ms(a.get("startTime")),
            "ended_unix_ms": time_ms(a.get("endTime")), "step": int(a.get("step", 0)),
            "resumed_from_step": int(a.get("resumedFromStep", 0)), "rank": a.get("rank", 0),
            "exit_code": a.get("exitCode", 0), "signal": a.get("signal", 0),
            "failed": a.get("failed", False), "reason": a.get("reason", "")}


def job(j):
    s = spec(j.get("spec"))
    grid = j.get("grid", {})
    out = {"id": j.get("id", ""), "name": j.get("name", ""),
           "state": j.get("state", "JOB_STATE_UNSPECIFIED").replace("JOB_STATE_", ""),
           "reason": j.get("reason", ""), "world_size": s.get("world_size", 1),
           "device": s.get("device", "cpu"), "comm": j.get("comm", ""),
           "grid": {"dp": grid.get("dp", 0), "pp": grid.get("pp", 0), "tp": grid.get("tp", 0)},
           "elapsed_ms": duration_ms(j.get("runDuration")), "step": int(j.get("step", 0)),
           "max_steps": int(j.get("maxSteps", 0)), "loss": num(j.get("loss", 0)),
           "tokens_per_second": num(j.get("tokensPerSecond", 0)),
           "ranks": [rank(r) for r in j.get("ranks", [])],
           "attempts": [attempt(a) for a in j.get("attempts", [])],
           "run_dir": j.get("runDir", ""), "checkpoint_dir": j.get("checkpointDir", ""),
           "idempotency_key": j.get("idempotencyKey", ""),
           "submitter": j.get("submitter", ""), "submitter_scope": j.get("submitterScope", ""),
           "spec": s}
    for k, name in TIME_FIELDS.items():
        out[name] = time_ms(j.get(k))
    return out


def record(r):
    return {"step": int(r.get("step", 0)), "time_unix_ms": time_ms(r.get("time")),
            "values": {v["key"]: num(v.get("value", 0)) for v in r.get("values", [])}}


def log_line(l):
    return {"seq": int(l.get("seq", 0)), "time_unix_ms": time_ms(l.get("time")),
            "rank": l.get("rank", 0), "stream": l.get("stream", ""), "text": l.get("text", "")}


def anomaly(a):
    return {"seq": int(a.get("seq", 0)), "step": int(a.get("step", 0)),
            "time_unix_ms": time_ms(a.get("time")), "kind": a.get("kind", ""),
            "policy": a.get("policy", ""), "value": num(a.get("value", 0)),
            "zscore": num(a.get("zscore", 0)), "rank": a.get("rank", 0),
            "message": a.get("message", "")}


def delivery(d):
    out = plain(d)
    out.setdefault("attempt", 0)
    out.setdefault("http_status", 0)
    out.setdefault("error", "")
    out["time_unix_ms"] = time_ms(out.pop("time", None))
    return out


def series(s):
    return {"key": s.get("key", ""), "steps": [int(x) for x in s.get("steps", [])],
            "values": [num(v) for v in s.get("values", [])]}


def checkpoint(c):
    step = int(c.get("step", 0))
    return {"tag": c.get("tag", ""), "step": step if step >= 0 else None,
            "complete": c.get("complete", False)}


LISTS = {"records": record, "lines": log_line, "anomalies": anomaly, "deliveries": delivery,
         "series": series, "jobs": job, "checkpoints": checkpoint}


def view(path, body):
    """The plain form of the body of GET/POST `path` (a path with its query string)."""
    route = path.split("?")[0].rstrip("/")
    if not isinstance(body, dict) or "type" in body and "status" in body:
        return body
    if re.fullmatch(r"/api/v1/jobs/[^/]+(/cancel)?", route) or route == "/api/v1/jobs" and \
            "id" in body:
        return job(body)
    if route.endswith("/config"):
        return {"deepspeed": json.loads(body["deepspeedJson"]) if "deepspeedJson" in body
                else None}
    if route.startswith("/api/v1/jobs") and not route.endswith(".json"):
        out = {}
        for k, v in body.items():
            if k in LISTS:
                out[k] = [LISTS[k](x) for x in v]
            elif k == "nextPageToken":
                out["next_page_token"] = v
            else:
                out[snake(k)] = v
        for name, kinds in (("records", "/records"), ("lines", "/logs"),
                            ("anomalies", "/anomalies"), ("deliveries", "/webhooks"),
                            ("series", "/metrics"), ("jobs", "/api/v1/jobs"),
                            ("checkpoints", "/checkpoints")):
            if route.endswith(kinds):
                out.setdefault(name, [])
        out.setdefault("next_page_token", "")
        if route.endswith("/checkpoints"):
            out.setdefault("latest", "")
        return out
    return body
