"""The gate benchmark's smoke run (`python bench/run.py --quick`) on a real Docker Engine.

It starts a private dockerd, HAProxy and the gate, measures every path, writes its results and
leaves nothing behind. It only checks that the benchmark works: speed is judged from the numbers
it writes (bench/results/), never by a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("RDC_E2E") != "1", reason="needs root, Docker Engine and HAProxy: set RDC_E2E=1"
    ),
]

ROOT = Path(__file__).resolve().parents[2]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_quick_run_measures_direct_haproxy_the_gate_and_the_gate_with_workers_then_cleans_up(
    tmp_path: Path,
) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output

    results = json.loads((tmp_path / "latest.json").read_text())
    records = results["records"]
    assert {r["path"] for r in records} == {"direct", "haproxy", "gate", "gate-w2"}
    # The gate with two worker processes runs beside the default gate in the keep-alive scenarios only.
    assert {r["scenario"] for r in records if r["path"] == "gate-w2"} == {"rate", "latency", "parallel"}
    assert any(r["path"] == "gate-w2" and r["proxy_processes"] == 3 for r in records)  # supervisor + 2
    scenarios = {r["scenario"] for r in records}
    assert scenarios == {
        "rate",
        "latency",
        "parallel",
        "decision",
        "create",
        "cli-create",
        "engine",
        "bulk",
        "memory",
    }
    assert results["meta"]["commit"].split()[0] != "unknown"

    # One dated table per run, and latest.md pointing at it.
    (dated,) = tmp_path.glob("results-*.md")
    assert dated.name in (tmp_path / "latest.md").read_text()
    table = dated.read_text()
    assert "Every request got the expected status; no errors." in table, table
    assert "gate/HAProxy" in run.stdout and "gate/direct" in run.stdout and "gate-w2/gate" in run.stdout

    workdir = next(line.split()[-1] for line in run.stdout.splitlines() if "work directory" in line)
    assert not Path(workdir).exists(), f"{workdir} was left behind"
    assert _processes_mentioning(workdir) == [], "processes outlived the benchmark"


def _quick_rate_run(tmp_path: Path, command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, *command, "--quick", "--only", "rate", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (dated,) = tmp_path.glob("results-*.md")
    table = dated.read_text()
    assert "Every request got the expected status; no errors." in table, table
    results: dict[str, Any] = json.loads((tmp_path / "latest.json").read_text())
    results["table"] = table
    return results


def test_gate_at_measures_the_gate_of_another_commit_and_the_report_names_it(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    results = _quick_rate_run(tmp_path, [str(ROOT / "bench" / "gate_at.py"), "HEAD"])

    override = results["meta"]["gate_override"]
    assert f"rdc-gate-at-{head[:12]}-" in override and "-P -m rediacc_core.runtime.serve" in override
    assert "In the gate's place (RDC_BENCH_GATE_CMD)" in results["table"]
    assert any(r["path"] == "gate" and r["scenario"] == "rate" for r in results["records"])
    left = list(Path(tempfile.gettempdir()).glob(f"rdc-gate-at-{head[:12]}-*"))
    assert left == [], "the extracted tree was left behind"


def test_the_relay_floor_stands_in_the_gates_place(tmp_path: Path) -> None:
    relay = "{python} " + str(ROOT / "bench" / "relay_floor.py") + " --listen {listen} --upstream {upstream}"
    results = _quick_rate_run(
        tmp_path, [str(ROOT / "bench" / "run.py")], env=dict(os.environ, RDC_BENCH_GATE_CMD=relay)
    )

    assert results["meta"]["gate_override"] == relay
    assert results["meta"]["workers_missing"], "gate-w2 is the gate's own variant: not run beside a stand-in"
    assert {r["path"] for r in results["records"]} == {"direct", "haproxy", "gate"}
