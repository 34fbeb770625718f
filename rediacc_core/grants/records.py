"""The grant records: the `Grant`, the grants file, and what reading it means at a moment.

The grants live in `<root>/etc/rediacc/gpu/grants.json`, replaced atomically and checked against
`schema/grants.schema.json` on every read. Writes happen under the machine's state lock (the
callers here take it, or say that their caller holds it).

A grant may be a lease (`expires_at`): from its end on it is absent for every reader (the gate, the
runtime guard, the checks) with no process needed to remove it; the next write drops it, keeping
for a day only what names it (`ended`: "the lease of … ended at …", never a grant). A suspended
grant (`suspended`, set by setup's re-check) stays in the file but reaches nothing. So does, for
the gate and the runtime guard, a grant whose recorded hardware (`bound_to`) is not what its name
reaches in the inventory they decide on (`binding_drift`), whatever wrote the grants file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rediacc_core.bindings import Binding, Suspension, binding_from_json, drift, suspension_from_json
from rediacc_core.errors import ValidationError
from rediacc_core.files import (
    StatKey,
    parse_json_checked,
    read_text_keyed,
    replace_watched_json,
    restore_hint,
)
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore, now_iso
from rediacc_core.statelock import state_lock

# Every `rdc` read, the gate and the runtime guard read grants: this module imports only what
# reading needs; granting's checks (the CDI registry, plugins) live in the modules beside it.

SCHEMA = "grants.schema.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Grant:
    """One CDI device name granted to one repo identity."""

    repo_id: str
    device: str
    exclusive: bool
    granted_at: str
    expires_at: str | None = None  # a lease's end (UTC, `...Z`); None: until revoked
    bound_to: Binding | None = None  # what the name reached when granted; None: an older file's grant
    suspended: Suspension | None = None
    job: str | None = None  # the scheduler's job the grant serves (`slurm:<cluster>/<job id>`)

    def in_force(self, now: str) -> bool:
        """False once a lease has ended by `now` (an rdc UTC stamp: text order is time order)."""
        return self.expires_at is None or self.expires_at > now


@dataclass(frozen=True)
class Drain:
    """A repo being emptied: no container of it may start until `until` (or until the mark is lifted)."""

    repo_id: str
    since: str
    until: str
    why: str  # what is being handed over, for the refusals' words

    def in_force(self, now: str) -> bool:
        return self.until > now


@dataclass(frozen=True)
class Residue:
    """Hardware `device` reached for `repo_id` until `ended`, which a process of it may still hold."""

    repo_id: str
    device: str
    ended: str
    how: str  # "revoked" or "lease-end"


@dataclass(frozen=True)
class EndedLease:
    """A lease of `device` to `repo_id` that ended at `expires_at`: named wherever a lease matters (a
    start, a renew, the GPU lists) for `ENDED_KEPT` after its end, then forgotten."""

    repo_id: str
    device: str
    expires_at: str


@dataclass(frozen=True)
class GrantsFile:
    """Everything the grants file holds, as read."""

    grants: tuple[Grant, ...] = ()
    draining: tuple[Drain, ...] = ()
    residue: tuple[Residue, ...] = ()
    ended: tuple[EndedLease, ...] = ()


DRAIN_BOUND = timedelta(minutes=10)  # the longest a drain mark is honoured (see `grants.release`)
ENDED_KEPT = timedelta(days=1)  # how long an ended lease is still named, once its grant left the file


def later_iso(delta: timedelta) -> str:
    """The rdc UTC stamp `delta` from this moment."""
    return (datetime.now(UTC) + delta).isoformat(timespec="seconds").replace("+00:00", "Z")


# --- the file ------------------------------------------------------------------------------------


def parse_grants(text: str, path: Path) -> list[Grant]:
    """The grants in a grants file's text; any problem is a ValidationError naming the file."""
    return list(parse_file(text, path).grants)


def parse_file(text: str, path: Path) -> GrantsFile:
    """A grants file's text, grants, drain marks and residue; any problem is a ValidationError."""
    document = parse_json_checked(text, path, SCHEMA, "grants file")
    grants = [
        Grant(
            entry["repoId"],
            entry["device"],
            entry["exclusive"],
            entry["grantedAt"],
            entry.get("expiresAt"),
            binding_from_json(entry["boundTo"]) if "boundTo" in entry else None,
            suspension_from_json(entry["suspended"]) if "suspended" in entry else None,
            entry.get("job"),
        )
        for entry in document["grants"]
    ]
    seen: set[tuple[str, str]] = set()
    for grant in grants:
        key = (grant.repo_id, grant.device)
        if key in seen:
            raise ValidationError(
                f"grants file {path} grants {grant.device} to repo {grant.repo_id} more than once",
                restore_hint(path),
            )
        seen.add(key)
    exclusive = {g.device: g.repo_id for g in grants if g.exclusive}
    for grant in grants:
        holder = exclusive.get(grant.device)
        if holder is not None and holder != grant.repo_id:
            # `rdc repo gpu grant` never writes this; a hand edit did, and the gate must not guess who wins.
            raise ValidationError(
                f"grants file {path} grants {grant.device} to repo {grant.repo_id} although repo {holder} "
                "holds it exclusively",
                restore_hint(path),
            )
    draining = tuple(
        Drain(d["repoId"], d["since"], d["until"], d["why"]) for d in document.get("draining", ())
    )
    residue = tuple(
        Residue(r["repoId"], r["device"], r["ended"], r["how"]) for r in document.get("residue", ())
    )
    ended = tuple(EndedLease(e["repoId"], e["device"], e["ended"]) for e in document.get("ended", ()))
    return GrantsFile(tuple(grants), draining, residue, ended)


def read_file(path: Path) -> tuple[StatKey, list[Grant]] | None:
    """The file's identity and grants, both taken from the same open file; None when there is none."""
    found = read_document(path)
    return None if found is None else (found[0], list(found[1].grants))


def read_document(path: Path) -> tuple[StatKey, GrantsFile] | None:
    """The file's identity and all it holds, taken from the same open file; None when there is none."""
    found = read_text_keyed(path, "grants file")
    return None if found is None else (found[0], parse_file(found[1], path))


def read_all(machine: Machine) -> GrantsFile:
    """All the grants file holds, ended leases included; empty when there is none."""
    found = read_document(machine.grants_path)
    return GrantsFile() if found is None else found[1]


def draining(machine: Machine, repo_id: str, *, now: str | None = None) -> Drain | None:
    """The drain mark of `repo_id` in force at `now`, or None."""
    stamp = now or now_iso()
    return next((d for d in read_all(machine).draining if d.repo_id == repo_id and d.in_force(stamp)), None)


def residue(found: GrantsFile, now: str | None = None) -> list[Residue]:
    """What the repos of `found` may still hold of hardware their grants no longer reach: the residue
    recorded, and the leases that have ended but are still in the file (the next write records them)."""
    stamp = now or now_iso()
    ended = [
        Residue(g.repo_id, g.device, g.expires_at or stamp, "lease-end")
        for g in found.grants
        if not g.in_force(stamp)
    ]
    return list(found.residue) + ended


def in_force(grants: Iterable[Grant], now: str | None = None) -> list[Grant]:
    """The grants of `grants` in force at `now` (default this moment): the one place a lease that
    has ended stops counting, for every reader (rdc, the gate, housekeeping)."""
    stamp = now or now_iso()
    return [g for g in grants if g.in_force(stamp)]


def reachable(grants: Iterable[Grant], now: str | None = None) -> list[Grant]:
    """The grants of `grants` a container may reach at `now`: in force, and not suspended by
    setup's re-check (the gate, the lease-end housekeeping; the runtime guard reads the same)."""
    return [g for g in in_force(grants, now) if g.suspended is None]


def binding_drift(grant: Grant, reaches: Mapping[str, Binding]) -> str | None:
    """How what `grant`'s name reaches in an inventory (`reaches`, as setup or refresh recorded it)
    differs from the hardware the grant recorded, in words; None when it is the same hardware, or
    when either is not recorded (a grant or an inventory of an older rdc: today's behaviour)."""
    now = reaches.get(grant.device)
    if grant.bound_to is None or now is None:
        return None
    return drift(grant.bound_to, now)


def read_grants(machine: Machine, *, now: str | None = None) -> list[Grant]:
    """Every grant in force on the machine (at `now`, default this moment); [] when none."""
    found = read_file(machine.grants_path)
    return [] if found is None else in_force(found[1], now)


def suspended_grant(machine: Machine, repo_id: str, device: str) -> Grant | None:
    """The repo's grant of `device` when it is in force but suspended; None otherwise."""
    return next(
        (g for g in read_grants(machine) if g.repo_id == repo_id and g.device == device and g.suspended),
        None,
    )


def confirm_command(repo_ref: str, device: str) -> str:
    return f"rdc repo gpu confirm {repo_ref} --device {device}"


def suspension_text(grant: Grant, repo_ref: str) -> str:
    """`the grant of vendor.example/gpu=0 to repo R is suspended since T: <drift>` (refusals, lists)."""
    held = grant.suspended
    if held is None:
        return ""
    return f"the grant of {grant.device} to repo {repo_ref} is suspended since {held.since}: {held.drift}"


def suspension_advice(grant: Grant, repo_ref: str) -> str:
    """The commands that resolve a suspension, runnable as printed."""
    revoke = f"rdc repo gpu revoke {repo_ref} --device {grant.device}"
    if grant.suspended is not None and grant.suspended.reason == "vanished":
        return f"no spec defines it any more: `{revoke}`, or run setup so a spec defines it again"
    confirm = confirm_command(repo_ref, grant.device)
    return f"to accept the hardware it reaches now: `{confirm}`; or `{revoke}`"


def ended_leases(found: GrantsFile, now: str | None = None) -> list[EndedLease]:
    """The leases that have ended: those whose grant the file still records (however long ago), and
    those moved to `ended` by a write within `ENDED_KEPT` of their end; latest per repo and name,
    none that was granted again since."""
    stamp = now or now_iso()
    since = _earlier_iso(stamp, ENDED_KEPT)
    again = {(g.repo_id, g.device) for g in found.grants if g.in_force(stamp)}
    candidates = [
        *(e for e in found.ended if e.expires_at > since),
        *(
            EndedLease(g.repo_id, g.device, g.expires_at)
            for g in found.grants
            if g.expires_at is not None and not g.in_force(stamp)
        ),
    ]
    latest: dict[tuple[str, str], EndedLease] = {}
    for lease in candidates:
        key = (lease.repo_id, lease.device)
        if key not in again and (key not in latest or latest[key].expires_at < lease.expires_at):
            latest[key] = lease
    return sorted(latest.values(), key=lambda e: (e.repo_id, e.device))


def ended_lease(machine: Machine, repo_id: str, device: str, *, now: str | None = None) -> EndedLease | None:
    """The repo's lease of `device` that ended within a day (`ended_leases`); None when there is none."""
    return next(
        (e for e in ended_leases(read_all(machine), now) if e.repo_id == repo_id and e.device == device), None
    )


def _earlier_iso(stamp: str, delta: timedelta) -> str:
    # fromisoformat, not strptime: strptime's first call costs every read of the grants a millisecond.
    moment = datetime.fromisoformat(stamp.removesuffix("Z")).replace(tzinfo=UTC)
    return (moment - delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_grants(
    machine: Machine,
    grants: Sequence[Grant],
    *,
    drains: Sequence[Drain] | None = None,
    emptied: Iterable[str] = (),
) -> None:
    """Replace the grants file; caller holds the state lock.

    Every grant of the file as it was that `grants` lacks (revoked, dropped, a lease that ended)
    becomes residue of its repo, unless its repo is among `emptied` (repo ids that run nothing now:
    their residue goes). `drains` replaces the drain marks (None: those in force are kept)."""
    stamp = now_iso()
    old = read_all(machine)
    gone = set(emptied)
    kept = {(g.repo_id, g.device) for g in grants}
    left = [r for r in old.residue if r.repo_id not in gone]
    for g in old.grants:
        if (g.repo_id, g.device) in kept or g.repo_id in gone:
            continue
        ended = not g.in_force(stamp)
        left.append(
            Residue(
                g.repo_id,
                g.device,
                (g.expires_at or stamp) if ended else stamp,
                "lease-end" if ended else "revoked",
            )
        )
    unique = list({(r.repo_id, r.device): r for r in left}.values())
    # An ended lease's grant leaves the file; what names it stays for a day after its end.
    day = _earlier_iso(stamp, ENDED_KEPT)
    lapsed = [e for e in ended_leases(old, stamp) if (e.repo_id, e.device) not in kept and e.expires_at > day]
    marks = [d for d in (old.draining if drains is None else drains) if d.in_force(stamp)]
    document = {
        "schemaVersion": SCHEMA_VERSION,
        **(
            {
                "draining": [
                    {"repoId": d.repo_id, "since": d.since, "until": d.until, "why": d.why} for d in marks
                ]
            }
            if marks
            else {}
        ),
        **(
            {
                "residue": [
                    {"repoId": r.repo_id, "device": r.device, "ended": r.ended, "how": r.how} for r in unique
                ]
            }
            if unique
            else {}
        ),
        **(
            {"ended": [{"repoId": e.repo_id, "device": e.device, "ended": e.expires_at} for e in lapsed]}
            if lapsed
            else {}
        ),
        "grants": [
            {
                "repoId": g.repo_id,
                "device": g.device,
                "exclusive": g.exclusive,
                "grantedAt": g.granted_at,
                **({"expiresAt": g.expires_at} if g.expires_at is not None else {}),
                **({"boundTo": [u.to_json() for u in g.bound_to]} if g.bound_to is not None else {}),
                **({"suspended": g.suspended.to_json()} if g.suspended is not None else {}),
                **({"job": g.job} if g.job is not None else {}),
            }
            for g in grants
        ],
    }
    replace_watched_json(machine.grants_path, document)  # LiveGrants must see every write as a change
    from rediacc_core import telemetry  # late: only a write exports; every read imports this module

    telemetry.export(machine, [g for g in grants if g.in_force(stamp)])  # best effort, see telemetry


def drop_repo_grants(machine: Machine, repo_id: str) -> int:
    """Remove every grant of `repo_id`; the caller holds the state lock. Returns how many went."""
    grants = read_grants(machine)
    kept = [g for g in grants if g.repo_id != repo_id]
    if len(kept) != len(grants) or any(r.repo_id == repo_id for r in read_all(machine).residue):
        # A repo is deleted only when nothing of it runs (`rdc repo delete`): it leaves no residue.
        write_grants(machine, kept, emptied=[repo_id])
    return len(grants) - len(kept)


def delete_repo(machine: Machine, repo: Repo, *, lock_timeout: float | None = None) -> int:
    """Delete the repo and its grants (all under one lock); returns how many grants went with it."""
    return RepoStore(machine, lock_timeout=lock_timeout).delete(repo, drop_repo_grants)


def prune_orphans(machine: Machine, *, lock_timeout: float | None = None) -> list[Grant]:
    """Remove the grants of repos that no longer exist on the machine; returns what went.

    A repo deleted by hand from repos.json (or by an older rdc) leaves them behind, still reserving
    hardware when exclusive.
    """
    with state_lock(machine, lock_timeout):
        known = {repo.id for repo in RepoStore(machine).list()}
        grants = read_grants(machine)
        orphans = [g for g in grants if g.repo_id not in known]
        if orphans:
            # Nothing can ask a repo that is gone what it runs: its residue goes with its grants.
            gone = {g.repo_id for g in orphans}
            write_grants(machine, [g for g in grants if g.repo_id in known], emptied=gone)
    return orphans
