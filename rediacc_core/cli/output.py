"""How commands print: data to stdout (table, JSON or YAML), prose to stderr.

Every listing takes `-o table|wide|json|yaml`. JSON and YAML print the data itself, so scripts never
parse tables; tables are aligned plain text for people. On a terminal a table is fitted to its
width, wrapping the widest cells; `wide` never wraps (and off a terminal nothing is wrapped).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

FORMATS = ("table", "wide", "json", "yaml")
_MIN_COLUMN = 8  # narrower than this a wrapped column is unreadable: the table overflows instead
_SHORT_COLUMN = 16  # columns this narrow are wrapped only when the long ones cannot give more
# What a person copies from a table into a command must stay whole: CDI device names, PCI
# addresses, ids and times. A column is never narrower than the longest of them it holds; other
# columns give way.
_WHOLE = re.compile(
    r"[a-z0-9][a-z0-9.-]*/[A-Za-z0-9_.-]+=[^\s,]+"  # vendor.example/class=name
    r"|\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b"  # PCI domain:bus:device.function
    r"|\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b"  # a UUID (a repo's id)
    r"|\b\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d)?Z"  # an rdc UTC time
)
_width: ContextVar[int | None] = ContextVar("table_width", default=None)

F = TypeVar("F", bound=Callable[..., Any])


def output_option(*formats: str) -> Callable[[F], F]:
    """The `-o/--output` option; its value reaches the command as `fmt`."""
    choices = formats or FORMATS
    return click.option(
        "-o",
        "--output",
        "fmt",
        type=click.Choice(choices),
        default="table",
        show_default=True,
        help="How to print the result.",
    )


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def to_yaml(data: Any) -> str:
    import yaml  # here: only `-o yaml` needs it

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip("\n")


@contextmanager
def fitted(fmt: str) -> Iterator[None]:
    """Tables made inside fit the terminal stdout is (unless `fmt` is `wide`, or it is no terminal)."""
    width = None
    if fmt == "table" and sys.stdout.isatty():
        import shutil  # late: a read that prints to no terminal never loads it

        width = shutil.get_terminal_size().columns
    token = _width.set(width)
    try:
        yield
    finally:
        _width.reset(token)


def fitted_width() -> int | None:
    """The width tables are fitted to here (inside `fitted` on a terminal), or None: unbounded."""
    return _width.get()


def emit(data: Any, fmt: str, table_fn: Callable[[Any], str]) -> None:
    """Print `data` to stdout in `fmt`; `table_fn` renders the table form (and `wide`)."""
    if fmt == "json":
        text = to_json(data)
    elif fmt == "yaml":
        text = to_yaml(data)
    else:
        with fitted(fmt):
            text = table_fn(data)
    if text:
        click.echo(text)


def runnable_rdc() -> str:
    """How to run this rdc from the user's shell: `rdc` when PATH finds this one, else its full
    path (after `tox -e demo`, rdc lives in the env's bin, which is on PATH only while tox runs)."""
    import shutil  # late: only advice that names rdc needs it

    here = Path(sys.executable).parent / "rdc"
    found = shutil.which("rdc")
    # Under tox the env's bin is on PATH only while tox runs: the user's shell will not find it.
    in_tox = bool(os.environ.get("TOX_ENV_DIR"))
    if found is not None and not in_tox and (not here.exists() or Path(found).resolve() == here.resolve()):
        return "rdc"
    return shlex.quote(str(here)) if here.exists() else f"{shlex.quote(sys.executable)} -m rediacc_core.cli"


def rdc_as_typed() -> str:
    """`rdc` as a "Next:" line must say it to run as printed from the user's shell: this rdc, and the
    client config when $REDIACC_CONFIG names one (else the next command would not find the machine).
    For a client elsewhere (an SSH machine's agent) plain `rdc`: the client runs its own."""
    from rediacc_core.config import CONFIG_ENV, default_path, serving_client

    if serving_client():
        return "rdc"
    prefix = f"REDIACC_CONFIG={shlex.quote(str(default_path()))} " if os.environ.get(CONFIG_ENV) else ""
    return f"{prefix}{runnable_rdc()}"


def note(message: str) -> None:
    """Prose for the person at the terminal, kept out of the data on stdout."""
    click.echo(message, err=True)


@contextmanager
def waiting(
    what: str, stream: TextIO | None = None, interval: float = 1.0, *, only_terminal: bool = False
) -> Iterator[None]:
    """Say what a command waits for: one line off a terminal (none with `only_terminal`); on one,
    with the seconds waited so far."""
    out = stream if stream is not None else sys.stderr
    if not out.isatty():
        if not only_terminal:
            out.write(f"{what} …\n")
            out.flush()
        yield
        return
    started = time.monotonic()
    stop = threading.Event()

    def tick() -> None:
        while True:
            out.write(f"\r{what} … {time.monotonic() - started:.0f}s")
            out.flush()
            if stop.wait(interval):
                return

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        out.write(f"\r{what} … waited {time.monotonic() - started:.0f}s\n")
        out.flush()


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "", width: int | None = None
) -> str:
    """Columns aligned with two spaces between them; None prints as `-`; no trailing blanks.

    Wider than `width` (default: the terminal's, inside `fitted`), the widest columns are narrowed
    and their cells wrapped onto more lines.
    """
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    limit = width if width is not None else _width.get()
    if limit is not None:
        whole = [_kept_whole([headers[i], *(row[i] for row in cells)]) for i in range(len(widths))]
        widths = _narrowed(widths, limit - len(indent) - 2 * (len(widths) - 1), whole)
    lines = []
    for row in [list(headers), *cells]:
        wrapped = [_wrap(value, widths[i]) for i, value in enumerate(row)]
        for n in range(max(len(parts) for parts in wrapped)):
            padded = [
                (parts[n] if n < len(parts) else "").ljust(widths[i]) for i, parts in enumerate(wrapped)
            ]
            lines.append((indent + "  ".join(padded)).rstrip())
    return "\n".join(lines)


def _kept_whole(column: Sequence[str]) -> int:
    """How narrow a column may get: its longest CDI name or PCI address, and its longest short word
    (a version, a size, a header), so that wrapping happens only between words of longer text."""
    names = max((len(m) for value in column for m in _WHOLE.findall(value)), default=0)
    words = max((len(w) for value in column for w in value.split() if len(w) <= _SHORT_COLUMN), default=0)
    return max(names, words)


def _narrowed(widths: list[int], room: int, whole: Sequence[int]) -> list[int]:
    """Narrow the widest columns first; short columns (ids, numbers) keep their width while the
    long ones can still give way, nothing goes below `_MIN_COLUMN`, and no column below the longest
    name it must keep whole (`whole[i]`): then the table overflows instead."""
    widths = list(widths)
    for floor in (_SHORT_COLUMN, _MIN_COLUMN):
        while sum(widths) > room:
            can_give = [i for i in range(len(widths)) if widths[i] > max(floor, whole[i])]
            if not can_give:
                break
            widest = max(can_give, key=lambda i: widths[i])
            widths[widest] -= 1
    return widths


def _wrap(value: str, width: int) -> list[str]:
    if len(value) <= width:
        return [value]
    # Lists wrap after their commas; a long name (a UUID, a path) is cut where it must be.
    import textwrap  # late: only a cell too wide for its terminal needs it

    return textwrap.wrap(value, width, break_on_hyphens=False) or [value]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


class TerminalProgress:
    """A step list on stderr; slow steps get a spinner, and only when stderr is a terminal."""

    FRAMES = "|/-\\"

    def __init__(self, stream: TextIO | None = None, interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.tty = self.stream.isatty()
        self.title = ""
        self._stop = threading.Event()
        self._spinner: threading.Thread | None = None
        self._started = 0.0

    def start(self, title: str, slow: bool = False) -> None:
        self.title = title
        self._started = time.monotonic()
        if not self.tty:
            self.stream.write(f"- {title}\n")
            self.stream.flush()
            return
        self.stream.write(f"  {title} …")
        self.stream.flush()
        if slow:
            self._stop.clear()
            self._spinner = threading.Thread(target=self._spin, daemon=True)
            self._spinner.start()

    def _spin(self) -> None:
        frame = 0
        while not self._stop.wait(self.interval):
            self.stream.write(f"\r{self.FRAMES[frame % len(self.FRAMES)]} {self.title} … {self._elapsed()}")
            self.stream.flush()
            frame += 1

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self._started:.0f}s"

    def finish(self, ok: bool) -> None:
        took = ""
        if self._spinner is not None:
            self._stop.set()
            self._spinner.join()
            self._spinner = None
            took = f" ({self._elapsed()})"  # slow steps say how long they took
        if self.tty:
            self.stream.write(f"\r{'✓' if ok else '✗'} {self.title}{took}  \n")
            self.stream.flush()
