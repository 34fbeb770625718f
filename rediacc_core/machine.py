"""A machine: where its filesystem root is and how commands run on it.

Every path the project reads or writes on a machine goes through `Machine.path`, so a machine whose
root is a directory (a simulated machine, a test) behaves exactly like `/`. Commands go through a
`Transport`. A machine reached over SSH (`remote` set) has no paths here: the CLI forwards the
whole command to the agent on it (`rediacc_core.remote`), which works on it as a local machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from rediacc_core.errors import StateError
from rediacc_core.remote.address import SshAddress

Platform = Literal["native", "wsl"]

# Where a machine keeps its programs, as Debian's default PATH orders them. A machine with a root of
# its own finds its tools only there: a vendor tool of the host's would report the host's GPUs as its own.
TOOL_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
WSL_TOOL_DIR = "/usr/lib/wsl/lib"  # WSL's driver tools, outside PATH's directories


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Transport(Protocol):
    """How commands reach a machine."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult: ...

    def which(self, program: str) -> str | None: ...


class LocalTransport:
    """Runs commands on this host, with the caller's PATH (stand-in tools are put first there)."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        import subprocess  # late: a read runs no tool, and the module costs every `rdc` start

        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        try:
            proc = subprocess.run(
                list(argv), env=full_env, input=input, capture_output=True, text=True, timeout=timeout
            )
        except FileNotFoundError as exc:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror}")
        except OSError as exc:  # found but not runnable (no x bit, bad interpreter): the shell's 126
            return CommandResult(tuple(argv), 126, "", f"{argv[0]}: cannot run it: {exc.strerror}")
        except subprocess.TimeoutExpired:
            return CommandResult(tuple(argv), 124, "", f"{argv[0]}: timed out after {timeout}s")
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def which(self, program: str) -> str | None:
        import shutil  # late: a read looks for no tool

        return shutil.which(program)


@dataclass
class Machine:
    """A machine known to `rdc`: a name and a filesystem root (its settings are files under it)."""

    name: str
    root: Path = Path("/")
    transport: Transport = field(default_factory=LocalTransport)
    remote: SshAddress | None = None

    def path(self, absolute: str | os.PathLike[str]) -> Path:
        """The host path of `absolute` as this machine sees it (`/etc/cdi` -> `<root>/etc/cdi`)."""
        if self.remote is not None:
            # Reading a remote root's path here would silently read this host's files instead.
            raise StateError(
                f"machine {self.name} is reached over SSH ({self.remote}); its files are not on this host",
                "run the command through rdc, which forwards it to the machine",
            )
        text = os.fspath(absolute)
        if not text.startswith("/"):
            raise ValueError(f"machine paths are absolute, got {text!r}")
        return self.root / text.lstrip("/") if text != "/" else self.root

    @property
    def is_host(self) -> bool:
        """True when this machine is the host itself, where real hardware APIs may be used."""
        return self.root.resolve() == Path("/")

    @property
    def platform(self) -> Platform:
        # WSL2 exposes the Windows GPU paravirtualisation device; that is an OS fact, not a vendor's.
        return "wsl" if self.path("/dev/dxg").exists() else "native"

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        if argv and "/" not in argv[0] and self.remote is None and not self.is_host:
            # A bare name is the machine's own program; one there without its x bit is still run,
            # so that the error says why it cannot run rather than that it is missing.
            found = next((str(c) for c in self._own_candidates(argv[0]) if c.is_file()), None)
            if found is None:
                return CommandResult(
                    tuple(argv),
                    127,
                    "",
                    f"{argv[0]}: not among machine {self.name}'s own tools (under {self.root})",
                )
            argv = [found, *argv[1:]]
        return self.transport.run(argv, env=env, input=input, timeout=timeout)

    def which(self, program: str) -> str | None:
        """The program `program` of this machine: found on PATH for the host (or by the SSH
        transport on its machine), under the root's own bin directories for any other root."""
        if self.remote is not None or self.is_host:
            return self.transport.which(program)
        return next(
            (str(c) for c in self._own_candidates(program) if c.is_file() and os.access(c, os.X_OK)), None
        )

    def _own_candidates(self, program: str) -> list[Path]:
        dirs = (*TOOL_DIRS, WSL_TOOL_DIR) if self.platform == "wsl" else TOOL_DIRS
        return [self.path(directory) / program for directory in dirs]

    @property
    def tool_dir(self) -> Path:
        """Where this machine's own programs go when a root of its own holds them (`<root>/usr/bin`)."""
        return self.path("/usr/bin")

    # Well-known places, all under the machine root.
    @property
    def cdi_dir(self) -> Path:
        return self.path("/etc/cdi")

    @property
    def state_dir(self) -> Path:
        return self.path("/etc/rediacc")

    @property
    def gpu_dir(self) -> Path:
        return self.path("/etc/rediacc/gpu")

    @property
    def inventory_path(self) -> Path:
        return self.path("/etc/rediacc/gpu/inventory.json")

    @property
    def grants_path(self) -> Path:
        return self.path("/etc/rediacc/gpu/grants.json")

    @property
    def settings_path(self) -> Path:
        return self.path("/etc/rediacc/settings.json")

    @property
    def repos_path(self) -> Path:
        return self.path("/etc/rediacc/repos.json")

    @property
    def run_dir(self) -> Path:
        return self.path("/run/rediacc")
