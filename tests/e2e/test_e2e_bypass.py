"""Crafted requests for every known way to make a gate and the daemon read a request differently.

Each is sent byte for byte to the gate's socket. The gate must refuse it (400 or 403); then the
daemon itself, asked on its own socket, must hold no container that carries hardware.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from e2e_kit import E2E, GPU0, IMAGE, post, raw_exchange

PRIVILEGED = {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {"Privileged": True}}
CREATE = "/v1.45/containers/create"


def body(document: object) -> bytes:
    return json.dumps(document).encode()


def chunked(path: str, payload: bytes, piece: int = 7) -> bytes:
    frames = b"".join(
        b"%x\r\n%s\r\n" % (len(payload[i : i + piece]), payload[i : i + piece])
        for i in range(0, len(payload), piece)
    )
    return (
        (
            f"POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        + frames
        + b"0\r\n\r\n"
    )


HOST_DEVICE = '{"PathOnHost": "/dev/fakegpu0", "PathInContainer": "/dev/x", "CgroupPermissions": "rwm"}'

CASES: dict[str, bytes] = {
    "chunked-body-hiding-privileged": chunked(CREATE, body(PRIVILEGED)),
    "duplicate-key-last-wins": post(
        CREATE, b'{"Image": "bb:latest", "HostConfig": {"Privileged": false, "Privileged": true}}'
    ),
    "duplicate-object-merges": post(
        CREATE, b'{"Image": "bb:latest", "HostConfig": {"Memory": 0}, "HostConfig": {"Privileged": true}}'
    ),
    "case-variant-key": post(CREATE, b'{"Image": "bb:latest", "hostconfig": {"privileged": true}}'),
    "case-variant-duplicate": post(
        CREATE, b'{"Image": "bb:latest", "HostConfig": {}, "HOSTCONFIG": {"Privileged": true}}'
    ),
    "long-s-folding": post(CREATE, '{"Image": "bb:latest", "HoſtConfig": {"Privileged": true}}'.encode()),
    "long-s-in-binds": post(
        CREATE, '{"Image": "bb:latest", "HostConfig": {"Bindſ": ["/dev:/dev"]}}'.encode()
    ),
    "escaped-long-s-in-device-requests": post(
        CREATE,
        body({"Image": IMAGE, "HostConfig": {"DeviceRequeſtſ": [{"Count": -1, "Capabilities": [["gpu"]]}]}}),
    ),
    "unknown-field-in-device-request": post(
        CREATE,
        body(
            {
                "Image": IMAGE,
                "HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [GPU0], "X": 1}]},
            }
        ),
    ),
    "version-prefix-with-zero": post("/v1.045/containers/create", body(PRIVILEGED)),
    "no-version-prefix": post("/containers/create", body(PRIVILEGED)),
    "encoded-slash": post("/v1.45/containers%2Fcreate", body(PRIVILEGED)),
    "encoded-letters": post("/v1.45/%63ontainers/create", body(PRIVILEGED)),
    "double-slash": post("/v1.45//containers/create", body(PRIVILEGED)),
    "absolute-form-target": post("http://docker/v1.45/containers/create", body(PRIVILEGED)),
    "auth-suffix-in-query": post(CREATE + "?name=x&/auth", body(PRIVILEGED)),
    "content-type-with-parameters": post(
        CREATE, body(PRIVILEGED), content_type="application/json; charset=utf-8"
    ),
    "content-type-not-json": post(CREATE, body(PRIVILEGED), content_type="text/plain"),
    "trailing-second-object": post(CREATE, b'{"Image": "bb:latest"}{"HostConfig": {"Privileged": true}}'),
    "oversized-body": post(
        CREATE,
        b'{"Image": "bb:latest", "Labels": {"pad": "' + b"x" * (5 << 20) + b'"}, '
        b'"HostConfig": {"Privileged": true}}',
    ),
    "content-length-and-chunked": (
        f"POST {CREATE} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body(PRIVILEGED)), body(PRIVILEGED)),
    "differing-content-lengths": post(CREATE, body(PRIVILEGED), "Content-Length: 2"),
    "zero-length-then-body": (
        f"POST {CREATE} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()
    + body(PRIVILEGED),
    "legacy-device-path": post(
        CREATE, f'{{"Image": "bb:latest", "HostConfig": {{"Devices": [{HOST_DEVICE}]}}}}'.encode()
    ),
    "update-adds-devices": post(
        "/v1.45/containers/sleeper-bypass/update", f'{{"Devices": [{HOST_DEVICE}]}}'.encode()
    ),
    "cdi-annotation": post(
        CREATE, body({"Image": IMAGE, "HostConfig": {"Annotations": {"cdi.k8s.io/x": GPU0}}})
    ),
    "volume-binding-dev": post(
        "/v1.45/volumes/create",
        body(
            {
                "Name": "devbind",
                "Driver": "local",
                "DriverOpts": {"type": "none", "o": "bind", "device": "/dev"},
            }
        ),
    ),
}


@pytest.fixture(scope="module")
def baseline(e2e: E2E) -> Iterator[set[str]]:
    """A running container to aim updates at, and the containers that existed before the attacks."""
    e2e.alpha.docker("run", "-d", "--name", "sleeper-bypass", IMAGE, "sleep", "600")
    yield e2e.alpha.container_ids()
    e2e.alpha.docker("rm", "-f", "sleeper-bypass")


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_crafted_request_is_refused_and_creates_nothing(e2e: E2E, baseline: set[str], name: str) -> None:
    status, answer = raw_exchange(e2e.alpha.gate, CASES[name])
    assert status in (400, 403), f"{name}: {status} {answer[:300]!r}"
    assert json.loads(answer)["message"], answer
    assert e2e.alpha.hardware_containers() == []
    assert e2e.alpha.container_ids() <= baseline, "a container was created"
    assert e2e.alpha.daemon_api("GET", "/volumes/devbind")[0] == 404


def test_the_gate_still_serves_after_the_attacks(e2e: E2E) -> None:
    status, answer = raw_exchange(e2e.alpha.gate, b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n")
    assert (status, answer) == (200, b"OK")
