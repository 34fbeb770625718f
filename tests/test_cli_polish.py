"""The CLI for people and scripts: ids back from every change (`-o json`), repo STATUS, `--version`
with the plugins, shell completion tested in a real bash, tables that fit the terminal, and an
Examples section in every command's help."""

from __future__ import annotations

import json
import os
import pty
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from grants_kit import GPU, build_machine, registered_box

from rediacc_core.cli import cli
from rediacc_core.cli.groups import walk
from rediacc_core.cli.output import table
from rediacc_core.config import Config
from rediacc_core.machine import Machine
from rediacc_core.remote.address import SshAddress
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.layout import runtime_for
from rediacc_core.testing import FakeMachine


@pytest.fixture
def box(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> Iterator[Machine]:
    with registered_box(make_fake_machine("box")) as machine:
        yield machine


def ok(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


# --- ids back for scripts ----------------------------------------------------------------------------


def test_create_fork_grant_and_revoke_print_ids_as_json(box: Machine) -> None:
    created = json.loads(ok("repo", "create", "alpha@box", "-o", "json").stdout)
    (alpha,) = RepoStore(box).list()
    assert (created["ref"], created["id"], created["grants"]) == ("alpha@box", alpha.id, [])

    forked = json.loads(ok("repo", "fork", "alpha@box", "--tag", "exp", "-o", "json").stdout)
    assert forked["ref"] == "alpha:exp@box" and forked["forkedFrom"] == alpha.id
    assert forked["id"] == RepoStore(box).get_by_label("alpha:exp").id

    granted = json.loads(ok("repo", "gpu", "grant", "alpha@box", "--device", f"{GPU}=0", "-o", "json").stdout)
    assert granted["repoId"] == alpha.id
    assert [(g["device"], g["exclusive"], g["changed"]) for g in granted["grants"]] == [
        (f"{GPU}=0", False, True)
    ]

    revoked = json.loads(
        ok("repo", "gpu", "revoke", "alpha@box", "--device", f"{GPU}=0", "-o", "json").stdout
    )
    assert [g["device"] for g in revoked["revoked"]] == [f"{GPU}=0"]


def test_changes_print_nothing_on_stdout_by_default(box: Machine) -> None:
    result = ok("repo", "create", "alpha@box")
    assert result.stdout == "" and "Created repo alpha@box" in result.stderr


# --- repo STATUS -------------------------------------------------------------------------------------


def test_repo_list_shows_whether_each_repo_is_up(box: Machine) -> None:
    """`up` only when every part runs (a repo on an existing daemon has one: its gate), `partial`
    while some do (a gate alone, left by a `repo up` cut short, is not a repo that is up)."""
    ok("repo", "create", "alpha@box", "--docker-host", "unix:///run/other/docker.sock")
    ok("repo", "create", "beta@box")
    ok("repo", "create", "gamma@box")
    ok("repo", "create", "delta@box")
    store = RepoStore(box)
    # A live process in the pidfiles, as `rdc repo up` leaves them (this test's own pid).
    for label in ("alpha", "delta"):
        gate = runtime_for(box, store.get_by_label(label))
        gate.gate_pidfile.parent.mkdir(parents=True)
        gate.gate_pidfile.write_text(f"{os.getpid()}\n")
    gamma = runtime_for(box, store.get_by_label("gamma"))
    gamma.daemon_paths.pidfile.parent.mkdir(parents=True)
    gamma.daemon_paths.pidfile.write_text(f"{os.getpid()}\n")

    rows = json.loads(ok("repo", "list", "box", "-o", "json").stdout)

    assert [(r["ref"], r["status"]) for r in rows] == [
        ("alpha@box", "up"),
        ("beta@box", "down"),
        ("delta@box", "partial"),
        ("gamma@box", "partial"),
    ]
    lines = ok("repo", "list", "box").stdout.splitlines()
    assert lines[0].split()[:2] == ["REPO", "STATUS"]
    assert [line.split()[1] for line in lines[1:]] == ["up", "down", "partial", "partial"]


# --- --version ---------------------------------------------------------------------------------------


def test_version_lists_each_plugin_with_its_version(box: Machine) -> None:
    lines = ok("--version").stdout.splitlines()
    assert lines[0].startswith("rdc ")
    assert any(line.startswith("plugin fakevendor ") for line in lines[1:]), lines


# --- completion, in a real bash ------------------------------------------------------------------------


def complete(words: list[str], env: dict[str, str]) -> list[str]:
    """What bash offers after `words` (the last one being typed), with `rdc completion bash` sourced."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("needs bash")
    quoted = " ".join(f"'{word}'" for word in words)
    script = (
        "source <(rdc completion bash) || exit 3\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}\n"
        '_rdc_completion rdc\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        [bash, "--norc", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "PATH": path, "REDIACC_LOAD_PLUGINS": ""},
    )
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]


@pytest.fixture
def completion_env(box: Machine, rdc_config: Path) -> dict[str, str]:
    ok("repo", "create", "alpha@box")
    ok("repo", "create", "beta:exp@box")
    return {"REDIACC_CONFIG": str(rdc_config), "OTHER_ROOT": str(rdc_config.parent / "other-root")}


def test_bash_completes_commands(completion_env: dict[str, str]) -> None:
    assert complete(["rdc", "ma"], completion_env) == ["machine"]
    assert "grant" in complete(["rdc", "repo", "gpu", ""], completion_env)


def test_bash_completes_machines(completion_env: dict[str, str]) -> None:
    assert complete(["rdc", "machine", "setup", ""], completion_env) == ["box", "localhost"]
    assert complete(["rdc", "repo", "list", "b"], completion_env) == ["box"]


def test_bash_completes_repos_and_new_repo_machines(completion_env: dict[str, str]) -> None:
    assert complete(["rdc", "repo", "up", ""], completion_env) == ["alpha@box", "beta:exp@box"]
    assert complete(["rdc", "repo", "delete", "al"], completion_env) == ["alpha@box"]
    assert complete(["rdc", "repo", "create", "gamma@"], completion_env) == ["gamma@box", "gamma@localhost"]


def test_bash_completes_the_cdi_names_of_the_repos_machine(completion_env: dict[str, str]) -> None:
    offered = complete(["rdc", "repo", "gpu", "grant", "alpha@box", "--device", "vendor"], completion_env)
    assert f"{GPU}=0" in offered and f"{GPU}=all" in offered
    assert all(name.startswith("vendor") for name in offered)
    # Only the repo's own machine: a second machine's names are not offered.
    other = build_machine(FakeMachine(Path(completion_env["OTHER_ROOT"]), name="other"))
    spec = other.cdi_dir / "vendor-example.yaml"
    spec.write_text(spec.read_text().replace("vendor.example/gpu", "vendor.example/tpu"))
    ok("machine", "add", "other", "--root", str(other.root))
    offered = complete(["rdc", "repo", "gpu", "grant", "alpha@box", "--device", "vendor"], completion_env)
    assert offered and not any("tpu" in name for name in offered)


def complete_line(line: str, env: dict[str, str]) -> list[str]:
    """What bash, given `line` with the cursor at its end, leaves in the word being typed for each
    answer: readline keeps the word up to its last break character (`@`, `=`, `:`) and inserts the
    answer after it."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("needs bash")
    script = (
        "source <(rdc completion bash) || exit 3\n"
        f"COMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=(); COMP_CWORD=0\n"
        '_rdc_completion rdc\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        [bash, "--norc", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "PATH": path, "REDIACC_LOAD_PLUGINS": ""},
    )
    assert result.returncode == 0, result.stderr
    word = "" if line.endswith(" ") else line.split()[-1]
    cut = max(word.rfind(char) for char in "@=:")
    return [word[: cut + 1] + answer for answer in result.stdout.splitlines() if answer]


def test_bash_completes_whole_words_across_its_break_characters(completion_env: dict[str, str]) -> None:
    assert complete_line("rdc repo up alpha@", completion_env) == ["alpha@box"]
    assert complete_line("rdc repo up beta:", completion_env) == ["beta:exp@box"]
    assert complete_line("rdc repo create gamma@lo", completion_env) == ["gamma@localhost"]
    offered = complete_line(f"rdc repo gpu grant alpha@box --device {GPU}=", completion_env)
    assert f"{GPU}=0" in offered and f"{GPU}=all" in offered


def test_bash_completes_a_repos_own_grants_for_revoke(completion_env: dict[str, str]) -> None:
    ok("repo", "gpu", "grant", "alpha@box", "--device", f"{GPU}=0")
    assert complete_line("rdc repo gpu revoke alpha@box --device ", completion_env) == [f"{GPU}=0"]
    assert complete_line("rdc repo gpu confirm alpha@box --device ", completion_env) == [f"{GPU}=0"]
    assert complete_line("rdc repo gpu revoke beta:exp@box --device ", completion_env) == []


def test_bash_completes_setting_keys_and_their_choices(completion_env: dict[str, str]) -> None:
    assert complete_line("rdc machine config box --set lease-e", completion_env) == ["lease-end="]
    assert complete_line("rdc machine config box --set lease-end=", completion_env) == [
        "lease-end=keep",
        "lease-end=stop",
    ]
    assert complete_line("rdc machine config box --unset image-st", completion_env) == ["image-store"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_are_printed(shell: str) -> None:
    assert "_RDC_COMPLETE" in ok("completion", shell).stdout


# --- tables that fit ---------------------------------------------------------------------------------


def test_a_table_wider_than_the_width_wraps_its_widest_column() -> None:
    text = table(["NAME", "NAMES"], [["a", "one, two, three, four, five, six, seven"]], width=30)
    assert all(len(line) <= 30 for line in text.splitlines())
    assert text.splitlines() == [
        "NAME  NAMES",
        "a     one, two, three, four,",
        "      five, six, seven",
    ]
    assert table(["NAME", "NAMES"], [["a", "one, two"]], width=None).splitlines()[1] == "a     one, two"


MIG = "nvidia.com/gpu=MIG-00000001-0000-0000-0000-000000000001"


@pytest.mark.parametrize("width", [40, 60, 80])
def test_a_narrow_table_never_breaks_a_cdi_name_or_a_pci_address(width: int) -> None:
    rows = [
        ["1", "NVIDIA H100 80GB HBM3", "590.48.01", "0000:65:00.0", f"nvidia.com/gpu=1, {MIG}"],
        [
            "2",
            "AMD Instinct MI210",
            "-",
            "00000000:83:00.0",
            "rediacc.io/amd=gpu1, rediacc.io/dri=renderD130",
        ],
    ]
    text = table(["GPU", "NAME", "DRIVER", "PCI BUS ID", "CDI NAMES"], rows, width=width)
    for whole in (
        MIG,
        "nvidia.com/gpu=1",
        "0000:65:00.0",
        "00000000:83:00.0",
        "rediacc.io/dri=renderD130",
        "590.48.01",
    ):
        assert any(whole in line for line in text.splitlines()), (whole, text)


def test_a_card_two_plugins_report_is_one_row_with_both_names() -> None:
    from rediacc_core.cli.machine_gpu import render_gpu_table

    amd = {"index": 1, "name": "AMD Instinct MI210", "vendor": "amd", "memoryMiB": 65536}
    inventory = {
        "machine": "box",
        "platform": "native",
        "gpus": [
            {
                "name": "AMD GPU 1002:740f",
                "vendor": "amd",
                "pciBusId": "0000:83:00.0",
                "cdiNames": ["rediacc.io/dri=renderD130"],
            },
            {**amd, "pciBusId": "0000:83:00.0", "cdiNames": ["rediacc.io/amd=gpu1"]},
        ],
        "devices": [],
    }
    rows = [line for line in render_gpu_table(inventory, {}).splitlines() if "0000:83:00.0" in line]
    assert len(rows) == 1
    assert rows[0].split()[:2] == ["1", "AMD"]
    assert rows[0].endswith("rediacc.io/amd=gpu1, rediacc.io/dri=renderD130")


def test_gpu_list_fits_80_columns_leaving_what_is_said_elsewhere_to_wide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rediacc_core.cli import machine_gpu as machine

    uuid = "nvidia.com/gpu=GPU-8f3a0c2e-5b1d-4e7a-9c60-1d2e3f405a61"
    card = {
        "index": 1, "name": "NVIDIA H100 80GB HBM3", "vendor": "nvidia", "driverVersion": "590.48.01",
        "memoryMiB": 81559, "pciBusId": "0000:65:00.0", "cdiNames": ["nvidia.com/gpu=1", uuid],
        "partitions": [
            {"index": 0, "profile": "3g.40gb", "memoryMiB": 40192, "cdiNames": ["nvidia.com/gpu=1:0", MIG]}
        ],
    }  # fmt: skip
    amd = {
        "index": 0,
        "name": "AMD Instinct MI210",
        "vendor": "amd",
        "memoryMiB": 65536,
        "pciBusId": "0000:03:00.0",
        "cdiNames": ["rediacc.io/amd=gpu0", "rediacc.io/dri=renderD129"],
    }
    names = ["nvidia.com/gpu=1", uuid, "nvidia.com/gpu=1:0", MIG, "rediacc.io/amd=gpu0"]
    inventory = {
        "machine": "box",
        "platform": "native",
        "generatedAt": "2026-12-04T20:00:00Z",
        "gpus": [card, amd],
        "devices": [{"name": n, "spec": "rediacc-example.yaml"} for n in names],
    }
    grants = {MIG: ["alpha (exclusive)"]}
    wide = machine.render_gpu_table(inventory, grants)
    assert max(len(line) for line in wide.splitlines()) > 80 and uuid in wide and "590.48.01" in wide

    monkeypatch.setattr(machine, "fitted_width", lambda: 80)
    narrow = machine.render_gpu_table(inventory, grants)
    assert max(len(line) for line in narrow.splitlines()[1:]) <= 80, narrow  # the first: the machine's line
    for name in names:  # every CDI name still there, whole: UUID forms in the CDI DEVICE table
        assert any(line.startswith(name) for line in narrow.splitlines()) or name in narrow, name
    assert narrow.endswith("(fitted to the terminal: -o wide shows every column)")


def _on_a_terminal(args: list[str], env: dict[str, str], columns: int) -> str:
    """`rdc ARGS` with stdout on a pseudo-terminal `columns` wide; its output."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rediacc_core.cli", *args],
        stdout=child,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env, "COLUMNS": str(columns), "REDIACC_LOAD_PLUGINS": ""},
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(60)
    os.close(main)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_on_a_terminal_tables_fit_its_width_and_wide_does_not_wrap(completion_env: dict[str, str]) -> None:
    fitted = _on_a_terminal(["repo", "list", "box"], completion_env, 70)
    assert fitted.splitlines()[0].split()[:2] == ["REPO", "STATUS"]
    assert max(len(line) for line in fitted.splitlines()) <= 70

    wide = _on_a_terminal(["repo", "list", "box", "-o", "wide"], completion_env, 70)
    assert max(len(line) for line in wide.splitlines()) > 70
    assert len(wide.splitlines()) == 3


# --- help ----------------------------------------------------------------------------------------------


def _commands(group: click.Group) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every visible command of the tree, the lazily loaded ones too."""
    for path, command in walk(group, click.Context(group, info_name="rdc")):
        if not command.hidden and not any(_hidden_parent(group, path[:n]) for n in range(1, len(path))):
            yield path, command


def _hidden_parent(group: click.Group, path: tuple[str, ...]) -> bool:
    command: click.Command | None = group
    for name in path:
        assert isinstance(command, click.Group)
        command = command.get_command(click.Context(command), name)
    return command is not None and command.hidden


@pytest.mark.parametrize("path", [path for path, _ in _commands(cli)], ids=" ".join)
def test_every_command_has_an_examples_section(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="rdc")
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output
    examples = result.output.split("Examples:", 1)[1]
    assert f"rdc {' '.join(path)}" in examples, "an example of this very command"


def test_completion_offers_ssh_machines_but_fetches_nothing_from_them(
    completion_env: dict[str, str], rdc_config: Path
) -> None:
    config = Config.load()
    config.add_ssh("far", SshAddress.parse("root@far.invalid"))
    config.save()

    assert complete(["rdc", "machine", "setup", ""], completion_env) == ["box", "far", "localhost"]
    assert complete(["rdc", "repo", "up", ""], completion_env) == ["alpha@box", "beta:exp@box"]
    assert complete(["rdc", "repo", "gpu", "grant", "a@far", "--device", ""], completion_env) == []


def test_machine_config_help_lists_every_setting_with_what_it_accepts() -> None:
    from rediacc_core.settings import SETTINGS

    text = ok("machine", "config", "--help").stdout
    for setting in SETTINGS.values():
        assert f"{setting.name}={setting.values}  [{setting.default or 'none'}]" in text
        assert setting.values, f"{setting.name} says nothing of what it accepts"
    assert "gate-workers=1-16" in text


@pytest.mark.parametrize(
    "path", ["/nonexistent", os.environ.get("PATH", "")], ids=["rdc-not-on-path", "as-is"]
)
def test_the_demos_next_commands_run_as_printed(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    import shlex

    from rediacc_core.cli.demo import runnable_rdc

    monkeypatch.setenv("PATH", path)
    printed = runnable_rdc()
    ran = subprocess.run([*shlex.split(printed), "--version"], capture_output=True, text=True, env=os.environ)
    assert ran.returncode == 0, (printed, ran.stderr)
    assert ran.stdout.startswith("rdc ")


def test_the_demos_next_commands_run_from_the_users_shell_after_tox(monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    from rediacc_core.cli.demo import runnable_rdc

    # While tox runs, its env's bin is on PATH; the shell the user types the next command in has none.
    monkeypatch.setenv("TOX_ENV_DIR", str(Path(sys.executable).parent.parent))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    printed = runnable_rdc()
    assert printed != "rdc"
    ran = subprocess.run(
        [*shlex.split(printed), "--version"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert ran.returncode == 0, (printed, ran.stderr)
