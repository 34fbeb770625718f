"""`LiveGrants`: the machine's grants as the gate reads them, on every request."""

from __future__ import annotations

from rediacc_core.bindings import Reaches
from rediacc_core.files import LiveFile, StatKey
from rediacc_core.grants.records import Drain, Grant, GrantsFile, binding_drift, reachable, read_document
from rediacc_core.machine import Machine
from rediacc_core.repos import now_iso


class LiveGrants:
    """The machine's grants as the gate sees them, re-read only when the file changed.

    One `stat` per request is all an unchanged file costs (see `files.LiveFile`). A missing file means
    nothing was ever granted; an unreadable or corrupt one raises, so the gate fails closed.
    """

    def __init__(self, machine: Machine) -> None:
        self.path = machine.grants_path
        path = self.path

        def load() -> tuple[StatKey, GrantsFile] | None:
            return read_document(path)

        self._file: LiveFile[GrantsFile] = LiveFile(path, load, GrantsFile(), "grants file")
        # The drifted grants of the last (grants, inventory) pair, by (repo id, name): both readers
        # hand out the same objects until their file changes, so a request pays a dict lookup.
        self._drifted: tuple[tuple[Grant, ...], Reaches, dict[tuple[str, str], str]] | None = None

    @property
    def cache_key(self) -> StatKey | None:
        return self._file.cache_key

    @property
    def reads(self) -> int:
        """How many times the file was parsed (tests check it is not re-read needlessly)."""
        return self._file.reads

    def grants(self) -> tuple[Grant, ...]:
        return self._file.get().grants

    def draining(self, repo_id: str) -> Drain | None:
        """The drain mark of `repo_id` in force now: while it holds, no container of the repo may start."""
        stamp = now_iso()
        return next(
            (d for d in self._file.get().draining if d.repo_id == repo_id and d.in_force(stamp)), None
        )

    def for_repo(self, repo_id: str, reaches: Reaches | None = None) -> frozenset[str]:
        """The names granted to `repo_id` that a container may reach now: a lease that has ended, or
        a grant setup suspended, is absent at once; with `reaches` (what each name reaches in the
        inventory the gate decides on), so is a grant whose recorded hardware is not that."""
        grants = self.grants()
        drifted = self.drifted(grants, reaches) if reaches else {}
        return frozenset(
            g.device for g in reachable(grants) if g.repo_id == repo_id and (repo_id, g.device) not in drifted
        )

    def drifted(self, grants: tuple[Grant, ...], reaches: Reaches) -> dict[tuple[str, str], str]:
        """Every grant of `grants` whose recorded hardware is not what its name reaches in
        `reaches`, by (repo id, name), with how (`records.binding_drift`)."""
        cached = self._drifted
        if cached is not None and cached[0] is grants and cached[1] is reaches:
            return cached[2]
        found: dict[tuple[str, str], str] = {}
        for grant in grants:
            how = binding_drift(grant, reaches)
            if how is not None:
                found[(grant.repo_id, grant.device)] = how
        self._drifted = (grants, reaches, found)
        return found

    def exclusive_for_repo(self, repo_id: str) -> frozenset[str]:
        return frozenset(g.device for g in reachable(self.grants()) if g.repo_id == repo_id and g.exclusive)
