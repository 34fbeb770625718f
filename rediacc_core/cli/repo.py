"""`rdc repo`: create, list, fork and delete repos, and grant them GPUs by CDI name (`rdc repo gpu`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import emit, fitted_width, note, output_option, table
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_STATE, RefusedError, StateError, ValidationError
from rediacc_core.grants.records import (
    Grant,
    delete_repo,
    ended_leases,
    read_all,
    read_grants,
    suspension_advice,
    suspension_text,
)
from rediacc_core.repos import Repo, RepoRef, RepoStore, repo_state_dir, resolve_ref
from rediacc_core.slurm.node import is_slurm_node

if TYPE_CHECKING:
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.machine import Machine

# The reads here (list, gpu list) import only the above; what a change needs (plugins, the CDI
# registry, the daemons) is imported by the command that makes it.


def _grant_json(grant: Grant) -> dict[str, Any]:
    return {
        "device": grant.device,
        "exclusive": grant.exclusive,
        "grantedAt": grant.granted_at,
        "expiresAt": grant.expires_at,
        # What the name reached when granted or confirmed; null for an older file's grant, until setup.
        "boundTo": [u.to_json() for u in grant.bound_to] if grant.bound_to is not None else None,
        "suspended": grant.suspended.to_json() if grant.suspended is not None else None,
    }


def _state(grant: Grant) -> str:
    if grant.suspended is not None:
        return f"suspended ({grant.suspended.reason})"
    return "in force" if grant.bound_to is not None else "in force (unbound)"


_FOR_HELP = "A lease: the grant ends after this long (8h, 90m, 1d12h)."
_UNTIL_HELP = "A lease: the grant ends at this time (ISO 8601, e.g. 2026-12-03T08:00Z; no zone: UTC)."


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
    # `*` marks an exclusive grant, as in `rdc repo gpu list`; a suspended one says so.
    return (
        ", ".join(
            g["device"] + (" *" if g["exclusive"] else "") + (" (suspended)" if g.get("suspended") else "")
            for g in grants
        )
        or "-"
    )


@click.group(cls=HintingGroup)
def repo() -> None:
    """\b
    Examples:
      rdc repo create gpu-a@localhost
      rdc repo gpu grant gpu-a --device vendor.example/gpu=0
      sudo rdc repo up gpu-a
    """


@click.command("create")
@click.argument("ref", metavar="NAME[:TAG]@MACHINE")
@click.option(
    "--docker-host",
    metavar="unix:///PATH",
    help="Attach the repo to this existing Docker daemon instead of one rdc starts.",
)
@output_option("table", "json", "yaml")
def create(ref: str, docker_host: str | None, fmt: str) -> None:
    """\b
    Examples:
      rdc repo create gpu-a@localhost
      rdc repo create gpu-a@localhost -o json | jq -r .id
      rdc repo create ext@localhost --docker-host unix:///run/docker.sock
    """
    parsed = RepoRef.parse(ref)
    if parsed.machine is None:
        raise ValidationError(
            f"say which machine the repo {parsed.label!r} goes on",
            f"write it as {parsed.label}@<machine> (see `rdc machine list`)",
        )
    machine = Config.load().machine(parsed.machine)
    created = RepoStore(machine).create(parsed.name, parsed.tag, docker_host)
    emit(_repo_json(created, []), fmt, lambda _: "")
    note(f"Created repo {created.ref} (id {created.id}); it has no GPU grants yet.")


@click.command("list")
@click.argument("machine_name", metavar="MACHINE", required=False)
@click.option("--all", "every", is_flag=True, help="The repos of every machine at once.")
@output_option()
def list_repos(machine_name: str | None, every: bool, fmt: str) -> None:
    """\b
    Examples:
      rdc repo list localhost
      rdc repo list localhost -o wide
      rdc repo list --all
    """
    from rediacc_core.runtime.status import net_path, orphan_text, orphaned_parts, repo_status

    if every or machine_name is None:
        from rediacc_core.cli.fleet import fleet_repo_list

        fleet_repo_list(machine_name, every, fmt)
        return
    machine = Config.load().machine(machine_name)
    repos = RepoStore(machine).list()
    grants = read_grants(machine)
    leases: dict[str, list[Any]] | None = None
    slurm_said: list[str] = []
    if is_slurm_node(machine):  # Slurm's rooms load only where Slurm runs (`slurm.node`)
        from rediacc_core.cli.repo_lease import lease_json, lease_text, slurm_leases

        leases, slurm_said = slurm_leases(machine, repos)
    data = [
        {
            **_repo_json(r, [g for g in grants if g.repo_id == r.id]),
            "status": repo_status(machine, r)[0],
            "net": net_path(machine, r),  # the namespace's path out: kernel, user, or None while down
            # Only on a Slurm node that answered: the repo's leases, pending and running.
            **({"leases": [lease_json(j) for j in leases[r.id]]} if leases is not None else {}),
        }
        for r in repos
    ]
    texts = {r.id: [lease_text(j) for j in leases[r.id]] for r in repos} if leases is not None else None

    def render(rows: list[dict[str, Any]]) -> str:
        # On a terminal the id is cut to its first 12 (as the run directory names it; `-o wide` and
        # `-o json` have it whole), and a DOCKER HOST column no repo fills is left out.
        short = fitted_width() is not None
        hosts = any(r["dockerHost"] for r in rows)
        wide = fmt == "wide"  # NET: which path out each repo's network takes (setting net-path)
        return table(
            ["REPO", "STATUS", "ID", *(["DOCKER HOST"] if hosts else []), *(["NET"] if wide else [])]
            + ["CREATED", "GPU GRANTS"]
            + (["LEASES"] if texts is not None else []),
            [
                [
                    r["ref"],
                    r["status"],
                    r["id"][:12] if short else r["id"],
                    *([r["dockerHost"]] if hosts else []),
                    *([r["net"]] if wide else []),
                    r["createdAt"],
                    _devices_cell(r["grants"]),
                    *([", ".join(texts[r["id"]]) or None] if texts is not None else []),
                ]
                for r in rows
            ],
        )

    emit(data, fmt, render)
    for line in slurm_said:
        note(line)
    for run_dir, parts in orphaned_parts(machine):
        pids = " ".join(part.rsplit("pid ", 1)[1].rstrip(")") for part in parts)
        what = orphan_text(run_dir, parts)
        note(f"Note: {what} still run on {machine.name}; no repo names them: kill {pids}")
    if not repos and fmt == "table":
        note(f"No repos on {machine.name}; create one with `rdc repo create <name>@{machine.name}`.")


def confirm_delete(ref: str) -> bool:
    """Ask on this terminal before `ref` is deleted (for an SSH machine, the client asks: see
    `remote.dispatch`, as the machine side has no terminal)."""
    return click.confirm(f"Delete repo {ref} and its GPU grants?", err=True)


@click.command("delete")
@click.argument("ref", metavar="REPO")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(ref: str, yes: bool) -> None:
    """\b
    Examples:
      rdc repo delete gpu-a@localhost --yes
    """
    from rediacc_core.runtime import filesmount, lifecycle, status

    machine, found = resolve_ref(ref, Config.load())
    running = status.running_parts(machine, found)
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
        if not confirm_delete(found.ref):
            raise click.Abort()
    filesmount.release_repo(machine, found.id, found.ref)  # left by units stopped without `rdc repo down`
    lifecycle.remove_kernel_path(machine, found)
    dropped = delete_repo(machine, found)
    note(f"Deleted repo {found.ref} and {dropped} GPU grant{'s' if dropped != 1 else ''}.")


@click.command("fork")
@click.argument("ref", metavar="REPO")
@click.option("--tag", required=True, help="The fork's tag: it becomes NAME:TAG.")
@click.option(
    "--empty", is_flag=True, help="Copy nothing: a new repo under the same name, with a new identity."
)
@output_option("table", "json", "yaml")
def fork(ref: str, tag: str, empty: bool, fmt: str) -> None:
    """Whatever the daemon recorded of REPO's paths names the fork's own in the copy (a bind volume
    mounts the fork's copy of REPO's files); a record rdc cannot rewrite refuses the fork.
    The fork starts without grants (they stay with the original): a copied container that holds
    a GPU does not start in the fork until the fork is granted it. REPO must be down (`rdc repo
    down`), unless --empty.

    \b
    Examples:
      rdc repo fork gpu-a --tag exp
      rdc repo fork gpu-a --tag scratch --empty -o json
    """
    from rediacc_core.runtime import fork as fork_copy
    from rediacc_core.runtime.status import running_parts

    machine, found = resolve_ref(ref, Config.load())
    if not empty:
        fork_copy.require_down(found, running_parts(machine, found))  # before anything is created
    store = RepoStore(machine)
    forked = store.fork(found, tag)
    copied = fork_copy.ForkCopy((), 0)
    if not empty:
        try:
            copied = fork_copy.copy_repo(machine, found, forked)
        except BaseException:
            delete_repo(machine, forked)  # nothing half-made stays: the fork goes with its partial copy
            import shutil  # late: only a failed fork needs it; the reads of this module never do

            shutil.rmtree(repo_state_dir(machine, forked.id), ignore_errors=True)
            raise
    emit(
        {
            **_repo_json(forked, []),
            "forkedFrom": found.id,
            "copied": list(copied.copied),
            "containers": copied.containers,
        },
        fmt,
        lambda _: "",
    )
    what = (
        "nothing copied"
        if empty
        else f"copied {', '.join(copied.copied) or 'nothing'}, {copied.containers} container(s)"
    )
    note(
        f"Forked {found.ref} as {forked.ref} (id {forked.id}; {what}); the fork has no GPU grants: "
        f"grant them with `rdc repo gpu grant {forked.ref} --device <name>`."
    )


# --- rdc repo gpu ---------------------------------------------------------------------------------


@click.group("gpu", cls=HintingGroup)
def gpu() -> None:
    """\b
    Examples:
      rdc repo gpu grant gpu-a --device vendor.example/gpu=0
      rdc repo gpu list gpu-a
    """


_DEVICE_HELP = "A CDI device name, e.g. vendor.example/gpu=0 (repeat for several)."


@click.command("grant")
@click.argument("ref", metavar="REPO")
@click.option("--device", "devices", multiple=True, required=True, metavar="CDI-NAME", help=_DEVICE_HELP)
@click.option("--exclusive", is_flag=True, help="Reserve the device's hardware for this repo alone.")
@click.option(
    "--stop-holders",
    is_flag=True,
    help="With --exclusive: stop the running containers of other repos that hold the same hardware.",
)
@click.option(
    "--take-over",
    is_flag=True,
    help="With --exclusive: a handover in one step (revoke other repos' grants in the way, stop holders).",
)
@click.option("--yes", is_flag=True, help="With --take-over: do not ask before revoking the grants it lists.")
@click.option("--for", "duration", metavar="DURATION", help=_FOR_HELP)
@click.option("--until", metavar="TIME", help=_UNTIL_HELP)
@output_option("table", "json", "yaml")
def grant(
    ref: str,
    devices: tuple[str, ...],
    exclusive: bool,
    stop_holders: bool,
    take_over: bool,
    yes: bool,
    duration: str | None,
    until: str | None,
    fmt: str,
) -> None:
    """An exclusive grant is refused (exit 4) while another repo holds or may hold the same hardware:
    a container of it runs with it, a process of it has a node open, or its grant of it ended
    (revoked, a lease's end) while it still runs anything (a descriptor in flight shows in no
    scan). --stop-holders empties those repos first, under the machine's lock: every running
    container of them is stopped. It is refused too while another repo holds a grant of that
    hardware; --take-over lists every such grant, asks (or takes --yes), revokes them and empties
    their repos, in that order, before the grant is written (audited in both repos). With --for or
    --until the grant is a lease: from its end on it is gone (renew it with `rdc repo gpu renew`).

    \b
    Examples:
      rdc repo gpu grant gpu-a --device vendor.example/gpu=0 --for 8h
      rdc repo gpu grant gpu-a --device vendor.example/gpu=0 --exclusive
      rdc repo gpu grant gpu-a --device vendor.example/gpu=0 --exclusive --stop-holders
      rdc repo gpu grant gpu-b --device vendor.example/gpu=0 --exclusive --take-over --yes
      rdc repo gpu grant gpu-a --device vendor.example/gpu=0 --device other.example/gpu=1
    """
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.leases import expiry
    from rediacc_core.plugins import get_plugins
    from rediacc_core.runtime.holdings import Holdings

    for flag, given in (("--stop-holders", stop_holders), ("--take-over", take_over)):
        if given and not exclusive:
            raise ValidationError(f"{flag} goes with --exclusive", f"add --exclusive, or leave {flag} out")
    if yes and not take_over:
        raise ValidationError("--yes goes with --take-over", "add --take-over, or leave --yes out")
    expires_at = expiry(duration, until)
    machine, found = resolve_ref(ref, Config.load())
    store = GrantStore(machine, get_plugins(), running=Holdings(machine))
    listed = _confirm_take_over(store, found, devices, yes) if take_over else None
    outcomes = store.grant(
        found,
        devices,
        exclusive,
        stop_holders=stop_holders,
        take_over=take_over,
        expires_at=expires_at,
        listed=listed,
    )
    stopped = list({h.id: h for o in outcomes for h in o.stopped}.values())
    emit(
        {
            "repo": found.ref,
            "repoId": found.id,
            "grants": [{**_grant_json(o.grant), "changed": o.changed} for o in outcomes],
            "stopped": [h.to_json() for h in stopped],
            "takenOver": [
                {"repo": who, "device": device}
                for who, device in dict.fromkeys(t for o in outcomes for t in o.taken)
            ],
        },
        fmt,
        lambda _: "",
    )
    for who, device in dict.fromkeys(t for o in outcomes for t in o.taken):
        note(f"Took {device} over from {who}: its grant there is revoked.")
    for holder in stopped:
        held = f"it held {', '.join(holder.cdi)}" if holder.cdi else "; ".join(holder.opened)
        why = held or "emptying the repo: a descriptor in flight shows in no scan"
        note(f"Stopped container {holder.name} of repo {holder.repo.ref} ({why}).")
    for outcome in outcomes:
        how = " exclusively" if outcome.grant.exclusive else ""
        if outcome.changed:
            extra = f" ({outcome.note})" if outcome.note else ""
            until_text = f" until {outcome.grant.expires_at}" if outcome.grant.expires_at else ""
            note(f"Granted {outcome.grant.device}{how} to {found.ref}{until_text}{extra}.")
        else:
            note(f"{found.ref}: {outcome.grant.device} {outcome.note}.")


def confirm_take_over(listing: str) -> bool:
    """Ask on this terminal before a take-over revokes the grants in `listing`."""
    return click.confirm(f"Revoke {listing}, and stop every container of those repos?", err=True)


def _confirm_take_over(
    store: GrantStore, found: Repo, devices: tuple[str, ...], yes: bool
) -> set[tuple[str, str]]:
    """List every grant a take-over would revoke, and ask (or need --yes); returns those listed, which
    are all the take-over may revoke."""
    plan = store.take_over_plan(found, devices)
    if not plan:
        return set()
    listing = "; ".join(f"{g.device}{' (exclusive)' if g.exclusive else ''} of repo {who}" for who, g in plan)
    note(f"Taking {', '.join(dict.fromkeys(devices))} over for {found.ref} revokes: {listing}.")
    if not yes:
        if not sys.stdin.isatty():
            names = " ".join(f"--device {d}" for d in dict.fromkeys(devices))
            raise RefusedError(
                f"not revoking {listing} without confirmation; nothing was granted or revoked",
                f"pass --yes: rdc repo gpu grant {found.ref} {names} --exclusive --take-over --yes",
            )
        if not confirm_take_over(listing):
            raise click.Abort()
    return {(g.repo_id, g.device) for _, g in plan}


@click.command("revoke")
@click.argument("ref", metavar="REPO")
@click.option("--device", "devices", multiple=True, required=True, metavar="CDI-NAME", help=_DEVICE_HELP)
@click.option(
    "--stop",
    is_flag=True,
    help="Empty the repo: stop every running container of it (not only those that hold the device).",
)
@output_option("table", "json", "yaml")
def revoke(ref: str, devices: tuple[str, ...], stop: bool, fmt: str) -> None:
    """No container of REPO can start, restart, unpause or exec with a revoked device again, whoever
    starts it. Containers already running keep the device open until stopped: they are listed,
    and so are those whose processes hold the device's node by any path (a descriptor handed over,
    a hard link); without --stop the exit code is 12 while any still runs. A descriptor in flight
    (sent over a socket, not yet received) shows in no scan: until REPO runs nothing, an exclusive
    grant of the same hardware to another repo waits for it.

    --stop empties REPO: the revocation is written first, then no container of it may start while
    every running one is stopped, so nothing of it holds the device afterwards, in flight or not.
    A process outside any container refuses (exit 4) with `rdc repo down`. With --stop, a device
    REPO no longer holds is no error: REPO is emptied all the same.

    \b
    Examples:
      rdc repo gpu revoke gpu-a --device vendor.example/gpu=0
      rdc repo gpu revoke gpu-a --device vendor.example/gpu=0 --stop
      rdc repo gpu revoke gpu-a --device vendor.example/gpu=0 -o json | jq .holders
    """
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.plugins import get_plugins
    from rediacc_core.runtime.holdings import Holdings

    machine, found = resolve_ref(ref, Config.load())
    names = list(dict.fromkeys(devices))
    if stop:
        store = GrantStore(machine, get_plugins(), running=Holdings(machine))
        removed, emptied = store.revoke_emptying(found, devices)
        emit(
            {
                "repo": found.ref,
                "repoId": found.id,
                "revoked": [_grant_json(g) for g in removed],
                "holders": [{**h.to_json(), "stopped": True} for h in emptied.stopped],
                "openers": [],
            },
            fmt,
            lambda _: "",
        )
        for gone in removed:
            note(f"Revoked {gone.device} from {found.ref}.")
        for holder in emptied.stopped:
            held = holder.holds_any(names)
            which = f", which held {', '.join(held)}; it cannot start again without the grant" if held else ""
            note(f"Stopped container {holder.name}{which}.")
        note(
            f"Emptied {found.ref}: no container of it ran any more, so nothing of it holds "
            f"{', '.join(names)}, not even a descriptor in flight."
        )
        _slurm_follows(machine)
        return
    try:
        _revoke_and_report(machine, found, devices, names, fmt)
    finally:
        _slurm_follows(machine)


def _revoke_and_report(
    machine: Machine, found: Repo, devices: tuple[str, ...], names: list[str], fmt: str
) -> None:
    """A revoke without --stop: the grants go, and whoever still holds the devices is named."""
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.plugins import get_plugins
    from rediacc_core.runtime.holdings import (
        device_openers,
        nodes_of,
        openers_report,
        repo_holders,
        stop_command,
    )

    store = GrantStore(machine, get_plugins())
    removed = store.revoke(found, devices)
    holders = [h for h in repo_holders(machine, found) or () if h.holds_any(names)]
    # Whatever its container named, any process of the repo holding a node of the devices keeps them
    # (a descriptor passed over a socket, a hard link); nodes of names still granted do not count.
    nodes = nodes_of(machine, names, [g.device for g in store.for_repo(found.id)])  # in force now
    left = device_openers(machine, found, nodes)
    still = [h for h in holders if h.running]
    lines, commands = openers_report(machine, found, left)
    emit(
        {
            "repo": found.ref,
            "repoId": found.id,
            "revoked": [_grant_json(g) for g in removed],
            "holders": [{**h.to_json(), "stopped": False} for h in holders],
            "openers": [{"pid": o.pid, "container": o.container, "holds": o.describe()} for o in left],
        },
        fmt,
        lambda _: "",
    )
    for gone in removed:
        note(f"Revoked {gone.device} from {found.ref}.")
    for holder in holders:
        held = ", ".join(holder.holds_any(names))
        if holder.running:
            note(
                f"Container {holder.name} is {holder.state} with {held} and keeps it open until stopped: "
                f"{stop_command(holder)} (or rerun with --stop)."
            )
        else:
            note(
                f"Container {holder.name} ({holder.state}) holds {held}: "
                "it cannot start again without the grant."
            )
    for line in lines:
        note(f"Still held: {line}.")
    if left:
        note("To end them: " + " and ".join(commands) + " (or rerun with --stop).")
    if still or left:
        click.get_current_context().exit(EXIT_STATE)


@click.command("renew")
@click.argument("ref", metavar="REPO")
@click.option("--device", "devices", multiple=True, required=True, metavar="CDI-NAME", help=_DEVICE_HELP)
@click.option("--for", "duration", metavar="DURATION", help="The lease ends this long from now (8h, 1d).")
@click.option("--until", metavar="TIME", help=_UNTIL_HELP)
@click.option("--forever", is_flag=True, help="The grant no longer ends (until revoked).")
@output_option("table", "json", "yaml")
def renew(
    ref: str, devices: tuple[str, ...], duration: str | None, until: str | None, forever: bool, fmt: str
) -> None:
    """\b
    Examples:
      rdc repo gpu renew gpu-a --device vendor.example/gpu=0 --for 8h
      rdc repo gpu renew gpu-a --device vendor.example/gpu=0 --forever
    """
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.leases import expiry
    from rediacc_core.plugins import get_plugins

    expires_at = expiry(duration, until)
    if forever == (expires_at is not None):
        raise ValidationError("say when the grant ends", "give one of --for, --until or --forever")
    machine, found = resolve_ref(ref, Config.load())
    renewed = GrantStore(machine, get_plugins()).renew(found, devices, expires_at)
    emit(
        {"repo": found.ref, "repoId": found.id, "grants": [_grant_json(g) for g in renewed]},
        fmt,
        lambda _: "",
    )
    for grant_ in renewed:
        ends = f"until {grant_.expires_at}" if grant_.expires_at else "until revoked"
        note(f"{found.ref} holds {grant_.device} {ends}.")


@click.command("confirm")
@click.argument("ref", metavar="REPO")
@click.option("--device", "devices", multiple=True, required=True, metavar="CDI-NAME", help=_DEVICE_HELP)
@output_option("table", "json", "yaml")
def confirm(ref: str, devices: tuple[str, ...], fmt: str) -> None:
    """Setup suspends a grant whose name reaches other hardware than when it was granted (cards
    swapped), or whose exclusive reservation overlaps another repo's; `rdc repo gpu list` says
    why. Refused when accepting would overlap another repo's grant while one of them is exclusive.

    \b
    Examples:
      rdc repo gpu confirm gpu-a --device vendor.example/gpu=0
      rdc repo gpu confirm gpu-a --device vendor.example/gpu=0 -o json
    """
    from rediacc_core.plugins import get_plugins
    from rediacc_core.recheck import confirm_grants

    machine, found = resolve_ref(ref, Config.load())
    changes = confirm_grants(machine, get_plugins(), found, devices)
    emit(
        {"repo": found.ref, "repoId": found.id, "grants": [_grant_json(c.grant) for c in changes]},
        fmt,
        lambda _: "",
    )
    for change in changes:
        reached = ", ".join(u.text() for u in change.grant.bound_to or ()) or "no known hardware"
        note(f"{found.ref} holds {change.grant.device} again, bound to {reached}.")
    _slurm_follows(machine)


@click.command("list")
@click.argument("ref", metavar="REPO")
@output_option()
def list_grants(ref: str, fmt: str) -> None:
    """\b
    Examples:
      rdc repo gpu list gpu-a
      rdc repo gpu list gpu-a -o json
    """
    machine, found = resolve_ref(ref, Config.load())
    grants = [g for g in read_grants(machine) if g.repo_id == found.id]
    data = [_grant_json(g) for g in sorted(grants, key=lambda g: g.device)]

    states = {g.device: _state(g) for g in grants}

    def render(rows: list[dict[str, Any]]) -> str:
        return table(
            ["DEVICE", "EXCLUSIVE", "GRANTED AT", "EXPIRES", "STATE"],
            [
                [r["device"], r["exclusive"], r["grantedAt"], r["expiresAt"] or "-", states[r["device"]]]
                for r in rows
            ],
        )

    emit(data, fmt, render)
    if fmt == "table":
        for grant_ in sorted(grants, key=lambda g: g.device):
            if grant_.suspended is not None:
                note(
                    f"{suspension_text(grant_, found.ref)}; it reaches nothing until resolved: "
                    f"{suspension_advice(grant_, found.ref)}."
                )
    for ended in ended_leases(read_all(machine)):
        if ended.repo_id == found.id:  # a lease that ended within a day
            note(
                f"The lease of {ended.device} to {found.ref} ended at {ended.expires_at}; grant it anew: "
                f"rdc repo gpu grant {found.ref} --device {ended.device} --for 8h"
            )
    if is_slurm_node(machine):
        from rediacc_core.cli.repo_lease import lease_lines

        lease_lines(machine, found)
    if not grants and fmt == "table":
        note(f"{found.ref} has no GPU grants; add one with `rdc repo gpu grant {found.ref} --device <name>`.")


def _slurm_follows(machine: Machine) -> None:
    if is_slurm_node(machine):
        from rediacc_core.cli.repo_lease import slurm_follows

        slurm_follows(machine)
