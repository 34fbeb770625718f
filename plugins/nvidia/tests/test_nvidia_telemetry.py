"""Per-repo GPU telemetry on an NVIDIA machine with MIG: dcgm-exporter's job-mapping files and the
`rediacc_gpu_grant_info` series follow every grant, revoke, lease end and handover."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rediacc_core import telemetry
from rediacc_core.grants.store import GrantStore
from rediacc_core.plugins import Plugins, load_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.runtime.serve import log_keeper
from rediacc_core.settings import set_setting
from rediacc_core.testing import FakeMachine

UUID = "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"
MAPPING = "/run/dcgm-job-map"


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "nvidia")
    return load_plugins()


@pytest.fixture
def a100(plugins: Plugins, set_up_mig_a100: Callable[[Plugins], FakeMachine]) -> FakeMachine:
    fm = set_up_mig_a100(plugins)
    set_setting(fm.machine, "dcgm-job-mapping-dir", MAPPING)
    return fm


def mapping(fm: FakeMachine) -> dict[str, str]:
    """The job-mapping directory as dcgm-exporter reads it: file name -> contents."""
    directory = fm.path(MAPPING)
    return {f.name: f.read_text() for f in sorted(directory.iterdir())} if directory.exists() else {}


def grant_info(fm: FakeMachine) -> list[str]:
    text = telemetry.metrics_path(fm.machine).read_text()
    return [line for line in text.splitlines() if line.startswith("rediacc_gpu_grant_info{")]


def test_mapping_files_follow_grant_revoke_lease_end_and_handover(
    a100: FakeMachine, plugins: Plugins, monkeypatch: pytest.MonkeyPatch
) -> None:
    repos = RepoStore(a100.machine)
    alpha, beta, gamma = repos.create("alpha"), repos.create("beta"), repos.create("gamma")
    nobody = Holdings(a100.machine, holders=lambda repo: [], stop=lambda holder: None)  # no daemon runs
    store = GrantStore(a100.machine, plugins, running=nobody)

    # A MIG device's file is `<gpu index>.<gpu instance id>` (the capture's instances are 1 and 2).
    store.grant(alpha, ["nvidia.com/gpu=0:0"])
    store.grant(beta, ["nvidia.com/gpu=0:1"], expires_at="2999-01-01T00:00:00Z")
    assert mapping(a100) == {"0.1": "alpha\n", "0.2": "beta\n"}
    # A whole GPU (by index or UUID) is `<gpu index>`; two repos sharing one are one line each.
    store.grant(gamma, [f"nvidia.com/gpu={UUID}"])
    store.grant(alpha, ["nvidia.com/gpu=0"])
    assert mapping(a100) == {"0": "alpha\ngamma\n", "0.1": "alpha\n", "0.2": "beta\n"}
    assert grant_info(a100) == [
        'rediacc_gpu_grant_info{repo="alpha",device="nvidia.com/gpu=0",uuid="'
        + UUID
        + '",exclusive="false"} 1',
        'rediacc_gpu_grant_info{repo="alpha",device="nvidia.com/gpu=0:0",uuid="MIG-00000000-0000-0000-0000-'
        '000000000000",exclusive="false"} 1',
        'rediacc_gpu_grant_info{repo="beta",device="nvidia.com/gpu=0:1",uuid="MIG-00000001-0000-0000-0000-'
        '000000000001",exclusive="false"} 1',
        f'rediacc_gpu_grant_info{{repo="gamma",device="nvidia.com/gpu={UUID}",uuid="{UUID}",'
        'exclusive="false"} 1',
    ]

    # A revoke removes the repo's line, and a file no grant reaches any more.
    store.revoke(alpha, ["nvidia.com/gpu=0", "nvidia.com/gpu=0:0"])
    assert mapping(a100) == {"0": "gamma\n", "0.2": "beta\n"}

    # A lease ends without a write: the gate's housekeeping round (every 30 s, of any repo's gate)
    # brings the files up to date.
    monkeypatch.setattr("rediacc_core.grants.records.now_iso", lambda: "3000-01-01T00:00:00Z")
    said: list[str] = []
    log_keeper(a100.machine, gamma, said.append).check()
    assert mapping(a100) == {"0": "gamma\n"}, said
    assert not [line for line in said if "telemetry" in line or "housekeeping failed" in line]
    monkeypatch.undo()

    # A handover: the other repo's grant goes, the new holder's comes, in one step.
    store.grant(alpha, ["nvidia.com/gpu=all"], exclusive=True, take_over=True)
    assert mapping(a100) == {"0": "alpha\n"}
    assert grant_info(a100) == [
        'rediacc_gpu_grant_info{repo="alpha",device="nvidia.com/gpu=all",uuid="'
        + UUID
        + '",exclusive="true"} 1'
    ]


def test_files_of_others_in_the_directory_are_left_alone(a100: FakeMachine, plugins: Plugins) -> None:
    a100.write(f"{MAPPING}/README", "kept\n")
    a100.write(f"{MAPPING}/7", "slurm-job-1\n")  # a stale GPU file: rdc owns the GPU-named files
    alpha = RepoStore(a100.machine).create("alpha")
    GrantStore(a100.machine, plugins).grant(alpha, ["nvidia.com/gpu=0"])
    assert mapping(a100) == {"0": "alpha\n", "README": "kept\n"}


def test_without_the_setting_no_mapping_is_written(a100: FakeMachine, plugins: Plugins) -> None:
    set_setting(a100.machine, "dcgm-job-mapping-dir", "")
    alpha = RepoStore(a100.machine).create("alpha")
    GrantStore(a100.machine, plugins).grant(alpha, ["nvidia.com/gpu=0"])
    assert mapping(a100) == {} and len(grant_info(a100)) == 1


def test_the_setting_takes_an_absolute_directory(a100: FakeMachine) -> None:
    from rediacc_core.errors import ValidationError

    with pytest.raises(ValidationError, match="not an absolute directory path"):
        set_setting(a100.machine, "dcgm-job-mapping-dir", "run/map")
    assert Path(MAPPING).is_absolute()
