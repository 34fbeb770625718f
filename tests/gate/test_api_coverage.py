"""Every endpoint and every request field of the Engine API is classified: nothing passes unexamined.

The daemons' own swaggers are the lists to check against, one per API version the gate serves: API
1.45 (Docker Engine 26.1) and API 1.51 (Engine 28.5). CI installs them from Debian's
`golang-github-docker-docker-dev` (`.ci/install-docker.sh`, `.ci/install-engine.sh`); elsewhere the
tests that need one skip unless `REDIACC_DOCKER_SWAGGER` names a copy (it then replaces both).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from rediacc_core.gate.policy.endpoints import ROUTES, match_route
from rediacc_core.gate.policy.field_policy import FIELDS, FREE, NESTED, NOT_IN_DAEMON_STRUCT
from rediacc_core.gate.policy.isolation import BUILD_PARAMETERS
from rediacc_core.gate.policy.rules import RULE_IDS
from rediacc_core.gate.wire.decode_fields import STRUCTS

SWAGGER_PLACES = {
    "1.45": (
        "/var/cache/rediacc/docker-api/swagger.yaml",
        "/usr/share/gocode/src/github.com/docker/docker/api/swagger.yaml",
    ),
    "1.51": ("/opt/rediacc/engines/28.5/swagger.yaml",),
}
METHODS = ("get", "post", "put", "delete", "head", "patch")


def _swagger_path(version: str) -> Path | None:
    named = os.environ.get("REDIACC_DOCKER_SWAGGER")
    candidates = [named] if named else list(SWAGGER_PLACES[version])
    return next((Path(p) for p in candidates if p and Path(p).is_file()), None)


@pytest.fixture(scope="module", params=sorted(SWAGGER_PLACES), ids=lambda v: f"api-{v}")
def swagger(request: pytest.FixtureRequest) -> dict[str, Any]:
    version: str = request.param
    path = _swagger_path(version)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"the Engine API {version} swagger is missing: .ci/run installs it")
        how = "bash .ci/install-docker.sh" if version == "1.45" else "bash .ci/install-engine.sh"
        pytest.skip(
            f"no Engine API {version} swagger at {', '.join(SWAGGER_PLACES[version])}: install it with "
            f"`{how}` (root), or point REDIACC_DOCKER_SWAGGER at a copy of moby's api/swagger.yaml"
        )
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def _properties(swagger: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if "$ref" in schema:
        return _properties(swagger, swagger["definitions"][schema["$ref"].rsplit("/", 1)[-1]])
    for part in schema.get("allOf", []):
        found.update(_properties(swagger, part))
    found.update(schema.get("properties", {}))
    return found


def _body(swagger: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    for parameter in swagger["paths"][path][method].get("parameters", []):
        if parameter.get("in") == "body":
            return _properties(swagger, parameter["schema"])
    raise AssertionError(f"{method} {path} has no body")


def _documented(swagger: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Our struct name -> the swagger's properties for it."""
    definitions = swagger["definitions"]
    mount = _properties(swagger, definitions["Mount"])
    host = _properties(swagger, definitions["HostConfig"])
    return {
        "CreateRequest": _body(swagger, "/containers/create", "post"),
        "HostConfig": _properties(swagger, definitions["HostConfig"]),
        "UpdateConfig": _body(swagger, "/containers/{id}/update", "post"),
        "ExecConfig": _body(swagger, "/containers/{id}/exec", "post"),
        "NetworkingConfig": _properties(swagger, definitions["NetworkingConfig"]),
        "EndpointSettings": _properties(swagger, definitions["EndpointSettings"]),
        "EndpointIPAMConfig": _properties(swagger, definitions["EndpointIPAMConfig"]),
        "NetworkConnectRequest": _body(swagger, "/networks/{id}/connect", "post"),
        "Mount": mount,
        "BindOptions": mount["BindOptions"]["properties"],
        "VolumeOptions": mount["VolumeOptions"]["properties"],
        "TmpfsOptions": mount["TmpfsOptions"]["properties"],
        "DeviceMapping": _properties(swagger, definitions["DeviceMapping"]),
        "DeviceRequest": _properties(swagger, definitions["DeviceRequest"]),
        "VolumeCreateOptions": _properties(swagger, definitions["VolumeCreateOptions"]),
        "NetworkCreateRequest": _body(swagger, "/networks/create", "post"),
        "IPAM": _properties(swagger, definitions["IPAM"]),
        "Ulimit": host["Ulimits"]["items"]["properties"],
        "PortBinding": _properties(swagger, definitions["PortBinding"]),
        "AuthConfig": _body(swagger, "/auth", "post"),
    }


class TestEveryFieldIsClassified:
    """These need no swagger: the decoder's structs and the policy table must agree exactly."""

    @pytest.mark.parametrize("name", sorted(STRUCTS))
    def test_each_decoded_struct_has_each_field_classified(self, name: str) -> None:
        assert name in FIELDS, f"struct {name} is decoded but not classified in field_policy.FIELDS"
        assert set(FIELDS[name]) == set(STRUCTS[name].fields)

    def test_classifications_name_real_rules(self) -> None:
        allowed = RULE_IDS | {FREE, NESTED, "plugins"}
        unknown = {
            f"{s}.{f}={r}" for s, fields in FIELDS.items() for f, r in fields.items() if r not in allowed
        }
        assert not unknown

    def test_structs_that_govern_the_host_are_strict(self) -> None:
        loose = sorted(n for n in FIELDS if not STRUCTS[n].strict and n != "CreateRequest")
        assert loose == ["NetworkingConfig"]


class TestAgainstTheDaemonsSwagger:
    def test_every_operation_is_classified(self, swagger: dict[str, Any]) -> None:
        missing = [
            f"{method.upper()} {path}"
            for path, operations in swagger["paths"].items()
            for method in operations
            if method in METHODS
            and match_route(method.upper(), path.replace("{", "x").replace("}", "")) is None
        ]
        assert not missing, f"Engine API operations no route classifies: {missing}"

    def test_every_route_is_in_the_swagger_or_named_as_extra(self, swagger: dict[str, Any]) -> None:
        extra = {("POST", "/build/cancel"), ("POST", "/grpc"), ("GET", "/images/{name}/attestations")}
        documented = {(m.upper(), p) for p, ops in swagger["paths"].items() for m in ops if m in METHODS}
        ours = {(r.method, r.pattern) for r in ROUTES}
        renamed = {(m, p.replace("{name}", "{id}")) for m, p in documented} | documented
        unexplained = [
            r
            for r in ours - extra
            if r not in renamed and (r[0], r[1].replace("{name}", "{id}")) not in renamed
        ]
        assert not unexplained

    def test_every_request_field_is_known_to_the_decoder(self, swagger: dict[str, Any]) -> None:
        for name, properties in _documented(swagger).items():
            unknown = sorted(
                f
                for f in properties
                if f not in STRUCTS[name].fields and (name, f) not in NOT_IN_DAEMON_STRUCT
            )
            assert not unknown, f"{name} fields nobody classified: {unknown}"

    def test_every_build_parameter_is_known(self, swagger: dict[str, Any]) -> None:
        documented = {
            p["name"] for p in swagger["paths"]["/build"]["post"]["parameters"] if p.get("in") == "query"
        }
        assert documented <= BUILD_PARAMETERS
