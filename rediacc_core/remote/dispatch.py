"""Forwarding: a command whose target is an SSH machine runs on that machine, through `rdc-agent`.

This is the one place remote machines are handled for the commands: `rdc`'s entry point asks
`forward_if_remote` first, which finds the command's target machine the way click parses the line
(a MACHINE/NAME argument, or the `@machine` of a repo reference, as `rediacc_core.placement`
declares for each forwarded command). For an SSH machine the unchanged argument list goes to the
agent, and its output and exit code become this process's, so tables, `-o json|yaml`,
`Error:`/`What to do:` and exit codes are exactly the local ones.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from rediacc_core import placement
from rediacc_core.config import Config
from rediacc_core.errors import (
    EXIT_GENERAL,
    EXIT_INTERRUPTED,
    EXIT_TOOL,
    AmbiguousError,
    RdcError,
    StateError,
)
from rediacc_core.machine import Machine
from rediacc_core.remote import link, protocol
from rediacc_core.remote.address import DEFAULT_PREFIX
from rediacc_core.remote.ssh import SshMachine, classify, key_unknown, no_ssh_client, stderr_file

if TYPE_CHECKING:
    import click

# How a command names its target: a machine argument, or a repo reference carrying `@machine`.
PARAMS: dict[placement.Target, tuple[str, ...]] = {"machine": ("machine_name", "name"), "ref": ("ref",)}


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
    kind = placement.FORWARDED.get(tuple(path))
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
        kind = placement.FORWARDED.get(path)
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
    from rediacc_core.repos import RepoRef, RepoStore

    label = RepoRef.parse(ref).label
    holders = [m.name for m in config.machines() if m.remote is None and RepoStore(m).find(label) is not None]

    def holds(machine: Machine) -> bool:
        out = Stream()
        if run_remote(config, machine, ["repo", "list", machine.name, "-o", "json"], out, Stream()) != 0:
            return False
        try:
            return any(r.get("ref", "").split("@")[0] == label for r in json.loads(out.value()))
        except (ValueError, AttributeError):
            return False

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
        holders += [m.name for m, found in zip(remote, pool.map(holds, remote), strict=True) if found]
    if len(holders) > 1:
        raise AmbiguousError(
            f"repo {label!r} exists on several machines: {', '.join(holders)}",
            f"name the machine, e.g. {label}@{holders[0]}",
        )
    if holders and config.machine(holders[0]).remote is not None:
        return holders[0]
    return None


def _with_machine(argv: Sequence[str], ref: str, machine: str) -> list[str]:
    """`argv` with the repo reference placed on `machine` (its first occurrence: the argument)."""
    placed = list(argv)
    placed[placed.index(ref)] = f"{ref}@{machine}"
    return placed


# --- running on the agent -------------------------------------------------------------------------


class Stream:
    """Where the agent's chunks of one kind go."""

    def __init__(self, target: IO[str] | None = None) -> None:
        self.target = target
        self.text: list[str] = []

    def write(self, chunk: str) -> None:
        if self.target is None:
            self.text.append(chunk)
        else:
            self.target.write(chunk)
            self.target.flush()

    def value(self) -> str:
        return "".join(self.text)


def ssh_machine(config: Config, machine: Machine) -> SshMachine:
    assert machine.remote is not None
    return SshMachine(machine.name, machine.remote, config.known_hosts)


def agent_path(machine: Machine) -> str:
    """`rdc-agent` of the venv `rdc machine install` makes: /opt/rediacc, under a simulated root."""
    return os.path.join(str(machine.root), DEFAULT_PREFIX.lstrip("/"), "bin", "rdc-agent")


@dataclass
class AgentCall:
    """One exchange with the agent: the request and what came back."""

    machine: Machine
    ssh: SshMachine
    request: dict[str, Any]
    on_message: Callable[[dict[str, Any]], None] = field(default=lambda _m: None)
    exit: int | None = None
    skew: dict[str, Any] | None = None
    versions: dict[str, str] | None = None
    received: int = 0

    resident: str | None = None  # where the machine's resident agent listens, when it says so

    def run(self, out: Stream, err: Stream) -> int:
        if not self.ssh.trusted_keys():
            raise key_unknown(self.ssh)
        root, idle = str(self.machine.root), link.idle_seconds()
        if idle and self.request.get("op") == "run":
            if link.exchange(self.ssh, root, self.request, lambda line: self._take(line, out, err)):
                return self._outcome(0, "", through="the resident agent's connection")
            self.exit, self.skew, self.received = None, None, 0  # nothing ran: the one-shot way
            self.request = {**self.request, "resident": {"idle": idle}}
        code = self._exec(out, err)
        if self.resident is not None:
            link.forward(self.ssh, root, self.resident)  # the next command goes straight there
        return code

    def _exec(self, out: Stream, err: Stream) -> int:
        if shutil.which("ssh") is None:
            raise no_ssh_client()
        argv = self.ssh.argv("exec " + shlex.quote(agent_path(self.machine)))
        with stderr_file() as errfile:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile)
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(protocol.encode(self.request))
                proc.stdin.close()
            except OSError:
                pass  # ssh is gone already: its exit status and stderr say why
            try:
                for line in proc.stdout:
                    self._take(line, out, err)
            finally:
                proc.stdout.close()
                returncode = proc.wait()
            errfile.seek(0)
            ssh_stderr = errfile.read().decode(errors="replace")
        return self._outcome(returncode, ssh_stderr)

    def _take(self, line: bytes, out: Stream, err: Stream) -> dict[str, Any] | None:
        try:
            message = protocol.decode(line)
        except protocol.ProtocolError as exc:
            err.write(f"{exc}\n")  # something on the machine printed plain text: show it
            return None
        self.received += 1
        if "out" in message:
            out.write(str(message["out"]))
        elif "err" in message:
            err.write(str(message["err"]))
        elif "exit" in message and isinstance(message["exit"], int):
            self.exit = message["exit"]
        elif "skew" in message:
            self.skew = dict(message["skew"])
        elif "versions" in message:
            self.versions = dict(message["versions"])
        elif "resident" in message and isinstance(message["resident"], str):
            self.resident = message["resident"]
        return message

    def _outcome(self, returncode: int, ssh_stderr: str, through: str = "") -> int:
        name = self.machine.name
        if self.skew is not None:
            client = self.request.get("versions") or protocol.versions()
            raise StateError(
                f"machine {name} runs other rediacc versions than this client: "
                f"{protocol.skew_text(client, self.skew) or 'protocol ' + str(self.skew.get('protocol'))}",
                f"install this client's versions on it: rdc machine install {name}",
            )
        if self.exit is not None:
            return self.exit
        if returncode == 255 and self.received == 0 and _never_connected(ssh_stderr):
            raise classify(self.ssh, returncode, ssh_stderr)  # ssh's own failure, said as what it is
        if returncode == 127 and self.received == 0:  # the machine's shell found no agent to exec
            raise StateError(
                f"rdc is not installed on machine {name} (no {agent_path(self.machine)} there)",
                f"install it: rdc machine install {name}",
            )
        if through:
            detail = f"{through} closed"
        elif ssh_stderr.strip():
            detail = ssh_stderr.strip().splitlines()[-1]
        else:
            detail = f"ssh exited with {returncode}"
        raise RdcError(
            f"the connection to machine {name} ended before the command finished ({detail})",
            "the machine made the whole change or none of it (its writes are atomic, under its lock): "
            "look with a listing such as `rdc repo list " + name + "`, then rerun the command if needed",
            exit_code=EXIT_TOOL,
        )


def _never_connected(stderr: str) -> bool:
    """ssh's own words for a session that never started (any other exit 255 lost a running one)."""
    words = (
        "Connection refused",
        "Connection timed out",
        "Could not resolve",
        "not accessible",
        "No route to host",
        "Network is unreachable",
        "Permission denied",
        "Too many authentication failures",
        "host key",
        "Host key",
        "HOST IDENTIFICATION",
        "banner exchange",
        "kex_exchange_identification",
    )
    return any(word in stderr for word in words)


def run_remote(config: Config, machine: Machine, argv: Sequence[str], out: Stream, err: Stream) -> int:
    """Forward `rdc ARGV` to MACHINE's agent; its output goes to `out`/`err`, errors to `err` too."""
    request = protocol.request(
        "run",
        machine=machine.name,
        root=str(machine.root),
        argv=list(argv),
        columns=shutil.get_terminal_size().columns,
        tty=err.target is not None and err.target.isatty(),  # progress of long steps, as locally
        versions=protocol.versions(),
    )
    try:
        return AgentCall(machine, ssh_machine(config, machine), request).run(out, err)
    except RdcError as exc:
        report(exc, err)
        return exc.exit_code


def report(exc: RdcError, err: Stream) -> None:
    """The two-line `Error:` / `What to do:` report, as the CLI prints it."""
    err.write(f"Error: {exc.what}\n" + (f"What to do: {exc.todo}\n" if exc.todo else ""))


def machine_versions(config: Config, machine: Machine) -> dict[str, str]:
    """The rediacc versions installed on MACHINE (raises when the agent is missing or unreachable)."""
    call = AgentCall(machine, ssh_machine(config, machine), protocol.request("versions"))
    err = Stream()
    call.run(Stream(), err)
    if call.versions is None:
        raise StateError(f"machine {machine.name} did not say its versions: {err.value().strip()}")
    return call.versions
