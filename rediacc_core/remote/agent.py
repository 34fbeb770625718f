"""`rdc-agent`: the machine side of an SSH machine, run by `ssh` for a command (not a daemon).

It reads one request line, checks that the client runs the same rediacc-core and plugin versions,
then runs the same `rdc` command line against this machine's root and streams what the command
writes back as protocol lines. The command takes the machine's own locks and writes atomically, so a
connection that drops mid-way leaves the machine with the whole change or none of it. A request that
asks for a resident agent (`"resident": {"idle": seconds}`) also starts one (`resident.py`) and
says where it listens, so the client's next commands skip this start-up.

The command line is handed in (`run_cli`, the CLI's `main`) by the console script,
`rediacc_core.launcher.agent_main`: this package does not import the CLI. So is the resident's
start (`start_resident`): the resident serves its requests through this module, never the reverse.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rediacc_core.remote import protocol

EXIT_PROTOCOL = 3

# Start a resident agent for a machine root (`resident.start`): where it listens, or None.
StartResident = Callable[[str, float, str], "Path | None"]


class _Chunks(io.TextIOBase):
    """A text stream whose writes become `{"out": …}` or `{"err": …}` lines as they happen."""

    def __init__(self, sender: protocol.Sender, key: str, tty: bool = False) -> None:
        self.sender = sender
        self.key = key
        self.tty = tty  # the client's stream is a terminal: progress may be shown on it

    def write(self, text: str | bytes) -> int:
        # click.echo writes bytes to a stream it cannot prove is text.
        if text:
            self.sender.send({self.key: text.decode(errors="replace") if isinstance(text, bytes) else text})
        return len(text)

    def isatty(self) -> bool:
        return self.tty

    encoding = "utf-8"


def main(run_cli: Callable[[list[str]], None], start_resident: StartResident | None = None) -> None:
    # The protocol gets its own copy of stdout; fd 1 then points at stderr, so a tool the command runs
    # that writes straight to the fd cannot corrupt the stream (the client shows it as text).
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sender = protocol.Sender(channel)
    # The session's end must not kill a command half way: it completes, and its answer is dropped.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    line = sys.stdin.buffer.readline()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # daemons the command starts must not hold the channel's input
    try:
        message = protocol.decode(line)
    except protocol.ProtocolError:
        sender.send({"err": "rdc-agent: the request is not protocol JSON\n"})
        sender.send({"exit": EXIT_PROTOCOL})
        return
    sender.send({"exit": serve(message, sender, run_cli=run_cli, start_resident=start_resident)})


def serve(
    message: dict[str, Any],
    sender: protocol.Sender,
    *,
    run_cli: Callable[[list[str]], None],
    mine: dict[str, str] | None = None,
    start_resident: StartResident | None = None,
) -> int:
    """Check one request and run it through `run_cli` (the CLI's `main`); `mine` are the versions
    installed here (a resident agent knows them already). A request for a resident agent starts
    one through `start_resident` (a resident, which has none, serves the request alone)."""
    if message.get("v") != protocol.VERSION:
        sender.send({"skew": {"protocol": protocol.VERSION}})
        return EXIT_PROTOCOL
    mine = protocol.versions() if mine is None else mine
    if message.get("op") == "versions":
        sender.send({"versions": mine})
        return 0
    if message.get("versions") != mine:
        sender.send({"skew": mine})
        return EXIT_PROTOCOL
    argv, name, root = message.get("argv"), message.get("machine"), message.get("root")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        return _bad(sender, "argv")
    if not (isinstance(name, str) and isinstance(root, str) and root.startswith("/")):
        return _bad(sender, "machine/root")
    wanted = message.get("resident")
    if (
        start_resident is not None
        and isinstance(wanted, dict)
        and isinstance(wanted.get("idle"), int | float)
    ):
        where = start_resident(root, float(wanted["idle"]), sys.argv[0])
        if where is not None:
            sender.send({"resident": str(where)})
    sender.send({"started": os.getpid()})  # from here on, a lost connection means "dropped mid-way"
    columns = message.get("columns")
    if isinstance(columns, int) and columns > 0:
        os.environ["COLUMNS"] = str(columns)
    return run_command(argv, name, root, sender, tty=message.get("tty") is True, run_cli=run_cli)


def _bad(sender: protocol.Sender, what: str) -> int:
    sender.send({"err": f"rdc-agent: bad request ({what})\n"})
    return EXIT_PROTOCOL


def run_command(
    argv: list[str],
    name: str,
    root: str,
    sender: protocol.Sender,
    tty: bool = False,
    *,
    run_cli: Callable[[list[str]], None],
) -> int:
    """`rdc ARGV` through `run_cli` (the CLI's `main`), against machine NAME at ROOT."""
    from rediacc_core import commands, config

    config.pin_machine(name, root)
    sender.stop_when_gone = commands.only_reads(argv)
    sys.stdout, sys.stderr = _Chunks(sender, "out"), _Chunks(sender, "err", tty)
    try:
        run_cli(argv)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BrokenPipeError:  # a read-only command whose client left
        return 141
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    return 0
