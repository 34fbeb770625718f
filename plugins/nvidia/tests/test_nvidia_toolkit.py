"""--install-nvidia-toolkit, the install plan per package manager, nvidia-cdi-refresh, and the spec."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rediacc_nvidia import testing, toolkit
from rediacc_nvidia.discovery import discover

from rediacc_core import Gpu, SetupContext, SetupStep
from rediacc_core.cdi.spec import CdiSpecError, load_spec
from rediacc_core.errors import ToolError
from rediacc_core.machine import Machine
from rediacc_core.testing import FakeMachine

XML_A100 = "nvidia-smi-q-x/a100-sxm4-40gb-mig_510.47.03.xml"
XML_T4 = "nvidia-smi-q-x/tesla-t4_515.105.01.xml"
NVIDIA_GPU = Gpu(
    vendor="nvidia",
    source="nvidia",
    name="Tesla T4",
    index=0,
    pci_bus_id="0000:00:1e.0",
    driver="nvidia",
    driver_version="515.105.01",
)
NOUVEAU_GPU = Gpu(
    vendor="nvidia",
    source="rediacc_dri",
    name="GP107",
    index=None,
    pci_bus_id="0000:01:00.0",
    driver="nouveau",
)


def ctx(machine: Machine, choice: str = "auto", gpus: tuple[Gpu, ...] = (NVIDIA_GPU,)) -> SetupContext:
    return SetupContext(machine, gpus, {"install_nvidia_toolkit": choice})


def titles(steps: list[SetupStep]) -> list[str]:
    return [step.title for step in steps]


@pytest.fixture
def bare(make_fake_machine: Callable[[str], FakeMachine], monkeypatch: pytest.MonkeyPatch) -> FakeMachine:
    """A machine whose PATH holds only its own stand-ins (no host apt-get, no host nvidia-ctk)."""
    fm = make_fake_machine("bare")
    monkeypatch.setenv("PATH", str(fm.bin_dir))
    return fm


# --- when the toolkit is wanted ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "gpus", "wanted"),
    [
        ("auto", (NVIDIA_GPU,), True),
        ("auto", (), False),
        ("auto", (NOUVEAU_GPU,), False),
        ("true", (), True),
        ("false", (NVIDIA_GPU,), False),
    ],
)
def test_install_choice(bare: FakeMachine, choice: str, gpus: tuple[Gpu, ...], wanted: bool) -> None:
    testing.install_ctk(bare)
    steps = toolkit.setup_steps(ctx(bare.machine, choice, gpus))
    specs = toolkit.cdi_specs(ctx(bare.machine, choice, gpus))
    installs = [step for step in steps if step.title == "Install the NVIDIA Container Toolkit"]
    assert bool(installs) is wanted
    assert [spec.filename for spec in specs if spec.command] == (["nvidia.yaml"] if wanted else [])


def test_nvidia_gpus_left_without_a_spec_are_said_in_the_plan_with_the_command(bare: FakeMachine) -> None:
    (step,) = toolkit.setup_steps(ctx(bare.machine, "false", (NVIDIA_GPU,)))
    assert step.title == "NVIDIA GPUs without a CDI spec" and step.apply is None
    assert step.plan == (
        "skip: no nvidia.yaml is generated (--install-nvidia-toolkit=false), so the NVIDIA GPUs found are "
        "not grantable; to make them grantable: rdc machine setup bare --install-nvidia-toolkit=auto",
    )
    assert toolkit.setup_steps(ctx(bare.machine, "false", (NOUVEAU_GPU,))) == [], "nothing for nouveau"


def test_false_generates_nothing_even_with_an_old_spec(bare: FakeMachine) -> None:
    bare.write("/etc/cdi/nvidia.yaml", "cdiVersion: 0.5.0\n")
    assert toolkit.cdi_specs(ctx(bare.machine, "false")) == []


def test_auto_without_gpu_removes_a_stale_spec(bare: FakeMachine) -> None:
    assert toolkit.cdi_specs(ctx(bare.machine, "auto", ())) == []
    bare.write("/etc/cdi/nvidia.yaml", "cdiVersion: 0.5.0\n")
    (removal,) = toolkit.cdi_specs(ctx(bare.machine, "auto", ()))
    assert (removal.filename, removal.spec, removal.command) == ("nvidia.yaml", None, None)


def test_generate_command_native_and_wsl(bare: FakeMachine) -> None:
    root = bare.root
    (spec,) = toolkit.cdi_specs(ctx(bare.machine))
    assert spec.command == (
        "nvidia-ctk", "cdi", "generate", "--output={output}", "--format=yaml",
        f"--dev-root={root}", f"--driver-root={root}",
    )  # fmt: skip
    bare.char_device("/dev/dxg", 10, 125)
    (spec,) = toolkit.cdi_specs(ctx(bare.machine))
    assert spec.command is not None and "--mode=wsl" in spec.command


def test_host_machine_gets_no_root_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(Machine, "is_host", property(lambda self: True))
    command = toolkit.generate_command(Machine("h", tmp_path))
    assert command == ("nvidia-ctk", "cdi", "generate", "--output={output}", "--format=yaml")


# --- installing -----------------------------------------------------------------------------------------


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat the fake machine as the host (root /): only there does setup use a package manager."""
    monkeypatch.setattr(Machine, "is_host", property(lambda self: True))


def test_a_directory_rooted_machine_never_uses_the_hosts_package_manager_or_network(
    bare: FakeMachine,
) -> None:
    log = testing.package_manager(bare, "apt")  # apt-get and curl stand-ins that log each call
    install = toolkit.setup_steps(ctx(bare.machine))[0]

    plan = " ".join(install.plan)
    assert "apt-get" not in plan and "curl" not in plan and "fetch" not in plan
    assert plan.startswith(
        "refuse: nvidia-ctk is not among the machine's own tools and machine bare's root is"
    )
    assert install.apply is None
    assert isinstance(install.refusal, ToolError)
    assert "--install-nvidia-toolkit=false" in install.refusal.todo
    assert not log.exists() or log.read_text() == ""


def test_installed_toolkit_is_not_installed_again(bare: FakeMachine) -> None:
    ctk = testing.install_ctk(bare)
    install = toolkit.setup_steps(ctx(bare.machine))[0]
    assert install.plan == (f"nvidia-ctk found at {ctk}: the toolkit is installed, nothing to install",)
    assert install.apply is None


def test_apt_plan_and_install(bare: FakeMachine, host: None) -> None:
    log = testing.package_manager(bare, "apt")
    install = toolkit.setup_steps(ctx(bare.machine))[0]
    keyring = bare.path("/usr/share/keyrings/nvidia-container-toolkit-keyring.asc")
    listing = bare.path("/etc/apt/sources.list.d/nvidia-container-toolkit.list")
    assert install.slow
    assert install.plan == (
        f"fetch https://nvidia.github.io/libnvidia-container/gpgkey -> {keyring}",
        f"write {listing}: deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.asc] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /",
        "run: apt-get update",
        "run: DEBIAN_FRONTEND=noninteractive apt-get install -y nvidia-container-toolkit",
    )
    assert install.apply is not None
    install.apply()
    assert log.read_text().splitlines() == [
        "curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey",
        "apt-get update",
        "apt-get install -y nvidia-container-toolkit",
    ]
    assert keyring.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert "stable/deb/$(ARCH) /" in listing.read_text()
    assert bare.machine.which("nvidia-ctk") is not None
    again = toolkit.setup_steps(ctx(bare.machine))[0]
    assert again.apply is None and "nothing to install" in again.plan[0]


@pytest.mark.parametrize("manager", ["dnf", "yum"])
def test_rpm_plan_and_install(bare: FakeMachine, host: None, manager: str) -> None:
    log = testing.package_manager(bare, manager)
    install = toolkit.setup_steps(ctx(bare.machine))[0]
    repo = bare.path("/etc/yum.repos.d/nvidia-container-toolkit.repo")
    assert toolkit.RPM_REPO_URL == (
        "https://nvidia.github.io/libnvidia-container/stable/rpm/nvidia-container-toolkit.repo"
    )
    assert install.plan == (
        f"fetch {toolkit.RPM_REPO_URL} -> {repo}",
        f"run: {manager} install -y nvidia-container-toolkit",
    )
    assert install.apply is not None
    install.apply()
    assert log.read_text().splitlines()[-1] == f"{manager} install -y nvidia-container-toolkit"
    assert repo.read_text().startswith("[nvidia-container-toolkit]")


def test_no_package_manager_fails_saying_what_to_do(bare: FakeMachine, host: None) -> None:
    install = toolkit.setup_steps(ctx(bare.machine))[0]
    assert "no apt-get, dnf or yum" in install.plan[0]
    assert install.apply is None  # a refusal known at planning time: a dry run exits with it too
    assert isinstance(install.refusal, ToolError)
    assert "--install-nvidia-toolkit=false" in install.refusal.todo


def test_failing_package_manager_is_a_tool_error(bare: FakeMachine, host: None) -> None:
    testing.package_manager(bare, "apt")
    bare.standin(
        "apt-get", "#!/bin/sh\necho 'E: Unable to locate package nvidia-container-toolkit' >&2\nexit 100\n"
    )
    install = toolkit.setup_steps(ctx(bare.machine))[0]
    assert install.apply is not None
    with pytest.raises(ToolError, match=r"exit 100.*Unable to locate package"):
        install.apply()


# --- nvidia-cdi-refresh and nvidia-persistenced ------------------------------------------------------


def test_refresh_points_at_etc_cdi_and_keeps_other_settings(bare: FakeMachine) -> None:
    testing.install_ctk(bare)
    env_file = bare.write(
        "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env",
        "NVIDIA_CTK_DEBUG=1\nNVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml\n",
    )
    refresh = toolkit.setup_steps(ctx(bare.machine))[1]
    assert refresh.plan[0] == f"write {env_file}: NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/etc/cdi/nvidia.yaml"
    assert refresh.plan[1].startswith("skip: systemctl enable --now nvidia-cdi-refresh.path")
    assert refresh.apply is not None
    refresh.apply()
    assert (
        env_file.read_text() == "NVIDIA_CTK_DEBUG=1\nNVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/etc/cdi/nvidia.yaml\n"
    )


def test_refresh_units_are_enabled_on_the_host(bare: FakeMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Machine, "is_host", property(lambda self: True))
    testing.install_ctk(bare)
    log = bare.bin_dir / "systemctl.log"
    bare.standin("systemctl", f'#!/bin/sh\necho "$@" > {log}\n')
    refresh = toolkit.setup_steps(ctx(bare.machine))[1]
    assert refresh.plan[1] == "run: systemctl enable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service"
    assert refresh.apply is not None
    refresh.apply()
    assert log.read_text() == "enable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service\n"


def test_wsl_has_no_refresh_step(bare: FakeMachine) -> None:
    testing.install_ctk(bare)
    bare.char_device("/dev/dxg", 10, 125)
    assert titles(toolkit.setup_steps(ctx(bare.machine))) == ["Install the NVIDIA Container Toolkit"]


def test_running_persistenced_is_noted(bare: FakeMachine) -> None:
    testing.install_ctk(bare)
    bare.write("/run/nvidia-persistenced/socket", "")
    steps = toolkit.setup_steps(ctx(bare.machine))
    assert titles(steps)[-1] == "nvidia-persistenced socket"
    assert "mounts its socket" in steps[-1].plan[0]


# --- the stand-in nvidia-ctk's spec, run as the core runs the command ----------------------------------


def generate(fm: FakeMachine, tmp_path: Path) -> Path:
    (spec_file,) = toolkit.cdi_specs(ctx(fm.machine))
    assert spec_file.command is not None
    target = tmp_path / "staging" / "nvidia.yaml"
    result = fm.machine.run([arg.replace("{output}", str(target)) for arg in spec_file.command])
    assert result.ok, result.stderr
    return target


def test_generated_spec_is_valid_and_names_every_device(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine], tmp_path: Path
) -> None:
    fm = make_fake_machine("a100")
    testing.nvidia_machine(fm, capture(XML_A100), compute_caps=["8.0"], persistenced=True)
    spec = load_spec(generate(fm, tmp_path))
    assert (spec.version, spec.kind) == ("0.5.0", "nvidia.com/gpu")
    gpu = discover(fm.machine)[0]
    expected = {*gpu.cdi_names, *(n for p in gpu.partitions for n in p.cdi_names), "nvidia.com/gpu=all"}
    assert set(spec.qualified_names()) == expected
    raw: Any = spec.raw
    nodes = {node["path"]: node["hostPath"] for node in raw["containerEdits"]["deviceNodes"]}
    assert nodes["/dev/nvidiactl"] == str(fm.root / "dev/nvidiactl")
    device0 = next(d for d in raw["devices"] if d["name"] == "0")
    assert device0["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": str(fm.root / "dev/nvidia0")}
    ]
    assert all(Path(host).exists() for host in nodes.values())
    hooks = raw["containerEdits"]["hooks"]
    assert {hook["hookName"] for hook in hooks} == {"createContainer"}
    assert all(hook["args"][0] == "nvidia-cdi-hook" and Path(hook["path"]).is_file() for hook in hooks)
    mounts = {m["containerPath"] for m in raw["containerEdits"]["mounts"]}
    assert "/run/nvidia-persistenced/socket" in mounts
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.510.47.03" in mounts


def test_generated_spec_uses_the_minor_number_not_the_index(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine], tmp_path: Path
) -> None:
    fm = make_fake_machine("a5000")
    testing.nvidia_machine(
        fm, capture("nvidia-smi-q-x/rtx-a5000-x2_590.44.01.xml"), compute_caps=["8.6", "8.6"]
    )
    raw: Any = load_spec(generate(fm, tmp_path)).raw
    by_name = {
        d["name"]: d["containerEdits"]["deviceNodes"][0]["path"] for d in raw["devices"] if d["name"] != "all"
    }
    assert by_name["0"] == "/dev/nvidia1" and by_name["1"] == "/dev/nvidia0"


def test_wsl_spec_has_only_all_backed_by_dxg(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine], tmp_path: Path
) -> None:
    fm = make_fake_machine("wsl")
    testing.wsl_machine(fm, capture("nvidia-smi-q-x/rtx-3080-windows_536.40.xml"))
    spec = load_spec(generate(fm, tmp_path))
    assert spec.qualified_names() == ["nvidia.com/gpu=all"]
    raw: Any = spec.raw
    assert raw["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/dxg", "hostPath": str(fm.root / "dev/dxg")}
    ]


def test_broken_nvidia_ctk_fails_or_writes_an_invalid_spec(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine], tmp_path: Path
) -> None:
    fm = make_fake_machine("broken")
    testing.nvidia_machine(fm, capture(XML_T4))
    testing.break_ctk(fm, "invalid")
    with pytest.raises(CdiSpecError):
        load_spec(generate(fm, tmp_path))
    testing.break_ctk(fm, "fail")
    (spec_file,) = toolkit.cdi_specs(ctx(fm.machine))
    assert spec_file.command is not None
    result = fm.machine.run([arg.replace("{output}", str(tmp_path / "x.yaml")) for arg in spec_file.command])
    assert result.returncode == 1 and "failed to initialize NVML" in result.stderr
