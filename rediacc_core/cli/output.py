"""How commands print: data to stdout (table, JSON or YAML), prose to stderr.

Every listing takes `-o table|json|yaml`. JSON and YAML print the data itself, so scripts never
parse tables; tables are aligned plain text for people.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO, TypeVar

import click
import yaml

FORMATS = ("table", "json", "yaml")

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
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip("\n")


def emit(data: Any, fmt: str, table_fn: Callable[[Any], str]) -> None:
    """Print `data` to stdout in `fmt`; `table_fn` renders the table form."""
    if fmt == "json":
        text = to_json(data)
    elif fmt == "yaml":
        text = to_yaml(data)
    else:
        text = table_fn(data)
    if text:
        click.echo(text)


def note(message: str) -> None:
    """Prose for the person at the terminal, kept out of the data on stdout."""
    click.echo(message, err=True)


@contextmanager
def waiting(what: str, stream: TextIO | None = None, interval: float = 1.0) -> Iterator[None]:
    """Say what a command waits for: one line off a terminal; on one, with the seconds waited so far."""
    out = stream if stream is not None else sys.stderr
    if not out.isatty():
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


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """Columns aligned with two spaces between them; None prints as `-`; no trailing blanks."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = []
    for row in [list(headers), *cells]:
        padded = [value.ljust(widths[i]) for i, value in enumerate(row)]
        lines.append((indent + "  ".join(padded)).rstrip())
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
