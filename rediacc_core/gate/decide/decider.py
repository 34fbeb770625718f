"""The gate's decision for one Docker API request: forward (canonical body), refuse, or answer.

Each check is the one the request's route record names (`endpoints.Route`: its rule, pinning,
start checks, view); nothing here decides by a route's name. Order matters and is fixed: route
through the endpoint allow-list (`endpoints.py`: unknown and refused routes end here, from the head
alone, and so do the query rules of `/build` and the fetching routes) -> a read the gate answers
itself is asked of the daemon and seen through its route's view -> for a request that makes a
container run, the names the container holds against the grants in force now -> decode into
the canonical body (400 on anything ambiguous) -> fold Compose's legacy CDI `Devices` into the CDI
device request -> check the requested CDI names against the repo's live grants (and, for a request
that makes a container run, the names the container already holds) -> core rules, then plugin
rules, merged on `(rule, subject)` (a plugin refusal replaces the core's about the same value) ->
refuse with every problem and its replacement, or apply the plugins' rewrites, check the names they
added against the grants, pin the admitted bind sources (`pins.py`) and forward the re-encoded body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rediacc_core.gate import buildkit
from rediacc_core.gate.buildkit import Verdict
from rediacc_core.gate.buildkit.llb import BuildPolicy
from rediacc_core.gate.decide import start_checks
from rediacc_core.gate.decide.allowances import AllowanceReader
from rediacc_core.gate.decide.answers import answer
from rediacc_core.gate.decide.body import BodyDecider
from rediacc_core.gate.decide.containers import ContainerLookup
from rediacc_core.gate.decide.decision import Decision, Forward, Refuse, merge_refusals, refuse
from rediacc_core.gate.decide.grant_refusals import GrantRefusals
from rediacc_core.gate.decide.health_check import HealthReader, live_health
from rediacc_core.gate.decide.live_facts import (
    GrantsReader,
    InventoryReader,
    LiveFacts,
    SettingsReader,
    SpecAgeReader,
)
from rediacc_core.gate.decide.start_checks import StartChecks
from rediacc_core.gate.policy import mounts, publish
from rediacc_core.gate.policy.endpoints import UNKNOWN_INSTEAD, Resolved, Route, path_id, resolve
from rediacc_core.gate.policy.pins import Pins
from rediacc_core.gate.policy.pins import directory_for as pins_directory
from rediacc_core.gate.wire.decode import (
    MAX_INSPECTED_BODY,
    MIN_API_VERSION,
    BadRequest,
    Target,
    canonicalise,
    check_content_type,
    parse_target,
)
from rediacc_core.health import LiveHealth
from rediacc_core.model import Refusal
from rediacc_core.publishing import Policy
from rediacc_core.repos import repo_state_dir

if TYPE_CHECKING:
    from rediacc_core.machine import Machine
    from rediacc_core.plugins import Plugins
    from rediacc_core.repos import Repo

__all__ = [
    "MAX_INSPECTED_BODY",
    "BadRequest",
    "Decider",
    "Decision",
    "Target",
    "merge_refusals",
    "parse_target",
]


class Decider:
    """Decides the requests of one repo's gate. Thread-safe for concurrent `decide` calls.

    A facade: the live facts (`live_facts`), the allowances of the settings (`allowances`), the
    start checks (`start_checks`), the grant refusals (`grant_refusals`) and the body decision
    (`body`) are its parts, each built here, when the gate starts, and handed what it reads. A
    request is decided on its route as `resolve` found it once (target parsed, route matched):
    the fields of that record say which checks it gets, so nothing here parses the target again or
    looks at a route's name.
    """

    def __init__(
        self,
        machine: Machine,
        repo: Repo,
        plugins: Plugins,
        image_config: Callable[[str], Mapping[str, Any] | None],
        log: Callable[[str], None],
        *,
        grants: GrantsReader | None = None,
        inventory: InventoryReader | None = None,
        spec_age: SpecAgeReader | None = None,
        settings: SettingsReader | None = None,
        pins: Pins | None = None,
        containers: ContainerLookup | None = None,
        upstream: Path | None = None,
        pinning: bool = True,
        health: HealthReader | None = None,
        in_the_way: Callable[[str], str | None] | None = None,
    ) -> None:
        self.machine = machine
        self.repo = repo
        self.plugins = plugins
        self.log = log
        self.facts = LiveFacts(
            machine, repo, log, grants=grants, inventory=inventory, spec_age=spec_age, settings=settings
        )
        self.upstream = upstream  # the repo daemon's socket, for the answers the gate makes (`answers`)
        # Pinning is on unless a caller opts out: an unpinned bind can be swapped before it is mounted.
        if pins is None:
            index = repo_state_dir(machine, repo.id) / "pins.json"
            pins = Pins(pins_directory(machine.run_dir, repo.id), index)
        self.pins = pins
        self.allowances = AllowanceReader(machine, repo, pins, image_config)
        # Why this repo could not be granted a name now (another repo's exclusive grant), or None:
        # for the advice of every refusal that names one.
        self.in_the_way = in_the_way or partial(start_checks.in_the_way, machine, plugins, repo)
        self.start_checks = StartChecks(
            machine,
            repo,
            plugins,
            self.facts,
            self.allowances,
            health or live_health(machine, plugins, self.facts.inventory, log),
            health or LiveHealth(machine).unhealthy,
            containers,
            self.in_the_way,
        )
        refusals = GrantRefusals(machine, repo, self.facts, self.start_checks)
        self.body = BodyDecider(machine, repo, plugins, log, self.facts, self.allowances, refusals, pinning)

    # --- what to read ---------------------------------------------------------------------------
    def resolve(self, method: str, raw_target: str) -> Resolved:
        """The request's target parsed and its route found, once: what the other steps take."""
        return resolve(method, raw_target)

    def inspects(self, request: Resolved) -> bool:
        """Must the body be read and decided? True for bad targets too, so they get their 400."""
        if request.target is None:
            return True
        route = request.route
        return route is not None and route.action == "inspect"

    def remembers(self, request: Resolved) -> bool:
        """May the answers of `head` and `inspects` for this target be remembered? Not for routes
        decided by their query, whose answer also depends on the machine's settings (`registries`),
        nor for routes that run a process or a build, whose answer depends on the drain mark."""
        if request.target is None:
            return True
        route = request.route
        return route is None or not (route.action == "query" or route.runs or route.builds)

    def head(self, request: Resolved) -> Decision | None:
        """The refusal of a request from its head alone (a route refused whole, an unknown route, or
        query parameters of `/build` and the fetching routes), or None when the head passes. Depends
        on nothing but its arguments, the machine's settings (routes decided by their query) and the
        repo's drain mark (routes that run a process or a build)."""
        if request.target is None:
            return None  # read and answered 400 by `decide`
        return self._head(request.method, request.target, request.route)

    def _head(self, method: str, target: Target, route: Route | None) -> Decision | None:
        where = f"{method} {target.path}"
        if route is None:
            refusal = Refusal(
                message=f"{where} is not an endpoint the gate knows, so it is refused",
                replacement=UNKNOWN_INSTEAD,
                rule="endpoint",
            )
            return refuse(where, [refusal], endpoint="unknown")
        if route.action == "refuse":
            refusal = Refusal(message=f"{where}: {route.why}", replacement=route.instead, rule="endpoint")
            return refuse(where, [refusal], endpoint=route.pattern)
        if route.runs or route.builds:
            drained = self._drained(where)
            if drained is not None:
                return refuse(where, [drained], endpoint=route.name or route.pattern)
        if route.action == "query":
            context = self.allowances.rule_context(target, self.facts.read_settings(), pinning=False)
            context = dataclasses.replace(context, name=path_id(route, target.path, "{name}"))
            findings = route.findings(None, context)
            if findings:
                return refuse(where, [f.refusal for f in findings], endpoint=route.name)
        return None

    def _drained(self, where: str) -> Refusal | None:
        """While hardware is being handed over from this repo (`grants.release`), no container of it
        may start, whatever it holds: one running could take over a descriptor in flight."""
        why = self.facts.read_drain()
        if why is None:
            return None
        return Refusal(
            message=f"{where}: repo {self.repo.label} is being emptied: {why}; no container of it may "
            "start, restart, unpause or exec, and no build may run, until that is done",
            replacement=f"try again once the handover is done (`rdc repo gpu list {self.repo.ref}` shows "
            "the grants then)",
            rule="grant",
        )

    # --- the decision -------------------------------------------------------------------------
    def decide(self, method: str, raw_target: str, content_type: str | None, body: bytes) -> Decision:
        """`decide_resolved` for a caller that holds the head's text only (`rdc repo check`, the
        demo, tests and benchmarks): the same decision, resolved here."""
        return self.decide_resolved(resolve(method, raw_target), content_type, body)

    def decide_resolved(self, request: Resolved, content_type: str | None, body: bytes) -> Decision:
        """The decision on a request whose head was resolved (`resolve`), given its body."""
        facts = self.facts
        facts.begin()
        try:
            return self._decide(request, content_type, body)
        except BadRequest as exc:
            log = (f"400 {request.method} {request.raw_target}: {exc.message}",)
            return Refuse(400, exc.message, log=log, rules=("bad-request",))
        except Exception as exc:  # a gate bug must refuse the request, never let it through unchecked
            message = f"the gate could not decide this request: {type(exc).__name__}: {exc}"
            log = (f"500 {request.method} {request.raw_target}: {message}",)
            return Refuse(500, message, log=log, rules=("gate",))
        finally:
            facts.end()

    def _decide(self, request: Resolved, content_type: str | None, body: bytes) -> Decision:
        method, raw_target = request.method, request.raw_target
        target = request.parsed()
        endpoint = request.route
        decision = self._decide_route(method, raw_target, target, endpoint, content_type, body)
        if decision.endpoint or endpoint is None or not endpoint.name:
            return decision
        # Every decision of a named route carries its name: the audit trail and the metrics label
        # it by name, never by a path with a container's id in it.
        return dataclasses.replace(decision, endpoint=endpoint.name)

    def _decide_route(
        self,
        method: str,
        raw_target: str,
        target: Target,
        endpoint: Route | None,
        content_type: str | None,
        body: bytes,
    ) -> Decision:
        early = self._head(method, target, endpoint)
        if early is not None:
            return early
        if endpoint is None or endpoint.action != "inspect":
            return Forward()
        if endpoint.view is not None:
            return answer(self.upstream, endpoint, raw_target, self._granted)
        where = f"{method} {target.path}"
        version = target.api_version
        if version is not None and version < MIN_API_VERSION:
            raise BadRequest(f"API version {target.version} is older than the gate supports (1.24)")
        if len(body) > MAX_INSPECTED_BODY:
            raise BadRequest(f"request body over {MAX_INSPECTED_BODY} bytes (the gate's limit for {where})")
        if endpoint.runs:
            held = self.start_checks.held_check(where, target, endpoint)
            if held is not None:
                return held
        if endpoint.raw_check is not None:
            endpoint.raw_check(target, body)
            return Forward(body=body or None)
        check_content_type(content_type, body)
        if not body or endpoint.body is None:
            return Forward()  # nothing the daemon could read as settings
        canonical = canonicalise(body, endpoint.body)
        if endpoint.runs_when is not None and endpoint.runs_when(canonical):
            held = self.start_checks.held_check(where, target, endpoint)
            if held is not None:
                return held
        return self.body.decide(method, target, endpoint, canonical)

    def _granted(self) -> frozenset[str]:
        """The names the repo may use now, for the answers the gate makes (unreadable grants: none)."""
        return self.facts.read_grants()[0]

    def published(self, policy: Policy) -> publish.Published:
        """What the publishing rules read: `policy`, and the keepers' state files of the machine."""
        return self.allowances.published(policy)

    def build_policy(self) -> BuildPolicy:
        """What BuildKit's build steps may use, from the machine's settings (read live)."""
        allowances = self.allowances.current(self.facts.read_settings())
        return BuildPolicy(allowances.extra_capabilities, registries=allowances.registries)

    def judge_grpc(self, path: str, message: bytes) -> Verdict:
        """One message of a BuildKit gRPC call on `/grpc` (`path` its method), judged like any
        other request: by this repo's policy, with the machine's settings as they are now."""
        return buildkit.check(path, message, self.build_policy())

    def restore_pins(self) -> list[str]:
        """Pin again the bind sources pinned before this gate started (a restart, a reboot), each
        checked against today's policy; returns the staging paths restored."""
        policy = self.allowances.current(self.facts.read_settings()).binds
        return self.pins.restore(lambda source: mounts.admits(policy, source))

    def spec_age(self) -> str | None:
        """Why the inventory is older than the CDI specs (the gate logs it at start), or None."""
        self.facts.inventory()
        return self.facts.spec_age()
