"""A simulated machine for `rdc demo`: the main job end to end, with no GPU needed.

The core knows no hardware, so the GPUs come from plugins: each may register a callable under the
entry-point group `rediacc.demo` that lays its hardware out on the fake machine
(`callable(fake_machine: FakeMachine) -> None`). With none registered the demo machine simply has
no GPUs, which setup handles like any other machine.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from rediacc_core.errors import StateError
from rediacc_core.testing.fakemachine import FakeMachine

ENTRY_POINT_GROUP = "rediacc.demo"
DEMO_MACHINE = "demo"
# Marks a root as the demo's own, so rebuilding it can never wipe a directory someone else made.
MARKER = ".rdc-demo"


@dataclass
class DemoMachine:
    fake: FakeMachine
    layouts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def is_demo_root(root: Path) -> bool:
    return (root / MARKER).exists()


def build_demo_machine(workdir: Path, name: str = DEMO_MACHINE) -> DemoMachine:
    """A fresh fake machine under `workdir/root`, stand-in tools in `workdir/bin`."""
    root, bin_dir = workdir / "root", workdir / "bin"
    for directory in (root, bin_dir):
        if directory.exists() and any(directory.iterdir()):
            if not is_demo_root(root):
                raise StateError(
                    f"{directory} exists and was not made by `rdc demo`",
                    "choose an empty or new --workdir",
                )
            shutil.rmtree(directory)
    fake = FakeMachine(root.absolute(), bin_dir.absolute(), name=name)
    (root / MARKER).write_text("made by `rdc demo`; safe to delete\n", encoding="utf-8")
    demo = DemoMachine(fake)
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            ep.load()(fake)
        except Exception as exc:  # one plugin's broken layout must not spoil the others'
            demo.problems.append(f"layout {ep.name!r} failed: {type(exc).__name__}: {exc}")
            continue
        demo.layouts.append(ep.name)
    return demo
