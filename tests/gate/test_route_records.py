"""One route, one record: every check an endpoint gets is a field of its record in
`endpoints.ROUTES`, and nothing in the gate decides by a route's name (names are for the audit trail
and the metrics)."""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

import pytest

from rediacc_core.gate.policy import rules, views
from rediacc_core.gate.policy.endpoints import EXTRA_REFUSED, ROUTES, Route
from rediacc_core.gate.wire.decode_fields import StructRef

GATE = Path(__file__).resolve().parents[2] / "rediacc_core" / "gate"
NAMES = frozenset(r.name for r in ROUTES if r.name)
CHECKED = [r for r in ROUTES if r.action in ("inspect", "query")]


def _id(route: Route) -> str:
    return f"{route.method} {route.pattern}"


@pytest.mark.parametrize("route", CHECKED, ids=_id)
def test_every_checked_route_is_named_and_carries_a_check(route: Route) -> None:
    assert route.name, "a checked route is named: the audit trail and the metrics label it by that"
    checks = (route.rule, route.view, route.raw_check, route.runs or None)
    assert any(c is not None for c in checks), "an inspected route with no check should be forwarded"


@pytest.mark.parametrize("route", [r for r in ROUTES if r.action == "query"], ids=_id)
def test_every_query_route_has_its_rule(route: Route) -> None:
    assert route.rule is not None
    assert route.body is None, "a query route's body streams, never decoded"


@pytest.mark.parametrize("route", [r for r in ROUTES if r.body is not None], ids=_id)
def test_every_decoded_body_has_its_rule(route: Route) -> None:
    # A body decoded for nothing would be re-encoded unchecked: its struct comes with a rule.
    assert route.action == "inspect"
    assert route.rule is not None


def test_the_checks_sit_where_they_belong() -> None:
    for route in ROUTES:
        where = _id(route)
        if route.pin is not None or route.devices_in is not None or route.creates:
            assert route.body is not None and route.rule is not None, where
        if route.held_in != "container" or route.binds_ports or route.starts:
            assert route.runs, f"{where}: a start check's detail on a route that runs nothing"
        if route.runs_when is not None or route.raw_check is not None:
            assert route.action == "inspect", where
        if route.view is not None:
            assert route.method == "GET" and route.body is None, f"{where}: only a read is answered"
    for route in (*ROUTES, *EXTRA_REFUSED):
        if route.action != "refuse":
            assert not route.why and not route.instead, _id(route)
        else:
            assert route.why and route.instead and not route.name, _id(route)


def test_the_routes_that_make_a_container_run_say_so() -> None:
    runs = {r.name for r in ROUTES if r.runs}
    assert runs == {"container-start", "container-restart", "container-unpause", "exec-create", "exec-start"}
    assert {r.name for r in ROUTES if r.runs_when is not None} == {"container-update"}
    assert {r.name for r in ROUTES if r.builds} == {"build", ""}  # and /grpc, /session (forwarded)
    assert {r.pattern for r in ROUTES if r.builds and not r.name} == {"/grpc", "/session"}


def name_dispatch(source: str) -> list[str]:
    """Where `source` decides by a route's name: a comparison of a name (an attribute `.name`, or a
    variable called `name`, `endpoint` or `route`) with a route's name, or a table keyed by two or
    more route names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            values = [
                e
                for o in operands
                for e in (o.elts if isinstance(o, ast.Tuple | ast.List | ast.Set) else [o])
            ]
            named = [v for v in values if isinstance(v, ast.Constant) and v.value in NAMES]
            subject = [
                o
                for o in operands
                if (isinstance(o, ast.Attribute) and o.attr == "name")
                or (isinstance(o, ast.Name) and o.id in ("name", "endpoint", "route"))
            ]
            if named and subject:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in NAMES]
            if len(keys) >= 2:
                found.append(f"line {node.lineno}: a table keyed by {', '.join(map(str, keys))}")
    return found


def test_nothing_in_the_gate_decides_by_a_routes_name() -> None:
    found = {
        str(path.relative_to(GATE)): where
        for path in sorted(GATE.rglob("*.py"))
        if (where := name_dispatch(path.read_text()))
    }
    assert found == {}, "put the check on the route's record (a field of `endpoints.Route`)"


@pytest.mark.parametrize(
    "source",
    [
        'if route.name == "container-start":\n    pass',
        'if endpoint != "container-create":\n    pass',
        '_BY_BODY = {"container-create": f, "volume-create": g}',
        'x = route.name in ("exec-start", "x")',
        'x = "build" == endpoint',
    ],
)
def test_the_walk_sees_a_dispatch_by_name(source: str) -> None:
    assert name_dispatch(source) != []


def test_the_walk_leaves_other_strings_alone() -> None:
    assert name_dispatch('FIELDS = {"auth": FREE}\nif level == "info":\n    pass') == []


# Every route's record as one line: its action and name, and each check it carries that differs from
# a plain forward. The file is the endpoint table as an auditor reads it; a check added to or taken
# from a route changes the file, so it changes only knowingly (regenerate with
# `RDC_WRITE_ROUTE_CHECKS=1 pytest tests/gate/test_route_records.py` and read the diff).
ROUTE_CHECKS = Path(__file__).parent / "data" / "route_checks.txt"


def _named(value: object) -> str:
    for module in (rules, views):
        for attr, held in vars(module).items():
            if held is value and not attr.startswith("__"):
                return f"{module.__name__.rpartition('.')[2]}.{attr}"
    return repr(value)


def route_line(route: Route) -> str:
    plain = Route(route.method, route.pattern, "forward")
    parts = [route.method, route.pattern, route.action]
    for field in dataclasses.fields(Route):
        if field.name in ("method", "pattern", "action", "_"):
            continue
        value = getattr(route, field.name)
        if value == getattr(plain, field.name):
            continue
        shown = value.name if isinstance(value, StructRef) else value
        if callable(value) or isinstance(value, rules.Pin):
            shown = _named(value)
        parts.append(f"{field.name}={shown}")
    return " ".join(parts)


def test_every_routes_checks_are_as_recorded() -> None:
    lines = "".join(f"{route_line(r)}\n" for r in (*ROUTES, *EXTRA_REFUSED))
    if os.environ.get("RDC_WRITE_ROUTE_CHECKS"):
        ROUTE_CHECKS.write_text(lines)
    assert lines == ROUTE_CHECKS.read_text(), (
        "a route's checks changed: if meant, regenerate tests/gate/data/route_checks.txt (see above)"
    )
