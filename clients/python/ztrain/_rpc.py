"""google.rpc.Status and the error details ztraind sends in grpc-status-details-bin. With
googleapis-common-protos installed they are its classes (google.rpc.status_pb2 and
error_details_pb2); without it, as on Debian, which packages none for Python, they are built with
the protobuf runtime alone from the descriptors generate.sh commits (_gen/rpc_descriptors.py),
in a descriptor pool of their own, so that a google.rpc imported later does not clash with them."""
from types import SimpleNamespace

# The messages of error_details.proto that ApiError unpacks, by their name in google.rpc.
DETAIL_NAMES = ("BadRequest", "PreconditionFailure", "QuotaFailure", "ResourceInfo",
                "ErrorInfo", "RetryInfo", "RequestInfo", "DebugInfo", "Help",
                "LocalizedMessage")

_messages = None


def _from_googleapis():
    from google.rpc import error_details_pb2, status_pb2

    return SimpleNamespace(Status=status_pb2.Status,
                           **{n: getattr(error_details_pb2, n) for n in DETAIL_NAMES})


def _message_class(descriptor):
    from google.protobuf import message_factory

    # protobuf 4.22 and later have GetMessageClass; Debian 12's 4.21 has only the factory.
    get = getattr(message_factory, "GetMessageClass", None)
    if get is not None:
        return get(descriptor)
    return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


def _from_descriptors():
    from google.protobuf import descriptor_pb2, descriptor_pool

    from ._gen.rpc_descriptors import FILE_DESCRIPTOR_SET

    pool = descriptor_pool.DescriptorPool()
    for file_proto in descriptor_pb2.FileDescriptorSet.FromString(FILE_DESCRIPTOR_SET).file:
        pool.Add(file_proto)
    return SimpleNamespace(**{n: _message_class(pool.FindMessageTypeByName("google.rpc." + n))
                              for n in ("Status",) + DETAIL_NAMES})


def messages():
    """The message classes: .Status and one attribute per name of DETAIL_NAMES."""
    global _messages
    if _messages is None:
        try:
            _messages = _from_googleapis()
        except ImportError:
            _messages = _from_descriptors()
    return _messages
