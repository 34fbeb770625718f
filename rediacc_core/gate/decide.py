"""The gate's decision for one Docker API request: forward (canonical body) or refuse, and why.

Order matters and is fixed: route through the endpoint allow-list (`endpoints.py`: unknown and
refused routes end here, from the head alone, and so do `/build`'s query parameters) -> decode into
the canonical body (400 on anything ambiguous) -> fold Compose's legacy CDI `Devices` into the CDI
device request -> check the requested CDI names against the repo's live grants (and, for a request
that makes a container run, the names the container already holds) -> core rules and
plugin rules (a plugin refusal with a core rule's id replaces the core's generic one) -> refuse with
every problem and its replacement, or apply the plugins' rewrites, check the names they added
against the grants, pin the admitted bind sources (`pins.py`) and forward the re-encoded body.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rediacc_core.errors import RdcError
from rediacc_core.gate import buildkit
from rediacc_core.gate.buildkit import Verdict
from rediacc_core.gate.buildkit.llb import BuildPolicy
from rediacc_core.gate.containers import Container, ContainerLookup, LookupFailed
from rediacc_core.gate.policy import isolation, mounts, publish, rules
from rediacc_core.gate.policy.endpoints import UNKNOWN_INSTEAD, Route, match_route, path_id
from rediacc_core.gate.policy.findings import Finding
from rediacc_core.gate.policy.pins import Pins
from rediacc_core.gate.policy.pins import directory_for as pins_directory
from rediacc_core.gate.wire.decode import (
    MAX_INSPECTED_BODY,
    MIN_API_VERSION,
    BadRequest,
    Target,
    canonicalise,
    check_content_type,
    encode,
    parse_target,
)
from rediacc_core.model import ApiRequest, GateContext, Inventory, Refusal, Rewrite
from rediacc_core.publishing import Policy, policy_from, short_id
from rediacc_core.values import split_list

if TYPE_CHECKING:
    from rediacc_core.machine import Machine
    from rediacc_core.plugins import Plugins
    from rediacc_core.repos import Repo

__all__ = ["MAX_INSPECTED_BODY", "BadRequest", "Decider", "Decision", "Target", "parse_target"]

GrantsReader = Callable[[str], frozenset[str]]
InventoryReader = Callable[[], Inventory | None]
SettingsReader = Callable[[], Mapping[str, str]]


@dataclass(frozen=True)
class Decision:
    forward: bool  # True: send upstream
    status: int = 200  # refusal status (400/403) when not forward
    message: str = ""  # refusal text (sent as Docker's {"message": ...} JSON)
    body: bytes | None = None  # canonical re-encoded body to forward instead of the original
    answer: bytes | None = None  # not forwarded: the gate answers 200 with this JSON itself (`views`)
    log: tuple[str, ...] = ()  # lines for the gate's log
    # For the audit trail: the endpoint's name, the refusing rules' ids, the CDI names asked and admitted.
    endpoint: str = ""
    rules: tuple[str, ...] = ()
    cdi_asked: tuple[str, ...] = ()
    cdi_admitted: tuple[str, ...] = ()


def _live_grants(machine: Machine) -> GrantsReader:
    # Imported when first needed: a gate whose grants cannot be loaded must still serve requests
    # without devices (it fails closed only for device requests).
    from rediacc_core.grants import LiveGrants

    return LiveGrants(machine).for_repo


def _live_settings(machine: Machine) -> SettingsReader:
    from rediacc_core.settings import LiveSettings

    return LiveSettings(machine).settings


class _LiveInventoryReader:
    """The machine inventory for the rules: `inventory.LiveInventory` (thread-safe, one `stat` when
    unchanged), with an unreadable file logged once per distinct problem and seen as none."""

    def __init__(self, machine: Machine, log: Callable[[str], None]) -> None:
        from rediacc_core.inventory import LiveInventory

        self._live = LiveInventory(machine)
        self._log = log
        self._error: str | None = None

    def __call__(self) -> Inventory | None:
        try:
            value = self._live.get()
        except RdcError as exc:
            if exc.what != self._error:
                self._error = exc.what
                self._log(f"inventory unreadable, rules see none: {exc.what}")
            return None
        self._error = None
        return value


def _describe(refusal: Refusal) -> str:
    if refusal.replacement:
        return f"{refusal.message}; use instead: {refusal.replacement}"
    return refusal.message


def merge_refusals(core: list[Finding], plugin: list[Refusal]) -> list[Refusal]:
    """The core's findings, less those a plugin refusal with the same rule id replaces, then the plugins'.

    A plugin refusal replaces the core findings of its rule whose subject (the refused value) it
    mentions; when it mentions none of them, it replaces the whole rule.
    """
    by_rule: dict[str, list[Refusal]] = {}
    for refusal in plugin:
        if refusal.rule:
            by_rule.setdefault(refusal.rule, []).append(refusal)
    kept: list[Refusal] = []
    grouped: dict[str, list[Finding]] = {}
    for finding in core:
        grouped.setdefault(finding.refusal.rule, []).append(finding)
    for rule, findings in grouped.items():
        theirs = by_rule.get(rule)
        if not theirs:
            kept.extend(f.refusal for f in findings)
            continue
        text = " ".join(f"{r.message} {r.replacement or ''}" for r in theirs)
        mentioned = [f for f in findings if f.subject and f.subject in text]
        if mentioned:
            kept.extend(f.refusal for f in findings if f not in mentioned)
    return kept + plugin


@dataclass(frozen=True)
class _Allowances:
    """What the machine's settings allow, as the core rules read it."""

    binds: mounts.BindPolicy
    extra_capabilities: frozenset[str]
    pids_limit: int
    registries: frozenset[tuple[str, int | None]]
    publishing: Policy


def _sets_restart_policy(body: Any) -> bool:
    policy = body.get("RestartPolicy") if isinstance(body, dict) else None
    name = policy.get("Name") if isinstance(policy, dict) else None
    return isinstance(name, str) and name not in ("", "no")


class Decider:
    """Decides the requests of one repo's gate. Thread-safe for concurrent `decide` calls."""

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
        settings: SettingsReader | None = None,
        pins: Pins | None = None,
        containers: ContainerLookup | None = None,
        upstream: Path | None = None,
    ) -> None:
        self.machine = machine
        self.repo = repo
        self.plugins = plugins
        self.image_config = image_config
        self.log = log
        self._grants = grants
        self._grants_error: str | None = None
        self._inventory: InventoryReader = inventory or _LiveInventoryReader(machine, log)
        self._settings = settings
        self._settings_error: str | None = None
        # None only where no daemon is behind the decider (unit tests): the runtime guard still holds.
        self.containers = containers
        self.upstream = upstream  # the repo daemon's socket, for the answers the gate makes (`_info`)
        # Pinning is on unless a caller opts out: an unpinned bind can be swapped before it is mounted.
        if pins is None:
            from rediacc_core.repos import repo_state_dir

            index = repo_state_dir(machine, repo.id) / "pins.json"
            pins = Pins(pins_directory(machine.run_dir, repo.id), index)
        self.pins = pins
        self._allowances: tuple[Mapping[str, Any], _Allowances] | None = None

    # --- what to read ---------------------------------------------------------------------------
    def inspects(self, method: str, raw_target: str) -> bool:
        """Must the body be read and decided? True for bad targets too, so they get their 400."""
        try:
            target = parse_target(raw_target)
        except BadRequest:
            return True
        route = match_route(method, target.path)
        return route is not None and route.action == "inspect"

    def remembers(self, method: str, raw_target: str) -> bool:
        """May the answers of `head` and `inspects` for this target be remembered? Not for routes
        decided by their query, whose answer also depends on the machine's settings (`registries`)."""
        try:
            target = parse_target(raw_target)
        except BadRequest:
            return True
        route = match_route(method, target.path)
        return route is None or route.action != "query"

    def head(self, method: str, raw_target: str) -> Decision | None:
        """The refusal of a request from its head alone (a route refused whole, an unknown route, or
        query parameters of `/build` and the fetching routes), or None when the head passes. Depends
        on nothing but its arguments and, for routes decided by their query, the machine's settings."""
        try:
            target = parse_target(raw_target)
        except BadRequest:
            return None  # read and answered 400 by `decide`
        return self._head(method, target, match_route(method, target.path))

    def _head(self, method: str, target: Target, route: Route | None) -> Decision | None:
        where = f"{method} {target.path}"
        if route is None:
            refusal = Refusal(
                message=f"{where} is not an endpoint the gate knows, so it is refused",
                replacement=UNKNOWN_INSTEAD,
                rule="endpoint",
            )
            return self._refuse(where, [refusal], endpoint="unknown")
        if route.action == "refuse":
            refusal = Refusal(message=f"{where}: {route.why}", replacement=route.instead, rule="endpoint")
            return self._refuse(where, [refusal], endpoint=route.pattern)
        if route.action == "query":
            context = self._rule_context(target, self._read_settings(), pinning=False)
            context = dataclasses.replace(context, name=path_id(route, target.path, "{name}"))
            findings = rules.check(route.name, None, context)
            if findings:
                return self._refuse(where, [f.refusal for f in findings], endpoint=route.name)
        return None

    # --- the decision -------------------------------------------------------------------------
    def decide(self, method: str, raw_target: str, content_type: str | None, body: bytes) -> Decision:
        try:
            return self._decide(method, raw_target, content_type, body)
        except BadRequest as exc:
            log = (f"400 {method} {raw_target}: {exc.message}",)
            return Decision(False, 400, exc.message, log=log, rules=("bad-request",))
        except Exception as exc:  # a gate bug must refuse the request, never let it through unchecked
            message = f"the gate could not decide this request: {type(exc).__name__}: {exc}"
            return Decision(
                False, 500, message, log=(f"500 {method} {raw_target}: {message}",), rules=("gate",)
            )

    def _decide(self, method: str, raw_target: str, content_type: str | None, body: bytes) -> Decision:
        target = parse_target(raw_target)
        endpoint = match_route(method, target.path)
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
            return Decision(True)
        if endpoint.name == "info":
            return self._info(raw_target)
        where = f"{method} {target.path}"
        version = target.api_version
        if version is not None and version < MIN_API_VERSION:
            raise BadRequest(f"API version {target.version} is older than the gate supports (1.24)")
        if len(body) > MAX_INSPECTED_BODY:
            raise BadRequest(f"request body over {MAX_INSPECTED_BODY} bytes (the gate's limit for {where})")
        if endpoint.runs:
            held = self._held_check(where, target, endpoint)
            if held is not None:
                return held
        if endpoint.name == "container-start":
            if body.strip() not in (b"", b"{}", b"null"):
                raise BadRequest("container start takes no body (older APIs read one as HostConfig)")
            if any(v for name in ("checkpoint", "checkpoint-dir") for v in target.query.get(name, ())):
                # Refused on every checkpoint route; here it would restore from a directory of the
                # caller's choosing (only experimental daemons act on it: defence in depth).
                raise BadRequest(
                    "starting from a checkpoint (checkpoint, checkpoint-dir) is refused; start without it"
                )
            return Decision(True, body=body or None)
        check_content_type(content_type, body)
        if not body or endpoint.body is None:
            return Decision(True)  # nothing the daemon could read as settings
        canonical = canonicalise(body, endpoint.body)
        if endpoint.name == "container-update" and _sets_restart_policy(canonical):
            # A restart policy makes the daemon start the container on its own, unseen by the gate.
            held = self._held_check(where, target, endpoint)
            if held is not None:
                return held
        return self._decide_body(method, target, endpoint, canonical)

    def _held_check(self, where: str, target: Target, route: Route) -> Decision | None:
        """The refusal of a request that would run a container holding CDI names the repo lacks now,
        or publishing host ports that today's policy or another repo's keeper leaves it no room for."""
        if self.containers is None:
            return None
        ref = path_id(route, target.path)
        try:
            if route.name == "exec-start":
                container = self.containers.exec_container(ref)
                held = None if container is None else self.containers.lookup(container)
            else:
                held = self.containers.lookup(ref)
        except LookupFailed as exc:
            message = f"the gate could not check which devices container {ref} holds: {exc}; try again"
            return Decision(
                False, 503, message, log=(f"503 {where}: {message}",), endpoint=route.name, rules=("gate",)
            )
        if held is None:
            return None  # no such container: the daemon says so
        refusals = self._port_problems(held) if route.binds_ports else []
        grants, error = self._read_grants() if held.cdi else (frozenset(), None)
        missing = [name for name in held.cdi if error is not None or name not in grants]
        if not missing and not refusals:
            return None
        why = f" (its grants cannot be read: {error})" if error is not None else ""
        refusals += [
            Refusal(
                message=(
                    f"container {held.name} holds {name}, which repo {self.repo.label} has no grant for "
                    f"now{why}, so it may not run"
                ),
                replacement=(
                    f"an operator's `rdc repo gpu grant {self.repo.ref} --device {name}`, or `docker rm "
                    f"{held.name}` and create it again without the device"
                ),
                rule="grant",
            )
            for name in missing
        ]
        return self._refuse(where, refusals, endpoint=route.name, cdi=held.cdi)

    def _port_problems(self, held: Container) -> list[Refusal]:
        """The publishing rules for a container about to run, under today's settings and keepers."""
        if not held.ports:
            return []
        policy = self._current_allowances(self._read_settings()).publishing
        findings = publish.check(
            list(held.ports), self.published(policy), self.repo.machine, counted=not held.running
        )
        return [
            dataclasses.replace(f.refusal, message=f"container {held.name}: {f.refusal.message}")
            for f in findings
        ]

    def _info(self, raw_target: str) -> Decision:
        """`GET /info` as this repo may see it: asked of the daemon, its CDI devices cut to the grants."""
        from rediacc_core.blocking import may_block
        from rediacc_core.gate import views

        if self.upstream is None:
            return Decision(True)  # no daemon behind this decider (unit tests of other routes)
        may_block()
        import http.client

        from rediacc_core import unixhttp

        try:
            status, raw = unixhttp.request(self.upstream, "GET", raw_target, timeout=30)
        except (OSError, http.client.HTTPException) as exc:
            return Decision(False, 502, f"the repo's daemon did not answer GET /info: {exc}", endpoint="info")
        if status != 200:
            return Decision(True, endpoint="info")  # its error, as the daemon phrases it
        granted, _ = self._read_grants()  # unreadable grants: no device is shown
        try:
            return Decision(False, 200, answer=views.info_body(raw, granted), endpoint="info")
        except ValueError:
            return Decision(False, 502, "the repo's daemon answered GET /info with no JSON", endpoint="info")

    def _read_grants(self) -> tuple[frozenset[str], str | None]:
        try:
            if self._grants is None:
                self._grants = _live_grants(self.machine)
            return self._grants(self.repo.id), None
        except Exception as exc:  # whatever went wrong, device requests fail closed and say why
            why = exc.what if isinstance(exc, RdcError) else f"{type(exc).__name__}: {exc}"
            return frozenset(), why

    def _read_settings(self) -> Mapping[str, str]:
        """The machine's settings, read live (one `stat` when unchanged).

        Unreadable settings mean the defaults, and every default is the safe choice (see
        `rediacc_core.settings`): refusing what a setting would have admitted is failing closed. Said
        in the log once per distinct problem, not for every request.
        """
        try:
            if self._settings is None:
                self._settings = _live_settings(self.machine)
            settings = self._settings()
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

    def _rule_context(
        self, target: Target, settings: Mapping[str, Any], *, pinning: bool
    ) -> rules.RuleContext:
        """What the core rules need for this request: the bind roots and allowances of `settings`."""
        allowances = self._current_allowances(settings)
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
        """What the publishing rules read: `policy`, and the keepers' state files of the machine."""
        return publish.Published(policy, self.machine.run_dir, short_id(self.repo.id), self._repo_named)

    def _repo_named(self, short: str) -> str:
        """The reference of the machine's repo whose id starts `short` (read only for a refusal)."""
        from rediacc_core.repos import RepoStore

        try:
            found = [r.label for r in RepoStore(self.machine).list() if short_id(r.id) == short]
        except Exception:  # a refusal must still be made when the repos file cannot be read
            found = []
        return f"{found[0]}@{self.repo.machine}" if found else f"with id {short}…"

    def build_policy(self) -> BuildPolicy:
        """What BuildKit's build steps may use, from the machine's settings (read live)."""
        allowances = self._current_allowances(self._read_settings())
        return BuildPolicy(allowances.extra_capabilities, registries=allowances.registries)

    def judge_grpc(self, path: str, message: bytes) -> Verdict:
        """One message of a BuildKit gRPC call on `/grpc` (`path` its method), judged like any
        other request: by this repo's policy, with the machine's settings as they are now."""
        return buildkit.check(path, message, self.build_policy())

    def restore_pins(self) -> list[str]:
        """Pin again the bind sources pinned before this gate started (a restart, a reboot), each
        checked against today's policy; returns the staging paths restored."""
        policy = self._current_allowances(self._read_settings()).binds
        return self.pins.restore(lambda source: mounts.admits(policy, source))

    def _current_allowances(self, settings: Mapping[str, Any]) -> _Allowances:
        """What `settings` (the machine's, read live) allow."""
        cached = self._allowances
        if cached is None or cached[0] is not settings:
            # Rebuilt only when the settings file changed (LiveSettings keeps the same mapping).
            cached = self._allowances = (settings, self._allowances_from(settings))
        return cached[1]

    def _allowances_from(self, settings: Mapping[str, Any]) -> _Allowances:
        from rediacc_core.gate.policy import fetches, limits
        from rediacc_core.repos import files_dir

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
        return _Allowances(
            binds=policy,
            extra_capabilities=extra,
            pids_limit=int(pids) if limits.check_pids_setting(pids) is None else limits.DEFAULT_PIDS_LIMIT,
            registries=fetches.parse_allowed(str(settings.get("registries", ""))),
            publishing=policy_from(settings),
        )

    def _grant_problems(
        self, names: tuple[str, ...], grants: frozenset[str], error: str | None
    ) -> list[Refusal]:
        if not names:
            return []
        if error is not None:
            message = (
                f"device requests are refused because the grants of repo {self.repo.label} "
                f"cannot be read ({error})"
            )
            return [Refusal(message=message, rule="grant")]
        missing = [name for name in names if name not in grants]
        return [Refusal(message=self._no_grant(name), rule="grant") for name in missing]

    def _no_grant(self, name: str) -> str:
        """Why `name` is refused, and advice that leads somewhere: a grant of a device the machine
        has, or the names it does have when `name` is none of them (a grant of a typo is refused)."""
        from rediacc_core.cdi.registry import Registry, suggest
        from rediacc_core.grants import ended_lease

        where = self.machine.name
        try:
            defined = Registry.for_machine(self.machine).names()
        except Exception:  # only the advice depends on it: the refusal stands either way
            defined = None
        if defined is None or name in defined:
            grant = f"rdc repo gpu grant {self.repo.ref} --device {name}"
            try:
                lease = ended_lease(self.machine, self.repo.id, name)
            except Exception:  # only the advice depends on it
                lease = None
            if lease is not None:  # an ended lease cannot be renewed: it is granted anew
                ended = lease.expires_at
                return f"the lease of {name} to repo {self.repo.label} ended at {ended} ({grant} --for 8h)"
            return f"repo {self.repo.label} has no grant for {name} ({grant})"
        close = suggest(name, defined)
        if not close:
            return f"{name} is not a device on machine {where} (its devices: rdc machine gpu list {where})"
        return (
            f"{name} is not a device on machine {where}; did you mean {' or '.join(close)}? "
            f"(rdc repo gpu grant {self.repo.ref} --device {close[0]}; "
            f"every device: rdc machine gpu list {where})"
        )

    def _decide_body(self, method: str, target: Target, route: Route, canonical: Any) -> Decision:
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
        grants, grants_error = self._read_grants()
        if grants_error:
            log.append(f"grants unreadable: {grants_error}")
        refusals = self._grant_problems(cdi, grants, grants_error)
        settings = self._read_settings()  # once per decision: the rules and plugins see one state
        findings = rules.check(endpoint, canonical, self._rule_context(target, settings, pinning=False))
        # Plugins are shown a copy, so nothing a plugin does to the body it is shown is forwarded.
        request = ApiRequest(
            method=method,
            path=target.path,
            query=target.query,
            body=copy.deepcopy(canonical),
            api_version=None if version is None else f"{version[0]}.{version[1]}",
            cdi_devices=cdi,
        )
        ctx = GateContext(
            repo_name=self.repo.label,
            repo_ref=self.repo.ref,
            machine=self.machine,
            grants=grants,
            inventory=self._inventory(),
            settings=settings,
            image_config=self.image_config,
            log=self.log,
        )
        try:
            verdicts = self.plugins.request_rules(request, ctx)
        except Exception as exc:  # a broken plugin must not let a request through unchecked
            message = f"a gate rule failed, so the request is refused: {type(exc).__name__}: {exc}"
            return Decision(False, 500, message, log=(*log, f"500 {where}: {message}"))
        plugin_refusals = [v for v in verdicts if isinstance(v, Refusal)]
        rewrites = [v for v in verdicts if isinstance(v, Rewrite)]
        refusals += merge_refusals(findings, plugin_refusals)
        if refusals:
            return self._refuse(where, refusals, log, endpoint=endpoint, cdi=cdi)
        asked = cdi  # what the request named; rewrites may add names
        if rewrites:
            if endpoint != "container-create":
                log.extend(
                    f"rewrite ignored (only container create is rewritten): {r.description}" for r in rewrites
                )
            else:
                added = self._rewrite(canonical, rewrites, log)
                new = tuple(n for n in added if n not in cdi)
                problems = self._grant_problems(new, grants, grants_error)
                if problems:
                    return self._refuse(where, problems, log, endpoint=endpoint, cdi=cdi)
                cdi += new
        if route.pins and rules.names_host_paths(endpoint, canonical):
            # Only now, with the request admitted, are bind sources pinned and rewritten.
            pinned = rules.pin(endpoint, canonical, self._rule_context(target, settings, pinning=True))
            if pinned:
                return self._refuse(where, [f.refusal for f in pinned], log, endpoint=endpoint, cdi=cdi)
        forwarded = encode(canonical)  # once: decoded once (canonicalise), changed in place, encoded once
        log.append(f"admitted {where}" + (f" with CDI devices {', '.join(cdi)}" if cdi else ""))
        return Decision(
            True, body=forwarded, log=tuple(log), endpoint=endpoint, cdi_asked=asked, cdi_admitted=cdi
        )

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

    @staticmethod
    def _refuse(
        where: str,
        refusals: list[Refusal],
        log: list[str] | None = None,
        *,
        endpoint: str = "",
        cdi: tuple[str, ...] = (),
    ) -> Decision:
        status = 403 if any(r.status == 403 for r in refusals) else 400
        # One problem per line: the docker CLI prints the message as it is.
        message = "\n".join(_describe(r) for r in refusals)
        rule_ids = tuple(dict.fromkeys(r.rule for r in refusals if r.rule))
        return Decision(
            False,
            status,
            message,
            log=(*(log or []), f"{status} {where}: {message}"),
            endpoint=endpoint,
            rules=rule_ids,
            cdi_asked=cdi,
        )
