"""A click group that points a command typed one level too high at where it lives (`rdc repo grant`)."""

from __future__ import annotations

import click


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
    """An unknown command that exists in a subgroup is refused naming that command, not a lookalike."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            places = _nested(self, ctx, name, (ctx.command_path,))
            if places:
                ctx.fail(f"No such command {name!r}. Did you mean `{places[0]}`?")
        return super().resolve_command(ctx, args)
