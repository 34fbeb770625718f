"""Where a suite that needs the machine must run (tox's e2e, e2e-28 and ssh envs, so CI), it must
also have run: a machine that cannot run it is a usage error, and a test that skipped is a failure
unless the suite's list of allowed skips names it, with the reason its skip must give and why that
skip is allowed. Without this every test could skip (port 80 taken, no compiler, a missing plugin)
and tox would still say OK.

The list (`allowed_skips.txt` beside the suite's conftest) has one skip a line:

    <test node id; * matches any run of characters> | <text its skip reason holds> | <why it is allowed>

Blank lines and lines starting with `#` are comments.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass(frozen=True)
class AllowedSkip:
    test: str  # a node id pattern (fnmatch: `*` and `?`, `[` taken literally)
    says: str  # text the skip's reason must hold
    why: str

    def covers(self, node_id: str, reason: str) -> bool:
        pattern = self.test.replace("[", "[[]")
        return fnmatch.fnmatchcase(node_id, pattern) and self.says in reason


def read_allowed(path: Path) -> list[AllowedSkip]:
    """The allowed skips of `path`; ValueError names a line that does not read."""
    allowed = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = [part.strip() for part in text.split(" | ")]
        if len(parts) != 3 or not all(parts):
            raise ValueError(
                f"{path}:{number}: not `test | what its skip says | why it is allowed`: {line!r}"
            )
        allowed.append(AllowedSkip(*parts))
    return allowed


def skip_reason_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


@dataclass(eq=False)  # a plugin: pytest keeps plugins in sets, by identity
class RequiredSuite:
    """A pytest plugin holding one suite (the tests under `here`) to having run where it is required."""

    name: str  # for messages: "end-to-end", "SSH"
    here: Path  # the suite's directory; its allowed_skips.txt lies there
    required_env: str  # RDC_E2E_REQUIRED, RDC_SSH_REQUIRED
    unmet: Callable[[], str | None]  # why the suite cannot run where it is required, or None
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def required(self) -> bool:
        return os.environ.get(self.required_env) == "1"

    @property
    def allowed_file(self) -> Path:
        return self.here / "allowed_skips.txt"

    def pytest_configure(self, config: pytest.Config) -> None:
        self.skipped.clear()  # one guard per conftest module, one session at a time

    def not_allowed(self, skipped: Sequence[tuple[str, str]]) -> list[str]:
        allowed = read_allowed(self.allowed_file)
        return [
            f"{node_id}: {reason}"
            for node_id, reason in skipped
            if not any(a.covers(node_id, reason) for a in allowed)
        ]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        unmet = self.unmet()
        if unmet is not None:
            raise pytest.UsageError(unmet)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)  # a module skipped whole (`pytest.importorskip`, a module-level skip)

    def _note(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        mine = Path(str(report.fspath)).resolve().is_relative_to(self.here.resolve())
        if mine and report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.append((report.nodeid, skip_reason_of(report)))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.required or not self.skipped:
            return
        bad = self.not_allowed(self.skipped)
        if not bad:
            return
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(
            f"{self.required_env}=1: {len(bad)} {self.name} test(s) skipped that must run here "
            f"(make them run, or name each in {self.allowed_file} with why its skip is allowed):",
            red=True,
        )
        for line in bad:
            writer.line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
