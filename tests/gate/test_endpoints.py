"""The endpoint allow-list: every route is forwarded, inspected, decided by its query, or refused."""

from __future__ import annotations

import pytest

from rediacc_core.gate.policy.endpoints import ROUTES, match_route


class TestRouting:
    @pytest.mark.parametrize(
        ("method", "path", "action", "name"),
        [
            ("POST", "/containers/create", "inspect", "container-create"),
            ("POST", "/containers/abc/update", "inspect", "container-update"),
            ("POST", "/containers/a/b/exec", "inspect", "exec-create"),  # the daemon's {name} is .*
            ("POST", "/containers/abc/start", "inspect", "container-start"),
            ("POST", "/volumes/create", "inspect", "volume-create"),
            ("POST", "/networks/create", "inspect", "network-create"),
            ("POST", "/build", "query", "build"),
            ("GET", "/containers/json", "forward", ""),
            ("HEAD", "/_ping", "forward", ""),
            ("POST", "/grpc", "forward", ""),  # BuildKit: relayed call by call (grpc_relay.py)
            ("GET", "/images/registry.local/team/app:1/json", "forward", ""),
        ],
    )
    def test_known_routes(self, method: str, path: str, action: str, name: str) -> None:
        route = match_route(method, path)
        assert route is not None and (route.action, route.name) == (action, name)

    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", "/plugins/pull"),
            ("POST", "/plugins/vendor/thing:1/upgrade"),
            ("POST", "/plugins/thing/set"),
            ("POST", "/plugins/thing/enable"),
            ("POST", "/plugins/create"),
            ("POST", "/swarm/init"),
            ("POST", "/swarm/join"),
            ("POST", "/services/create"),
            ("POST", "/services/web/update"),
            ("POST", "/secrets/create"),
            ("PUT", "/volumes/shared"),
            ("POST", "/containers/abc/checkpoints"),
            ("DELETE", "/containers/abc/checkpoints/c1"),  # not `DELETE /containers/{id}`
        ],
    )
    def test_routes_refused_whole(self, method: str, path: str) -> None:
        route = match_route(method, path)
        assert route is not None and route.action == "refuse" and route.why and route.instead

    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("post", "/containers/create"),  # the daemon's router matches methods exactly
            ("PATCH", "/containers/create"),
            ("GET", "/containers/create/"),
            ("GET", "/Containers/json"),
            ("OPTIONS", "/containers/json"),
            ("GET", "/debug/pprof/"),
            ("POST", "/containers/abc/copy"),
        ],
    )
    def test_unknown_routes_match_nothing(self, method: str, path: str) -> None:
        assert match_route(method, path) is None

    def test_a_name_that_spells_a_refused_route_is_refused(self) -> None:
        # `/plugins/{name}/disable` is forwarded, but a name may hold `/`: the strictest match wins.
        route = match_route("POST", "/plugins/x/enable/disable")
        assert route is not None and route.action == "forward"
        route = match_route("POST", "/plugins/x/disable/enable")
        assert route is not None and route.action == "refuse"

    def test_every_route_is_listed_once(self) -> None:
        keys = [(r.method, r.pattern) for r in ROUTES]
        assert len(keys) == len(set(keys))
