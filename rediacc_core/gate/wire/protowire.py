"""Protocol Buffers' wire format, read and written by hand: just what the BuildKit checks need.

A message is a sequence of fields, each a key (field number << 3 | wire type) followed by its
value: a varint (type 0), 8 bytes (type 1), a length and that many bytes (type 2: strings, bytes,
nested messages, map entries, packed repeated scalars) or 4 bytes (type 5). Groups (types 3 and 4)
are long deprecated and never used by BuildKit's protos, so they are refused.

The reader is strict where a lenient one could be made to disagree with the daemon's: a truncated
field, a varint of more than 10 bytes, a field number 0 or a group is `WireError`. Unknown fields
are kept (a newer client may send them) and left to the caller to judge. As in Go's protobuf, a
scalar field repeated on the wire takes its last value and a repeated or map field collects all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_MAX_VARINT_BYTES = 10
MAX_DEPTH = 64  # nested messages the checks follow; the daemon's own limit is 100


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


@dataclass(frozen=True, slots=True)
class Field:
    number: int
    wire_type: int
    value: int | bytes  # an int for varints and fixed types, the bytes of a length-delimited field


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise WireError("truncated varint")
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos + i + 1
        shift += 7
    raise WireError("varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[Field]:
    """Every field of the message `data`, in wire order."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == VARINT:
            value, pos = read_varint(data, pos)
            yield Field(number, wire_type, value)
        elif wire_type in (FIXED64, FIXED32):
            size = 8 if wire_type == FIXED64 else 4
            if pos + size > end:
                raise WireError(f"truncated field {number}")
            yield Field(number, wire_type, int.from_bytes(data[pos : pos + size], "little"))
            pos += size
        elif wire_type == LENGTH:
            size, pos = read_varint(data, pos)
            if pos + size > end:
                raise WireError(f"field {number} runs past the end of its message")
            yield Field(number, wire_type, data[pos : pos + size])
            pos += size
        else:
            raise WireError(f"field {number} has wire type {wire_type} (groups are not used)")


class Message:
    """One decoded message: its fields by number, read as the schema's types say."""

    __slots__ = ("_by_number",)

    def __init__(self, data: bytes) -> None:
        by_number: dict[int, list[Field]] = {}
        for item in fields(data):
            by_number.setdefault(item.number, []).append(item)
        self._by_number = by_number

    def numbers(self) -> frozenset[int]:
        return frozenset(self._by_number)

    def _all(self, number: int, wire_type: int) -> list[int | bytes]:
        found = self._by_number.get(number, [])
        for item in found:
            if item.wire_type != wire_type:
                raise WireError(f"field {number} has wire type {item.wire_type}, not {wire_type}")
        return [item.value for item in found]

    def has(self, number: int) -> bool:
        return number in self._by_number

    def integer(self, number: int) -> int:
        """A varint scalar (int32/int64/enum/bool as its raw unsigned value); 0 when absent."""
        values = self._all(number, VARINT)
        last = values[-1] if values else 0
        assert isinstance(last, int)
        return last

    def signed(self, number: int) -> int:
        """An int64/int32 scalar, two's complement as Go reads it."""
        value = self.integer(number)
        return value - (1 << 64) if value >= 1 << 63 else value

    def blobs(self, number: int) -> list[bytes]:
        """Every length-delimited value of a field (a repeated one, or a scalar sent more than once)."""
        return [v for v in self._all(number, LENGTH) if isinstance(v, bytes)]

    def blob(self, number: int) -> bytes:
        values = self.blobs(number)
        return values[-1] if values else b""

    def text(self, number: int) -> str:
        return _utf8(self.blob(number), number)

    def texts(self, number: int) -> list[str]:
        return [_utf8(v, number) for v in self.blobs(number)]

    def message(self, number: int) -> Message | None:
        """A singular nested message; None when absent. Go merges repeated occurrences of one,
        so their bytes are read together."""
        values = self.blobs(number)
        return Message(b"".join(values)) if values else None

    def messages(self, number: int) -> list[Message]:
        return [Message(v) for v in self.blobs(number)]

    def string_map(self, number: int) -> dict[str, str]:
        """A `map<string, string>`: later entries win, as in Go."""
        return {key: _utf8(value.blob(2), number) for key, value in self.message_map(number).items()}

    def message_map(self, number: int) -> dict[str, Message]:
        """A `map<string, Message>`: each entry's key (field 1) and value (field 2) message."""
        out: dict[str, Message] = {}
        for entry in self.messages(number):
            out[entry.text(1)] = entry
        return out

    def packed_or_repeated_ints(self, number: int) -> list[int]:
        """A repeated varint field, packed or not (a reader must accept both)."""
        values: list[int] = []
        for item in self._by_number.get(number, []):
            if item.wire_type == VARINT and isinstance(item.value, int):
                values.append(item.value)
            elif item.wire_type == LENGTH and isinstance(item.value, bytes):
                pos = 0
                while pos < len(item.value):
                    value, pos = read_varint(item.value, pos)
                    values.append(value)
            else:
                raise WireError(f"field {number} has wire type {item.wire_type}")
        return values


def _utf8(data: bytes, number: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"field {number} is not valid UTF-8") from exc


# --- writing (the gate's own additions, and the tests' requests) --------------------------------
def varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64s go out as ten bytes, as Go writes them
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_field(number: int, payload: bytes | str) -> bytes:
    raw = payload.encode() if isinstance(payload, str) else payload
    return key(number, LENGTH) + varint(len(raw)) + raw


def varint_field(number: int, value: int) -> bytes:
    return key(number, VARINT) + varint(value)


def map_entry(number: int, name: str, value: bytes | str) -> bytes:
    """One entry of a map field: a message of key (1) and value (2)."""
    return length_field(number, length_field(1, name) + length_field(2, value))
