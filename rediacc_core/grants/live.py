"""`LiveGrants`: the machine's grants as the gate reads them, on every request."""

from __future__ import annotations

from rediacc_core.files import LiveFile, StatKey
from rediacc_core.grants.records import Grant, reachable, read_file
from rediacc_core.machine import Machine


class LiveGrants:
    """The machine's grants as the gate sees them, re-read only when the file changed.

    One `stat` per request is all an unchanged file costs (see `files.LiveFile`). A missing file means
    nothing was ever granted; an unreadable or corrupt one raises, so the gate fails closed.
    """

    def __init__(self, machine: Machine) -> None:
        self.path = machine.grants_path
        path = self.path

        def load() -> tuple[StatKey, tuple[Grant, ...]] | None:
            found = read_file(path)
            return None if found is None else (found[0], tuple(found[1]))

        self._file: LiveFile[tuple[Grant, ...]] = LiveFile(path, load, (), "grants file")

    @property
    def cache_key(self) -> StatKey | None:
        return self._file.cache_key

    @property
    def reads(self) -> int:
        """How many times the file was parsed (tests check it is not re-read needlessly)."""
        return self._file.reads

    def grants(self) -> tuple[Grant, ...]:
        return self._file.get()

    def for_repo(self, repo_id: str) -> frozenset[str]:
        """The names granted to `repo_id` that a container may reach now: a lease that has ended, or
        a grant setup suspended, is absent at once."""
        return frozenset(g.device for g in reachable(self.grants()) if g.repo_id == repo_id)

    def exclusive_for_repo(self, repo_id: str) -> frozenset[str]:
        return frozenset(g.device for g in reachable(self.grants()) if g.repo_id == repo_id and g.exclusive)
