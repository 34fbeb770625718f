"""`rdc repo fork`: a real copy of a repo under a new identity, which starts without grants.

What is copied, from the source's state directory to the fork's: its files directory and its
daemon's data-root (images, volumes, containers, networks, build cache), with `cp -a --reflink=auto`
(a copy-on-write clone where the filesystem has one), and its pins index. Not copied: its logs and
audit trail (the fork's history starts empty) and its grants (they belong to the source's identity).

The daemon's records name absolute paths: containers their hosts/resolv.conf/log files and volumes
under the data-root and their binds under the repo's files directory or its pins; a bind-backed
volume its pinned device; containerd its bundles under the run directory. Every record that names
the source's state directory, pins or run directory is rewritten to the fork's own
(`runtime.dataroot`), and a pin is re-keyed to the fork's copy of what it held, so the fork's gate
pins the copy and a container or volume of the fork mounts only that. A record still naming the
source after that refuses the fork (nothing is kept). A path outside them all (a bind root the
operator shares) stays as it is and is checked again when the fork's gate restores its pins. A
container of the fork that holds a CDI device is refused at every start by the fork's gate and
runtime guard until the fork is granted that device.

The source must be down: a running daemon's data-root is not a consistent copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rediacc_core.errors import StateError, ToolError
from rediacc_core.files import atomic_write_text
from rediacc_core.gate.policy import pins
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, repo_state_dir
from rediacc_core.runtime import dataroot
from rediacc_core.runtime.layout import runtime_for

COPIED = ("files", "docker")  # under the repo's state directory


@dataclass(frozen=True)
class ForkCopy:
    """What a fork received, for the user."""

    copied: tuple[str, ...]
    containers: int


def rewrite(value: Any, moves: Mapping[str, str]) -> Any:
    """`value` (decoded JSON) with every string that is one of `moves`' keys, or lies below one,
    moved to that key's value. Whole path components only: `/a/b` moves `/a/b/c`, never `/a/bc`."""
    if isinstance(value, str):
        for old, new in moves.items():
            if value == old or value.startswith(old + "/"):
                return new + value[len(old) :]
        return value
    if isinstance(value, list):
        return [rewrite(item, moves) for item in value]
    if isinstance(value, dict):
        return {key: rewrite(item, moves) for key, item in value.items()}
    return value


def path_moves(machine: Machine, source: Repo, fork: Repo) -> dict[str, str]:
    return {
        str(repo_state_dir(machine, source.id)): str(repo_state_dir(machine, fork.id)),
        str(pins.directory_for(machine.run_dir, source.id)): str(
            pins.directory_for(machine.run_dir, fork.id)
        ),
        str(runtime_for(machine, source).run_dir): str(runtime_for(machine, fork).run_dir),
    }


def _write_json(path: Path, document: Any) -> None:
    # Root's alone, as dockerd writes its records (they name the repo's paths and its environment).
    atomic_write_text(path, json.dumps(document), mode=0o600)


def _copy_tree(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", str(source), str(target)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ToolError(
            f"cannot copy {source} to {target}: {done.stderr.strip()}",
            "free disk space (or fix what cp names), then delete the fork and fork again",
        )


def rekeyed_pins(index: Mapping[str, Any], moves: Mapping[str, str]) -> dict[str, str]:
    """Each pin's new staging name in the fork (old name -> new): a pin is named by the object it
    holds, and a copied file is a new object; a bind root the operator shares keeps its name."""
    renamed = {}
    for name, entry in index.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
            continue
        try:
            info = os.stat(rewrite(entry["source"], moves), follow_symlinks=False)
        except OSError:
            continue  # gone: the fork's gate finds nothing to restore, the bind nothing to mount
        renamed[name] = pins.pin_name(info, read_only=bool(entry.get("readOnly")))
    return renamed


def require_down(source: Repo, running: list[str]) -> None:
    """Refuse to copy `source` while any of it runs (`running`: `status.running_parts`)."""
    if running:
        raise StateError(
            f"repo {source.ref} is up ({', '.join(running)}): a running daemon's data cannot be copied whole",
            f"run `rdc repo down {source.ref}` first, fork it, then bring both up; or fork with --empty",
        )


def copy_repo(machine: Machine, source: Repo, fork: Repo) -> ForkCopy:
    """Copy `source`'s data into the freshly created `fork` (see the module docstring); the
    caller has checked `require_down`."""
    src_dir, dst_dir = repo_state_dir(machine, source.id), repo_state_dir(machine, fork.id)
    moves = path_moves(machine, source, fork)
    copied = []
    for name in COPIED:
        if (src_dir / name).exists():
            _copy_tree(src_dir / name, dst_dir / name)
            copied.append(name)
    index = src_dir / "pins.json"
    if index.exists():
        recorded = json.loads(index.read_text())
        renamed = rekeyed_pins(recorded, moves)
        src_pins, dst_pins = (pins.directory_for(machine.run_dir, r.id) for r in (source, fork))
        # The pins' own moves first: rewrite() takes the first that matches.
        moves = {**{str(src_pins / old): str(dst_pins / new) for old, new in renamed.items()}, **moves}
        _write_json(
            dst_dir / "pins.json", {renamed.get(n, n): rewrite(e, moves) for n, e in recorded.items()}
        )
    data_root = dst_dir / "docker"
    needles = dataroot.needles_of(moves)
    dataroot.rewrite_records(data_root, lambda value: rewrite(value, moves), needles)
    left = dataroot.leftovers(data_root, needles)
    if left:
        raise StateError(
            f"{', '.join(left[:5])} under {src_dir / 'docker'} name {source.ref}'s own paths in a form "
            "rdc cannot rewrite for a copy: through them the fork would reach the source's files",
            f"in {source.ref}, remove the containers, volumes or networks those records belong to and "
            f"fork again, or fork it empty: rdc repo fork {source.ref} --tag {fork.tag} --empty",
        )
    containers = sum(1 for d in (data_root / "containers").glob("*") if d.is_dir())
    return ForkCopy(tuple(copied), containers)
