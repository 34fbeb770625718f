"""The decision on a request's canonical body: its CDI names against the grants, the core and plugin
rules, the plugins' rewrites, and the pinning of the admitted bind sources."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rediacc_core.gate.decide.allowances import AllowanceReader
from rediacc_core.gate.decide.decision import Decision, Forward, Refuse, merge_refusals, refuse
from rediacc_core.gate.decide.grant_refusals import GrantRefusals
from rediacc_core.gate.decide.live_facts import LiveFacts
from rediacc_core.gate.policy import rules
from rediacc_core.gate.policy.endpoints import Route
from rediacc_core.gate.wire.decode import Target, copied, encode
from rediacc_core.model import ApiRequest, GateContext, Refusal, Rewrite

if TYPE_CHECKING:
    from rediacc_core.machine import Machine
    from rediacc_core.plugins import Plugins
    from rediacc_core.repos import Repo


class BodyDecider:
    """Decides the bodies of one repo's requests."""

    def __init__(
        self,
        machine: Machine,
        repo: Repo,
        plugins: Plugins,
        log: Callable[[str], None],
        facts: LiveFacts,
        allowances: AllowanceReader,
        refusals: GrantRefusals,
        pinning: bool,
    ) -> None:
        self.machine = machine
        self.repo = repo
        self.plugins = plugins
        self.log = log
        self.facts = facts
        self.allowances = allowances
        self.grant_refusals = refusals
        # False only for a decision that is never forwarded (`rdc repo check`): nothing is mounted.
        self.pinning = pinning

    def decide(self, method: str, target: Target, route: Route, canonical: Any) -> Decision:
        where = f"{method} {target.path}"
        endpoint = route.name
        version = target.api_version
        log: list[str] = []
        holder_key = route.devices_in
        cdi: tuple[str, ...] = ()
        if holder_key is not None and isinstance(canonical, dict):
            folded = rules.fold_compose_devices(canonical, holder_key)
            if folded:
                log.append(f"folded Compose devices into the CDI request: {', '.join(folded)}")
            cdi = rules.cdi_devices(canonical.get(holder_key) if holder_key else canonical)
        grants, grants_error = self.facts.read_grants()
        if grants_error:
            log.append(f"grants unreadable: {grants_error}")
        refusals = self.grant_refusals.grant_problems(cdi, grants, grants_error)
        # Each read once per decision: the health check, the rules and the plugins see one state.
        settings = self.facts.read_settings()
        inventory = self.facts.inventory()  # before the spec check, which compares what this read found
        if route.creates and cdi and not refusals:
            # Known now, so refused now: a start refused later leaves a container made for nothing.
            refusals += self.grant_refusals.checks.health_at_create(list(cdi), settings, inventory)
        stale = self.grant_refusals.stale_facts(cdi) if cdi else []
        if stale:  # no rule decides on the old facts, so none is asked (its answer would mislead)
            return refuse(where, refusals + stale, log, endpoint=endpoint, cdi=cdi)
        findings = route.findings(canonical, self.allowances.rule_context(target, settings, pinning=False))
        # Plugins are shown a copy, so nothing a plugin does to the body it is shown is forwarded.
        request = ApiRequest(
            method=method,
            path=target.path,
            query=target.query,
            body=copied(canonical),
            api_version=None if version is None else f"{version[0]}.{version[1]}",
            cdi_devices=cdi,
        )
        ctx = GateContext(
            repo_name=self.repo.label,
            repo_ref=self.repo.ref,
            machine=self.machine,
            grants=grants,
            inventory=inventory,
            settings=settings,
            image_config=self.allowances.image_config,
            log=self.log,
            in_the_way=self.grant_refusals.checks.in_the_way,
        )
        try:
            verdicts = self.plugins.request_rules(request, ctx)
        except Exception as exc:  # a broken plugin must not let a request through unchecked
            message = f"a gate rule failed, so the request is refused: {type(exc).__name__}: {exc}"
            return Refuse(500, message, log=(*log, f"500 {where}: {message}"))
        plugin_refusals = [v for v in verdicts if isinstance(v, Refusal)]
        rewrites = [v for v in verdicts if isinstance(v, Rewrite)]
        refusals += merge_refusals(findings, plugin_refusals)
        if refusals:
            return refuse(where, refusals, log, endpoint=endpoint, cdi=cdi)
        asked = cdi  # what the request named; rewrites may add names
        if rewrites:
            if not route.creates:
                log.extend(
                    f"rewrite ignored (only container create is rewritten): {r.description}" for r in rewrites
                )
            else:
                added = self._rewrite(canonical, rewrites, log)
                new = tuple(n for n in added if n not in cdi)
                problems = self.grant_refusals.grant_problems(new, grants, grants_error)
                if new and not cdi:
                    problems += self.grant_refusals.stale_facts(new)
                if problems:
                    return refuse(where, problems, log, endpoint=endpoint, cdi=cdi)
                cdi += new
        pin = route.pin
        if (
            self.pinning
            and pin is not None
            and isinstance(canonical, dict)
            and pin.names_host_paths(canonical)
        ):
            # Only now, with the request admitted, are bind sources pinned and rewritten.
            pinned = list(pin.pin(canonical, self.allowances.rule_context(target, settings, pinning=True)))
            if pinned:
                return refuse(where, [f.refusal for f in pinned], log, endpoint=endpoint, cdi=cdi)
        forwarded = encode(canonical)  # once: decoded once (canonicalise), changed in place, encoded once
        log.append(f"admitted {where}" + (f" with CDI devices {', '.join(cdi)}" if cdi else ""))
        return Forward(body=forwarded, log=tuple(log), endpoint=endpoint, cdi_asked=asked, cdi_admitted=cdi)

    @staticmethod
    def _rewrite(body: dict[str, Any], rewrites: list[Rewrite], log: list[str]) -> list[str]:
        """Apply the plugins' rewrites to `body` in place; the CDI names they added."""
        added: list[str] = []
        for rewrite in rewrites:
            log.append(f"rewrite: {rewrite.description}")
            if rewrite.remove_env and isinstance(body.get("Env"), list):
                drop = set(rewrite.remove_env)
                body["Env"] = [
                    e for e in body["Env"] if not (isinstance(e, str) and e.split("=", 1)[0] in drop)
                ]
            if rewrite.add_cdi_devices:
                host = body.get("HostConfig")
                if not isinstance(host, dict):
                    host = body["HostConfig"] = {}
                rules.add_cdi_devices(host, rewrite.add_cdi_devices)
                added.extend(rewrite.add_cdi_devices)
        return list(dict.fromkeys(added))
