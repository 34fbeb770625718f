"""Where an SSH machine is: `[USER@]HOST[:PORT]`, an optional identity file and agent path."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rediacc_core.errors import ValidationError

# A host name, an IPv4 address, or an IPv6 address in brackets (`[::1]:2222`).
_ADDRESS = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]{0,31})@)?"
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252}))"
    r"(?::(?P<port>[0-9]{1,5}))?$"
)

DEFAULT_PREFIX = "/opt/rediacc"


@dataclass(frozen=True)
class SshAddress:
    host: str
    user: str | None = None
    port: int | None = None
    identity: str | None = None

    @classmethod
    def parse(cls, text: str, identity: str | None = None) -> SshAddress:
        match = _ADDRESS.match(text.strip())
        port = int(match["port"]) if match and match["port"] else None
        if match is None or (port is not None and not 0 < port < 65536):
            raise ValidationError(
                f"invalid SSH address {text!r}",
                "write it as [USER@]HOST[:PORT], e.g. root@gpu1.example.com:2222 or a Host of ~/.ssh/config",
            )
        return cls(match["v6"] or match["host"], match["user"], port, identity)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{host}{port}"
