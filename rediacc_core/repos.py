"""Repos: named workloads on a machine, each with an identity (a random UUID) separate from its name.

Grants belong to the identity, so a fork, a copy or a repo re-created under an old name starts with
no grants. The repos of a machine live in `<root>/etc/rediacc/repos.json`, written atomically under
the machine's state lock and checked against `schema/repos.schema.json` on every read.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from rediacc_core.errors import AmbiguousError, NotFoundError, StateError, ValidationError
from rediacc_core.files import atomic_write_json, read_json_checked
from rediacc_core.machine import Machine
from rediacc_core.statelock import state_lock

SCHEMA = "repos.schema.json"
SCHEMA_VERSION = 1
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_LABEL_RULE = "1-63 letters, digits, '_', '.' or '-', starting with a letter or digit"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Repo:
    """A repo on one machine. `id` is its identity; `name[:tag]` is how people refer to it."""

    id: str
    name: str
    tag: str | None
    machine: str
    docker_host: str | None
    created_at: str

    @property
    def label(self) -> str:
        return self.name if self.tag is None else f"{self.name}:{self.tag}"

    @property
    def ref(self) -> str:
        return f"{self.label}@{self.machine}"


@dataclass(frozen=True)
class RepoRef:
    """A reference as typed: `name[:tag][@machine]`."""

    name: str
    tag: str | None = None
    machine: str | None = None

    @property
    def label(self) -> str:
        return self.name if self.tag is None else f"{self.name}:{self.tag}"

    def __str__(self) -> str:
        return self.label if self.machine is None else f"{self.label}@{self.machine}"

    @classmethod
    def parse(cls, text: str) -> RepoRef:
        label, at, machine = text.partition("@")
        if at and (not machine or "@" in machine):
            raise ValidationError(
                f"repo reference {text!r} has a bad machine part after '@'",
                "write the reference as name[:tag][@machine], e.g. alpha:v2@gpu-box",
            )
        name, colon, tag = label.partition(":")
        check_label(name, "repo name", text)
        if colon:
            check_label(tag, "repo tag", text)
        return cls(name, tag if colon else None, machine if at else None)


def check_label(value: str, what: str, source: str | None = None) -> None:
    if not _LABEL.fullmatch(value):
        where = f" in {source!r}" if source is not None and source != value else ""
        raise ValidationError(
            f"{what} {value!r}{where} is not valid: use {_LABEL_RULE}",
            "write the reference as name[:tag][@machine], e.g. alpha:v2@gpu-box",
        )


def check_docker_host(value: str) -> None:
    if not value.startswith("unix:///") or any(ch.isspace() for ch in value):
        raise ValidationError(
            f"docker host {value!r} is not a unix socket URL",
            "give the daemon's socket as unix:///absolute/path/docker.sock",
        )


class MachineSource(Protocol):
    """What resolving a reference needs from the configuration (`rediacc_core.config.Config`)."""

    def machine(self, name: str) -> Machine: ...

    def machines(self) -> list[Machine]: ...


class RepoStore:
    """The repos of one machine."""

    def __init__(self, machine: Machine, *, lock_timeout: float | None = None) -> None:
        self.machine = machine
        self.lock_timeout = lock_timeout

    # --- reading (no lock: the file is always replaced whole) -----------------------------------
    def _read(self) -> list[Repo]:
        path = self.machine.repos_path
        if not path.exists():
            return []  # no repo was ever created here
        document = read_json_checked(path, SCHEMA, "repos file")
        repos = [self._from_json(entry) for entry in document["repos"]]
        ids = [repo.id for repo in repos]
        labels = [repo.label for repo in repos]
        for kind, values in (("id", ids), ("name", labels)):
            twice = sorted({value for value in values if values.count(value) > 1})
            if twice:
                raise ValidationError(
                    f"repos file {path} lists the same repo {kind} more than once: {', '.join(twice)}",
                    f"restore {path} from backup or fix it by hand; nothing was changed",
                )
        return repos

    def _from_json(self, entry: dict[str, Any]) -> Repo:
        return Repo(
            id=entry["id"],
            name=entry["name"],
            tag=entry["tag"],
            machine=self.machine.name,
            docker_host=entry["dockerHost"],
            created_at=entry["createdAt"],
        )

    @staticmethod
    def _to_json(repo: Repo) -> dict[str, Any]:
        return {
            "id": repo.id,
            "name": repo.name,
            "tag": repo.tag,
            "dockerHost": repo.docker_host,
            "createdAt": repo.created_at,
        }

    def _write(self, repos: Sequence[Repo]) -> None:
        document = {"schemaVersion": SCHEMA_VERSION, "repos": [self._to_json(repo) for repo in repos]}
        atomic_write_json(self.machine.repos_path, document)

    def list(self) -> list[Repo]:
        return sorted(self._read(), key=lambda repo: (repo.name, repo.tag or ""))

    def find(self, label: str) -> Repo | None:
        return next((repo for repo in self._read() if repo.label == label), None)

    def get_by_label(self, label: str) -> Repo:
        repo = self.find(label)
        if repo is None:
            import difflib  # late: only a mistyped name pays for it

            close = difflib.get_close_matches(label, [r.label for r in self._read()], n=1)
            meant = f"did you mean {close[0]}@{self.machine.name}? " if close else ""
            raise NotFoundError(
                f"no repo {label!r} on machine {self.machine.name!r}",
                f"{meant}see the repos there with `rdc repo list {self.machine.name}`",
            )
        return repo

    def by_id(self, repo_id: str) -> Repo:
        repo = next((repo for repo in self._read() if repo.id == repo_id), None)
        if repo is None:
            raise NotFoundError(
                f"no repo with id {repo_id} on machine {self.machine.name!r} (it was deleted)",
                f"see the repos there with `rdc repo list {self.machine.name}`",
            )
        return repo

    # --- changing (under the machine's state lock) ----------------------------------------------
    def create(self, name: str, tag: str | None = None, docker_host: str | None = None) -> Repo:
        check_label(name, "repo name")
        if tag is not None:
            check_label(tag, "repo tag")
        if docker_host is not None:
            check_docker_host(docker_host)
        with state_lock(self.machine, self.lock_timeout):
            repos = self._read()
            repo = Repo(str(uuid.uuid4()), name, tag, self.machine.name, docker_host, now_iso())
            if any(existing.label == repo.label for existing in repos):
                raise StateError(
                    f"repo {repo.ref} already exists",
                    f"pick another name, or delete it first with `rdc repo delete {repo.ref}`",
                )
            self._write([*repos, repo])
        make_state_dirs(self.machine, repo.id)
        return repo

    def fork(self, repo: Repo, tag: str) -> Repo:
        """A new repo `<name>:<tag>` with a new identity: it starts without grants and with its own
        daemon (`runtime.fork` copies the source's data into it)."""
        return self.create(repo.name, tag)

    def delete(self, repo: Repo, drop_grants: Callable[[Machine, str], int]) -> int:
        """Delete the repo and, first, its grants through `drop_grants` (`grants.records.drop_repo_grants`,
        called under the state lock; `grants.records.delete_repo` puts the two together); returns how many
        grants went with it."""
        with state_lock(self.machine, self.lock_timeout):
            repos = self._read()
            if not any(existing.id == repo.id for existing in repos):
                raise NotFoundError(
                    f"repo {repo.ref} no longer exists",
                    f"see the repos there with `rdc repo list {self.machine.name}`",
                )
            # Grants first: a crash in between leaves a repo without grants, never grants without a repo
            # that a later repo could be mistaken for.
            dropped = drop_grants(self.machine, repo.id)
            self._write([existing for existing in repos if existing.id != repo.id])
        return dropped


AUDIT_LOG = "audit.log"  # in the repo's state dir (`RepoRuntime.audit_log` too)


def repo_state_dir(machine: Machine, repo_id: str) -> Path:
    """Where the machine keeps one repo's data: its daemon's data root, gate log, files."""
    return machine.path(f"/var/lib/rediacc/repos/{repo_id}")


def audit_log_path(machine: Machine, repo_id: str) -> Path:
    """The repo's audit trail: the gate's decisions and what rdc itself did to the repo's grants."""
    return repo_state_dir(machine, repo_id) / AUDIT_LOG


def files_dir(machine: Machine, repo_id: str) -> Path:
    """The repo's own files directory: the one host directory its containers may always bind."""
    return repo_state_dir(machine, repo_id) / "files"


STATE_DIR_MODE = 0o700


def make_state_dirs(machine: Machine, repo_id: str) -> Path:
    """Create the repo's state and files directories, or fix their modes; returns the files directory.

    Container root is host root, so what a tenant leaves in its files directory (a set-user-ID
    program, a device node) must be out of every host user's reach: the state directory, and the
    directory of all repos above it, are root's alone (0700). Idempotent: `rdc repo up` runs it
    again, which fixes the modes of repos created before."""
    files = files_dir(machine, repo_id)
    files.mkdir(parents=True, exist_ok=True)
    state = repo_state_dir(machine, repo_id)
    for directory in (state.parent, state):
        if directory.stat().st_mode & 0o777 != STATE_DIR_MODE:
            os.chmod(directory, STATE_DIR_MODE)
    return files


def _did_you_mean(label: str, config: MachineSource) -> str:
    """`did you mean b@m1? ` for the nearest labels of the local machines' repos; empty for none."""
    import difflib  # late: only a repo not found pays for it

    close = []
    for machine in config.machines():
        if machine.remote is None:
            labels = [repo.label for repo in RepoStore(machine).list()]
            close += [f"{found}@{machine.name}" for found in difflib.get_close_matches(label, labels, n=1)]
    return f"did you mean {' or '.join(close)}? " if close else ""


def resolve_ref(ref_text: str, config: MachineSource) -> tuple[Machine, Repo]:
    """The machine and repo a reference names; `@machine` may be left out when the name is unique."""
    ref = RepoRef.parse(ref_text)
    if ref.machine is not None:
        machine = config.machine(ref.machine)
        return machine, RepoStore(machine).get_by_label(ref.label)
    found: list[tuple[Machine, Repo]] = []
    for machine in config.machines():
        if machine.remote is not None:  # searching it would cost a connection: name it with @machine
            continue
        repo = RepoStore(machine).find(ref.label)
        if repo is not None:
            found.append((machine, repo))
    if not found:
        meant = _did_you_mean(ref.label, config)
        raise NotFoundError(
            f"no repo {ref.label!r} on any configured local machine",
            f"{meant}name the machine as {ref.label}@<machine> (needed for one reached over SSH); "
            "check the name with `rdc repo list <machine>`, or create it with "
            f"`rdc repo create {ref.label}@<machine>`",
        )
    if len(found) > 1:
        candidates = ", ".join(repo.ref for _, repo in found)
        raise AmbiguousError(
            f"repo {ref.label!r} exists on several machines: {candidates}",
            f"name the machine, e.g. {found[0][1].ref}",
        )
    return found[0]
