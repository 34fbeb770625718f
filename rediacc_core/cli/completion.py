"""`rdc completion bash|zsh|fish`, and what the shell completes: machines, repos and CDI names.

Which values a parameter completes is decided here, in one place, by the parameter's name, so the
commands need no completion code: `ref` arguments complete repo references, a machine's `name` (or
`machine_name`) completes machines, `--device` completes the CDI names defined on the repo's machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import click
from click.shell_completion import CompletionItem, get_completion_class

from rediacc_core.cli.groups import COMPLETE_VAR, walk
from rediacc_core.config import Config
from rediacc_core.errors import RdcError
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoRef, RepoStore, resolve_ref

SHELLS = ("bash", "zsh", "fish")

Completer = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]


def _items(values: Iterable[str], incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(value) for value in sorted(set(values)) if value.startswith(incomplete)]


def _machines() -> list[Machine]:
    """Machines to offer: SSH ones too, local ones only while their root exists."""
    try:
        return [m for m in Config.load().machines() if m.remote is not None or m.root.is_dir()]
    except RdcError:
        return []  # a broken config completes nothing; the command itself will say why


def _local(machines: list[Machine]) -> list[Machine]:
    # Completion must answer at once: what lives on SSH machines is not fetched for it.
    return [m for m in machines if m.remote is None]


def complete_machines(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    return _items((m.name for m in _machines()), incomplete)


def complete_repos(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    refs: list[str] = []
    for machine in _local(_machines()):
        try:
            refs += [repo.ref for repo in RepoStore(machine).list()]
        except RdcError:
            continue
    return _items(refs, incomplete)


def complete_new_repo(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`NAME@MACHINE` for `repo create`: once `@` is typed, the machines."""
    name, at, _ = incomplete.partition("@")
    if not at:
        return []
    return _items((f"{name}@{m.name}" for m in _machines()), incomplete)


def complete_devices(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    # While an option waits for its value, click leaves the arguments before it unparsed in ctx.args.
    ref = ctx.params.get("ref") or next((arg for arg in ctx.args if not arg.startswith("-")), None)
    try:
        config = Config.load()
        on = RepoRef.parse(ref).machine if isinstance(ref, str) else None
        if on is not None and config.machine(on, present=False).remote is not None:
            return []  # its specs are on the SSH machine: not fetched for a completion
        machines = [resolve_ref(ref, config)[0]] if isinstance(ref, str) else _machines()
    except RdcError:
        machines = _machines()
    from rediacc_core.cdi.registry import Registry  # CDI specs are parsed only to complete a name

    names: list[str] = []
    for machine in _local(machines):
        names += Registry.for_machine(machine).names()
    return _items(names, incomplete)


def _completer_for(path: tuple[str, ...], param: click.Parameter) -> Completer | None:
    if param.name == "ref":
        return complete_new_repo if path[-2:] == ("repo", "create") else complete_repos
    names_a_machine = param.name == "name" and path[:1] == ("machine",) and path[-1] != "add"
    if param.name == "machine_name" or names_a_machine:
        return complete_machines
    if param.name == "devices":
        return complete_devices
    return None


def attach_completers(root: click.Group) -> None:
    """Give every parameter of the core's command tree its completer (see the module docstring).

    Loads the whole tree: only a shell asking for completions pays for it.
    """
    ctx = click.Context(root, info_name="rdc")
    for path, command in walk(root, ctx):
        for param in command.params:
            completer = _completer_for(path, param)
            if completer is not None:
                # click's own hook for `shell_complete=`: set here so the commands stay free of it.
                param._custom_shell_complete = completer


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the script that makes SHELL complete rdc's commands, machines, repos and CDI names.

    \b
    Examples:
      eval "$(rdc completion bash)"                       # in ~/.bashrc
      eval "$(rdc completion zsh)"                        # in ~/.zshrc
      rdc completion fish > ~/.config/fish/completions/rdc.fish
    """
    root = click.get_current_context().find_root().command
    script = get_completion_class(shell)
    assert script is not None  # every choice is one of click's shells
    click.echo(script(root, {}, "rdc", COMPLETE_VAR).source())
