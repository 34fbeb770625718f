"""`rdc repo slurm …`: which Slurm users and accounts may lease GPUs for a repo."""

from __future__ import annotations

import click

from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import emit, note, output_option
from rediacc_core.config import Config
from rediacc_core.errors import ValidationError
from rediacc_core.repos import resolve_ref


@click.group("slurm", cls=HintingGroup)
def slurm() -> None:
    """\b
    Examples:
      rdc repo slurm allow gpu-a --account team-a
      rdc repo slurm show gpu-a
    """


def _show(ref: str, accounts: tuple[str, ...], users: tuple[str, ...], fmt: str) -> None:
    emit(
        {"repo": ref, "accounts": list(accounts), "users": list(users)},
        fmt,
        lambda d: "\n".join(
            (
                f"REPO {d['repo']}",
                f"ACCOUNTS {', '.join(d['accounts']) or '-'}",
                f"USERS {', '.join(d['users']) or '-'}",
            )
        ),
    )


@click.command("allow")
@click.argument("ref", metavar="REPO")
@click.option("--account", "accounts", multiple=True, help="A Slurm account whose jobs may lease for REPO.")
@click.option("--user", "users", multiple=True, help="A Slurm user whose jobs may lease for REPO.")
@output_option("table", "json")
def allow(ref: str, accounts: tuple[str, ...], users: tuple[str, ...], fmt: str) -> None:
    """\b
    Examples:
      rdc repo slurm allow gpu-a --account team-a
      rdc repo slurm allow gpu-a --user alice --user bob
    """
    from rediacc_core.slurm.access import change_access

    if not accounts and not users:
        raise ValidationError("name an --account or a --user", "rdc repo slurm allow REPO --account ACCOUNT")
    machine, found = resolve_ref(ref, Config.load())
    now = change_access(machine, found.id, add_accounts=accounts, add_users=users)
    note(f"Jobs of {now.describe()} may lease GPUs for {found.ref}.")
    if fmt == "json":
        _show(found.ref, now.accounts, now.users, fmt)


@click.command("deny")
@click.argument("ref", metavar="REPO")
@click.option("--account", "accounts", multiple=True, help="An account to take off REPO's list.")
@click.option("--user", "users", multiple=True, help="A user to take off REPO's list.")
def deny(ref: str, accounts: tuple[str, ...], users: tuple[str, ...]) -> None:
    """\b
    Examples:
      rdc repo slurm deny gpu-a --user bob
    """
    from rediacc_core.slurm.access import change_access

    machine, found = resolve_ref(ref, Config.load())
    now = change_access(machine, found.id, remove_accounts=accounts, remove_users=users)
    note(f"Jobs of {now.describe()} may lease GPUs for {found.ref}.")


@click.command("show")
@click.argument("ref", metavar="REPO")
@output_option("table", "json")
def show(ref: str, fmt: str) -> None:
    """\b
    Examples:
      rdc repo slurm show gpu-a -o json
    """
    from rediacc_core.slurm.access import access_for

    machine, found = resolve_ref(ref, Config.load())
    held = access_for(machine, found.id)
    _show(found.ref, held.accounts, held.users, fmt)
