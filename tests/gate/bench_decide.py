"""Rerunnable benchmark of one decision: `python tests/gate/bench_decide.py [iterations]`.

Decides the container-create body the docker CLI 28 sends for `docker run --device <cdi name> -v
named:/data` (captured in tests/gate/data, its bind made a named volume), with the installed plugins
loaded, on a simulated machine. Prints microseconds per decision; the target is well under 500.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from rediacc_core.gate.decide.decider import Decider
from rediacc_core.machine import Machine
from rediacc_core.plugins import load_plugins
from rediacc_core.repos import Repo

DATA = Path(__file__).parent / "data" / "docker-cli-requests.jsonl"


def main(iterations: int) -> None:
    request = json.loads(DATA.read_text().splitlines()[0])
    body = json.loads(request["body"])
    body["HostConfig"]["Binds"] = ["named:/data"]
    raw = json.dumps(body).encode()
    names = tuple(body["HostConfig"]["DeviceRequests"][0]["DeviceIDs"])
    root = Path(tempfile.mkdtemp())
    (root / "mnt" / "data").mkdir(parents=True)
    machine = Machine("bench", root)
    repo = Repo("bench-id", "bench", None, "bench", None, "2026-01-01T00:00:00Z")
    decider = Decider(
        machine,
        repo,
        load_plugins(),
        lambda image: None,
        lambda line: None,
        grants=lambda r: frozenset(names),
    )
    for _ in range(100):
        decision = decider.decide("POST", request["target"], "application/json", raw)
    assert decision.forward, decision.message
    start = time.perf_counter()
    for _ in range(iterations):
        decider.decide("POST", request["target"], "application/json", raw)
    elapsed = time.perf_counter() - start
    print(
        f"{len(raw)}-byte create body: {elapsed / iterations * 1e6:.0f} us per decision ({iterations} runs)"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
