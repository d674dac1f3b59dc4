"""The client of ztraind's gRPC API (ztrain.v1.Trainer): submit, get, list, cancel, watch,
metrics, logs and wait, over a plaintext or TLS channel with the server's bearer token.

Every method returns the generated message types (ztrain.pb: Job, LogLine, ...) or, for watch(),
small typed event objects; every refusal is an ApiError carrying the server's structured error
(errors.py)."""
import datetime
import math
import os
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from ._gen import ztrain_pb2 as pb
from ._gen import ztrain_pb2_grpc as pb_grpc
from ._request import build, refuse as _refuse
from .errors import ApiError, ClientClosed, from_rpc_error
from .spec import JobSpec, load

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def state_name(value: int) -> str:
    """"RUNNING" for JOB_STATE_RUNNING's number."""
    return pb.JobState.Name(value).replace("JOB_STATE_", "")


# ---- watch events ------------------------------------------------------------------------------

@dataclass
class JobUpdate:
    """The job's state changed (the first event is always the current state)."""
    job: "pb.Job"

    @property
    def state(self) -> str:
        return state_name(self.job.state)


@dataclass
class Metrics:
    """One metric record: its step, wall time (UTC; None if the server sent none), finite
    values by key, and seq, its number within the job (1, 2, ... in the order records came):
    a step may have several records (an eval step; a step run again after a restart), so seq,
    not step, is where watch(after_seq=...) goes on from."""
    step: int
    time: Optional[datetime.datetime]
    values: Dict[str, float]
    seq: int = 0


@dataclass
class Log:
    """One log line of a rank (rank -1: ztraind itself)."""
    seq: int
    time: Optional[datetime.datetime]
    rank: int
    stream: str
    text: str


@dataclass
class Anomaly:
    """An anomaly the ranks or ztraind detected, and the policy applied."""
    seq: int
    step: int
    kind: str
    policy: str
    value: float
    message: str


WatchEvent = Union[JobUpdate, Metrics, Log, Anomaly]


def _time(msg, field: str) -> Optional[datetime.datetime]:
    """A Timestamp field as an aware UTC datetime, None when it is unset."""
    if not msg.HasField(field):
        return None
    return getattr(msg, field).ToDatetime().replace(tzinfo=datetime.timezone.utc)


def _event(ev: "pb.JobEvent") -> Optional[WatchEvent]:
    which = ev.WhichOneof("event")
    if which == "job":
        return JobUpdate(ev.job)
    if which == "metrics":
        m = ev.metrics
        return Metrics(m.step, _time(m, "time"), {v.key: v.value for v in m.values}, m.seq)
    if which == "log":
        l = ev.log
        return Log(l.seq, _time(l, "time"), l.rank, l.stream, l.text)
    if which == "anomaly":
        a = ev.anomaly
        return Anomaly(a.seq, a.step, a.kind, a.policy, a.value, a.message)
    return None


# ---- the client ----------------------------------------------------------------------------

class _Tls:
    """tls=True (the system's roots), a CA file's path, or a dict {ca, cert, key} of paths."""

    # What each file must hold: grpc takes any bytes and fails later with no word of which file.
    PEM = {"ca": ("-----BEGIN CERTIFICATE-----",), "cert": ("-----BEGIN CERTIFICATE-----",),
           "key": ("-----BEGIN PRIVATE KEY-----", "-----BEGIN RSA PRIVATE KEY-----",
                   "-----BEGIN EC PRIVATE KEY-----")}

    @staticmethod
    def credentials(tls) -> grpc.ChannelCredentials:
        if tls is True:
            return grpc.ssl_channel_credentials()
        if isinstance(tls, (str, os.PathLike)):
            tls = {"ca": tls}
        if not isinstance(tls, dict) or not set(tls) <= {"ca", "cert", "key"}:
            _refuse("tls", f"tls: {tls!r} is not True, a CA file's path or a dict of ca, cert "
                           f"and key paths")
        # grpc's C core aborts the whole process on a client certificate without its key, or a
        # key without its certificate.
        if bool(tls.get("cert")) != bool(tls.get("key")):
            given = "cert" if tls.get("cert") else "key"
            _refuse("tls", f"tls: cert and key come together (the client's certificate and its "
                           f"private key, for mutual TLS); only {given} was given")

        def read(key):
            if not tls.get(key):
                return None
            try:
                with open(tls[key], "rb") as f:
                    pem = f.read()
            except OSError as e:
                _refuse(f"tls.{key}", f"tls.{key}: cannot read {os.fspath(tls[key])}: "
                                      f"{e.strerror}")
            if not any(m.encode() in pem for m in _Tls.PEM[key]):
                what = "private key" if key == "key" else "certificate"
                _refuse(f"tls.{key}", f"tls.{key}: {os.fspath(tls[key])} holds no PEM {what} "
                                      f"({_Tls.PEM[key][0]})")
            return pem

        return grpc.ssl_channel_credentials(read("ca"), read("key"), read("cert"))


class Client:
    """A connection to ztraind's gRPC address.

        c = Client("127.0.0.1:50051", token="...", tls=False)

    token: the server's bearer token (None: the server has none); surrounding white space is
    removed, as ztrain reads a token file, so open("token").read() works as it is, and an empty
    or blank one is InvalidArgument naming token, as ztrain refuses an empty token file or
    ZTRAIN_TOKEN="" (docs/api.md, "Tokens"). tls: False
    (plaintext), True (TLS, the system's roots), a CA file's path, or {"ca": ..., "cert": ...,
    "key": ...} for mutual TLS (cert and key together; paths as str or pathlib.Path); a file
    that cannot be read or holds no PEM certificate (key) is InvalidArgument naming tls.ca,
    tls.cert or tls.key, before any call. timeout: gRPC's deadline for each unary call, in
    seconds (None: no deadline); 0 (which gRPC takes as a deadline already past, failing a call
    or not as the server is quick), a negative one or one not a number is InvalidArgument
    naming timeout.

    After close() (or the end of a `with` block) every call raises ClientClosed."""

    def __init__(self, address: str, token: Optional[str] = None, tls=False,
                 timeout: float = 60.0):
        self.address = address
        self.timeout = _timeout(timeout)
        token = _token(token)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        if tls:
            self._channel = grpc.secure_channel(address, _Tls.credentials(tls))
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.TrainerStub(self._channel)
        self._closed = False

    def close(self):
        """Closes the channel; every later call raises ClientClosed. A `with` block calls it."""
        self._closed = True
        self._channel.close()

    def _check_open(self):
        if self._closed:
            raise ClientClosed(f"this Client of {self.address} is closed (close() or the end "
                               f"of its `with` block): make a new Client")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        self._check_open()
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata,
                                               timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except ValueError:
            # grpc's "Cannot invoke RPC on closed channel!": closed by another thread.
            self._check_open()
            raise

    def _stream(self, method, request, timeout=None):
        self._check_open()
        try:
            for msg in getattr(self._stub, method)(request, metadata=self._metadata,
                                                   timeout=timeout):
                yield msg
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except ValueError:
            self._check_open()
            raise

    def server_version(self) -> str:
        """The daemon's version, "0.1.0" for ztraind 0.1.0, as `kubectl version` reports the
        server's: from the `server` initial metadata ("ztraind/0.1.0") of a health check, the
        version HTTP's Server header carries too. "" from a server that sends none."""
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check",
                                          request_serializer=lambda _: b"",
                                          response_deserializer=lambda raw: raw)
        self._check_open()
        try:
            _, call = check.with_call(None, metadata=self._metadata, timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        server = dict(call.initial_metadata()).get("server", "")
        return server.split("/", 1)[1] if server.startswith("ztraind/") else ""

    # ---- jobs -----------------------------------------------------------------------------

    def submit(self, spec: Union[JobSpec, dict, str], idempotency_key: str = "") -> "pb.Job":
        """Submits a JobSpec builder, a job file's object or a job file's path. The spec is
        validated locally first (SpecError), then by the server (ApiError). A repeated
        idempotency_key with the same spec returns the job it created."""
        req = build(pb.SubmitJobRequest, spec=load(spec).to_proto(), idempotency_key=idempotency_key)
        return self._call("SubmitJob", req)

    def get(self, job_id: str) -> "pb.Job":
        """The job with that id ("job-000042"), resource name ("jobs/job-000042") or Job
        message, as the server has it now; NotFound naming jobs/ID when there is none."""
        return self._call("GetJob", build(pb.GetJobRequest, id=_id(job_id)))

    def _pages(self, method: str, request, items: str) -> Iterator:
        """The `items` of every page `method` answers for `request`, fetched as they are read
        (the request's page_token follows each page's next_page_token)."""
        while True:
            page = self._call(method, request)
            yield from getattr(page, items)
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def list(self, state: Union[str, int, None] = None,
             page_size: int = 0) -> Iterator["pb.Job"]:
        """Every job (or every job in `state`), newest first, fetched page by page. state is a
        JobState value (pb.JOB_STATE_RUNNING, 3), its name ("JOB_STATE_RUNNING") or its short
        name ("RUNNING", any case); None or 0 is every state. Anything else raises
        InvalidArgument naming `state` at the call, before any request."""
        request = build(pb.ListJobsRequest, state=_state_value(state), page_size=page_size)
        return self._pages("ListJobs", request, "jobs")

    def cancel(self, job_id: str, force: bool = False, grace_seconds: float = 0) -> "pb.Job":
        """Graceful by default (the ranks checkpoint and stop); force kills at once."""
        return self._call("CancelJob", build(pb.CancelJobRequest, id=_id(job_id), force=force,
                                                    grace_seconds=grace_seconds))

    def watch(self, job_id: str, since_step: int = 0, logs: bool = False,
              timeout: Optional[float] = None, after_seq: int = 0,
              after_anomaly_seq: int = 0, after_log_seq: int = 0) -> Iterator[WatchEvent]:
        """The job's events as typed objects: JobUpdate first, then Metrics records from
        since_step on (history first), live updates, Log lines when logs=True (live ones), and
        Anomaly events; the iteration ends after the update that carries a terminal state.
        after_seq, after_anomaly_seq and after_log_seq resume a watch that was cut: only
        records after the one with that seq (the last Metrics.seq received), Anomaly events
        after the one with that seq (the last Anomaly.seq received) and, with logs, the Log
        lines after the one with that seq (the last Log.seq received: the lines the daemon
        still keeps after it come first) come. timeout: gRPC's deadline for the whole stream,
        in seconds (None: none), as Client's timeout (0 is InvalidArgument). Bad arguments
        raise InvalidArgument at the call, before the first next()."""
        req = build(pb.WatchJobRequest, id=_id(job_id), since_step=since_step, logs=logs,
                    after_seq=after_seq, after_anomaly_seq=after_anomaly_seq,
                    after_log_seq=after_log_seq)
        stream = self._stream("WatchJob", req, _timeout(timeout))
        return (e for e in map(_event, stream) if e is not None)

    def metrics(self, job_id: str, keys: Union[str, Sequence[str]] = (), since_step: int = 0,
                max_points: int = 0, as_frame: bool = False):
        """The history of the chosen keys (all keys when none are given; one key may be given
        as a string, metrics(id, "train/loss"), never read as its characters): a dict mapping each
        key to a list of (step, value) pairs in the order the records came, so a step may
        appear twice (an eval step's train and eval records both carry train/global_step; a
        step run again after a restart). With as_frame=True, a pandas DataFrame instead (pandas
        must be installed): indexed by step, ascending, one row per step and one column per
        key, the records of a step merged and, where a step has a key twice, the later value
        (the run after a restart) kept; NaN where a step has no value for a key."""
        resp = self._call("GetMetrics", build(
            pb.GetMetricsRequest, id=_id(job_id), keys=[keys] if isinstance(keys, str) else list(keys),
            since_step=since_step, max_points=max_points))
        out: Dict[str, List[Tuple[int, float]]] = {
            s.key: list(zip(s.steps, s.values)) for s in resp.series}
        if not as_frame:
            return out
        return _frame(out)

    def logs(self, job_id: str, tail: Optional[int] = None, follow: bool = False,
             timeout: Optional[float] = None) -> Iterator["pb.LogLine"]:
        """The last `tail` lines of every rank (None: the server's default, 100; 0: none);
        with follow, then new lines until the job ends (with tail=0, only those). A tail above
        what the request carries (2^31-1) asks for every line kept, as it does. timeout: as
        watch()'s; bad arguments raise at the call, as watch()'s do."""
        tail = {} if tail is None else {"tail": tail}
        req = build(pb.StreamLogsRequest, id=_id(job_id), follow=follow, **tail)
        return self._stream("StreamLogs", req, _timeout(timeout))

    def checkpoints(self, job_id: str) -> "pb.ListCheckpointsResponse":
        """The checkpoints in the job's checkpoint directory (.checkpoints, each with tag, step
        and complete) and the tag "latest" names (.latest)."""
        return self._call("ListCheckpoints", build(pb.ListCheckpointsRequest, id=_id(job_id)))

    def effective_config(self, job_id: str) -> dict:
        """The DeepSpeed config rank 0 resolved ("auto" values filled in), as a dict;
        FailedPrecondition before the ranks have written it."""
        import json

        resp = self._call("GetEffectiveConfig", build(pb.GetEffectiveConfigRequest, id=_id(job_id)))
        return json.loads(resp.deepspeed_json)

    def anomalies(self, job_id: str, page_size: int = 0) -> Iterator["pb.AnomalyEvent"]:
        """The job's anomaly events, oldest first, fetched page by page. Bad arguments raise
        InvalidArgument at the call, before any request, as list()'s do."""
        request = build(pb.ListAnomaliesRequest, id=_id(job_id), page_size=page_size)
        return self._pages("ListAnomalies", request, "anomalies")

    def webhook_deliveries(self, job_id: str, page_size: int = 0) -> List["pb.WebhookDelivery"]:
        """The job's newest webhook delivery attempts (page_size of them; 0: up to 10,000),
        oldest first."""
        return list(self._call("ListWebhookDeliveries", build(
            pb.ListWebhookDeliveriesRequest, id=_id(job_id), page_size=page_size)).deliveries)

    # How wait() retries while the daemon cannot be reached (it restarts, or is being
    # upgraded): the first wait, doubling up to the longest, until the caller's timeout; with
    # no timeout, until the daemon has been unreachable for RECONNECT_LIMIT seconds in a row.
    RECONNECT_FIRST = 0.25
    RECONNECT_LONGEST = 5.0
    RECONNECT_LIMIT = 300.0

    def wait(self, job_id: str, timeout: Optional[float] = None) -> "pb.Job":
        """Blocks until the job is SUCCEEDED, FAILED or CANCELLED and returns it. Watches the
        job's stream (no polling). A stream cut short, or a daemon that cannot be reached (it
        restarts), is retried with backoff (Client.RECONNECT_FIRST doubling up to
        RECONNECT_LONGEST seconds) and resumed after the last record received, until the
        timeout (TimeoutError); with no timeout, ServiceUnavailable once the daemon has been
        unreachable for RECONNECT_LIMIT seconds in a row. A timeout of 0 or below looks at
        the job once (kubectl wait --timeout=0): the job if it has ended, else TimeoutError."""
        if timeout is not None and timeout <= 0:
            return self._wait_once(job_id, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        after_seq = after_anomaly_seq = 0
        pause = self.RECONNECT_FIRST
        down_since = None

        def left():
            return None if deadline is None else deadline - time.monotonic()

        def timed_out():
            return TimeoutError(f"{job_id} did not end within {timeout} s")

        while True:
            if left() is not None and left() <= 0:
                raise timed_out()
            try:
                for ev in self.watch(job_id, after_seq=after_seq,
                                     after_anomaly_seq=after_anomaly_seq,
                                     timeout=None if left() is None else max(left(), 0.001)):
                    down_since = None
                    pause = self.RECONNECT_FIRST
                    if isinstance(ev, Metrics):
                        after_seq = max(after_seq, ev.seq)
                    elif isinstance(ev, Anomaly):
                        after_anomaly_seq = max(after_anomaly_seq, ev.seq)
                    elif isinstance(ev, JobUpdate) and ev.state in TERMINAL:
                        return ev.job
                # The stream ended before a terminal state: the job as it is now says why.
                unary = self.timeout if left() is None else max(min(self.timeout, left()), 0.01)
                job = self._call("GetJob", build(pb.GetJobRequest, id=_id(job_id)), timeout=unary)
                if state_name(job.state) in TERMINAL:
                    return job
            except ApiError as e:
                if e.code == "DEADLINE_EXCEEDED":
                    raise timed_out() from None
                if e.code != "UNAVAILABLE":
                    raise
                now = time.monotonic()
                down_since = down_since if down_since is not None else now
                if deadline is None and now - down_since >= self.RECONNECT_LIMIT:
                    raise
            wait = pause if left() is None else min(pause, max(left(), 0))
            time.sleep(wait)
            pause = min(pause * 2, self.RECONNECT_LONGEST)

    def _wait_once(self, job_id, timeout) -> "pb.Job":
        """wait() with no time left (timeout 0 or below): the job if it has ended, else
        TimeoutError, from one look at it, as `kubectl wait --timeout=0` checks once."""
        job = self._call("GetJob", build(pb.GetJobRequest, id=_id(job_id)))
        if state_name(job.state) in TERMINAL:
            return job
        raise TimeoutError(f"{job_id} did not end within {timeout} s")


def _frame(series: Dict[str, List[Tuple[int, float]]]):
    """metrics()'s series as a DataFrame of one row per step: each series arrives in record
    order, so the last value of a step is the later record's."""
    import pandas as pd  # only as_frame needs it

    cols = {}
    for key, pts in series.items():
        by_step: Dict[int, float] = {}
        for step, value in pts:
            by_step[step] = value
        cols[key] = pd.Series(list(by_step.values()), index=list(by_step), dtype=float)
    frame = pd.DataFrame(cols).sort_index()
    frame.index = frame.index.astype("int64").rename("step")
    return frame


def _timeout(timeout) -> Optional[float]:
    """A gRPC deadline in seconds: None (none) or a number above 0. gRPC takes 0 as a deadline
    already past, yet a quick server may still answer within it, so 0 would fail some calls
    and not others: it is refused as a negative one is, naming timeout."""
    if timeout is None or (isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                           and timeout > 0):
        return timeout
    _refuse("timeout", f"timeout: must be None (no deadline) or a number of seconds above 0, "
                       f"got {type(timeout).__name__} ({timeout!r:.60})")


def _token(token: Optional[str]) -> Optional[str]:
    """The bearer token as ztraind compares it: surrounding white space removed, as auth.c
    reads a token file or ZTRAIN_TOKEN, so that a token read with open(f).read() keeps no
    newline. What gRPC cannot send in a header, or a token of white space alone, is refused
    naming `token` (InvalidArgument) instead of failing every call with "INTERNAL: Invalid
    metadata". Only None means no token: "" is what an empty token file or ZTRAIN_TOKEN=""
    gives, which ztrain refuses too rather than calling without one."""
    if token is None:
        return None
    if not isinstance(token, str):
        message = f"token: must be a string, got {type(token).__name__}"
    else:
        what = "empty" if token == "" else "blank (white space only)"
        token = token.strip()
        if not token:
            message = (f"token: is {what}: give the token, or None for a server without "
                       f"authentication")
        elif any(not ("!" <= ch <= "~") for ch in token):
            bad = next(ch for ch in token if not ("!" <= ch <= "~"))
            message = (f"token: holds {bad!r}: a bearer token is printable ASCII without "
                       f"spaces or line breaks (a token file's first line)")
        else:
            return token
    _refuse("token", message)


def _state_value(state) -> int:
    """The JobState number for list()'s state (None, "" or 0: 0, every state)."""
    if state is None or state == "" or (type(state) is int and state == 0):
        return 0
    names = [n for n in pb.JobState.keys() if n != "JOB_STATE_UNSPECIFIED"]
    if isinstance(state, int) and not isinstance(state, bool):
        if state in (pb.JobState.Value(n) for n in names):
            return state
    elif isinstance(state, str):
        name = state.strip().upper()
        name = name if name.startswith("JOB_STATE_") else "JOB_STATE_" + name
        if name in names:
            return pb.JobState.Value(name)
    short = ", ".join(n[len("JOB_STATE_"):] for n in names)
    _refuse("state", f"state: {state!r} is not a job state ({short}, their JOB_STATE_ names or "
                     f"numbers)")


def _id(job_id) -> str:
    """A job id from an id, a resource name "jobs/ID" or a Job message; anything else is
    InvalidArgument naming id, the request's field."""
    if isinstance(job_id, pb.Job):
        return job_id.id
    if not isinstance(job_id, str):
        _refuse("id", f"id: must be a job id (\"job-000042\"), its resource name "
                      f"(\"jobs/job-000042\") or a Job, got {type(job_id).__name__} "
                      f"({job_id!r:.60})")
    return job_id[5:] if job_id.startswith("jobs/") else job_id


def finite(x: float) -> Optional[float]:
    """None for the NaN the server sends before a first value."""
    return None if x is None or math.isnan(x) else x
