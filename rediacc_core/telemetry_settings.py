"""The machine setting telemetry reads: its own declaration (`rediacc_core.setting`).

`telemetry.py` writes dcgm-exporter's job mapping where this setting says, and reads the settings
file to learn where: the file's reader cannot import it, so the setting is declared here, in a
module that reads nothing, on the reader's floor (`tests/test_layers.py`).
"""

from __future__ import annotations

from rediacc_core.setting import Setting


def _check_directory(value: str) -> str | None:
    if value and (not value.startswith("/") or any(c in value for c in ",:\n")):
        return f"{value!r} is not an absolute directory path (or empty, for off)"
    return None


DCGM_JOB_MAPPING_DIR = Setting(
    "dcgm-job-mapping-dir",
    (),
    "",
    "the directory dcgm-exporter reads job mappings from (its --hpc-job-mapping-dir): rdc writes "
    "one file per GPU there naming the repos granted it, at every grant change; empty = off",
    _check_directory,
    form="DIR",
)
