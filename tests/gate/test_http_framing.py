"""The gate frames requests strictly: anything the daemon might read differently is refused (400)."""

from __future__ import annotations

import pytest

from rediacc_core.gate.http.messages import (
    BODY_CHUNKED,
    BODY_LENGTH,
    BODY_NONE,
    BODY_UNTIL_CLOSE,
    INTERIM,
    SWITCHED,
    ChunkedDecoder,
    FramingError,
    chunk_frame,
    error_response,
    parse_request_head,
    parse_response_head,
)


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def test_a_plain_request_head_is_read_as_sent() -> None:
    req = parse_request_head(
        head(
            "POST /v1.45/containers/create?name=x HTTP/1.1",
            "Host: docker",
            "Content-Type: application/json",
            "Content-Length: 12",
        )
    )
    assert (req.method, req.target, req.version) == ("POST", "/v1.45/containers/create?name=x", "1.1")
    assert req.content_length == 12 and not req.chunked and req.keep_alive
    assert req.content_type == "application/json"


def test_absolute_form_targets_are_kept_raw_for_the_decider() -> None:
    req = parse_request_head(head("POST http://docker/v1.45/containers/create HTTP/1.1", "Host: docker"))
    assert req.target == "http://docker/v1.45/containers/create"


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (["POST /x HTTP/1.1", "Content-Length: 3", "Transfer-Encoding: chunked"], "Content-Length"),
        (["POST /x HTTP/1.1", "Content-Length: 3", "Content-Length: 4"], "Content-Length"),
        (["POST /x HTTP/1.1", "Transfer-Encoding: identity"], "Transfer-Encoding"),
        (["POST /x HTTP/1.1", "Transfer-Encoding: gzip, chunked"], "Transfer-Encoding"),
        (
            ["POST /x HTTP/1.1", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
            "Transfer-Encoding",
        ),
        (["POST /x HTTP/1.1", "X-A: a", " folded"], "obs-fold"),
        (["POST /x HTTP/1.1", "X-A: a", "\tfolded"], "obs-fold"),
        (["POST /x HTTP/1.1", "Content-Length: -1"], "Content-Length"),
        (["POST /x HTTP/1.1", "Host : docker"], "token"),
        (["POST /x HTTP/1.1", "Content-Type: application/json", "Content-Type: text/plain"], "Content-Type"),
        (["GET /x HTTP/2.0", "Host: docker"], "HTTP/2.0"),
        (["POST /x HTTP/1.0", "Transfer-Encoding: chunked"], "HTTP/1.0"),
        (["POST /x HTTP/1.1", "Expect: something-else"], "Expect"),
    ],
)
def test_ambiguous_framing_is_refused(lines: list[str], why: str) -> None:
    with pytest.raises(FramingError) as caught:
        parse_request_head(head(*lines))
    assert caught.value.status == 400
    assert why.lower() in str(caught.value).lower()


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",
        "Application/X-WWW-Form-Urlencoded; charset=utf-8",
        "\xc2\xa0application/x-www-form-urlencoded",  # a UTF-8 no-break space: Go trims it
        "application/x-www-form-urlencoded;;bad=",  # Go still reads the form when a parameter is bad
        "multipart/form-data; boundary=x",
        "MULTIPART/FORM-DATA",
    ],
)
def test_a_body_the_daemon_would_read_as_form_fields_is_refused(content_type: str) -> None:
    """Go's ParseForm reads such a body and lets its fields override the query: `POST /build?
    networkmode=none` with `networkmode=host` in the body builds on the host's network."""
    request = head("POST /v1.45/build?networkmode=none HTTP/1.1", f"Content-Type: {content_type}")
    with pytest.raises(FramingError) as caught:
        parse_request_head(request)
    assert caught.value.status == 400
    assert "form fields that override the query string" in str(caught.value)


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/x-tar", "text/plain", "application/octet-stream"]
)
def test_the_types_docker_clients_send_pass(content_type: str) -> None:
    lines = ["POST /v1.45/build HTTP/1.1", f"Content-Type: {content_type}", "Content-Length: 0"]
    assert parse_request_head(head(*lines)).content_type == content_type


def test_bare_lf_line_endings_are_refused() -> None:
    with pytest.raises(FramingError):
        parse_request_head(b"GET /x HTTP/1.1\nHost: docker\n\n")


def test_the_forwarded_head_carries_only_the_gates_framing() -> None:
    req = parse_request_head(
        head(
            "POST /containers/create HTTP/1.1",
            "Host: docker",
            "Transfer-Encoding: chunked",
            "Expect: 100-continue",
        )
    )
    forwarded = req.encode(content_length=42, chunked=False)
    assert b"Transfer-Encoding" not in forwarded and b"Expect" not in forwarded
    assert forwarded.endswith(b"Content-Length: 42\r\n\r\n")
    assert req.encode(content_length=None, chunked=True).count(b"Transfer-Encoding: chunked") == 1


def test_upgrade_requests_are_recognised() -> None:
    req = parse_request_head(
        head(
            "POST /exec/abc/start HTTP/1.1",
            "Host: docker",
            "Connection: Upgrade",
            "Upgrade: tcp",
            "Content-Length: 2",
        )
    )
    assert req.upgrade and req.content_length == 2


def decode_all(decoder: ChunkedDecoder, data: bytes, step: int) -> tuple[bytes, int]:
    out = bytearray()
    used_total = 0
    for start in range(0, len(data), step):
        pieces, used = decoder.feed(data[start : start + step])
        out += b"".join(bytes(p) for p in pieces)
        used_total += used
        if decoder.done:
            break
    return bytes(out), used_total


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 10_000])
def test_chunked_bodies_decode_whatever_the_read_sizes(step: int) -> None:
    body = b"5\r\nhello\r\n1a\r\n" + b"x" * 26 + b"\r\n0\r\n\r\n"
    decoder = ChunkedDecoder(strict=True)
    data, used = decode_all(decoder, body + b"NEXT", step)
    assert decoder.done and data == b"hello" + b"x" * 26
    assert used == len(body)  # the next request's bytes are left alone


@pytest.mark.parametrize(
    "body",
    [
        b"5;ext=1\r\nhello\r\n0\r\n\r\n",  # chunk extension
        b"5\r\nhelloXX\r\n0\r\n\r\n",  # data longer than declared
        b"5\nhello\r\n0\r\n\r\n",  # bare LF
        b"zz\r\nhello\r\n0\r\n\r\n",  # not hex
        b" 5\r\nhello\r\n0\r\n\r\n",  # whitespace
        b"0\r\nX-Trailer: 1\r\n\r\n",  # trailer
        b"1" * 20 + b"\r\n",  # absurd size
    ],
)
def test_bad_chunk_framing_is_refused(body: bytes) -> None:
    with pytest.raises(FramingError):
        decode_all(ChunkedDecoder(strict=True), body, 4)


def test_the_daemons_chunked_responses_are_read_leniently() -> None:
    decoder = ChunkedDecoder(strict=False)
    data, _ = decode_all(decoder, b"5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n", 5)
    assert decoder.done and data == b"hello"


def test_re_framing_makes_one_chunk_per_read() -> None:
    assert (
        b"".join(bytes(p) for p in chunk_frame([memoryview(b"ab"), memoryview(b"cde")])) == b"5\r\nabcde\r\n"
    )
    assert chunk_frame([]) == []


@pytest.mark.parametrize(
    ("lines", "method", "body"),
    [
        (["HTTP/1.1 200 OK", "Content-Length: 2"], "GET", BODY_LENGTH),
        (["HTTP/1.1 200 OK", "Content-Length: 2"], "HEAD", BODY_NONE),
        (["HTTP/1.1 200 OK", "Content-Length: 0"], "GET", BODY_NONE),
        (["HTTP/1.1 200 OK", "Transfer-Encoding: chunked"], "GET", BODY_CHUNKED),
        (["HTTP/1.1 204 No Content"], "DELETE", BODY_NONE),
        (["HTTP/1.1 101 UPGRADED", "Connection: Upgrade", "Upgrade: tcp"], "POST", SWITCHED),
        (["HTTP/1.1 100 Continue"], "POST", INTERIM),
        (["HTTP/1.1 200 OK", "Content-Type: application/vnd.docker.raw-stream"], "POST", BODY_UNTIL_CLOSE),
    ],
)
def test_response_framing(lines: list[str], method: str, body: int) -> None:
    assert parse_response_head(head(*lines), method).body == body


def test_keep_alive_survives_bodiless_responses() -> None:
    assert parse_response_head(head("HTTP/1.1 200 OK", "Content-Length: 0"), "HEAD").keep_alive
    assert not parse_response_head(
        head("HTTP/1.1 200 OK", "Connection: close", "Content-Length: 0"), "GET"
    ).keep_alive


def test_refusals_look_like_docker_errors() -> None:
    response = error_response(403, 'no grant for "x"')
    assert response.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert response.endswith(b'\r\n\r\n{"message": "no grant for \\"x\\""}\n')
    assert not error_response(403, "no", head_only=True).endswith(b"}\n")


def test_response_framing_fields_are_found_in_any_case() -> None:
    resp = parse_response_head(head("HTTP/1.1 200 OK", "transfer-encoding: chunked"), "GET")
    assert resp.body == BODY_CHUNKED
    old = parse_response_head(head("HTTP/1.0 200 OK", "Content-Length: 2"), "GET")
    assert old.body == BODY_LENGTH and not old.keep_alive


@pytest.mark.parametrize("bad", [b"HTTX/1.1 200 OK\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n", b"junk\r\n\r\n"])
def test_a_garbled_daemon_response_is_an_error(bad: bytes) -> None:
    with pytest.raises(ValueError):
        parse_response_head(bad, "GET")


def test_a_repeated_head_is_parsed_once_and_shared_immutably() -> None:
    raw = head("GET /v1.45/containers/json HTTP/1.1", "Host: docker")
    first, again = parse_request_head(raw), parse_request_head(bytes(bytearray(raw)))
    assert first is again
    assert first.passthrough == first.encode(content_length=None, chunked=False)
    with pytest.raises(AttributeError):
        first.target = "/other"  # type: ignore[misc]


def test_a_refused_head_is_refused_every_time() -> None:
    bad = head("POST /x HTTP/1.1", "Content-Length: 3", "Transfer-Encoding: chunked")
    for _ in range(2):
        with pytest.raises(FramingError):
            parse_request_head(bad)


def test_response_heads_that_differ_only_in_their_date_frame_alike() -> None:
    for date in ("Mon, 30 Nov 2026 07:00:00 GMT", "Mon, 30 Nov 2026 07:00:01 GMT"):
        resp = parse_response_head(head("HTTP/1.1 200 OK", f"Date: {date}", "Content-Length: 2"), "GET")
        assert (resp.body, resp.length, resp.keep_alive) == (BODY_LENGTH, 2, True)
    closing = parse_response_head(
        head(
            "HTTP/1.1 200 OK", "Date: Mon, 30 Nov 2026 07:00:01 GMT", "Content-Length: 2", "Connection: close"
        ),
        "GET",
    )
    assert not closing.keep_alive
    assert (
        parse_response_head(head("HTTP/1.1 200 OK", "Date: x", "Content-Length: 2"), "HEAD").body == BODY_NONE
    )
    chunked = head("HTTP/1.1 200 OK", "Date: x", "Content-Length-Extra: 1", "transfer-encoding: chunked")
    assert parse_response_head(chunked, "GET").body == BODY_CHUNKED


def test_a_head_without_its_blank_line_is_refused() -> None:
    with pytest.raises(FramingError, match="incomplete head"):
        parse_request_head(b"GET /x HTTP/1.1\r\nHost: docker\r\n")


def test_a_chunk_framing_line_that_never_ends_is_refused() -> None:
    decoder = ChunkedDecoder(strict=False)
    with pytest.raises(FramingError, match="line too long"):
        for _ in range(100):
            decoder.feed(b"f" * 100)


def test_a_daemon_content_length_that_is_not_a_number_is_an_error() -> None:
    with pytest.raises(ValueError, match="Content-Length"):
        parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "GET")


def test_the_parsed_head_caches_stay_bounded() -> None:
    from rediacc_core.gate.http import messages

    for n in range(messages.HEAD_CACHE_SIZE + 10):
        parse_request_head(head(f"GET /containers/{n}/json HTTP/1.1", "Host: docker"))
        parse_response_head(head("HTTP/1.1 200 OK", f"X-Id: {n}", "Content-Length: 0"), "GET")
    assert len(messages._HEAD_CACHE) <= messages.HEAD_CACHE_SIZE
    assert len(messages._RESPONSE_CACHE) <= messages._RESPONSE_CACHE_SIZE
