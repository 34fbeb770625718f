"""What the machine's settings allow a repo (binds, capabilities, limits, registries, publishing),
and the context the core rules read it in."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rediacc_core.gate.policy import fetches, isolation, limits, mounts, publish, rules
from rediacc_core.gate.policy.pins import Pins
from rediacc_core.gate.wire.decode import Target
from rediacc_core.publishing import Policy, policy_from, short_id
from rediacc_core.repos import RepoStore, files_dir
from rediacc_core.values import split_list

if TYPE_CHECKING:
    from rediacc_core.machine import Machine
    from rediacc_core.repos import Repo


@dataclass(frozen=True)
class Allowances:
    """What the machine's settings allow, as the core rules read it."""

    binds: mounts.BindPolicy
    extra_capabilities: frozenset[str]
    pids_limit: int
    registries: frozenset[tuple[str, int | None]]
    publishing: Policy


class AllowanceReader:
    """The allowances of one repo under the settings it is handed, rebuilt only when they change."""

    def __init__(
        self,
        machine: Machine,
        repo: Repo,
        pins: Pins,
        image_config: Callable[[str], Mapping[str, Any] | None],
    ) -> None:
        self.machine = machine
        self.repo = repo
        self.pins = pins
        self.image_config = image_config
        self._cached: tuple[Mapping[str, Any], Allowances] | None = None
        self._published: publish.Published | None = None

    def rule_context(
        self, target: Target, settings: Mapping[str, Any], *, pinning: bool
    ) -> rules.RuleContext:
        """What the core rules need for this request: the bind roots and allowances of `settings`."""
        allowances = self.current(settings)
        policy = allowances.binds
        if pinning:
            policy = dataclasses.replace(policy, pins=self.pins)
        return rules.RuleContext(
            self.repo.ref,
            policy,
            allowances.extra_capabilities,
            target.query,
            api_version=target.api_version,
            pids_limit=allowances.pids_limit,
            registries=allowances.registries,
            published=self.published(allowances.publishing),
            image_config=self.image_config,
        )

    def published(self, policy: Policy) -> publish.Published:
        """What the publishing rules read: `policy`, and the keepers' state files of the machine.

        Kept while the policy is the same object: a `Published` is immutable and reads the state
        files only when a rule asks, so one serves every request under that policy."""
        known = self._published
        if known is None or known.policy is not policy:
            known = self._published = publish.Published(
                policy, self.machine.run_dir, short_id(self.repo.id), self._repo_named
            )
        return known

    def _repo_named(self, short: str) -> str:
        """The reference of the machine's repo whose id starts `short` (read only for a refusal)."""
        try:
            found = [r.label for r in RepoStore(self.machine).list() if short_id(r.id) == short]
        except Exception:  # a refusal must still be made when the repos file cannot be read
            found = []
        return f"{found[0]}@{self.repo.machine}" if found else f"with id {short}…"

    def current(self, settings: Mapping[str, Any]) -> Allowances:
        """What `settings` (the machine's, read live) allow."""
        cached = self._cached
        if cached is None or cached[0] is not settings:
            # Rebuilt only when the settings file changed (LiveSettings keeps the same mapping).
            cached = self._cached = (settings, self._from(settings))
        return cached[1]

    def _from(self, settings: Mapping[str, Any]) -> Allowances:
        roots = [mounts.Root(os.path.realpath(files_dir(self.machine, self.repo.id)), False)]
        for item in split_list(str(settings.get("bind-roots", ""))):
            path = item.removesuffix(":ro")
            if mounts.check_root_setting(path) is None:
                roots.append(mounts.Root(os.path.realpath(self.machine.path(path)), item.endswith(":ro")))
        policy = mounts.BindPolicy(
            files_dir=roots[0].path,
            roots=tuple(roots),
            never=mounts.never_paths(self.machine.path),
            volume_drivers=frozenset(split_list(str(settings.get("volume-drivers", "")))),
            pins=None,
        )
        extra = frozenset(
            map(isolation.capability_name, split_list(str(settings.get("extra-capabilities", ""))))
        )
        pids = str(settings.get("pids-limit", ""))
        return Allowances(
            binds=policy,
            extra_capabilities=extra,
            pids_limit=int(pids) if limits.check_pids_setting(pids) is None else limits.DEFAULT_PIDS_LIMIT,
            registries=fetches.parse_allowed(str(settings.get("registries", ""))),
            publishing=policy_from(settings),
        )
