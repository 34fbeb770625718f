"""Every Docker Engine API endpoint the gate serves, and what it does with each: the endpoint allow-list.

The table lists each route of the Engine API (the operations of the daemon's own swagger for the
API versions served, plus the few undocumented routes the docker CLI and BuildKit use), with one of
four actions:

- `forward`: streamed to the daemon as it is (reads, and changes that cannot reach the host);
- `inspect`: the JSON body is decoded as the daemon will and checked field by field (`body` names
  the daemon's struct, see `decode_fields`);
- `query`: decided from the method and target alone, by the query parameters and the path's name
  (`/build`, and the routes where the daemon fetches from a registry or URL), then the body streams;
- `refuse`: answered 403 with the reason and what to do instead.

Each route is one record of all the gate knows of it, and of every check it gets: its `name` (what
decisions, the audit trail and the metrics call it; nothing decides by it), the struct its body
decodes into, the core's rule on its query or body (`rule`, a function of `rules.py`), where its
body holds devices (`devices_in`), how its admitted bind sources are pinned (`pin`), whether it
makes a container (`creates`: GPU health checked then, the plugins' rewrites applied), the start
checks of a request after which a container's processes run with their devices (`runs`, `held_in`,
`binds_ports`, `starts`, `runs_when`, `raw_check`), whether a build runs after it (`builds`), and
the view through which the gate answers it itself (`view`). Auditing an endpoint is reading its
record; a new core check is a function in `policy/` and a field on its route.

A request's head is resolved once (`resolve`): its target parsed and its route found, and that
`Resolved` is what every later step of the gate reads, so nothing parses the path again.

A method and path the table does not list is refused: a newer daemon may serve routes the gate has
never checked. `tests/gate/test_api_coverage.py` fails when the daemon's swagger has an operation the
table does not classify.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

from rediacc_core.gate.policy import rules, views
from rediacc_core.gate.policy.findings import Finding
from rediacc_core.gate.policy.rules import CREATE_PINS, VOLUME_PINS, Pin, Rule, RuleContext
from rediacc_core.gate.policy.views import View
from rediacc_core.gate.wire.decode import BadRequest, Target, parse_target
from rediacc_core.gate.wire.decode_fields import FieldType, StructRef

Action = Literal["forward", "inspect", "query", "refuse"]

SWARM_REFUSED = "swarm mode is refused: a repo's daemon is a single node with no cluster"
SWARM_INSTEAD = "containers (docker run, docker compose) in this repo"
PLUGIN_REFUSED = "installing, configuring or enabling daemon plugins is the machine operator's job"
PLUGIN_INSTEAD = "ask the machine's operator; containers get GPUs through CDI grants"


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str  # the swagger path; `{x}` segments match as the daemon's router does (`.*`)
    action: Action
    _: KW_ONLY
    name: str = ""  # what decisions, the audit trail and the metrics call it (inspect and query routes)
    body: FieldType | None = None  # the struct an inspected body decodes into
    why: str = ""  # refuse: the reason
    instead: str = ""  # refuse: what to use
    # The core's rule: a query route's on its query and path's `{name}`, an inspected route's on its
    # canonical body (an object); core findings, merged with the plugins' refusals on (rule, subject).
    rule: Rule | None = None
    devices_in: str | None = None  # where its body holds Devices and DeviceRequests ("" = top level)
    # Its admitted body may name host paths: how they are pinned before it is forwarded.
    pin: Pin | None = None
    # It makes a container with the devices it names: a GPU held back for its health is refused now
    # (a `docker run --rm` refused at its start would leave a container made for nothing), and the
    # plugins' rewrites apply to its body (on any other route they are logged and ignored).
    creates: bool = False
    # After the request, a container's processes run with its devices: the daemon injects its CDI
    # devices at every start, so what the container holds is checked against the grants in force now.
    runs: bool = False
    held_in: Literal["container", "exec"] = "container"  # whose id the path holds (an exec's is traced)
    binds_ports: bool = False  # after it, the daemon binds the container's published host ports
    # The daemon's own start of a made container: a refused start of a `--rm` one removes it, as the
    # daemon does when its start fails (`docker run --rm` waits for that removal).
    starts: bool = False
    # After it the daemon may run the container on its own when its canonical body says so (an
    # update's restart policy): then it gets a start's checks.
    runs_when: Callable[[Any], bool] | None = None
    # A body the daemon would read as settings the gate does not check (an old start's HostConfig):
    # checked raw (BadRequest when not empty), then forwarded as it came, never decoded.
    raw_check: Callable[[Target, bytes], None] | None = None
    builds: bool = False  # a build runs after it (BuildKit's session and control API, `/build`)
    view: View | None = None  # the gate answers it itself: the daemon's answer seen through this view

    def findings(self, body: Any, ctx: RuleContext) -> list[Finding]:
        """The core rule's findings on a request of this route (`body` its canonical body, None for a
        query route); none when it has no rule or an inspected body is not an object."""
        if self.rule is None or (self.action == "inspect" and not isinstance(body, dict)):
            return []
        return list(self.rule(body, ctx))


def _fwd(method: str, pattern: str, *, builds: bool = False) -> Route:
    return Route(method, pattern, "forward", builds=builds)


def _swarm(method: str, pattern: str) -> Route:
    return Route(method, pattern, "refuse", why=SWARM_REFUSED, instead=SWARM_INSTEAD)


def _plugin(method: str, pattern: str) -> Route:
    return Route(method, pattern, "refuse", why=PLUGIN_REFUSED, instead=PLUGIN_INSTEAD)


ROUTES: tuple[Route, ...] = (
    # --- system -------------------------------------------------------------------------------
    _fwd("GET", "/_ping"),
    _fwd("HEAD", "/_ping"),
    # The daemon logs in to the body's `serveraddress` from the host's network.
    Route("POST", "/auth", "inspect", name="auth", body=StructRef("AuthConfig"), rule=rules.auth),
    # Answered by the gate from the daemon's, CDI devices cut to the repo's grants (`views`).
    Route("GET", "/info", "inspect", name="info", view=views.info_for_repo),
    _fwd("GET", "/version"),
    _fwd("GET", "/events"),
    _fwd("GET", "/system/df"),
    Route("GET", "/distribution/{name}/json", "query", name="distribution", rule=rules.distribution),
    # --- containers ---------------------------------------------------------------------------
    Route(
        "POST",
        "/containers/create",
        "inspect",
        name="container-create",
        body=StructRef("CreateRequest"),
        rule=rules.container_create,
        devices_in="HostConfig",
        pin=CREATE_PINS,
        creates=True,
    ),
    Route(
        "POST",
        "/containers/{id}/update",
        "inspect",
        name="container-update",
        body=StructRef("UpdateConfig"),
        rule=rules.container_update,
        devices_in="",
        runs_when=rules.sets_restart_policy,
    ),
    Route(
        "POST",
        "/containers/{id}/exec",
        "inspect",
        name="exec-create",
        body=StructRef("ExecConfig"),
        rule=rules.exec_create,
        runs=True,
    ),
    # The routes that make a container's processes run: the gate checks what the container holds
    # against the grants in force now (`decide/start_checks.py`). Older APIs read a start body as a
    # HostConfig: only an empty one passes.
    Route(
        "POST",
        "/containers/{id}/start",
        "inspect",
        name="container-start",
        runs=True,
        binds_ports=True,
        starts=True,
        raw_check=rules.start_body,
    ),
    Route(
        "POST", "/containers/{id}/restart", "inspect", name="container-restart", runs=True, binds_ports=True
    ),
    Route("POST", "/containers/{id}/unpause", "inspect", name="container-unpause", runs=True),
    _fwd("GET", "/containers/json"),
    _fwd("POST", "/containers/prune"),
    _fwd("DELETE", "/containers/{id}"),
    _fwd("GET", "/containers/{id}/archive"),
    _fwd("HEAD", "/containers/{id}/archive"),
    _fwd("PUT", "/containers/{id}/archive"),
    _fwd("POST", "/containers/{id}/attach"),
    _fwd("GET", "/containers/{id}/attach/ws"),
    _fwd("GET", "/containers/{id}/changes"),
    _fwd("GET", "/containers/{id}/export"),
    _fwd("GET", "/containers/{id}/json"),
    _fwd("POST", "/containers/{id}/kill"),
    _fwd("GET", "/containers/{id}/logs"),
    _fwd("POST", "/containers/{id}/pause"),
    _fwd("POST", "/containers/{id}/rename"),
    _fwd("POST", "/containers/{id}/resize"),
    _fwd("GET", "/containers/{id}/stats"),
    _fwd("POST", "/containers/{id}/stop"),
    _fwd("GET", "/containers/{id}/top"),
    _fwd("POST", "/containers/{id}/wait"),
    # A commit body is an image config: no host settings can ride on it.
    _fwd("POST", "/commit"),
    # --- exec ---------------------------------------------------------------------------------
    _fwd("GET", "/exec/{id}/json"),
    _fwd("POST", "/exec/{id}/resize"),
    # The exec's process starts here, in a container that may have lost a grant since the exec was made.
    Route("POST", "/exec/{id}/start", "inspect", name="exec-start", runs=True, held_in="exec"),
    # --- images and builds --------------------------------------------------------------------
    Route("POST", "/build", "query", name="build", rule=rules.build, builds=True),
    _fwd("POST", "/build/prune"),
    _fwd("POST", "/build/cancel"),  # undocumented; the CLI cancels BuildKit builds with it
    # BuildKit's session (h2c upgrade): the daemon calls the client's file, secret and auth
    # services over it; no build option travels on it (a `/build?version=2` build uses it).
    _fwd("POST", "/session", builds=True),
    # BuildKit's control API (gRPC over h2c), which buildx and Compose drive: after the daemon's
    # 101 the gate relays it call by call and checks every request that carries build steps
    # (`buildkit/relay.py`, `buildkit/__init__.py`).
    _fwd("POST", "/grpc", builds=True),
    # Pull (`fromImage`) and import (`fromSrc`): the daemon fetches from the registry or URL named.
    Route("POST", "/images/create", "query", name="image-create", rule=rules.image_create),
    _fwd("GET", "/images/get"),
    _fwd("GET", "/images/json"),
    _fwd("POST", "/images/load"),
    _fwd("POST", "/images/prune"),
    Route("GET", "/images/search", "query", name="image-search", rule=rules.image_search),
    _fwd("DELETE", "/images/{name}"),
    _fwd("GET", "/images/{name}/attestations"),
    _fwd("GET", "/images/{name}/get"),
    _fwd("GET", "/images/{name}/history"),
    _fwd("GET", "/images/{name}/json"),
    Route("POST", "/images/{name}/push", "query", name="image-push", rule=rules.image_push),
    _fwd("POST", "/images/{name}/tag"),
    # --- networks -----------------------------------------------------------------------------
    _fwd("GET", "/networks"),
    Route(
        "POST",
        "/networks/create",
        "inspect",
        name="network-create",
        body=StructRef("NetworkCreateRequest"),
        rule=rules.network_create,
    ),
    _fwd("POST", "/networks/prune"),
    _fwd("DELETE", "/networks/{id}"),
    _fwd("GET", "/networks/{id}"),
    # Its endpoint's driver options may ask for per-interface sysctls (API 1.46+).
    Route(
        "POST",
        "/networks/{id}/connect",
        "inspect",
        name="network-connect",
        body=StructRef("NetworkConnectRequest"),
        rule=rules.network_connect,
    ),
    _fwd("POST", "/networks/{id}/disconnect"),
    # --- volumes ------------------------------------------------------------------------------
    _fwd("GET", "/volumes"),
    Route(
        "POST",
        "/volumes/create",
        "inspect",
        name="volume-create",
        body=StructRef("VolumeCreateOptions"),
        rule=rules.volume_create,
        pin=VOLUME_PINS,
    ),
    _fwd("POST", "/volumes/prune"),
    _fwd("DELETE", "/volumes/{name}"),
    _fwd("GET", "/volumes/{name}"),
    _swarm("PUT", "/volumes/{name}"),  # cluster volumes only
    # --- plugins: listing and removing pass; installing, configuring and enabling do not -------
    _fwd("GET", "/plugins"),
    Route("GET", "/plugins/privileges", "query", name="plugin-privileges", rule=rules.plugin_privileges),
    _fwd("DELETE", "/plugins/{name}"),
    _fwd("POST", "/plugins/{name}/disable"),
    _fwd("GET", "/plugins/{name}/json"),
    _fwd("POST", "/plugins/{name}/push"),
    _plugin("POST", "/plugins/create"),
    _plugin("POST", "/plugins/pull"),
    _plugin("POST", "/plugins/{name}/enable"),
    _plugin("POST", "/plugins/{name}/set"),
    _plugin("POST", "/plugins/{name}/upgrade"),
    # --- swarm: reads answer "not a swarm manager"; every change is refused ---------------------
    _fwd("GET", "/swarm"),
    _fwd("GET", "/swarm/unlockkey"),
    _fwd("POST", "/swarm/leave"),
    _swarm("POST", "/swarm/init"),
    _swarm("POST", "/swarm/join"),
    _swarm("POST", "/swarm/unlock"),
    _swarm("POST", "/swarm/update"),
    _fwd("GET", "/nodes"),
    _fwd("GET", "/nodes/{id}"),
    _fwd("DELETE", "/nodes/{id}"),
    _swarm("POST", "/nodes/{id}/update"),
    _fwd("GET", "/services"),
    _fwd("GET", "/services/{id}"),
    _fwd("DELETE", "/services/{id}"),
    _fwd("GET", "/services/{id}/logs"),
    _swarm("POST", "/services/create"),
    _swarm("POST", "/services/{id}/update"),
    _fwd("GET", "/tasks"),
    _fwd("GET", "/tasks/{id}"),
    _fwd("GET", "/tasks/{id}/logs"),
    _fwd("GET", "/secrets"),
    _fwd("GET", "/secrets/{id}"),
    _fwd("DELETE", "/secrets/{id}"),
    _swarm("POST", "/secrets/create"),
    _swarm("POST", "/secrets/{id}/update"),
    _fwd("GET", "/configs"),
    _fwd("GET", "/configs/{id}"),
    _fwd("DELETE", "/configs/{id}"),
    _swarm("POST", "/configs/create"),
    _swarm("POST", "/configs/{id}/update"),
)

# Undocumented routes the daemon serves that no client of a repo needs: listed so they are refused
# with a reason rather than as unknown.
EXTRA_REFUSED: tuple[Route, ...] = (
    Route(
        "POST",
        "/containers/{id}/checkpoints",
        "refuse",
        why="checkpoints (CRIU, experimental) are refused: restoring one recreates a process from a file",
        instead="restart the container",
    ),
    # Without this row the daemon's `{id}`, which matches slashes, would make it `DELETE /containers/{id}`.
    Route(
        "DELETE",
        "/containers/{id}/checkpoints/{checkpoint}",
        "refuse",
        why="checkpoints (CRIU, experimental) are refused",
        instead="remove the container",
    ),
)

UNKNOWN_INSTEAD = "the documented Docker Engine API (docker CLI, Compose)"


def _regex(pattern: str) -> re.Pattern[str]:
    # The daemon's router matches names with `.*`, so a name may contain `/` (images do).
    parts = re.split(r"\{[a-z]+\}", pattern)
    return re.compile(".*".join(re.escape(p) for p in parts))


_RANK = {"refuse": 3, "inspect": 2, "query": 1, "forward": 0}


def _first_segment(path: str) -> str:
    return path[1:].partition("/")[0]


# Routes grouped by method and first path segment (always literal), so a lookup tries a handful of
# patterns rather than the whole table.
_INDEX: dict[tuple[str, str], list[tuple[Route, re.Pattern[str]]]] = {}
for _route in (*ROUTES, *EXTRA_REFUSED):
    _INDEX.setdefault((_route.method, _first_segment(_route.pattern)), []).append(
        (_route, _regex(_route.pattern))
    )


def path_id(route: Route, path: str, placeholder: str = "{id}") -> str:
    """The `{id}` (or other `placeholder`) of a path `route` matched (`/containers/{id}/start` ->
    the id), "" when none."""
    prefix, found, suffix = route.pattern.partition(placeholder)
    if not found or len(path) < len(prefix) + len(suffix):
        return ""
    return path[len(prefix) : len(path) - len(suffix)] if suffix else path[len(prefix) :]


def match_route(method: str, path: str) -> Route | None:
    """The route `method path` reaches (path URL-decoded, without the `/vX.Y` prefix), or None.

    When a path matches several patterns (a name may contain `/`), the strictest action wins, so a
    crafted name can never turn a checked route into a forwarded one.
    """
    found: Route | None = None
    for route, regex in _INDEX.get((method, _first_segment(path)), ()):
        better = found is None or _RANK[route.action] > _RANK[found.action]
        if better and route.method == method and regex.fullmatch(path):
            found = route
    return found


@dataclass(frozen=True)
class Resolved:
    """A request's head as the gate routes it, found once: the target parsed as the daemon parses
    it and the route it reaches, or why the target could not be parsed."""

    method: str
    raw_target: str  # as the client sent it
    target: Target | None  # None: the target is malformed (`bad` says how)
    route: Route | None  # None: a route the table does not list, or a malformed target
    bad: str = ""  # why the target could not be parsed (answered 400), "" when it was

    def parsed(self) -> Target:
        """The parsed target; BadRequest, with the parser's message, when the target is malformed."""
        if self.target is None:
            raise BadRequest(self.bad)
        return self.target


def resolve(method: str, raw_target: str) -> Resolved:
    """Parse `raw_target` and find the route `method` reaches with it, once per request."""
    try:
        target = parse_target(raw_target)
    except BadRequest as exc:
        return Resolved(method, raw_target, None, None, exc.message)
    return Resolved(method, raw_target, target, match_route(method, target.path))
