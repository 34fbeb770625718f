"""Errors that reach the user: each carries what went wrong, what to do next, and an exit code.

Exit codes follow the Rediacc convention so scripts can branch on them.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_GENERAL = 1
EXIT_VALIDATION = 2
EXIT_REFUSED = 4
EXIT_NOT_FOUND = 5
EXIT_AMBIGUOUS = 11
EXIT_STATE = 12
EXIT_TOOL = 14
EXIT_BUSY = 15


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
