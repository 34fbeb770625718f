"""Reading a Docker API request exactly as the daemon will, or refusing it as ambiguous.

The daemon routes on the URL-decoded path (optionally prefixed `/v1.xx`, absolute-form targets
included) and decodes JSON with Go's `encoding/json`: keys match struct fields case-insensitively
under Unicode simple folding, a repeated key's last value wins and repeated objects merge. Every
AuthZ-plugin bypass of the past lived in a gap between such rules and the checker's reading. So the
gate decodes into the daemon's struct shapes (`decode_fields`) and refuses, with 400, anything two
readers could read differently: duplicate or fold-variant keys, trailing data, invalid UTF-8, out of
range numbers, unknown non-empty fields in the structs that reach the host. What it forwards is
its own canonical re-encoding, so the daemon reads exactly what was checked.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson

from rediacc_core.gate.wire.decode_fields import (
    STRUCTS,
    AnyValue,
    FieldType,
    ListOf,
    MapOf,
    Scalar,
    StructRef,
)

MAX_INSPECTED_BODY = 4 * 1024 * 1024  # bytes; the daemon has no limit, the gate must have one
MIN_API_VERSION = (1, 24)  # the oldest API a current daemon serves; older ones read bodies differently
MAX_DEPTH = 200  # far deeper than any real body, well short of Python's recursion limit


class BadRequest(Exception):
    """The request is malformed or ambiguous; the gate answers 400 with this message."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Target:
    """A request target as the daemon's router sees it."""

    path: str  # URL-decoded, without the `/vX.Y` prefix
    version: str | None  # as written, e.g. "1.045"; compare with `api_version`
    query: dict[str, tuple[str, ...]]

    @property
    def api_version(self) -> tuple[int, int] | None:
        if self.version is None:
            return None
        major, minor = self.version.split(".")
        return int(major), int(minor)


# --- request targets -------------------------------------------------------------------------

_ABSOLUTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^/?#]*")
# Go's regexp: `.` stops at a newline and `$` is the end of the text (Python's fullmatch).
_VERSIONED = re.compile(r"/v([0-9.]+)(/.*)")
_VERSION = re.compile(r"[0-9]+\.[0-9]+")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_BAD_TARGET_CHAR = re.compile("[\x00-\x20\x7f#]")  # controls, space, DEL, a fragment


def _unescape(text: str, what: str) -> str:
    if _BAD_ESCAPE.search(text):
        raise BadRequest(f"invalid percent-escape in the request {what}")
    return unquote_to_bytes(text).decode("utf-8", "surrogateescape")


def _is_clean(path: str) -> bool:
    """What Go's router serves without a 301: no empty, `.` or `..` segment (a trailing `/` is kept)."""
    segments = path[1:].split("/")
    if segments[-1] == "":
        segments.pop()
    return all(seg not in ("", ".", "..") for seg in segments)


def _parse_query(raw: str) -> dict[str, tuple[str, ...]]:
    if ";" in raw:  # Go refuses `;` separators; the daemon answers 400
        raise BadRequest("invalid semicolon separator in query")
    query: dict[str, list[str]] = {}
    for part in raw.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        name = _unescape(key.replace("+", " "), "query")
        query.setdefault(name, []).append(_unescape(value.replace("+", " "), "query"))
    return {key: tuple(values) for key, values in query.items()}


def parse_target(raw_target: str) -> Target:
    """Route `raw_target` (origin- or absolute-form) the way the daemon does; BadRequest if unclean."""
    if _BAD_TARGET_CHAR.search(raw_target):
        raise BadRequest("invalid character in the request target")
    target = raw_target
    absolute = _ABSOLUTE.match(target)
    if absolute:
        target = target[absolute.end() :]
    raw_path, _, raw_query = target.partition("?")
    if not raw_path.startswith("/"):
        raise BadRequest(f"request target {raw_target!r} is not an absolute path")
    path = _unescape(raw_path, "path")
    if not _is_clean(path):
        raise BadRequest(f"request path {path!r} is not clean (the daemon would redirect, not serve it)")
    version = None
    versioned = _VERSIONED.fullmatch(path)
    if versioned:
        version, path = versioned.group(1), versioned.group(2)
        if not _VERSION.fullmatch(version):
            raise BadRequest(f"API version {version!r} is not of the form <major>.<minor>")
    return Target(path=path, version=version, query=_parse_query(raw_query))


# --- content type ----------------------------------------------------------------------------

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_PARAM = re.compile(r"\s*;\s*(" + _TOKEN + r")\s*=\s*(" + _TOKEN + "|" + _QUOTED + r")\s*", re.DOTALL)
_TRAILING = re.compile(r"[\s;]*")


def check_content_type(content_type: str | None, body: bytes) -> None:
    """The daemon's own check: `application/json` (parameters allowed), or no type and no body."""
    if content_type is None or content_type.strip() == "":
        if body:
            raise BadRequest("a request body needs Content-Type: application/json")
        return
    media = content_type.partition(";")[0]
    if media.strip().lower() != "application/json":
        raise BadRequest(f"Content-Type {content_type!r} is not application/json")
    rest = content_type[len(media) :]
    while rest:
        param = _PARAM.match(rest)
        if param is None:
            if _TRAILING.fullmatch(rest):
                break  # Go ignores trailing semicolons
            raise BadRequest(f"malformed Content-Type header ({content_type})")
        rest = rest[param.end() :]


# --- JSON as Go decodes it -------------------------------------------------------------------

# Go's EqualFold puts a rune in the same class as its simple case folds. Among the runes that fold
# onto ASCII letters, only these two are not ASCII themselves.
_ASCII_FOLDS = {"\u017f": "S", "\u212a": "K"}


def _fold_char(char: str) -> str:
    if char.isascii():
        return char.upper()
    special = _ASCII_FOLDS.get(char)
    if special is not None:
        return special
    # Outside ASCII, fold at least as coarsely as Go does (coarser only refuses more key pairs).
    variants = {char, char.lower(), char.upper(), char.casefold(), char.title()}
    return min(v for v in variants if len(v) == 1)


def go_fold(key: str) -> str:
    """Equal for a key and an ASCII field name exactly when Go's `bytes.EqualFold` says they match."""
    if key.isascii():
        return key.upper()
    return "".join(_ASCII_FOLDS.get(c, c.upper() if c.isascii() else c) for c in key)


def fold(key: str) -> str:
    """Equal for two keys whenever Go's `bytes.EqualFold` could say they are equal (and a little more).

    Used to find ambiguous keys, where folding too much only refuses more; field lookup uses
    `go_fold`, which is exact.
    """
    if key.isascii():
        return key.upper()
    return "".join(_fold_char(c) for c in key)


_FORBIDDEN_INDEX: dict[str, frozenset[str]] = {
    name: frozenset(go_fold(f) for f in struct.forbidden) for name, struct in STRUCTS.items()
}
_SURROGATE = re.compile("[\ud800-\udfff]")

INT_RANGE = {("int", b): (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)}
INT_RANGE.update({("uint", b): (0, (1 << b) - 1) for b in (8, 16, 32, 64)})


class _Pairs(list[tuple[str, Any]]):
    """A JSON object with its keys in order and duplicates kept, so the gate can see them."""


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"invalid JSON: {name} is not a JSON value")


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BadRequest(f"invalid JSON: number {text} is out of range")
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_Pairs, parse_float=_parse_float, parse_constant=_reject_constant, strict=True
)


def parse_json(body: bytes) -> Any:
    """Parse `body` as Go's grammar allows; objects come back as `_Pairs`."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Go would silently read invalid UTF-8 as U+FFFD; the gate won't guess what was meant.
        raise BadRequest(f"invalid UTF-8 in the request body at byte {exc.start}") from None
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise BadRequest("unexpected content after the JSON value") from None
        raise BadRequest(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (RecursionError, ValueError) as exc:  # ValueError: an integer with too many digits
        raise BadRequest(f"invalid JSON: {exc}") from None


# Where a value sits in the body, for error messages only: a string, or (parent, key, style) built
# as the walk goes down and formatted only when something is refused (most bodies are admitted).
_FIELD, _INDEX, _MAP_KEY, _ANY_KEY = range(4)
Where = str | tuple[Any, Any, int]


def place(where: Where) -> str:
    """The location `where` stands for, as error messages show it (`HostConfig.Devices[0]`)."""
    if isinstance(where, str):
        return where
    parent, key, style = where
    above = place(parent)
    if style == _FIELD:
        return f"{above}.{key}" if above else str(key)
    if style == _ANY_KEY:
        return f"{above}.{key}"
    if style == _INDEX:
        return f"{above}[{key}]"
    return f"{above}[{key!r}]"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "object" if isinstance(value, _Pairs) else "array"
    return "null"


def _type_error(value: Any, expected: str, where: Where) -> BadRequest:
    return BadRequest(f"{place(where)}: cannot use a JSON {_json_type(value)} as {expected}")


def is_empty(value: Any) -> bool:
    """Go's zero value for any field type: null, false, 0, "", [] or {}."""
    if value is None or value is False or value == "":
        return True
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value == 0
    return isinstance(value, list | dict) and len(value) == 0


Reader = Callable[[Any, Where, int], Any]


class Readers:
    """Turns parsed JSON into the canonical value of a field type, or raises BadRequest.

    Each field type is compiled once into a reader: a closure specialised for that type (a struct's
    key table, an integer's range), so a body is read without asking, for every value, what kind of
    field it is. Values are tested with `type(...) is`, which is exact here: the parser makes only
    plain str, int, float, bool, list, `_Pairs` and None.
    """

    def __init__(self, escapes: bool = True) -> None:
        # An unpaired surrogate can only come from a `\uD800`-`\uDFFF` escape (strict UTF-8 has
        # none), so bodies without such an escape skip the per-string check.
        self.escapes = escapes
        self._readers: dict[FieldType, Reader] = {}
        self._structs: dict[str, Reader] = {}
        self.any = self._any_reader()

    def reader(self, kind: FieldType) -> Reader:
        found = self._readers.get(kind)
        if found is None:
            found = self._readers[kind] = self._compile(kind)
        return found

    def _compile(self, kind: FieldType) -> Reader:
        if isinstance(kind, Scalar):
            return self._scalar(kind)
        if isinstance(kind, ListOf):
            return self._list(self.reader(kind.item))
        if isinstance(kind, MapOf):
            return self._map(self.reader(kind.value))
        if isinstance(kind, StructRef):
            return self._struct(kind.name)
        return self.any  # which returns null as it is

    @staticmethod
    def _check_string(value: str, where: Where) -> None:
        """An unpaired surrogate in `value` is refused (readers call this only when `escapes` is set)."""
        if _SURROGATE.search(value):
            raise BadRequest(f"{place(where)}: invalid \\u escape (unpaired surrogate)")

    def _scalar(self, kind: Scalar) -> Reader:
        scalar_kind, bits, check = kind.kind, kind.bits, self._check_string
        if scalar_kind == "string":
            escapes = self.escapes

            def read_string(value: Any, where: Where, depth: int) -> Any:
                if type(value) is str:
                    if escapes:
                        check(value, where)
                    return value
                if value is None:
                    return None  # Go: null leaves a value alone or sets a pointer/slice/map to nil
                raise _type_error(value, "a string", where)

            return read_string
        if scalar_kind == "bool":

            def read_bool(value: Any, where: Where, depth: int) -> Any:
                if value is True or value is False or value is None:
                    return value
                raise _type_error(value, "a boolean", where)

            return read_bool
        expected = f"a {scalar_kind}{bits} number"
        if scalar_kind == "float":

            def read_float(value: Any, where: Where, depth: int) -> Any:
                if type(value) is int or type(value) is float or value is None:
                    return value
                raise _type_error(value, expected, where)

            return read_float
        low, high = INT_RANGE[(scalar_kind, bits)]

        def read_integer(value: Any, where: Where, depth: int) -> Any:
            if type(value) is int:
                if low <= value <= high:
                    return value
                raise BadRequest(f"{place(where)}: {value} is out of range for a {scalar_kind}{bits}")
            if value is None:
                return None
            if type(value) is float:  # Go parses integer fields with ParseInt: no fraction, no exponent
                raise BadRequest(f"{place(where)}: {value!r} is not an integer")
            raise _type_error(value, expected, where)

        return read_integer

    @staticmethod
    def _list(read_item: Reader) -> Reader:
        def read_list(value: Any, where: Where, depth: int) -> Any:
            if type(value) is list:
                if depth > MAX_DEPTH:
                    raise BadRequest(f"{place(where)}: nested too deeply")
                below = depth + 1
                return [read_item(item, (where, i, _INDEX), below) for i, item in enumerate(value)]
            if value is None:
                return None
            raise _type_error(value, "a list", where)

        return read_list

    def _map(self, read_item: Reader) -> Reader:
        check, escapes = self._check_string, self.escapes

        def read_map(value: Any, where: Where, depth: int) -> Any:
            if type(value) is not _Pairs:
                if value is None:
                    return None
                raise _type_error(value, "an object", where)
            if depth > MAX_DEPTH:
                raise BadRequest(f"{place(where)}: nested too deeply")
            out: dict[str, Any] = {}
            below = depth + 1
            for key, item in value:
                if escapes:
                    check(key, where)
                if key in out:
                    raise BadRequest(f"{place(where)}: duplicate key {key!r}")
                out[key] = read_item(item, (where, key, _MAP_KEY), below)
            return out

        return read_map

    def _struct(self, name: str) -> Reader:
        known = self._structs.get(name)
        if known is not None:
            return known
        struct = STRUCTS[name]
        strict, forbidden = struct.strict, _FORBIDDEN_INDEX[name]
        # Go's folded field name -> (the field's name, its reader); filled below, after this reader
        # is registered, so that a struct may contain itself.
        fields: dict[str, tuple[str, Reader]] = {}
        # The same for keys spelled exactly as the field is: (field, its folded name, its reader,
        # the one type of value its reader returns unchanged, if any).
        as_spelled: dict[str, tuple[str, str, Reader, type | None]] = {}
        check, escapes, read_any = self._check_string, self.escapes, self.any

        def read_struct(value: Any, where: Where, depth: int) -> Any:
            if type(value) is not _Pairs:
                if value is None:
                    return None
                raise _type_error(value, f"a {name} object", where)
            if depth > MAX_DEPTH:
                raise BadRequest(f"{place(where)}: nested too deeply")
            out: dict[str, Any] = {}
            seen: dict[str, str] = {}
            below = depth + 1
            for key, item in value:
                spelled = as_spelled.get(key)
                if spelled is not None:  # the field's own spelling, as every client sends it
                    field, folded, read, passes = spelled
                    if folded in seen:
                        raise BadRequest(_duplicate(place(where), seen[folded], key))
                    seen[folded] = key
                    if item is None or type(item) is passes:
                        out[field] = item
                    else:
                        out[field] = read(item, (where, field, _FIELD), below)
                    continue
                if escapes:
                    check(key, where)
                if key.isascii():
                    folded = exact = key.upper()
                else:
                    folded, exact = fold(key), go_fold(key)
                if folded in seen:
                    raise BadRequest(_duplicate(place(where), seen[folded], key))
                seen[folded] = key
                found = fields.get(exact)
                if found is not None:
                    out[found[0]] = found[1](item, (where, found[0], _FIELD), below)
                    continue
                inner = (where, key, _FIELD)
                if exact in forbidden and (type(item) is list or type(item) is _Pairs or not is_empty(item)):
                    raise BadRequest(f"{place(inner)}: belongs inside HostConfig, not at the top level")
                if strict and not is_empty(item):
                    raise BadRequest(
                        f"{place(inner)}: unknown field in {name}; the gate refuses fields it cannot "
                        "check in settings that reach the host (devices, mounts, privileges, the kernel)"
                    )
                out[key] = read_any(item, inner, below)
            return out

        self._structs[name] = read_struct
        for field_name, kind in struct.fields.items():
            read = self.reader(kind)
            fields[go_fold(field_name)] = (field_name, read)
            as_spelled[field_name] = (field_name, fold(field_name), read, self._passes(kind))
        return read_struct

    def _passes(self, kind: FieldType) -> type | None:
        """The type of value that `kind`'s reader returns unchanged, unchecked (null aside)."""
        if isinstance(kind, Scalar):
            if kind.kind == "bool":
                return bool
            if kind.kind == "string" and not self.escapes:
                return str
            return None
        if isinstance(kind, AnyValue):
            return str if not self.escapes else bool
        return None

    def _any_reader(self) -> Reader:
        check, escapes = self._check_string, self.escapes

        def read_any(value: Any, where: Where, depth: int) -> Any:
            kind = type(value)
            if kind is str:
                if escapes:
                    check(value, where)
                return value
            if kind is _Pairs:
                # The shape is unknown here (struct or map), so treat fold variants as ambiguous too.
                out: dict[str, Any] = {}
                seen: dict[str, str] = {}
                for key, item in value:
                    if escapes:
                        check(key, where)
                    folded = fold(key)
                    if folded in seen:
                        raise BadRequest(_duplicate(place(where), seen[folded], key))
                    seen[folded] = key
                    out[key] = read_any(item, (where, key, _ANY_KEY), depth + 1)
                return out
            if kind is list:
                if depth > MAX_DEPTH:
                    raise BadRequest(f"{place(where)}: nested too deeply")
                return [read_any(item, (where, i, _INDEX), depth + 1) for i, item in enumerate(value)]
            return value

        return read_any


def _duplicate(where: str, first: str, second: str) -> str:
    place = f" in {where}" if where else ""
    if first == second:
        return f"duplicate key {second!r}{place}: the request is ambiguous"
    return f"keys {first!r} and {second!r}{place} name the same field: the request is ambiguous"


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def canonicalise(body: bytes, kind: FieldType) -> Any:
    """Decode `body` into the canonical value of `kind`: Go's field names, nothing ambiguous."""
    parsed = parse_json(body)
    readers = _READERS if _SURROGATE_ESCAPE.search(body) else _NO_ESCAPES
    try:
        return readers.reader(kind)(parsed, "", 0)
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None


_READERS = Readers()
_NO_ESCAPES = Readers(escapes=False)


# No cycle check: what is encoded is a tree the gate built itself from parsed JSON.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False)


def encode(value: Any) -> bytes:
    """Compact JSON that Go decodes to exactly `value`.

    orjson writes it in a tenth of the standard library's time; what orjson refuses (an integer
    beyond 64 bits, which only an untyped field can hold) goes to the standard library's encoder.
    orjson would write NaN and infinities as null, but a canonical tree holds none: the parser
    refuses them.
    """
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _ENCODER.encode(value).encode("utf-8")


def copied(value: Any) -> Any:
    """A deep copy of a canonical tree, made by orjson: `copy.deepcopy` took 40% of a create's
    decision (its memo and type dispatch, for dicts, lists and immutable leaves only). A tree orjson
    refuses (an integer beyond 64 bits) is copied by `copy.deepcopy`."""
    try:
        return orjson.loads(orjson.dumps(value))
    except orjson.JSONEncodeError:
        return copy.deepcopy(value)


def field_path(body: Mapping[str, Any] | None, *keys: str) -> Any:
    """`body[k1][k2]...`, or None as soon as a level is missing or null."""
    current: Any = body
    for key in keys:
        if not isinstance(current, dict):
            return None
        current = current.get(key)
    return current
