"""`rdc repo`: create, list, fork and delete repos, and grant them GPUs by CDI name (`rdc repo gpu`)."""

from __future__ import annotations

import sys
from typing import Any

import click

from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import emit, note, output_option, table
from rediacc_core.config import Config
from rediacc_core.errors import RefusedError, StateError, ValidationError
from rediacc_core.gate.lifecycle import running_parts
from rediacc_core.grants import Grant, GrantStore, read_grants
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import Repo, RepoRef, RepoStore, resolve_ref


def _grant_json(grant: Grant) -> dict[str, Any]:
    return {"device": grant.device, "exclusive": grant.exclusive, "grantedAt": grant.granted_at}


def _repo_json(repo: Repo, grants: list[Grant]) -> dict[str, Any]:
    return {
        "ref": repo.ref,
        "name": repo.name,
        "tag": repo.tag,
        "id": repo.id,
        "dockerHost": repo.docker_host,
        "createdAt": repo.created_at,
        "grants": [_grant_json(g) for g in sorted(grants, key=lambda g: g.device)],
    }


def _devices_cell(grants: list[dict[str, Any]]) -> str:
    # `*` marks an exclusive grant, as in `rdc repo gpu list`.
    return ", ".join(g["device"] + (" *" if g["exclusive"] else "") for g in grants) or "-"


@click.group(cls=HintingGroup)
def repo() -> None:
    """Repos: isolated Docker workloads on a machine, each with its own daemon behind the gate."""


@repo.command("create")
@click.argument("ref", metavar="NAME[:TAG]@MACHINE")
@click.option(
    "--docker-host",
    metavar="unix:///PATH",
    help="Attach the repo to this existing Docker daemon instead of one rdc starts.",
)
def create(ref: str, docker_host: str | None) -> None:
    """Create a repo with a new identity and no grants."""
    parsed = RepoRef.parse(ref)
    if parsed.machine is None:
        raise ValidationError(
            f"say which machine the repo {parsed.label!r} goes on",
            f"write it as {parsed.label}@<machine> (see `rdc machine list`)",
        )
    machine = Config.load().machine(parsed.machine)
    created = RepoStore(machine).create(parsed.name, parsed.tag, docker_host)
    note(f"Created repo {created.ref} (id {created.id}); it has no GPU grants yet.")


@repo.command("list")
@click.argument("machine_name", metavar="MACHINE", required=False)
@click.option("--all", "every", is_flag=True, help="The repos of every machine at once.")
@output_option()
def list_repos(machine_name: str | None, every: bool, fmt: str) -> None:
    """The repos on MACHINE with their GPU grants (`*` marks an exclusive grant)."""
    if every or machine_name is None:
        from rediacc_core.remote.fleet import fleet_repo_list

        fleet_repo_list(machine_name, every, fmt)
        return
    machine = Config.load().machine(machine_name)
    repos = RepoStore(machine).list()
    grants = read_grants(machine)
    data = [_repo_json(r, [g for g in grants if g.repo_id == r.id]) for r in repos]

    def render(rows: list[dict[str, Any]]) -> str:
        return table(
            ["REPO", "ID", "DOCKER HOST", "CREATED", "GPU GRANTS"],
            [[r["ref"], r["id"], r["dockerHost"], r["createdAt"], _devices_cell(r["grants"])] for r in rows],
        )

    emit(data, fmt, render)
    if not repos and fmt == "table":
        note(f"No repos on {machine.name}; create one with `rdc repo create <name>@{machine.name}`.")


@repo.command("delete")
@click.argument("ref", metavar="REPO")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(ref: str, yes: bool) -> None:
    """Delete a repo and its grants."""
    machine, found = resolve_ref(ref, Config.load())
    running = running_parts(machine, found)
    if running:
        # Its daemon would keep serving containers whose grants were just dropped.
        raise StateError(
            f"repo {found.ref} is running: {', '.join(running)}",
            f"stop it first: rdc repo down {found.ref}",
        )
    if not yes:
        if not sys.stdin.isatty():
            raise RefusedError(
                f"not deleting {found.ref} without confirmation",
                f"pass --yes to delete it: rdc repo delete {found.ref} --yes",
            )
        click.confirm(f"Delete repo {found.ref} and its GPU grants?", abort=True, err=True)
    dropped = RepoStore(machine).delete(found)
    note(f"Deleted repo {found.ref} and {dropped} GPU grant{'s' if dropped != 1 else ''}.")


@repo.command("fork")
@click.argument("ref", metavar="REPO")
@click.option("--tag", required=True, help="The fork's tag: it becomes NAME:TAG.")
def fork(ref: str, tag: str) -> None:
    """Create NAME:TAG from REPO with a new identity; grants stay with the original."""
    machine, found = resolve_ref(ref, Config.load())
    forked = RepoStore(machine).fork(found, tag)
    note(
        f"Forked {found.ref} as {forked.ref} (id {forked.id}); the fork has no GPU grants: "
        f"grant them with `rdc repo gpu grant {forked.ref} --device <name>`."
    )


# --- rdc repo gpu ---------------------------------------------------------------------------------


@repo.group("gpu")
def gpu() -> None:
    """GPU grants: the exact CDI device names a repo may use."""


_DEVICE_HELP = "A CDI device name, e.g. vendor.example/gpu=0 (repeat for several)."


@gpu.command("grant")
@click.argument("ref", metavar="REPO")
@click.option("--device", "devices", multiple=True, required=True, metavar="CDI-NAME", help=_DEVICE_HELP)
@click.option("--exclusive", is_flag=True, help="Reserve the device's hardware for this repo alone.")
def grant(ref: str, devices: tuple[str, ...], exclusive: bool) -> None:
    """Grant REPO the named devices (all of them or none); takes effect at its next Docker request."""
    machine, found = resolve_ref(ref, Config.load())
    outcomes = GrantStore(machine, get_plugins()).grant(found, devices, exclusive)
    for outcome in outcomes:
        how = " exclusively" if outcome.grant.exclusive else ""
        if outcome.changed:
            extra = f" ({outcome.note})" if outcome.note else ""
            note(f"Granted {outcome.grant.device}{how} to {found.ref}{extra}.")
        else:
            note(f"{found.ref}: {outcome.grant.device} {outcome.note}.")


@gpu.command("revoke")
@click.argument("ref", metavar="REPO")
@click.option("--device", "devices", multiple=True, required=True, metavar="CDI-NAME", help=_DEVICE_HELP)
def revoke(ref: str, devices: tuple[str, ...]) -> None:
    """Revoke REPO's grants of the named devices (all of them or none)."""
    machine, found = resolve_ref(ref, Config.load())
    removed = GrantStore(machine, get_plugins()).revoke(found, devices)
    for gone in removed:
        note(f"Revoked {gone.device} from {found.ref}.")


@gpu.command("list")
@click.argument("ref", metavar="REPO")
@output_option()
def list_grants(ref: str, fmt: str) -> None:
    """The grants in force for REPO, read from the machine now."""
    machine, found = resolve_ref(ref, Config.load())
    grants = [g for g in read_grants(machine) if g.repo_id == found.id]
    data = [_grant_json(g) for g in sorted(grants, key=lambda g: g.device)]

    def render(rows: list[dict[str, Any]]) -> str:
        return table(
            ["DEVICE", "EXCLUSIVE", "GRANTED AT"],
            [[r["device"], r["exclusive"], r["grantedAt"]] for r in rows],
        )

    emit(data, fmt, render)
    if not grants and fmt == "table":
        note(f"{found.ref} has no GPU grants; add one with `rdc repo gpu grant {found.ref} --device <name>`.")
