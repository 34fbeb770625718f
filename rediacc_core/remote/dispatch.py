"""Forwarding: a command whose target is an SSH machine runs on that machine, through `rdc-agent`.

This is the one place remote machines are handled for the commands: `rdc`'s entry point asks
`forward_if_remote` first, which finds the command's target machine the way click parses the line
(a MACHINE/NAME argument, or the `@machine` of a repo reference, as `rediacc_core.commands`
declares for each forwarded command). For an SSH machine the unchanged argument list goes to the
agent, and its output and exit code become this process's, so tables, `-o json|yaml`,
`Error:`/`What to do:` and exit codes are exactly the local ones.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rediacc_core import commands
from rediacc_core.config import Config
from rediacc_core.errors import (
    EXIT_GENERAL,
    EXIT_INTERRUPTED,
    AmbiguousError,
    NotFoundError,
    RdcError,
)
from rediacc_core.machine import Machine

if TYPE_CHECKING:
    import click

# How a command names its target: a machine argument, or a repo reference carrying `@machine`.
PARAMS: dict[commands.Target, tuple[str, ...]] = {"machine": ("machine_name", "name"), "ref": ("ref",)}


@dataclass(frozen=True)
class Target:
    """What a command line names: its command path, and its machine or repo reference."""

    path: tuple[str, ...]
    machine: str | None = None
    unplaced_ref: str | None = None  # a repo reference without `@machine`


def parse_target(argv: Sequence[str], root: click.Group) -> Target | None:
    """What `rdc ARGV` acts on, or None (a local command, help, or a line click will reject).

    `root` is the CLI's root group, handed in by the CLI: this package does not import it.
    """
    if any(arg in ("-h", "--help", "--version") for arg in argv):
        return None
    import click

    try:
        ctx = root.make_context("rdc", list(argv), resilient_parsing=True)
        command: click.Command = root
        path: list[str] = []
        while isinstance(command, click.Group):
            # Click keeps the subcommand's name apart from the rest (`_protected_args` from 8.2 on).
            held = vars(ctx).get("_protected_args", vars(ctx).get("protected_args", []))
            rest = [*held, *ctx.args]
            if not rest:
                return None
            _name, sub, rest = command.resolve_command(ctx, rest)
            if sub is None or sub.name is None:
                return None
            path.append(sub.name)
            ctx = sub.make_context(sub.name, rest, parent=ctx, resilient_parsing=True)
            command = sub
    except click.ClickException:
        return None
    kind = commands.FORWARDED.get(tuple(path))
    if kind is None:
        return None
    for param in PARAMS[kind]:
        value = ctx.params.get(param)
        if not isinstance(value, str):
            continue
        if kind == "machine":
            return Target(tuple(path), value)
        from rediacc_core.repos import RepoRef

        try:
            machine = RepoRef.parse(value).machine
        except RdcError:
            return None
        return Target(tuple(path), machine, None if machine else value)
    return None


def fast_target(argv: Sequence[str]) -> Target | None:
    """`parse_target` for the usual shape `rdc <command> <target> [options]`, without click.

    None when the line has another shape (options first, help, an unknown command): click decides.
    """
    if any(arg in ("-h", "--help", "--version") for arg in argv):
        return None
    for size in (3, 2):
        path = tuple(argv[:size])
        kind = commands.FORWARDED.get(path)
        if kind is not None and len(argv) > size and not argv[size].startswith("-"):
            value = argv[size]
            if kind == "machine":
                return Target(path, value)
            machine = value.rpartition("@")[2] if "@" in value else None
            return Target(path, machine or None, None if machine else value)
    return None


def command_target(argv: Sequence[str], root: click.Group) -> str | None:
    """The machine `rdc ARGV` names, or None."""
    target = parse_target(argv, root)
    return target.machine if target is not None else None


def forward_if_remote(
    argv: Sequence[str], confirm_delete: Callable[[str], bool], root: click.Group | None = None
) -> int | None:
    """Run `rdc ARGV` on its SSH machine and return the exit code; None when it runs here.

    The CLI hands in what forwarding needs of it: `confirm_delete` asks on this terminal before a
    `repo delete` (the machine has none to ask on), and `root`, its root group, lets click parse the
    line; without `root` only lines `fast_target` understands are looked at (the CLI not imported).
    """
    config = Config.load()
    if not any(entry.get("ssh") for entry in config.entries.values()):
        return None  # no SSH machine: nothing to forward, and no parse to pay for
    target = fast_target(argv) if root is None else parse_target(argv, root)
    if target is None:
        return None
    name = target.machine
    if target.unplaced_ref is not None:
        name = place_repo(config, target.unplaced_ref)
        if name is None:
            return None  # local, or nowhere: the command resolves it and reports
        argv = _with_machine(argv, target.unplaced_ref, name)
    if name is None or not config.has(name):
        return None  # the command reports the unknown machine itself
    machine = config.machine(name)
    if machine.remote is None:
        return None
    from rediacc_core.remote.agentcall import Stream, run_remote  # late: only forwarding needs ssh

    if target.path == ("repo", "docker-host") and _output_of(argv) in _FORMATS:
        # The machine's socket path means nothing here: hand out the local end of a tunnel to it.
        return _local_docker_host(config, machine, _ref_on(argv, name), _output_of(argv))
    if target.path == ("repo", "delete") and "--yes" not in argv and sys.stdin.isatty():
        # The machine side has no terminal to ask on: ask here, as the local command does.
        import click

        ref = _ref_on(argv, name)
        try:
            agreed = confirm_delete(ref)
        except click.Abort as exc:  # Ctrl-C or the end of input at the prompt
            interrupted = isinstance(exc.__cause__, KeyboardInterrupt)
            Stream(sys.stderr).write("Interrupted.\n" if interrupted else "Aborted.\n")
            return EXIT_INTERRUPTED if interrupted else EXIT_GENERAL
        if not agreed:
            Stream(sys.stderr).write("Aborted.\n")  # as the local command says it
            return EXIT_GENERAL
        argv = [*argv, "--yes"]
    if target.path == ("repo", "up") and "--foreground" not in argv and _output_of(argv) in _FORMATS:
        # Up there; DOCKER_HOST here is the local end of a tunnel to its gate.
        answer = Stream()
        code = run_remote(config, machine, [*argv, "-o", "json"], answer, Stream(sys.stderr))
        if code != 0:
            Stream(sys.stdout).write(answer.value())
            return code
        return _local_docker_host(config, machine, _ref_on(argv, name), _output_of(argv), up=True)
    code = run_remote(config, machine, argv, Stream(sys.stdout), Stream(sys.stderr))
    if target.path == ("repo", "delete") and code == 0:
        # Imported only here: a local command never pays for the tunnels.
        from rediacc_core.remote.tunnel import close_tunnels

        close_tunnels(config, name, _ref_on(argv, name))  # no tunnel outlives its repo
    return code


_FORMATS = ("table", "json", "yaml")


def _ref_on(argv: Sequence[str], machine: str) -> str:
    return next((a for a in argv if a.endswith(f"@{machine}")), machine)


def _output_of(argv: Sequence[str]) -> str:
    """The value of `-o/--output` on the line (the last one given), `table` without one."""
    fmt = "table"
    for i, arg in enumerate(argv):
        if arg in ("-o", "--output") and i + 1 < len(argv):
            fmt = argv[i + 1]
        elif arg.startswith("--output="):
            fmt = arg.partition("=")[2]
        elif arg.startswith("-o") and len(arg) > 2:
            fmt = arg[2:]
    return fmt


def _local_docker_host(config: Config, machine: Machine, ref: str, fmt: str, *, up: bool = False) -> int:
    """Print the DOCKER_HOST of `ref` here, a tunnel's socket, as `rdc repo docker-host` (or, with
    `up`, `rdc repo up`) prints it locally."""
    from rediacc_core.remote.agentcall import Stream, report  # late: only forwarding needs ssh
    from rediacc_core.remote.tunnel import open_tunnel

    try:
        opened = open_tunnel(config, machine, ref)
    except RdcError as exc:
        report(exc, Stream(sys.stderr))
        return exc.exit_code
    data = opened.to_json()
    if fmt == "json":
        Stream(sys.stdout).write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    elif fmt == "yaml":
        import yaml

        Stream(sys.stdout).write(yaml.safe_dump(data, sort_keys=False))
    elif not up:
        Stream(sys.stdout).write(opened.docker_host + "\n")
    if up:
        Stream(sys.stderr).write(
            f"Repo {data['repo']} is up. Use it with: export DOCKER_HOST={opened.docker_host} "
            f'(a local socket tunnelled to its gate; or eval "$(rdc repo env {data["repo"]})")\n'
        )
    return 0


def place_repo(config: Config, ref: str) -> str | None:
    """The SSH machine holding the repo `ref` names without `@machine`, when it is only there.

    Local machines are looked at here and SSH machines asked in parallel (`repo list -o json`); a
    machine that does not answer is left out. None when the repo is local or found nowhere (the
    command then resolves it as usual); ambiguous when several machines hold it.
    """
    remote = [m for m in config.machines() if m.remote is not None]
    if not remote:
        return None
    from rediacc_core.remote.agentcall import Stream, run_remote  # late: only forwarding needs ssh
    from rediacc_core.repos import RepoRef, RepoStore

    label = RepoRef.parse(ref).label
    holders = [m.name for m in config.machines() if m.remote is None and RepoStore(m).find(label) is not None]

    def holds(machine: Machine) -> bool | None:
        """Whether `machine` has the repo; None when it could not be asked."""
        out = Stream()
        if run_remote(config, machine, ["repo", "list", machine.name, "-o", "json"], out, Stream()) != 0:
            return None
        try:
            return any(r.get("ref", "").split("@")[0] == label for r in json.loads(out.value()))
        except (ValueError, AttributeError):
            return None

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
        answers = list(zip(remote, pool.map(holds, remote), strict=True))
    holders += [m.name for m, found in answers if found]
    silent = [m.name for m, found in answers if found is None]
    if len(holders) > 1:
        raise AmbiguousError(
            f"repo {label!r} exists on several machines: {', '.join(holders)}",
            f"name the machine, e.g. {label}@{holders[0]}",
        )
    if not holders and silent:
        raise NotFoundError(
            f"no repo {label!r} on the machines that answered; could not ask {', '.join(silent)}",
            f"name the machine ({label}@{silent[0]}) once it answers: `rdc machine list` shows which do",
        )
    if holders and config.machine(holders[0]).remote is not None:
        return holders[0]
    return None


def _with_machine(argv: Sequence[str], ref: str, machine: str) -> list[str]:
    """`argv` with the repo reference placed on `machine` (its first occurrence: the argument)."""
    placed = list(argv)
    placed[placed.index(ref)] = f"{ref}@{machine}"
    return placed
