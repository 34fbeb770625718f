"""The call to `rdc-agent` on an SSH machine: one command line sent, its output streamed back as
protocol lines, its exit code returned (`run_remote`); what a failure to connect means (`AgentCall`),
and the versions installed there. Forwarding (`dispatch`) and tunnels (`tunnel`) both use it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rediacc_core.config import Config
from rediacc_core.errors import (
    EXIT_TOOL,
    RdcError,
    StateError,
)
from rediacc_core.machine import Machine
from rediacc_core.remote import link, protocol
from rediacc_core.remote.address import DEFAULT_PREFIX
from rediacc_core.remote.ssh import SshMachine, classify, key_unknown, no_ssh_client, stderr_file


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
