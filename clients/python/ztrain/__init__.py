"""ztrain's Python client: submit and follow training jobs on a ztraind from scripts and
notebooks.

    import ztrain
    c = ztrain.Client("127.0.0.1:50051", token="...")
    job = c.submit("job.json")
    for ev in c.watch(job.id): print(ev)
    print(c.metrics(job.id, ["train/loss"]))

The messages are the generated ones of proto/ztrain.proto (ztrain.pb), built into the package."""
from ._gen import ztrain_pb2 as pb
from .client import (Anomaly, Client, JobUpdate, Log, Metrics, TERMINAL, finite,  # noqa: F401
                     state_name)
from .errors import (Aborted, AlreadyExists, ApiError, Cancelled, ClientClosed,  # noqa: F401
                     DataLoss, DeadlineExceeded, FailedPrecondition, InternalServerError,
                     InvalidArgument, MethodNotImplemented, NotFound, OutOfRange,
                     PermissionDenied, ResourceExhausted, ServiceUnavailable, SpecError,
                     Unauthenticated, Unavailable, Unknown, Violation, ZtrainError)
from .spec import JobSpec  # noqa: F401

__version__ = "0.1.0"
