"""What one machine setting is, and the registry that holds every setting by its name.

Each room that acts on a machine setting declares it, in a module of its own that reads no
settings file: the name, the values it takes (`choices`, or a `check` with the `form` shown for
it), the default and the help `rdc machine config` prints. `rediacc_core.settings`, which reads
and writes the file on the machine, collects them into one registry with `registry()`, by an
explicit, ordered list (the order `machine config` lists them in). The list sits on the floor of
the file's reader: every process that reads the file, whatever it imported, sees every setting
(an unknown name in the file is an error), and no module of a lower floor names a higher one.

This module is on the ground floor so that every room below the reader may declare with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Setting:
    """A per-machine setting, with the values it accepts.

    A setting has either `choices`, or a `check` that returns why a value is wrong (None when it is
    right) for free-form values such as comma-separated lists.
    """

    name: str
    choices: tuple[str, ...]
    default: str
    help: str
    check: Callable[[str], str | None] | None = None
    form: str = ""  # the shape of a free-form value, as `machine config` shows it (`1-16`, `DIR[:ro],…`)

    @property
    def values(self) -> str:
        """What the setting accepts, in a few characters: its choices, or the shape of its value."""
        return "|".join(self.choices) if self.choices else self.form


def registry(*declared: Setting) -> Mapping[str, Setting]:
    """`declared` by name, in their order, read-only; a name declared twice is refused.

    Two rooms declaring one name would leave one of them reading a value it did not define.
    """
    found: dict[str, Setting] = {}
    for setting in declared:
        if setting.name in found:
            raise ValueError(f"machine setting {setting.name!r} is declared twice")
        found[setting.name] = setting
    return MappingProxyType(found)
