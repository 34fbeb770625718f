"""Files that must never be half-written: atomic replace, JSON checked against a shipped schema, and
state files read live (re-parsed only when they changed)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Generic, TypeVar

from rediacc_core.errors import ValidationError

T = TypeVar("T")

# (st_dev, st_ino, st_mtime_ns, st_size): writes replace a file (new inode) and move mtime forward, so
# an unchanged key means an unchanged file.
StatKey = tuple[int, int, int, int]


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never a mix.

    Temp file in the same directory, fsync, rename, then fsync the directory so the rename survives
    a crash.
    """
    import tempfile  # late: only a write needs it, and `rdc`'s reads write nothing

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: Path, document: Any) -> None:
    atomic_write_text(path, json.dumps(document, indent=2, sort_keys=False) + "\n")


def replace_watched_json(path: Path, document: Any) -> None:
    """`atomic_write_json` for a file a `LiveFile` watches: the new file always gets a new StatKey.

    A freed inode can be reused by the next file and a coarse clock can repeat an mtime, so the mtime
    is kept strictly increasing.
    """
    try:
        before: os.stat_result | None = path.stat()
    except FileNotFoundError:
        before = None
    atomic_write_json(path, document)
    if before is not None:
        after = path.stat()
        if after.st_mtime_ns <= before.st_mtime_ns:
            os.utime(path, ns=(after.st_atime_ns, before.st_mtime_ns + 1))


@cache
def schema_text(name: str) -> str:
    """The text of a JSON Schema shipped in `rediacc_core/schema/`: read beside this module, as every
    read checks its state files' marks against it (importlib.resources costs a read a tenth of its
    start, in tempfile, shutil and the compressors it loads)."""
    return (Path(__file__).parent / "schema" / name).read_text(encoding="utf-8")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A JSON Schema shipped in `rediacc_core/schema/`."""
    schema: dict[str, Any] = json.loads(schema_text(name))
    return schema


# A state file whose exact text has passed its schema carries this extended attribute: the digest of
# the schema and the text. Reads (every `rdc` command, the gate on each change) then skip jsonschema,
# which costs a CLI read most of its time; an edited file or a new schema has another digest and is
# validated again. Only who may write the file may set it; where the filesystem keeps no user
# attributes, every read validates.
VALID_XATTR = "user.rediacc.schema-valid"


def _valid_token(text: str, schema_name: str) -> bytes:
    digest = hashlib.sha256(schema_text(schema_name).encode())
    digest.update(b"\0")
    digest.update(text.encode())
    return digest.hexdigest().encode()


def _validated_before(path: Path, token: bytes) -> bool:
    try:
        return os.getxattr(path, VALID_XATTR) == token
    except OSError:
        return False


def _mark_validated(path: Path, token: bytes) -> None:
    with contextlib.suppress(OSError):  # read-only, another owner, no user xattrs: validate next time
        os.setxattr(path, VALID_XATTR, token)


def schema_errors(document: Any, schema_name: str) -> list[str]:
    """Every way `document` breaks the schema, each as `at <json path>: <message>`."""
    import jsonschema  # here, not at the top: a command forwarded to an SSH machine never needs it

    validator = jsonschema.Draft202012Validator(load_schema(schema_name))
    return [
        f"at {err.json_path}: {err.message}"
        for err in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    ]


def restore_hint(path: Path) -> str:
    return f"restore {path} from backup or fix it by hand; nothing was changed"


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def read_text_keyed(path: Path, what: str) -> tuple[StatKey, str] | None:
    """A state file's identity and text, both from the same open file; None when there is no file.

    A missing file is legitimate (nothing was ever recorded); unreadable or non-UTF-8 is an error.
    """
    try:
        with path.open("rb") as handle:
            key = stat_key(os.fstat(handle.fileno()))
            raw = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValidationError(
            f"cannot read {what} {path}: {exc.strerror}",
            f"check the permissions of {path} and its directory; nothing was changed",
        ) from exc
    try:
        return key, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{what} {path} is not UTF-8 text ({exc.reason})", restore_hint(path)) from exc


def file_schema_errors(document: Any, text: str, path: Path, schema_name: str) -> list[str]:
    """`schema_errors` of `document`, parsed from `text` as read from `path`: none without running
    jsonschema when that exact text passed this schema before (see VALID_XATTR)."""
    token = _valid_token(text, schema_name)
    if _validated_before(path, token):
        return []
    problems = schema_errors(document, schema_name)
    if not problems:
        _mark_validated(path, token)
    return problems


def parse_json_checked(text: str, path: Path, schema_name: str, what: str) -> Any:
    """A state file's text as JSON that matches its schema; any problem is an error naming the file."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            restore_hint(path),
        ) from exc
    problems = file_schema_errors(document, text, path, schema_name)
    if problems:
        raise ValidationError(
            f"{what} {path} does not match its schema: " + "; ".join(problems[:5]), restore_hint(path)
        )
    return document


def read_json_checked(path: Path, schema_name: str, what: str) -> Any:
    """Read and validate a state file; any problem is an error naming the file, never 'empty'."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(
            f"cannot read {what} {path}: {exc.strerror}",
            f"check the file's permissions, or restore {path} from backup",
        ) from exc
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{what} {path} is not UTF-8 text ({exc.reason})", restore_hint(path)) from exc
    return parse_json_checked(text, path, schema_name, what)


class LiveFile(Generic[T]):
    """A value parsed from one state file, re-parsed only when the file's StatKey changed.

    One `stat` is all an unchanged file costs, so a gate may call `get()` for every request. `load`
    returns the file's key and value read from one open file, or None when the file is gone; `empty`
    is the value of a missing file. A load error is remembered for that version of the file and
    raised again until the file changes: a broken file is never taken as 'empty'. Thread-safe.
    """

    def __init__(self, path: Path, load: Callable[[], tuple[StatKey, T] | None], empty: T, what: str) -> None:
        self.path = path
        self._load = load
        self._empty = empty
        self._what = what
        self._key: StatKey | None = None
        self._value: T = empty
        self._error: ValidationError | None = None
        self._lock = threading.Lock()
        self.reads = 0  # how many times the file was parsed (tests check it is not re-read needlessly)

    @property
    def cache_key(self) -> StatKey | None:
        return self._key

    def get(self) -> T:
        with self._lock:
            return self._refresh()

    def _refresh(self) -> T:
        try:
            key = stat_key(os.stat(self.path))
        except FileNotFoundError:
            self._key, self._value, self._error = None, self._empty, None
            return self._empty
        except OSError as exc:
            raise ValidationError(
                f"cannot read {self._what} {self.path}: {exc.strerror}",
                f"check the permissions of {self.path} and its directory",
            ) from exc
        if key != self._key:
            self.reads += 1
            try:
                found = self._load()
            except ValidationError as exc:
                self._key, self._value, self._error = key, self._empty, exc
                raise
            if found is None:  # removed between stat and open
                self._key, self._value, self._error = None, self._empty, None
            else:
                self._key, self._value, self._error = found[0], found[1], None
        if self._error is not None:
            raise self._error
        return self._value
