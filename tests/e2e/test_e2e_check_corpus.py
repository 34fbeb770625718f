"""`rdc repo check` against the live gate, case by case (tests/check_corpus.py): each docker create
line and Compose project is checked offline, then sent by the real docker CLI or Compose to repo
alpha's gate; both must say admitted or refused, with the same rules. Zero disagreements.

The live rules are the gate's audit entries written while the case ran. A Compose project that
fails stops at its first refused request, so there the live rules must be among the check's (and
equal to them when the check refuses one request).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from check_corpus import COMMON_FILES, CORPUS, GPU0, Case
from click.testing import CliRunner
from e2e_kit import E2E, wait_for

from rediacc_core.cli import cli
from rediacc_core.repos import files_dir

_CREATES = ("container-create", "volume-create", "network-create", "grpc")


@dataclass
class Outcome:
    case: Case
    checked: list[dict[str, Any]] | None = None
    check_error: str = ""
    live_rc: int = 0
    live_stderr: str = ""
    window: tuple[float, float] = (0.0, 0.0)
    live_rules: set[str] = field(default_factory=set)
    live_refusals: int = 0
    live_decided: int = 0  # the gate's decisions on the case's creates and builds


def _words(case: Case, directory: Path, files: Path) -> list[str]:
    return [w.replace("{files}", str(files)).replace("{dir}", str(directory)) for w in case.words]


def _check(e2e: E2E, words: list[str], env: dict[str, str]) -> tuple[list[dict[str, Any]] | None, str]:
    """The offline check, in this process (as `rdc repo check` runs it), in the case's directory."""
    result = CliRunner().invoke(
        cli,
        ["repo", "check", e2e.alpha.repo.ref, "-o", "json", "--", "docker", *words],
        env={**env, "REDIACC_CONFIG": str(e2e.config_path)},
    )
    if result.exit_code not in (0, 4):
        return None, f"exit {result.exit_code}: {result.output}"
    return json.loads(result.stdout), ""


def _live(e2e: E2E, words: list[str], directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *words], capture_output=True, text=True, cwd=directory, env=e2e.alpha.env, timeout=300
    )


def _audit(e2e: E2E) -> list[dict[str, Any]]:
    lines = e2e.alpha.runtime.audit_log.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _settled_decisions(e2e: E2E) -> list[dict[str, Any]]:
    """The refusals and creates in the audit log once no worker adds any: each writes its batch a
    quarter of a second after a decision, later on a loaded host, so the log is read until two reads
    a second apart agree (for 30 s at most)."""
    deadline = time.monotonic() + 30
    before: list[dict[str, Any]] | None = None
    while True:
        now = [e for e in _audit(e2e) if e.get("decision") == "refused" or e.get("endpoint") in _CREATES]
        if now == before or time.monotonic() > deadline:
            return now
        before = now
        time.sleep(1)


def _stamp(entry: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(entry["time"])).timestamp()


def _disagreement(o: Outcome) -> str | None:
    if o.checked is None:
        return f"the check failed: {o.check_error}"
    refused_rows = [row for row in o.checked if not row["admitted"]]
    checked_rules = {r["rule"] for row in refused_rows for r in row["refusals"]}
    # The gate's decision is compared, not the daemon's: a create the gate admits may still fail
    # in the daemon (`--storage-opt` on a file system without quotas).
    live_refused = o.live_refusals > 0
    if not o.live_decided:
        return f"the gate decided nothing (rc {o.live_rc}): {o.live_stderr.strip()[-400:]}"
    if bool(refused_rows) != live_refused:
        said = "refused " + str(sorted(checked_rules)) if refused_rows else "admitted"
        return f"check {said}, live {'refused ' + str(sorted(o.live_rules)) if live_refused else 'admitted'}"
    if not live_refused:
        return None
    compose = o.case.words[0] == "compose"
    if (compose and len(refused_rows) > 1 and o.live_rules <= checked_rules) or o.live_rules == checked_rules:
        return None
    return f"rules differ: check {sorted(checked_rules)}, live {sorted(o.live_rules)}"


def _down(e2e: E2E, case: Case, words: list[str], directory: Path) -> None:
    if case.words[0] == "compose":
        _live(e2e, [*words[: words.index("up")], "down", "-v", "--remove-orphans"], directory)


def test_the_check_and_the_live_gate_agree_on_every_case(
    e2e: E2E, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(CORPUS) >= 100
    files = files_dir(e2e.machine, e2e.alpha.repo.id)
    files.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in e2e.alpha.env.items() if k != "DOCKER_HOST"}  # the check sends nothing
    outcomes: list[Outcome] = []
    created: list[str] = []
    e2e.grant(e2e.alpha, GPU0)
    try:
        for n, case in enumerate(CORPUS):
            directory = tmp_path / f"c{n:03d}"
            directory.mkdir()
            for name, text in {**COMMON_FILES, **dict(case.files)}.items():
                (directory / name).write_text(text.replace("{files}", str(files)))
            words = _words(case, directory, files)
            monkeypatch.chdir(directory)
            outcome = Outcome(case)
            outcome.checked, outcome.check_error = _check(e2e, words, env)
            time.sleep(0.01)  # the audit clock is in milliseconds: no entry falls in two windows
            start = time.time()
            live = _live(e2e, words, directory)
            outcome.window = (start, time.time())
            outcome.live_rc, outcome.live_stderr = live.returncode, live.stderr
            if case.words[0] == "create" and live.returncode == 0:
                created.append(live.stdout.strip())
            _down(e2e, case, words, directory)
            outcomes.append(outcome)
    finally:
        e2e.revoke(e2e.alpha, GPU0)
        if created:
            e2e.alpha.docker("rm", "-f", *created)
    last = outcomes[-1].window[1]
    assert wait_for(lambda: any(_stamp(e) >= last - 5 for e in _audit(e2e)), timeout=10)
    decided = _settled_decisions(e2e)
    for o in outcomes:
        mine = [e for e in decided if o.window[0] - 0.002 <= _stamp(e) <= o.window[1] + 0.002]
        refused = [e for e in mine if e.get("decision") == "refused"]
        o.live_decided, o.live_refusals = len(mine), len(refused)
        o.live_rules = {rule for e in refused for rule in e.get("rules") or ()}
    for o in outcomes:  # shown with -s: what each case got, for a reader looking for a wrong admit
        print(
            f"{o.case.name}: {'refused ' + ','.join(sorted(o.live_rules)) if o.live_refusals else 'admitted'}"
        )
    problems = [(o.case.name, why) for o in outcomes if (why := _disagreement(o)) is not None]
    assert not problems, "\n".join(f"{name}: {why}" for name, why in problems)
