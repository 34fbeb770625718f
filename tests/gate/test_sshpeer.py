"""A request sshd forwarded to the gate names the SSH client behind it, read from /proc."""

from __future__ import annotations

import os
from pathlib import Path

from rediacc_core.gate.audit.sshpeer import ssh_client

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def process(proc: Path, pid: int, comm: str, ppid: int, sockets: dict[int, str] | None = None) -> None:
    entry = proc / str(pid)
    (entry / "fd").mkdir(parents=True)
    (entry / "net").mkdir()
    (entry / "comm").write_text(comm + "\n")
    (entry / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0\n")
    rows = []
    for fd, (inode, remote) in enumerate((sockets or {}).items(), start=3):
        os.symlink(f"socket:[{inode}]", entry / "fd" / str(fd))
        rows.append(f"   0: 0100007F:0016 {remote} 01 00000000:00000000 00:00000000 00000000 0 0 {inode}\n")
    (entry / "net" / "tcp").write_text(HEADER + "".join(rows))
    (entry / "net" / "tcp6").write_text(HEADER)


def test_an_sshd_session_names_its_user_and_the_clients_address(tmp_path: Path) -> None:
    process(tmp_path, 700, "sshd", 1, {4242: "0100007F:D431"})
    assert ssh_client(700, 0, tmp_path) == {"user": "root", "client": "127.0.0.1:54321"}


def test_the_address_is_found_on_the_privileged_parent_when_the_child_holds_no_socket(tmp_path: Path) -> None:
    process(tmp_path, 700, "sshd", 1, {4242: "0A00000A:0050"})
    process(tmp_path, 701, "sshd-session", 700)
    assert ssh_client(701, 0, tmp_path) == {"user": "root", "client": "10.0.0.10:80"}


def test_a_peer_that_is_no_sshd_is_not_an_ssh_client(tmp_path: Path) -> None:
    process(tmp_path, 800, "docker", 1, {4242: "0100007F:D431"})
    assert ssh_client(800, 1000, tmp_path) is None
    assert ssh_client(0, 0, tmp_path) is None  # no peer credentials at all
    assert ssh_client(999, 0, tmp_path) is None  # gone before it was looked at
