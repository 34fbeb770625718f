"""Checks shared by the suites of the gate's state machines (the framers, the exchange): each keeps
its transitions in tables, shows them in its module docstring, and its cases must take every one.

`recording` swaps a module's tables for ones that note each transition looked up, so a case's
transitions can be compared with the ones it should take; `docstring_rows` reads a table back from
the docstring, so the prose is tested equal to the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import ModuleType
from unittest.mock import patch

Transition = tuple[str, str, str]
Table = dict[str, dict[str, str]]


class Recording:
    """A transition table that notes each transition looked up in it."""

    def __init__(self, table: Table, taken: list[Transition]) -> None:
        self.table = table
        self.taken = taken

    def __getitem__(self, state: str) -> RecordingMoves:
        return RecordingMoves(state, self.table[state], self.taken)


@dataclass
class RecordingMoves:
    state: str
    moves: dict[str, str]
    taken: list[Transition]

    def __getitem__(self, event: str) -> str:
        after = self.moves[event]
        self.taken.append((self.state, event, after))
        return after


@contextmanager
def recording(module: ModuleType, *tables: str) -> Iterator[list[Transition]]:
    """Within it, the named tables of `module` note the transitions taken, in order, into the list."""
    taken: list[Transition] = []
    with ExitStack() as stack:
        for name in tables:
            stack.enter_context(patch.object(module, name, Recording(getattr(module, name), taken)))
        yield taken


def table_rows(table: Table) -> Iterator[Transition]:
    for state, moves in table.items():
        for event, after in moves.items():
            yield (state, event, after)


def docstring_rows(module: ModuleType, title: str) -> list[Transition]:
    """The table drawn under `title` in the module's docstring, as rows `state --event--> after`."""
    doc = module.__doc__ or ""
    section = doc.split(title, 1)[1].split("\n\n", 2)[1]  # the indented block after the title
    rows = [re.fullmatch(r"\s+(\S+)\s+--(\S+?)-*>\s+(\S+)", line) for line in section.splitlines()]
    assert all(rows), section
    return [(m.group(1), m.group(2), m.group(3)) for m in rows if m]
