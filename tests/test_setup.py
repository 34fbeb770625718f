"""`rdc machine setup`: discovery, steps in order, specs validated before any is written, inventory last."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from setup_kit import KIND, FakeVendor, example_gpu, generator_script, spec_document, use_vendor

from rediacc_core import CdiSpecFile, GpuPartition, SetupStep
from rediacc_core.cli import cli
from rediacc_core.cli.output import TerminalProgress
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_TOOL, ToolError
from rediacc_core.inventory import load_inventory
from rediacc_core.plugins import load_plugins
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine


@pytest.fixture
def fm(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> FakeMachine:
    machine = make_fake_machine("box")
    config = Config.load()
    config.add("box", machine.root)
    config.save()
    return machine


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every regular file under `root` with its bytes, directories as None, to prove nothing changed
    (the stand-in tools under usr/bin aside: the tests swap them between runs)."""
    tools = root / "usr" / "bin"
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if not p.is_symlink() and tools not in (p, *p.parents)
    }


def with_generator(vendor: FakeVendor, fm: FakeMachine, mode: str = "ok") -> None:
    fm.standin("examplegen", generator_script(mode))
    vendor.specs = [CdiSpecFile("example.yaml", command=("examplegen", "cdi", "--output={output}"))]


def test_a_machine_without_gpus_still_gets_an_inventory_with_empty_lists(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    result = rdc("machine", "setup", "box")

    assert result.exit_code == 0, result.output
    inventory = json.loads(fm.machine.inventory_path.read_text())
    assert inventory["gpus"] == [] and inventory["devices"] == []
    assert (
        inventory["schemaVersion"] == 1
        and inventory["machine"] == "box"
        and inventory["platform"] == "native"
    )
    assert "0 GPU(s)" in result.stderr


def test_setup_writes_the_plugins_spec_then_an_inventory_of_what_the_specs_define(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    vendor.gpus = [
        example_gpu(
            0,
            partitions=[
                GpuPartition(
                    index=1, uuid="MIG-1", profile="1g.10gb", memory_mib=9984, cdi_names=(f"{KIND}=0:1",)
                )
            ],
        )
    ]
    vendor.specs = [CdiSpecFile("example.yaml", spec=spec_document(fm, ["0"]))]

    result = rdc("machine", "setup", "box")

    assert result.exit_code == 0, result.output
    spec_path = fm.path("/etc/cdi/example.yaml")
    assert "vendor.example/gpu" in spec_path.read_text()
    inventory = load_inventory(fm.machine)
    assert inventory is not None
    (gpu,) = inventory["gpus"]
    # `=all` and the partition's `0:1` are expected by the plugin but no spec defines them.
    assert gpu["cdiNames"] == [f"{KIND}=0"]
    assert gpu["partitions"][0]["cdiNames"] == []
    # No plugin places the name on hardware here: it reaches none, and the inventory says so.
    assert inventory["devices"] == [
        {"name": f"{KIND}=0", "kind": KIND, "spec": "example.yaml", "reaches": []}
    ]
    assert f"wrote {spec_path}" in result.stderr


def test_steps_run_in_order_and_plugin_options_reach_the_context(vendor: FakeVendor, fm: FakeMachine) -> None:
    ran: list[str] = []
    vendor.steps = [
        SetupStep("second", ("do b",), apply=lambda: ran.append("b"), order=60),
        SetupStep("first", ("do a",), apply=lambda: ran.append("a"), order=10, slow=True),
    ]

    result = rdc("machine", "setup", "box", "--example-toolkit", "false")

    assert result.exit_code == 0, result.output
    assert ran == ["a", "b"]
    assert vendor.contexts[-1].options["example_toolkit"] == "false"
    assert result.stderr.index("- first") < result.stderr.index("- second")


def test_an_invalid_plugin_option_value_is_a_usage_error(vendor: FakeVendor, fm: FakeMachine) -> None:
    result = rdc("machine", "setup", "box", "--example-toolkit", "sometimes")

    assert result.exit_code == 2
    assert "sometimes" in result.stderr


def test_a_step_that_cannot_succeed_makes_the_dry_run_exit_as_the_real_run(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    vendor.gpus = [example_gpu(0)]
    refusal = ToolError("example-ctk is not installed", "install example-toolkit yourself")
    vendor.steps = [SetupStep("Install the example toolkit", ("refuse: no example-ctk",), refusal=refusal)]
    with_generator(vendor, fm)
    before = snapshot(fm.root)

    dry = rdc("machine", "setup", "box", "--dry-run")
    real = rdc("machine", "setup", "box")

    assert dry.exit_code == real.exit_code == EXIT_TOOL
    assert "refuse: no example-ctk" in dry.stdout  # the plan is printed first
    assert "Error: example-ctk is not installed" in dry.stderr
    assert "Error: example-ctk is not installed" in real.stderr
    assert snapshot(fm.root) == before  # neither wrote a spec or the inventory


def test_dry_run_prints_every_step_command_and_file_and_changes_nothing(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    ran: list[str] = []
    vendor.gpus = [example_gpu(0)]
    vendor.steps = [
        SetupStep(
            "Install the example toolkit", ("apt-get install -y example-toolkit",), lambda: ran.append("x")
        )
    ]
    with_generator(vendor, fm)
    fm.write("/etc/cdi/old.yaml", "kept\n")
    vendor.specs.append(CdiSpecFile("old.yaml"))
    before = snapshot(fm.root)

    result = rdc("machine", "setup", "box", "--dry-run")

    assert result.exit_code == 0, result.output
    assert snapshot(fm.root) == before
    assert ran == []
    plan = result.stdout
    assert "apt-get install -y example-toolkit" in plan
    assert f"run: examplegen cdi --output={fm.path('/etc/cdi/example.yaml')}" in plan
    assert f"remove {fm.path('/etc/cdi/old.yaml')}" in plan
    assert f"write {fm.machine.inventory_path}" in plan
    assert f"check every repo's grants in {fm.machine.grants_path}" in plan
    assert "Example GPU 0" in plan
    assert "nothing was changed" in result.stderr


def test_a_generated_spec_is_written_exactly_as_the_tool_wrote_it(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    with_generator(vendor, fm)

    result = rdc("machine", "setup", "box")

    assert result.exit_code == 0, result.output
    assert (
        fm.path("/etc/cdi/example.yaml")
        .read_text()
        .startswith("cdiVersion: 0.6.0\nkind: vendor.example/gpu\n")
    )
    inventory = load_inventory(fm.machine)
    assert inventory is not None and [d["name"] for d in inventory["devices"]] == [f"{KIND}=all"]
    assert [p.name for p in fm.path("/etc").iterdir() if p.name.startswith(".rdc-setup")] == []


@pytest.fixture
def set_up_once(vendor: FakeVendor, fm: FakeMachine) -> dict[str, bytes | None]:
    """A machine set up successfully once; returns its state to compare against after a failure."""
    with_generator(vendor, fm)
    assert rdc("machine", "setup", "box").exit_code == 0
    return snapshot(fm.root)


def test_a_failing_tool_exits_14_with_its_own_message_and_keeps_the_previous_spec_and_inventory(
    vendor: FakeVendor, fm: FakeMachine, set_up_once: dict[str, bytes | None]
) -> None:
    fm.standin("examplegen", generator_script("fail"))

    result = rdc("machine", "setup", "box")

    assert result.exit_code == EXIT_TOOL
    assert (
        f"Error: `examplegen cdi --output={fm.path('/etc/cdi/example.yaml')}` failed with exit code 3:"
        in (result.stderr)
    )
    assert "examplegen: driver/library version mismatch (550.54 vs 535.1)" in result.stderr
    assert "What to do: fix the problem above" in result.stderr
    assert snapshot(fm.root) == set_up_once


@pytest.mark.parametrize("mode", ["invalid", "garbage", "silent"])
def test_a_tool_that_writes_a_bad_spec_exits_14_and_changes_nothing(
    vendor: FakeVendor, fm: FakeMachine, set_up_once: dict[str, bytes | None], mode: str
) -> None:
    fm.standin("examplegen", generator_script(mode))

    result = rdc("machine", "setup", "box")

    assert result.exit_code == EXIT_TOOL
    assert "example.yaml" in result.stderr
    assert snapshot(fm.root) == set_up_once


def test_an_invalid_spec_document_stops_setup_before_any_spec_is_written(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    good = CdiSpecFile("a-good.yaml", spec=spec_document(fm, ["0"]))
    bad = CdiSpecFile("b-bad.yaml", spec={"cdiVersion": "0.6.0", "kind": "vendor.example/gpu", "devices": []})
    vendor.specs = [good, bad]
    before = snapshot(fm.root)

    result = rdc("machine", "setup", "box")

    assert result.exit_code == EXIT_TOOL
    assert "b-bad.yaml" in result.stderr and "at least one device" in result.stderr
    assert snapshot(fm.root) == before


def test_an_owned_spec_returned_empty_is_removed(vendor: FakeVendor, fm: FakeMachine) -> None:
    vendor.specs = [CdiSpecFile("example.yaml", spec=spec_document(fm, ["0"]))]
    assert rdc("machine", "setup", "box").exit_code == 0
    vendor.specs = [CdiSpecFile("example.yaml")]  # the hardware is gone

    result = rdc("machine", "setup", "box")

    assert result.exit_code == 0, result.output
    assert not fm.path("/etc/cdi/example.yaml").exists()
    inventory = load_inventory(fm.machine)
    assert inventory is not None and inventory["devices"] == []
    assert f"removed {fm.path('/etc/cdi/example.yaml')}" in result.stderr


def test_specs_of_others_in_the_cdi_dir_count_as_grantable_and_are_left_alone(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    other = fm.write(
        "/etc/cdi/other.yaml",
        "cdiVersion: 0.6.0\nkind: other.example/fpga\ndevices:\n"
        "- name: f0\n  containerEdits:\n    env: [FPGA=0]\n",
    )
    text = other.read_text()

    assert rdc("machine", "setup", "box").exit_code == 0

    inventory = load_inventory(fm.machine)
    assert inventory is not None and [d["name"] for d in inventory["devices"]] == ["other.example/fpga=f0"]
    assert other.read_text() == text


def test_a_broken_spec_of_someone_else_is_a_warning_not_a_failure(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    fm.write("/etc/cdi/broken.yaml", "cdiVersion: [\n")

    result = rdc("machine", "setup", "box")

    assert result.exit_code == 0
    assert "Warning:" in result.stderr and "broken.yaml" in result.stderr


def test_two_plugins_claiming_one_spec_file_is_an_error(vendor: FakeVendor, fm: FakeMachine) -> None:
    vendor.specs = [CdiSpecFile("x.yaml"), CdiSpecFile("x.yaml")]

    result = rdc("machine", "setup", "box")

    assert result.exit_code == 1
    assert "two plugins claim the CDI spec file 'x.yaml'" in result.stderr


def test_a_step_that_fails_leaves_specs_and_inventory_alone(vendor: FakeVendor, fm: FakeMachine) -> None:
    def fail() -> None:
        raise ToolError("apt-get failed: E: Unable to locate package example-toolkit", "check the repository")

    vendor.steps = [SetupStep("Install", ("apt-get install example-toolkit",), fail, slow=True)]
    vendor.specs = [CdiSpecFile("example.yaml", spec=spec_document(fm, ["0"]))]
    before = snapshot(fm.root)

    with pytest.raises(ToolError):
        run_setup(fm.machine, use_vendor(vendor), {})

    assert snapshot(fm.root) == before


def test_run_setup_reports_progress_for_each_step(vendor: FakeVendor, fm: FakeMachine) -> None:
    events: list[tuple[str, object]] = []

    class Recorder:
        def start(self, title: str, slow: bool = False) -> None:
            events.append(("start", title))

        def finish(self, ok: bool) -> None:
            events.append(("finish", ok))

    vendor.steps = [SetupStep("Install", ("x",), lambda: None, slow=True)]
    report = run_setup(fm.machine, use_vendor(vendor), {}, progress=Recorder())

    assert [title for kind, title in events if kind == "start"] == [
        "Discover GPUs",
        "Install",
        "Generate and check CDI specs",
        "Write CDI specs",
        "Write the inventory",
        "Check the grants",
    ]
    assert all(ok for kind, ok in events if kind == "finish")
    assert report.inventory is not None and report.inventory["gpus"] == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_step_is_ticked_and_slow_steps_spin() -> None:
    terminal = _Terminal()
    progress = TerminalProgress(terminal, interval=0.001)

    progress.start("Discover GPUs")
    progress.finish(True)
    progress.start("Install the toolkit", slow=True)
    deadline = time.monotonic() + 10
    while "\r| Install the toolkit" not in terminal.getvalue() and time.monotonic() < deadline:
        time.sleep(0.001)
    progress.finish(False)

    text = terminal.getvalue()
    assert "\r✓ Discover GPUs" in text
    assert "\r| Install the toolkit … 0s" in text  # a slow step shows the seconds it has taken
    assert text.endswith("\r✗ Install the toolkit (0s)  \n")


def test_off_a_terminal_steps_are_plain_lines_without_a_spinner() -> None:
    log = io.StringIO()
    progress = TerminalProgress(log, interval=0.001)

    progress.start("Install the toolkit", slow=True)
    progress.finish(True)

    assert log.getvalue() == "- Install the toolkit\n"


def test_a_card_two_plugins_report_is_counted_once(
    monkeypatch: pytest.MonkeyPatch, make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    fm = make_fake_machine("two")
    card = example_gpu(0)
    generic = replace(card, source="generic", vendor="example", cdi_names=())  # e.g. its render node
    plugins = load_plugins(
        extra=[("vendor", FakeVendor(gpus=[card, example_gpu(1)])), ("generic", FakeVendor(gpus=[generic]))]
    )

    report = run_setup(fm.machine, plugins, {}, dry_run=True)

    assert len(report.gpus) == 3 and report.cards == 2
    assert any("(2 GPU(s)," in line for step in report.plan for line in step.lines)
    assert report.plan[0].lines == (  # one line a card, the fuller report leading, both finders named
        "example Example GPU 0 at 0000:01:00.0 (found by fakevendor, generic)",
        "example Example GPU 1 at 0000:02:00.0 (found by fakevendor)",
    )
