"""Freeing a repo's hardware: the one place hardware leaves a repo, for every path that takes it
(`rdc repo gpu revoke --stop`, an exclusive grant's `--stop-holders` and `--take-over`, a lease's
end under `lease-end=stop`).

The rule: **hardware leaves a repo only when every process that could hold it is gone.** No scan
can show every holder: a descriptor sent over a Unix socket and not yet received lives in the
socket's queue, in no fd table and no memory map (/proc has no view of files in flight). What
bounds it is where it can go: a descriptor travels only between processes of the same repo (repos
share no filesystem or namespace, and the Engine API passes no descriptors to the repo's daemon),
and it dies with the last process that holds it, in an fd table or in the queue of a socket that
process owns. So once no process of the repo runs, nothing of it holds the hardware, and a
container started later has nobody to receive a descriptor from.

Emptying a repo, all under the machine's state lock:
1. one write: the revocations, and a drain mark for each repo to empty. From then on its gate and
   its runtime guard refuse every start of any of its containers (start, restart, unpause, exec,
   builds; runc create, exec, resume), so the set of its running containers only shrinks;
2. every running, paused or restarting container of the repo is stopped, and the list read again
   until none runs (within `EMPTY_TIMEOUT`);
3. a process of the repo outside any container (one that left its cgroup; not its daemon's
   runtime) refuses the handover: `rdc repo down` ends it;
4. one write: the drain marks lifted, the repo's residue cleared and, for a grant, the new grant.
A failure in 2 or 3 lifts the drain marks and keeps the revocations and the residue (what an
exclusive grant checks, below); nothing is granted. The drain mark is honoured at most until its
`until` (`records.DRAIN_BOUND`, longer than `EMPTY_TIMEOUT`), so an rdc that dies mid-way never
leaves a repo unable to start containers for good; the next write drops the stale mark.

Residue: a repo whose grant ended while it may still run processes (a revoke without `--stop`, a
lease's end, a take-over) may hold the hardware through a descriptor in flight. An exclusive grant
of overlapping hardware to another repo is refused while such a repo runs anything; with
`--stop-holders` or `--take-over` that repo is emptied first. A repo that runs nothing at the check
has its residue cleared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rediacc_core.errors import RdcError, RefusedError, StateError
from rediacc_core.grants.records import (
    DRAIN_BOUND,
    Drain,
    Grant,
    Residue,
    later_iso,
    read_all,
    read_grants,
    residue,
    write_grants,
)
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, now_iso

if TYPE_CHECKING:
    from rediacc_core.holders import Holder

ROUND_PAUSE = 0.5
EMPTY_TIMEOUT = 120.0  # seconds to empty the repos of one handover (stops run side by side)


class Emptier(Protocol):
    """What emptying a repo asks of the machine's running parts (`runtime.holdings.Holdings`)."""

    def running(self, repo: Repo) -> list[Holder]:
        """Every running, paused or restarting container of `repo` ([] when its daemon is down)."""

    def stop(self, holder: Holder) -> None: ...

    def outside(self, repo: Repo) -> list[str]:
        """The repo's processes outside any container, its daemon's runtime aside (descriptions)."""


@dataclass(frozen=True)
class Emptied:
    """What emptying did: the containers stopped, by repo."""

    stopped: tuple[Holder, ...] = ()


def empty_repos(
    machine: Machine,
    emptier: Emptier,
    repos: Sequence[Repo],
    *,
    revoke: Iterable[Grant] = (),
    why: str,
    then: Callable[[list[Grant]], list[Grant]] | None = None,
    check: Callable[[], None] | None = None,
    timeout: float = EMPTY_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
) -> Emptied:
    """Revoke `revoke`, empty `repos` and then write `then(grants in force)`, in that order; the
    caller holds the state lock. `check` runs once the repos are empty, before that last write
    (the visible scan of what still holds a node). StateError or RefusedError when a repo could not
    be emptied: its revocations stand, its drain mark is lifted, nothing of `then` is written."""
    taken = set(revoke)
    ids = {r.id for r in repos}
    stamp = now_iso()
    marks = [d for d in read_all(machine).draining if d.repo_id not in ids]
    marks += [Drain(r.id, stamp, later_iso(DRAIN_BOUND), why) for r in repos]
    write_grants(machine, [g for g in read_grants(machine) if g not in taken], drains=marks)
    try:
        deadline = clock() + timeout
        stopped: dict[str, Holder] = {}
        while True:
            stopped.update((c.id, c) for c in _stop_all(emptier, repos, deadline - clock(), clock))
            _nothing_outside(emptier, repos)
            # A start that passed the guard before the drain mark may show as running only now (the
            # daemon records it after runc starts it): look once more after the slow /proc scan.
            if not any(emptier.running(r) for r in repos):
                break
        if check is not None:
            check()
    except BaseException:
        lifted = [d for d in read_all(machine).draining if d.repo_id not in ids]
        write_grants(machine, read_grants(machine), drains=lifted)
        raise
    current = read_grants(machine)
    lifted = [d for d in read_all(machine).draining if d.repo_id not in ids]
    write_grants(machine, then(current) if then else current, drains=lifted, emptied=ids)
    return Emptied(tuple(stopped.values()))


def _stop_all(
    emptier: Emptier, repos: Sequence[Repo], timeout: float, clock: Callable[[], float]
) -> tuple[Holder, ...]:
    """Stop every running container of `repos` and look again until none runs (side by side: each
    stop may wait out its grace period)."""
    deadline = clock() + timeout
    stopped: dict[str, Holder] = {}
    problems: list[str] = []
    while True:
        left = [c for repo in repos for c in emptier.running(repo)]
        if not left:
            return tuple(stopped.values())
        if clock() > deadline:
            names = ", ".join(f"{c.name} of {c.repo.ref}" for c in left)
            raise StateError(
                f"could not empty {_refs(repos)} within {timeout:.0f} s: still running: {names}"
                + (f" ({'; '.join(dict.fromkeys(problems))})" if problems else "")
                + "; nothing was granted",
                " and ".join(f"`rdc repo down {r.ref}`" for r in repos)
                + " stops everything of it, then retry",
            )
        with ThreadPoolExecutor(max_workers=min(8, len(left))) as pool:
            outcomes = list(pool.map(lambda c: _try_stop(emptier, c), left))
        for container, problem in zip(left, outcomes, strict=True):
            if problem is None:
                stopped[container.id] = container
            else:
                problems.append(problem)
        if problems:
            time.sleep(ROUND_PAUSE)  # a stop that failed: give the daemon a moment before the next round


def _try_stop(emptier: Emptier, container: Holder) -> str | None:
    try:
        emptier.stop(container)
    except RdcError as exc:
        return exc.what
    return None


def _nothing_outside(emptier: Emptier, repos: Sequence[Repo]) -> None:
    """Refuse when a process of one of `repos` runs outside any container: `docker stop` cannot
    reach it, and it may hold anything the repo ever held."""
    found = {r.id: emptier.outside(r) for r in repos}
    lines = [f"{p}, outside any container of {r.ref}" for r in repos for p in found[r.id]]
    if lines:
        downs = " and ".join(f"`rdc repo down {r.ref}`" for r in repos if found[r.id])
        raise RefusedError(
            "; ".join(lines) + "; nothing was granted",
            f"`docker stop` cannot reach a process outside a container: run {downs}, then retry",
        )


def _refs(repos: Sequence[Repo]) -> str:
    return ", ".join(f"repo {r.ref}" for r in repos)


def runs_anything(emptier: Emptier, repo: Repo) -> list[str]:
    """What of `repo` runs now: its running containers and its processes outside any (descriptions)."""
    return [f"container {c.name} ({c.state})" for c in emptier.running(repo)] + emptier.outside(repo)


def residue_in_the_way(
    machine: Machine,
    emptier: Emptier,
    repo: Repo,
    reaches: Callable[[str], bool],
    owners: Mapping[str, Repo],
) -> tuple[dict[str, tuple[Repo, list[Residue], list[str]]], set[str]]:
    """The other repos with residue of hardware `reaches` accepts that run something now (by id:
    the repo, its residue, what runs), and the ids of those with such residue that run nothing
    (their residue may be cleared). Caller holds the state lock."""
    found: dict[str, list[Residue]] = {}
    for left in residue(read_all(machine)):
        if left.repo_id != repo.id and reaches(left.device):
            found.setdefault(left.repo_id, []).append(left)
    busy: dict[str, tuple[Repo, list[Residue], list[str]]] = {}
    idle: set[str] = set()
    for repo_id, residues in found.items():
        other = owners.get(repo_id)
        running = runs_anything(emptier, other) if other is not None else []
        if running and other is not None:
            busy[repo_id] = (other, residues, running)
        else:
            idle.add(repo_id)
    return busy, idle


def residue_text(other: Repo, residues: Sequence[Residue], running: Sequence[str]) -> str:
    """`repo alpha@m1 held vendor.example/gpu=0 until T (revoked) and still runs container y (running)`."""
    held = ", ".join(f"{r.device} until {r.ended} ({r.how})" for r in residues)
    return (
        f"repo {other.ref} held {held} and still runs {', '.join(running)}: one of its processes may "
        "hold the hardware through a descriptor no scan sees"
    )
