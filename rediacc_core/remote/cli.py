"""The commands that exist for SSH machines: host keys (add, trust, remove), `rdc machine install`,
and docker from the laptop (`rdc repo env`, `rdc repo tunnel`)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import click

from rediacc_core.cli.machine import TerminalProgress, machine
from rediacc_core.cli.output import emit, note, output_option, table
from rediacc_core.cli.repo import repo
from rediacc_core.config import Config
from rediacc_core.errors import RdcError, RefusedError, StateError, ToolError, ValidationError
from rediacc_core.machine import Machine
from rediacc_core.remote import install, protocol, tunnel
from rediacc_core.remote.address import SshAddress
from rediacc_core.remote.dispatch import agent_path, machine_versions, place_repo, ssh_machine
from rediacc_core.remote.ssh import CONNECT_TIMEOUT, SshMachine, classify, fingerprints, stderr_file
from rediacc_core.repos import RepoRef, resolve_ref


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


@machine.command("trust")
@click.argument("name")
@click.option("--fingerprint", metavar="SHA256:…", help="Accept the key only if it has this fingerprint.")
def trust(name: str, fingerprint: str | None) -> None:
    """Trust the host key the SSH machine NAME presents now (replacing one trusted before).

    \b
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


@machine.command("install")
@click.argument("name")
@click.option("--force", is_flag=True, help="Install even when the machine has the same versions already.")
def install_command(name: str, force: bool) -> None:
    """Install this client's rediacc-core and plugin versions on the SSH machine NAME (a venv there).

    \b
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
        and _installed_record(ssh, prefix) == digests
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
    argv = ssh.argv("sh -c " + shlex.quote(install.install_script(prefix, wanted, digests)))
    with stderr_file() as errfile:
        proc = subprocess.run(
            argv, input=archive, stdout=errfile, stderr=errfile, timeout=install.PIP_TIMEOUT
        )
        errfile.seek(0)
        output = errfile.read().decode(errors="replace")
    progress.finish(proc.returncode == 0)
    if proc.returncode == 255:
        raise classify(ssh, proc.returncode, output)
    if proc.returncode != 0:
        raise ToolError(
            f"installing on machine {name} failed (exit {proc.returncode}): {output.strip()[-800:]}",
            f"fix the cause on the machine (python3 3.11+, python3-venv, pip's index), then rerun "
            f"`rdc machine install {name}`",
        )
    got = machine_versions(config, target)
    if got != wanted:
        raise ToolError(f"machine {name} still reports {_pins(got)} after installing", "rerun with --force")
    note(f"Installed {_pins(wanted)} on {name} ({prefix}).")
    note(f"Next: rdc machine setup {name}")


def _installed_record(ssh: SshMachine, prefix: str) -> dict[str, str] | None:
    """What the last whole install on the machine recorded of its wheels (None: nothing known)."""
    argv = ssh.argv("cat " + shlex.quote(f"{prefix}/{install.RECORD}"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT + 20, check=False)
    if proc.returncode == 255:
        raise classify(ssh, proc.returncode, proc.stderr)
    try:
        found = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _runs(config: Config, target: Machine) -> dict[str, str] | None:
    """The versions the machine's agent runs; None when it has none (or other ones)."""
    try:
        return machine_versions(config, target)
    except StateError:
        return None


def _pins(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


# --- docker from the laptop -------------------------------------------------------------------------


@repo.command("env")
@click.argument("ref", metavar="REPO")
def env(ref: str) -> None:
    """Print `export DOCKER_HOST=…` for REPO's gate (over a tunnel for an SSH machine).

    Use it as: eval "$(rdc repo env REPO)"; then docker and docker compose reach the repo's gate.

    \b
    Examples:
      eval "$(rdc repo env gpu-a@gpu-box)"
    """
    click.echo(f"export DOCKER_HOST={_docker_host(ref)}")


@repo.command("tunnel")
@click.argument("ref", metavar="REPO", required=False)
@click.option("--close", is_flag=True, help="Close the tunnel instead.")
@click.option("--list", "listing", is_flag=True, help="List this config's tunnels and whether each answers.")
@output_option()
def tunnel_command(ref: str | None, close: bool, listing: bool, fmt: str) -> None:
    """Forward a local socket to REPO's gate on its SSH machine and print its DOCKER_HOST.

    A tunnel is found again only while it leads to the same machine (address and host key), root,
    repo (its id) and gate, and its gate answers; otherwise a new one replaces it.

    \b
    Examples:
      export DOCKER_HOST=$(rdc repo tunnel gpu-a@gpu-box)
      rdc repo tunnel --list
      rdc repo tunnel gpu-a@gpu-box --close
    """
    if listing:
        if ref is not None or close:
            raise ValidationError("--list takes no REPO and no --close", "run `rdc repo tunnel --list`")
        _list_tunnels(Config.load(), fmt)
        return
    if ref is None:
        raise ValidationError("name the repo to tunnel to", "e.g. rdc repo tunnel gpu-a@gpu-box, or --list")
    config, target, parsed = _remote_repo(ref)
    if close:
        closed = tunnel.close_tunnels(config, target.name, parsed)
        note(f"Closed the tunnel to {parsed}." if closed else f"No tunnel to {parsed} was open.")
        return
    opened = tunnel.open_tunnel(config, target, parsed)
    emit(opened.to_json(), fmt, lambda data: str(data["dockerHost"]))
    note(f"Close it with: rdc repo tunnel {parsed} --close")


def _list_tunnels(config: Config, fmt: str) -> None:
    rows = [
        {
            **t.to_json(),
            "machine": t.far.machine,
            "address": t.far.address,
            "root": t.far.root,
            "gate": t.far.gate,
            "state": tunnel.state(t),
        }
        for t in tunnel.tunnels(config)
    ]
    emit(
        rows,
        fmt,
        lambda data: table(
            ["REPO", "REPO ID", "STATE", "DOCKER HOST", "MACHINE", "GATE THERE"],
            [[r["repo"], r["repoId"], r["state"], r["dockerHost"], r["machine"], r["gate"]] for r in data],
        ),
    )
    if not rows and fmt == "table":
        note("No tunnels are open; `rdc repo env REPO` opens one.")


def _placed(config: Config, ref: str) -> str:
    """`ref` with `@machine` added when it names none and the repo is on one SSH machine only."""
    if RepoRef.parse(ref).machine is not None:
        return ref
    machine = place_repo(config, ref)
    return f"{ref}@{machine}" if machine is not None else ref


def _remote_repo(ref: str) -> tuple[Config, Machine, str]:
    config = Config.load()
    ref = _placed(config, ref)
    parsed = RepoRef.parse(ref)
    if parsed.machine is None or config.machine(parsed.machine).remote is None:
        raise ValidationError(
            f"{ref} is not a repo on a machine reached over SSH",
            f"for a local repo, DOCKER_HOST is its gate socket: rdc repo env {ref}",
        )
    return config, config.machine(parsed.machine), ref


def _docker_host(ref: str) -> str:
    config = Config.load()
    ref = _placed(config, ref)
    parsed = RepoRef.parse(ref)
    if parsed.machine is not None and config.machine(parsed.machine).remote is not None:
        return tunnel.open_tunnel(config, config.machine(parsed.machine), ref).docker_host
    from rediacc_core.runtime.lifecycle import runtime_for

    machine, found = resolve_ref(ref, config)
    return runtime_for(machine, found).docker_host_url
