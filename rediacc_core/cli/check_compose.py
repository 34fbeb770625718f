"""A Compose file or a `docker compose … up|create` command line as the requests Compose sends.

The project is read by the installed Compose itself: `docker compose [the same global options]
config --format json [the same services]`, run with this process's environment, in this directory.
So overrides, `include`, `extends`, profiles, `env_file`, `--env-file`, interpolation and every
default are Compose's own; `compose_bodies` turns its model into the requests. Without a Compose
that answers, nothing is guessed: the check is refused, naming what to install.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rediacc_core.cli.check_docker import CheckedRequest
from rediacc_core.cli.compose_bodies import from_model
from rediacc_core.errors import ValidationError

_DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
_OVERRIDES = ("compose.override.yaml", "compose.override.yml", "docker-compose.override.yml",
              "docker-compose.override.yaml")  # fmt: skip

# `docker compose` global options: those that change the project (passed on to `config`), and
# those that change only how it runs or prints.
_PROJECT_OPTIONS = frozenset(("-f", "--file", "-p", "--project-name", "--profile", "--env-file",
                              "--project-directory"))  # fmt: skip
_RUN_OPTIONS = frozenset(("--parallel", "--ansi", "--progress"))
_GLOBAL_FLAGS = frozenset(("--compatibility", "--dry-run", "--all-resources", "--verbose", "--debug", "-D"))
# `up` and `create` options: with a value, and flags. None of them changes what a container is
# created with (`--scale` only how many); `--no-build` and `--no-deps` change which requests are sent.
_UP_VALUES = frozenset(("--pull", "--scale", "-t", "--timeout", "--wait-timeout", "--attach",
                        "--no-attach", "--exit-code-from"))  # fmt: skip
_UP_FLAGS = frozenset(
    (
        "-d", "--detach", "--build", "--no-build", "--no-deps", "--force-recreate", "--no-recreate",
        "--remove-orphans", "-V", "--renew-anon-volumes", "--always-recreate-deps",
        "--abort-on-container-exit", "--abort-on-container-failure", "--attach-dependencies",
        "--no-color", "--no-log-prefix", "--no-start", "--quiet-pull", "--wait", "-w", "--watch",
        "--menu", "-y", "--yes", "--dry-run", "--timestamps", "--quiet-build",
    )
)  # fmt: skip


@dataclass
class ComposeLine:
    """What a `docker compose` command line asks for: the options that make the project, the
    services named (none: all), and the `up` flags that change which requests are sent."""

    project_options: list[str] = field(default_factory=list)
    services: list[str] = field(default_factory=list)
    no_build: bool = False
    no_deps: bool = False
    directory: Path | None = None

    def shown(self) -> str:
        return shlex.join(["docker", "compose", *self.project_options, "up", *self.services])


def _unknown(option: str, where: str) -> ValidationError:
    return ValidationError(
        f"rdc repo check does not know the docker compose {where}option {option}, so it cannot say what "
        "the gate would decide",
        "check the command line without it, or run it: the gate decides every request itself",
    )


def parse_compose(args: Sequence[str]) -> ComposeLine:
    """`docker compose [GLOBAL OPTIONS] up|create [OPTIONS] [SERVICE…]` (the words after `compose`)."""
    line = ComposeLine()
    i, args = 0, list(args)

    def value(name: str, eq: str, given: str) -> str:
        nonlocal i
        if eq:
            return given
        i += 1
        if i >= len(args):
            raise ValidationError(f"docker compose option {name} needs a value", f"give it one: {name} VALUE")
        return args[i]

    while i < len(args) and args[i].startswith("-"):
        name, eq, given = args[i].partition("=")
        if name in _PROJECT_OPTIONS:
            line.project_options += [name, value(name, eq, given)]
        elif name in _RUN_OPTIONS:
            value(name, eq, given)
        elif name not in _GLOBAL_FLAGS:
            raise _unknown(name, "")
        i += 1
    command = args[i] if i < len(args) else ""
    if command not in ("up", "create"):
        raise ValidationError(
            f"rdc repo check reads docker compose up and create, not docker compose {command}".rstrip(),
            "write it as: rdc repo check REPO -- docker compose [-f FILE] up [SERVICE...]",
        )
    i += 1
    while i < len(args):
        name, eq, given = args[i].partition("=")
        if name in _UP_VALUES:
            value(name, eq, given)
        elif name in _UP_FLAGS:
            line.no_build |= name == "--no-build"
            line.no_deps |= name == "--no-deps"
        elif name.startswith("-"):
            raise _unknown(name, f"{command} ")
        else:
            line.services.append(args[i])
        i += 1
    return line


def file_line(path: Path) -> ComposeLine:
    """A Compose file named alone: `docker compose -f FILE up`, with the override file beside it when
    FILE has a default name, as `docker compose up` in its directory reads them."""
    if not path.is_file():
        raise ValidationError(
            f"cannot read the Compose file {path}: no such file",
            "name a Compose file that exists (rdc repo check REPO ./compose.yaml)",
        )
    options = ["-f", str(path)]
    if path.name in _DEFAULT_FILES:
        for name in _OVERRIDES:
            if (path.parent / name).is_file():
                options += ["-f", str(path.parent / name)]
                break
    return ComposeLine(project_options=options)


def _compose(args: Sequence[str], cwd: Path | None) -> str:
    try:
        done = subprocess.run(
            ["docker", "compose", *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
        )
    except FileNotFoundError:
        done = None
    if done is None or (done.returncode != 0 and "is not a docker command" in done.stderr):
        raise ValidationError(
            "rdc repo check reads a Compose project through the installed Compose (docker compose config), "
            "and no docker compose is installed here, so it cannot say what Compose would send",
            "install the Docker Compose plugin (docker-compose-plugin), then check again",
        )
    if done.returncode != 0:
        raise ValidationError(
            f"Compose could not read the project: {done.stderr.strip()}",
            "fix what Compose names, then check again (docker compose config shows the project)",
        )
    return done.stdout


def compose_version() -> tuple[int, int]:
    text = _compose(["version", "--short"], None).strip()
    found = re.match(r"v?(\d+)\.(\d+)", text)
    if found is None:
        raise ValidationError(f"cannot read docker compose version {text!r}", "reinstall docker compose")
    return int(found.group(1)), int(found.group(2))


def model_of(line: ComposeLine) -> dict[str, Any]:
    """The project as Compose builds it for this command line."""
    text = _compose([*line.project_options, "config", "--format", "json", *line.services], line.directory)
    model: dict[str, Any] = json.loads(text)
    return model


def from_compose(line: ComposeLine) -> tuple[list[CheckedRequest], list[str]]:
    """The requests `line` would send, and what the installed Compose reads but does not send."""
    version = compose_version()
    model = model_of(line)
    services = model.get("services") or {}
    if line.no_deps and line.services:
        services = {name: services[name] for name in line.services if name in services}
    if line.no_build:
        services = {name: {k: v for k, v in s.items() if k != "build"} for name, s in services.items()}
    requests, dropped = from_model(model, version, services)
    shown = f"Compose {version[0]}.{version[1]}"
    return requests, [f"Read by {shown} as: {line.shown()}", *(f"{shown} drops {d}" for d in dropped)]
