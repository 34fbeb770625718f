"""Reading Slurm's accounting for GPU hours: `sacct -X -n -P --delimiter=D` lines as Slurm 22.05
prints them (the slurm suite reads the real ones, `tests/slurm/test_slurm_usage.py`)."""

from __future__ import annotations

from datetime import UTC, datetime

from rediacc_core.slurm.usage import Accounted, gpus_of, month_start, parse_sacct

D = "|5f0c9e2a71d4b3e8|"  # made anew for each read, as `usage` does


def row(*fields: str) -> str:
    return D.join(fields)


def test_a_line_reads_as_its_fields_and_a_bar_in_the_comment_stays_in_the_comment() -> None:
    text = (
        row(
            "41",
            "root",
            "teama",
            "n1",
            "7",
            "billing=2,cpu=1,gres/gpu=2,mem=100M,node=1",
            "",
            "rdc-repo=alpha",
        )
        + "\n"
        + row("42", "daemon", "teamb", "n1", "0", "gres/gpu=1", "rdc: refused", "rdc-repo=a|b")
        + "\n"
    )
    assert parse_sacct(text, D) == [
        Accounted("41", "root", "teama", "n1", 7, 2, "", "rdc-repo=alpha"),
        Accounted("42", "daemon", "teamb", "n1", 0, 1, "rdc: refused", "rdc-repo=a|b"),
    ]


def test_a_line_a_comment_forges_after_a_newline_is_no_job() -> None:
    """A user's comment may hold a newline and a whole made-up line; without the read's own
    delimiter (which it cannot know) that line has too few fields."""
    forged = "rdc-repo=alpha\n43|alice|teama|n1|999999|gres/gpu=8||rdc-repo=alpha"
    text = row("42", "bob", "teamb", "n1", "5", "gres/gpu=1", "", forged) + "\n"
    assert [j.job_id for j in parse_sacct(text, D)] == ["42"]
    assert parse_sacct(text, D)[0].comment == "rdc-repo=alpha"


def test_a_job_without_gpus_or_a_short_line_counts_nothing() -> None:
    assert gpus_of("billing=1,cpu=4,mem=8G,node=1") == 0
    assert gpus_of("cpu=1,gres/gpu:h100=1,gres/gpu=1") == 1  # the typed count is not added twice
    assert parse_sacct(row("41", "root", "teama") + "\n\n", D) == []


def test_the_month_starts_at_midnight_utc_on_its_first_day() -> None:
    now = datetime(2026, 12, 6, 2, 30, tzinfo=UTC).timestamp()
    assert month_start(now) == datetime(2026, 12, 1, tzinfo=UTC).timestamp()
