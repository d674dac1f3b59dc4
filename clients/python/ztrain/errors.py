"""The client's exceptions. A refusal by the server is an ApiError carrying the structured error
ztraind sent (google.rpc.Status in gRPC's grpc-status-details-bin): the code, the message, and
the field, resource, precondition or quota it names. A spec refused before it was sent is a
SpecError naming the field the same way ("spec.model.n_embd")."""
from dataclasses import dataclass, field
from typing import List, Optional

import grpc

from . import _rpc


@dataclass
class Violation:
    """One violation of an error detail: BadRequest's field, PreconditionFailure's type and
    subject, or QuotaFailure's subject, with the server's description."""
    kind: str            # "field", "precondition" or "quota"
    subject: str         # the field path, or the precondition's or quota's subject
    description: str
    type: str = ""       # a precondition's type ("RANKS", "GPU", "NODES", "MEMORY")


class ZtrainError(Exception):
    """Everything this package raises for a failed request."""


class SpecError(ZtrainError, ValueError):
    """A job spec refused locally, before any request: `field` is its path ("spec.world_size")."""

    def __init__(self, field_path: str, message: str):
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


class ClientClosed(ZtrainError, ValueError):
    """A call on a Client after its close() (or the end of its `with` block)."""


@dataclass
class _Parsed:
    violations: List[Violation] = field(default_factory=list)
    resource_type: str = ""
    resource_name: str = ""
    details: list = field(default_factory=list)


class ApiError(ZtrainError):
    """A request ztraind refused or could not answer. Every gRPC status code has its own
    subclass below, named as google-api-core's exceptions name them (NotFound,
    PermissionDenied, DeadlineExceeded, MethodNotImplemented, ...); a code gRPC may add later
    is an ApiError itself.

    code        the gRPC status code's name ("INVALID_ARGUMENT", "NOT_FOUND", ...)
    message     the server's message
    details     the google.rpc.Status's details, each unpacked to its google.rpc message
                (BadRequest, PreconditionFailure, QuotaFailure, ResourceInfo, ErrorInfo, ...;
                a kind outside error_details.proto stays a google.protobuf.Any); [] when the
                server sent none. With googleapis-common-protos installed these are the
                classes of google.rpc.error_details_pb2; without it, messages of the same
                names and fields built from the descriptors committed with the client
    violations  [Violation]: the fields, preconditions or quotas at fault
    field       the first violation's field or subject, or None
    resource    "jobs/job-000042" for NOT_FOUND and ALREADY_EXISTS, or None
    status      the google.rpc.Status itself (None when the server sent none)"""

    grpc_status_code: Optional[grpc.StatusCode] = None

    def __init__(self, code: str, message: str, status=None, parsed: Optional[_Parsed] = None):
        parsed = parsed or _Parsed()
        self.code = code
        self.message = message
        self.status = status
        self.details = parsed.details
        self.violations = parsed.violations
        self.field = parsed.violations[0].subject if parsed.violations else None
        self.resource = parsed.resource_name or None
        self.resource_type = parsed.resource_type or None
        where = f" [{self.field}]" if self.field else f" [{self.resource}]" if self.resource else ""
        super().__init__(f"{code}{where}: {message}")


# One class per gRPC status code other than OK, in grpc.StatusCode's order.

class Cancelled(ApiError):
    """The call was cancelled (by the client, or by the server as it shut down)."""
    grpc_status_code = grpc.StatusCode.CANCELLED


class Unknown(ApiError):
    """An error the server or the transport could not classify."""
    grpc_status_code = grpc.StatusCode.UNKNOWN


class InvalidArgument(ApiError):
    """The request is malformed: .field names the field at fault."""
    grpc_status_code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(ApiError):
    """The call's timeout passed before the server answered."""
    grpc_status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(ApiError):
    """No such job (or checkpoint): .resource names it."""
    grpc_status_code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ApiError):
    """An idempotency key reused with another spec: .resource names the job it made."""
    grpc_status_code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(ApiError):
    """The token's scope does not allow the call (docs/security.md)."""
    grpc_status_code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(ApiError):
    """A quota or limit of the server: .violations name it."""
    grpc_status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(ApiError):
    """The job or the server is not in the state the call needs."""
    grpc_status_code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(ApiError):
    """The call was aborted by a concurrent change; it may be retried."""
    grpc_status_code = grpc.StatusCode.ABORTED


class OutOfRange(ApiError):
    """A value past the valid range."""
    grpc_status_code = grpc.StatusCode.OUT_OF_RANGE


class MethodNotImplemented(ApiError):
    """The server does not have this method (an older ztraind)."""
    grpc_status_code = grpc.StatusCode.UNIMPLEMENTED


class InternalServerError(ApiError):
    """The server or the transport failed internally."""
    grpc_status_code = grpc.StatusCode.INTERNAL


class ServiceUnavailable(ApiError):
    """The server cannot be reached (down, restarting, a wrong address); a retry may
    succeed."""
    grpc_status_code = grpc.StatusCode.UNAVAILABLE


class DataLoss(ApiError):
    """Unrecoverable loss or corruption of data."""
    grpc_status_code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(ApiError):
    """No token, or not one the server has."""
    grpc_status_code = grpc.StatusCode.UNAUTHENTICATED


# The name earlier versions of this package gave UNAVAILABLE's class.
Unavailable = ServiceUnavailable

_BY_CODE = {cls.grpc_status_code.name: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
    MethodNotImplemented, InternalServerError, ServiceUnavailable, DataLoss, Unauthenticated)}
"""The class of each gRPC status code's name: every code of grpc.StatusCode but OK."""


def _parse_status(status) -> _Parsed:
    """The details of a google.rpc.Status, unpacked, and the violations and resource they
    name."""
    ed = _rpc.messages()
    known = tuple(getattr(ed, name) for name in _rpc.DETAIL_NAMES)
    out = _Parsed()
    for any_ in status.details:
        cls = next((c for c in known if any_.Is(c.DESCRIPTOR)), None)
        if cls is None:
            out.details.append(any_)
            continue
        m = cls()
        any_.Unpack(m)
        out.details.append(m)
        if cls is ed.BadRequest:
            out.violations += [Violation("field", v.field, v.description)
                               for v in m.field_violations]
        elif cls is ed.PreconditionFailure:
            out.violations += [Violation("precondition", v.subject, v.description, v.type)
                               for v in m.violations]
        elif cls is ed.QuotaFailure:
            out.violations += [Violation("quota", v.subject, v.description)
                               for v in m.violations]
        elif cls is ed.ResourceInfo:
            out.resource_type, out.resource_name = m.resource_type, m.resource_name
    return out


def from_rpc_error(e: grpc.RpcError) -> ApiError:
    """The ApiError for a failed gRPC call, with the structured detail when the server sent
    one."""
    code = e.code().name if hasattr(e, "code") and e.code() else "UNKNOWN"
    message = e.details() if hasattr(e, "details") else str(e)
    status, parsed = None, None
    trailers = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "grpc-status-details-bin":
            status = _rpc.messages().Status.FromString(value)
            parsed = _parse_status(status)
    return _BY_CODE.get(code, ApiError)(code, message or "", status, parsed)
