"""The client's exceptions. A refusal by the server is an ApiError carrying the structured error
ztraind sent (google.rpc.Status in gRPC's grpc-status-details-bin): the code, the message, and
the field, resource, precondition or quota it names. A spec refused before it was sent is a
SpecError naming the field the same way ("spec.model.n_embd")."""
from dataclasses import dataclass, field
from typing import List, Optional

import grpc


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


@dataclass
class _Parsed:
    violations: List[Violation] = field(default_factory=list)
    resource_type: str = ""
    resource_name: str = ""


class ApiError(ZtrainError):
    """A request ztraind refused or could not answer.

    code        the gRPC status code's name ("INVALID_ARGUMENT", "NOT_FOUND", ...)
    message     the server's message
    violations  [Violation]: the fields, preconditions or quotas at fault
    field       the first violation's field or subject, or None
    resource    "jobs/job-000042" for NOT_FOUND and ALREADY_EXISTS, or None
    status      the google.rpc.Status itself (None when the server sent none)"""

    def __init__(self, code: str, message: str, status=None, parsed: Optional[_Parsed] = None):
        parsed = parsed or _Parsed()
        self.code = code
        self.message = message
        self.status = status
        self.violations = parsed.violations
        self.field = parsed.violations[0].subject if parsed.violations else None
        self.resource = parsed.resource_name or None
        self.resource_type = parsed.resource_type or None
        where = f" [{self.field}]" if self.field else f" [{self.resource}]" if self.resource else ""
        super().__init__(f"{code}{where}: {message}")


class InvalidArgument(ApiError):
    pass


class NotFound(ApiError):
    pass


class AlreadyExists(ApiError):
    pass


class FailedPrecondition(ApiError):
    pass


class ResourceExhausted(ApiError):
    pass


class Unauthenticated(ApiError):
    pass


class Unavailable(ApiError):
    pass


_BY_CODE = {
    "INVALID_ARGUMENT": InvalidArgument,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "FAILED_PRECONDITION": FailedPrecondition,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "UNAUTHENTICATED": Unauthenticated,
    "UNAVAILABLE": Unavailable,
}


def _parse_status(status) -> _Parsed:
    """The violations and resource of a google.rpc.Status's details."""
    from google.rpc import error_details_pb2 as ed

    out = _Parsed()
    for any_ in status.details:
        if any_.Is(ed.BadRequest.DESCRIPTOR):
            m = ed.BadRequest()
            any_.Unpack(m)
            out.violations += [Violation("field", v.field, v.description)
                               for v in m.field_violations]
        elif any_.Is(ed.PreconditionFailure.DESCRIPTOR):
            m = ed.PreconditionFailure()
            any_.Unpack(m)
            out.violations += [Violation("precondition", v.subject, v.description, v.type)
                               for v in m.violations]
        elif any_.Is(ed.QuotaFailure.DESCRIPTOR):
            m = ed.QuotaFailure()
            any_.Unpack(m)
            out.violations += [Violation("quota", v.subject, v.description)
                               for v in m.violations]
        elif any_.Is(ed.ResourceInfo.DESCRIPTOR):
            m = ed.ResourceInfo()
            any_.Unpack(m)
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
            from google.rpc import status_pb2

            status = status_pb2.Status.FromString(value)
            parsed = _parse_status(status)
    return _BY_CODE.get(code, ApiError)(code, message or "", status, parsed)
