"""The protobuf wire-format reader: each case is bytes as a Go client writes them, and what the
gate reads from them (or that it refuses them)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rediacc_core.gate.wire.protowire import (
    Field,
    Message,
    WireError,
    fields,
    length_field,
    map_entry,
    read_varint,
    varint,
    varint_field,
)


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (b"\x00", 0),
        (b"\x01", 1),
        (b"\x96\x01", 150),
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", (1 << 64) - 1),  # -1 as an int64
    ],
)
def test_varints(data: bytes, value: int) -> None:
    assert read_varint(data, 0) == (value, len(data))


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_varints_round_trip(value: int) -> None:
    assert read_varint(varint(value), 0)[0] == value


@pytest.mark.parametrize(
    ("data", "fields_read"),
    [
        (b"", []),
        (varint_field(3, 7), [Field(3, 0, 7)]),
        (length_field(1, "abc"), [Field(1, 2, b"abc")]),
        (b"\x0d\x01\x00\x00\x00", [Field(1, 5, 1)]),  # fixed32
        (b"\x09" + b"\x02" + b"\x00" * 7, [Field(1, 1, 2)]),  # fixed64
        (length_field(2, b"") + varint_field(2, 1), [Field(2, 2, b""), Field(2, 0, 1)]),
    ],
)
def test_fields_in_wire_order(data: bytes, fields_read: list[Field]) -> None:
    assert list(fields(data)) == fields_read


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x08", "truncated varint"),
        (b"\x0a\x05abc", "runs past the end"),
        (b"\x00\x00", "field number 0"),
        (b"\x0b", "wire type 3"),  # a group
        (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\x0d\x01\x00", "truncated field 1"),
    ],
)
def test_malformed_messages_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        list(fields(data))


def test_a_scalar_sent_twice_reads_as_its_last_value_as_in_go() -> None:
    message = Message(length_field(6, "dockerfile.v0") + length_field(6, "gateway.v0"))
    assert message.text(6) == "gateway.v0"


def test_maps_collect_every_entry_and_a_later_key_wins() -> None:
    message = Message(map_entry(7, "a", "1") + map_entry(7, "b", "2") + map_entry(7, "a", "3"))
    assert message.string_map(7) == {"a": "3", "b": "2"}


def test_a_singular_message_sent_twice_is_merged_as_in_go() -> None:
    message = Message(length_field(1, varint_field(3, 1)) + length_field(1, varint_field(4, 1)))
    inner = message.message(1)
    assert inner is not None and (inner.integer(3), inner.integer(4)) == (1, 1)


def test_a_field_of_the_wrong_wire_type_is_refused() -> None:
    with pytest.raises(WireError, match="wire type"):
        Message(varint_field(6, 1)).text(6)


def test_strings_must_be_utf8_as_proto3_requires() -> None:
    with pytest.raises(WireError, match="UTF-8"):
        Message(length_field(1, b"\xff")).text(1)


def test_signed_int64_and_packed_repeated() -> None:
    assert Message(varint_field(2, -1)).signed(2) == -1
    packed = Message(length_field(12, varint(1) + varint(300)) + varint_field(12, 5))
    assert packed.packed_or_repeated_ints(12) == [1, 300, 5]
