"""`rdc machine …`, the error convention, `main()`'s exit codes and `rdc demo`."""

from __future__ import annotations

import configparser
import json
import os
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner, Result
from setup_kit import KIND, FakeVendor, example_gpu, spec_document, use_vendor

from rediacc_core import CdiSpecFile, GpuPartition
from rediacc_core.cli import cli, main
from rediacc_core.cli.demo import runnable_rdc
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_NOT_FOUND, EXIT_STATE, EXIT_VALIDATION, RdcError
from rediacc_core.grants.store import GrantStore
from rediacc_core.remote.address import SshAddress
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.settings import read_settings
from rediacc_core.testing import FakeMachine


@pytest.fixture
def fm(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> FakeMachine:
    return make_fake_machine("box")


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def set_up_box(vendor: FakeVendor, fm: FakeMachine) -> None:
    """`box`: one example GPU with a MIG-style partition, its spec, and setup run."""
    part = GpuPartition(
        index=1, uuid="MIG-0001", profile="1g.10gb", memory_mib=9984, cdi_names=(f"{KIND}=0:1",)
    )
    vendor.gpus = [example_gpu(0, partitions=[part])]
    document = spec_document(fm, ["0", "all"])
    document["devices"].append({"name": "0:1", "containerEdits": {"env": ["EXAMPLE_PART=0:1"]}})
    vendor.specs = [CdiSpecFile("example.yaml", spec=document)]
    assert rdc("machine", "add", "box", "--root", str(fm.root)).exit_code == 0
    result = rdc("machine", "setup", "box")
    assert result.exit_code == 0, result.output


# --- add / list / remove ------------------------------------------------------------------------


def test_add_list_remove(fm: FakeMachine, rdc_config: Path) -> None:
    added = rdc("machine", "add", "box", "--root", str(fm.root))
    assert added.exit_code == 0 and added.stdout == ""
    assert "rdc machine setup box" in added.stderr

    listed = json.loads(rdc("machine", "list", "-o", "json").stdout)
    assert [(m["name"], m["root"], m["inventory"]) for m in listed] == [
        ("localhost", "/", listed[0]["inventory"]),
        ("box", str(fm.root), "not set up"),
    ]

    table = rdc("machine", "list").stdout.splitlines()
    assert table[0].split() == ["NAME", "ROOT", "PLATFORM", "SETTINGS", "INVENTORY"]
    assert table[2].split()[:3] == ["box", str(fm.root), "native"]

    assert yaml.safe_load(rdc("machine", "list", "-o", "yaml").stdout) == listed

    removed = rdc("machine", "remove", "box")
    assert removed.exit_code == 0 and "nothing under" in removed.stderr
    assert fm.root.exists()
    assert [m["name"] for m in json.loads(rdc("machine", "list", "-o", "json").stdout)] == ["localhost"]


@pytest.mark.parametrize(
    "args",
    [
        ["machine", "remove", "ghost"],
        ["machine", "setup", "ghost"],
        ["machine", "gpu", "list", "ghost"],
        ["machine", "config", "ghost"],
    ],
)
def test_an_unknown_machine_exits_5_with_error_and_next_step(rdc_config: Path, args: list[str]) -> None:
    result = rdc(*args)

    assert result.exit_code == EXIT_NOT_FOUND
    assert result.stderr.splitlines() == [
        f"Error: no machine named 'ghost' (there is no client config at {rdc_config})",
        "What to do: run `rdc machine list` to see the machines, or add it: "
        "`rdc machine add ghost --ssh root@<host>` (or `--root <dir>` for a simulated machine)",
    ]
    assert result.stdout == ""


def test_an_empty_client_config_is_named_when_a_machine_is_not_in_it(rdc_config: Path) -> None:
    rdc_config.write_text("")
    result = rdc("machine", "gpu", "list", "demo")
    assert result.exit_code == EXIT_NOT_FOUND
    assert f"no machine named 'demo' in {rdc_config} (it names no machines)" in result.stderr


def test_adding_a_machine_twice_is_a_state_error(fm: FakeMachine) -> None:
    rdc("machine", "add", "box", "--root", str(fm.root))

    result = rdc("machine", "add", "box", "--root", str(fm.root))

    assert result.exit_code == EXIT_STATE
    assert "Error: a machine named 'box' already exists" in result.stderr


def test_per_machine_settings_are_kept_on_the_machine(fm: FakeMachine, rdc_config: Path) -> None:
    rdc("machine", "add", "box", "--root", str(fm.root))

    shown = json.loads(rdc("machine", "config", "box", "-o", "json").stdout)
    assert shown[0] == {
        "setting": "legacy-visible-devices",
        "value": "refuse",
        "source": "default",
        "choices": ["refuse", "translate"],
    }
    assert [s["setting"] for s in shown[1:]] == [
        "bind-roots",
        "extra-capabilities",
        "volume-drivers",
        "lease-end",
        "publish-addresses",
        "publish-ports",
        "publish-limit",
        "pids-limit",
        "registries",
        "image-store",
        "gate-workers",
        "net-path",
        "gpu-health",
        "dcgm-job-mapping-dir",
    ]
    assert not fm.machine.settings_path.exists()

    changed = rdc("machine", "config", "box", "--set", "legacy-visible-devices=translate")
    assert changed.exit_code == 0
    assert changed.stdout == "", "a change prints nothing on stdout unless asked"
    assert changed.stderr == "Machine box: legacy-visible-devices=translate\n"
    shown = rdc("machine", "config", "box")
    assert shown.stdout.splitlines()[1].split() == [
        "legacy-visible-devices",
        "translate",
        "machine",
        "refuse|translate",
    ]
    as_json = rdc("machine", "config", "box", "--set", "legacy-visible-devices=translate", "-o", "json")
    assert {"setting": "legacy-visible-devices", "value": "translate"}.items() <= json.loads(as_json.stdout)[
        0
    ].items()
    assert read_settings(fm.machine) == {"legacy-visible-devices": "translate"}
    # The client's config holds none.
    assert yaml.safe_load(rdc_config.read_text()) == {"machines": {"box": {"root": str(fm.root)}}}

    for args, error in [
        (["--set", "legacy-visible-devices=sometimes"], "Error: invalid value 'sometimes'"),
        (["--set", "colour=blue"], "Error: unknown machine setting 'colour'"),
        (["--unset", "colour"], "Error: unknown machine setting 'colour'"),
        (["--set", "novalue"], "Error: --set expects KEY=VALUE"),
        # All or none: the valid first change is not applied either.
        (["--unset", "legacy-visible-devices", "--set", "colour=blue"], "unknown machine setting"),
    ]:
        bad = rdc("machine", "config", "box", *args)
        assert bad.exit_code == EXIT_VALIDATION, args
        assert error in bad.stderr, args
    assert read_settings(fm.machine) == {"legacy-visible-devices": "translate"}

    listed = json.loads(rdc("machine", "list", "-o", "json").stdout)
    assert listed[1]["settings"] == {"legacy-visible-devices": "translate"}
    assert "legacy-visible-devices=translate" in rdc("machine", "list").stdout

    rdc("machine", "config", "box", "--unset", "legacy-visible-devices")
    assert read_settings(fm.machine) == {}


def test_a_corrupt_settings_file_is_an_error_naming_it_and_is_never_overwritten(fm: FakeMachine) -> None:
    rdc("machine", "add", "box", "--root", str(fm.root))
    fm.machine.settings_path.parent.mkdir(parents=True, exist_ok=True)
    fm.machine.settings_path.write_text("{broken")

    for args in (["config", "box"], ["config", "box", "--set", "legacy-visible-devices=translate"]):
        result = rdc("machine", *args)
        assert result.exit_code == EXIT_VALIDATION
        assert f"Error: settings file {fm.machine.settings_path} is not valid JSON" in result.stderr
    assert fm.machine.settings_path.read_text() == "{broken"

    listed = rdc("machine", "list")
    assert listed.exit_code == 0
    assert listed.stdout.splitlines()[2].split()[3] == "unreadable"


def test_list_tolerates_a_machine_whose_root_is_gone_and_config_will_not_create_it(
    fm: FakeMachine, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    rdc("machine", "add", "gone", "--root", str(gone))
    gone.rmdir()

    listed = json.loads(rdc("machine", "list", "-o", "json").stdout)
    assert listed[1]["name"] == "gone" and listed[1]["settings"] == {}

    result = rdc("machine", "config", "gone", "--set", "legacy-visible-devices=translate")
    assert result.exit_code == EXIT_STATE
    assert f"the root of machine gone, {gone}, does not exist any more" in result.stderr
    assert not gone.exists()
    assert listed[1]["inventory"] == "root missing"


@pytest.mark.parametrize(
    "args",
    [
        ["repo", "create", "z@gone"],
        ["repo", "list", "gone"],
        ["machine", "setup", "gone"],
        ["machine", "gpu", "list", "gone"],
    ],
)
def test_work_on_a_machine_whose_root_vanished_is_refused_and_recreates_nothing(
    fm: FakeMachine, tmp_path: Path, args: list[str]
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    assert rdc("machine", "add", "gone", "--root", str(gone)).exit_code == 0
    gone.rmdir()

    result = rdc(*args)

    assert result.exit_code == EXIT_STATE, result.output
    assert f"Error: the root of machine gone, {gone}, does not exist any more" in result.stderr
    assert "rdc machine remove gone" in result.stderr
    assert not gone.exists()
    removed = rdc("machine", "remove", "gone")  # forgetting it still works
    assert removed.exit_code == 0, removed.output


@pytest.mark.parametrize("same", ["/", "{root}", "{root}/."])
def test_a_second_machine_on_a_root_already_registered_is_refused(
    fm: FakeMachine, rdc_config: Path, same: str
) -> None:
    assert rdc("machine", "add", "box", "--root", str(fm.root)).exit_code == 0
    owner = "localhost" if same == "/" else "box"

    result = rdc("machine", "add", "twin", "--root", same.format(root=fm.root))

    assert result.exit_code == EXIT_STATE, result.output
    assert f"Error: machine {owner} already has the root" in result.stderr
    assert "twin" not in rdc_config.read_text()


def test_a_local_root_may_share_its_path_with_an_ssh_machines_root(fm: FakeMachine, rdc_config: Path) -> None:
    config = Config.load()
    config.add_ssh("far", SshAddress.parse("root@far.invalid"), str(fm.root))  # a path on that machine
    config.save()

    assert rdc("machine", "add", "box", "--root", str(fm.root)).exit_code == 0


def test_machine_list_json_gives_the_inventory_time_not_its_age(vendor: FakeVendor, fm: FakeMachine) -> None:
    set_up_box(vendor, fm)
    generated = json.loads(fm.machine.inventory_path.read_text())["generatedAt"]

    listed = json.loads(rdc("machine", "list", "-o", "json").stdout)

    assert listed[1]["inventory"] == f"written {generated}"
    assert "written just now" in rdc("machine", "list").stdout  # people read the age


def test_settings_an_older_rdc_kept_in_the_config_file_are_pointed_out_then_moved(
    fm: FakeMachine, rdc_config: Path
) -> None:
    rdc_config.write_text(
        f"machines:\n  box: {{root: {fm.root}, settings: {{legacy-visible-devices: translate}}}}\n"
    )
    move = "rdc machine config box --set legacy-visible-devices=translate"

    for args in (["list"], ["config", "box"]):
        result = rdc("machine", *args)
        assert result.exit_code == 0
        assert "still holds settings for machine box (legacy-visible-devices=translate)" in result.stderr
        assert "they have no effect" in result.stderr and move in result.stderr
    assert read_settings(fm.machine) == {}  # ignored: the gate never sees them

    moved = rdc(*move.split()[1:])
    assert moved.exit_code == 0
    assert f"Removed the old settings of machine box from {rdc_config}" in moved.stderr
    assert read_settings(fm.machine) == {"legacy-visible-devices": "translate"}
    assert yaml.safe_load(rdc_config.read_text()) == {"machines": {"box": {"root": str(fm.root)}}}
    assert "still holds" not in rdc("machine", "list").stderr


# --- gpu list -----------------------------------------------------------------------------------


def test_gpu_list_before_setup_names_setup_as_the_next_step(vendor: FakeVendor, fm: FakeMachine) -> None:
    rdc("machine", "add", "box", "--root", str(fm.root))

    result = rdc("machine", "gpu", "list", "box")

    assert result.exit_code == EXIT_STATE
    assert result.stderr.splitlines() == [
        f"Error: machine box has not been set up: there is no {fm.machine.inventory_path}",
        "What to do: run `rdc machine setup box`",
    ]


def test_gpu_list_json_is_the_inventory_exactly_as_recorded(vendor: FakeVendor, fm: FakeMachine) -> None:
    set_up_box(vendor, fm)

    result = rdc("machine", "gpu", "list", "box", "-o", "json")

    assert result.exit_code == 0
    assert result.stdout == fm.machine.inventory_path.read_text()


def test_gpu_list_yaml_is_the_same_data(vendor: FakeVendor, fm: FakeMachine) -> None:
    set_up_box(vendor, fm)

    result = rdc("machine", "gpu", "list", "box", "-o", "yaml")

    assert yaml.safe_load(result.stdout) == json.loads(fm.machine.inventory_path.read_text())


def test_gpu_list_table_shows_gpus_partitions_platform_age_and_grantable_names(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    set_up_box(vendor, fm)

    out = rdc("machine", "gpu", "list", "box").stdout.splitlines()

    assert out[0].startswith("Machine box: platform native, inventory written just now (")
    assert out[2].split() == [
        "GPU",
        "NAME",
        "VENDOR",
        "DRIVER",
        "MEMORY",
        "PLATFORM",
        "PCI",
        "BUS",
        "ID",
        "CDI",
        "NAMES",
    ]
    gpu_row = out[3]
    for cell in ("Example GPU 0", "example", "550.54.14", "81559 MiB", "native", "0000:01:00.0"):
        assert cell in gpu_row
    assert gpu_row.endswith(f"{KIND}=0, {KIND}=all")
    assert out[4].split() == ["└", "1", "1g.10gb", "9984", "MiB", f"{KIND}=0:1"]
    assert out[4].index("9984 MiB") == gpu_row.index("81559 MiB")
    devices = out[6:]
    assert out[5] == ""
    assert devices[0].split() == ["CDI", "DEVICE", "SPEC", "GRANTED", "TO"]
    assert [line.split()[:3] for line in devices[1:]] == [
        [f"{KIND}=0", "example.yaml", "-"],
        [f"{KIND}=0:1", "example.yaml", "-"],
        [f"{KIND}=all", "example.yaml", "-"],
    ]
    # Columns line up: every row of the device table starts its SPEC cell at the same place.
    assert len({line.index("example.yaml") for line in devices[1:]}) == 1


def test_gpu_list_of_a_machine_without_gpus(vendor: FakeVendor, fm: FakeMachine) -> None:
    rdc("machine", "add", "box", "--root", str(fm.root))
    rdc("machine", "setup", "box")

    out = rdc("machine", "gpu", "list", "box").stdout

    assert "GPUs: none found" in out and "Grantable CDI devices: none" in out


def test_gpu_list_shows_grants_in_force_read_live(vendor: FakeVendor, fm: FakeMachine) -> None:
    grants = pytest.importorskip("rediacc_core.grants.store")
    repos = pytest.importorskip("rediacc_core.repos")
    set_up_box(vendor, fm)
    machine = Config.load().machine("box")
    alpha = repos.RepoStore(machine).create("alpha")
    beta = repos.RepoStore(machine).create("beta", "gpu")
    store = grants.GrantStore(machine, use_vendor(vendor), running=Holdings(machine))
    store.grant(alpha, [f"{KIND}=0"])
    store.grant(beta, [f"{KIND}=0", f"{KIND}=all"])

    out = rdc("machine", "gpu", "list", "box").stdout

    row_0 = next(line for line in out.splitlines() if line.startswith(f"{KIND}=0 "))
    assert row_0.endswith("alpha, beta:gpu")
    row_all = next(line for line in out.splitlines() if line.startswith(f"{KIND}=all"))
    assert row_all.endswith("beta:gpu")

    store.revoke(beta, [f"{KIND}=all"])  # no setup in between: the listing reads grants live
    out = rdc("machine", "gpu", "list", "box").stdout
    row_all = next(line for line in out.splitlines() if line.startswith(f"{KIND}=all"))
    assert row_all.endswith("-")


def test_gpu_list_with_a_corrupt_repos_file_is_an_error_naming_it(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    set_up_box(vendor, fm)
    machine = Config.load().machine("box")
    alpha = RepoStore(machine).create("alpha")
    GrantStore(machine, use_vendor(vendor), running=Holdings(machine)).grant(alpha, [f"{KIND}=0"])
    machine.repos_path.write_text("{")

    result = rdc("machine", "gpu", "list", "box")

    assert result.exit_code == EXIT_VALIDATION, result.output
    assert f"Error: repos file {machine.repos_path}" in result.stderr
    assert "unknown repo" not in result.output


def test_gpu_prune_removes_the_grants_of_a_deleted_repo(vendor: FakeVendor, fm: FakeMachine) -> None:
    set_up_box(vendor, fm)
    machine = Config.load().machine("box")
    alpha = RepoStore(machine).create("alpha")
    GrantStore(machine, use_vendor(vendor), running=Holdings(machine)).grant(
        alpha, [f"{KIND}=0"], exclusive=True
    )
    machine.repos_path.write_text(json.dumps({"schemaVersion": 1, "repos": []}))  # deleted by hand
    listed = rdc("machine", "gpu", "list", "box").stdout
    assert f"{alpha.id} (deleted repo: rdc machine gpu prune) (exclusive)" in listed

    pruned = rdc("machine", "gpu", "prune", "box", "-o", "json")

    assert pruned.exit_code == 0, pruned.output
    assert json.loads(pruned.stdout) == [{"repoId": alpha.id, "device": f"{KIND}=0", "exclusive": True}]
    assert json.loads(machine.grants_path.read_text())["grants"] == []
    assert "No grants of deleted repos on box." in rdc("machine", "gpu", "prune", "box").stderr


def test_a_corrupt_inventory_is_an_error_naming_the_file(vendor: FakeVendor, fm: FakeMachine) -> None:
    set_up_box(vendor, fm)
    fm.machine.inventory_path.write_text("{")

    result = rdc("machine", "gpu", "list", "box", "-o", "json")

    assert result.exit_code == EXIT_VALIDATION
    assert f"Error: inventory {fm.machine.inventory_path} is not valid JSON" in result.stderr
    assert result.stdout == ""


# --- the console script ---------------------------------------------------------------------------


@click.command("explode")
def _explode() -> None:
    raise RuntimeError("boom")


@click.command("refuse")
def _refuse() -> None:
    raise RdcError("the thing is refused", "do the other thing", exit_code=4)


@pytest.fixture
def failing_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two commands on the root group that fail the two ways a command can: a bug, and an RdcError."""
    monkeypatch.setitem(cli.commands, "explode", _explode)
    monkeypatch.setitem(cli.commands, "refuse", _refuse)


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(args)
    captured = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), captured.out, captured.err


def test_an_rdc_error_is_two_lines_and_its_exit_code(failing_commands: None) -> None:
    result = rdc("refuse")

    assert result.exit_code == 4
    assert result.stderr == "Error: the thing is refused\nWhat to do: do the other thing\n"


def test_main_exits_with_the_error_code(
    rdc_config: Path, failing_commands: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(["machine", "remove", "ghost"], capsys)[0] == EXIT_NOT_FOUND
    code, out, err = run_main(["refuse"], capsys)
    assert (code, out) == (4, "")
    assert err.startswith("Error: the thing is refused\n")


def test_an_unexpected_exception_is_a_short_message_and_exit_1(
    failing_commands: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(["explode"], capsys)

    assert code == 1
    assert err.splitlines()[0] == "Error: unexpected RuntimeError: boom"
    assert "Traceback" not in err


def test_main_success_and_usage_errors(rdc_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(["machine", "list", "-o", "json"], capsys)[0] == 0
    code, _, err = run_main(["machine", "list", "-o", "xml"], capsys)
    assert code == 2 and "xml" in err


# --- rdc demo -------------------------------------------------------------------------------------


def test_demo_sets_up_a_simulated_machine_and_lists_its_gpus(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = metadata.EntryPoint(name="example", value="setup_kit:demo_layout", group="rediacc.demo")
    monkeypatch.setattr("rediacc_core.demo.metadata.entry_points", lambda group: [layout])
    workdir = tmp_path / "demo"

    result = rdc("demo", "--workdir", str(workdir))

    assert result.exit_code == 0, result.output
    assert "Machine demo: platform native" in result.stdout
    assert "hardware from: example" in result.stdout  # a walkthrough: its prose on stdout, in order
    last = result.stdout.rstrip().splitlines()[-3:]
    assert last[0].startswith(f"Next: REDIACC_CONFIG={rdc_config} {runnable_rdc()} machine gpu list demo")
    assert last[2].strip().startswith(f"REDIACC_CONFIG={rdc_config} {runnable_rdc()} machine setup demo ")
    assert result.stderr == ""
    demo = Config.load().machine("demo")
    assert demo.root == workdir.absolute() / "root"
    assert (demo.root / "etc/example-demo-layout").read_text() == "laid out\n"
    assert demo.inventory_path.exists()
    assert str(workdir) not in os.environ["PATH"]

    again = rdc("demo", "--workdir", str(workdir))  # rerunnable: rebuilds its own machine
    assert again.exit_code == 0, again.output


def test_demo_run_again_rebuilds_its_machine_in_place_leaving_no_temporary_directory_behind(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    for _ in range(3):
        result = rdc("demo")
        assert result.exit_code == 0, result.output

    (made,) = temp.iterdir()
    assert made.name.startswith("rdc-demo-")
    assert Config.load().machine("demo").root == made / "root"


def test_tox_demo_uses_its_own_config_and_workdir_never_the_users() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).parents[1] / "tox.ini")
    env = tox["testenv:demo"]
    assert "REDIACC_CONFIG = {envtmpdir}{/}rdc-config.yaml" in env["set_env"]
    assert "--workdir {envtmpdir}" in env["commands"]


def test_demo_never_wipes_a_directory_it_did_not_make(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path
) -> None:
    (tmp_path / "mine" / "root").mkdir(parents=True)
    (tmp_path / "mine" / "root" / "precious").write_text("keep")

    result = rdc("demo", "--workdir", str(tmp_path / "mine"))

    assert result.exit_code == EXIT_STATE
    assert (tmp_path / "mine" / "root" / "precious").read_text() == "keep"


def test_machine_list_says_what_it_did_not_ask_an_ssh_machine_and_how_to(rdc_config: Path) -> None:
    config = Config.load()
    config.add_ssh("far", SshAddress.parse("root@far.invalid"), "/")
    config.save()

    [row] = [line for line in rdc("machine", "list").stdout.splitlines() if line.startswith("far ")]
    assert "not asked: rdc machine gpu list far" in row and "not asked: rdc machine config far" in row
    [far] = [m for m in json.loads(rdc("machine", "list", "-o", "json").stdout) if m["name"] == "far"]
    assert (far["platform"], far["settings"], far["inventory"]) == (None, None, None)  # unknown
