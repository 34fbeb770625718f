"""Every `rdc` command on machines reached over a real OpenSSH server, as on local machines."""

from __future__ import annotations

import json
import os
import pty
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ssh_kit import BIN, Client, Fleet

from rediacc_core.errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, EXIT_STATE, EXIT_TOOL
from rediacc_core.grants.records import read_grants
from rediacc_core.repos import RepoStore
from rediacc_core.statelock import lock_path, state_lock

DEVICE = "nvidia.com/gpu=0"


def ok(result: object) -> str:
    assert getattr(result, "returncode", None) == 0, getattr(result, "stderr", result)
    return str(getattr(result, "stdout", ""))


def test_the_mission_over_ssh_setup_list_grant_revoke_exclusive(fleet: Fleet) -> None:
    rdc = fleet.client.rdc
    setup = rdc("machine", "setup", "m1")
    assert setup.returncode == 0, setup.stderr
    assert "- Discover GPUs" in setup.stderr  # setup's progress lines reach the client
    assert "Machine m1 is set up" in setup.stderr
    listing = ok(rdc("machine", "gpu", "list", "m1"))
    assert DEVICE in listing and "GRANTED TO" in listing
    ok(rdc("repo", "create", "mission@m1"))
    ok(rdc("repo", "create", "other@m1"))
    granted = rdc("repo", "gpu", "grant", "mission@m1", "--device", DEVICE, "--exclusive")
    assert granted.returncode == 0 and f"Granted {DEVICE} exclusively to mission@m1" in granted.stderr
    refused = rdc("repo", "gpu", "grant", "other@m1", "--device", DEVICE)
    assert refused.returncode == EXIT_STATE or refused.returncode == EXIT_REFUSED
    assert refused.stderr.startswith("Error: ") and "What to do: " in refused.stderr
    held = json.loads(ok(rdc("repo", "gpu", "list", "mission@m1", "-o", "json")))
    assert [(g["device"], g["exclusive"]) for g in held] == [(DEVICE, True)]
    assert "mission (exclusive)" in ok(rdc("machine", "gpu", "list", "m1"))
    ok(rdc("repo", "gpu", "revoke", "mission@m1", "--device", DEVICE))
    ok(rdc("repo", "gpu", "grant", "other@m1", "--device", DEVICE))
    repos = json.loads(ok(rdc("repo", "list", "m1", "-o", "json")))
    assert {r["ref"]: [g["device"] for g in r["grants"]] for r in repos}["other@m1"] == [DEVICE]
    for ref in ("mission@m1", "other@m1"):
        ok(rdc("repo", "delete", ref, "--yes"))


def test_output_and_exit_codes_are_the_local_ones(fleet: Fleet, tmp_path: Path) -> None:
    """The same commands against m2 over SSH and against m2's root as a local machine print the same."""
    remote = fleet.client
    local = fleet.new_client(tmp_path)
    ok(local.rdc("machine", "add", "m2", "--root", str(fleet.machines["m2"].root)))
    ok(remote.rdc("machine", "setup", "m2"))
    ok(remote.rdc("repo", "create", "same@m2"))
    for args in (
        ("machine", "gpu", "list", "m2", "-o", "json"),
        ("machine", "gpu", "list", "m2", "-o", "yaml"),
        ("machine", "config", "m2"),
        ("repo", "list", "m2", "-o", "yaml"),
        ("repo", "gpu", "list", "same@m2"),
        ("repo", "gpu", "list", "missing@m2"),
        ("repo", "gpu", "grant", "same@m2", "--device", "nvidia.com/gpu=typo"),
        ("repo", "create", "same@m2"),
    ):
        here, there = local.rdc(*args), remote.rdc(*args)
        assert (there.returncode, there.stdout, there.stderr) == (
            here.returncode,
            here.stdout,
            here.stderr,
        ), args
    ok(remote.rdc("repo", "delete", "same@m2", "--yes"))


def test_eight_clients_granting_one_exclusive_device_exactly_one_wins(fleet: Fleet, tmp_path: Path) -> None:
    rdc = fleet.client.rdc
    ok(rdc("machine", "setup", "m2"))
    clients: list[Client] = []
    for n in range(8):
        ok(rdc("repo", "create", f"race{n}@m2"))
        client = fleet.new_client(tmp_path)
        ok(fleet.add(client, "m2", "--accept-host-key"))
        clients.append(client)

    def grant(n: int) -> int:
        return (
            clients[n]
            .rdc("repo", "gpu", "grant", f"race{n}@m2", "--device", DEVICE, "--exclusive")
            .returncode
        )

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(grant, range(8)))
    assert codes.count(EXIT_OK) == 1, codes
    machine = fleet.machines["m2"].machine
    assert [g.device for g in read_grants(machine)] == [DEVICE]
    for n in range(8):
        ok(rdc("repo", "delete", f"race{n}@m2", "--yes"))


# --- host keys ------------------------------------------------------------------------------------


def test_an_unknown_host_key_is_refused_with_its_fingerprint_until_trusted(
    fleet: Fleet, tmp_path: Path
) -> None:
    client = fleet.new_client(tmp_path)
    added = fleet.add(client, "m1")
    assert added.returncode == 0
    assert "not trusted yet: SHA256:" in added.stderr and "rdc machine trust m1" in added.stderr
    refused = client.rdc("repo", "list", "m1")
    assert refused.returncode == EXIT_STATE
    assert "host key of machine m1" in refused.stderr and "rdc machine trust m1" in refused.stderr
    wrong = client.rdc("machine", "trust", "m1", "--fingerprint", "SHA256:not-this-one")
    assert wrong.returncode == EXIT_REFUSED and not client.known_hosts.exists()
    trusted = client.rdc("machine", "trust", "m1")
    assert trusted.returncode == 0 and "SHA256:" in trusted.stderr
    ok(client.rdc("repo", "list", "m1"))


def test_a_changed_host_key_is_refused(fleet: Fleet) -> None:
    client = fleet.client
    other = fleet.sshd.workdir / "other_host"
    from rediacc_core.testing.sshd import keygen

    keygen(other, "someone-else")
    forged = other.with_name("other_host.pub").read_text().split()[:2]
    lines = client.known_hosts.read_text().splitlines()
    client.known_hosts.write_text(
        "\n".join(
            f"{line.split()[0]} {' '.join(forged)}" if line.startswith("rdc.m1 ") else line for line in lines
        )
        + "\n"
    )
    refused = client.rdc("repo", "list", "m1")
    assert refused.returncode == EXIT_STATE, refused.stderr
    assert "has CHANGED" in refused.stderr and "rdc machine trust m1 --fingerprint" in refused.stderr
    ok(client.rdc("repo", "list", "m2"))  # the other machine's key is still trusted
    # Both fingerprints are shown; a bare `trust` (no terminal to type yes on) replaces nothing.
    public = f"{fleet.sshd.host_key}.pub"
    new_print = ok(subprocess.run(["ssh-keygen", "-lf", public], capture_output=True, text=True)).split()[1]
    assert f"presented now: {new_print}" in refused.stderr
    kept = client.rdc("machine", "trust", "m1")
    assert kept.returncode == EXIT_REFUSED and f"--fingerprint {new_print}" in kept.stderr
    assert client.rdc("repo", "list", "m1").returncode == EXIT_STATE
    ok(client.rdc("machine", "trust", "m1", "--fingerprint", new_print))
    ok(client.rdc("repo", "list", "m1"))


def test_a_key_the_machine_does_not_accept_is_a_login_error(fleet: Fleet, tmp_path: Path) -> None:
    from rediacc_core.testing.sshd import keygen

    client = fleet.new_client(tmp_path)
    stranger = keygen(client.home / "stranger", "not-authorized")
    fm = fleet.machines["m1"]
    args = ["machine", "add", "m1", "--ssh", fleet.sshd.address, "--root", str(fm.root)]
    ok(client.rdc(*args, "--identity", str(stranger), "--accept-host-key"))
    refused = client.rdc("repo", "list", "m1")
    assert refused.returncode == EXIT_TOOL
    assert "refused the login" in refused.stderr and "What to do: " in refused.stderr


def test_an_unreachable_machine_is_a_clear_error(fleet: Fleet, tmp_path: Path) -> None:
    client = fleet.new_client(tmp_path)
    ok(fleet.add(client, "m1", "--accept-host-key"))
    fleet.sshd.stop()
    refused = client.rdc("repo", "list", "m1")
    assert refused.returncode == EXIT_TOOL
    assert "cannot reach machine m1" in refused.stderr and "What to do: " in refused.stderr
    advice = refused.stderr.split("sshd answers: ", 1)[1].strip()
    assert advice.startswith(f"ssh -p {fleet.sshd.port} ")
    fleet.sshd.start()
    trusted = ["-o", f"UserKnownHostsFile={client.known_hosts}", "-o", "HostKeyAlias=rdc.m1"]
    tried = subprocess.run([*shlex.split(advice)[:-1], *trusted, "true"], capture_output=True, text=True)
    assert tried.returncode == 0, tried.stderr  # the advice is a command that runs


def test_a_bare_repo_name_names_the_machine_it_could_not_ask(fleet: Fleet, tmp_path: Path) -> None:
    client = fleet.new_client(tmp_path)
    ok(fleet.add(client, "m1", "--accept-host-key"))
    fleet.sshd.stop()
    try:
        refused = client.rdc("repo", "gpu", "list", "nosuch")
    finally:
        fleet.sshd.start()
    assert refused.returncode == EXIT_NOT_FOUND
    assert "could not ask m1" in refused.stderr and "nosuch@m1" in refused.stderr


def test_a_relative_identity_works_from_any_directory(fleet: Fleet, tmp_path: Path) -> None:
    client = fleet.new_client(tmp_path)
    key = fleet.keys["m1"]
    args = ["machine", "add", "m1", "--ssh", fleet.sshd.address, "--root", str(fleet.machines["m1"].root)]
    added = subprocess.run(
        [str(BIN / "rdc"), *args, "--identity", key.name, "--accept-host-key"],
        cwd=key.parent, env=client.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    elsewhere = subprocess.run(
        [str(BIN / "rdc"), "repo", "list", "m1"],
        cwd="/",
        env=client.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert elsewhere.returncode == 0, elsewhere.stderr


def test_a_missing_key_file_is_said_as_such(fleet: Fleet, tmp_path: Path) -> None:
    client = fleet.new_client(tmp_path)
    args = ["machine", "add", "m1", "--ssh", fleet.sshd.address, "--root", str(fleet.machines["m1"].root)]
    added = client.rdc(*args, "--identity", str(tmp_path / "no-such-key"), "--accept-host-key")
    assert added.returncode == 0 and "does not exist" in added.stderr
    refused = client.rdc("repo", "list", "m1")
    assert refused.returncode == EXIT_TOOL, refused.stderr
    assert f"key file of machine m1, {tmp_path / 'no-such-key'}, does not exist" in refused.stderr
    assert "not installed" not in refused.stderr


# --- the agent --------------------------------------------------------------------------------------


def test_a_machine_without_the_agent_names_rdc_machine_install(fleet: Fleet, tmp_path: Path) -> None:
    bare = tmp_path / "bare-root"
    bare.mkdir()
    client = fleet.client
    args = ["machine", "add", "bare", "--ssh", fleet.sshd.address, "--root", str(bare)]
    ok(client.rdc(*args, "--identity", str(fleet.keys["m1"]), "--accept-host-key"))
    refused = client.rdc("repo", "list", "bare")
    assert refused.returncode == EXIT_STATE
    assert "rdc is not installed on machine bare" in refused.stderr
    assert "rdc machine install bare" in refused.stderr


def test_a_version_skew_names_rdc_machine_install(fleet: Fleet, tmp_path: Path) -> None:
    """The client has one more plugin distribution than the machine: a real metadata difference."""
    extra = tmp_path / "site"
    info = extra / "rdc_skew_plugin-9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rdc-skew-plugin\nVersion: 9.9\n")
    (info / "entry_points.txt").write_text("[rediacc.demo]\nskew = rdc_skew_plugin:layout\n")
    client = fleet.client
    client.env["PYTHONPATH"] = str(extra)
    refused = client.rdc("repo", "list", "m1")
    assert refused.returncode == EXIT_STATE
    assert "rdc-skew-plugin 9.9 here, absent on the machine" in refused.stderr
    assert "rdc machine install m1" in refused.stderr


def test_a_connection_dropped_mid_grant_leaves_the_whole_grant(fleet: Fleet) -> None:
    rdc = fleet.client.rdc
    ok(rdc("machine", "setup", "m1"))
    ok(rdc("repo", "create", "dropped@m1"))
    machine = fleet.machines["m1"].machine
    with state_lock(machine):
        # The grant waits for the lock we hold; its connection is cut while it waits.
        waiting = fleet.client.popen("repo", "gpu", "grant", "dropped@m1", "--device", DEVICE)
        _wait_for_lock_waiter(lock_path(machine))
        fleet.sshd.stop()
        _out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == EXIT_TOOL, err
    assert "ended before the command finished" in err and "whole change or none" in err
    deadline = time.monotonic() + 30
    repo = RepoStore(machine).get_by_label("dropped")
    while time.monotonic() < deadline and not [g for g in read_grants(machine) if g.repo_id == repo.id]:
        time.sleep(0.1)  # the agent goes on without its client, under the lock
    assert [g.device for g in read_grants(machine) if g.repo_id == repo.id] == [DEVICE]
    fleet.sshd.start()
    ok(rdc("repo", "delete", "dropped@m1", "--yes"))


def _wait_for_lock_waiter(lock: Path, timeout: float = 30) -> None:
    """Until the agent is running and, as far as can be seen, waiting for the lock file.

    A waiter opens the file only for each try, so seeing it is luck; a running agent that has not
    reached it yet has the request in its input anyway, and reaches the lock all the same.
    """
    deadline = time.monotonic() + timeout
    seen_agent = None
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if b"rdc-agent" not in (proc / "cmdline").read_bytes():
                    continue
                seen_agent = seen_agent or time.monotonic()
                if any(os.readlink(fd) == str(lock) for fd in (proc / "fd").iterdir()):
                    return
            except OSError:
                continue
        if seen_agent is not None and time.monotonic() - seen_agent > 2:
            return
        time.sleep(0.01)
    raise AssertionError("no rdc-agent ran")


# --- fleet views --------------------------------------------------------------------------------------


def test_fleet_views_show_every_machine_and_the_unreachable_one_in_its_row(fleet: Fleet) -> None:
    from rediacc_core.testing.sshd import free_port

    rdc = fleet.client.rdc
    for name in ("m1", "m2"):
        ok(rdc("machine", "setup", name))
    ok(rdc("repo", "create", "seen@m2"))
    dead = f"root@127.0.0.1:{free_port()}"
    ok(rdc("machine", "add", "gone", "--ssh", dead, "--identity", str(fleet.keys["m1"])))
    # `gone` was trusted once (the key line is m1's) and is down now.
    known = fleet.client.known_hosts
    m1_key = next(line for line in known.read_text().splitlines() if line.startswith("rdc.m1 "))
    known.write_text(known.read_text() + m1_key.replace("rdc.m1 ", "rdc.gone ", 1) + "\n")
    gpus = rdc("machine", "gpu", "list", "--all")
    assert gpus.returncode == EXIT_TOOL, gpus.stderr
    rows = gpus.stdout.splitlines()
    assert rows[0].split() == ["MACHINE", "GPU", "NAME", "VENDOR", "MEMORY", "CDI", "NAME"]
    assert any(r.startswith("m1 ") and "nvidia.com/gpu=0" in r for r in rows)
    assert any(r.startswith("m2 ") and "nvidia.com/gpu=0" in r for r in rows)
    assert any(r.startswith("gone ") and "(failed) cannot reach machine gone" in r for r in rows)
    assert "1 of 3 machine(s) did not answer: gone" in gpus.stderr
    repos = rdc("repo", "list", "--all", "-o", "json")
    answers = {a["machine"]: a for a in json.loads(repos.stdout)}
    assert [r["ref"] for r in answers["m2"]["repos"]] == ["seen@m2"] and "error" in answers["gone"]
    ok(rdc("machine", "remove", "gone"))
    assert ok(rdc("repo", "list", "--all")).count("seen@m2") == 1
    ok(rdc("repo", "delete", "seen@m2", "--yes"))


def test_a_repo_named_without_its_machine_is_found_on_the_ssh_machine_holding_it(fleet: Fleet) -> None:
    """The README's `rdc repo gpu grant gpu-a …` works unchanged when gpu-a lives on an SSH machine."""
    rdc = fleet.client.rdc
    ok(rdc("machine", "setup", "m1"))
    ok(rdc("repo", "create", "solo@m1"))
    granted = rdc("repo", "gpu", "grant", "solo", "--device", DEVICE)
    assert granted.returncode == 0 and "to solo@m1" in granted.stderr
    assert DEVICE in ok(rdc("repo", "gpu", "list", "solo"))
    ok(rdc("repo", "gpu", "revoke", "solo", "--device", DEVICE))
    ok(rdc("repo", "create", "solo@m2"))
    twice = rdc("repo", "gpu", "list", "solo")
    assert twice.returncode == 11 and "several machines: m1, m2" in twice.stderr
    missing = rdc("repo", "gpu", "list", "nowhere")
    assert missing.returncode == 5 and "nowhere@<machine>" in missing.stderr
    for ref in ("solo@m1", "solo@m2"):
        ok(rdc("repo", "delete", ref, "--yes"))


def test_machine_install_puts_this_clients_versions_in_a_venv_there_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A bare machine gets the wheels of every installed rediacc distribution; a rerun does nothing."""
    bare = tmp_path / "fresh-root"
    bare.mkdir()
    client = fleet.client
    args = ["machine", "add", "fresh", "--ssh", fleet.sshd.address, "--root", str(bare)]
    ok(client.rdc(*args, "--identity", str(fleet.keys["m1"]), "--accept-host-key"))
    assert client.rdc("repo", "list", "fresh").returncode == EXIT_STATE  # no agent yet
    installed = client.rdc("machine", "install", "fresh", timeout=900)
    assert installed.returncode == 0, installed.stderr
    assert (bare / "opt/rediacc/bin/rdc-agent").is_file()
    started = time.monotonic()
    again = client.rdc("machine", "install", "fresh", timeout=300)
    took = time.monotonic() - started
    assert again.returncode == 0 and "nothing to do" in again.stderr
    assert took < 10, f"an install with nothing to do took {took:.1f}s"  # no wheels built nor sent
    listing = client.rdc("repo", "list", "fresh")
    assert listing.returncode == 0 and "No repos on fresh" in listing.stderr


def test_removing_a_machine_closes_its_tunnels(fleet: Fleet) -> None:
    """A tunnel is a way into a repo's gate: none outlives the machine it leads to."""
    rdc = fleet.client.rdc
    ok(rdc("repo", "create", "tun1@m1"))
    ok(rdc("repo", "create", "tun2@m1"))
    sockets = [
        Path(ok(rdc("repo", "tunnel", ref)).strip().removeprefix("unix://")) for ref in ("tun1@m1", "tun2@m1")
    ]
    assert all(s.is_socket() for s in sockets) and sockets[0] != sockets[1]
    # Each is one ssh of its own, found again rather than opened twice.
    assert ok(rdc("repo", "tunnel", "tun1@m1")).strip() == f"unix://{sockets[0]}"
    assert len(_holders(sockets[0])) == 1
    removed = rdc("machine", "remove", "m1")
    assert removed.returncode == 0, removed.stderr
    assert "Closed 2 tunnel(s) to machine m1." in removed.stderr
    assert not any(s.exists() or s.with_suffix(".ctl").exists() for s in sockets)
    # Nothing still forwards: no ssh process holds either socket's control path.
    assert not any(_holders(socket) for socket in sockets)


def _holders(socket: Path) -> list[Path]:
    """The processes whose command line names `socket`'s control path (its tunnel's ssh)."""
    control = str(socket.with_suffix(".ctl")).encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if control in cmdline.read_bytes():
                found.append(cmdline.parent)
        except OSError:  # the process ended while we looked
            continue
    return found


def _answering(client: Client, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`rdc ARGS` with its stdin on a terminal, answering a prompt with `answer`."""
    main, child = pty.openpty()
    try:
        process = subprocess.Popen(
            [str(BIN / "rdc"), *args],
            stdin=child,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=client.env,
            text=True,
        )
        os.write(main, answer.encode() + b"\n")
        out, err = process.communicate(timeout=120)
    finally:
        os.close(child)
        os.close(main)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_repo_delete_over_ssh_asks_on_the_clients_terminal(fleet: Fleet) -> None:
    rdc = fleet.client.rdc
    ok(rdc("repo", "create", "asked@m1"))
    kept = _answering(fleet.client, "n", "repo", "delete", "asked@m1")
    assert kept.returncode == 1 and "Delete repo asked@m1 and its GPU grants?" in kept.stderr
    assert "Aborted." in kept.stderr  # as the local command says it
    ended = _answering(fleet.client, "\x04", "repo", "delete", "asked@m1")  # end of input at the prompt
    assert ended.returncode == 1 and "Aborted." in ended.stderr
    assert ended.stderr.count("Delete repo asked@m1") == 1  # asked once, not again by the local CLI
    assert "asked" in ok(rdc("repo", "list", "m1"))
    deleted = _answering(fleet.client, "y", "repo", "delete", "asked@m1")
    assert deleted.returncode == 0, deleted.stderr
    assert "asked" not in ok(rdc("repo", "list", "m1"))
    # Without a terminal the machine's own answer stands: it asks for --yes.
    ok(rdc("repo", "create", "asked@m1"))
    refused = rdc("repo", "delete", "asked@m1")
    assert refused.returncode != 0 and "--yes" in refused.stderr
    ok(rdc("repo", "delete", "asked@m1", "--yes"))
