"""A stateful test of the operator's world: random sequences of what an operator does (repos made,
forked, brought up, interrupted, brought down and deleted; grants, leases and revokes; setup,
refresh, GPU health events and clears; the machine forgotten and added again; the demo built and
rebuilt), each through the CLI as typed, on a simulated (directory-rooted) machine. After every
step the world's invariants hold (`world_kit`): every process of rdc belongs to a repo `rdc repo
list` shows with the right state, no grant reaches hardware it was not bound to, no two exclusive
reservations overlap, every `What to do:` and `Next:` line parses; and a `rdc repo down` that a
refusal advises runs as printed.

A repo's running parts are stand-in processes named by its pidfiles, as `rdc repo up` leaves them
(all of a repo on an existing daemon: its gate; some of a repo with its own daemon: a `repo up` cut
short); `tests/e2e/test_e2e_interrupts.py` holds the same reading to real daemons. Derandomized,
with a bounded number of steps, so it runs the same every time."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from advice_kit import advised
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from setup_kit import KIND, FakeVendor, example_gpu, spec_document, use_vendor
from world_kit import advice_parses, grants_hold, processes_marked, running_named

from rediacc_core import CdiSpecFile, hookimpl
from rediacc_core.cli import cli
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_GENERAL
from rediacc_core.health import record_events
from rediacc_core.machine import Machine
from rediacc_core.model import HealthEvent, Inventory
from rediacc_core.plugins import Plugins, set_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.runtime import layout, lifecycle, status

NAMES = ("a", "b", "c")  # c lives on an existing daemon: its gate is all of it
DEVICES = (f"{KIND}=0", f"{KIND}=1", f"{KIND}=all")


class WorldVendor(FakeVendor):
    """Two cards; `all` reaches both, `N` the card of index N."""

    @hookimpl
    def rdc_hardware_units(self, name: str, inventory: Inventory) -> list[str] | None:
        kind, _, device = name.partition("=")
        if kind != KIND:
            return None
        return [f"pci:{g.pci_bus_id}" for g in inventory.gpus if device in ("all", str(g.index))]


class OperatorWorld(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="rdcw", dir="/tmp"))
        self.saved = {k: os.environ.get(k) for k in ("REDIACC_CONFIG", "REDIACC_LOAD_PLUGINS")}
        os.environ["REDIACC_CONFIG"] = str(self.base / "rdc.yaml")
        os.environ["REDIACC_LOAD_PLUGINS"] = ""
        from rediacc_core.testing import FakeMachine

        self.fm = FakeMachine(self.base / "m", name="box")
        self.vendor = WorldVendor(gpus=[example_gpu(0), example_gpu(1)])
        self.vendor.specs = [CdiSpecFile("example.yaml", spec=spec_document(self.fm, ["0", "1", "all"]))]
        self.plugins: Plugins = use_vendor(self.vendor)
        self.mark = f"rdc-world-{uuid.uuid4().hex[:12]}"  # in every stand-in's command line
        self.stand_ins: list[subprocess.Popen[bytes]] = []
        self.printed: list[str] = []
        self.ok("machine", "add", "box", "--root", str(self.fm.root))
        self.ok("machine", "setup", "box")
        self.events = 0

    def teardown(self) -> None:
        for process in self.stand_ins:
            process.kill()
            process.wait()
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        set_plugins(None)
        shutil.rmtree(self.base, ignore_errors=True)

    # --- how the operator acts -------------------------------------------------------------------
    def rdc(self, *args: str) -> Result:
        result = CliRunner().invoke(cli, list(args))
        self.printed += [result.stdout, result.stderr]
        assert result.exit_code != EXIT_GENERAL, f"rdc {' '.join(args)}: {result.output}"
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"rdc {' '.join(args)} raised {result.exception!r}"
        )
        return result

    def ok(self, *args: str) -> Result:
        result = self.rdc(*args)
        assert result.exit_code == 0, f"rdc {' '.join(args)}: {result.output}"
        return result

    @property
    def machine(self) -> Machine:
        return Config.load().machine("box")

    def repo(self, name: str) -> Any:
        found = [r for r in RepoStore(self.machine).list() if r.label == name]
        return found[0] if found else None

    def follow_the_downs(self, result: Result) -> None:
        """A refusal that advises `rdc repo down …` is followed as printed: each must succeed."""
        todo = [line for line in result.stderr.splitlines() if line.startswith("What to do:")]
        for line in todo:
            for argv in advised(line, ["repo", "machine", "demo"]):
                if argv[:2] == ["repo", "down"]:
                    self.ok(*shlex.split(" ".join(argv)))

    # --- rules -------------------------------------------------------------------------------------
    @initialize()
    def repos(self) -> None:
        for name in NAMES:
            self.create(name)

    @rule(name=st.sampled_from(NAMES))
    def create(self, name: str) -> None:
        """A repo made (again: refused while one of that name is)."""
        extra = ["--docker-host", f"unix://{self.base}/other.sock"] if name == "c" else []
        self.rdc("repo", "create", f"{name}@box", *extra)

    @rule(name=st.sampled_from(NAMES), whole=st.booleans())
    def start_parts(self, name: str, whole: bool) -> None:
        """The gate runs (for a repo on an existing daemon, all of it; otherwise a `repo up` cut short)."""
        repo = self.repo(name)
        if repo is None:
            return
        runtime = layout.runtime_for(self.machine, repo)
        if runtime.gate.pid() is not None:
            return
        argv = [sys.executable, "-c", "import time; time.sleep(3600)", self.mark, str(runtime.run_dir)]
        process = subprocess.Popen(argv)
        self.stand_ins.append(process)
        runtime.run_dir.mkdir(parents=True, exist_ok=True)
        runtime.gate.record(process.pid)

    @rule(name=st.sampled_from(NAMES))
    def down(self, name: str) -> None:
        if self.repo(name) is not None:
            self.ok("repo", "down", f"{name}@box")

    @rule(name=st.sampled_from(NAMES))
    def delete(self, name: str) -> None:
        repo = self.repo(name)
        result = self.rdc("repo", "delete", f"{name}@box", "--yes")
        if repo is not None and status.running_parts(self.machine, repo):
            assert result.exit_code == 12, result.output
            self.follow_the_downs(result)

    @rule(name=st.sampled_from(NAMES), tag=st.sampled_from(("x", "y")))
    def fork(self, name: str, tag: str) -> None:
        result = self.rdc("repo", "fork", f"{name}@box", "--tag", tag)
        if result.exit_code == 12:
            self.follow_the_downs(result)

    @rule(
        name=st.sampled_from(NAMES),
        device=st.sampled_from(DEVICES),
        exclusive=st.booleans(),
        lease=st.booleans(),
    )
    def grant(self, name: str, device: str, exclusive: bool, lease: bool) -> None:
        flags = (["--exclusive"] if exclusive else []) + (["--for", "1h"] if lease else [])
        self.rdc("repo", "gpu", "grant", f"{name}@box", "--device", device, *flags)

    @rule(name=st.sampled_from(NAMES), device=st.sampled_from(DEVICES))
    def renew(self, name: str, device: str) -> None:
        self.rdc("repo", "gpu", "renew", f"{name}@box", "--device", device, "--for", "2h")

    @rule(name=st.sampled_from(NAMES), device=st.sampled_from(DEVICES))
    def revoke(self, name: str, device: str) -> None:
        self.rdc("repo", "gpu", "revoke", f"{name}@box", "--device", device)

    @rule(again=st.sampled_from(("setup", "refresh")))
    def setup_again(self, again: str) -> None:
        self.ok("machine", again, "box")

    @rule(card=st.sampled_from(("0000:01:00.0", "0000:02:00.0")), clear=st.booleans())
    def health(self, card: str, clear: bool) -> None:
        if clear:
            self.ok("machine", "gpu", "clear", "box")
            return
        self.events += 1
        event = HealthEvent(
            pci_bus_id=card, reason="xid-79", message="fallen off the bus", key=f"e{self.events}"
        )
        record_events(self.machine, [event])

    @rule(then=st.sampled_from(("add it again", "build the demo", "build the demo with --stop")))
    def forget_machine(self, then: str) -> None:
        """Forget the machine (refused while a repo of it runs), then add it again or build the demo."""
        running = lifecycle.running_repos(self.machine)
        result = self.rdc("machine", "remove", "box")
        if running:
            assert result.exit_code == 12, result.output
            self.follow_the_downs(result)
            return
        assert result.exit_code == 0, result.output
        if then != "add it again":
            stop = ["--stop"] if then.endswith("--stop") else []
            self.ok("demo", "--workdir", str(self.base / "demo"), *stop)  # none of its repos runs here
            assert processes_marked(self.mark) == {}, "forgotten with its repos running"
        self.ok("machine", "add", "box", "--root", str(self.fm.root))

    # --- invariants --------------------------------------------------------------------------------
    @invariant()
    def every_process_is_a_listed_part(self) -> None:
        processes = processes_marked(self.mark)
        listed = json.loads(self.ok("repo", "list", "box", "-o", "json").stdout)
        statuses: Mapping[str, str] = {r["ref"]: r["status"] for r in listed}
        assert running_named(self.machine, statuses, processes) == []

    @invariant()
    def grants_reach_what_they_were_bound_to_and_reservations_are_apart(self) -> None:
        assert grants_hold(self.machine, self.plugins) == []

    @invariant()
    def every_advice_line_parses(self) -> None:
        assert advice_parses(self.printed) == []
        self.printed.clear()


OperatorWorld.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=25,  # 300 steps in all
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
test_operator_world = OperatorWorld.TestCase
