"""The console scripts, `rdc` and `rdc-agent`: light on imports, and the CLI's link to `remote/`.

`rdc`: a command for an SSH machine is forwarded before the CLI is imported. Forwarding needs only
the config and `ssh`; importing every command, click's whole tree and the plugins would add their
cost to each remote command for nothing (the agent loads them there). Everything else is
`rediacc_core.cli.main`.

`rdc-agent`: the machine side (`rediacc_core.remote.agent`, or with `--resident` the warm agent of
`rediacc_core.remote.resident`), which runs each command through the CLI's `main` handed in from
here (the remote package does not import the CLI).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import rediacc_core
from rediacc_core.commands import LOCAL_ONLY


def confirm_delete(ref: str) -> bool:
    """`rdc repo delete`'s question, asked here for a repo on an SSH machine (imported only then)."""
    from rediacc_core.cli.repo import confirm_delete as ask

    return ask(ref)


def main() -> None:
    try:
        _main()
    except KeyboardInterrupt:  # before a command began (its own Ctrl-C is the CLI's to report)
        sys.stderr.write("Interrupted.\n")
        sys.exit(130)


def _main() -> None:
    argv = sys.argv[1:]
    if not argv or argv[0] in LOCAL_ONLY:
        from rediacc_core.cli import main as cli_main

        cli_main(argv)
        return
    try:
        from rediacc_core.remote.dispatch import forward_if_remote

        forwarded = forward_if_remote(argv, confirm_delete)
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(130)
    except Exception:  # an unreadable config and the like: the CLI reports it the usual way
        forwarded = None
    if forwarded is not None:
        sys.exit(forwarded)
    from rediacc_core.cli import main as cli_main

    cli_main(argv)


def run_cli(argv: list[str]) -> None:
    # Imported per command, not at start: a `versions` request needs neither click nor the commands.
    from rediacc_core.cli import main as cli_main

    cli_main(argv)


def agent_main() -> None:
    if sys.argv[1:2] == ["--resident"]:  # as `remote.resident.start` runs it
        from rediacc_core.remote import resident

        resident.main(sys.argv[2:], run_cli, warm_every_module)
        return
    from rediacc_core.remote import agent

    agent.main(run_cli, start_resident)


def warm_every_module() -> None:
    """Import every module a command may import and load the plugins, so no child of the resident
    agent pays for an import (a child's own imports would not outlive it)."""
    import pkgutil

    from rediacc_core.plugins import get_plugins

    for module in pkgutil.walk_packages(rediacc_core.__path__, "rediacc_core."):
        if not module.name.startswith("rediacc_core.testing") and not module.name.endswith("__main__"):
            try:
                importlib.import_module(module.name)
            except ImportError:
                continue  # an optional extra not installed: the command that needs it says so
    get_plugins()


def start_resident(root: str, idle: float, agent_script: str) -> Path | None:
    # Imported only when a client asks for a resident agent.
    from rediacc_core.remote import resident

    return resident.start(root, idle, agent_script)
