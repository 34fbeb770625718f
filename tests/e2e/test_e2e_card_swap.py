"""A card swap on a real Docker Engine: the grant follows the hardware, not the index.

A fake NVIDIA machine (the plugin's test kit: mknod nodes, stand-in `nvidia-smi` and `nvidia-ctk`)
with two GPUs; repo `alpha` is granted `nvidia.com/gpu=0` and creates containers with it. Then the
two cards exchange places behind the same indexes (the stand-in reports their UUIDs the other way
round) and `rdc machine setup` runs: the grant is suspended, a `docker start` through the gate and
a restart policy's start through the runtime guard are refused naming the drift and the confirm,
and `rdc repo gpu confirm` lets the container start again. The same after the toolkit rewrote the
spec at boot and `rdc machine refresh` ran (and after the grants file lost its suspension: the gate
and the guard compare the grant's recorded card with the inventory), and `confirm` onto the card
another repo's suspended exclusive grant still reserves is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_kit import IMAGE, RepoEnv, client_env, refused, skip_reason, wait_for

from rediacc_core.config import Config
from rediacc_core.gate.audit.read import read_entries
from rediacc_core.repos import RepoStore
from rediacc_core.runtime import lifecycle
from rediacc_core.testing.dockerenv import import_busybox
from rediacc_core.testing.fakemachine import FakeMachine

nvidia_testing = pytest.importorskip("rediacc_nvidia.testing")

MACHINE = "swap1"
GPU0 = "nvidia.com/gpu=0"
UUID_A, UUID_B = nvidia_testing.A100_UUIDS


@dataclass
class SwapEnv:
    base: Path
    config_path: Path
    fm: FakeMachine
    alpha: RepoEnv

    def rdc(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "REDIACC_CONFIG": str(self.config_path)}
        return subprocess.run(["rdc", *args], capture_output=True, text=True, env=env, timeout=180)

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = self.rdc(*args)
        assert result.returncode == 0, result.stderr
        return result

    def cards(self, first: str, second: str) -> None:
        """What the stand-in tools report from now on: the machine's cards, by index."""
        nvidia_testing.nvidia_machine(
            self.fm, nvidia_testing.two_a100s(first, second), compute_caps=("8.0", "8.0")
        )


@pytest.fixture(scope="module")
def swap() -> Iterator[SwapEnv]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="rdcw", dir="/tmp"))  # short: socket paths are limited
    fm = FakeMachine(base / "m", name=MACHINE)
    config_path = base / "rdc.yaml"
    config = Config.load(config_path)
    config.add(MACHINE, fm.root)
    config.save()
    machine = Config.load(config_path).machine(MACHINE)
    repo = RepoStore(machine).create("alpha")
    env = client_env(base)
    try:
        nvidia_testing.nvidia_machine(
            fm, nvidia_testing.two_a100s(UUID_A, UUID_B), compute_caps=("8.0", "8.0")
        )
        setup = subprocess.run(
            ["rdc", "machine", "setup", MACHINE],
            capture_output=True,
            text=True,
            env={**os.environ, "REDIACC_CONFIG": str(config_path)},
            timeout=180,
        )
        assert setup.returncode == 0, setup.stderr
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("REDIACC_CONFIG", str(base / "no-client-config.yaml"))
            runtime = lifecycle.repo_up(machine, repo)
        alpha = RepoEnv(repo, runtime, {**env, "DOCKER_HOST": runtime.docker_host_url})
        state = SwapEnv(base, config_path, fm, alpha)
        import_busybox(state.alpha.daemon, IMAGE)
        state.ok("repo", "gpu", "grant", repo.ref, "--device", GPU0)
        yield state
    finally:
        lifecycle.repo_down(machine, repo)
        shutil.rmtree(base, ignore_errors=True)


def test_a_card_swap_suspends_the_grant_until_confirmed(swap: SwapEnv) -> None:
    ref = swap.alpha.repo.ref
    confirm = f"rdc repo gpu confirm {ref} --device {GPU0}"
    (granted,) = json.loads(swap.ok("repo", "gpu", "list", ref, "-o", "json").stdout)
    assert granted["boundTo"] == [{"unit": "pci:0000:07:00.0", "pciBusId": "0000:07:00.0", "uuid": UUID_A}]
    created = swap.alpha.docker("create", "--name", "trainer", "--device", GPU0, IMAGE, "true")
    assert created.returncode == 0, created.stderr
    # A container the daemon restarts on its own: only the runtime guard sees those starts.
    looping = swap.alpha.docker(
        "run", "-d", "--name", "looper", "--restart", "always", "--device", GPU0, IMAGE, "sleep", "1"
    )
    assert looping.returncode == 0, looping.stderr

    swap.cards(UUID_B, UUID_A)  # the cards exchanged places: index 0 is the other card now
    setup = swap.ok("machine", "setup", MACHINE)
    assert f"Warning: grant {GPU0} of {ref} suspended: it was granted on {UUID_A}" in setup.stderr
    assert confirm in setup.stderr

    started = swap.alpha.docker("start", "trainer")
    refused(started, f"the grant of {GPU0} to repo {ref} is suspended", f"now reaches {UUID_B}", confirm)
    refused(swap.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), "is suspended", confirm)
    guard_log = swap.alpha.runtime.guard_log
    assert wait_for(lambda: guard_log.exists() and "is suspended" in guard_log.read_text(), 60), (
        "the restart policy's start was not refused by the runtime guard"
    )
    assert f"rdc repo gpu confirm {ref} --device {GPU0}" in guard_log.read_text()
    listed = swap.ok("repo", "gpu", "list", ref)
    assert "suspended (moved)" in listed.stdout and confirm in listed.stderr
    audit = [e for e in read_entries(swap.alpha.runtime.audit_log) if e.get("decision") == "suspended"]
    assert audit and audit[-1]["cdi_asked"] == [GPU0]

    swap.ok(*confirm.split()[1:])
    assert swap.alpha.docker("start", "-a", "trainer").returncode == 0
    swap.alpha.docker("rm", "-f", "looper", "trainer")


def _baseline(swap: SwapEnv) -> None:
    """The cards in their first places and set up, no container left, alpha holding gpu=0 on card A."""
    ref = swap.alpha.repo.ref
    swap.alpha.docker("rm", "-f", "trainer", "looper", "keeper")
    swap.cards(UUID_A, UUID_B)
    swap.ok("machine", "setup", MACHINE)
    swap.rdc("repo", "gpu", "revoke", ref, "--device", GPU0)  # whatever an earlier test left
    swap.ok("repo", "gpu", "grant", ref, "--device", GPU0)


def _toolkit_refresh(swap: SwapEnv) -> None:
    """What the toolkit's `nvidia-cdi-refresh` unit does at boot: rewrite the spec, nothing else."""
    machine = swap.fm.machine
    ctk = swap.fm.bin_dir / "nvidia-ctk"
    done = machine.run([str(ctk), "cdi", "generate", f"--output={machine.cdi_dir / 'nvidia.yaml'}"])
    assert done.ok, done.stderr


def _guard_lines_after(swap: SwapEnv, start: int, needle: str) -> bool:
    log = swap.alpha.runtime.guard_log
    return log.exists() and needle in log.read_text()[start:]


def test_a_refresh_after_a_swap_suspends_the_grant_at_the_gate_and_the_guard(swap: SwapEnv) -> None:
    _baseline(swap)
    ref = swap.alpha.repo.ref
    confirm = f"rdc repo gpu confirm {ref} --device {GPU0}"
    assert swap.alpha.docker("create", "--name", "trainer", "--device", GPU0, IMAGE, "true").returncode == 0
    looping = swap.alpha.docker(
        "run", "-d", "--name", "looper", "--restart", "always", "--device", GPU0, IMAGE, "sleep", "1"
    )
    assert looping.returncode == 0, looping.stderr
    # One more the daemon restarts on its own, once its process is killed (later, below).
    keeping = swap.alpha.docker(
        "run", "-d", "--name", "keeper", "--restart", "always", "--device", GPU0, IMAGE, "sleep", "3600"
    )
    assert keeping.returncode == 0, keeping.stderr
    guard_log = swap.alpha.runtime.guard_log
    seen = len(guard_log.read_text()) if guard_log.exists() else 0

    swap.cards(UUID_B, UUID_A)  # the cards exchanged places, and at boot the toolkit rewrote the spec
    _toolkit_refresh(swap)
    refused(
        swap.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), f"rdc machine refresh {MACHINE}"
    )
    refreshed = swap.ok("machine", "refresh", MACHINE)
    assert f"Warning: grant {GPU0} of {ref} suspended: it was granted on {UUID_A}" in refreshed.stderr

    refused(swap.alpha.docker("start", "trainer"), f"the grant of {GPU0} to repo {ref} is suspended", confirm)
    refused(swap.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), "is suspended", confirm)
    assert wait_for(lambda: _guard_lines_after(swap, seen, "is suspended"), 60), (
        "the restart policy's start was not refused by the runtime guard after the refresh"
    )

    # The grants file rewritten without the suspension (by hand, or by an older rdc): the gate and
    # the guard still compare the grant's recorded card with what the inventory places its name on.
    grants = json.loads(swap.fm.machine.grants_path.read_text())
    for entry in grants["grants"]:
        entry.pop("suspended", None)
    swap.fm.machine.grants_path.write_text(json.dumps(grants))
    seen = len(guard_log.read_text())
    moved = "no longer reaches the hardware it was given on"
    refused(swap.alpha.docker("start", "trainer"), moved, UUID_B, confirm)
    refused(swap.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), moved, confirm)
    pid = swap.alpha.docker("inspect", "-f", "{{.State.Pid}}", "keeper").stdout.strip()
    os.kill(int(pid), signal.SIGKILL)  # its restart policy starts it again, past the gate
    assert wait_for(lambda: _guard_lines_after(swap, seen, moved), 60), (
        "the restart policy's start was not refused by the runtime guard on the recorded card"
    )
    assert confirm in guard_log.read_text()[seen:]
    swap.alpha.docker("rm", "-f", "looper", "trainer", "keeper")


def test_confirm_onto_another_repos_suspended_exclusive_reservation_is_refused(swap: SwapEnv) -> None:
    _baseline(swap)
    ref, beta = swap.alpha.repo.ref, f"beta@{MACHINE}"
    swap.ok("repo", "create", beta)
    try:
        swap.ok("repo", "gpu", "grant", beta, "--device", "nvidia.com/gpu=1", "--exclusive")
        swap.cards(UUID_B, UUID_A)  # card B, which beta reserves, now sits behind alpha's gpu=0
        swap.ok("machine", "setup", MACHINE)

        confirmed = swap.rdc("repo", "gpu", "confirm", ref, "--device", GPU0)
        assert confirmed.returncode == 4, confirmed.stderr
        assert (
            f"repo {beta} holds nvidia.com/gpu=1 exclusively (suspended, still reserving it), which "
            f"reaches the same hardware as {GPU0} ({UUID_B}"
        ) in confirmed.stderr
        assert f"rdc repo gpu revoke {beta} --device nvidia.com/gpu=1" in confirmed.stderr
        refused(swap.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), "is suspended")

        swap.ok("repo", "gpu", "revoke", beta, "--device", "nvidia.com/gpu=1")
        swap.ok("repo", "gpu", "confirm", ref, "--device", GPU0)
        ran = swap.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true")
        assert ran.returncode == 0, ran.stderr
    finally:
        swap.rdc("repo", "delete", beta, "--yes")
