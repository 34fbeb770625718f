"""The runtime guard: runc runs a container only while every device node it holds is granted now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rediacc_core.gate.policy.rules import GUARD_RUNTIME
from rediacc_core.runtime import guard
from rediacc_core.runtime.daemon import Guard, daemon_config, guard_script
from rediacc_core.runtime.layout import DaemonPaths

REPO_ID = "6f1d0d6e-3a57-4d5c-9d59-0a4f2f2b8c11"
NULL = os.stat("/dev/null")
NULL_NODE = ("c", os.major(NULL.st_rdev), os.minor(NULL.st_rdev))


@pytest.mark.parametrize(
    ("args", "command", "rest"),
    [
        (["--root", "/r", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b", "id"], "create",
         ["--bundle", "/b", "id"]),
        (["--root=/r", "--systemd-cgroup", "exec", "--process", "/p", "id"], "exec",
         ["--process", "/p", "id"]),
        (["--debug", "resume", "id"], "resume", ["id"]),
        (["--version"], "", []),
        ([], "", []),
    ],
)  # fmt: skip
def test_runc_command_lines(args: list[str], command: str, rest: list[str]) -> None:
    _, found, after = guard.split_runc_args(args)
    assert (found, after) == (command, rest)


def test_the_bundle_of_each_command(tmp_path: Path) -> None:
    state = tmp_path / "state" / "cid"
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"config": {"labels": ["x=y", "bundle=/the/bundle"]}}))
    root = str(tmp_path / "state")
    assert guard.bundle_of("create", ["--bundle", "/b", "cid"], root, "/cwd") == "/b"
    assert guard.bundle_of("create", ["-b", "/b", "cid"], root, "/cwd") == "/b"
    assert guard.bundle_of("run", ["--bundle=/b", "cid"], root, "/cwd") == "/b"
    assert guard.bundle_of("create", ["cid"], root, "/cwd") == "/cwd"  # runc's default: the cwd
    assert guard.bundle_of("exec", ["--process", "/p", "cid"], root, "/cwd") == "/the/bundle"
    assert guard.bundle_of("resume", ["other"], root, "/cwd") == "/cwd"


@pytest.mark.parametrize(
    ("linux", "nodes"),
    [
        ({}, []),
        ({"devices": []}, []),
        ({"devices": [{"path": "/dev/x", "type": "c", "major": 1, "minor": 3}]}, [("/dev/x", "c", 1, 3)]),
    ],
)
def test_the_nodes_a_config_asks_for(linux: dict[str, Any], nodes: list[guard.Node]) -> None:
    assert guard.container_nodes({"linux": linux}) == nodes


@pytest.mark.parametrize(
    "linux", [{"devices": {}}, {"devices": [{"type": "c"}]}, {"devices": [{"path": "/x", "major": "1"}]}]
)
def test_an_unexpected_device_entry_is_refused(linux: dict[str, Any]) -> None:
    with pytest.raises(guard.Refused):
        guard.container_nodes({"linux": linux})


def grants_doc(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"schemaVersion": 1, "grants": list(entries)}


def test_held_names_are_this_repos_and_in_force() -> None:
    document = grants_doc(
        {"repoId": REPO_ID, "device": "v.example/gpu=0"},
        {"repoId": "other", "device": "v.example/gpu=1"},
        {"repoId": REPO_ID, "device": "v.example/gpu=2", "expiresAt": "2030-01-01T00:00:00Z"},
        {"repoId": REPO_ID, "device": "v.example/gpu=3", "expiresAt": "2020-01-01T00:00:00Z"},
        {"repoId": REPO_ID, "device": "v.example/gpu=4", "expiresAt": "garbage"},
    )
    now = 1893456000.0 - 1  # 2029-12-31T23:59:59Z
    assert guard.granted_names(document, REPO_ID, now) == {"v.example/gpu=0", "v.example/gpu=2"}
    assert guard.granted_names(document, REPO_ID, 1893456000.0) == {"v.example/gpu=0"}  # at the end: gone


@pytest.mark.parametrize("document", [[], {"grants": {}}, {"grants": [{"repoId": REPO_ID}]}])
def test_a_grants_file_of_another_shape_refuses(document: Any) -> None:
    with pytest.raises(guard.Refused):
        guard.granted_names(document, REPO_ID, 0.0)


SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "v.example/gpu",
    "containerEdits": {"deviceNodes": [{"path": "/dev/vctl", "hostPath": "/dev/null"}]},
    "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/v0", "hostPath": "/dev/null"}]}},
        {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/v1", "hostPath": "/dev/null"}]}},
        {"name": "n", "containerEdits": {"deviceNodes": [{"path": "/dev/vn", "type": "c", "major": 9,
                                                          "minor": 9}]}},
    ],
}  # fmt: skip


def node(path: str) -> guard.Node:
    return (path, *NULL_NODE)


@pytest.mark.parametrize(
    ("held", "nodes", "refused"),
    [
        ({"v.example/gpu=0"}, [node("/dev/v0"), node("/dev/vctl")], None),
        ({"v.example/gpu=0"}, [node("/dev/v1")], "/dev/v1"),  # same numbers, another device's path
        (set(), [node("/dev/vctl")], "/dev/vctl"),  # a spec's shared node needs one of its devices
        ({"v.example/gpu=0"}, [("/dev/v0", "c", 4, 4)], "/dev/v0"),  # the path, other hardware
        ({"v.example/gpu=n"}, [("/dev/vn", "c", 9, 9)], None),  # numbers from the spec itself
        ({"v.example/gpu=0"}, [node("/dev/unknown")], "/dev/unknown"),
    ],
)
def test_every_node_must_come_from_a_held_device(
    held: set[str], nodes: list[guard.Node], refused: str | None
) -> None:
    if refused is None:
        guard.check(nodes, frozenset(held), [SPEC])
        return
    with pytest.raises(guard.Refused, match=refused) as caught:
        guard.check(nodes, frozenset(held), [SPEC])
    if refused == "/dev/v1":
        assert caught.value.names == ("v.example/gpu=1",)
        assert "(v.example/gpu=1)" in str(caught.value)


# --- the guard as the daemon runs it -------------------------------------------------------------


@pytest.fixture
def machine_root(tmp_path: Path) -> Path:
    root = tmp_path / "m"
    (root / "etc/cdi").mkdir(parents=True)
    (root / "etc/rediacc/gpu").mkdir(parents=True)
    (root / "etc/cdi/v.yaml").write_text(json.dumps(SPEC))  # JSON is YAML
    return root


def run_guard(root: Path, tmp_path: Path, command: list[str], devices: list[dict[str, Any]]) -> Any:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(
        json.dumps({"linux": {"devices": devices}} if devices else {"linux": {}})
    )
    runc = tmp_path / "runc"
    runc.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/ran\n')
    runc.chmod(0o755)
    script = tmp_path / "runtime-guard"
    script.write_text(guard_script(root, Guard(REPO_ID, "alpha@m1", tmp_path / "guard.log", str(runc))))
    script.chmod(0o700)
    log = tmp_path / "log.json"
    argv = [
        str(script),
        "--root",
        str(tmp_path / "state"),
        "--log",
        str(log),
        "--log-format",
        "json",
        *command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, cwd=bundle, env={"PATH": os.environ["PATH"]})


DEV0 = {"path": "/dev/v0", "type": "c", "major": NULL_NODE[1], "minor": NULL_NODE[2]}


def test_a_container_without_devices_goes_straight_to_runc(machine_root: Path, tmp_path: Path) -> None:
    done = run_guard(machine_root, tmp_path, ["create", "--bundle", str(tmp_path / "bundle"), "cid"], [])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text().split()[-2:] == [str(tmp_path / "bundle"), "cid"]


def test_other_runc_commands_do_not_start_python(machine_root: Path, tmp_path: Path) -> None:
    script = guard_script(machine_root, Guard(REPO_ID, "alpha@m1", tmp_path / "g.log", "/usr/bin/runc"))
    assert script.startswith("#!/bin/sh\n")
    assert 'exec /usr/bin/runc "$@"' in script
    for name in guard.GATED:
        assert f'*" {name} "*' in script
    done = run_guard(machine_root, tmp_path, ["kill", "cid", "9"], [DEV0])  # no grant, but not gated
    assert done.returncode == 0 and (tmp_path / "ran").exists()


def test_a_granted_device_runs(machine_root: Path, tmp_path: Path) -> None:
    grants = grants_doc(
        {"repoId": REPO_ID, "device": "v.example/gpu=0", "exclusive": False, "grantedAt": "x"}
    )
    (machine_root / "etc/rediacc/gpu/grants.json").write_text(json.dumps(grants))
    done = run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "command", [["create", "cid"], ["exec", "--process", "/p", "cid"], ["resume", "cid"]]
)
def test_a_device_no_longer_granted_stops_runc(
    machine_root: Path, tmp_path: Path, command: list[str]
) -> None:
    done = run_guard(machine_root, tmp_path, command, [DEV0])
    assert done.returncode == 1
    assert not (tmp_path / "ran").exists()
    # In runc's own log format, which the daemon hands back to the client as the error.
    entry = json.loads((tmp_path / "log.json").read_text().splitlines()[-1])
    assert entry["level"] == "error"
    assert entry["msg"].startswith(
        "rdc: repo alpha@m1 may not run this container: the container holds /dev/v0"
    )
    assert "rdc repo gpu grant alpha@m1 --device v.example/gpu=0" in entry["msg"]
    audit = json.loads((tmp_path / "guard.log").read_text())
    assert audit["runc"] == command[0] and audit["container"] == "cid"


def test_a_suspended_grant_stops_runc_naming_the_drift_and_the_confirm(
    machine_root: Path, tmp_path: Path
) -> None:
    drift = "it was granted on GPU-a at 0000:0a:00.0 and now reaches GPU-b at 0000:0a:00.0"
    grants = grants_doc(
        {
            "repoId": REPO_ID,
            "device": "v.example/gpu=0",
            "exclusive": False,
            "grantedAt": "x",
            "suspended": {"reason": "moved", "drift": drift, "since": "2026-01-01T00:00:00Z"},
        }
    )
    assert guard.granted_names(grants, REPO_ID, 0.0) == frozenset()
    (machine_root / "etc/rediacc/gpu/grants.json").write_text(json.dumps(grants))
    done = run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0])  # a restart policy's start
    assert done.returncode == 1 and not (tmp_path / "ran").exists()
    message = json.loads((tmp_path / "log.json").read_text().splitlines()[-1])["msg"]
    assert f"the grant of v.example/gpu=0 is suspended ({drift})" in message
    assert "rdc repo gpu confirm alpha@m1 --device v.example/gpu=0" in message
    assert "rdc repo gpu revoke alpha@m1 --device v.example/gpu=0" in message


def test_a_broken_grants_file_fails_closed(machine_root: Path, tmp_path: Path) -> None:
    (machine_root / "etc/rediacc/gpu/grants.json").write_text("{not json")
    done = run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0])
    assert done.returncode == 1 and "grants file cannot be read" in done.stderr


def test_the_repo_daemon_runs_its_containers_under_the_guard(tmp_path: Path) -> None:
    paths = DaemonPaths(tmp_path / "w", tmp_path / "data")
    config = daemon_config(tmp_path, paths, Guard(REPO_ID, "alpha@m1", tmp_path / "g.log"))
    assert config["default-runtime"] == GUARD_RUNTIME
    assert config["runtimes"] == {GUARD_RUNTIME: {"path": str(paths.guard_script)}}
    assert "runtimes" not in daemon_config(tmp_path, paths)  # a daemon started for tests, without a repo


def test_the_guard_needs_nothing_but_the_standard_library() -> None:
    """It starts with `python -S -I` (no site-packages) for every container create on the machine."""
    done = subprocess.run([sys.executable, "-S", "-I", guard.__file__], capture_output=True, text=True)
    assert "usage: guard.py" in done.stderr, done.stderr


# --- GPU health: a start the gate never sees (a restart policy, the daemon's own) ------------------


def test_a_node_of_a_card_held_back_is_refused_and_shared_nodes_are_not() -> None:
    held_back = frozenset({"v.example/gpu=0"})
    guard.check_health([node("/dev/v1"), node("/dev/vctl")], held_back, [SPEC])
    with pytest.raises(
        guard.Refused, match=r"holds /dev/v0 \(v\.example/gpu=0\), a device of a GPU"
    ) as refused:
        guard.check_health([node("/dev/v0")], held_back, [SPEC])
    assert refused.value.unhealthy and refused.value.names == ("v.example/gpu=0",)


def write_health(root: Path, names: list[str], setting: str | None = None) -> None:
    (root / "etc/rediacc/gpu/health.json").write_text(
        json.dumps({"schemaVersion": 1, "heldNames": names, "events": []})
    )
    if setting is not None:
        settings = {"schemaVersion": 1, "settings": {"gpu-health": setting}}
        (root / "etc/rediacc/settings.json").write_text(json.dumps(settings))


def test_the_guard_refuses_a_granted_device_on_an_unhealthy_card_until_cleared(
    machine_root: Path, tmp_path: Path
) -> None:
    grants = grants_doc(
        {"repoId": REPO_ID, "device": "v.example/gpu=0", "exclusive": False, "grantedAt": "x"}
    )
    (machine_root / "etc/rediacc/gpu/grants.json").write_text(json.dumps(grants))
    write_health(machine_root, ["v.example/gpu=0"])
    done = run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0])
    assert done.returncode == 1 and not (tmp_path / "ran").exists()
    assert "a device of a GPU its driver reported unhealthy" in done.stderr
    assert "rdc machine gpu clear m1 --device v.example/gpu=0" in done.stderr

    write_health(machine_root, ["v.example/gpu=0"], setting="report")  # shown only: it runs
    assert run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0]).returncode == 0
    write_health(machine_root, [])  # cleared
    (machine_root / "etc/rediacc/settings.json").unlink()
    assert run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0]).returncode == 0


@pytest.mark.parametrize("command", [["create", "cid"], ["exec", "--process", "/p", "cid"], ["run", "cid"]])
def test_a_repo_being_emptied_runs_no_container_even_one_without_devices(
    machine_root: Path, tmp_path: Path, command: list[str]
) -> None:
    """One that names no device may take over a descriptor in flight (`grants.release`)."""
    why = "v.example/gpu=0 is being handed over to repo beta@m1"
    mark = {"repoId": REPO_ID, "since": "2026-01-01T00:00:00Z", "until": "2999-01-01T00:00:00Z", "why": why}
    grants = {**grants_doc(), "draining": [mark]}
    (machine_root / "etc/rediacc/gpu/grants.json").write_text(json.dumps(grants))
    done = run_guard(machine_root, tmp_path, command, [])
    assert done.returncode == 1 and not (tmp_path / "ran").exists()
    message = json.loads((tmp_path / "log.json").read_text().splitlines()[-1])["msg"]
    assert f"the repo is being emptied: {why} (at most until 2999-01-01T00:00:00Z)" in message
    assert "once the handover is done" in message
    # Past its bound (an rdc that died mid-way), the mark no longer holds.
    mark["until"] = "2001-01-01T00:00:00Z"
    (machine_root / "etc/rediacc/gpu/grants.json").write_text(
        json.dumps({**grants_doc(), "draining": [mark]})
    )
    assert run_guard(machine_root, tmp_path, command, []).returncode == 0


def test_a_paused_container_of_a_repo_being_emptied_may_resume_to_be_stopped(
    machine_root: Path, tmp_path: Path
) -> None:
    """The daemon resumes a paused container to deliver its stop; its processes ran before the drain."""
    mark = {"repoId": REPO_ID, "since": "x", "until": "2999-01-01T00:00:00Z", "why": "w"}
    (machine_root / "etc/rediacc/gpu/grants.json").write_text(
        json.dumps({**grants_doc(), "draining": [mark]})
    )
    assert run_guard(machine_root, tmp_path, ["resume", "cid"], []).returncode == 0


def test_another_repo_being_emptied_is_none_of_this_ones_business() -> None:
    mark = {"repoId": "other", "since": "x", "until": "2999-01-01T00:00:00Z", "why": "w"}
    assert guard.drain_of({"grants": [], "draining": [mark]}, REPO_ID, 0.0) is None


def record_specs(root: Path) -> None:
    """An inventory that records the spec files as they are now (what setup and refresh write)."""
    rows = []
    for spec in sorted((root / "etc/cdi").iterdir()):
        st = spec.stat()
        rows.append({"file": spec.name, "inode": st.st_ino, "mtimeNs": st.st_mtime_ns, "size": st.st_size})
    (root / "etc/rediacc/gpu/inventory.json").write_text(json.dumps({"devices": [], "specs": rows}))


def test_a_spec_rewritten_after_the_inventory_stops_a_container_with_devices_until_a_refresh(
    machine_root: Path, tmp_path: Path
) -> None:
    # A restart policy's start after the toolkit rewrote the spec at boot: the name may reach the other
    # card now, and the grants were checked against the old spec's facts.
    grants = grants_doc(
        {"repoId": REPO_ID, "device": "v.example/gpu=0", "exclusive": False, "grantedAt": "x"}
    )
    (machine_root / "etc/rediacc/gpu/grants.json").write_text(json.dumps(grants))
    record_specs(machine_root)
    assert run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0]).returncode == 0
    (tmp_path / "ran").unlink()
    spec = machine_root / "etc/cdi/v.yaml"
    spec.write_text(spec.read_text() + "\n")
    done = run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0])
    assert done.returncode == 1 and not (tmp_path / "ran").exists()
    message = json.loads((tmp_path / "log.json").read_text().splitlines()[-1])["msg"]
    assert "changed after the machine's inventory was written (v.yaml)" in message
    assert "rdc machine refresh m1" in message
    done = run_guard(machine_root, tmp_path, ["create", "plain"], [])  # a container without devices runs
    assert done.returncode == 0 and (tmp_path / "ran").exists()
    record_specs(machine_root)  # what the refresh writes
    (tmp_path / "ran").unlink()
    assert run_guard(machine_root, tmp_path, ["create", "cid"], [DEV0]).returncode == 0


def test_a_spec_added_after_the_inventory_counts_and_an_older_inventory_is_not_judged(
    machine_root: Path, tmp_path: Path
) -> None:
    inventory = str(machine_root / "etc/rediacc/gpu/inventory.json")
    cdi = str(machine_root / "etc/cdi")
    record_specs(machine_root)
    assert guard.stale_specs(cdi, inventory) is None
    (machine_root / "etc/cdi/w.json").write_text("{}")
    why = guard.stale_specs(cdi, inventory)
    assert why is not None and "(w.json)" in why
    (machine_root / "etc/rediacc/gpu/inventory.json").write_text(json.dumps({"devices": []}))
    assert guard.stale_specs(cdi, inventory) is None  # an older rdc's inventory records no specs
