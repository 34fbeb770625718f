"""`rdc plugins`: which plugins loaded, from which distribution, and what they implement."""

from __future__ import annotations

from dataclasses import asdict

import click

from rediacc_core.cli.output import emit, output_option, table


@click.command("plugins")
@output_option()
def plugins(fmt: str) -> None:
    """\b
    Examples:
      rdc plugins
      rdc plugins -o json
    """
    from rediacc_core.plugins import get_plugins  # here: `rdc --help` lists this command without loading

    rows = [
        {**asdict(info), "hooks": list(info.hooks), "loaded": info.error is None}
        for info in get_plugins().infos
    ]
    emit(
        rows,
        fmt,
        lambda data: (
            table(
                ["NAME", "DISTRIBUTION", "VERSION", "HOOKS", "STATUS"],
                [
                    [
                        r["name"],
                        r["distribution"],
                        r["version"],
                        ", ".join(r["hooks"]) or None,
                        "loaded" if r["loaded"] else f"failed: {r['error']}",
                    ]
                    for r in data
                ],
            )
            if data
            else "No plugins loaded."
        ),
    )
