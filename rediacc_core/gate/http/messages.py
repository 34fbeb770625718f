"""HTTP/1.1 framing for the gate: request and response heads, and chunked bodies.

The gate must agree with the daemon about where every request starts and ends, or a request could
hide inside another one's body. So it is strict: heads go through llhttp (via httptools), and every
framing the daemon might read differently is refused with 400 before anything is forwarded. Bodies
that pass through are re-framed by the gate itself, so the daemon reads exactly the frames the gate
parsed.

Nothing here does per-byte work in Python: heads are located with `bytes.find`, chunk data is
sliced with memoryviews, and only chunk-size lines are looked at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

import httptools

# One limit, owned by the decoder; re-exported for the proxy.
from rediacc_core.gate.wire.decode import MAX_INSPECTED_BODY as MAX_INSPECTED_BODY

MAX_HEAD = 256 * 1024  # bigger than any head the docker CLI sends (registry auth headers included)
_MAX_CHUNK_LINE = 4096
_LINE_WINDOW = 80
_HEX = frozenset(b"0123456789abcdefABCDEF")

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class FramingError(Exception):
    """A request the gate cannot frame unambiguously: answered with 400 and the connection closed."""

    status = 400
    # How many bytes of the chunked decoder's last `feed` were whole framing before the bad line:
    # a response relays them, so the client sees the body cut where it went wrong.
    valid = 0


@dataclass(frozen=True, slots=True)
class RequestHead:
    """One request head, validated. `target` is the raw request target exactly as received.

    Immutable: one parsed head is shared by every request that sent the same bytes (see
    `parse_request_head`), across connections.
    """

    method: str
    target: str
    version: str
    headers: tuple[tuple[bytes, bytes], ...]
    content_length: int | None
    chunked: bool
    keep_alive: bool
    upgrade: bool
    content_type: str | None
    expect_continue: bool
    # The head as forwarded when the body streams through unchanged: `encode` with the framing
    # the client sent, computed once per distinct head.
    passthrough: bytes = b""

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)

    def encode(self, *, content_length: int | None, chunked: bool) -> bytes:
        """The head as the gate forwards it, with framing headers written by the gate.

        `Content-Length` and `Transfer-Encoding` are replaced by what the gate sends; `Expect` goes
        when the gate has already read the body (there is nothing left to continue).
        """
        lines = [f"{self.method} {self.target} HTTP/{self.version}\r\n".encode("latin-1")]
        drop_expect = content_length is not None and not chunked and self.expect_continue
        for name, value in self.headers:
            lower = name.lower()
            if lower in (b"content-length", b"transfer-encoding"):
                continue
            if drop_expect and lower == b"expect":
                continue
            lines.append(name + b": " + value + b"\r\n")
        if chunked:
            lines.append(b"Transfer-Encoding: chunked\r\n")
        elif content_length is not None:
            lines.append(b"Content-Length: %d\r\n" % content_length)
        lines.append(b"\r\n")
        return b"".join(lines)


@dataclass(slots=True)
class _HeadCollector:
    url: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    complete: bool = False

    # httptools calls these by name.
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.complete = True


def find_head_end(buffer: bytes | bytearray) -> int:
    """Index just past the blank line ending a head in `buffer`, or -1 while it is incomplete."""
    end = buffer.find(b"\r\n\r\n")
    return -1 if end < 0 else end + 4


def _refuse(problem: str) -> FramingError:
    return FramingError(f"malformed request: {problem}; send a well-formed HTTP/1.1 request")


_HEAD_CACHE: dict[bytes, RequestHead] = {}
HEAD_CACHE_SIZE = 512
_CACHED_HEAD_MAX = 4096  # bigger heads (registry credentials) are rare: parsed every time


def parse_request_head(head: bytes) -> RequestHead:
    """Parse and validate a complete request head (through its blank line).

    Docker clients send the same heads over and over (every ping, every `docker ps`, every
    poll), and the same bytes always parse to the same result, so results are remembered by the
    head's exact bytes (a bounded number; refusals are not remembered, they end the connection).
    The result is immutable, so sharing it between connections shares nothing they could change.

    Raises FramingError for anything llhttp rejects (bare LF, obs-fold, bad tokens, bad or
    duplicate Content-Length, Content-Length together with Transfer-Encoding) and for what the
    gate additionally refuses: any Transfer-Encoding but one `chunked`, repeated Content-Type, a
    form Content-Type (its body would override the query), HTTP versions other than 1.0 and 1.1.
    """
    known = _HEAD_CACHE.get(head)
    if known is not None:
        return known
    req = _parse_request_head(head)
    if len(head) > _CACHED_HEAD_MAX:
        return req
    if len(_HEAD_CACHE) >= HEAD_CACHE_SIZE:
        del _HEAD_CACHE[next(iter(_HEAD_CACHE))]  # the oldest entry
    _HEAD_CACHE[head] = req
    return req


def known_request_head(head: bytes) -> RequestHead | None:
    """`parse_request_head`'s remembered answer for exactly these bytes, or None (never parses).

    Every remembered key is one whole head through its first blank line, so bytes found here are
    one whole request head and nothing else.
    """
    return _HEAD_CACHE.get(head)


def _parse_request_head(head: bytes) -> RequestHead:
    if b"\r\n " in head or b"\r\n\t" in head:
        raise _refuse("folded header line (obs-fold)")
    collector = _HeadCollector()
    parser = httptools.HttpRequestParser(collector)
    try:
        parser.feed_data(head)
    except httptools.HttpParserUpgrade:
        pass  # the head is complete; whether the connection really upgrades is the daemon's answer
    except httptools.HttpParserError as exc:
        raise _refuse(str(exc) or type(exc).__name__) from None
    if not collector.complete:
        raise _refuse("incomplete head")
    version = parser.get_http_version()
    if version not in ("1.1", "1.0"):
        raise _refuse(f"HTTP/{version} is not supported")
    content_length: int | None = None
    transfer_encodings: list[bytes] = []
    content_types: list[bytes] = []
    connection_tokens: set[bytes] = set()
    upgrade_header = False
    expect_continue = False
    headers: list[tuple[bytes, bytes]] = []
    for name, raw_value in collector.headers:
        value = raw_value.strip(b" \t")
        headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length":
            if content_length is not None and int(value) != content_length:
                raise _refuse("differing Content-Length headers")
            content_length = int(value)
        elif lower == b"transfer-encoding":
            transfer_encodings.append(value)
        elif lower == b"content-type":
            content_types.append(value)
        elif lower == b"connection":
            connection_tokens.update(token.strip().lower() for token in value.split(b","))
        elif lower == b"upgrade":
            upgrade_header = True
        elif lower == b"expect":
            if value.lower() != b"100-continue":
                raise _refuse(f"unsupported Expect: {value.decode('latin-1')!r}")
            expect_continue = True
    if transfer_encodings:
        if version == "1.0":
            # The daemon ignores Transfer-Encoding on HTTP/1.0 and would read the chunks as requests.
            raise _refuse("Transfer-Encoding on an HTTP/1.0 request")
        if content_length is not None:
            raise _refuse("both Transfer-Encoding and Content-Length")
        if len(transfer_encodings) != 1 or transfer_encodings[0].lower() != b"chunked":
            shown = ", ".join(v.decode("latin-1") for v in transfer_encodings)
            raise _refuse(f"Transfer-Encoding {shown!r}: only a single 'chunked' is accepted")
    if len(content_types) > 1:
        raise _refuse("repeated Content-Type headers")
    if content_types:
        _refuse_form_body(content_types[0])
    req = RequestHead(
        method=parser.get_method().decode("latin-1"),
        target=collector.url.decode("latin-1"),
        version=version,
        headers=tuple(headers),
        content_length=content_length,
        chunked=bool(transfer_encodings),
        keep_alive=_keeps_alive(version, connection_tokens),
        upgrade=upgrade_header and b"upgrade" in connection_tokens,
        content_type=content_types[0].decode("latin-1") if content_types else None,
        expect_continue=expect_continue,
    )
    passthrough = req.encode(content_length=req.content_length, chunked=req.chunked)
    return replace(req, passthrough=passthrough)


# Go's Request.ParseForm reads a POST, PUT or PATCH body of these types as form fields, and its
# form lists them before the query's, so the daemon's `r.FormValue("networkmode")` would take the
# body's value over the query the gate checked.
_FORM_MEDIA_TYPES = (b"application/x-www-form-urlencoded", b"multipart/form-data")


def _refuse_form_body(content_type: bytes) -> None:
    """Refuses a body the daemon would read as form fields.

    Matched loosely (Go trims Unicode spaces and lowercases before it compares; any media type
    that contains one of these is refused), since no Docker client sends either type.
    """
    media = content_type.partition(b";")[0].lower()
    for form in _FORM_MEDIA_TYPES:
        if form in media:
            raise FramingError(
                f"refused: Content-Type {content_type.decode('latin-1')!r}: the daemon would read "
                "the body as form fields that override the query string the gate checked; send "
                "options in the query string and the body as the endpoint expects it (JSON, or a "
                "tar archive for a build), as the docker CLI does"
            )


def _keeps_alive(version: str, connection_tokens: set[bytes]) -> bool:
    if version == "1.1":
        return b"close" not in connection_tokens
    return b"keep-alive" in connection_tokens


# --- responses (from the daemon, which the gate trusts for framing) ------------------------------

BODY_NONE = 0  # no body follows the head
BODY_LENGTH = 1  # Content-Length bytes follow
BODY_CHUNKED = 2  # chunked body follows
BODY_UNTIL_CLOSE = 3  # the body runs until the daemon closes (a hijacked stream)
INTERIM = 4  # a 1xx other than 101: another head follows
SWITCHED = 5  # 101: raw bytes both ways from here on


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    body: int  # one of the BODY_* / INTERIM / SWITCHED values
    length: int
    keep_alive: bool


_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [^\r\n]*)?\r\n")
_FRAMING_FIELD = re.compile(
    rb"\r\n(content-length|transfer-encoding|connection)[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE
)
_RESPONSE_CACHE: dict[tuple[bytes, str], ResponseHead] = {}
_RESPONSE_CACHE_SIZE = 256


def parse_response_head(head: bytes, request_method: str) -> ResponseHead:
    """Status and body framing of a daemon response head (RFC 9112 section 6.3 rules).

    The daemon is trusted to frame its answers, so only the few fields that decide framing are
    looked up (one regular-expression scan). This runs for every response the gate relays, and
    the daemon's heads for one endpoint differ only in their `Date:` line, which frames nothing:
    so the result is remembered by the head's exact bytes without that line.
    """
    key = head  # without its first `Date:` line (as Go's server writes it), if it has one
    start = head.find(b"\r\nDate: ")
    if start >= 0:
        end = head.find(b"\r\n", start + 2)
        if end >= 0:
            key = head[:start] + head[end:]
    known = _RESPONSE_CACHE.get((key, request_method))
    if known is not None:
        return known
    resp = _parse_response_head(head, request_method)
    if len(key) <= _CACHED_HEAD_MAX:
        if len(_RESPONSE_CACHE) >= _RESPONSE_CACHE_SIZE:
            del _RESPONSE_CACHE[next(iter(_RESPONSE_CACHE))]  # the oldest entry
        _RESPONSE_CACHE[(key, request_method)] = resp
    return resp


def _parse_response_head(head: bytes, request_method: str) -> ResponseHead:
    status_line = _STATUS_LINE.match(head)
    if status_line is None:
        raise ValueError(f"malformed response from the daemon: {head[:40]!r}")
    status = int(status_line.group(2))
    if status == 101:
        return ResponseHead(status, SWITCHED, 0, False)
    if status < 200:
        return ResponseHead(status, INTERIM, 0, True)
    length: int | None = None
    chunked = False
    connection_tokens: set[bytes] = set()
    for field_match in _FRAMING_FIELD.finditer(head, status_line.end() - 2):
        name = field_match.group(1).lower()
        value = field_match.group(2).strip().lower()
        if name == b"content-length":
            if not value.isdigit():
                raise ValueError(f"malformed Content-Length from the daemon: {value[:20]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        else:
            connection_tokens.update(token.strip() for token in value.split(b","))
    version = "1.1" if status_line.group(1) == b"1" else "1.0"
    keep_alive = _keeps_alive(version, connection_tokens)
    if request_method == "HEAD" or status in (204, 304):
        return ResponseHead(status, BODY_NONE, 0, keep_alive)
    if chunked:
        return ResponseHead(status, BODY_CHUNKED, 0, keep_alive)
    if length is not None:
        return ResponseHead(status, BODY_LENGTH if length else BODY_NONE, length, keep_alive)
    return ResponseHead(status, BODY_UNTIL_CLOSE, 0, False)


# --- chunked bodies ---------------------------------------------------------------------------

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedDecoder:
    """Incremental chunked-body reader.

    `feed(data)` returns the decoded data pieces (memoryviews into `data`, no copies) and how many
    bytes of `data` belonged to the body; fewer than `len(data)` only once the body ended.
    Strict mode (requests) accepts exactly `HEX CRLF data CRLF ... 0 CRLF CRLF`: no chunk
    extensions, no trailers. Lenient mode (the daemon's responses) skips both.
    """

    __slots__ = ("_line", "_remaining", "_state", "_strict")

    def __init__(self, *, strict: bool) -> None:
        self._strict = strict
        self._state = _SIZE
        self._remaining = 0
        self._line = bytearray()

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes | bytearray | memoryview) -> tuple[list[memoryview], int]:
        view = memoryview(data)
        pieces: list[memoryview] = []
        pos = 0
        size = len(view)
        while pos < size and self._state != _DONE:
            if self._state == _DATA:
                take = min(self._remaining, size - pos)
                pieces.append(view[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
                continue
            # Framing lines are short: look for their end in a small copied window, never in the
            # whole (possibly 256 KiB) read.
            window = bytes(view[pos : pos + _LINE_WINDOW])
            newline = window.find(b"\n")
            start = pos
            if newline < 0:
                self._line += window
                if len(self._line) > _MAX_CHUNK_LINE:
                    raise _at(_refuse("chunk framing line too long"), start)
                pos += len(window)
                continue
            if self._line:
                self._line += window[: newline + 1]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = window[: newline + 1]
            pos += newline + 1
            try:
                self._line_done(line)
            except FramingError as exc:
                raise _at(exc, start) from None
        return pieces, pos

    def _line_done(self, line: bytes) -> None:
        if not line.endswith(b"\r\n"):
            raise _refuse("chunk framing line not ended by CRLF")
        text = line[:-2]
        if self._state == _SIZE:
            if b";" in text:
                if self._strict:
                    raise _refuse("chunk extensions are not accepted")
                text = text.split(b";", 1)[0].rstrip(b" \t")
            if not text or len(text) > 15 or not _HEX.issuperset(text):
                raise _refuse(f"bad chunk size {text[:20]!r}")
            self._remaining = int(text, 16)
            self._state = _DATA if self._remaining else _TRAILER
        elif self._state == _DATA_END:
            if text:
                raise _refuse("chunk data not followed by CRLF")
            self._state = _SIZE
        elif self._state == _TRAILER:
            if not text:
                self._state = _DONE
            elif self._strict:
                raise _refuse("trailer fields after a chunked body are not accepted")


def _at(error: FramingError, valid: int) -> FramingError:
    error.valid = valid
    return error


def chunk_frame(pieces: list[memoryview]) -> list[bytes | memoryview]:
    """One chunk carrying `pieces` (empty list when there is nothing to send)."""
    total = sum(len(piece) for piece in pieces)
    if not total:
        return []
    return [b"%x\r\n" % total, *pieces, b"\r\n"]


LAST_CHUNK = b"0\r\n\r\n"


def json_response(body: bytes, *, close: bool = False) -> bytes:
    """A 200 response the gate makes itself, with a JSON body (`views`: what a tenant may see)."""
    lines = ["HTTP/1.1 200 OK", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def error_response(status: int, message: str, *, head_only: bool = False, close: bool = False) -> bytes:
    """A Docker-style error response: `{"message": "..."}` as JSON, which the docker CLI shows."""
    body = (json.dumps({"message": message}) + "\n").encode("utf-8")
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
