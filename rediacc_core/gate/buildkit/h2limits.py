"""What one HTTP/2 client of `/grpc` may make the gate do, bounded in memory and in CPU.

The gate ends the client's HTTP/2 connection itself (`relay.py`), so the abuse classes of HTTP/2
servers are its own to hold, each to a bound that a BuildKit client never comes near:

- Frames that carry no request data and cost work (RST_STREAM, SETTINGS, PING, WINDOW_UPDATE,
  PRIORITY, HEADERS, CONTINUATION, empty DATA, unknown types) spend a per-connection budget
  (`FRAME_BURST`, refilled at `FRAME_RATE` a second, and by one frame for every `CREDIT_BYTES` the
  gate sends the client: a client downloading fast acknowledges what it reads, Go's every 4 KiB,
  and gRPC's pings measure the link while data flows), a reset or a SETTINGS frame `COSTLY` times
  a plain one: rapid reset (opening streams and resetting them, CVE-2023-44487), window-size churn
  (WINDOW_UPDATE floods, SETTINGS_INITIAL_WINDOW_SIZE changes that touch every open stream) and
  PING or SETTINGS floods whose acknowledgements pile up end with a GOAWAY ENHANCE_YOUR_CALM.
  The frames are counted from their 9-byte heads before `h2` reads them, so a flood costs the
  gate a scan, not a parse.
- One header block (HEADERS and its CONTINUATIONs) holds at most `MAX_HEADER_BLOCK` encoded bytes
  (CONTINUATION floods, CVE-2024-27316 style), decodes to at most `MAX_HEADER_LIST` bytes as RFC
  7541 counts them (HPACK bombs: a small block naming a large table entry again and again), and
  starts with at most two dynamic table size updates, as many as RFC 7541 4.2 ever needs (table
  size churn). The meter ends a connection past the first bound and h2 one past the second (both
  GOAWAY ENHANCE_YOUR_CALM), the decoder one past the third (GOAWAY PROTOCOL_ERROR).
- A call's headers hold at most `MAX_REQUEST_FIELDS` fields and its trailers `MAX_TRAILER_FIELDS`;
  more is refused with grpc-status 8 (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import hpack

MAX_HEADER_BLOCK = 64 * 1024  # encoded bytes of one header block
MAX_HEADER_LIST = 64 * 1024  # decoded bytes of one header list (each field counts 32 more, RFC 7541)
MAX_TABLE_SIZE_UPDATES = 2  # at the start of one header block
MAX_REQUEST_FIELDS = 256  # BuildKit's session headers list its methods, a few dozen fields
MAX_TRAILER_FIELDS = 64
FRAME_BURST = 2000.0  # frames without request data a connection may send at once
FRAME_RATE = 1000.0  # ... and a second after that
COSTLY = 10.0  # what a RST_STREAM or a SETTINGS frame counts for
CREDIT_BYTES = 2048  # bytes sent to the client that earn it one more frame
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x9
_END_STREAM, _END_HEADERS = 0x1, 0x4
_HEAD = 9


class Abuse(Exception):
    """The client went past a bound: the gate ends its connection (GOAWAY ENHANCE_YOUR_CALM)."""


class FrameMeter:
    """Reads a client's bytes as HTTP/2 frames (their heads only) before `h2` does, and raises Abuse
    once they pass a bound of this module."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.tokens = FRAME_BURST
        self.last = clock()
        self.preface = len(PREFACE)  # bytes of the client's preface still to come
        self.head = bytearray()
        self.skip = 0  # payload bytes of the current frame still to come
        self.block = -1  # encoded bytes of the header block in progress (-1: none)

    def feed(self, data: bytes) -> None:
        view, at = memoryview(data), 0
        if self.preface:
            at = min(self.preface, len(view))
            self.preface -= at
        while at < len(view):
            if self.skip:
                step = min(self.skip, len(view) - at)
                self.skip -= step
                at += step
                continue
            take = min(_HEAD - len(self.head), len(view) - at)
            self.head += view[at : at + take]
            at += take
            if len(self.head) == _HEAD:
                self._frame(bytes(self.head))
                self.head.clear()

    def credited(self, sent: bytes) -> bytes:
        """`sent`, which the gate sends the client, after making room for the frames that
        acknowledge it."""
        self.tokens = min(FRAME_BURST, self.tokens + len(sent) / CREDIT_BYTES)
        return sent

    def _frame(self, head: bytes) -> None:
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        self.skip = length
        if kind == _DATA and (length or flags & _END_STREAM):
            return  # request data: flow control bounds it
        if kind in (_HEADERS, _CONTINUATION):
            self.block = (0 if kind == _HEADERS else max(self.block, 0)) + length
            if self.block > MAX_HEADER_BLOCK:
                raise Abuse(f"a header block over {MAX_HEADER_BLOCK} bytes")
            if flags & _END_HEADERS:
                self.block = -1
        self._spend(COSTLY if kind in (_RST_STREAM, _SETTINGS) else 1.0)

    def _spend(self, cost: float) -> None:
        now = self.clock()
        self.tokens = min(FRAME_BURST, self.tokens + (now - self.last) * FRAME_RATE) - cost
        self.last = now
        if self.tokens < 0:
            raise Abuse(
                f"more than {FRAME_BURST:.0f} control frames at once, or {FRAME_RATE:.0f} a second "
                "(stream resets, settings, pings, window updates, empty frames)"
            )


def too_many_fields(path: str, count: int, *, trailers: bool) -> str | None:
    """Why a call's headers (or trailers) of `count` fields are refused, or None."""
    limit, what = (MAX_TRAILER_FIELDS, "trailer") if trailers else (MAX_REQUEST_FIELDS, "header")
    return f"rdc gate: {path}: more than {limit} {what} fields" if count > limit else None


class BoundedDecoder(hpack.Decoder):
    """hpack's decoder, refusing a header block with more dynamic table size updates than
    `MAX_TABLE_SIZE_UPDATES` (h2 ends the connection with GOAWAY PROTOCOL_ERROR)."""

    def __init__(self) -> None:
        super().__init__(max_header_list_size=MAX_HEADER_LIST)
        self.updates = 0

    def decode(self, data: bytes, raw: bool = False) -> Iterable[hpack.HeaderTuple]:
        self.updates = 0
        return super().decode(data, raw)

    def _update_encoding_context(self, data: bytes | memoryview) -> int:
        self.updates += 1
        if self.updates > MAX_TABLE_SIZE_UPDATES:
            raise hpack.HPACKDecodingError(
                f"more than {MAX_TABLE_SIZE_UPDATES} dynamic table size updates in one header block"
            )
        return super()._update_encoding_context(data)
