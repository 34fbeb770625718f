"""The gate's Prometheus counters and the node_exporter textfile they are written to.

The counters are written every `METRICS_INTERVAL` seconds, atomically (write, then rename), as a
node_exporter textfile-collector file: `<machine root>/run/rediacc/metrics/<repo id>.prom`, one
directory for every repo of the machine, so one `--collector.textfile.directory` collects them all.
A worker process hands its `Counters` to its supervisor instead, which adds them up and writes the
file (`runtime.workers`).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

METRICS_INTERVAL = 10.0  # seconds between two writes of the metrics file
# Upper bounds (seconds) of the decision-latency histogram's buckets.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class Counters:
    """What the metrics file reports: counters only grow; the gauges are what holds now.

    Worker processes of one gate each count their own, and their supervisor adds them up (`plus`);
    they travel between the two as JSON (`to_json`, `from_json`).
    """

    requests: int = 0  # request heads read
    open_connections: int = 0  # gauge
    buffered: int = 0  # gauge: bytes of unfinished requests held
    decisions: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (endpoint, rule, result)
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0

    def plus(self, other: Counters) -> Counters:
        decisions = dict(self.decisions)
        for key, count in other.decisions.items():
            decisions[key] = decisions.get(key, 0) + count
        return Counters(
            requests=self.requests + other.requests,
            open_connections=self.open_connections + other.open_connections,
            buffered=self.buffered + other.buffered,
            decisions=decisions,
            latency_counts=[a + b for a, b in zip(self.latency_counts, other.latency_counts, strict=True)],
            latency_sum=self.latency_sum + other.latency_sum,
        )

    def without_gauges(self) -> Counters:
        """These counters as a worker that has stopped leaves them: its connections are gone."""
        return Counters(
            self.requests, 0, 0, dict(self.decisions), list(self.latency_counts), self.latency_sum
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "requests": self.requests,
                "open_connections": self.open_connections,
                "buffered": self.buffered,
                "decisions": [[*key, count] for key, count in self.decisions.items()],
                "latency_counts": self.latency_counts,
                "latency_sum": self.latency_sum,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Counters:
        """Raises ValueError (or KeyError, TypeError) when `text` is not what `to_json` wrote."""
        document = json.loads(text)
        counts = [int(n) for n in document["latency_counts"]]
        if len(counts) != len(LATENCY_BUCKETS) + 1:
            raise ValueError("latency_counts has the wrong number of buckets")
        return cls(
            requests=int(document["requests"]),
            open_connections=int(document["open_connections"]),
            buffered=int(document["buffered"]),
            decisions={(str(e), str(r), str(d)): int(n) for e, r, d, n in document["decisions"]},
            latency_counts=counts,
            latency_sum=float(document["latency_sum"]),
        )


def metrics_text(labels: str, counters: Counters) -> str:
    """`counters` in Prometheus' text format (version 0.0.4); `labels` name the repo."""
    out = [
        "# HELP rediacc_gate_requests_total Requests whose head the gate read.",
        "# TYPE rediacc_gate_requests_total counter",
        f"rediacc_gate_requests_total{{{labels}}} {counters.requests}",
        "# HELP rediacc_gate_decisions_total Decisions by endpoint, refusing rule and result.",
        "# TYPE rediacc_gate_decisions_total counter",
    ]
    for (endpoint, rule, result), count in sorted(counters.decisions.items()):
        out.append(
            f'rediacc_gate_decisions_total{{{labels},endpoint="{_label(endpoint)}",'
            f'rule="{_label(rule)}",result="{result}"}} {count}'
        )
    out += [
        "# HELP rediacc_gate_decision_seconds Time from a decided request's head to its decision.",
        "# TYPE rediacc_gate_decision_seconds histogram",
    ]
    running = 0
    for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counters.latency_counts, strict=True):
        running += count
        le = "+Inf" if bound == float("inf") else repr(bound)
        out.append(f'rediacc_gate_decision_seconds_bucket{{{labels},le="{le}"}} {running}')
    out += [
        f"rediacc_gate_decision_seconds_sum{{{labels}}} {counters.latency_sum:.6f}",
        f"rediacc_gate_decision_seconds_count{{{labels}}} {running}",
        "# HELP rediacc_gate_open_connections Client connections open now.",
        "# TYPE rediacc_gate_open_connections gauge",
        f"rediacc_gate_open_connections{{{labels}}} {counters.open_connections}",
        "# HELP rediacc_gate_buffered_bytes Bytes of unfinished requests held now.",
        "# TYPE rediacc_gate_buffered_bytes gauge",
        f"rediacc_gate_buffered_bytes{{{labels}}} {counters.buffered}",
    ]
    return "\n".join(out) + "\n"


def repo_labels(repo_id: str, repo_name: str) -> str:
    return f'repo_id="{_label(repo_id)}",repo="{_label(repo_name)}"'


def write_metrics_file(path: Path, text: str) -> None:
    """Replace the metrics file atomically: node_exporter never reads half a file. Best effort:
    metrics never stop the gate (the audit log is the record)."""
    # A name of this process's own: two gates for one repo (the benchmark runs two) never write one
    # temporary file together.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o644)  # node_exporter often runs as its own user
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
