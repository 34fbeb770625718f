"""Click groups of the `rdc` tree, built from the one declaration of every command
(`rediacc_core.commands`): subcommands imported only when used, listed from their one-line help
without importing them, and a hint for a command typed one level too high (`rdc repo grant`)."""

from __future__ import annotations

import importlib
import inspect

import click

from rediacc_core.commands import BY_PATH, Command, children

# click's completion variable for the program `rdc`: set only while a shell asks for completions.
COMPLETE_VAR = "_RDC_COMPLETE"
# Every record's `code` names a module of this package (rediacc_core.cli) and an attribute of it.
_PACKAGE = __name__.rpartition(".")[0]


def _nested(group: click.Group, ctx: click.Context, name: str, path: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for sub_name in group.list_commands(ctx):
        sub = group.get_command(ctx, sub_name)
        if isinstance(sub, click.Group):
            if sub.get_command(ctx, name) is not None:
                found.append(" ".join((*path, sub_name, name)))
            found += _nested(sub, ctx, name, (*path, sub_name))
    return found


def load(record: Command) -> click.Command:
    """The click object `record` declares, its help led by the record's one-line summary."""
    module_name, _, attribute = f"{_PACKAGE}.{record.code}".partition(":")
    command = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(command, click.Command):
        raise RuntimeError(f"{record.code} is not a click command (rediacc_core/commands.py)")
    if not (command.help or "").startswith(record.summary):  # the module's text follows it
        rest = inspect.cleandoc(command.help) if command.help else ""
        command.help = record.summary + (f"\n\n{rest}" if rest else "")
    command.name, command.hidden = record.path[-1], record.hidden  # the record's, whatever the module says
    return command


class HintingGroup(click.Group):
    """A group whose subcommands are the records under its path in `rediacc_core.commands`, each
    imported on first use. A read command then pays only for the modules it runs
    (`tests/test_cli_imports.py` holds each to its budget), and a listing (`rdc --help`, `rdc repo
    --help`) imports none. An unknown command that exists in a subgroup is refused naming that
    command, not a lookalike.
    """

    path: tuple[str, ...] = ()  # the root's; a subgroup's is set by the group that loads it

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *children(self.path)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            record = BY_PATH.get((*self.path, cmd_name))
            if record is None:
                return None
            command = load(record)
            if isinstance(command, HintingGroup):
                command.path = record.path
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The subcommands and their one-line help, from their records: none is imported."""
        rows = [(name, c.summary) for name, c in sorted(children(self.path).items()) if not c.hidden]
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, first_sentence(text, limit)) for name, text in rows])

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            places = _nested(self, ctx, name, (ctx.command_path,))
            if places:
                ctx.fail(f"No such command {name!r}. Did you mean `{places[0]}`?")
        return super().resolve_command(ctx, args)


def first_sentence(text: str, limit: int = 0) -> str:
    """As click shortens a command's help in a listing: its first sentence, cut at a word to fit
    `limit` characters (0: whole)."""
    words = text.split()
    for i, word in enumerate(words):
        if word.endswith(".") and (i == len(words) - 1 or not words[i + 1][0].islower()):
            words = words[: i + 1]
            break
    sentence = " ".join(words)
    if not limit or len(sentence) <= limit:
        return sentence
    return sentence[: max(limit - 2, 0)].rsplit(" ", 1)[0] + "..."


def walk(
    group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command below `group` with its path, loading lazy ones: for completion and tests."""
    found: list[tuple[tuple[str, ...], click.Command]] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None:
            continue
        found.append(((*path, name), command))
        if isinstance(command, click.Group):
            found += walk(command, ctx, (*path, name))
    return found
