"""The gate benchmark: dockerd direct, through HAProxy, and through the gate, side by side.

    python bench/run.py [--rounds N] [--quick] [--out DIR] [--profile SECONDS] [--no-workers]

Starts a private dockerd, HAProxy and the gate in a temporary directory (and, for the request rate
and latency, a second gate for the same repo in two worker processes, `gate-w2`), measures every path
interleaved, writes `results-<date>-<commit>.md` (kept), `latest.md` (a pointer to it), `latest.json`
and `chart.png` (regenerated each run, not committed) to the output directory (bench/results, or
bench/results/quick for --quick), prints the ratios gate/HAProxy, gate/direct and gate-w2/gate, and
stops everything it started. Needs root (dockerd), a C compiler, curl, HAProxy and Docker Engine;
see bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cli_capture
import decide_cost
import gate_launch
import gate_profile
import loadgen
import report
import scenarios
import stack
import uds

BENCH = Path(__file__).resolve().parent
REPO_ROOT = BENCH.parent
KEEP = {"bench-taken", "bench-bulk"}
DECISION_TARGET = "/{api}/containers/create?name=bench-taken"


def log(text: str) -> None:
    print(text, flush=True)


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise TimeoutError("the benchmark ran past its time limit; stopping everything it started")


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def missing_tools() -> list[str]:
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root: the benchmark starts its own dockerd")
    for tool, hint in (
        (stack.DOCKERD, "Docker Engine (bash .ci/install-docker.sh)"),
        (stack.HAPROXY, "HAProxy (apt-get install haproxy)"),
        (stack.BUSYBOX, "busybox-static (apt-get install busybox-static)"),
        ("curl", "curl (apt-get install curl)"),
    ):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found: install {hint}")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        problems.append("no C compiler: apt-get install gcc")
    return problems


def _run_text(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def commit_measured() -> str:
    head = _run_text(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"]) or "unknown"
    # What a run writes (bench/results) is output, not what was measured: a second run is not "dirty".
    dirty = _run_text(
        [
            "git",
            "-C",
            str(REPO_ROOT),
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":!bench/results",
        ]
    )
    untracked_core = _run_text(
        [
            "git",
            "-C",
            str(REPO_ROOT),
            "status",
            "--porcelain",
            "--",
            "rediacc_core",
            "plugins",
            "pyproject.toml",
        ]
    )
    return head + (" + uncommitted changes" if dirty or untracked_core else "")


def machine_text() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return f"{os.cpu_count()} CPUs ({model}), {mem_kib / 1048576:.0f} GiB RAM, Linux {platform.release()}"


def software_text(docker_sock: str) -> str:
    try:
        docker = uds.call(docker_sock, "GET", "/version").json()
        engine = f"Docker Engine {docker['Version']} (API {docker['ApiVersion']})"
    except (OSError, uds.HttpError, ValueError, KeyError):
        engine = "Docker Engine (version unknown)"
    haproxy = _run_text([stack.HAPROXY, "-v"]).splitlines()
    return f"{engine}, {haproxy[0] if haproxy else 'HAProxy'}, Python {platform.python_version()}"


def api_version(docker_sock: str) -> str:
    with uds.Conn(docker_sock) as conn:
        resp = conn.request("GET", "/_ping")
    return resp.headers.get("api-version", "1.45")


def settings_text(s: scenarios.Settings) -> str:
    return (
        f"{s.rounds} rounds × {s.slices} cycles; per path and cycle: rate {s.rate_conns} connections × "
        f"{s.rate_seconds:g} s, {s.decisions} decision and {s.creates} real creates; per round: "
        f"{s.bulk_per_round} bulk cycle(s) of {s.bulk_mib} MiB each way; {s.idle_conns} idle connections; "
        f"{s.attached} attached containers"
    )


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, help="rounds of interleaved measurements (default 3, quick 1)")
    parser.add_argument(
        "--quick", action="store_true", help="a short smoke run with small sizes (under a minute)"
    )
    parser.add_argument(
        "--out", type=Path, help="where results go (default bench/results, quick: bench/results/quick)"
    )
    parser.add_argument(
        "--profile",
        type=float,
        default=0,
        metavar="SECONDS",
        help="also sample the gate with py-spy under GET /_ping and the create decision",
    )
    parser.add_argument("--only", default="rate,create,bulk,memory", help="comma list of scenarios to run")
    parser.add_argument(
        "--data-on-disk",
        action="store_true",
        help="keep dockerd's data on disk instead of a tmpfs (bulk numbers then follow the disk)",
    )
    parser.add_argument(
        "--keep-workdir", action="store_true", help="leave the temporary directory (logs) behind"
    )
    parser.add_argument(
        "--no-workers",
        action="store_true",
        help=f"do not measure {gate_launch.WORKERS}, the gate in two worker processes, beside the default",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    chosen = choose(args)
    if chosen is None:
        return 2
    settings, only = chosen
    out_dir = args.out or (BENCH / "results" / "quick" if args.quick else BENCH / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    arm_time_limit(settings, args)
    stack.raise_fd_limit()

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="rdc-bench-"))
    st = stack.Stack(workdir)
    records: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    try:
        log(f"bench: work directory {workdir}")
        run_all(st, workdir, args, argv, settings, only, out_dir, records, meta)
    except BaseException as exc:
        log(f"bench: stopped early: {type(exc).__name__}: {exc}")
        for proc in st.procs:
            if not proc.alive():
                log(f"bench: {proc.name} had exited; its log ends with:\n{proc.log_tail()}")
        raise
    finally:
        signal.alarm(0)
        meta["elapsed_s"] = time.monotonic() - started
        meta["loadavg_after"] = loadavg()
        if records and meta.get("date"):
            write_results(records, meta, out_dir)
        log("bench: stopping dockerd, HAProxy and the gate")
        st.close()
        if args.keep_workdir:
            log(f"bench: work directory kept: {workdir}")
        else:
            stack.remove_tree(workdir)
    return 0


def choose(args: argparse.Namespace) -> tuple[scenarios.Settings, set[str]] | None:
    """The settings and the scenarios asked for; None, having said why, when the run cannot go on."""
    settings = scenarios.QUICK if args.quick else scenarios.FULL
    if args.rounds:
        if args.rounds < 1:
            print("error: --rounds must be at least 1", file=sys.stderr)
            return None
        settings = dataclasses.replace(settings, rounds=args.rounds)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {"rate", "create", "bulk", "memory"}
    if unknown:
        print(
            f"error: unknown scenario(s) {', '.join(sorted(unknown))}; pick from rate,create,bulk,memory",
            file=sys.stderr,
        )
        return None
    problems = missing_tools()
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return None
    return settings, only


def arm_time_limit(settings: scenarios.Settings, args: argparse.Namespace) -> None:
    """Everything stops by itself: a hard limit on the whole run, then `main`'s finally block cleans up."""
    limit_s = int(180 + settings.cycles * 45 + args.profile) if not args.quick else 150
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGTERM, _on_term)
    signal.alarm(limit_s)


@dataclass
class Paths:
    """The paths under measurement: each one's socket and first process, and why a gate is missing."""

    socks: dict[str, str]
    rate_socks: dict[str, str]  # `socks` and, when started, the gate with workers
    pids: dict[str, int]
    launch: gate_launch.GateLaunch | None  # None when the gate is not measured
    gate_missing: str | None
    workers_missing: str | None


def start_paths(st: stack.Stack, workdir: Path, args: argparse.Namespace, only: set[str]) -> Paths:
    """dockerd, HAProxy before it, the gate and (for the rate scenarios) the gate with workers."""
    docker_sock = st.start_dockerd(data_in_memory=not args.data_on_disk)
    st.import_image()
    haproxy_sock = st.start_haproxy(docker_sock)
    gate_launch.write_machine(st.machine_root)
    socks = {"direct": docker_sock, "haproxy": haproxy_sock}
    pids = {"haproxy": st.haproxy_proc.pid} if st.haproxy_proc else {}
    launch: gate_launch.GateLaunch | None = None
    gate_missing = gate_launch.gate_available()
    if gate_missing is None:
        launch = gate_launch.launch(workdir, st.machine_root, docker_sock)
        socks["gate"] = st.start_gate(launch.argv, launch.sock, launch.env)
    else:
        log(f"bench: the gate is not measured: {gate_missing}")
    # The rate scenarios also measure the gate in two worker processes, in the same cycles as the
    # default gate: what worker processes buy, free of the noise between separate runs.
    rate_socks = dict(socks)
    workers_missing: str | None = None
    if "rate" in only and launch is not None:
        started_w = start_with_workers(st, launch, workdir, args.no_workers)
        if isinstance(started_w, str):
            workers_missing = started_w
            log(f"bench: {gate_launch.WORKERS} (the gate with workers) not measured: {started_w}")
        else:
            rate_socks[gate_launch.WORKERS], pids[gate_launch.WORKERS] = started_w
    return Paths(socks, rate_socks, pids, launch, gate_missing, workers_missing)


def run_all(
    st: stack.Stack,
    workdir: Path,
    args: argparse.Namespace,
    argv: list[str],
    settings: scenarios.Settings,
    only: set[str],
    out_dir: Path,
    records: list[dict[str, Any]],
    meta: dict[str, Any],
) -> None:
    """Starts every path, then measures the rounds and the asides; fills `records` and `meta` as it goes."""
    paths = start_paths(st, workdir, args, only)
    docker_sock = paths.socks["direct"]
    binary = loadgen.build(workdir)
    api = "v" + api_version(docker_sock)
    body, body_source = cli_capture.capture_create_body(workdir, api[1:], stack.IMAGE, gate_launch.DEVICE)
    body_file = workdir / "create-body.json"
    body_file.write_bytes(body)
    meta.update(describe_run(st, paths, settings, argv, f"{len(body)} bytes, {body_source}"))
    create_helper_containers(docker_sock, body)
    tar_path = workdir / "bulk.tar"
    if "bulk" in only:
        scenarios.write_bulk_tar(tar_path, settings.bulk_mib)

    if st.gate_proc is not None:
        paths.pids["gate"] = st.gate_proc.pid
    repo_id = paths.launch.repo_id if paths.launch is not None else ""
    ctx = Context(
        binary, paths.socks, paths.rate_socks, paths.pids, body_file, api, docker_sock, tar_path, settings,
        st.machine_root, repo_id,
    )  # fmt: skip
    for round_no in range(settings.rounds):
        log(f"bench: round {round_no + 1} of {settings.rounds}")
        measure_round(ctx, round_no, only, records)
    if "create" in only and ctx.repo_id:
        records += measure_decisions(ctx, body)
    if "memory" in only:
        records += measure_memory(ctx, st)

    if args.profile and st.gate_proc is not None:
        profile_gate(ctx, st.gate_proc.pid, args.profile, out_dir, meta)


def describe_run(
    st: stack.Stack, paths: Paths, settings: scenarios.Settings, argv: list[str], create_body: str
) -> dict[str, Any]:
    """What the results say about the run: when, which commit, on what, with which settings."""
    docker_sock = paths.socks["direct"]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit_measured(),
        "machine": machine_text(),
        "software": software_text(docker_sock)
        + (
            f"; the gate on Python's {gate_launch.event_loop()} event loop"
            if paths.gate_missing is None
            else ""
        ),
        "settings": settings_text(settings) + f"; dockerd's data-root on {st.data_on}",
        "create_body": create_body,
        "command": "python bench/run.py " + " ".join(argv),
        "rate_conns": settings.rate_conns,
        "rate_seconds": settings.rate_seconds,
        "bulk_mib": settings.bulk_mib,
        "gate_missing": paths.gate_missing,
        "gate_override": os.environ.get(gate_launch.OVERRIDE_ENV),
        "workers_missing": paths.workers_missing,
        "loadavg_before": loadavg(),
    }


def create_helper_containers(docker_sock: str, body: bytes) -> None:
    """The two containers the scenarios name and keep (`KEEP`)."""
    direct_create = uds.call(docker_sock, "POST", "/containers/create?name=bench-taken", json.loads(body))
    bulk_create = uds.call(
        docker_sock,
        "POST",
        "/containers/create?name=bench-bulk",
        {"Image": stack.IMAGE, "Cmd": ["true"], "HostConfig": {"NetworkMode": "none"}},
    )
    if direct_create.status != 201 or bulk_create.status != 201:
        raise RuntimeError(
            f"could not create the helper containers: {direct_create.body!r} {bulk_create.body!r}"
        )


def measure_decisions(ctx: Context, body: bytes) -> list[dict[str, Any]]:
    """The decision engine alone, in this process: an aside, so a failure only says so."""
    s = ctx.settings
    with timed("decision engine in-process"):
        try:
            return [
                decide_cost.measure(
                    ctx.machine_root, ctx.repo_id, ctx.docker_sock, DECISION_TARGET.format(api=ctx.api), body,
                    max(200, s.decisions * s.cycles),
                )
            ]  # fmt: skip
        except Exception as exc:  # an aside: the gate's own numbers stand without it
            log(f"bench: the decision engine was not measured alone: {type(exc).__name__}: {exc}")
            return []


def start_with_workers(
    st: stack.Stack, launch: gate_launch.GateLaunch, workdir: Path, skip: bool
) -> tuple[str, int] | str:
    """Starts the gate in two worker processes beside the default gate: its (socket, pid), or why not."""
    if skip:
        return "--no-workers was given"
    one = gate_launch.with_workers(launch, workdir)
    if isinstance(one, str):
        return one
    try:
        proc = st.start_other_gate(gate_launch.WORKERS, one.argv, one.sock, one.env)
    except RuntimeError as exc:  # e.g. a gate too old for --workers: the rest of the run stands
        log(f"bench: {exc}")
        return f"it did not start ({str(exc).splitlines()[0]})"
    return one.sock, proc.pid


@dataclass(frozen=True)
class Context:
    """What every measurement needs: the load generator, the sockets, the request bodies."""

    binary: Path
    socks: dict[str, str]
    rate_socks: dict[str, str]  # `socks` and, when measured, the gate with workers (rate, latency)
    pids: dict[str, int]  # each proxy's first process; its CPU and memory include its descendants
    body_file: Path
    api: str
    docker_sock: str
    tar_path: Path
    settings: scenarios.Settings
    machine_root: Path
    repo_id: str  # the bench repo, "" when the gate is not measured


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        log(f"  {label}: {time.monotonic() - start:.1f}s")


def measure_round(ctx: Context, round_no: int, only: set[str], records: list[dict[str, Any]]) -> None:
    """One round: `slices` short cycles of the request scenarios, then its bulk cycles.

    Appends to `records` as it goes, so a run stopped part-way still reports what it measured.
    """
    s = ctx.settings
    with timed(f"{s.slices} cycles of rate, latency and create"):
        for slice_no in range(s.slices):
            cycle = round_no * s.slices + slice_no
            if "rate" in only:
                for endpoint in ("/_ping", f"/{ctx.api}/containers/json"):
                    records += scenarios.rate(ctx.binary, ctx.rate_socks, ctx.pids, endpoint, cycle, s)
                records += scenarios.latency(ctx.binary, ctx.rate_socks, ctx.pids, "/_ping", cycle, s)
                records += scenarios.parallel_decisions(
                    ctx.binary, ctx.rate_socks, ctx.pids, ctx.body_file, ctx.api, "bench-taken", cycle, s
                )
            if "create" in only:
                records += scenarios.decision(
                    ctx.binary, ctx.socks, ctx.pids, ctx.body_file, ctx.api, "bench-taken", cycle, s
                )
                records += scenarios.create(
                    ctx.binary, ctx.socks, ctx.body_file, ctx.api, ctx.docker_sock, KEEP, cycle, s
                )
                records += scenarios.cli_create(
                    ctx.socks,
                    ctx.docker_sock,
                    KEEP,
                    stack.IMAGE,
                    gate_launch.DEVICE,
                    ctx.body_file.parent / "docker-cli",
                    cycle,
                    s,
                )
    if "bulk" in only:
        with timed("bulk"):
            for k in range(s.bulk_per_round):
                cycle = round_no * s.bulk_per_round + k
                records += scenarios.bulk(ctx.socks, ctx.tar_path, ctx.api, "bench-bulk", cycle, s)


def measure_memory(ctx: Context, st: stack.Stack) -> list[dict[str, Any]]:
    """Idle connections, then attach streams, held through the gate and (for reference) HAProxy."""
    log("bench: memory")
    records = []

    def fresh_pids() -> dict[str, int]:
        # A fresh gate before each measurement: after earlier load its allocator holds freed memory
        # that new connections would reuse, which would make them look cheaper than they are.
        pids = {"haproxy": st.haproxy_proc.pid} if st.haproxy_proc else {}
        if st.gate_proc is not None:
            with timed("restart the gate"):
                st.restart_gate()
                scenarios.warm_up(ctx.socks["gate"])
                pids["gate"] = st.gate_proc.pid
        return pids

    pids = fresh_pids()
    for name in ("gate", "haproxy"):
        if name in pids:
            with timed(f"{ctx.settings.idle_conns} idle connections via {name}"):
                records.append(
                    scenarios.idle_connections(name, ctx.socks[name], pids[name], ctx.settings.idle_conns)
                )
    with timed(f"start {ctx.settings.attached} containers"):
        ids = scenarios.start_attachable(ctx.docker_sock, ctx.settings.attached)
    pids = fresh_pids()
    for name in ("gate", "haproxy"):
        if name in pids:
            with timed(f"{len(ids)} attach streams via {name}"):
                records.append(scenarios.attached_streams(name, ctx.socks[name], pids[name], ctx.api, ids))
    with timed("remove the attached containers"):
        scenarios.remove_all_but(ctx.docker_sock, KEEP)
    return records


def profile_gate(ctx: Context, pid: int, seconds: float, out_dir: Path, meta: dict[str, Any]) -> None:
    """py-spy on the gate under `GET /_ping` (the pure proxy path) and under the create decision."""
    loads = [
        gate_profile.Load("ping", "/_ping", ctx.settings.rate_conns),
        gate_profile.Load(
            "create",
            DECISION_TARGET.format(api=ctx.api),
            1,
            "POST",
            ctx.body_file,
            ("Content-Type: application/json",),
        ),
    ]
    parts = [f"# Gate profile ({meta['date']}, commit {meta['commit']})", ""]
    for load in loads:
        log(f"bench: profiling the gate for {seconds:g}s under {load.method} {load.path}")
        stacks, summary = gate_profile.record(ctx.binary, ctx.socks["gate"], pid, seconds, out_dir, load)
        parts += [f"## {load.method} {load.path}", "", summary, "", gate_profile.summarise(stacks)]
    try:
        engine = decide_cost.profile(
            ctx.machine_root, ctx.repo_id, ctx.docker_sock, DECISION_TARGET.format(api=ctx.api),
            ctx.body_file.read_bytes(), 2000,
        )  # fmt: skip
    except Exception as exc:  # an aside: the profiles above stand without it
        engine = f"not profiled: {type(exc).__name__}: {exc}\n"
    parts += ["## The decision engine alone (cProfile, in the benchmark's process)", "", engine]
    (out_dir / "profile-top.md").write_text("\n".join(parts))
    log(f"bench: profile written to {out_dir / 'profile-top.md'}")


def write_results(records: list[dict[str, Any]], meta: dict[str, Any], out_dir: Path) -> None:
    """One dated table per run (kept), `latest.md` pointing at it, and the raw records and the chart,
    regenerated by every run and never committed (bench/results/.gitignore)."""
    text = report.markdown(records, meta)
    day = meta["date"].split()[0]
    dated = f"results-{day}-{meta['commit'][:7]}.md"
    (out_dir / dated).write_text(text)
    (out_dir / "latest.md").write_text(f"# Latest gate benchmark\n\n[{dated}]({dated}), {meta['date']}.\n")
    (out_dir / "latest.json").write_text(
        json.dumps({"meta": meta, "records": records}, indent=1, sort_keys=True)
    )
    why_not = report.chart(
        records, out_dir / "chart.png", f"rediacc gate benchmark, {meta['date']}, {meta['commit'][:12]}"
    )
    log(f"bench: results in {out_dir / dated}" + (f" (no chart: {why_not})" if why_not else " and chart.png"))
    log("")
    for line in report.summary_lines(records):
        log(line)


if __name__ == "__main__":
    sys.exit(main())
