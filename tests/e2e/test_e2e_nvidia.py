"""NVIDIA runtime semantics at the gate, on a real Docker Engine with a fake NVIDIA machine.

The machine has two GPUs (driver 535.104.05, CUDA 12.2, compute capability 8.0) laid out by the
NVIDIA plugin's test kit: real device nodes made by mknod, stand-in `nvidia-smi` and `nvidia-ctk`.
The real `run_setup` with the installed plugins discovers them and has the stand-in toolkit write
`/etc/cdi/nvidia.yaml` (hostPaths under the root, a createContainer hook that runc really runs).
Repo `alpha` is granted `nvidia.com/gpu=0` only; the docker CLI talks to its gate.

Settings live on the machine (`/etc/rediacc/settings.json` under its root) and the gate reads them
live, so `rdc machine config gpu1 --set legacy-visible-devices=...` applies at the gate's next
request: the repo is not restarted, and the gate (started without the client's config) keeps its pid.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_kit import IMAGE, RepoEnv, client_env, refused, skip_reason

from rediacc_core.config import Config
from rediacc_core.machine import Machine
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import lifecycle
from rediacc_core.setup import run_setup
from rediacc_core.testing.dockerenv import busybox_tar, import_busybox
from rediacc_core.testing.fakemachine import FakeMachine

nvidia_testing = pytest.importorskip("rediacc_nvidia.testing")

MACHINE = "gpu1"
GPU0 = "nvidia.com/gpu=0"
GPU1 = "nvidia.com/gpu=1"
DRIVER_ADVICE = "please update your driver to a newer version, or use an earlier cuda container"
LEGACY_SETTING = "legacy-visible-devices"
HOOK_LOG = "hook.log"


def _up(machine: Machine, base: Path, repo: Repo, env: dict[str, str]) -> RepoEnv:
    """`lifecycle.repo_up` with `$REDIACC_CONFIG` naming no file: the gate, a child process, must find
    everything it reads (settings included) on the machine, as under systemd with another HOME."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REDIACC_CONFIG", str(base / "no-client-config.yaml"))
        runtime = lifecycle.repo_up(machine, repo)
    return RepoEnv(repo, runtime, {**env, "DOCKER_HOST": runtime.docker_host_url})


@dataclass
class NvidiaEnv:
    """The fake NVIDIA machine, its config file, and repo `alpha` up behind its gate."""

    base: Path
    config_path: Path
    machine: Machine
    alpha: RepoEnv
    mode: str = "refuse"

    @property
    def hook_calls(self) -> list[str]:
        log = self.base / HOOK_LOG
        return log.read_text().splitlines() if log.exists() else []

    def rdc(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "REDIACC_CONFIG": str(self.config_path)}
        return subprocess.run(["rdc", *args], capture_output=True, text=True, env=env, timeout=120)

    def gate_pid(self) -> int:
        return int(self.alpha.runtime.gate_pidfile.read_text().strip())

    def legacy_mode(self, mode: str) -> None:
        """Set `legacy-visible-devices` on the machine with the CLI; the running gate follows at its
        next request, without a restart."""
        if mode == self.mode:
            return
        pid = self.gate_pid()
        result = self.rdc("machine", "config", MACHINE, "--set", f"{LEGACY_SETTING}={mode}")
        assert result.returncode == 0, result.stderr
        assert self.gate_pid() == pid
        self.mode = mode


def _setup_machine(machine: Machine) -> None:
    """`rdc machine setup` as the CLI runs it (default options): the stand-ins are the machine's own tools."""
    plugins = get_plugins()
    options = {opt.name: opt.default for opt in plugins.setup_options() if opt.name}
    run_setup(machine, plugins, options)


@pytest.fixture(scope="module")
def nv() -> Iterator[NvidiaEnv]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="rdcn", dir="/tmp"))  # short: socket paths are limited
    fm = FakeMachine(base / "m", name=MACHINE)
    nvidia_testing.nvidia_machine(fm, nvidia_testing.two_a100s(), compute_caps=("8.0", "8.0"))
    # The spec's createContainer hooks name this stand-in by its absolute path; runc runs it before
    # the container starts. Recording each call shows the toolkit's hooks really run.
    fm.standin("nvidia-cdi-hook", f'#!/bin/sh\necho "$@" >> {base / HOOK_LOG}\n')
    config_path = base / "rdc.yaml"
    config = Config.load(config_path)
    config.add(MACHINE, fm.root)
    config.save()
    machine = Config.load(config_path).machine(MACHINE)
    repo = RepoStore(machine).create("alpha")
    env = client_env(base)
    try:
        _setup_machine(machine)
        state = NvidiaEnv(base, config_path, machine, _up(machine, base, repo, env))
        import_busybox(state.alpha.daemon, IMAGE)
        granted = state.rdc("repo", "gpu", "grant", repo.ref, "--device", GPU0)
        assert granted.returncode == 0, granted.stderr
        yield state
    finally:
        lifecycle.repo_down(machine, repo)
        shutil.rmtree(base, ignore_errors=True)


def admitted(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr


def imported(nv: NvidiaEnv, tag: str, *changes: str) -> str:
    """`docker import --change ...` through the gate: an image whose own config sets `changes`."""
    args = [arg for change in changes for arg in ("--change", change)]
    result = nv.alpha.docker("import", *args, "-", tag, input=busybox_tar())
    admitted(result)
    return tag


# --- the machine -------------------------------------------------------------------------------------


def test_gpu_list_shows_the_discovered_gpus_and_their_cdi_names(nv: NvidiaEnv) -> None:
    result = nv.rdc("machine", "gpu", "list", MACHINE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("NVIDIA A100-SXM4-40GB") == 2, result.stdout
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.strip()}
    assert rows[GPU0] == ["nvidia.yaml", "alpha"], result.stdout  # the grant in force
    assert rows[GPU1] == ["nvidia.yaml", "-"], result.stdout
    assert rows["nvidia.com/gpu=all"] == ["nvidia.yaml", "-"], result.stdout


def test_a_granted_gpu_is_injected_by_cdi_and_the_toolkit_hooks_run(nv: NvidiaEnv) -> None:
    calls_before = len(nv.hook_calls)
    result = nv.alpha.docker(
        "run", "--rm", "--device", GPU0, IMAGE, "ls", "-l", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia1"
    )
    # Only the granted GPU's node, plus the spec's common nodes; /dev/nvidia1 is not there.
    assert "/dev/nvidia1: No such file or directory" in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("c") and "195,   0" in lines[0] and lines[0].endswith("/dev/nvidia0")
    assert lines[1].startswith("c") and "195, 255" in lines[1] and lines[1].endswith("/dev/nvidiactl")
    calls = nv.hook_calls[calls_before:]
    assert [call.split()[0] for call in calls] == ["create-symlinks", "update-ldcache"], calls


def test_a_raw_gpu_node_is_refused_naming_its_exact_cdi_name(nv: NvidiaEnv) -> None:
    result = nv.alpha.docker("run", "--rm", "--device", "/dev/nvidia1", IMAGE, "true")
    refused(result, "raw device /dev/nvidia1 is refused", f"--device {GPU1}", f"--device {GPU1}")
    assert f"rdc repo gpu grant {nv.alpha.repo.ref} --device {GPU1}" in result.stderr


def test_visible_devices_with_empty_entries_is_read_as_the_toolkit_reads_it(nv: NvidiaEnv) -> None:
    nv.legacy_mode("refuse")
    result = nv.alpha.docker("run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0,,", IMAGE, "true")
    refused(result, "NVIDIA_VISIBLE_DEVICES=0,,", f"--device {GPU0}")


# --- NVIDIA_REQUIRE_* ----------------------------------------------------------------------------------


def test_a_requirement_from_the_command_line_the_driver_cannot_meet_is_refused(nv: NvidiaEnv) -> None:
    result = nv.alpha.docker(
        "run", "--rm", "--device", GPU0, "-e", "NVIDIA_REQUIRE_CUDA=cuda>=99.0", IMAGE, "true"
    )
    refused(
        result,
        "GPU 0 (NVIDIA A100-SXM4-40GB): unsatisfied condition: cuda>=99.0",
        DRIVER_ADVICE,
        "CUDA driver version 12.2",
    )
    assert not nv.alpha.containers(), "a refused create must leave no container behind"


def test_a_requirement_from_the_command_line_the_driver_meets_is_admitted(nv: NvidiaEnv) -> None:
    admitted(
        nv.alpha.docker(
            "run", "--rm", "--device", GPU0, "-e", "NVIDIA_REQUIRE_CUDA=cuda>=11.0", IMAGE, "true"
        )
    )


@pytest.mark.parametrize(
    ("change", "condition"),
    [
        ("ENV NVIDIA_REQUIRE_CUDA=cuda>=99.0", "cuda>=99.0"),
        ("ENV CUDA_VERSION=99.1.0", "cuda>=99.1"),  # legacy images: the requirement is implicit
    ],
    ids=["NVIDIA_REQUIRE_CUDA", "CUDA_VERSION"],
)
def test_a_requirement_from_the_image_itself_is_refused_unless_disabled(
    nv: NvidiaEnv, change: str, condition: str
) -> None:
    tag = imported(nv, f"needs-{condition.replace('>=', '-')}:latest", change)
    refused(
        nv.alpha.docker("run", "--rm", "--device", GPU0, tag, "true"),
        f"unsatisfied condition: {condition}",
        DRIVER_ADVICE,
    )
    admitted(
        nv.alpha.docker("run", "--rm", "--device", GPU0, "-e", "NVIDIA_DISABLE_REQUIRE=true", tag, "true")
    )


def test_an_image_requirement_the_driver_meets_is_admitted(nv: NvidiaEnv) -> None:
    tag = imported(nv, "needs-cuda-12:latest", "ENV NVIDIA_REQUIRE_CUDA=cuda>=12.0 brand=tesla")
    admitted(nv.alpha.docker("run", "--rm", "--device", GPU0, tag, "true"))


def test_the_command_line_overrides_the_images_requirement(nv: NvidiaEnv) -> None:
    tag = imported(nv, "needs-cuda-99b:latest", "ENV NVIDIA_REQUIRE_CUDA=cuda>=99.0")
    admitted(
        nv.alpha.docker("run", "--rm", "--device", GPU0, "-e", "NVIDIA_REQUIRE_CUDA=cuda>=12.2", tag, "true")
    )


def test_requirements_do_not_concern_containers_without_a_gpu(nv: NvidiaEnv) -> None:
    tag = imported(nv, "needs-cuda-99c:latest", "ENV NVIDIA_REQUIRE_CUDA=cuda>=99.0")
    admitted(nv.alpha.docker("run", "--rm", tag, "true"))


# --- NVIDIA_VISIBLE_DEVICES ----------------------------------------------------------------------------


def test_visible_devices_is_refused_by_default_naming_the_cdi_device(nv: NvidiaEnv) -> None:
    nv.legacy_mode("refuse")
    result = nv.alpha.docker("run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "true")
    refused(result, "NVIDIA_VISIBLE_DEVICES=0", f"--device {GPU0}")


def test_a_changed_setting_applies_at_the_gates_next_request_without_a_restart(nv: NvidiaEnv) -> None:
    def legacy_run() -> subprocess.CompletedProcess[str]:
        return nv.alpha.docker("run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "true")

    nv.legacy_mode("refuse")
    pid = nv.gate_pid()
    refused(legacy_run(), "NVIDIA_VISIBLE_DEVICES=0", f"--device {GPU0}")
    nv.legacy_mode("translate")
    admitted(legacy_run())
    nv.legacy_mode("refuse")
    refused(legacy_run(), "NVIDIA_VISIBLE_DEVICES=0", f"--device {GPU0}")
    assert nv.gate_pid() == pid


# The mode varies slowest, so the setting changes once between the refuse and the translate cases.
@pytest.mark.parametrize("value", ["void", "none", pytest.param("", id="empty")])
@pytest.mark.parametrize("mode", ["refuse", "translate"])
def test_visible_devices_asking_for_no_gpu_is_admitted(nv: NvidiaEnv, mode: str, value: str) -> None:
    nv.legacy_mode(mode)
    result = nv.alpha.docker(
        "run", "--rm", "-e", f"NVIDIA_VISIBLE_DEVICES={value}", IMAGE, "sh", "-c", "ls /dev/nvidia0 || true"
    )
    admitted(result)
    assert "/dev/nvidia0" not in result.stdout


def test_translated_visible_devices_becomes_the_granted_cdi_device(nv: NvidiaEnv) -> None:
    nv.legacy_mode("translate")
    result = nv.alpha.docker(
        "run",
        "--rm",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=0",
        IMAGE,
        "sh",
        "-c",
        "ls -l /dev/nvidia0; echo visible=$NVIDIA_VISIBLE_DEVICES",
    )
    admitted(result)
    node, visible = result.stdout.splitlines()
    assert node.startswith("c") and "195,   0" in node, result.stdout
    assert visible == "visible=void", result.stdout  # the CDI spec's value; the legacy one was removed
    assert "translated to CDI devices nvidia.com/gpu=0" in nv.alpha.runtime.gate_log.read_text()


def test_translated_visible_devices_still_meets_the_requirements(nv: NvidiaEnv) -> None:
    nv.legacy_mode("translate")
    result = nv.alpha.docker(
        "run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "NVIDIA_REQUIRE_CUDA=cuda>=99.0", IMAGE, "true"
    )
    refused(result, "unsatisfied condition: cuda>=99.0")


def test_translated_visible_devices_without_the_grant_is_refused_naming_it(nv: NvidiaEnv) -> None:
    nv.legacy_mode("translate")
    result = nv.alpha.docker("run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=1", IMAGE, "true")
    refused(result, f"no grant for {GPU1}", f"rdc repo gpu grant alpha@{MACHINE} --device {GPU1}")
    result = nv.alpha.docker("run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=all", IMAGE, "true")
    refused(result, "no grant for nvidia.com/gpu=all")


# --- day two (last: it updates the machine's driver) ----------------------------------------------------


def test_a_driver_update_holds_device_requests_until_the_refresh_then_requirements_read_the_new_driver(
    nv: NvidiaEnv,
) -> None:
    wants = ("-e", "NVIDIA_REQUIRE_CUDA=cuda>=12.4")
    before = nv.alpha.docker("run", "--rm", "--device", GPU0, *wants, IMAGE, "true")
    refused(before, "unsatisfied condition: cuda>=12.4", "CUDA driver version 12.2")

    # The driver is updated and the toolkit's refresh unit rewrites the spec, as after a reboot.
    data = nv.machine.tool_dir / nvidia_testing.DATA_DIR
    report = (data / "q-x.xml").read_text()
    (data / "q-x.xml").write_text(report.replace("535.104.05", "550.54.15").replace("12.2<", "12.4<"))
    spec = nv.machine.cdi_dir / "nvidia.yaml"
    generated = nv.machine.run(
        [str(nv.machine.tool_dir / "nvidia-ctk"), "cdi", "generate", f"--output={spec}"]
    )
    assert generated.ok, generated.stderr

    stale = nv.alpha.docker("run", "--rm", "--device", GPU0, *wants, IMAGE, "true")
    refused(stale, "nvidia.yaml changed", f"rdc machine refresh {MACHINE}")
    admitted(nv.alpha.docker("run", "--rm", IMAGE, "true"))  # requests without devices go on

    done = nv.rdc("machine", "refresh", MACHINE)
    assert done.returncode == 0, done.stderr
    assert f"Machine {MACHINE} is refreshed: 2 GPU(s)" in done.stderr
    admitted(nv.alpha.docker("run", "--rm", "--device", GPU0, *wants, IMAGE, "true"))
    listing = nv.rdc("machine", "gpu", "list", MACHINE)
    assert "550.54.15" in listing.stdout, listing.stdout
