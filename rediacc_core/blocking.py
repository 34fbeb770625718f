"""`may_block()`: the one call decision code makes before it waits for I/O.

The gate first tries a decision inline on its event loop, where waiting would stall every other
connection. Marked so (`decisions_must_not_block`), `may_block()` raises `MustNotBlock`, and the
gate starts the decision over in a worker thread, where waiting is fine. Rules, plugins and the
daemon lookups (image configs, a container's record) all call it; it lives on the ground floor so
that each can, whatever floor it is on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class MustNotBlock(BaseException):
    """Raised where a decision running on the gate's event loop would wait for I/O.

    A BaseException, so that rules which turn their own failures into refusals (`except
    Exception`) let it through: the gate catches it and runs the decision again in a worker.
    """


_inline = threading.local()


@contextmanager
def decisions_must_not_block() -> Iterator[None]:
    """Mark this thread as deciding inline: `may_block()` raises MustNotBlock until the end."""
    previous = getattr(_inline, "active", False)
    _inline.active = True
    try:
        yield
    finally:
        _inline.active = previous


def may_block() -> None:
    """Call before any blocking I/O in decision code (rules, plugins, the daemon lookups)."""
    if getattr(_inline, "active", False):
        raise MustNotBlock
