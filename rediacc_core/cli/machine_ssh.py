"""`rdc machine` for SSH machines: host keys (what `add` and `remove` do for one, and `trust`), and
`rdc machine install`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rediacc_core.cli.output import TerminalProgress, note
from rediacc_core.config import Config
from rediacc_core.errors import RdcError, RefusedError, StateError, ToolError, ValidationError
from rediacc_core.machine import Machine
from rediacc_core.remote import install, protocol, tunnel
from rediacc_core.remote.address import SshAddress
from rediacc_core.remote.agentcall import agent_path, machine_versions, ssh_machine
from rediacc_core.remote.ssh import SshMachine, classify, fingerprints


def add_ssh_machine(
    config: Config, name: str, ssh: str, identity: str | None, root: str | None, accept: bool
) -> None:
    added = config.add_ssh(name, SshAddress.parse(ssh, identity), root)
    config.save()
    key_file = added.remote.identity if added.remote is not None else None
    if key_file and not Path(key_file).is_file():
        note(f"Warning: the key file {key_file} does not exist (yet); ssh will not log in without it.")
    tunnel.close_tunnels(config, name)  # left from an earlier machine of this name, if any
    note(f"Added machine {name} at {added.remote}, root {added.root} there.")
    target = ssh_machine(config, added)
    try:
        keys = target.scan_keys()
    except RdcError as exc:
        note(f"Warning: could not fetch its host key now: {exc.what}")
        note(f"When it is reachable, run: rdc machine trust {name}")
        return
    prints = ", ".join(fingerprints(keys))
    if accept:
        target.remember_keys(keys)
        note(f"Trusted its host key: {prints}.")
        note(f"Next: rdc machine install {name}")
    else:
        note(f"Its host key is not trusted yet: {prints}.")
        note(f"If that is the machine's fingerprint, accept it: rdc machine trust {name}")


def forget_ssh_machine(config: Config, target: Machine) -> None:
    # A tunnel is a way into a repo: none outlives the machine it was opened to.
    closed = tunnel.close_tunnels(config, target.name)
    if closed:
        note(f"Closed {closed} tunnel(s) to machine {target.name}.")
    ssh = ssh_machine(config, target)
    ssh.close_master()
    ssh.forget_keys()


def _ssh_target(name: str) -> tuple[Config, Machine, SshMachine]:
    config = Config.load()
    target = config.machine(name)
    if target.remote is None:
        raise ValidationError(f"machine {name} is local, not reached over SSH", "nothing to do for it")
    return config, target, ssh_machine(config, target)


@click.command("trust")
@click.argument("name")
@click.option("--fingerprint", metavar="SHA256:…", help="Accept the key only if it has this fingerprint.")
def trust(name: str, fingerprint: str | None) -> None:
    """\b
    Examples:
      rdc machine trust gpu-box
      rdc machine trust gpu-box --fingerprint SHA256:…
    """
    config, _target, ssh = _ssh_target(name)
    keys = ssh.scan_keys()
    prints = fingerprints(keys)
    if fingerprint is not None and not any(p.split()[0] == fingerprint for p in prints):
        raise RefusedError(
            f"machine {name} presents {', '.join(prints)}, not {fingerprint}; nothing was trusted",
            "check the fingerprint with the machine's operator (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub)",
        )
    old = fingerprints(ssh.trusted_keys()) if ssh.trusted_keys() else []
    if old and set(old) != set(prints) and fingerprint is None:
        _confirm_replacement(name, old, prints)
    ssh.close_master()  # a master made under the old key must not outlive it, nor its tunnels
    tunnel.close_tunnels(config, name)
    ssh.remember_keys(keys)
    if old and set(old) != set(prints):
        note(f"Replaced the old host key of {name} ({', '.join(old)}).")
    note(f"Trusted the host key of {name}: {', '.join(prints)}.")


def on_terminal() -> bool:
    return sys.stdin.isatty()


def _confirm_replacement(name: str, old: list[str], new: list[str]) -> None:
    """A changed key replaces the trusted one only when the user names it, or types yes here."""
    what = (
        f"the host key of machine {name} has CHANGED: trusted {', '.join(old)}, "
        f"presented now {', '.join(new)}"
    )
    given = new[0].split()[0] if new else "SHA256:…"
    if not on_terminal():
        raise RefusedError(
            f"{what}; nothing was trusted",
            f"check the new fingerprint with the machine's operator, then: rdc machine trust {name} "
            f"--fingerprint {given}",
        )
    note(f"Warning: {what}.")
    if click.prompt("Type yes to trust the new key", default="", show_default=False, err=True) != "yes":
        raise RefusedError(
            f"the new host key of {name} was not trusted", f"rdc machine trust {name} --fingerprint {given}"
        )


@click.command("install")
@click.argument("name")
@click.option("--force", is_flag=True, help="Install even when the machine has the same versions already.")
def install_command(name: str, force: bool) -> None:
    """\b
    Examples:
      rdc machine install gpu-box
      rdc machine install gpu-box --force
    """
    config, target, ssh = _ssh_target(name)
    wanted = protocol.versions()
    prefix = agent_path(target).removesuffix("/bin/rdc-agent")
    progress = TerminalProgress()
    progress.start(f"Comparing {name}'s installation with this client's")
    digests = install.fingerprints(list(wanted))
    same = (
        not force
        and install.UNKNOWN not in digests.values()
        and install.installed_record(ssh, prefix) == digests
        and _runs(config, target) == wanted
    )
    progress.finish(True)
    if same:
        note(f"Machine {name} already has exactly these wheels ({_pins(wanted)}); nothing to do.")
        return
    if not ssh.trusted_keys():
        raise StateError(
            f"the host key of machine {name} is not trusted yet", f"run `rdc machine trust {name}`"
        )
    progress.start(f"Building wheels of {_pins(wanted)}", slow=True)
    with install.scratch_dir() as scratch:
        wheels = install.build_wheels(list(wanted), Path(scratch))
        archive = install.wheelhouse_tar(wheels)
    progress.finish(True)
    progress.start(f"Installing them into {prefix} on {name}", slow=True)
    code, output = install.run_install(ssh, install.install_script(prefix, wanted, digests), archive)
    progress.finish(code == 0)
    if code == 255:
        raise classify(ssh, code, output)
    if code != 0:
        raise ToolError(
            f"installing on machine {name} failed (exit {code}): {output.strip()[-800:]}",
            f"fix the cause on the machine (python3 3.11+, python3-venv, pip's index), then rerun "
            f"`rdc machine install {name}`",
        )
    got = machine_versions(config, target)
    if got != wanted:
        raise ToolError(f"machine {name} still reports {_pins(got)} after installing", "rerun with --force")
    note(f"Installed {_pins(wanted)} on {name} ({prefix}).")
    note(f"Next: rdc machine setup {name}")


def _runs(config: Config, target: Machine) -> dict[str, str] | None:
    """The versions the machine's agent runs; None when it has none (or other ones)."""
    try:
        return machine_versions(config, target)
    except StateError:
        return None


def _pins(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())
