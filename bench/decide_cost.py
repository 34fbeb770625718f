"""The decision engine alone: `Decider.decide` on the create body, called in this process.

Set beside the create latency the gate adds on the wire, this splits that cost into the decision
itself (decode, rules, plugins, re-encode) and everything around it (reading the body, the hop to a
worker thread and back, writing the canonical body upstream, logging).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def _decider(root: Path, repo_id: str, upstream: str) -> Any:
    import gate_launch

    from rediacc_core.config import Config
    from rediacc_core.gate.decide.decider import Decider
    from rediacc_core.gate.decide.images import ImageConfigs
    from rediacc_core.plugins import get_plugins
    from rediacc_core.repos import RepoStore

    # The machine as the gate loads it: from the benchmark's rdc config (gate_launch.prepare).
    machine = Config.load().machine(gate_launch.MACHINE)
    if machine.root.resolve() != root.resolve():
        raise RuntimeError(f"the rdc config names another root for {gate_launch.MACHINE}: {machine.root}")
    repo = RepoStore(machine).by_id(repo_id)
    # As rediacc_core.runtime.serve.build_gate builds it, less the log (the gate writes it; here it
    # would only be noise).
    return Decider(machine, repo, get_plugins(), ImageConfigs(Path(upstream)), lambda line: None)


# More than this machine's caches hold (L2 and its share of L3): written between two cold calls.
_EVICT_BYTES = 32 * 1024 * 1024
_COLD_CALLS = 200


def _cold_call_us(decide: Callable[[], object], calls: int) -> float:
    """The median CPU time of one call made after the CPU caches were filled with other data.

    In the gate, a create sent one at a time finds the caches full of what the daemon and the load
    generator touched since the last one, and Python's decision touches a lot of memory (code
    objects, dicts, the interpreter itself): this is that decision.
    """
    junk = bytearray(_EVICT_BYTES)
    fill = b"\x01" * (len(junk) // 64)
    spent = []
    for _ in range(calls):
        junk[::64] = fill  # one write per cache line
        start = time.thread_time_ns()
        decide()
        spent.append((time.thread_time_ns() - start) / 1000)
    return statistics.median(spent)


def measure(root: Path, repo_id: str, upstream: str, target: str, body: bytes, calls: int) -> Record:
    """µs per `decide` call: the median of batches of 50, after a warm-up batch; and the median of
    single calls made with the CPU caches emptied first (`us_cold`).

    Timed in this thread's CPU time, not wall time, so that other processes taking the CPU away
    mid-batch (this machine is shared) do not count as decision time.
    """
    decider = _decider(root, repo_id, upstream)
    decision = decider.decide("POST", target, "application/json", body)
    if not decision.forward:
        raise RuntimeError(f"the decider refused the bench create body: {decision.status} {decision.message}")
    batch = 50
    per_call = []
    for _ in range(max(1, calls // batch)):
        start = time.thread_time()
        for _ in range(batch):
            decider.decide("POST", target, "application/json", body)
        per_call.append((time.thread_time() - start) / batch * 1e6)
    return {
        "scenario": "engine",
        "endpoint": "Decider.decide (create body)",
        "path": "gate",
        "calls": batch * len(per_call),
        "us_per_call": statistics.median(per_call),
        "us_min": min(per_call),
        "us_max": max(per_call),
        "us_cold": _cold_call_us(
            lambda: decider.decide("POST", target, "application/json", body), min(calls, _COLD_CALLS)
        ),
    }


def profile(
    root: Path, repo_id: str, upstream: str, target: str, body: bytes, calls: int, top: int = 25
) -> str:
    """cProfile of `calls` decisions: the functions with the most own time, as Markdown."""
    decider = _decider(root, repo_id, upstream)
    decider.decide("POST", target, "application/json", body)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        decider.decide("POST", target, "application/json", body)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
    lines = [
        f"{calls} calls, {total / calls * 1e6:.0f} µs each under cProfile (it inflates small functions)",
        "",
        "| own time | per decision | calls per decision | function |",
        "|---|---|---|---|",
    ]
    for (filename, line, name), (_, ncalls, tottime, _cum, _) in rows:
        where = filename.split("/site-packages/")[-1].split("/work/main/")[-1]
        lines.append(
            f"| {tottime / total * 100:.1f}% | {tottime / calls * 1e6:.1f} µs | {ncalls / calls:.1f} "
            f"| `{name}` ({where}:{line}) |"
        )
    return "\n".join(lines) + "\n"
