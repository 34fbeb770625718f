"""`rdc slurm gres`: the node's gres.conf and its index map come from the inventory and the specs,
every GPU with explicit files, a partitioned GPU slice by slice; a map the hardware no longer matches
is stale. (The suite under tests/slurm runs them with a real slurmd.)"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from setup_kit import KIND, FakeVendor, example_gpu

from rediacc_core import CdiSpecFile, Gpu, GpuPartition
from rediacc_core.cli import cli
from rediacc_core.config import Config
from rediacc_core.errors import StateError
from rediacc_core.grants.records import read_grants
from rediacc_core.machine import Machine
from rediacc_core.plugins import get_plugins
from rediacc_core.setup import run_setup
from rediacc_core.slurm import gres
from rediacc_core.slurm.bridge import Step, cancel_refused, claim_node, gpu_indexes, jobs_json, read_jobs
from rediacc_core.slurm.client import Budget, Job, Share, iso, parse_budget, parse_share, parse_squeue
from rediacc_core.slurm.hooks import Outcome
from rediacc_core.testing import FakeMachine

DATA = Path(__file__).parent / "slurm" / "data"


@pytest.fixture
def fm(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> FakeMachine:
    machine = make_fake_machine("box")
    config = Config.load()
    config.add("box", machine.root)
    config.save()
    return machine


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def node(fm: FakeMachine, path: str, minor: int) -> dict[str, str]:
    fm.char_device(path, 195, minor)
    return {"path": path, "hostPath": str(fm.path(path))}


def spec(fm: FakeMachine) -> dict[str, Any]:
    """Two cards, the first split in two slices: a slice reaches its card's node and a cap of its own."""
    return {
        "cdiVersion": "0.6.0",
        "kind": KIND,
        "containerEdits": {"deviceNodes": [node(fm, "/dev/examplectl", 255)]},
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [node(fm, "/dev/examplegpu0", 0)]}},
            {"name": "1", "containerEdits": {"deviceNodes": [node(fm, "/dev/examplegpu1", 1)]}},
            {
                "name": "0:1",
                "containerEdits": {
                    "deviceNodes": [node(fm, "/dev/examplegpu0", 0), node(fm, "/dev/example-caps/cap1", 101)]
                },
            },
            {
                "name": "0:2",
                "containerEdits": {
                    "deviceNodes": [node(fm, "/dev/examplegpu0", 0), node(fm, "/dev/example-caps/cap2", 102)]
                },
            },
        ],
    }


def cards(split: bool = True) -> list[Gpu]:
    slices = [
        GpuPartition(
            index=i, uuid=f"MIG-{i}", profile="1g.10gb", memory_mib=9984, cdi_names=(f"{KIND}=0:{i}",)
        )
        for i in (1, 2)
    ]
    first = example_gpu(0, partitions=slices if split else (), architecture="Hopper")
    named = Gpu(**{**first.__dict__, "name": "Example H100 80GB HBM3"})
    return [named, example_gpu(1, architecture="Hopper")]


def set_up(vendor: FakeVendor, fm: FakeMachine, split: bool = True) -> None:
    vendor.gpus = cards(split)
    vendor.specs = [CdiSpecFile("example.yaml", spec=spec(fm))]
    done = rdc("machine", "setup", "box")
    assert done.exit_code == 0, done.output


def test_every_gpu_gets_an_explicit_typed_line_and_a_slice_its_files_together(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    set_up(vendor, fm)
    done = rdc("slurm", "gres", "box", "--node", "gpu1")
    assert done.exit_code == 0, done.output
    text = fm.path("/etc/slurm/gres.conf").read_text()
    root, caps = fm.root, fm.path("/dev/example-caps")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "AutoDetect=off",
        f"NodeName=gpu1 Name=gpu Type=h100_1g.10gb MultipleFiles={root}/dev/examplegpu0,{caps}/cap1",
        f"NodeName=gpu1 Name=gpu Type=h100_1g.10gb MultipleFiles={root}/dev/examplegpu0,{caps}/cap2",
        f"NodeName=gpu1 Name=gpu Type=example File={root}/dev/examplegpu1",
    ]
    # The slurm.conf part: counts by type, and the features a --constraint can name.
    assert (
        done.stdout.strip()
        == "NodeName=gpu1 Gres=gpu:h100_1g.10gb:2,gpu:example:1 Features=hopper,80gb,driver550"
    )
    mapped = json.loads(fm.path(gres.MAP_PATH).read_text())
    assert [(g["index"], g["cdi"], g["uuid"]) for g in mapped["gpus"]] == [
        (0, f"{KIND}=0:1", "MIG-1"),
        (1, f"{KIND}=0:2", "MIG-2"),
        (2, f"{KIND}=1", "GPU-00000001"),
    ]
    assert f"# rdc-generation: {mapped['generation']}" in text


def test_a_written_map_is_fresh_until_the_hardware_or_the_conf_changes(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    set_up(vendor, fm)
    assert rdc("slurm", "gres", "box", "--node", "gpu1").exit_code == 0
    assert gres.stale_reason(fm.machine, gres.read_map(fm.machine)) is None
    # The card is no longer split (index 0 would now be the whole card, not a slice), and the
    # inventory says so by a way that does not follow Slurm (setup's core, not the command).
    vendor.gpus = cards(split=False)
    run_setup(fm.machine, get_plugins(), {})
    why = gres.stale_reason(fm.machine, gres.read_map(fm.machine))
    assert why == (
        "the GPUs of machine box changed since the gres map was written: run `rdc slurm gres box --node gpu1`"
    )
    assert rdc("slurm", "gres", "box", "--node", "gpu1").exit_code == 0
    assert gres.stale_reason(fm.machine, gres.read_map(fm.machine)) is None
    conf = fm.path("/etc/slurm/gres.conf")
    conf.write_text(conf.read_text().replace("Type=example", "Type=other"))
    edited = gres.stale_reason(fm.machine, gres.read_map(fm.machine))
    assert (
        edited == "/etc/slurm/gres.conf was changed since rdc wrote it: run `rdc slurm gres box --node gpu1`"
    )
    conf.write_text("AutoDetect=nvml\n")
    assert "is not the generation of the gres map" in (
        gres.stale_reason(fm.machine, gres.read_map(fm.machine)) or ""
    )


def test_no_map_is_stale_with_the_command_that_writes_it(vendor: FakeVendor, fm: FakeMachine) -> None:
    set_up(vendor, fm)
    assert gres.stale_reason(fm.machine, None) == (
        "no gres map at /etc/rediacc/slurm/gres-map.json: run `rdc slurm gres box --node NODE`"
    )


def test_a_dry_run_prints_the_conf_and_writes_nothing(vendor: FakeVendor, fm: FakeMachine) -> None:
    set_up(vendor, fm)
    done = rdc("slurm", "gres", "box", "--node", "gpu1", "--dry-run")
    assert done.exit_code == 0, done.output
    assert "AutoDetect=off" in done.stdout
    assert not fm.path("/etc/slurm/gres.conf").exists() and not fm.path(gres.MAP_PATH).exists()


@pytest.mark.parametrize(
    ("name", "vendor", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "nvidia", "h100"),
        ("NVIDIA A100-SXM4-40GB", "nvidia", "a100"),
        ("AMD Instinct MI210", "amd", "mi210"),
        ("Intel(R) UHD Graphics 770", "intel", "intel"),
    ],
)
def test_the_type_is_the_model_word_of_the_name(name: str, vendor: str, expected: str) -> None:
    assert gres.gres_type(Gpu(vendor=vendor, source="x", name=name)) == expected


def test_squeue_22_05_json_is_read_as_jobs() -> None:
    """A capture of bookworm's Slurm 22.05 (`squeue --json`, two leases running on n1)."""
    jobs = parse_squeue((DATA / "squeue-22.05.json").read_text())
    assert [(j.job_id, j.state, j.comment, j.account, j.user, j.nodes) for j in jobs] == [
        ("1", "RUNNING", "rdc-repo=alpha", "teama", "root", "n1"),
        ("2", "RUNNING", "rdc-repo=beta", "teama", "root", "n1"),
    ]
    assert jobs[0].live and jobs[0].end_iso is not None and jobs[0].gpus == ("gpu:example:1(IDX:0)",)


def test_setup_and_refresh_keep_a_written_map_in_step_with_the_inventory(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    set_up(vendor, fm)
    done = rdc("machine", "setup", "box")
    assert "gres" not in done.stderr  # never written: setup leaves Slurm alone
    assert rdc("slurm", "gres", "box", "--node", "gpu1").exit_code == 0
    vendor.gpus = cards(split=False)
    done = rdc("machine", "refresh", "box")
    assert done.exit_code == 0, done.output
    assert "/etc/slurm/gres.conf and the gres map are rewritten" in done.stderr
    assert "restart slurmd on gpu1" in done.stderr
    assert gres.stale_reason(fm.machine, gres.read_map(fm.machine)) is None
    assert "Type=h100 File=" in fm.path("/etc/slurm/gres.conf").read_text()


def test_a_teams_gpu_minutes_are_read_from_the_controllers_association() -> None:
    """A capture of 22.05's `scontrol show assoc_mgr flags=assoc accounts=teamc` (teamc: no minutes)."""
    text = (DATA / "assoc-mgr-22.05.txt").read_text()
    assert parse_budget(text, "teamc") == Budget("teamc", 0, 0)
    assert parse_budget(text, "teamc").spent == 1.0
    spent = text.replace("pages=N(0),gres/gpu=0(0)", "pages=N(0),gres/gpu=6000(4950)")
    assert parse_budget(spent, "teamc") == Budget("teamc", 6000, 4950)
    assert parse_budget(spent, "teamc").left == 1050
    assert parse_budget(text, "teama") == Budget("teama", None, 0)  # no such association: no limit known


def external_job(*gres_detail: str) -> Job:
    return Job(
        "7", "RUNNING", "None", "external", "root", "teama", "rdc-repo=a", "", "gpu1", 0, 0, gres_detail
    )


def test_the_bridge_picks_free_cards_of_the_counted_type_since_slurm_numbers_none_on_an_external_node(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    set_up(vendor, fm)
    assert rdc("slurm", "gres", "box", "--node", "gpu1").exit_code == 0
    box = Config.load().machine("box")
    assert gpu_indexes(external_job("gpu:example(CNT:1)"), box) == "2"
    assert gpu_indexes(external_job("gpu:h100_1g.10gb(CNT:2)"), box) == "0,1"
    assert gpu_indexes(external_job("gpu(CNT:3)"), box) == "0,1,2"
    # A Slurm that numbers the cards is taken at its word.
    assert gpu_indexes(external_job("gpu:example:1(IDX:2)"), box) == "2"
    # A card any grant holds (a lease's, or one made outside Slurm) is never picked.
    assert rdc("repo", "create", "a@box").exit_code == 0
    done = rdc("repo", "gpu", "grant", "a@box", "--device", f"{KIND}=0:1", "--exclusive")
    assert done.exit_code == 0, done.output
    assert gpu_indexes(external_job("gpu:h100_1g.10gb(CNT:1)"), box) == "1"
    assert gpu_indexes(external_job("gpu:h100_1g.10gb(CNT:2)"), box) == "1"


def step(jobs: str, *extra: str) -> Result:
    return rdc("slurm", "bridge-step", "box", "--cluster", "c", "--jobs", jobs, "-o", "json", *extra)


def test_a_bridge_step_grants_and_reconciles_on_the_box_and_answers_its_refusals_calling_no_slurm_tool(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    """The bridge's jobs are 22.05's capture (two leases running on n1), ending in ten minutes; the
    box has no Slurm tool at all, so a step that called one would fail."""
    set_up(vendor, fm, split=False)
    assert rdc("slurm", "gres", "box", "--node", "n1").exit_code == 0
    for repo, account in (("alpha", "teama"), ("beta", "teamb")):
        assert rdc("repo", "create", f"{repo}@box").exit_code == 0
        assert rdc("repo", "slurm", "allow", f"{repo}@box", "--account", account).exit_code == 0
    end = int(time.time()) + 600
    read = [replace(j, end=end) for j in parse_squeue((DATA / "squeue-22.05.json").read_text())]
    jobs = jobs_json(read)
    assert read_jobs(jobs) == [replace(j, reason="", name="", start=0) for j in read]

    done = step(jobs)
    assert done.exit_code == 0, done.output
    answer = json.loads(done.stdout)
    assert answer["node"] == "n1"
    granted, refused = answer["outcomes"]
    assert (granted["job"], granted["repo"], granted["granted"]) == ("slurm:c/1", "alpha@box", [f"{KIND}=0"])
    assert refused["job"] == "slurm:c/2" and not refused["drain"]
    assert refused["refused"].startswith("user root (account teama) may not lease for repo beta@box")
    (grant,) = read_grants(fm.machine)
    assert (grant.device, grant.job, grant.expires_at) == (f"{KIND}=0", "slurm:c/1", iso(end))

    assert json.loads(step(jobs).stdout)["outcomes"] == [refused]  # granted once; refused until cancelled
    gone = step("[]")
    assert [o["revoked"] for o in json.loads(gone.stdout)["outcomes"]] == [[f"{KIND}=0"]], gone.output
    assert read_grants(fm.machine) == []


def test_a_bridge_step_grants_no_job_past_its_end_though_slurm_still_shows_it_running(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    """slurmctld looks at time limits every 30 s: a job past its end may still be RUNNING in squeue;
    its grant lapsed at that end, and a step must not write a lapsed one again."""
    set_up(vendor, fm, split=False)
    assert rdc("slurm", "gres", "box", "--node", "n1").exit_code == 0
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    assert rdc("repo", "slurm", "allow", "alpha@box", "--account", "teama").exit_code == 0
    (job, _) = parse_squeue((DATA / "squeue-22.05.json").read_text())
    done = step(jobs_json([replace(job, end=int(time.time()) - 1)]))
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["outcomes"] == []
    assert read_grants(fm.machine) == []


def test_a_bridge_step_refuses_jobs_it_cannot_read_and_a_machine_that_is_no_node(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    set_up(vendor, fm)
    done = step("[]")
    assert done.exit_code != 0
    assert "machine box has no gres map" in done.output and "rdc slurm gres box --node NODE" in done.output
    assert rdc("slurm", "gres", "box", "--node", "n1").exit_code == 0
    done = step('[{"job_id": "1"}]')
    assert done.exit_code != 0 and "--jobs is not a list of jobs as the bridge writes them" in done.output


def test_the_bridge_writes_a_unit_that_runs_it_by_this_rdcs_path_and_always_restarts_it(
    fm: FakeMachine, tmp_path: Path
) -> None:
    unit = tmp_path / "rediacc-slurm-bridge.service"
    done = rdc("slurm", "bridge", "box", "--slurm", "box", "--interval", "0.5", "--write-unit", str(unit))
    assert done.exit_code == 0, done.output
    lines = unit.read_text().splitlines()
    start = next(line for line in lines if line.startswith("ExecStart="))
    program, *args = shlex.split(start.removeprefix("ExecStart="))
    assert Path(program).is_absolute() and Path(program).name == "rdc"
    assert args == ["slurm", "bridge", "box", "--slurm", "box", "--interval", "0.5"]
    assert "Restart=always" in lines and "WantedBy=multi-user.target" in lines
    assert f"systemctl enable --now {unit.name}" in done.output
    if shutil.which("systemd-analyze") and Path(program).exists():  # systemd's own reading of it
        checked = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    unknown = rdc("slurm", "bridge", "box", "--slurm", "nowhere", "--write-unit", str(unit))
    assert unknown.exit_code != 0 and "nowhere" in unknown.output


def test_a_teams_fair_share_is_its_accounts_row_of_sshare() -> None:
    """22.05's `sshare -n -P -A teama -o Account,User,NormShares,EffectvUsage`: the account's row has no
    user; its users' rows follow, indented."""
    text = "teama||0.250000|0.612500\n teama|root|1.000000|1.000000\n"
    assert parse_share(text, "teama") == Share("teama", 0.25, 0.6125)
    assert parse_share(" teamb||0.250000|\n", "teamb") == Share("teamb", 0.25, None)
    assert parse_share(text, "teamz") == Share("teamz", None, None)


def lease_on_box(vendor: FakeVendor, fm: FakeMachine) -> tuple[Job, int]:
    """Box `box` as node n1 with repo alpha (teama may lease for it), and 22.05's first captured
    job (alpha's, on n1) ending in ten minutes."""
    set_up(vendor, fm, split=False)
    assert rdc("slurm", "gres", "box", "--node", "n1").exit_code == 0
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    assert rdc("repo", "slurm", "allow", "alpha@box", "--account", "teama").exit_code == 0
    end = int(time.time()) + 600
    (job, _) = parse_squeue((DATA / "squeue-22.05.json").read_text())
    return replace(job, end=end), end


def test_a_lease_the_operator_revoked_is_not_granted_again_while_its_job_runs(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    job, _ = lease_on_box(vendor, fm)
    assert json.loads(step(jobs_json([job])).stdout)["outcomes"][0]["granted"] == [f"{KIND}=0"]
    revoked = rdc("repo", "gpu", "revoke", "alpha@box", "--device", f"{KIND}=0")
    assert revoked.exit_code == 0, revoked.output
    assert json.loads(step(jobs_json([job])).stdout)["outcomes"] == []  # the revoke stands
    assert read_grants(fm.machine) == []
    # Once the job left the live jobs (ended, or requeued and pending), its next run is granted anew.
    assert step("[]").exit_code == 0
    assert json.loads(step(jobs_json([job])).stdout)["outcomes"][0]["granted"] == [f"{KIND}=0"]


def test_a_job_whose_limit_was_lowered_below_its_run_time_is_not_renewed_into_the_past(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    job, end = lease_on_box(vendor, fm)
    assert step(jobs_json([job])).exit_code == 0
    lowered = step(jobs_json([replace(job, end=int(time.time()) - 5)]))
    assert lowered.exit_code == 0, lowered.output
    assert [g.expires_at for g in read_grants(fm.machine)] == [iso(end)]  # lapses at its own end


def test_a_bridge_step_needs_the_live_jobs_since_a_grant_whose_job_is_missing_is_revoked(
    fm: FakeMachine,
) -> None:
    done = rdc("slurm", "bridge-step", "box", "--cluster", "c")
    assert done.exit_code != 0 and "--jobs" in done.output


def test_the_bridge_acts_on_no_job_or_node_a_box_answers_for_beyond_its_own() -> None:
    """A box's answer names its node and its refusals; the operator's host cancels and drains only a
    job sent to that box for that node, and one node is one box's."""
    on_n1 = client_job("7", "n1")
    answer = Step("n1", [Outcome("slurm:c/9", "alpha@box", refused="made up")])
    with pytest.raises(StateError, match="refused job 9, which is no job of its node n1"):
        cancel_refused(Machine("ops", Path("/nonexistent")), "box", answer, answer.done[0], [on_n1])
    claimed: dict[str, str] = {}
    claim_node(claimed, "n1", "box")
    claim_node(claimed, "n1", "box")
    with pytest.raises(StateError, match="machines box and other both answer for Slurm node n1"):
        claim_node(claimed, "n1", "other")


def client_job(job_id: str, node: str) -> Job:
    return Job(job_id, "RUNNING", "", "", "root", "teama", "rdc-repo=alpha", "", node, 0, 0, ())
