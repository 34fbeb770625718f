"""Signals for the children tests start."""

from __future__ import annotations

import signal


def ctrl_c_reaches_it() -> None:
    """For `subprocess.Popen(preexec_fn=...)`: a child of a shell's background job starts with SIGINT
    ignored, and Python keeps it ignored; a test that sends Ctrl-C needs it to arrive as a terminal's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
