"""Errors that reach the user: each carries what went wrong, what to do next, and an exit code.

Exit codes follow the Rediacc convention so scripts can branch on them.
"""

from __future__ import annotations

import errno

EXIT_OK = 0
EXIT_GENERAL = 1
EXIT_VALIDATION = 2
EXIT_REFUSED = 4
EXIT_NOT_FOUND = 5
EXIT_AMBIGUOUS = 11
EXIT_STATE = 12
EXIT_PERMISSION = 13
EXIT_TOOL = 14
EXIT_BUSY = 15
EXIT_INTERRUPTED = 130  # the shell's convention for a command stopped by Ctrl-C (128 + SIGINT)


class RdcError(Exception):
    """An error with a message for the user and the next step to take."""

    exit_code: int = EXIT_GENERAL

    def __init__(self, what: str, todo: str = "", *, exit_code: int | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.todo = todo
        if exit_code is not None:
            self.exit_code = exit_code


class ValidationError(RdcError):
    exit_code = EXIT_VALIDATION


class RefusedError(RdcError):
    exit_code = EXIT_REFUSED


class NotFoundError(RdcError):
    exit_code = EXIT_NOT_FOUND


class AmbiguousError(RdcError):
    exit_code = EXIT_AMBIGUOUS


class StateError(RdcError):
    exit_code = EXIT_STATE


class ToolError(RdcError):
    """An outside command (package manager, vendor tool, dockerd) failed."""

    exit_code = EXIT_TOOL


class BusyError(RdcError):
    exit_code = EXIT_BUSY


class PermissionDeniedError(RdcError):
    exit_code = EXIT_PERMISSION


def from_os_error(exc: OSError) -> RdcError:
    """The user-facing error for an operating-system error that no command expected.

    Most are the operator's situation, not a bug: running without root, a file where a directory
    should be, a read-only or full disk. The path comes from the exception itself.
    """
    path = exc.filename
    where = f": {path}" if path is not None else ""
    if exc.filename2 is not None:
        where += f" -> {exc.filename2}"
    # A rename names its source first; what is in the way is its target.
    in_the_way = exc.filename2 if exc.filename2 is not None else path
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
        target = path if path is not None else "the file"
        return PermissionDeniedError(
            f"{reason.lower()}{where}",
            "rerun the command as root (sudo rdc …), or ask the owner of "
            f"{target} for access"
            + ("; the filesystem is mounted read-only" if exc.errno == errno.EROFS else ""),
        )
    if isinstance(exc, FileExistsError):
        return StateError(
            f"{in_the_way} already exists where rdc needs to create it",
            f"move {in_the_way} aside (or remove it if it is not needed), then rerun the command",
        )
    if isinstance(exc, IsADirectoryError):
        return StateError(
            f"{in_the_way} is a directory where rdc expects a file",
            f"move the directory {in_the_way} aside, then rerun the command",
        )
    if isinstance(exc, NotADirectoryError):
        return StateError(
            f"a file is in the way of a directory rdc needs{where}",
            "move that file aside, then rerun the command",
        )
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(
            f"no such file or directory{where}",
            "check that the path exists (a machine's root may have been moved or removed)",
        )
    if exc.errno == errno.ENOSPC:
        return RdcError(f"no space left on the device{where}", "free some space, then rerun the command")
    return RdcError(
        f"{reason}{where} (errno {exc.errno})",
        "check the path and rerun; RDC_DEBUG=1 shows where it happened",
    )
