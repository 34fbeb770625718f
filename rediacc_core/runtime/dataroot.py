"""What a repo daemon's data-root holds, for a fork: records that name host paths, and tenant content.

Records are what dockerd and its containerd write about the objects a tenant made: containers'
config files, volumes' options (`volumes/<name>/opts.json`, which the local driver mounts from, and
`volumes/metadata.db`), networks, containerd's and BuildKit's bolt databases. Any of them may name a
path of the source repo (its state directory, pins or run directory): `rewrite_records` moves every
such path to the fork's own, in JSON files, and in bolt databases value by value (a bolt file is
written again whole, which also drops what its free pages still held of deleted records).

Content is what a tenant put in: layers, volume data, container logs, image configs (addressed by
their digest, so never edited). Its bytes are the tenant's and are not read.

`leftovers` lists the records that still name a source path after the rewrite: a fork refuses to
keep such a copy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from rediacc_core.files import atomic_write_text
from rediacc_core.runtime import boltdb

Rewrite = Callable[[Any], Any]  # decoded JSON -> the same with the source's paths moved


def is_content(relative: PurePosixPath) -> bool:
    """Whether a path under the data-root holds a tenant's bytes rather than a daemon's record."""
    parts = relative.parts
    if not parts or parts[0] == "tmp":  # build contexts and uploads in flight
        return True
    if parts[0] == "overlay2" and len(parts) > 2 and parts[2] in ("diff", "merged", "work"):
        return True
    if parts[0] == "volumes" and len(parts) > 2 and parts[2] == "_data":
        return True
    if parts[0] == "containers" and ("local-logs" in parts or "-json.log" in parts[-1]):
        return True
    if parts[0] == "image" and ("content" in parts or parts[-1] == "tar-split.json.gz"):
        return True
    if "blobs" in parts:  # containerd's and BuildKit's content stores
        return True
    snapshots = [i for i, part in enumerate(parts) if part == "snapshots"]
    return any(len(parts) > i + 2 and parts[i + 2] == "fs" for i in snapshots)


def records(data_root: Path) -> Iterator[Path]:
    """Every regular file and symlink of the data-root that is not tenant content."""
    for top, dirs, files in os.walk(data_root):
        here = Path(top)
        dirs[:] = [d for d in dirs if not is_content(PurePosixPath((here / d).relative_to(data_root)))]
        for name in files:
            path = here / name
            if not is_content(PurePosixPath(path.relative_to(data_root))):
                yield path
        yield from (here / d for d in dirs if (here / d).is_symlink())


def _names(path: Path, needles: tuple[bytes, ...]) -> bool:
    if path.is_symlink():
        return any(n in os.fsencode(os.readlink(path)) for n in needles)
    if not path.is_file():
        return False
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return any(n in data for n in needles)


def _rewrite_value(value: bytes, rewrite: Rewrite, needles: tuple[bytes, ...]) -> bytes:
    """One bolt value: JSON is rewritten as JSON, a bare path as a path; anything else is kept (and
    `leftovers` reports it when it still names the source)."""
    if not any(n in value for n in needles):
        return value
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return value
    try:
        document = json.loads(text)
    except ValueError:
        moved = rewrite(text)
        return moved.encode() if isinstance(moved, str) else value
    return json.dumps(rewrite(document), separators=(",", ":"), ensure_ascii=False).encode()


def _rewrite_bucket(bucket: boltdb.Bucket, rewrite: Rewrite, needles: tuple[bytes, ...]) -> None:
    for key, value in bucket.items.items():
        if isinstance(value, boltdb.Bucket):
            _rewrite_bucket(value, rewrite, needles)
        else:
            bucket.items[key] = _rewrite_value(value, rewrite, needles)


def _is_bolt(path: Path) -> bool:
    with open(path, "rb") as file:
        head = file.read(20)
    return len(head) == 20 and head[16:20] == (0xED0CDAED).to_bytes(4, "little")


def rewrite_records(data_root: Path, rewrite: Rewrite, needles: tuple[bytes, ...]) -> None:
    """Rewrite every record under `data_root` that names one of `needles` (see the docstring)."""
    for path in list(records(data_root)):
        if path.is_symlink() or not _names(path, needles):
            continue
        if _is_bolt(path):
            database = boltdb.read(path)
            _rewrite_bucket(database.root, rewrite, needles)
            boltdb.write(path, database)
            continue
        try:
            document = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue  # not a format rdc can rewrite: `leftovers` names it
        # Root's alone, as dockerd writes its records (they name the repo's paths and its environment).
        atomic_write_text(path, json.dumps(rewrite(document)), mode=0o600)


def leftovers(data_root: Path, needles: tuple[bytes, ...]) -> list[str]:
    """The records under `data_root` (relative paths) that still name one of `needles`."""
    return sorted(str(p.relative_to(data_root)) for p in records(data_root) if _names(p, needles))


def needles_of(moves: Mapping[str, str]) -> tuple[bytes, ...]:
    return tuple(os.fsencode(old) for old in moves)
