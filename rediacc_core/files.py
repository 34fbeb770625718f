"""Files that must never be half-written: atomic replace, and JSON checked against a shipped schema."""

from __future__ import annotations

import json
import os
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from rediacc_core.errors import ValidationError


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never a mix.

    Temp file in the same directory, fsync, rename, then fsync the directory so the rename survives
    a crash.
    """
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


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A JSON Schema shipped in `rediacc_core/schema/`."""
    text = resources.files("rediacc_core").joinpath("schema", name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_errors(document: Any, schema_name: str) -> list[str]:
    """Every way `document` breaks the schema, each as `at <json path>: <message>`."""
    validator = jsonschema.Draft202012Validator(load_schema(schema_name))
    return [
        f"at {err.json_path}: {err.message}"
        for err in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    ]


def read_json_checked(path: Path, schema_name: str, what: str) -> Any:
    """Read and validate a state file; any problem is an error naming the file, never 'empty'."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValidationError(
            f"cannot read {what} {path}: {exc.strerror}",
            f"check the file's permissions, or restore {path} from backup",
        ) from exc
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            f"restore {path} from backup or fix it by hand; nothing was changed",
        ) from exc
    problems = schema_errors(document, schema_name)
    if problems:
        raise ValidationError(
            f"{what} {path} does not match its schema: " + "; ".join(problems[:5]),
            f"restore {path} from backup or fix it by hand; nothing was changed",
        )
    return document
