"""Request messages built from a method's arguments, each checked against its proto field first,
so that a value of the wrong type or out of the field's range is InvalidArgument naming the field
(as the server names one) rather than protobuf's TypeError or "Value out of range"."""
import operator

from google.protobuf.descriptor import FieldDescriptor as FD

from .errors import InvalidArgument, Violation, _Parsed

# The integer fields' ranges, by protobuf's C++ type.
_INT_RANGE = {FD.CPPTYPE_INT32: (-2**31, 2**31 - 1), FD.CPPTYPE_INT64: (-2**63, 2**63 - 1),
              FD.CPPTYPE_UINT32: (0, 2**32 - 1), FD.CPPTYPE_UINT64: (0, 2**64 - 1)}

# Sizes the server takes as its maximum when they are above it (AIP-158, docs/api.md): one past
# what the field can carry is sent as the most it can, which the server clamps the same way, as
# HTTP clamps any size up to 2^63-1.
CLAMPED = ("page_size", "max_points", "tail")


def refuse(field_path: str, message: str):
    """Raises the InvalidArgument naming field_path that the client's own checks raise, as the
    server names a field."""
    raise InvalidArgument("INVALID_ARGUMENT", message,
                          parsed=_Parsed([Violation("field", field_path, message)]))


def _repeated(fd) -> bool:
    is_repeated = getattr(fd, "is_repeated", None)
    return is_repeated if is_repeated is not None else fd.label == FD.LABEL_REPEATED


def _got(value) -> str:
    return f"got {type(value).__name__} ({value!r:.60})"


def _integer(name: str, fd, value) -> int:
    if isinstance(value, bool):
        refuse(name, f"{name}: must be an integer, {_got(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        refuse(name, f"{name}: must be an integer, {_got(value)}")
    low, high = _INT_RANGE[fd.cpp_type]
    if number > high and name in CLAMPED:
        return high
    if not low <= number <= high:
        refuse(name, f"{name}: {number} is out of range ({low} to {high})")
    return number


def _scalar(name: str, fd, value):
    """value as the field takes it, or InvalidArgument naming name."""
    kind = fd.cpp_type
    if kind in _INT_RANGE:
        return _integer(name, fd, value)
    if kind == FD.CPPTYPE_BOOL:
        if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
            return bool(value)
        refuse(name, f"{name}: must be True or False, {_got(value)}")
    if kind in (FD.CPPTYPE_DOUBLE, FD.CPPTYPE_FLOAT):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        refuse(name, f"{name}: must be a number, {_got(value)}")
    if kind == FD.CPPTYPE_STRING:
        if isinstance(value, str):
            return value
        refuse(name, f"{name}: must be a string, {_got(value)}")
    return value  # a message or an enum: the caller has built or checked it


def build(message_class, **fields):
    """message_class(**fields), each field's value checked against its type and range (integer
    sizes in CLAMPED above the field's range taken as its maximum). A field's name is the
    method's argument and the field's path in the server's errors (id, page_size, keys)."""
    by_name = message_class.DESCRIPTOR.fields_by_name
    checked = {}
    for name, value in fields.items():
        fd = by_name[name]
        if _repeated(fd):
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                refuse(name, f"{name}: must be a list, {_got(value)}")
            checked[name] = [_scalar(name, fd, v) for v in value]
        else:
            checked[name] = _scalar(name, fd, value)
    return message_class(**checked)
