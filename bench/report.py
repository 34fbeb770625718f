"""Turns the records of one run into the results table, the chart and the printed ratios.

Values per path are medians over all cycles. Ratios and added latencies are paired: each cycle
measured every path within a few seconds, so the ratio is taken within each cycle and the median of
those per-cycle ratios is reported, with their range. A burst of other work on the machine then
moves one cycle's ratio, not the result. Absolute numbers move with the machine; ratios are the result.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Record = dict[str, Any]
# "gate" is the gate as `rdc repo up` runs it (worker processes by default); "gate-w2" the same gate
# in two worker processes (`--workers 2`, bench/gate_launch.py), measured beside it in the rate
# scenarios only.
WORKERS = "gate-w2"
PATHS = ("direct", "haproxy", "gate", WORKERS)
Key = Callable[[Record], float]


@dataclass(frozen=True)
class Stat:
    """The median of per-cycle values, with their range."""

    median: float
    low: float
    high: float
    cycles: int

    def text(self, unit: str, digits: int = 2) -> str:
        if self.cycles == 1:
            return f"{self.median:.{digits}f}{unit}"
        return f"{self.median:.{digits}f}{unit} ({self.low:.{digits}f}–{self.high:.{digits}f})"


def _stat(values: list[float]) -> Stat | None:
    return Stat(statistics.median(values), min(values), max(values), len(values)) if values else None


def _selected(records: list[Record], scenario: str, endpoint: str) -> list[Record]:
    return [r for r in records if r["scenario"] == scenario and r["endpoint"] == endpoint]


def median_of(records: list[Record], scenario: str, endpoint: str, path: str, key: Key) -> float | None:
    values = [
        v for r in _selected(records, scenario, endpoint) if r["path"] == path if (v := key(r)) is not None
    ]
    return statistics.median(values) if values else None


def _process_counts(records: list[Record], key: str) -> list[str]:
    """One line saying how many processes each proxy's numbers were summed over (none if unrecorded)."""
    counts: dict[str, set[int]] = {}
    for r in records:
        if r.get(key) is not None:
            counts.setdefault(r["path"], set()).add(r[key])
    if not counts:
        return []
    names = {"gate": "the gate", WORKERS: "the gate in two worker processes", "haproxy": "HAProxy"}
    parts = [
        f"{names.get(path, path)} {'–'.join(str(n) for n in sorted({min(c), max(c)}))}"
        for path in PATHS
        if (c := counts.get(path))
    ]
    return [f"Processes summed: {', '.join(parts)}.", ""]


def _pairs(
    records: list[Record], scenario: str, endpoint: str, a: str, b: str, key: Key
) -> list[tuple[float, float]]:
    cycles: dict[Any, dict[str, float]] = {}
    for r in _selected(records, scenario, endpoint):
        value = key(r)
        if value is not None:
            cycles.setdefault(r["cycle"], {})[r["path"]] = value
    return [(v[a], v[b]) for v in cycles.values() if a in v and b in v]


def ratio(records: list[Record], scenario: str, endpoint: str, a: str, b: str, key: Key) -> Stat | None:
    """a/b within each cycle."""
    return _stat([x / y for x, y in _pairs(records, scenario, endpoint, a, b, key) if y])


def added(records: list[Record], scenario: str, endpoint: str, a: str, b: str, key: Key) -> Stat | None:
    """a-b within each cycle."""
    return _stat([x - y for x, y in _pairs(records, scenario, endpoint, a, b, key)])


def _ms(us_key: str) -> Key:
    return lambda r: float(r["latency_us"][us_key]) / 1000.0


def _rate(r: Record) -> float:
    return float(r["rate"])


def _mbps(r: Record) -> float:
    return float(r["mb_per_s"])


def _cpu(r: Record) -> float:
    """The proxy's CPU µs per request served (None on the direct path: there is no proxy)."""
    value = r.get("proxy_cpu_us_per_req")
    return float(value) if value is not None else None  # type: ignore[return-value]


def endpoints(records: list[Record], scenario: str) -> list[str]:
    seen: list[str] = []
    for r in records:
        if r["scenario"] == scenario and r["endpoint"] not in seen:
            seen.append(r["endpoint"])
    return seen


@dataclass(frozen=True)
class Target:
    what: str
    measured: Stat | None
    unit: str
    limit: float
    higher_is_better: bool

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        value = self.measured.median
        return value >= self.limit if self.higher_is_better else value <= self.limit

    @property
    def verdict(self) -> str:
        return {None: "not measured", True: "met", False: "NOT met"}[self.met]

    def row(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        shown = "not measured" if self.measured is None else self.measured.text(self.unit)
        mark = {None: "–", True: "yes", False: "**no**"}[self.met]
        return f"| {self.what} | {sign} {self.limit:g}{self.unit} | {shown} | {mark} |"


def targets(records: list[Record]) -> list[Target]:
    out: list[Target] = []
    for endpoint in endpoints(records, "rate"):
        measured = ratio(records, "rate", endpoint, "gate", "haproxy", _rate)
        out.append(Target(f"request rate `GET {endpoint}`, gate/HAProxy", measured, "×", 1.0, True))
    for endpoint in endpoints(records, "rate"):
        measured = ratio(records, "rate", endpoint, "gate", "haproxy", _ms("p99"))
        out.append(Target(f"p99 latency `GET {endpoint}`, gate/HAProxy", measured, "×", 1.2, False))
    for endpoint in endpoints(records, "decision"):
        measured = added(records, "decision", endpoint, "gate", "direct", _ms("p50"))
        out.append(Target("create decision (409 reply): p50 added over direct", measured, " ms", 0.5, False))
    for endpoint in endpoints(records, "rate"):
        measured = ratio(records, "rate", endpoint, "gate", "haproxy", _cpu)
        out.append(Target(f"proxy CPU per request `GET {endpoint}`, gate/HAProxy", measured, "×", 0.8, False))
    for endpoint in endpoints(records, "decision"):
        cpu = [_cpu(r) for r in _selected(records, "decision", endpoint) if r["path"] == "gate"]
        measured = _stat([c for c in cpu if c is not None])
        # Issue 41 (issue 13 asked 185 µs, half of the 370 µs measured on 2026-11-30 at 3d96f9b).
        out.append(Target("create (409 reply): the gate's CPU per request", measured, " µs", 200, False))
    for endpoint in endpoints(records, "cli-create"):
        measured = ratio(records, "cli-create", endpoint, "gate", "direct", _ms("p50"))
        out.append(Target("`docker create` through the CLI, gate/direct", measured, "×", 1.05, False))
    for endpoint in endpoints(records, "bulk"):
        measured = ratio(records, "bulk", endpoint, "gate", "direct", _mbps)
        out.append(Target(f"bulk {endpoint}, gate/direct", measured, "×", 0.95, True))
    idle = [
        r
        for r in records
        if r["scenario"] == "memory" and r["path"] == "gate" and r["endpoint"].startswith("idle")
    ]
    measured = _stat([float(idle[0]["kib_per_item"])]) if idle else None
    out.append(Target("gate memory per idle keep-alive connection", measured, " KiB", 64, False))
    return out


def checks(records: list[Record]) -> list[str]:
    """Anything that makes a number suspect: wrong statuses, errors, failed streams."""
    expected = {"rate": "200", "latency": "200", "create": "201", "decision": "409"}
    problems = []
    for r in records:
        where = f"{r['scenario']} {r['endpoint']} via {r['path']} (cycle {r.get('cycle', '-')})"
        if r["scenario"] in expected:
            statuses = r.get("statuses", {})
            others = {k: v for k, v in statuses.items() if k != expected[r["scenario"]]}
            if others or r.get("errors"):
                problems.append(f"{where}: statuses {statuses}, errors {r.get('errors', 0)}")
            if not r.get("requests"):
                problems.append(f"{where}: no request completed")
        elif r["scenario"] == "bulk" and r["status"] != 200:
            problems.append(f"{where}: HTTP {r['status']}")
        elif r["scenario"] == "memory" and r["failed"]:
            problems.append(f"{where}: {r['failed']} of {r['count']} connections did not work")
    return problems


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _st(stat: Stat | None, unit: str = "×", digits: int = 2) -> str:
    return "–" if stat is None else stat.text(unit, digits)


def markdown(records: list[Record], meta: dict[str, Any]) -> str:
    lines = [
        *_header(records, meta),
        *_cpu_section(records),
        *_rate_section(records, meta),
        *workers_section(records, meta),
        *_latency_section(records),
        *_create_section(records),
        *_bulk_section(records, meta),
        *_memory_section(records),
        *_checks_section(records),
    ]
    return "\n".join(lines)


def _header(records: list[Record], meta: dict[str, Any]) -> list[str]:
    """What was measured, how, and the targets."""
    lines = [
        f"# Gate benchmark, {meta['date']}",
        "",
        f"- commit measured: `{meta['commit']}`",
        f"- machine: {meta['machine']}",
        f"- software: {meta['software']}",
        f"- settings: {meta['settings']}",
        f"- create body: {meta['create_body']}",
        f"- command: `{meta['command']}` ({meta['elapsed_s']:.0f} s)",
        f"- load average before / after: {meta.get('loadavg_before', '?')} / "
        f"{meta.get('loadavg_after', '?')}",
        "",
        "Absolute numbers move with the machine; the ratios within this one run are the result.",
        "Paths were measured interleaved, in short cycles with rotating order. Values are medians over",
        "cycles; ratios and added latencies are medians of per-cycle ratios (range in brackets).",
        "",
    ]
    if meta.get("gate_override"):
        lines += [
            f"**In the gate's place (RDC_BENCH_GATE_CMD): `{meta['gate_override']}`.** The rows named",
            "gate measure that command, not the gate of the commit above.",
            "",
        ]
    if meta.get("gate_missing"):
        lines += [f"**The gate was not measured: {meta['gate_missing']}.**", ""]
    lines += ["## Targets (issues 7, 13 and 41)", ""]
    lines += ["| target | limit | measured (range over cycles) | met |"]
    lines += ["|---|---|---|---|", *[t.row() for t in targets(records)]]
    return lines


def _cpu_section(records: list[Record]) -> list[str]:
    """CPU per request of each proxy, beside HAProxy's."""
    lines: list[str] = [
        "",
        "## Proxy CPU per request",
        "",
        "CPU time the proxy's processes spent (the process started and every process descended from it,",
        "all threads, from /proc/<pid>/task/*/schedstat) divided by the requests it served. Unlike",
        "requests per second it hardly moves when other work shares the machine. On a machine whose",
        "cores are all busy (load generator, daemon and proxy here), a proxy matches HAProxy's rate",
        "only by spending no more CPU per request than HAProxy does.",
        "",
        *_process_counts(records, "proxy_processes"),
        f"| request | gate µs | {WORKERS} µs | HAProxy µs | gate/HAProxy | {WORKERS}/HAProxy "
        f"| {WORKERS}/gate |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario, label in (("rate", "`GET {}`, 8 connections"), ("decision", "{}, one at a time")):
        for endpoint in endpoints(records, scenario):
            gate, one, haproxy = (
                median_of(records, scenario, endpoint, p, _cpu) for p in ("gate", WORKERS, "haproxy")
            )
            lines.append(
                f"| {label.format(endpoint)} | {_fmt(gate, 1)} | {_fmt(one, 1)} | {_fmt(haproxy, 1)} "
                f"| {_st(ratio(records, scenario, endpoint, 'gate', 'haproxy', _cpu))} "
                f"| {_st(ratio(records, scenario, endpoint, WORKERS, 'haproxy', _cpu))} "
                f"| {_st(ratio(records, scenario, endpoint, WORKERS, 'gate', _cpu))} |"
            )
    return lines


def _rate_section(records: list[Record], meta: dict[str, Any]) -> list[str]:
    """Keep-alive request rate and its latency percentiles, path by path."""
    lines: list[str] = [
        "",
        "## Request rate (keep-alive)",
        "",
        f"{meta['rate_conns']} connections, each with one request in flight, "
        f"{meta['rate_seconds']:g} s per path and cycle.",
        "",
        "| endpoint | path | req/s | p50 ms | p99 ms | req/s vs HAProxy | p99 vs HAProxy | req/s vs direct "
        "| proxy CPU µs/req | CPU/req vs HAProxy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for endpoint in endpoints(records, "rate"):
        for path in PATHS:
            rate = median_of(records, "rate", endpoint, path, _rate)
            if rate is None:
                continue
            lines.append(
                f"| `GET {endpoint}` | {path} | {_fmt(rate, 0)} "
                f"| {_fmt(median_of(records, 'rate', endpoint, path, _ms('p50')), 3)} "
                f"| {_fmt(median_of(records, 'rate', endpoint, path, _ms('p99')), 3)} "
                f"| {_st(ratio(records, 'rate', endpoint, path, 'haproxy', _rate))} "
                f"| {_st(ratio(records, 'rate', endpoint, path, 'haproxy', _ms('p99')))} "
                f"| {_st(ratio(records, 'rate', endpoint, path, 'direct', _rate))} "
                f"| {_fmt(median_of(records, 'rate', endpoint, path, _cpu), 1)} "
                f"| {_st(ratio(records, 'rate', endpoint, path, 'haproxy', _cpu))} |"
            )
    return lines


def _latency_section(records: list[Record]) -> list[str]:
    """One request at a time: the latency each proxy adds."""
    lines: list[str] = [
        "",
        "## Latency of a single request (one connection, one request at a time)",
        "",
        "| endpoint | path | req/s | p50 ms | p99 ms | p50 added vs direct | proxy CPU µs/req |",
        "|---|---|---|---|---|---|---|",
    ]
    for endpoint in endpoints(records, "latency"):
        for path in PATHS:
            p50 = median_of(records, "latency", endpoint, path, _ms("p50"))
            if p50 is None:
                continue
            lines.append(
                f"| `GET {endpoint}` | {path} "
                f"| {_fmt(median_of(records, 'latency', endpoint, path, _rate), 0)} "
                f"| {_fmt(p50, 3)} | {_fmt(median_of(records, 'latency', endpoint, path, _ms('p99')), 3)} "
                f"| {_st(added(records, 'latency', endpoint, path, 'direct', _ms('p50')), ' ms', 3)} "
                f"| {_fmt(median_of(records, 'latency', endpoint, path, _cpu), 1)} |"
            )
    return lines


def _create_section(records: list[Record]) -> list[str]:
    """Container creates, and the decision engine alone on the same body."""
    lines: list[str] = [
        "",
        "## Container create (`docker run --device vendor.example/gpu=0 …`'s body, one request at a time)",
        "",
        "| request | path | p50 ms | p99 ms | p50 added vs direct | p99 added vs direct | proxy CPU µs/req |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in ("decision", "create"):
        label = "create, name taken (409)" if scenario == "decision" else "create (201, container made)"
        for endpoint in endpoints(records, scenario):
            for path in PATHS:
                p50 = median_of(records, scenario, endpoint, path, _ms("p50"))
                if p50 is None:
                    continue
                lines.append(
                    f"| {label} | {path} | {_fmt(p50, 3)} "
                    f"| {_fmt(median_of(records, scenario, endpoint, path, _ms('p99')), 3)} "
                    f"| {_st(added(records, scenario, endpoint, path, 'direct', _ms('p50')), ' ms', 3)} "
                    f"| {_st(added(records, scenario, endpoint, path, 'direct', _ms('p99')), ' ms', 3)} "
                    f"| {_fmt(median_of(records, scenario, endpoint, path, _cpu), 0)} |"
                )
    for endpoint in endpoints(records, "cli-create"):
        lines += [
            "",
            "`docker create --network none --device vendor.example/gpu=0 bb:latest true` through the "
            "installed CLI, timed whole (the CLI's start, its ping, the create, its exit), the median of "
            "several runs per path and cycle:",
            "",
            "| path | ms | vs direct (per cycle) |",
            "|---|---|---|",
        ]
        for path in PATHS:
            ms = median_of(records, "cli-create", endpoint, path, _ms("p50"))
            if ms is not None:
                shown = _st(ratio(records, "cli-create", endpoint, path, "direct", _ms("p50")))
                lines.append(f"| {path} | {_fmt(ms, 1)} | {shown} |")
    for r in records:
        if r["scenario"] == "engine":
            lines += [
                "",
                f"The decision engine alone (`Decider.decide` on the same body, in the benchmark's process, "
                f"{r['calls']} calls): **{r['us_per_call']:.0f} µs** of CPU per decision "
                f"(batches {r['us_min']:.0f}–{r['us_max']:.0f} µs)"
                + (
                    f"; **{r['us_cold']:.0f} µs** when the CPU caches are filled with other data before "
                    "each call, as the daemon and the load generator fill them between two creates sent "
                    "one at a time: set beside the gate's CPU per create above, it says how much of "
                    "that is the decision."
                    if r.get("us_cold")
                    else "."
                ),
            ]
    return lines


def _bulk_section(records: list[Record], meta: dict[str, Any]) -> list[str]:
    """The bulk transfers (after the note that closes the create section)."""
    lines: list[str] = [
        "",
        "The 409 request carries the same body with a name already in use: the daemon decodes it and",
        "answers at once, so the difference between paths is the proxy's own cost (read, decide,",
        "re-encode, forward). The real create shows that cost against a whole create.",
        "",
        f"## Bulk transfer ({meta['bulk_mib']} MiB tar through `/containers/{{id}}/archive`, curl)",
        "",
        "| transfer | path | MB/s | vs direct | vs HAProxy |",
        "|---|---|---|---|---|",
    ]
    for endpoint in endpoints(records, "bulk"):
        for path in PATHS:
            speed = median_of(records, "bulk", endpoint, path, _mbps)
            if speed is not None:
                lines.append(
                    f"| {endpoint} | {path} | {_fmt(speed, 0)} "
                    f"| {_st(ratio(records, 'bulk', endpoint, path, 'direct', _mbps))} "
                    f"| {_st(ratio(records, 'bulk', endpoint, path, 'haproxy', _mbps))} |"
                )
    return lines


def _memory_section(records: list[Record]) -> list[str]:
    """Resident memory while connections and attach streams are held."""
    lines: list[str] = [
        "",
        "## Resident memory (VmRSS of the proxy's processes)",
        "",
        "The gate is restarted first, so freed memory left by the load above does not hide the cost.",
        "RSS is summed over the proxy's processes (the one started and its descendants); pages that",
        "forked workers share are counted once in each, which overstates a forking proxy's memory.",
        "",
        *_process_counts(records, "processes"),
        "| held open | path | count | RSS before KiB | RSS held KiB | per item KiB | RSS after closing KiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["scenario"] == "memory":
            lines.append(
                f"| {r['endpoint']} | {r['path']} | {r['count']} | {r['rss_before_kib']:,} "
                f"| {r['rss_held_kib']:,} | {r['kib_per_item']:.1f} | {r['rss_after_close_kib']:,} |"
            )
    return lines


def _checks_section(records: list[Record]) -> list[str]:
    """What went wrong, if anything, and what the load generator cost."""
    lines: list[str] = []
    problems = checks(records)
    lines += ["", "## Checks", ""]
    lines += (
        [f"- {p}" for p in problems] if problems else ["Every request got the expected status; no errors."]
    )
    lines += ["", "## Load generator cost", ""]
    cpu = [r["cpu_s"] / (r["duration_s"] or 1) for r in records if r["scenario"] in ("rate", "latency")]
    if cpu:
        lines.append(
            f"bench/loadgen used at most {max(cpu) * 100:.0f}% of one core during a rate measurement "
            f"(median {statistics.median(cpu) * 100:.0f}%)."
        )
    lines.append("")
    return lines


def workers_section(records: list[Record], meta: dict[str, Any]) -> list[str]:
    """The same gate in two worker processes against the default gate, measured in the same cycles."""
    if not endpoints(records, "rate"):
        return []
    head = ["", f"## Worker processes: {WORKERS} against gate", ""]
    if not any(r["path"] == WORKERS for r in records):
        why = meta.get("workers_missing") or "no record of it"
        return [*head, f"{WORKERS}, the gate in two worker processes, was not measured: {why}."]
    lines = [
        *head,
        "`gate` runs as `rdc repo up` runs it by default (one process: the machine's `gate-workers`",
        f"setting is 1); `{WORKERS}` is the same command line with `--workers 2`, on a socket of its",
        "own, for the same repo. Both ran in every cycle, so their ratio shows what worker processes",
        "buy on this machine; ratios from two separate runs move by more than that here.",
        "",
        f"| endpoint | req/s gate/HAProxy | req/s {WORKERS}/HAProxy | req/s {WORKERS}/gate "
        f"| p99 {WORKERS}/gate | CPU µs/req gate | {WORKERS} | HAProxy "
        f"| CPU/req {WORKERS}/gate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario, method in (("rate", "GET"), ("parallel", "POST")):
        for endpoint in endpoints(records, scenario):
            cpu = [median_of(records, scenario, endpoint, p, _cpu) for p in ("gate", WORKERS, "haproxy")]
            lines.append(
                f"| `{method} {endpoint}` "
                f"| {_st(ratio(records, scenario, endpoint, 'gate', 'haproxy', _rate))} "
                f"| {_st(ratio(records, scenario, endpoint, WORKERS, 'haproxy', _rate))} "
                f"| {_st(ratio(records, scenario, endpoint, WORKERS, 'gate', _rate))} "
                f"| {_st(ratio(records, scenario, endpoint, WORKERS, 'gate', _ms('p99')))} "
                f"| {' | '.join(_fmt(c, 1) for c in cpu)} "
                f"| {_st(ratio(records, scenario, endpoint, WORKERS, 'gate', _cpu))} |"
            )
    if endpoints(records, "parallel"):
        lines += [
            "",
            "The `POST` row is the create body with a taken name from as many connections as the rate",
            "rows: the decision is most of the work on that path, so it is where one event loop limits",
            "the gate and where its worker processes pay off first.",
        ]
    return lines


_LABEL = {"haproxy": "HAProxy"}  # how the printed lines name a path, where it differs


def summary_lines(records: list[Record]) -> list[str]:
    """The ratios printed at the end of a run."""
    out = []
    for endpoint in endpoints(records, "rate"):
        out.append(
            f"rate GET {endpoint}: gate/HAProxy "
            f"{_st(ratio(records, 'rate', endpoint, 'gate', 'haproxy', _rate))}, "
            f"gate/direct {_st(ratio(records, 'rate', endpoint, 'gate', 'direct', _rate))}; p99 gate/HAProxy "
            f"{_st(ratio(records, 'rate', endpoint, 'gate', 'haproxy', _ms('p99')))}"
        )
        if any(r["path"] == WORKERS for r in _selected(records, "rate", endpoint)):
            out.append(
                f"rate GET {endpoint}: {WORKERS}/HAProxy "
                f"{_st(ratio(records, 'rate', endpoint, WORKERS, 'haproxy', _rate))}, {WORKERS}/gate "
                f"{_st(ratio(records, 'rate', endpoint, WORKERS, 'gate', _rate))}"
            )
    for endpoint in endpoints(records, "rate"):
        cpu = {p: median_of(records, "rate", endpoint, p, _cpu) for p in ("gate", WORKERS, "haproxy")}
        shown = ", ".join(f"{_LABEL.get(p, p)} {_fmt(v, 1)} µs" for p, v in cpu.items() if v is not None)
        out.append(
            f"proxy CPU per request GET {endpoint}: {shown}; "
            f"gate/HAProxy {_st(ratio(records, 'rate', endpoint, 'gate', 'haproxy', _cpu))}"
            + (
                f", {WORKERS}/gate {_st(ratio(records, 'rate', endpoint, WORKERS, 'gate', _cpu))}"
                if cpu[WORKERS] is not None
                else ""
            )
        )
    for endpoint in endpoints(records, "parallel"):
        cpu = {p: median_of(records, "parallel", endpoint, p, _cpu) for p in ("gate", WORKERS, "haproxy")}
        shown = ", ".join(f"{_LABEL.get(p, p)} {_fmt(v, 1)} µs" for p, v in cpu.items() if v is not None)
        out.append(
            f"rate POST {endpoint} (decided): gate/HAProxy "
            f"{_st(ratio(records, 'parallel', endpoint, 'gate', 'haproxy', _rate))}, {WORKERS}/HAProxy "
            f"{_st(ratio(records, 'parallel', endpoint, WORKERS, 'haproxy', _rate))}, {WORKERS}/gate "
            f"{_st(ratio(records, 'parallel', endpoint, WORKERS, 'gate', _rate))}; "
            f"CPU per request: {shown}"
        )
    for endpoint in endpoints(records, "latency"):
        added_p50 = {
            p: added(records, "latency", endpoint, p, "direct", _ms("p50"))
            for p in ("gate", WORKERS, "haproxy")
        }
        shown = ", ".join(
            f"{_LABEL.get(p, p)} {_st(v, ' ms', 3)}" for p, v in added_p50.items() if v is not None
        )
        out.append(f"latency GET {endpoint} (1 connection), p50 added over direct: {shown}")
    for scenario in ("decision", "create"):
        for endpoint in endpoints(records, scenario):
            out.append(
                f"{scenario} {endpoint}, p50 added over direct: gate "
                f"{_st(added(records, scenario, endpoint, 'gate', 'direct', _ms('p50')), ' ms', 3)}, HAProxy "
                f"{_st(added(records, scenario, endpoint, 'haproxy', 'direct', _ms('p50')), ' ms', 3)}"
            )
    for r in records:
        if r["scenario"] == "engine":
            cold = f", {r['us_cold']:.0f} µs with the CPU caches emptied first" if r.get("us_cold") else ""
            out.append(f"decision engine alone (in-process): {r['us_per_call']:.0f} µs per decision{cold}")
    for endpoint in endpoints(records, "bulk"):
        out.append(
            f"bulk {endpoint}: gate/direct {_st(ratio(records, 'bulk', endpoint, 'gate', 'direct', _mbps))}, "
            f"gate/HAProxy {_st(ratio(records, 'bulk', endpoint, 'gate', 'haproxy', _mbps))}, "
            f"HAProxy/direct {_st(ratio(records, 'bulk', endpoint, 'haproxy', 'direct', _mbps))}"
        )
    for r in records:
        if r["scenario"] == "memory":
            out.append(
                f"memory {r['endpoint']} via {r['path']}: {r['kib_per_item']:.1f} KiB each ({r['count']})"
            )
    for t in targets(records):
        out.append(f"target {t.what}: {_st(t.measured, t.unit)} -> {t.verdict}")
    return out


def chart(records: list[Record], path: Path, title: str) -> str | None:
    """Writes the PNG chart; returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (tox -e bench installs it)"
    colours = {"direct": "#8c8c8c", "haproxy": "#4c72b0", "gate": "#dd8452", WORKERS: "#e8c07d"}
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    fig.suptitle(title)

    def bars(
        ax: Any,
        groups: list[str],
        value: Callable[[str, str], float | None],
        ylabel: str,
        limit: float | None = None,
    ) -> None:
        # Only the paths measured here: gate-w2 runs in the rate scenarios, not in bulk or memory.
        paths = [p for p in PATHS if any(value(g, p) is not None for g in groups)] or list(PATHS)
        width = 0.8 / len(paths)
        for i, path in enumerate(paths):
            ys = [value(g, path) for g in groups]
            xs = [j + (i - (len(paths) - 1) / 2) * width for j in range(len(groups))]
            ax.bar(xs, [y or 0 for y in ys], width, label=path, color=colours[path])
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([g.replace(" (", "\n(") for g in groups], fontsize=8)
        ax.set_ylabel(ylabel)
        if limit is not None:
            ax.axhline(limit, color="red", linestyle="--", linewidth=1, label="target")
        ax.legend(fontsize=7)

    rate_eps = endpoints(records, "rate")
    bars(
        axes[0][0],
        rate_eps,
        lambda e, p: median_of(records, "rate", e, p, _rate),
        "requests/s (higher is better)",
    )
    axes[0][0].set_title("keep-alive request rate")
    bars(axes[0][1], rate_eps, lambda e, p: median_of(records, "rate", e, p, _cpu), "µs (lower is better)")
    axes[0][1].set_title("proxy CPU per request")
    bars(axes[0][2], rate_eps, lambda e, p: median_of(records, "rate", e, p, _ms("p99")), "ms")
    axes[0][2].set_title("p99 latency under load")
    bulk_eps = endpoints(records, "bulk")
    bars(
        axes[1][0],
        bulk_eps,
        lambda e, p: median_of(records, "bulk", e, p, _mbps),
        "MB/s (higher is better)",
    )
    axes[1][0].set_title("bulk transfer")
    create_groups = [("decision", e) for e in endpoints(records, "decision")] + [
        ("create", e) for e in endpoints(records, "create")
    ]
    labels = ["create (409)" if s == "decision" else "create (201)" for s, _ in create_groups]

    def added_p50(label: str, path: str) -> float | None:
        scenario, endpoint = create_groups[labels.index(label)]
        stat = added(records, scenario, endpoint, path, "direct", _ms("p50"))
        return None if stat is None else stat.median

    bars(axes[1][1], labels, added_p50, "ms added over direct (p50)", 0.5)
    axes[1][1].set_title("create: added p50 latency")
    mem = [r for r in records if r["scenario"] == "memory"]
    mem_groups = []
    for r in mem:
        if r["endpoint"] not in mem_groups:
            mem_groups.append(r["endpoint"])

    def per_item(group: str, path: str) -> float | None:
        found = [r["kib_per_item"] for r in mem if r["endpoint"] == group and r["path"] == path]
        return float(found[0]) if found else None

    bars(axes[1][2], mem_groups, per_item, "KiB per item", 64)
    axes[1][2].set_title("resident memory per held connection")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
