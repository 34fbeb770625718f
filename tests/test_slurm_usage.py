"""Reading Slurm's accounting for GPU hours: `sacct -X -n -P` lines as Slurm 22.05 prints them (the
slurm suite reads the real ones, `tests/slurm/test_slurm_usage.py`)."""

from __future__ import annotations

from datetime import UTC, datetime

from rediacc_core.slurm.usage import Accounted, gpus_of, month_start, parse_sacct


def test_a_line_reads_as_its_fields_and_a_bar_in_the_comment_stays_in_the_comment() -> None:
    text = (
        "41|root|teama|n1|7|billing=2,cpu=1,gres/gpu=2,mem=100M,node=1||rdc-repo=alpha\n"
        "42|daemon|teamb|n1|0|billing=1,cpu=1,gres/gpu=1,mem=100M,node=1|rdc: refused|rdc-repo=a|b\n"
    )
    assert parse_sacct(text) == [
        Accounted("41", "root", "teama", "n1", 7, 2, "", "rdc-repo=alpha"),
        Accounted("42", "daemon", "teamb", "n1", 0, 1, "rdc: refused", "rdc-repo=a|b"),
    ]


def test_a_job_without_gpus_or_a_short_line_counts_nothing() -> None:
    assert gpus_of("billing=1,cpu=4,mem=8G,node=1") == 0
    assert gpus_of("cpu=1,gres/gpu:h100=1,gres/gpu=1") == 1  # the typed count is not added twice
    assert parse_sacct("41|root|teama\n\n") == []


def test_the_month_starts_at_midnight_utc_on_its_first_day() -> None:
    now = datetime(2026, 12, 6, 2, 30, tzinfo=UTC).timestamp()
    assert month_start(now) == datetime(2026, 12, 1, tzinfo=UTC).timestamp()
