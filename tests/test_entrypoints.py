"""`rdc --version` reads the plugins' entry points from the metadata files on `sys.path` itself; the
answer is `importlib.metadata.entry_points(group=...)`'s, entry for entry, in every layout a
distribution is installed in (a wheel's dist-info, an editable install, an egg, one name twice)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rediacc_core import entrypoints
from rediacc_core.entrypoints import EntryPoint, entry_points, from_metadata

GROUPS = ("rediacc", "console_scripts", "pytest11", "rediacc.demo", "nowhere")


@pytest.mark.parametrize("group", GROUPS)
def test_the_installed_distributions_read_as_importlib_metadata_reads_them(group: str) -> None:
    read = entrypoints._scan(group)  # this environment needs no fallback: the direct reading answers
    assert read == from_metadata(group)


def test_this_environments_plugins_are_found_with_their_versions() -> None:
    from importlib import metadata

    found = {ep.name: ep for ep in entry_points("rediacc")}
    assert found["slurm"] == EntryPoint(
        "slurm", "rediacc_core.slurm.plugin", "rediacc-core", metadata.version("rediacc-core")
    )


def dist(
    where: Path, directory: str, name: str, version: str, points: str | None, *, header: str = "METADATA"
) -> None:
    info = where / directory
    info.mkdir(parents=True)
    (info / header).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n\nBody: no\n"
    )
    if points is not None:
        (info / "entry_points.txt").write_text(points)


@pytest.fixture
def path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    entries: list[str] = []
    monkeypatch.setattr(sys, "path", entries)
    yield entries
    importlib.invalidate_caches()


def same_answer(group: str = "rediacc") -> list[EntryPoint]:
    importlib.invalidate_caches()
    read = entry_points(group)
    assert read == from_metadata(group)
    return read


def test_the_first_of_a_name_on_sys_path_wins_even_without_entry_points(
    tmp_path: Path, path: list[str]
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    dist(first, "Foo_Bar-1.0.dist-info", "Foo_Bar", "1.0", "[rediacc]\nfoo = foo_v1\n")
    dist(second, "foo.bar-2.0.dist-info", "foo.bar", "2.0", "[rediacc]\nfoo = foo_v2\nbar = bar_v2\n")
    dist(first, "quiet-1.0.dist-info", "quiet", "1.0", None)
    dist(second, "Quiet-9.0.dist-info", "Quiet", "9.0", "[rediacc]\nloud = loud\n")
    path += [str(tmp_path / "missing"), str(first), str(second)]
    assert same_answer() == [EntryPoint("foo", "foo_v1", "Foo_Bar", "1.0")]


def test_one_directory_lists_two_of_a_name_and_the_first_seen_wins(tmp_path: Path, path: list[str]) -> None:
    site = tmp_path / "site"
    dist(site, "a-1.dist-info", "a", "1", "[rediacc]\na = a1\n")
    dist(site, "b-1.dist-info", "b", "1", "[rediacc]\nb = b1\n")
    dist(site, "A-2.egg-info", "A", "2", "[rediacc]\na = a2\n", header="PKG-INFO")
    path.append(str(site))
    assert {ep.value for ep in same_answer()} <= {"a1", "a2", "b1"}


def test_sections_comments_and_extras_are_read_as_importlib_metadata_reads_them(
    tmp_path: Path, path: list[str]
) -> None:
    text = (
        "# a comment\n\n[console_scripts]\ntool = tool:main\n\n"
        "[rediacc]\n  spaced   =   pkg.mod : attr [extra]\n"
        "# another\nplain=pkg\n[rediacc.demo]\nlayout = kit:layout\n"
    )
    dist(tmp_path / "site", "pkg-0.3.dist-info", "pkg", "0.3", text)
    path.append(str(tmp_path / "site"))
    assert same_answer() == [
        EntryPoint("spaced", "pkg.mod : attr [extra]", "pkg", "0.3"),
        EntryPoint("plain", "pkg", "pkg", "0.3"),
    ]
    assert same_answer("rediacc.demo") == [EntryPoint("layout", "kit:layout", "pkg", "0.3")]


def test_an_egg_and_an_old_egg_info_file_are_read_too(tmp_path: Path, path: list[str]) -> None:
    egg = tmp_path / "eggy-1.5-py3.11.egg"
    dist(egg, "EGG-INFO", "eggy", "1.5", "[rediacc]\neggy = eggy.plugin\n", header="PKG-INFO")
    site = tmp_path / "site"
    site.mkdir()
    (site / "old-0.1.egg-info").write_text("Name: old\nVersion: 0.1\n")
    path += [str(egg), str(site)]
    assert same_answer() == [EntryPoint("eggy", "eggy.plugin", "eggy", "1.5")]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # importlib.metadata's, of the missing key
def test_a_header_with_no_version_is_none_as_importlib_metadata_says(tmp_path: Path, path: list[str]) -> None:
    info = tmp_path / "site" / "nover-1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Name: nover\n")
    (info / "entry_points.txt").write_text("[rediacc]\nnover = nover\n")
    path.append(str(tmp_path / "site"))
    assert same_answer() == [EntryPoint("nover", "nover", "nover", None)]


def test_a_zip_on_sys_path_is_read_by_importlib_metadata_itself(tmp_path: Path, path: list[str]) -> None:
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("zipped-1.0.dist-info/METADATA", "Name: zipped\nVersion: 1.0\n")
        out.writestr("zipped-1.0.dist-info/entry_points.txt", "[rediacc]\nzipped = zipped\n")
    path.append(str(archive))
    with pytest.raises(entrypoints._Unreadable):
        entrypoints._scan("rediacc")
    assert same_answer() == [EntryPoint("zipped", "zipped", "zipped", "1.0")]


def test_source_trees_first_on_sys_path_read_the_same(tmp_path: Path) -> None:
    """Run from the source trees (as `bench/cli_reads.py` does): each distribution is seen twice, its
    build's `*.egg-info` in the tree first, then the editable install's `*.dist-info`."""
    repo = Path(__file__).resolve().parents[1]
    trees = [repo, *(repo / "plugins" / name for name in ("nvidia", "rediacc_dri", "rediacc_amd"))]
    compare = (
        "from rediacc_core import entrypoints as e\n"
        "for group in ('rediacc', 'console_scripts', 'pytest11'):\n"
        "    assert e._scan(group) == e.from_metadata(group), group\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, trees))}
    done = subprocess.run(
        [sys.executable, "-c", compare], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
