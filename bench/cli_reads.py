"""Local `rdc` reads as multiples of a bare `python3 -c pass` (t_py), optionally beside another commit.

    python bench/cli_reads.py [--runs 15] [--compare REF] [--out bench/results]

Builds a demo machine (as `rdc demo` does), then runs, interleaved, `python -c pass` and each read
command in a fresh interpreter and reports medians, as milliseconds and as multiples of t_py, so the
numbers carry over between machines. `--compare REF` checks REF out into a temporary worktree and
runs the same commands from it in the same rounds (its sources first on PYTHONPATH), so the table
shows both side by side. Writes `cli-reads.md` to the output directory.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
READS = {
    "rdc --version": ["--version"],
    "rdc --help": ["--help"],
    "rdc repo gpu list alpha@demo": ["repo", "gpu", "list", "alpha@demo"],
    "rdc machine gpu list demo": ["machine", "gpu", "list", "demo"],
    "rdc repo list demo": ["repo", "list", "demo"],
    "rdc machine list": ["machine", "list"],
}


def source_path(tree: Path) -> str:
    parts = [tree, *(tree / "plugins" / name for name in ("nvidia", "rediacc_dri", "rediacc_amd"))]
    return os.pathsep.join(str(p) for p in parts)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The wall time of `argv` and the CPU time (user + system) the process spent: the CPU time
    moves less when other work shares the host."""
    start = time.perf_counter()
    # From a neutral directory: `python -m` puts the working directory first on sys.path.
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
    assert proc.stderr is not None
    errors = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {errors.decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime


def commit_of(tree: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True)
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--compare", metavar="REF", help="a commit to measure beside this tree")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rdc-cr-", dir="/tmp"))
    try:
        trees = {commit_of(REPO): REPO}
        if options.compare:
            other = work / "compare"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(other), options.compare],
                check=True,
            )
            trees = {commit_of(other): other, **trees}
        base = {
            k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"
        }  # as installed: with .pyc
        base["REDIACC_CONFIG"] = str(work / "rdc.yaml")
        made = subprocess.run(
            [sys.executable, "-m", "rediacc_core.cli", "demo", "--workdir", str(work / "demo")],
            env={**base, "PYTHONPATH": source_path(REPO)},
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise SystemExit(f"rdc demo failed: {made.stderr}")
        envs = {name: {**base, "PYTHONPATH": source_path(tree)} for name, tree in trees.items()}
        cli = [sys.executable, "-m", "rediacc_core.cli"]
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        for env in envs.values():  # warm: .pyc files, the parsed config, the checked state files
            for argv in READS.values():
                timed([*cli, *argv], env)
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(options.runs):
            samples.setdefault(("", "t_py"), []).append(timed([sys.executable, "-c", "pass"], base))
            for name, env in envs.items():
                for label, argv in READS.items():
                    samples.setdefault((name, label), []).append(timed([*cli, *argv], env))
        report(samples, list(envs), options.runs, options.out, load)
    finally:
        if options.compare:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "compare")])
        shutil.rmtree(work, ignore_errors=True)


def report(
    samples: dict[tuple[str, str], list[tuple[float, float]]],
    trees: list[str],
    runs: int,
    out: Path,
    load: str,
) -> None:
    t_py = statistics.median(wall for wall, _ in samples[("", "t_py")])
    cpu_py = statistics.median(cpu for _, cpu in samples[("", "t_py")])
    header = "| command | " + " | ".join(f"{t} ms | {t} t_py | {t} CPU t_py" for t in trees) + " |"
    lines = [
        "# Local `rdc` reads, as multiples of `python3 -c pass`",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}): medians of {runs} interleaved rounds, each command a fresh "
        f"`python -m rediacc_core.cli` with .pyc files, on a demo machine. t_py = {t_py * 1000:.1f} ms "
        f"(its CPU time {cpu_py * 1000:.1f} ms); load average before: {load}. CPU t_py: the command's "
        "CPU time over that of `python -c pass`, which moves less with the host's load.",
        "Target: each read <= 3.5 t_py. Rerun: `python bench/cli_reads.py [--compare REF]`.",
        "",
        header,
        "|---|" + "---:|---:|---:|" * len(trees),
    ]
    for label in READS:
        cells = []
        for tree in trees:
            median = statistics.median(wall for wall, _ in samples[(tree, label)])
            cpu = statistics.median(cpu for _, cpu in samples[(tree, label)])
            cells.append(f"{median * 1000:.0f} | {median / t_py:.1f} | {cpu / cpu_py:.1f}")
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cli-reads.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
