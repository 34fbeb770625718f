"""Where each `rdc` command runs when it names an SSH machine: here, or forwarded to the machine.

The one declaration of it, pure data: the launcher forwards from it before click or any command is
imported (`rediacc_core.remote.dispatch.fast_target`), and `tests/test_placement.py` holds every
command of the click tree in `rediacc_core.cli` to it (each classified, each forwarded one with the
parameter its target is read from).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# How a forwarded command names its machine, in its first argument: the machine itself
# (`MACHINE`/`NAME`), or a repo reference that may carry `@machine` (`REF`).
Target = Literal["machine", "ref"]


@dataclass(frozen=True)
class Placement:
    target: Target | None  # None: the command runs here, on this host's config, whatever it names
    read_only: bool = False  # on the machine it stops once its client is gone (no one reads it)


LOCAL = Placement(None)
# Asked of this rdc, never of a machine: no config to read for them.
LOCAL_ONLY = frozenset({"--version", "--help", "-h"})
ON_MACHINE = Placement("machine")
ON_REF = Placement("ref")
READ_MACHINE = Placement("machine", read_only=True)
READ_REF = Placement("ref", read_only=True)

COMMANDS: dict[tuple[str, ...], Placement] = {
    ("completion",): LOCAL,
    ("demo",): LOCAL,
    ("plugins",): LOCAL,
    # This host's config, or connections of their own (host keys, installs, tunnels).
    ("machine", "add"): LOCAL,
    ("machine", "list"): LOCAL,
    ("machine", "remove"): LOCAL,
    ("machine", "trust"): LOCAL,
    ("machine", "install"): LOCAL,
    ("repo", "env"): LOCAL,
    ("repo", "tunnel"): LOCAL,
    ("machine", "setup"): ON_MACHINE,
    ("machine", "refresh"): ON_MACHINE,
    ("machine", "config"): ON_MACHINE,
    ("machine", "gpu", "list"): READ_MACHINE,
    ("machine", "gpu", "prune"): ON_MACHINE,
    ("machine", "gpu", "clear"): ON_MACHINE,
    ("repo", "list"): READ_MACHINE,
    ("repo", "create"): ON_REF,
    ("repo", "delete"): ON_REF,
    ("repo", "fork"): ON_REF,
    ("repo", "gpu", "grant"): ON_REF,
    ("repo", "gpu", "revoke"): ON_REF,
    ("repo", "gpu", "renew"): ON_REF,
    ("repo", "gpu", "confirm"): ON_REF,
    ("repo", "gpu", "list"): READ_REF,
    ("repo", "check"): READ_REF,  # decides offline, on the machine whose grants it reads
    ("repo", "up"): ON_REF,
    ("repo", "down"): ON_REF,
    ("repo", "units"): ON_REF,  # --install writes unit files
    ("repo", "gate", "run"): ON_REF,
    ("repo", "gate", "log"): READ_REF,
    ("repo", "dockerd"): ON_REF,
    ("repo", "docker-host"): READ_REF,
    # Slurm's side runs on the node itself (slurmd's hooks, its CLIs), or on a directory-rooted
    # machine; they are not forwarded to an SSH machine (README: "not over SSH").
    ("slurm", "prolog"): LOCAL,
    ("slurm", "epilog"): LOCAL,
    ("slurm", "reconcile"): LOCAL,
    ("slurm", "health"): LOCAL,
    ("slurm", "bridge"): LOCAL,
    # A box's own files, which external mode's bridge reaches over SSH too: its map, its repos'
    # lists, and its part of each round (the bridge, on the operator's host, runs it on each box).
    ("slurm", "gres"): ON_MACHINE,
    ("slurm", "bridge-step"): ON_MACHINE,
    ("repo", "slurm", "allow"): ON_REF,
    ("repo", "slurm", "deny"): ON_REF,
    ("repo", "slurm", "show"): READ_REF,
    ("repo", "gpu", "request"): LOCAL,
    ("repo", "gpu", "release"): LOCAL,
    ("repo", "gpu", "leases"): LOCAL,
}

# The forwarded commands and how each names its target: what `fast_target` reads.
FORWARDED: dict[tuple[str, ...], Target] = {
    path: p.target for path, p in COMMANDS.items() if p.target is not None
}
READ_ONLY = frozenset(path for path, p in COMMANDS.items() if p.read_only)
_DEPTH = max(len(path) for path in COMMANDS)


def only_reads(argv: Sequence[str]) -> bool:
    """Whether `rdc ARGV` runs a read-only command, told from its leading words: no group of the
    tree takes an option before its subcommand but help, which runs nothing."""
    return any(tuple(argv[:size]) in READ_ONLY for size in range(1, _DEPTH + 1))
