"""Every `rdc …` command that an error or a refusal advises, as the test suites produce them, and
whether the CLI parser accepts it.

`record()` wraps `RdcError` and `Refusal` so each one made during the session keeps its text;
`test_advised_commands.py` (run last) reads the commands out of them and parses each with click, so
advice that names a command, an option or an argument the CLI does not take fails the suite.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from typing import Any

import click

from rediacc_core.errors import RdcError
from rediacc_core.model import Refusal

ADVICE: set[str] = set()

# A command ends at punctuation that closes the sentence around it or opens a remark, or at a line's end.
_COMMAND = re.compile(r"(?<![\w/.-])rdc ((?:[^;,()`'\"\n])+)")
# Prose that may follow a command in a sentence ("run rdc machine setup M first").
_PROSE = frozenset({"first", "again", "then", "and", "or", "to", "instead", "now", "there", "here", "after"})
_PLACEHOLDER = re.compile(r"<[^>]*>")


def record() -> None:
    """Keep the text of every RdcError and Refusal made from now on (idempotent)."""
    if getattr(RdcError.__init__, "recording", False):
        return

    def wrap(init: Callable[..., None], texts: Callable[[Any], list[str | None]]) -> Callable[..., None]:
        def recording(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            ADVICE.update(t for t in texts(self) if t and "rdc " in t)

        recording.recording = True  # type: ignore[attr-defined]
        return recording

    RdcError.__init__ = wrap(RdcError.__init__, lambda e: [e.what, e.todo])  # type: ignore[method-assign]
    Refusal.__init__ = wrap(Refusal.__init__, lambda r: [r.message, r.replacement])  # type: ignore[method-assign]


def advised(text: str, commands: Sequence[str]) -> list[list[str]]:
    """The `rdc` command lines in `text`, without `rdc` and without prose after them; `<name>`
    placeholders of a template stand as a plain word. A sentence about rdc ("rdc cannot rewrite")
    is no command: its first word is none of `commands` (the top-level ones) nor close to one."""
    found = []
    for match in _COMMAND.finditer(_PLACEHOLDER.sub("x", text)):
        words = match.group(1).split()
        if "|" in words:  # piped on to another program
            words = words[: words.index("|")]
        while words and words[-1] in _PROSE:
            words.pop()
        words = [w.rstrip(".:") for w in words]
        if words and (words[0] in commands or difflib.get_close_matches(words[0], commands, cutoff=0.8)):
            found.append(words)
    return found


def parse_error(argv: list[str], root: click.Group) -> str | None:
    """Why click refuses `rdc ARGV` (a command, option or argument it does not take), or None."""
    try:
        ctx = root.make_context("rdc", list(argv))
        command: click.Command = root
        while isinstance(command, click.Group):
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            name, sub, rest = command.resolve_command(ctx, rest)
            assert name is not None and sub is not None
            ctx = sub.make_context(name, rest, parent=ctx)
            command = sub
    except click.ClickException as exc:
        return exc.format_message()
    return None
