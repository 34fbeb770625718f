"""`rdc repo` and `rdc repo gpu`: what an operator types and sees, with exit codes scripts rely on."""

from __future__ import annotations

import json
import multiprocessing
import os
import pty
import subprocess
import sys
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from grants_kit import GPU, build_machine, fake_plugins, registered_box, set_uuids

from rediacc_core.cli import cli
from rediacc_core.config import Config
from rediacc_core.errors import (
    EXIT_AMBIGUOUS,
    EXIT_BUSY,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_STATE,
    EXIT_VALIDATION,
)
from rediacc_core.grants.records import read_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.layout import runtime_for
from rediacc_core.statelock import state_lock
from rediacc_core.testing import FakeMachine


@pytest.fixture
def box(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> Iterator[Machine]:
    with registered_box(make_fake_machine("box")) as machine:
        yield machine


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def ok(*args: str) -> Result:
    result = rdc(*args)
    assert result.exit_code == 0, result.output
    return result


def test_create_list_and_delete_a_repo(box: Machine) -> None:
    created = ok("repo", "create", "alpha@box")
    assert "Created repo alpha@box" in created.stderr and created.stdout == ""
    [row] = json.loads(ok("repo", "list", "box", "-o", "json").stdout)
    assert (row["ref"], row["tag"], row["grants"]) == ("alpha@box", None, [])
    assert "alpha@box" in ok("repo", "list", "box").stdout
    ok("repo", "delete", "alpha@box", "--yes")
    assert json.loads(ok("repo", "list", "box", "-o", "json").stdout) == []


def test_create_needs_the_machine_and_a_free_name(box: Machine) -> None:
    missing = rdc("repo", "create", "alpha")
    assert missing.exit_code == EXIT_VALIDATION and "alpha@<machine>" in missing.stderr
    ok("repo", "create", "alpha@box")
    taken = rdc("repo", "create", "alpha@box")
    assert taken.exit_code == EXIT_STATE and "already exists" in taken.stderr
    assert rdc("repo", "create", "alpha@nowhere").exit_code == EXIT_NOT_FOUND


def test_create_attached_to_an_existing_daemon(box: Machine) -> None:
    ok("repo", "create", "ext@box", "--docker-host", "unix:///run/ext/docker.sock")
    [row] = json.loads(ok("repo", "list", "box", "-o", "json").stdout)
    assert row["dockerHost"] == "unix:///run/ext/docker.sock"
    bad = rdc("repo", "create", "ext2@box", "--docker-host", "/run/ext/docker.sock")
    assert bad.exit_code == EXIT_VALIDATION


def test_delete_asks_first_and_refuses_without_a_terminal(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    refused = rdc("repo", "delete", "alpha@box")
    assert refused.exit_code == EXIT_REFUSED and "--yes" in refused.stderr
    assert [r.label for r in RepoStore(box).list()] == ["alpha"]


def _answering(answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`rdc ARGS` in a process whose stdin is a terminal, answering its prompt with `answer`."""
    main, child = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "rediacc_core.cli", *args],
            stdin=child,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.write(main, answer.encode() + b"\n")
        out, err = process.communicate(timeout=60)
    finally:
        os.close(child)
        os.close(main)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_delete_on_a_terminal_asks_and_keeps_the_repo_unless_told_yes(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    kept = _answering("n", "repo", "delete", "alpha@box")
    assert kept.returncode == 1, kept.stderr
    assert "Delete repo alpha@box and its GPU grants?" in kept.stderr and "Aborted." in kept.stderr
    assert [r.label for r in RepoStore(box).list()] == ["alpha"]
    deleted = _answering("y", "repo", "delete", "alpha@box")
    assert deleted.returncode == 0, deleted.stderr
    assert RepoStore(box).list() == []


def test_delete_refuses_a_running_repo(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    repo = RepoStore(box).get_by_label("alpha")
    runtime = runtime_for(box, repo)
    runtime.gate_pidfile.parent.mkdir(parents=True, exist_ok=True)
    runtime.gate_pidfile.write_text(f"{os.getpid()}\n")  # a live pid stands for the gate

    refused = rdc("repo", "delete", "alpha@box", "--yes")

    assert refused.exit_code == EXIT_STATE
    assert "is running: gate (pid" in refused.stderr and "rdc repo down alpha@box" in refused.stderr
    assert [r.label for r in RepoStore(box).list()] == ["alpha"]


def test_grant_list_revoke(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    granted = ok(
        "repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", "--device", f"{GPU}=1", "--exclusive"
    )
    assert f"Granted {GPU}=0 exclusively to alpha@box" in granted.stderr
    listed = json.loads(ok("repo", "gpu", "list", "alpha@box", "-o", "json").stdout)
    assert [(g["device"], g["exclusive"]) for g in listed] == [(f"{GPU}=0", True), (f"{GPU}=1", True)]
    assert yaml.safe_load(ok("repo", "gpu", "list", "alpha", "-o", "yaml").stdout) == listed
    table = ok("repo", "gpu", "list", "alpha").stdout.splitlines()
    assert table[0].split() == ["DEVICE", "EXCLUSIVE", "GRANTED", "AT", "EXPIRES", "STATE"]
    assert table[1].split()[:2] == [f"{GPU}=0", "yes"]
    assert f"{GPU}=0 *" in ok("repo", "list", "box").stdout
    ok("repo", "gpu", "revoke", "alpha", "--device", f"{GPU}=0")
    listed = json.loads(ok("repo", "gpu", "list", "alpha", "-o", "json").stdout)
    assert [g["device"] for g in listed] == [f"{GPU}=1"]


def test_a_suspended_grant_is_shown_and_confirmed(box: Machine) -> None:
    from rediacc_core.recheck import recheck_grants

    set_uuids(box, "GPU-a", "GPU-b")
    ok("repo", "create", "alpha@box")
    ok("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", "--exclusive")
    (listed,) = json.loads(ok("repo", "gpu", "list", "alpha", "-o", "json").stdout)
    assert listed["boundTo"] == [{"unit": "pci:0000:0a:00.0", "pciBusId": "0000:0a:00.0", "uuid": "GPU-a"}]
    assert listed["suspended"] is None
    set_uuids(box, "GPU-b", "GPU-a")  # the cards swapped; what setup's re-check then does:
    recheck_grants(box, fake_plugins())
    (listed,) = json.loads(ok("repo", "gpu", "list", "alpha", "-o", "json").stdout)
    assert listed["suspended"]["reason"] == "moved"
    shown = ok("repo", "gpu", "list", "alpha")
    assert shown.stdout.splitlines()[1].split()[-2:] == ["suspended", "(moved)"]
    confirm = f"rdc repo gpu confirm alpha@box --device {GPU}=0"
    assert "now reaches GPU-b at 0000:0a:00.0; it reaches nothing until resolved" in shown.stderr
    assert confirm in shown.stderr
    assert f"{GPU}=0 * (suspended)" in ok("repo", "list", "box").stdout
    machine_view = ok("machine", "gpu", "list", "box")
    assert "alpha (exclusive, suspended)" in machine_view.stdout
    assert f"Suspended: the grant of {GPU}=0 to repo alpha@box" in machine_view.stderr
    assert confirm in machine_view.stderr
    confirmed = ok(*confirm.split()[1:])
    assert f"alpha@box holds {GPU}=0 again, bound to GPU-b at 0000:0a:00.0." in confirmed.stderr
    (listed,) = json.loads(ok("repo", "gpu", "list", "alpha", "-o", "json").stdout)
    assert listed["suspended"] is None and listed["boundTo"][0]["uuid"] == "GPU-b"


def test_a_leased_grant_shows_its_end_and_is_renewed(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    granted = ok("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", "--for", "8h")
    assert f"Granted {GPU}=0 to alpha@box until 20" in granted.stderr
    (lease,) = json.loads(ok("repo", "gpu", "list", "alpha", "-o", "json").stdout)
    assert lease["expiresAt"].endswith("Z") and lease["expiresAt"] > lease["grantedAt"]
    assert lease["expiresAt"] in ok("repo", "gpu", "list", "alpha").stdout
    ok("repo", "gpu", "renew", "alpha", "--device", f"{GPU}=0", "--until", "2099-01-01T00:00Z")
    assert read_grants(box)[0].expires_at == "2099-01-01T00:00:00Z"
    ok("repo", "gpu", "renew", "alpha", "--device", f"{GPU}=0", "--forever")
    assert read_grants(box)[0].expires_at is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--for", "8 hours"], "is not a duration"),
        (["--for", "0h"], "no time at all"),
        (["--until", "tomorrow"], "is not a time"),
        (["--until", "2001-01-01T00:00Z"], "already past"),
        (["--for", "1h", "--until", "2099-01-01"], "both say when"),
    ],
)
def test_a_lease_that_makes_no_sense_exits_2_and_grants_nothing(
    box: Machine, args: list[str], says: str
) -> None:
    ok("repo", "create", "alpha@box")
    result = rdc("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", *args)
    assert result.exit_code == EXIT_VALIDATION and says in result.stderr
    assert read_grants(box) == []


def test_a_lease_over_is_no_grant_for_anyone(box: Machine) -> None:
    """Expiry needs no process: every reader sees an ended lease as absent, and it stops reserving."""
    ok("repo", "create", "alpha@box")
    ok("repo", "create", "beta@box")
    ok("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", "--exclusive", "--for", "1h")
    document = json.loads(box.grants_path.read_text())
    document["grants"][0]["expiresAt"] = "2001-01-01T00:00:00Z"  # the hour has passed
    box.grants_path.write_text(json.dumps(document))
    assert json.loads(ok("repo", "gpu", "list", "alpha", "-o", "json").stdout) == []
    assert (
        rdc("repo", "gpu", "renew", "alpha", "--device", f"{GPU}=0", "--for", "1h").exit_code
        == EXIT_NOT_FOUND
    )
    ok("repo", "gpu", "grant", "beta", "--device", f"{GPU}=0", "--exclusive")  # no longer reserved
    assert [g.repo_id for g in read_grants(box)] == [RepoStore(box).get_by_label("beta").id]


def test_a_typo_exits_2_with_suggestions_and_records_nothing(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    result = rdc("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", "--device", f"{GPU}=al")
    assert result.exit_code == EXIT_VALIDATION
    assert result.stderr.startswith("Error: ") and f"did you mean {GPU}=all" in result.stderr
    assert "What to do: " in result.stderr
    assert read_grants(box) == []


def test_an_exclusive_conflict_exits_4_naming_the_repo_and_grant_in_the_way(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    ok("repo", "create", "beta@box")
    ok("repo", "gpu", "grant", "beta", "--device", f"{GPU}=all", "--exclusive")
    result = rdc("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0")
    assert result.exit_code == EXIT_REFUSED
    assert f"repo beta@box holds {GPU}=all exclusively" in result.stderr
    assert f"rdc repo gpu revoke beta@box --device {GPU}=all" in result.stderr


def test_take_over_lists_every_grant_it_revokes_and_asks_first(box: Machine) -> None:
    for name in ("alpha", "beta", "gamma"):
        ok("repo", "create", f"{name}@box")
    ok("repo", "gpu", "grant", "beta", "--device", f"{GPU}=0")
    ok("repo", "gpu", "grant", "gamma", "--device", f"{GPU}=all")  # a third repo's shared grant
    take = ("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", "--exclusive", "--take-over")
    listing = f"revokes: {GPU}=0 of repo beta@box; {GPU}=all of repo gamma@box"
    refused = rdc(*take)  # no terminal here
    assert refused.exit_code == EXIT_REFUSED and listing in refused.stderr
    assert f"rdc repo gpu grant alpha@box --device {GPU}=0 --exclusive --take-over --yes" in refused.stderr
    kept = _answering("n", *take)
    assert kept.returncode == 1 and "and stop every container of those repos?" in kept.stderr
    assert len(read_grants(box)) == 2  # nothing revoked
    moved = ok(*take, "--yes")
    assert listing in moved.stderr
    assert [(g.device, g.exclusive) for g in read_grants(box)] == [(f"{GPU}=0", True)]


def test_yes_goes_with_take_over(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    result = rdc("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0", "--exclusive", "--yes")
    assert result.exit_code == 2 and "--yes goes with --take-over" in result.stderr


def test_revoking_what_is_not_held_exits_5(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    result = rdc("repo", "gpu", "revoke", "alpha", "--device", f"{GPU}=0")
    assert result.exit_code == EXIT_NOT_FOUND and "holds no grant" in result.stderr


def test_fork_starts_without_grants_and_delete_takes_them_away(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    ok("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0")
    forked = ok("repo", "fork", "alpha", "--tag", "exp")
    assert "alpha:exp@box" in forked.stderr and "no GPU grants" in forked.stderr
    assert json.loads(ok("repo", "gpu", "list", "alpha:exp", "-o", "json").stdout) == []
    ok("repo", "delete", "alpha", "--yes")
    ok("repo", "create", "alpha@box")
    assert json.loads(ok("repo", "gpu", "list", "alpha", "-o", "json").stdout) == []
    assert read_grants(box) == []


def test_fork_copies_the_files_and_the_containers_records_name_only_the_forks_paths(box: Machine) -> None:
    from rediacc_core.gate.policy.pins import directory_for
    from rediacc_core.repos import RepoStore, files_dir, repo_state_dir

    ok("repo", "create", "alpha@box")
    alpha = RepoStore(box).get_by_label("alpha")
    (files_dir(box, alpha.id) / "data.txt").write_text("alpha's\n")
    state = repo_state_dir(box, alpha.id)
    record = state / "docker/containers/c1/hostconfig.json"
    record.parent.mkdir(parents=True)
    pin = directory_for(box.run_dir, alpha.id) / "p0"
    record.write_text(
        json.dumps({"Binds": [f"{files_dir(box, alpha.id)}/d:/d", f"{pin}:/p", "/srv/shared:/s"]})
    )
    forked = json.loads(ok("repo", "fork", "alpha", "--tag", "exp", "-o", "json").stdout)
    assert forked["copied"] == ["files", "docker"] and forked["containers"] == 1
    fork_id = forked["id"]
    assert (files_dir(box, fork_id) / "data.txt").read_text() == "alpha's\n"
    copied = json.loads((repo_state_dir(box, fork_id) / "docker/containers/c1/hostconfig.json").read_text())
    assert copied["Binds"] == [
        f"{files_dir(box, fork_id)}/d:/d",
        f"{directory_for(box.run_dir, fork_id)}/p0:/p",
        "/srv/shared:/s",  # an operator's shared bind root stays itself
    ]
    (files_dir(box, fork_id) / "data.txt").write_text("the fork's\n")
    assert (files_dir(box, alpha.id) / "data.txt").read_text() == "alpha's\n"


def test_fork_repins_a_bind_volume_to_its_own_copy_of_the_files(box: Machine) -> None:
    """A volume bound to the source's files names the source's pin, in the local driver's options
    (what it mounts) and in the volume store's bolt database: both name the fork's pin of its copy."""
    from rediacc_core.gate.policy.pins import directory_for, pin_name
    from rediacc_core.repos import RepoStore, files_dir, repo_state_dir
    from rediacc_core.runtime import boltdb

    ok("repo", "create", "alpha@box")
    alpha = RepoStore(box).get_by_label("alpha")
    (files_dir(box, alpha.id) / "shared").mkdir()
    name = pin_name(os.stat(files_dir(box, alpha.id) / "shared"), read_only=False)
    state = repo_state_dir(box, alpha.id)
    (state / "pins.json").write_text(
        json.dumps({name: {"source": f"{files_dir(box, alpha.id)}/shared", "readOnly": False}})
    )
    pinned = f"{directory_for(box.run_dir, alpha.id)}/{name}"
    (state / "docker/volumes/vb").mkdir(parents=True)
    (state / "docker/volumes/vb/opts.json").write_text(
        json.dumps({"MountType": "none", "MountOpts": "bind", "MountDevice": pinned, "Quota": {"Size": 0}})
    )
    meta = {"Name": "vb", "Driver": "local", "Labels": None, "Options": {"device": pinned, "o": "bind"}}
    volumes = boltdb.Bucket({b"vb": json.dumps(meta).encode()})
    boltdb.write(state / "docker/volumes/metadata.db", boltdb.Database(boltdb.Bucket({b"volumes": volumes})))

    fork_id = json.loads(ok("repo", "fork", "alpha", "--tag", "exp", "-o", "json").stdout)["id"]
    copy = files_dir(box, fork_id) / "shared"
    repinned = f"{directory_for(box.run_dir, fork_id)}/{pin_name(os.stat(copy), read_only=False)}"
    fork_state = repo_state_dir(box, fork_id)
    assert json.loads((fork_state / "docker/volumes/vb/opts.json").read_text())["MountDevice"] == repinned
    stored = boltdb.read(fork_state / "docker/volumes/metadata.db").root.items[b"volumes"]
    assert isinstance(stored, boltdb.Bucket) and isinstance(record := stored.items[b"vb"], bytes)
    assert json.loads(record)["Options"] == {"device": repinned, "o": "bind"}
    assert json.loads((fork_state / "pins.json").read_text()) == {
        repinned.rsplit("/", 1)[1]: {"source": str(copy), "readOnly": False}
    }


def test_fork_leaves_tenant_content_as_it_is_and_refuses_a_record_it_cannot_rewrite(box: Machine) -> None:
    """A volume's data may hold anything, the source's paths too: it is copied as it is. A daemon
    record naming the source in a form rdc cannot rewrite refuses the fork, and nothing is kept."""
    from rediacc_core.repos import RepoStore, repo_state_dir

    ok("repo", "create", "alpha@box")
    alpha = RepoStore(box).get_by_label("alpha")
    state = repo_state_dir(box, alpha.id)
    tenant = state / "docker/volumes/v/_data/notes"
    tenant.parent.mkdir(parents=True)
    tenant.write_bytes(b"\x00" + bytes(state))
    fork_id = json.loads(ok("repo", "fork", "alpha", "--tag", "exp", "-o", "json").stdout)["id"]
    assert (repo_state_dir(box, fork_id) / "docker/volumes/v/_data/notes").read_bytes() == tenant.read_bytes()

    (state / "docker/network/files").mkdir(parents=True)
    (state / "docker/network/files/state.bin").write_bytes(b"\x00\x01" + bytes(state) + b"/x")
    result = rdc("repo", "fork", "alpha", "--tag", "other")
    assert result.exit_code == EXIT_STATE
    assert "network/files/state.bin" in result.stderr and "cannot rewrite" in result.stderr
    assert [r.ref for r in RepoStore(box).list()] == ["alpha@box", "alpha:exp@box"]
    assert sorted(p.name for p in state.parent.iterdir()) == sorted([alpha.id, fork_id])
    advised = [*result.stderr.split("--empty")[0].rsplit("rdc ", 1)[1].split(), "--empty"]
    assert "nothing copied" in ok(*advised).stderr


def test_fork_of_a_repo_that_is_up_is_refused_and_creates_nothing(box: Machine) -> None:
    from rediacc_core.repos import RepoStore
    from rediacc_core.runtime.layout import runtime_for

    ok("repo", "create", "alpha@box")
    runtime = runtime_for(box, RepoStore(box).get_by_label("alpha"))
    runtime.run_dir.mkdir(parents=True, exist_ok=True)
    runtime.gate_pidfile.write_text(f"{os.getpid()}\n")  # a live process: the repo's gate "runs"
    result = rdc("repo", "fork", "alpha", "--tag", "exp")
    assert result.exit_code == EXIT_STATE and "rdc repo down alpha@box" in result.stderr
    assert "--empty" in result.stderr
    assert [r.ref for r in RepoStore(box).list()] == ["alpha@box"]
    empty = ok("repo", "fork", "alpha", "--tag", "scratch", "--empty")
    assert "nothing copied" in empty.stderr


def test_a_name_on_two_machines_needs_the_machine(
    box: Machine, make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    config = Config.load()
    config.add("other", build_machine(make_fake_machine("other")).root)
    config.save()
    ok("repo", "create", "alpha@box")
    ok("repo", "create", "alpha@other")
    result = rdc("repo", "gpu", "list", "alpha")
    assert result.exit_code == EXIT_AMBIGUOUS
    assert "alpha@box" in result.stderr and "alpha@other" in result.stderr
    ok("repo", "gpu", "list", "alpha@other")
    assert rdc("repo", "gpu", "list", "ghost").exit_code == EXIT_NOT_FOUND


def test_a_corrupt_grants_file_is_reported_not_shown_as_empty(box: Machine) -> None:
    ok("repo", "create", "alpha@box")
    box.grants_path.parent.mkdir(parents=True, exist_ok=True)
    box.grants_path.write_text("[]")
    result = rdc("repo", "gpu", "list", "alpha")
    assert result.exit_code == EXIT_VALIDATION and str(box.grants_path) in result.stderr
    assert result.stdout == ""


def _hold(machine: Machine, held: Event, release: Event) -> None:
    with state_lock(machine):
        held.set()
        release.wait(30)


def test_a_held_lock_exits_15_naming_the_holders_pid(box: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    ok("repo", "create", "alpha@box")
    monkeypatch.setenv("REDIACC_LOCK_TIMEOUT", "0.2")
    fork = multiprocessing.get_context("fork")
    held, release = fork.Event(), fork.Event()
    holder = fork.Process(target=_hold, args=(box, held, release))
    holder.start()
    try:
        assert held.wait(10)
        result = rdc("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0")
        assert result.exit_code == EXIT_BUSY
        assert f"process {holder.pid}" in result.stderr
    finally:
        release.set()
        holder.join(10)
    ok("repo", "gpu", "grant", "alpha", "--device", f"{GPU}=0")


def test_the_rdc_program_exits_with_the_error_code(box: Machine, rdc_config: Path) -> None:
    # The real console entry point in a fresh process, with no plugins at all.
    ok("repo", "create", "alpha@box")
    env = {**os.environ, "REDIACC_CONFIG": str(rdc_config), "REDIACC_LOAD_PLUGINS": ""}
    argv = [sys.executable, "-c", "from rediacc_core.cli import main; main()"]
    typo = subprocess.run(
        [*argv, "repo", "gpu", "grant", "alpha", "--device", f"{GPU}=al"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert typo.returncode == EXIT_VALIDATION, typo.stderr
    assert f"did you mean {GPU}=all" in typo.stderr
    good = subprocess.run(
        [*argv, "repo", "gpu", "grant", "alpha", "--device", f"{GPU}=all"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stderr
    assert [g.device for g in read_grants(box)] == [f"{GPU}=all"]


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (["repo", "grant", "a", "--device", "x"], "rdc repo gpu grant"),
        (["repo", "revoke", "a"], "rdc repo gpu revoke"),
        (["grant"], "rdc repo gpu grant"),
        (["prune"], "rdc machine gpu prune"),
    ],
)
def test_a_command_typed_one_level_too_high_names_where_it_lives(args: list[str], meant: str) -> None:
    result = CliRunner().invoke(cli, args, prog_name="rdc")
    assert result.exit_code == 2
    assert (
        f"No such command {args[0] if args[0] != 'repo' else args[1]!r}. Did you mean `{meant}`?"
        in result.output
    )
    assert "'gate'" not in result.output
