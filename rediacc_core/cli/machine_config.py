"""`rdc machine config`: a machine's settings, shown with where each value comes from, and changed.

Apart from `rdc machine`'s other commands, whose module every `rdc machine …` line imports (the
group lives there): this one lists every setting in its help, so importing it reads the registry of
settings (`rediacc_core.settings`), which `rdc machine gpu list` does not need.
"""

from __future__ import annotations

import click

from rediacc_core.cli.machine import note_old_settings
from rediacc_core.cli.output import emit, note, output_option, table
from rediacc_core.config import Config
from rediacc_core.errors import ValidationError
from rediacc_core.settings import SETTINGS, change_settings, read_settings


def _settings_help(text: str | None) -> str:
    """The command's help with every setting listed: what it accepts and its default."""
    lines = ["\b", "Settings (default in brackets):"]
    lines += [f"  {s.name}={s.values}  [{s.default or 'none'}]" for s in SETTINGS.values()]
    return (text or "").replace("{settings}", "\n    ".join(lines))  # the docstring's indent


@click.command("config")
@click.argument("name")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Set a per-machine setting.")
@click.option("--unset", "unset", multiple=True, metavar="KEY", help="Go back to a setting's default.")
@output_option()
def configure(name: str, assignments: tuple[str, ...], unset: tuple[str, ...], fmt: str) -> None:
    """Settings are kept on the machine, in /etc/rediacc/settings.json under its root; running repo
    gates apply a change at their next request.

    {settings}

    \b
    Examples:
      rdc machine config localhost
      rdc machine config localhost --set legacy-visible-devices=translate
      rdc machine config localhost --unset legacy-visible-devices
    """
    config = Config.load()
    target = config.machine(name)
    changes: list[tuple[str, str | None]] = []
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise ValidationError(
                f"--set expects KEY=VALUE, got {assignment!r}",
                "for example: --set legacy-visible-devices=translate",
            )
        changes.append((key.strip(), value.strip()))
    changes += [(key, None) for key in unset]
    if changes:
        settings = change_settings(target, changes)
        if config.forget_old_settings(name):
            config.save()
            note(f"Removed the old settings of machine {name} from {config.path}: they live on the machine.")
        if fmt != "json":  # a change prints nothing on stdout unless asked, as every changing command
            for key, given in changes:
                now = settings.get(key, SETTINGS[key].default) or "none"
                note(f"Machine {name}: {key}={now}" + ("" if given is not None else " (its default)"))
            return
    else:
        note_old_settings(config, name)
        settings = read_settings(target)
    rows = [
        {
            "setting": s.name,
            "value": settings.get(s.name, s.default),
            "source": "machine" if s.name in settings else "default",
            "choices": list(s.choices),
        }
        for s in SETTINGS.values()
    ]
    emit(
        rows,
        fmt,
        lambda data: table(
            ["SETTING", "VALUE", "SOURCE", "ACCEPTS"],
            [
                [
                    r["setting"],
                    r["value"] or "-",
                    r["source"],
                    SETTINGS[r["setting"]].values,
                ]
                for r in data
            ],
        ),
    )


configure.help = _settings_help(configure.help)
