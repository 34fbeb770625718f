"""Who may lease GPUs for a repo through Slurm: per repo, the Slurm accounts and users allowed.

Kept in `<root>/etc/rediacc/slurm/access.json` (schema-checked on every read, replaced atomically
under the machine's state lock). The prolog admits a job for a repo only when the job's user
(`SLURM_JOB_USER`) or account (`SLURM_JOB_ACCOUNT`) is listed for it: the repo a job names is a
request, never an authority, so naming a repo in a job is not enough to lease for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rediacc_core.files import atomic_write_json, parse_json_checked
from rediacc_core.machine import Machine
from rediacc_core.statelock import state_lock

SCHEMA = "slurm-access.schema.json"
SCHEMA_VERSION = 1
PATH = "/etc/rediacc/slurm/access.json"


@dataclass(frozen=True)
class Access:
    """The Slurm accounts and users allowed to lease for one repo."""

    accounts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    def admits(self, user: str | None, account: str | None) -> bool:
        return (user is not None and user in self.users) or (account is not None and account in self.accounts)

    def describe(self) -> str:
        parts = [f"account {a}" for a in self.accounts] + [f"user {u}" for u in self.users]
        return ", ".join(parts) if parts else "nobody"


def read_access(machine: Machine) -> dict[str, Access]:
    """Every repo's allowance, by repo id; {} when none was ever given."""
    path = machine.path(PATH)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    document = parse_json_checked(text, path, SCHEMA, "Slurm access file")
    return {
        repo_id: Access(tuple(entry["accounts"]), tuple(entry["users"]))
        for repo_id, entry in document["repos"].items()
    }


def access_for(machine: Machine, repo_id: str) -> Access:
    return read_access(machine).get(repo_id, Access())


def change_access(
    machine: Machine,
    repo_id: str,
    *,
    add_accounts: Iterable[str] = (),
    add_users: Iterable[str] = (),
    remove_accounts: Iterable[str] = (),
    remove_users: Iterable[str] = (),
    lock_timeout: float | None = None,
) -> Access:
    """Add and remove allowed accounts and users of one repo; returns what holds now."""
    with state_lock(machine, lock_timeout):
        table = read_access(machine)
        held = table.get(repo_id, Access())
        gone_a, gone_u = set(remove_accounts), set(remove_users)
        accounts = [a for a in dict.fromkeys([*held.accounts, *add_accounts]) if a not in gone_a]
        users = [u for u in dict.fromkeys([*held.users, *add_users]) if u not in gone_u]
        now = Access(tuple(accounts), tuple(users))
        if now.accounts or now.users:
            table[repo_id] = now
        else:
            table.pop(repo_id, None)
        atomic_write_json(
            machine.path(PATH),
            {
                "schemaVersion": SCHEMA_VERSION,
                "repos": {
                    rid: {"accounts": list(a.accounts), "users": list(a.users)}
                    for rid, a in sorted(table.items())
                },
            },
        )
    return now
