"""The command reference, `docs/commands.md`, written from each command's record in
`rediacc_core.commands` and its click definition.

    python -m rediacc_core.cli.reference > docs/commands.md

`tests/test_commands.py` fails while the committed page differs from what this writes. The options a
plugin adds (`rdc machine setup`'s) depend on what is installed and are left out; `--help` shows them.
"""

from __future__ import annotations

import click

from rediacc_core.cli import cli
from rediacc_core.cli.groups import first_sentence, load
from rediacc_core.commands import TABLE, Command, Placement

WIDTH = 100

# The line each placement gets: where the command runs when what it names is on an SSH machine.
_RUNS = {
    Placement(None): "here, on this host's config (never forwarded)",
    Placement("machine"): "on the machine it names (over SSH for an SSH machine)",
    Placement("ref"): "on the machine of the repo it names (over SSH for an SSH machine)",
    Placement("machine", read_only=True): "on the machine it names (over SSH for an SSH machine); "
    "a read, stopped there when its client goes",
    Placement("ref", read_only=True): "on the machine of the repo it names (over SSH for an SSH "
    "machine); a read, stopped there when its client goes",
}


def _section(record: Command, ctx: click.Context) -> str:
    command = load(record)
    formatter = click.HelpFormatter(width=WIDTH, max_width=WIDTH)
    # The command's own parameters, without what plugins add when it is parsed.
    params = [p for p in click.Command.get_params(command, ctx) if not getattr(p, "hidden", False)]
    pieces = ["[OPTIONS]"] + [
        piece for p in params if isinstance(p, click.Argument) for piece in p.get_usage_pieces(ctx)
    ]
    if isinstance(command, click.Group):
        pieces.append("COMMAND [ARGS]...")
    formatter.write_usage(" ".join(("rdc", *record.path)), " ".join(pieces))
    command.format_help_text(ctx, formatter)
    options = [row for p in params if isinstance(p, click.Option) and (row := p.get_help_record(ctx))]
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)
    lines = [f"## `rdc {' '.join(record.path)}`", ""]
    if record.placement is not None:
        lines += [f"Runs {_RUNS[record.placement]}.", ""]
    else:
        subcommands = [c for c in TABLE if c.path[:-1] == record.path and not c.hidden]
        lines += ["Commands: " + ", ".join(f"`{c.path[-1]}`" for c in subcommands) + ".", ""]
    return "\n".join([*lines, "```text", formatter.getvalue().rstrip(), "```", ""])


def render() -> str:
    """The whole page: an index of every command, then each one's help."""
    ctx = click.Context(
        cli, info_name="rdc", max_content_width=WIDTH, terminal_width=WIDTH, **cli.context_settings
    )
    shown = [r for r in TABLE if not r.hidden]
    index = ["| command | runs | what it does |", "|---|---|---|"]
    for record in shown:
        runs = "group" if record.placement is None else _where(record.placement)
        name = " ".join(record.path)
        index.append(f"| [`rdc {name}`](#{_anchor(name)}) | {runs} | {first_sentence(record.summary)} |")
    head = [
        "# The `rdc` commands",
        "",
        "Written by `python -m rediacc_core.cli.reference > docs/commands.md` from each command's record",
        "in `rediacc_core/commands.py` (its one-line help and where it runs) and its click definition; do",
        "not edit by hand. `rdc COMMAND --help` shows the same, with the options installed plugins add.",
        "",
        "*here*: on this host, whatever machine it names; *machine*: forwarded to the SSH machine it",
        "names; *read*: forwarded, and stopped there once its client goes.",
        "",
    ]
    return "\n".join([*head, *index, "", *(_section(r, ctx) for r in shown)])


def _where(placement: Placement) -> str:
    if placement.target is None:
        return "here"
    return "machine, read" if placement.read_only else "machine"


def _anchor(name: str) -> str:
    """GitHub's anchor for the heading `rdc NAME` (in backticks)."""
    return "rdc-" + name.replace(" ", "-")


if __name__ == "__main__":
    click.echo(render(), nl=False)
