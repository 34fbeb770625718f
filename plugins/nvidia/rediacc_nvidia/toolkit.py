"""The NVIDIA Container Toolkit: whether setup wants it, how to install it, and the spec it generates.

Only `nvidia-ctk` (for `cdi generate` and the `/dev/char` links) and the `nvidia-cdi-refresh` units
are used. No container
runtime is configured: repo daemons admit only runc, and the CDI spec is all they need.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rediacc_core import CdiSpecFile, Gpu, Machine, SetupContext, SetupStep, ToolError, atomic_write_text
from rediacc_nvidia.discovery import is_wsl

OPTION = "install_nvidia_toolkit"
OPTION_FLAG = "--install-nvidia-toolkit"
CHOICES = ("auto", "true", "false")
SPEC_FILE = "nvidia.yaml"
SPEC_PATH = f"/etc/cdi/{SPEC_FILE}"
PACKAGE = "nvidia-container-toolkit"

KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
# apt reads ASCII-armoured keys when the file ends in .asc (apt >= 1.4), so no gpg is needed.
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.asc"
APT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
# apt itself replaces $(ARCH) with the machine's architecture.
APT_SOURCE = f"deb [signed-by={KEYRING}] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /"
RPM_REPO_URL = "https://nvidia.github.io/libnvidia-container/stable/rpm/nvidia-container-toolkit.repo"
RPM_REPO_FILE = "/etc/yum.repos.d/nvidia-container-toolkit.repo"

REFRESH_ENV = "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
REFRESH_VARIABLE = "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH"
REFRESH_UNITS = ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")
PERSISTENCED_SOCKET = "/run/nvidia-persistenced/socket"

_INSTALL_TIMEOUT = 1800.0


def install_choice(options: Mapping[str, Any]) -> str:
    value = options.get(OPTION, "auto")
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value or "auto").lower()
    return text if text in CHOICES else "auto"


def has_nvidia_gpu(gpus: Iterable[Gpu]) -> bool:
    # A GPU another plugin saw on the PCI bus counts only when NVIDIA's driver runs it: with nouveau
    # (or no driver) the toolkit has nothing to describe.
    return any(gpu.vendor == "nvidia" and (gpu.source == "nvidia" or gpu.driver == "nvidia") for gpu in gpus)


def toolkit_wanted(ctx: SetupContext) -> bool:
    choice = install_choice(ctx.options)
    return choice == "true" or (choice == "auto" and has_nvidia_gpu(ctx.gpus))


# --- running things ---------------------------------------------------------------------------------


def _run(machine: Machine, argv: list[str], env: Mapping[str, str] | None = None) -> str:
    result = machine.run(argv, env=env, timeout=_INSTALL_TIMEOUT)
    if not result.ok:
        output = (result.stderr or result.stdout).strip()
        detail = output.splitlines()[-1] if output else "no output"
        raise ToolError(
            f"`{' '.join(argv)}` failed (exit {result.returncode}): {detail}",
            f"fix the cause and run setup again, or install {PACKAGE} by hand "
            "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html)",
        )
    return result.stdout


def _fetch(machine: Machine, url: str, looks_right: Callable[[str], bool], what: str) -> str:
    if machine.which("curl") is None:
        raise ToolError(
            f"curl is needed to fetch {what} from {url}, and it is not installed",
            "install curl, then run setup again",
        )
    text = _run(machine, ["curl", "-fsSL", url])
    if not looks_right(text):
        raise ToolError(
            f"{url} did not return {what} (got {text[:60]!r})",
            "check the machine's network or proxy, then run setup again",
        )
    return text


# --- the install step -------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstallPlan:
    manager: str
    plan: tuple[str, ...]
    apply: Callable[[], None]


def _apt_plan(machine: Machine) -> InstallPlan:
    keyring, source_list = machine.path(KEYRING), machine.path(APT_LIST)
    env = {"DEBIAN_FRONTEND": "noninteractive"}

    def apply() -> None:
        key = _fetch(
            machine, KEY_URL, lambda text: "BEGIN PGP PUBLIC KEY BLOCK" in text, "NVIDIA's repository key"
        )
        atomic_write_text(keyring, key)
        atomic_write_text(source_list, APT_SOURCE + "\n")
        _run(machine, ["apt-get", "update"], env)
        _run(machine, ["apt-get", "install", "-y", PACKAGE], env)

    return InstallPlan(
        "apt",
        (
            f"fetch {KEY_URL} -> {keyring}",
            f"write {source_list}: {APT_SOURCE}",
            "run: apt-get update",
            f"run: DEBIAN_FRONTEND=noninteractive apt-get install -y {PACKAGE}",
        ),
        apply,
    )


def _rpm_plan(machine: Machine, manager: str) -> InstallPlan:
    repo_file = machine.path(RPM_REPO_FILE)

    def apply() -> None:
        repo = _fetch(
            machine, RPM_REPO_URL, lambda text: text.lstrip().startswith("["), "NVIDIA's repository file"
        )
        atomic_write_text(repo_file, repo)
        _run(machine, [manager, "install", "-y", PACKAGE])

    return InstallPlan(
        manager,
        (f"fetch {RPM_REPO_URL} -> {repo_file}", f"run: {manager} install -y {PACKAGE}"),
        apply,
    )


def install_plan(machine: Machine) -> InstallPlan | None:
    """The install for the machine's package manager: apt-get, else dnf, else yum; None if none."""
    if machine.which("apt-get"):
        return _apt_plan(machine)
    for manager in ("dnf", "yum"):
        if machine.which(manager):
            return _rpm_plan(machine, manager)
    return None


def install_step(ctx: SetupContext) -> SetupStep:
    machine = ctx.machine
    title = "Install the NVIDIA Container Toolkit"
    ctk = machine.which("nvidia-ctk")
    if ctk is not None:
        return SetupStep(
            title, (f"nvidia-ctk found at {ctk}: the toolkit is installed, nothing to install",), order=20
        )
    if not machine.is_host:
        # A directory-rooted machine is simulated or prepared by hand: the host's package manager and
        # network belong to the host, never to it.
        where = f"machine {machine.name}'s root is {machine.root}, not /"

        return SetupStep(
            title,
            (
                f"refuse: nvidia-ctk is not among the machine's own tools and {where}: no package manager "
                "or network is used for it",
            ),
            order=20,
            refusal=ToolError(
                f"nvidia-ctk is not among machine {machine.name}'s own tools (under {machine.root}/usr/bin "
                f"and the other bin directories of its root) and {where}: setup never installs packages for "
                "such a machine (the host's apt-get, dnf and network are left alone)",
                f"put the machine's nvidia-ctk at {machine.tool_dir}/nvidia-ctk, "
                "or run setup with --install-nvidia-toolkit=false",
            ),
        )
    plan = install_plan(machine)
    if plan is None:
        return SetupStep(
            title,
            ("no apt-get, dnf or yum found: cannot install nvidia-container-toolkit",),
            order=20,
            refusal=ToolError(
                "no supported package manager (apt-get, dnf or yum) was found to install the "
                "NVIDIA Container Toolkit",
                f"install {PACKAGE} by hand so that nvidia-ctk is on PATH, "
                "or run setup with --install-nvidia-toolkit=false",
            ),
        )

    def apply() -> None:
        plan.apply()
        if machine.which("nvidia-ctk") is None:
            raise ToolError(
                f"{PACKAGE} was installed with {plan.manager} but nvidia-ctk is still not on PATH",
                "check the package's files (`dpkg -L nvidia-container-toolkit-base`), then run setup again",
            )

    return SetupStep(title, plan.plan, apply, order=20, slow=True)


# --- nvidia-cdi-refresh and nvidia-persistenced -----------------------------------------------------


def _with_variable(existing: str, line: str) -> str:
    kept = [old for old in existing.splitlines() if not old.strip().startswith(f"{REFRESH_VARIABLE}=")]
    return "\n".join([*kept, line]) + "\n"


def refresh_step(ctx: SetupContext) -> SetupStep:
    """Point the toolkit's spec-refresh service at /etc/cdi, the only dir repo daemons read."""
    machine = ctx.machine
    env_file = machine.path(REFRESH_ENV)
    line = f"{REFRESH_VARIABLE}={SPEC_PATH}"
    command = ["systemctl", "enable", "--now", *REFRESH_UNITS]
    can_enable = machine.is_host and machine.which("systemctl") is not None
    plan = [f"write {env_file}: {line}"]
    if can_enable:
        plan.append(f"run: {' '.join(command)}")
    elif not machine.is_host:
        plan.append(
            f"skip: {' '.join(command)} (machine root is {machine.root}, not /: host units left alone)"
        )
    else:
        plan.append(
            f"skip: {' '.join(command)} (no systemctl: setup regenerates the spec on each run instead)"
        )

    def apply() -> None:
        existing = env_file.read_text(encoding="utf-8") if env_file.exists() else ""
        atomic_write_text(env_file, _with_variable(existing, line))
        if not can_enable:
            return
        result = machine.run(command, timeout=120.0)
        # Toolkits before 1.18 ship no refresh units; setup regenerating the spec covers that case.
        if not result.ok and "does not exist" not in result.stderr and "not found" not in result.stderr:
            raise ToolError(
                f"`{' '.join(command)}` failed (exit {result.returncode}): {result.stderr.strip()}",
                "check `systemctl status nvidia-cdi-refresh.path`, then run setup again",
            )

    return SetupStep("Point nvidia-cdi-refresh at /etc/cdi/nvidia.yaml", tuple(plan), apply, order=30)


# --- /dev/char links --------------------------------------------------------------------------------

DEV_CHAR = "/dev/char"
DEV_CHAR_COMMAND = ("nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all")


def nvidia_nodes(machine: Machine) -> list[str]:
    """The NVIDIA device nodes of the machine, as container paths (`/dev/nvidia0`, `/dev/nvidia-caps/…`)."""
    dev = machine.path("/dev")
    found = [*dev.glob("nvidia*"), *dev.glob("nvidia-caps/nvidia-cap*")]
    return sorted(
        f"/dev/{node.relative_to(dev)}" for node in found if not node.is_dir() and node.suffix != ".devnum"
    )


def linked_nodes(machine: Machine) -> set[str]:
    """The nodes `/dev/char` links point at, as container paths (links are read, never followed)."""
    char = machine.path(DEV_CHAR)
    root = str(machine.root).rstrip("/")
    targets = set()
    for link in char.iterdir() if char.is_dir() else ():
        if link.is_symlink():
            target = os.readlink(link)
            targets.add(target.removeprefix(root) if root and target.startswith(root + "/") else target)
    return targets


def dev_char_step(ctx: SetupContext) -> SetupStep:
    """`/dev/char/MAJOR:MINOR` links to the NVIDIA nodes: under the systemd cgroup driver a
    `systemctl daemon-reload` rebuilds a container's device rules from those links, and without
    them the container loses its GPUs (NVIDIA/nvidia-container-toolkit issue 48)."""
    machine = ctx.machine
    command = list(DEV_CHAR_COMMAND)
    if not machine.is_host:
        command += [f"--dev-char-path={machine.path(DEV_CHAR)}", f"--driver-root={machine.root}"]
    title = "Link the NVIDIA device nodes in /dev/char"
    nodes = nvidia_nodes(machine)
    missing = [node for node in nodes if node not in linked_nodes(machine)]
    if nodes and not missing:
        done = f"{machine.path(DEV_CHAR)} links all {len(nodes)} NVIDIA device nodes: nothing to do"
        return SetupStep(title, (done,), order=25)

    def apply() -> None:
        _run(machine, command)

    why = "so containers keep their GPUs across `systemctl daemon-reload`"
    return SetupStep(title, (f"run: {' '.join(command)} ({why})",), apply, order=25)


def persistenced_step(ctx: SetupContext) -> SetupStep | None:
    socket = ctx.machine.path(PERSISTENCED_SOCKET)
    if not socket.exists():
        return None
    return SetupStep(
        "nvidia-persistenced socket",
        (
            f"nvidia-persistenced is running ({socket}): the generated spec mounts its socket into "
            "containers, and repo daemons see it at the same host path",
        ),
        order=35,
    )


def setup_steps(ctx: SetupContext) -> list[SetupStep]:
    if not toolkit_wanted(ctx):
        return [unspecified_step(ctx)] if has_nvidia_gpu(ctx.gpus) else []
    steps = [install_step(ctx)]
    if not is_wsl(ctx.machine):
        steps += [refresh_step(ctx), dev_char_step(ctx)]
    persistenced = persistenced_step(ctx)
    if persistenced is not None:
        steps.append(persistenced)
    return steps


def unspecified_step(ctx: SetupContext) -> SetupStep:
    """NVIDIA GPUs found while the toolkit is not wanted: no spec names them, so none is grantable.
    Said in the plan (and the dry run), with the command that makes them grantable."""
    machine = ctx.machine
    return SetupStep(
        "NVIDIA GPUs without a CDI spec",
        (
            f"skip: no {SPEC_FILE} is generated ({OPTION_FLAG}=false), so the NVIDIA GPUs found are not "
            f"grantable; to make them grantable: rdc machine setup {machine.name} {OPTION_FLAG}=auto",
        ),
        order=20,
    )


# --- the spec ---------------------------------------------------------------------------------------


def generate_command(machine: Machine) -> tuple[str, ...]:
    command = ["nvidia-ctk", "cdi", "generate", "--output={output}", "--format=yaml"]
    if is_wsl(machine):
        command.append("--mode=wsl")
    if not machine.is_host:
        # A machine whose root is a directory: find device nodes and driver files under it, so the
        # spec's hostPaths point there.
        command += [f"--dev-root={machine.root}", f"--driver-root={machine.root}"]
    return tuple(command)


def cdi_specs(ctx: SetupContext) -> list[CdiSpecFile]:
    choice = install_choice(ctx.options)
    if choice == "false":
        return []
    if toolkit_wanted(ctx):
        return [CdiSpecFile(SPEC_FILE, command=generate_command(ctx.machine))]
    if (ctx.machine.cdi_dir / SPEC_FILE).exists():
        return [CdiSpecFile(SPEC_FILE)]  # the GPU is gone: the core removes the stale spec
    return []
