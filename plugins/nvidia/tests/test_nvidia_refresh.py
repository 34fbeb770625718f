"""The machine's facts follow its hardware: stale CDI names are never grantable, `rdc machine refresh`
follows a driver update and a MIG change, and the gate decides no device request on an inventory
older than the specs the daemon injects from."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rediacc_nvidia import testing
from rediacc_nvidia.demo import demo_layout
from rediacc_nvidia.discovery_smi import parse_xml

from rediacc_core.cli import cli
from rediacc_core.errors import RefusedError, ToolError
from rediacc_core.gate.decide.decider import Decider, Decision
from rediacc_core.grants.store import GrantStore
from rediacc_core.inventory import load_inventory
from rediacc_core.plugins import Plugins, load_plugins
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.testing import FakeMachine

MIG_NAMES = ["nvidia.com/gpu=1:0", "nvidia.com/gpu=1:1"]


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "nvidia")
    return load_plugins()


@pytest.fixture
def demo(make_fake_machine: Any, rdc_config: Path) -> FakeMachine:
    """The demo's NVIDIA layout (GPU 1 split into two MIG devices), registered as machine `lab`."""
    fm: FakeMachine = make_fake_machine("lab")
    demo_layout(fm)
    assert CliRunner().invoke(cli, ["machine", "add", "lab", "--root", str(fm.root)]).exit_code == 0
    return fm


def rdc(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def _serve_report(fm: FakeMachine, edit: Any) -> None:
    """Change what the stand-in nvidia-smi reports (a driver update, a MIG change): `edit` gets and
    returns the `-q -x` text; `-L` follows."""
    data = testing.data_dir(fm)
    xml = edit((data / "q-x.xml").read_text(encoding="utf-8"))
    (data / "q-x.xml").write_text(xml, encoding="utf-8")
    report = parse_xml(xml)
    (data / "L.txt").write_text(testing.list_text(report, {1: ("3g.40gb", "3g.40gb")}), encoding="utf-8")


def _toolkit_refresh(fm: FakeMachine) -> None:
    """What `nvidia-cdi-refresh` does after a driver update or boot: rewrite /etc/cdi/nvidia.yaml."""
    ctk = fm.bin_dir / "nvidia-ctk"
    result = fm.machine.run([str(ctk), "cdi", "generate", f"--output={fm.machine.cdi_dir / 'nvidia.yaml'}"])
    assert result.ok, result.stderr


def _create(decider: Decider, device: str, env: list[str]) -> Decision:
    requests = [{"Driver": "cdi", "DeviceIDs": [device]}]
    body = {"Image": "cuda", "Env": env, "HostConfig": {"DeviceRequests": requests}}
    return decider.decide("POST", "/v1.45/containers/create", "application/json", json.dumps(body).encode())


def _decider(fm: FakeMachine, plugins: Plugins, repo: Repo, log: list[str]) -> Decider:
    # The live inventory and spec check, as a gate has them; the grants handed in.
    grants = frozenset({"nvidia.com/gpu=0", "nvidia.com/gpu=1:0"})
    return Decider(fm.machine, repo, plugins, lambda _image: None, log.append, grants=lambda _: grants)


# --- stale names ---------------------------------------------------------------------------------


def test_a_setup_without_the_toolkit_keeps_no_stale_name_grantable(
    demo: FakeMachine, plugins: Plugins
) -> None:
    """The issue's first bullet: a full setup, then one with --install-nvidia-toolkit=false whose
    discovery reads only /proc (no nvidia-smi): the old nvidia.yaml still names GPU 1's MIG devices,
    the new inventory knows no MIG. Those names are shown as not grantable, with why, and the overlap
    the issue reproduced (gpu=1 exclusive in beta, gpu=1:0 in alpha) is refused at grant."""
    assert rdc("machine", "setup", "lab").exit_code == 0
    (demo.bin_dir / "nvidia-smi").unlink()  # discovery falls back to /proc/driver/nvidia

    done = rdc("machine", "setup", "lab", "--install-nvidia-toolkit=false")
    assert done.exit_code == 0, done.output
    # Setup says what discovery could not read this time, and which names are not grantable.
    assert "could not read memory" in done.stderr and "2 partition(s) (nvidia.com/gpu=1:0" in done.stderr
    assert "4 CDI name(s) a spec defines are not grantable" in done.stderr
    assert (
        "not grantable: nvidia.com/gpu=1:0: nvidia.yaml defines it, but no GPU discovery found" in done.stderr
    )
    inventory = load_inventory(demo.machine)
    assert inventory is not None
    stale = [row["name"] for row in inventory["ungrantable"]]
    assert stale[:2] == MIG_NAMES and all(n.startswith("nvidia.com/gpu=MIG-") for n in stale[2:])
    assert not set(stale) & {d["name"] for d in inventory["devices"]}
    listing = rdc("machine", "gpu", "list", "lab", "-o", "wide")
    assert re.search(
        r"nvidia\.com/gpu=1:0 +nvidia\.yaml \(not grantable: nvidia\.yaml defines it", listing.stdout
    )

    repos = RepoStore(demo.machine)
    alpha, beta = repos.create("alpha"), repos.create("beta")
    store = GrantStore(demo.machine, plugins, running=Holdings(demo.machine))
    store.grant(beta, ["nvidia.com/gpu=1"], exclusive=True)
    for exclusive in (True, False):
        with pytest.raises(
            RefusedError, match=re.escape("nvidia.com/gpu=1:0 is not grantable on lab")
        ) as refused:
            store.grant(alpha, ["nvidia.com/gpu=1:0"], exclusive=exclusive)
        assert "rdc machine refresh lab" in str(refused.value.todo)
    refused_cli = rdc("repo", "gpu", "grant", "alpha@lab", "--device", "nvidia.com/gpu=1:0", "--exclusive")
    assert refused_cli.exit_code == 4 and "not grantable" in refused_cli.stderr

    # The tool back: a refresh reads the MIG layout again and the names are grantable once more.
    testing.nvidia_machine(demo, (testing.data_dir(demo) / "q-x.xml").read_text(), toolkit=True)
    _serve_report(demo, lambda xml: xml)
    assert rdc("machine", "refresh", "lab").exit_code == 0
    again = load_inventory(demo.machine)
    assert again is not None and "ungrantable" not in again
    # ... and placed on GPU 1, so beta's exclusive grant of the whole card is what refuses them now.
    with pytest.raises(
        RefusedError, match=re.escape("beta@lab holds nvidia.com/gpu=1 exclusively, which reaches")
    ):
        store.grant(alpha, ["nvidia.com/gpu=1:1"])


# --- driver updates --------------------------------------------------------------------------------


def test_refresh_follows_a_driver_update_and_the_require_decision_with_it(
    demo: FakeMachine, plugins: Plugins
) -> None:
    assert rdc("machine", "setup", "lab").exit_code == 0
    repo = RepoStore(demo.machine).create("alpha")
    log: list[str] = []
    decider = _decider(demo, plugins, repo, log)
    wants = ["NVIDIA_REQUIRE_CUDA=cuda>=13.2"]
    before = _create(decider, "nvidia.com/gpu=0", wants)
    assert not before.forward and before.rules == ("nvidia-require",)
    assert "CUDA driver version 13.1, driver 590.48.01" in before.message

    # The driver is updated; the toolkit's refresh unit rewrites the spec; rdc has not looked yet.
    _serve_report(
        demo,
        lambda xml: xml.replace("590.48.01", "595.12.03").replace("<cuda_version>13.1", "<cuda_version>13.2"),
    )
    _toolkit_refresh(demo)
    stale = _create(decider, "nvidia.com/gpu=0", wants)
    assert not stale.forward and stale.status == 403 and stale.rules == ("stale-facts",)
    assert "nvidia.yaml changed" in stale.message
    assert "rdc machine refresh lab" in stale.message
    assert decider.spec_age() is not None
    # Requests without devices are not held up.
    plain = decider.decide("POST", "/v1.45/containers/create", "application/json", b'{"Image": "cuda"}')
    assert plain.forward

    dry = rdc("machine", "refresh", "lab", "--dry-run")
    assert (
        dry.exit_code == 0 and "Check the CDI specs in" in dry.stdout and "nothing is installed" in dry.stdout
    )
    assert _create(decider, "nvidia.com/gpu=0", wants).rules == ("stale-facts",)  # a dry run changes nothing

    done = rdc("machine", "refresh", "lab")
    assert done.exit_code == 0, done.output
    assert "Machine lab is refreshed: 2 GPU(s)" in done.stderr
    inventory = load_inventory(demo.machine)
    assert inventory is not None
    assert {g["driverVersion"] for g in inventory["gpus"]} == {"595.12.03"}
    assert decider.spec_age() is None
    after = _create(decider, "nvidia.com/gpu=0", wants)
    assert after.forward, after.message


def test_refresh_refuses_a_spec_it_cannot_use_and_keeps_the_inventory(demo: FakeMachine) -> None:
    assert rdc("machine", "setup", "lab").exit_code == 0
    before = demo.machine.inventory_path.read_text()
    (demo.machine.cdi_dir / "broken.yaml").write_text("cdiVersion: 0.5.0\nkind: vendor.example/gpu\n")
    dry = rdc("machine", "refresh", "lab", "--dry-run")
    assert dry.exit_code == ToolError.exit_code and "broken.yaml" in dry.stderr
    done = rdc("machine", "refresh", "lab")
    assert done.exit_code == ToolError.exit_code
    assert "broken.yaml" in done.stderr and "the previous inventory was kept" in done.stderr
    assert demo.machine.inventory_path.read_text() == before


# --- MIG changes --------------------------------------------------------------------------------------


def _one_mig_device(xml: str) -> str:
    """GPU 1 reconfigured from two MIG devices to one."""
    start = xml.rindex("<mig_device>")
    end = xml.index("</mig_device>", start) + len("</mig_device>")
    return xml[:start] + xml[end:]


def test_a_mig_change_is_followed(demo: FakeMachine, plugins: Plugins) -> None:
    assert rdc("machine", "setup", "lab").exit_code == 0
    _serve_report(demo, _one_mig_device)

    # Before the spec is rewritten: a refresh sees one MIG device, and the spec's second is stale.
    assert rdc("machine", "refresh", "lab").exit_code == 0
    inventory = load_inventory(demo.machine)
    assert inventory is not None
    (_gpu0, gpu1) = inventory["gpus"]
    assert [p["cdiNames"][0] for p in gpu1["partitions"]] == ["nvidia.com/gpu=1:0"]
    assert [row["name"] for row in inventory["ungrantable"]][:1] == ["nvidia.com/gpu=1:1"]
    repo = RepoStore(demo.machine).create("alpha")
    with pytest.raises(RefusedError, match=re.escape("nvidia.com/gpu=1:1 is not grantable")):
        GrantStore(demo.machine, plugins).grant(repo, ["nvidia.com/gpu=1:1"])

    # The toolkit rewrites the spec: the gate holds device requests until the next refresh.
    _toolkit_refresh(demo)
    log: list[str] = []
    decider = _decider(demo, plugins, repo, log)
    assert _create(decider, "nvidia.com/gpu=1:0", []).rules == ("stale-facts",)
    assert rdc("machine", "refresh", "lab").exit_code == 0
    inventory = load_inventory(demo.machine)
    assert inventory is not None and "ungrantable" not in inventory
    assert "nvidia.com/gpu=1:1" not in {d["name"] for d in inventory["devices"]}
    assert _create(decider, "nvidia.com/gpu=1:0", []).forward
