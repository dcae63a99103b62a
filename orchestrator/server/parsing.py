"""Parsing requests at the edge: bytes that are not a valid message become an error naming the field.

gRPC's own deserializer failure would answer INTERNAL; `lenient` hands the handler a
`Malformed` instead, which the error interceptor turns into INVALID_ARGUMENT.
"""

from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import DecodeError, Message

from orchestrator.errors import InvalidRequestError


@dataclass
class Malformed:
    """What a lenient deserializer returns for bytes that are not a valid request."""

    error: InvalidRequestError


def lenient(message_class: type[Message]) -> Callable[[bytes], "Message | Malformed"]:
    """A request deserializer that never raises: gRPC would answer INTERNAL for that.

    The handler wrapper (ErrorInterceptor) turns a Malformed into INVALID_ARGUMENT.
    """

    def deserialize(data: bytes):
        try:
            return parse(message_class, data)
        except InvalidRequestError as e:
            return Malformed(e)

    return deserialize


# up to this size, two encoded-size passes (C) find unknown fields faster than the walk (Python), which
# never reads bytes fields and so wins on large messages (K/V blocks inline)
SIZE_CHECK_MAX_BYTES = 64 << 10


def parse(message_class: type[Message], data: bytes) -> Message:
    """Parse a request; InvalidRequestError names the field for bad UTF-8 or unknown fields."""
    try:
        msg = message_class.FromString(data)
    except DecodeError:
        raise InvalidRequestError(_why_undecodable(message_class, data)) from None
    small = len(data) <= SIZE_CHECK_MAX_BYTES
    if small and not _drops_unknown(msg):
        return msg
    # a small one is parsed afresh to name the field: the check dropped what it found
    unknown = _unknown_field(message_class.FromString(data) if small else msg)
    if unknown is not None:
        raise InvalidRequestError(f"{unknown}: unknown field (this server speaks {message_class.DESCRIPTOR.full_name} "
                                  f"of hetspec.v1)")
    return msg


def _drops_unknown(msg: Message) -> bool:
    """Whether `msg` held unknown fields anywhere (now dropped): each one encodes in at least 2 bytes.

    A cold propose frame of the drafter session took ~0.1 ms in the walk below (2-core EPYC VM), which
    a remote drafter's fresh round trip pays on the engine's critical path."""
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    return msg.ByteSize() != size


def _unknown_field(msg: Message, prefix: str = "") -> str | None:
    for f in unknown_fields.UnknownFieldSet(msg):
        return f"{prefix}field #{f.field_number}"
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        items = value if fd.is_repeated else [value]
        for i, item in enumerate(items):
            if fd.message_type.GetOptions().map_entry:
                continue
            name = f"{prefix}{fd.name}[{i}]." if fd.is_repeated else f"{prefix}{fd.name}."
            found = _unknown_field(item, name)
            if found:
                return found
    return None


def _why_undecodable(message_class: type[Message], data: bytes) -> str:
    """Re-parse with every string field read as bytes, to name the field that is not UTF-8."""
    twin = _bytes_twin(message_class)
    try:
        raw = twin.FromString(data)
    except DecodeError:
        return f"request: not a valid {message_class.DESCRIPTOR.full_name} message"
    bad = _first_bad_utf8(raw, message_class.DESCRIPTOR)
    return f"{bad}: not valid UTF-8" if bad else f"request: not a valid {message_class.DESCRIPTOR.full_name} message"


_TWINS: dict[str, type[Message]] = {}


def _bytes_twin(message_class: type[Message]) -> type[Message]:
    """The same message (and its nested types' file) with string fields typed as bytes."""
    name = message_class.DESCRIPTOR.full_name
    if name not in _TWINS:
        pool = descriptor_pool.DescriptorPool()
        files = _file_closure(message_class.DESCRIPTOR.file)
        for fd in files:
            proto = descriptor_pb2.FileDescriptorProto()
            fd.CopyToProto(proto)
            for m in proto.message_type:
                _strings_to_bytes(m)
            proto.ClearField("service")
            pool.Add(proto)
        _TWINS[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return _TWINS[name]


def _file_closure(fd) -> list:
    seen, order = set(), []

    def visit(f):
        if f.name in seen:
            return
        seen.add(f.name)
        for dep in f.dependencies:
            visit(dep)
        order.append(f)

    visit(fd)
    return order


def _strings_to_bytes(m: descriptor_pb2.DescriptorProto) -> None:
    for f in m.field:
        if f.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
            f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    for nested in m.nested_type:
        if nested.options.map_entry:  # a map's key cannot be bytes: read the map as its repeated entries
            nested.options.ClearField("map_entry")
        _strings_to_bytes(nested)


def _first_bad_utf8(raw: Message, desc, prefix: str = "") -> str | None:
    for fd, value in raw.ListFields():
        original = desc.fields_by_name[fd.name]
        items = value if fd.is_repeated else [value]
        for i, item in enumerate(items):
            name = f"{prefix}{fd.name}[{i}]" if fd.is_repeated else f"{prefix}{fd.name}"
            if original.type == original.TYPE_STRING:
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError:
                    return name
            elif original.message_type is not None:
                found = _first_bad_utf8(item, original.message_type, name + ".")
                if found:
                    return found
    return None
