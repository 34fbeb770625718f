"""Click groups of the `rdc` tree: subcommands imported only when used, and a hint for a command typed
one level too high (`rdc repo grant`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import click

# click's completion variable for the program `rdc`: set only while a shell asks for completions.
COMPLETE_VAR = "_RDC_COMPLETE"


def _nested(group: click.Group, ctx: click.Context, name: str, path: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for sub_name in group.list_commands(ctx):
        sub = group.get_command(ctx, sub_name)
        if isinstance(sub, click.Group):
            if sub.get_command(ctx, name) is not None:
                found.append(" ".join((*path, sub_name, name)))
            found += _nested(sub, ctx, name, (*path, sub_name))
    return found


class HintingGroup(click.Group):
    """A group whose subcommands may live in other modules, imported on first use.

    `lazy` maps a subcommand's name to where it is defined: `"module:attribute"` (the command object),
    or `"module"` alone for a module that attaches its commands to this group when imported. A read
    command then pays only for the modules it runs (`tests/test_cli_imports.py` holds each to its
    budget). An unknown command that exists in a subgroup is refused naming that command, not a
    lookalike.
    """

    def __init__(self, *args: object, lazy: Mapping[str, str] | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.load(cmd_name)
        return self.commands.get(cmd_name)

    def load(self, name: str) -> None:
        module_name, _, attribute = self.lazy[name].partition(":")
        module = importlib.import_module(module_name)
        if attribute:
            self.add_command(getattr(module, attribute), name)
        elif name not in self.commands:
            raise RuntimeError(f"importing {module_name} did not attach `{name}` to `{self.name}`")

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            places = _nested(self, ctx, name, (ctx.command_path,))
            if places:
                ctx.fail(f"No such command {name!r}. Did you mean `{places[0]}`?")
        return super().resolve_command(ctx, args)


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
