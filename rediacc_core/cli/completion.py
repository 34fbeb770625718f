"""`rdc completion bash|zsh|fish`, and what the shell completes: machines, repos and CDI names.

Which values a parameter completes is declared with its command (`completes` in
`rediacc_core.commands`), so the commands need no completion code: a repo reference completes repo
references, a machine's name completes machines, `--device` the CDI names defined on the repo's
machine (or, to revoke, those granted to the repo); each kind's completer is here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import click
from click.shell_completion import (
    BashComplete,
    CompletionItem,
    add_completion_class,
    get_completion_class,
    split_arg_string,
)

from rediacc_core.cli.groups import COMPLETE_VAR, walk
from rediacc_core.commands import BY_PATH, Completes
from rediacc_core.config import Config
from rediacc_core.errors import RdcError
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoRef, RepoStore, resolve_ref

SHELLS = ("bash", "zsh", "fish")
# bash's default: readline ends a word at each of these, so `alpha@box` and `vendor/gpu=0` reach a
# completion function in pieces.
_BASH_BREAKS = " \t\n\"'@><=;|&(:"


class _Bash(BashComplete):
    """bash completion that sees the whole word being typed.

    bash splits the command line at its COMP_WORDBREAKS (`@`, `=`, `:` among them), so click's own
    script would complete `alpha@` as a new empty word and stop at the `=` of a CDI name. This script
    also hands over the line up to the cursor and the break characters: the word is read whole from
    the line, and each answer loses what readline keeps before the word's last break character.
    """

    source_template = BashComplete.source_template.replace(
        "COMP_CWORD=$COMP_CWORD ",
        'COMP_CWORD=$COMP_CWORD RDC_COMP_LINE="${COMP_LINE:0:$COMP_POINT}" '
        'RDC_COMP_BREAKS="${COMP_WORDBREAKS}" ',
    )

    def get_completion_args(self) -> tuple[list[str], str]:
        line = os.environ.get("RDC_COMP_LINE")
        if not line:  # a caller that sets only COMP_WORDS (as click's own script does)
            return super().get_completion_args()
        words = split_arg_string(line)
        if line[-1].isspace() or not words:
            return words[1:], ""
        return words[1:-1], words[-1]

    def format_completion(self, item: CompletionItem) -> str:
        kept = self._kept_by_readline()
        value = str(item.value)
        if kept and value.startswith(kept):
            value = value[len(kept) :]
        return f"{item.type},{value}"

    def _kept_by_readline(self) -> str:
        """The part of the word being typed that readline leaves in place (up to its last break)."""
        line = os.environ.get("RDC_COMP_LINE")
        if not line or line[-1].isspace():
            return ""
        word = split_arg_string(line)[-1]
        breaks = os.environ.get("RDC_COMP_BREAKS", _BASH_BREAKS)
        cut = max((word.rfind(char) for char in breaks if not char.isspace()), default=-1)
        return word[: cut + 1]


add_completion_class(_Bash, "bash")

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


def complete_granted(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The CDI names granted to the repo (for `revoke`, `renew`, `confirm`), read from its machine."""
    ref = ctx.params.get("ref") or next((arg for arg in ctx.args if not arg.startswith("-")), None)
    if not isinstance(ref, str):
        return []
    try:
        config = Config.load()
        on = RepoRef.parse(ref).machine
        if on is not None and config.machine(on, present=False).remote is not None:
            return []  # its grants are on the SSH machine: not fetched for a completion
        machine, repo = resolve_ref(ref, config)
        from rediacc_core.grants.records import read_grants

        return _items((g.device for g in read_grants(machine) if g.repo_id == repo.id), incomplete)
    except RdcError:
        return []


def complete_held_back(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """For `machine gpu clear --device`: the bus ids of the cards held back for their health."""
    name = ctx.params.get("name") or next((arg for arg in ctx.args if not arg.startswith("-")), None)
    if not isinstance(name, str):
        return []
    try:
        machine = Config.load().machine(name)
        if machine.remote is not None:
            return []  # its records are on the SSH machine: not fetched for a completion
        from rediacc_core.health import read_health, unhealthy_cards

        return _items(unhealthy_cards(read_health(machine)), incomplete)
    except RdcError:
        return []


def complete_setting_keys(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """`KEY=` for `machine config --set` (`KEY` for `--unset`); after `=`, the values a setting names."""
    from rediacc_core.settings import SETTINGS

    key, eq, _ = incomplete.partition("=")
    if param.name == "unset":
        return _items(SETTINGS, incomplete)
    if not eq:
        return _items((f"{name}=" for name in SETTINGS), incomplete)
    setting = SETTINGS.get(key)
    return _items((f"{key}={choice}" for choice in setting.choices), incomplete) if setting else []


# What each kind a command's record names (`completes` in `rediacc_core.commands`) completes with.
COMPLETERS: dict[Completes, Completer] = {
    "machine": complete_machines,
    "repo": complete_repos,
    "new-repo": complete_new_repo,
    "device": complete_devices,
    "granted": complete_granted,
    "held-back": complete_held_back,
    "setting": complete_setting_keys,
}


def attach_completers(root: click.Group) -> None:
    """Give every parameter of the core's command tree its completer (see the module docstring).

    Loads the whole tree: only a shell asking for completions pays for it.
    """
    ctx = click.Context(root, info_name="rdc")
    for path, command in walk(root, ctx):
        completes = BY_PATH[path].completes
        for param in command.params:
            if param.name in completes:
                completer = COMPLETERS[completes[param.name]]
                # click's own hook for `shell_complete=`: set here so the commands stay free of it.
                param._custom_shell_complete = completer


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """\b
    Examples:
      eval "$(rdc completion bash)"                       # in ~/.bashrc
      eval "$(rdc completion zsh)"                        # in ~/.zshrc
      rdc completion fish > ~/.config/fish/completions/rdc.fish
    """
    root = click.get_current_context().find_root().command
    script = get_completion_class(shell)
    assert script is not None  # every choice is one of click's shells
    click.echo(script(root, {}, "rdc", COMPLETE_VAR).source())
