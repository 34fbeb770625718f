"""`rdc repo` for SSH machines: docker from the laptop (`rdc repo env`, `rdc repo tunnel`)."""

from __future__ import annotations

import click

from rediacc_core.cli.output import emit, note, output_option, table
from rediacc_core.config import Config
from rediacc_core.errors import ValidationError
from rediacc_core.machine import Machine
from rediacc_core.remote import tunnel
from rediacc_core.remote.dispatch import place_repo
from rediacc_core.repos import RepoRef, resolve_ref


@click.command("env")
@click.argument("ref", metavar="REPO")
def env(ref: str) -> None:
    """Use it as: eval "$(rdc repo env REPO)"; then docker and docker compose reach the repo's gate.

    \b
    Examples:
      eval "$(rdc repo env gpu-a@gpu-box)"
    """
    click.echo(f"export DOCKER_HOST={_docker_host(ref)}")


@click.command("tunnel")
@click.argument("ref", metavar="REPO", required=False)
@click.option("--close", is_flag=True, help="Close the tunnel instead.")
@click.option("--list", "listing", is_flag=True, help="List this config's tunnels and whether each answers.")
@output_option()
def tunnel_command(ref: str | None, close: bool, listing: bool, fmt: str) -> None:
    """A tunnel is found again only while it leads to the same machine (address and host key), root,
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
    from rediacc_core.runtime.layout import runtime_for

    machine, found = resolve_ref(ref, config)
    return runtime_for(machine, found).docker_host_url
