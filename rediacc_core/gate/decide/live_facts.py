"""What a gate decides on, read live: the repo's grants, the machine's settings and inventory.

A repo's granted names are those in force, not suspended, and whose recorded hardware (`bound_to`)
is what the name reaches in the inventory the gate decides on (its devices' `reaches`), whoever
wrote the grants file: a hand edit, an older rdc, a writer of facts that forgot the re-check."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rediacc_core.errors import RdcError
from rediacc_core.grants.live import LiveGrants
from rediacc_core.grants.records import Grant, binding_drift, reachable, read_grants
from rediacc_core.inventory import LiveInventory
from rediacc_core.model import Inventory
from rediacc_core.settings import LiveSettings
from rediacc_core.spec_facts import SpecAge

if TYPE_CHECKING:
    from rediacc_core.bindings import Reaches
    from rediacc_core.machine import Machine
    from rediacc_core.repos import Repo

GrantsReader = Callable[[str], frozenset[str]]
InventoryReader = Callable[[], Inventory | None]
SettingsReader = Callable[[], Mapping[str, str]]
SpecAgeReader = Callable[[], str | None]
ReachesReader = Callable[[], "Reaches | None"]


DrainReader = Callable[[str], str | None]


class _LiveGrantsReader:
    """The repo's grants and drain mark from the machine's grants file (`grants.live.LiveGrants`:
    thread-safe, one `stat` when unchanged), its grants held to what each name reaches now.
    Building it reads nothing: a grants file that cannot be read fails only the reads, closed."""

    def __init__(self, machine: Machine, reaches: ReachesReader) -> None:
        self._live = LiveGrants(machine)
        self._reaches = reaches

    def grants(self, repo_id: str) -> frozenset[str]:
        return self._live.for_repo(repo_id, self._reaches())

    def drain(self, repo_id: str) -> str | None:
        mark = self._live.draining(repo_id)
        return None if mark is None else f"{mark.why} (since {mark.since}, at most until {mark.until})"


class _LiveInventoryReader:
    """The machine inventory for the rules: `inventory.LiveInventory` (thread-safe, one `stat` when
    unchanged), with an unreadable file logged once per distinct problem and seen as none."""

    def __init__(self, machine: Machine, log: Callable[[str], None]) -> None:
        self._live = LiveInventory(machine)
        self._log = log
        self._error: str | None = None
        # The specs the inventory was built from, as the last read found them: the spec check
        # of a decision uses the read its rules use, at no further `stat`.
        self._specs: list[dict[str, Any]] | None = None
        self._reaches: Reaches | None = None
        self.spec_age = SpecAge(machine, lambda: self._specs)
        # Within a decision (`begin` to `end`, per thread: workers decide side by side), the first
        # read is every later one's: the grants' check, the rules and the spec check see one state
        # at one `stat`.
        self._decision = threading.local()

    def begin(self) -> None:
        self._decision.read = None

    def end(self) -> None:
        self._decision.read = _NOT_DECIDING

    def stale(self) -> str | None:
        """Why the inventory as it is now is older than the specs (`spec_facts.SpecAge`), or None.
        Read first: a start check may come before any rule read the inventory (one `stat` when
        unchanged), and a refresh must be seen at once."""
        self()
        return self.spec_age.check()

    def reaches(self) -> Reaches | None:
        """What each name reaches in the inventory as it is now (one `stat` when unchanged); None
        when there is none, it is unreadable (logged) or it records nothing of it (an older rdc's)."""
        self()
        return self._reaches

    def __call__(self) -> Inventory | None:
        held: tuple[Inventory | None] | None = getattr(self._decision, "read", _NOT_DECIDING)
        if held is _NOT_DECIDING:
            return self._read()
        if held is None:
            held = self._decision.read = (self._read(),)
        return held[0]

    def _read(self) -> Inventory | None:
        try:
            value, self._specs, self._reaches = self._live.read()
        except RdcError as exc:
            self._specs = self._reaches = None
            if exc.what != self._error:
                self._error = exc.what
                self._log(f"inventory unreadable, rules see none: {exc.what}")
            return None
        self._error = None
        return value


# The thread is outside a decision: every read reads (a value no read returns).
_NOT_DECIDING: tuple[Inventory | None] = (None,)


def _nothing() -> None:
    return None


def _same_age() -> str | None:
    return None


def _no_reaches() -> Reaches | None:
    return None


class LiveFacts:
    """The grants, settings and inventory of one repo's gate, each read live and failing closed.

    A reader handed in (unit tests, the demo) is used as given; the others read the machine's
    files, each built here, when the gate starts (building one reads nothing).
    """

    def __init__(
        self,
        machine: Machine,
        repo: Repo,
        log: Callable[[str], None],
        *,
        grants: GrantsReader | None = None,
        inventory: InventoryReader | None = None,
        spec_age: SpecAgeReader | None = None,
        settings: SettingsReader | None = None,
        drain: DrainReader | None = None,
    ) -> None:
        self.machine = machine
        self.repo = repo
        self.log = log
        live = None
        if inventory is None:
            live = _LiveInventoryReader(machine, log)
            inventory = live
        self.inventory: InventoryReader = inventory
        # Why the inventory's facts are older than the specs the daemon injects from, or None. A
        # caller that hands the inventory in (unit tests, the demo) decides on it as given.
        self.spec_age: SpecAgeReader = spec_age or (live.stale if live else _same_age)
        # What each name reaches in that inventory, which a grant's recorded hardware must be: a
        # handed-in inventory is decided on as given, so its grants are not compared.
        self.reaches: ReachesReader = live.reaches if live else _no_reaches
        files = _LiveGrantsReader(machine, self.reaches)
        self.grants: GrantsReader = grants or files.grants
        self.drain: DrainReader = drain or files.drain
        self.settings: SettingsReader = settings or LiveSettings(machine).settings
        self._settings_error: str | None = None
        # A decision's bounds, for the one inventory read it makes (`_LiveInventoryReader`).
        self.begin: Callable[[], None] = live.begin if live else _nothing
        self.end: Callable[[], None] = live.end if live else _nothing

    def read_grants(self) -> tuple[frozenset[str], str | None]:
        """The repo's granted names, and why they could not be read (then none), or None."""
        try:
            return self.grants(self.repo.id), None
        except Exception as exc:  # whatever went wrong, device requests fail closed and say why
            why = exc.what if isinstance(exc, RdcError) else f"{type(exc).__name__}: {exc}"
            return frozenset(), why

    def read_drain(self) -> str | None:
        """Why the repo is being emptied (a handover of hardware in progress), or None.

        An unreadable grants file counts as no drain: rdc cannot complete a handover while it cannot
        read the file either, and requests without devices must still be served."""
        try:
            return self.drain(self.repo.id)
        except Exception:
            return None

    def moved(self, name: str) -> tuple[Grant, str] | None:
        """The repo's grant of `name` (in force, not suspended) when what the name reaches in the
        inventory is not the hardware it recorded, with how; None otherwise. For a refusal's words:
        the refusal itself is `read_grants` leaving the name out."""
        reaches = self.reaches()
        if not reaches:
            return None
        for grant in reachable(read_grants(self.machine)):
            if grant.repo_id == self.repo.id and grant.device == name:
                how = binding_drift(grant, reaches)
                return None if how is None else (grant, how)
        return None

    def read_settings(self) -> Mapping[str, str]:
        """The machine's settings, read live (one `stat` when unchanged).

        Unreadable settings mean the defaults, and every default is the safe choice (see
        `rediacc_core.settings`): refusing what a setting would have admitted is failing closed. Said
        in the log once per distinct problem, not for every request.
        """
        try:
            settings = self.settings()
        except Exception as exc:
            why = exc.what if isinstance(exc, RdcError) else f"{type(exc).__name__}: {exc}"
            if why != self._settings_error:
                self._settings_error = why
                self.log(f"settings unreadable, deciding with the defaults: {why}")
            return {}
        if self._settings_error is not None:
            self._settings_error = None
            self.log("settings readable again")
        return settings
