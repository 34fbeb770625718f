"""The entry points of one group, with each one's distribution and version, read as the standard
library's `importlib.metadata.entry_points(group=...)` reads them, without importing it.

`rdc --version` lists the plugins by their metadata, and `importlib.metadata` (with the email
parser, zipfile, csv and inspect it loads) costs that command more than half of what Python itself
takes to start. The metadata directories on `sys.path` are plain files, so this reads them directly,
in the same order and with the same rules: every `*.dist-info` and `*.egg-info` entry of each
`sys.path` directory (an `.egg` directory's `EGG-INFO` too), the first distribution of each
normalized name winning, its `entry_points.txt` sections and its METADATA (or PKG-INFO) `Name` and
`Version` headers. Anything this reading does not cover (a zip file on `sys.path`, a finder of
distributions other than the standard one, a header folded over lines, a file it cannot parse) is
handed to `importlib.metadata` itself, so the answer is always the one it gives
(`tests/test_entrypoints.py` compares the two).
"""

from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple


class EntryPoint(NamedTuple):
    """One entry point of a group, and the distribution that declares it (None: unknown)."""

    name: str
    value: str
    distribution: str | None
    version: str | None


class _Unreadable(Exception):
    """A layout this reading does not cover: `importlib.metadata` answers instead."""


# A header line as the email parser recognises one (printable ASCII but ":" up to a colon).
_HEADER = re.compile(r"[\041-\071\073-\176]*:")
_INFO_SUFFIXES = (".dist-info", ".egg-info")


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of `group` in the order `importlib.metadata.entry_points(group=group)` gives."""
    try:
        return _scan(group)
    except _Unreadable:
        return from_metadata(group)


def from_metadata(group: str) -> list[EntryPoint]:
    """The same list, from `importlib.metadata` itself."""
    from importlib import metadata  # late: only where the direct reading does not cover the layout

    return [
        EntryPoint(
            ep.name,
            ep.value,
            ep.dist.name if ep.dist is not None else None,
            ep.dist.version if ep.dist is not None else None,
        )
        for ep in metadata.entry_points(group=group)
    ]


def _normalize(name: str) -> str:
    """A distribution's name as `importlib.metadata` compares them (PEP 503, dashes as underscores)."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _scan(group: str) -> list[EntryPoint]:
    finders = [f for f in sys.meta_path if getattr(f, "find_distributions", None) is not None]
    if len(finders) != 1 or getattr(finders[0], "__name__", "") != "PathFinder":
        raise _Unreadable("a finder of distributions other than the standard one")
    seen: set[str] = set()
    found: list[EntryPoint] = []
    for entry in sys.path:
        for path in _info_paths(entry):
            stem = os.path.basename(path)
            base, ext = os.path.splitext(stem)
            headers: dict[str, str | None] | None = None
            normalized = _normalize(base.partition("-")[0]) if ext in _INFO_SUFFIXES else ""
            if not normalized:  # an `.egg`'s EGG-INFO, a suffix in other case: named by its metadata
                headers = _headers(path)
                if headers["name"] is None:
                    raise _Unreadable(f"{path} names no distribution")
                normalized = _normalize(headers["name"])
            if normalized in seen:
                continue
            seen.add(normalized)
            points = _group_of(_read(os.path.join(path, "entry_points.txt")), group)
            if points:
                headers = headers or _headers(path)
                found += [EntryPoint(n, v, headers["name"], headers["version"]) for n, v in points]
    return found


def _info_paths(entry: str) -> list[str]:
    """The metadata directories of one `sys.path` entry, in `importlib.metadata`'s order: every
    `*.dist-info`/`*.egg-info` by the first appearance of its normalized name, then an egg's."""
    try:
        children = os.listdir(entry or ".")
    except NotADirectoryError:
        raise _Unreadable(f"{entry} on sys.path is a file (a zip)") from None
    except OSError:
        return []
    egg = os.path.basename(entry).lower().endswith(".egg")
    infos: dict[str, list[str]] = {}
    eggs: list[str] = []
    for child in children:
        low = child.lower()
        if low.endswith(_INFO_SUFFIXES):
            name = _normalize(low.rpartition(".")[0].partition("-")[0])
            infos.setdefault(name, []).append(os.path.join(entry, child))
        elif egg and low == "egg-info":
            eggs.append(os.path.join(entry, child))
    return [path for paths in infos.values() for path in paths] + eggs


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        return None


def _group_of(text: str | None, group: str) -> list[tuple[str, str]]:
    """The `name = value` pairs of `group` in an entry_points.txt."""
    pairs: list[tuple[str, str]] = []
    section = None
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        if section is None:
            continue
        name, equals, value = line.partition("=")
        if not equals:
            raise _Unreadable(f"an entry point line without '=': {line!r}")
        if section == group:
            pairs.append((name.strip(), value.strip()))
    return pairs


def _headers(path: str) -> dict[str, str | None]:
    """The `Name` and `Version` of the distribution at `path`: the first of each among the leading
    headers of METADATA, else PKG-INFO, else the file itself (an old egg-info file)."""
    text = _read(os.path.join(path, "METADATA")) or _read(os.path.join(path, "PKG-INFO")) or _read(path) or ""
    found: dict[str, str | None] = {"name": None, "version": None}
    last = ""
    for line in text.split("\n"):
        if line in ("", "\r"):
            break
        if line[0] in " \t":
            if last in found:
                raise _Unreadable(f"a folded {last} header in {path}")
            continue
        if not _HEADER.match(line):
            break
        key, _, value = line.partition(":")
        last = key.lower()
        if last in found and found[last] is None:
            found[last] = value.lstrip(" \t").rstrip("\r\n")
    return found
