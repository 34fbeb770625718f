"""What a read skips, and when it does not: a state file's text that passed its schema once is not
checked again (a digest in an extended attribute), and the config's parsed document is kept beside
it for as long as the file is the same (its StatKey). Neither may ever hide a change or a broken
file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rediacc_core import files
from rediacc_core.config import Config, parsed_copy
from rediacc_core.errors import ValidationError

SCHEMA = "grants.schema.json"
VALID = {"schemaVersion": 1, "grants": []}
BROKEN = {"schemaVersion": 1, "grants": [{"repoId": "r"}]}


def write(path: Path, document: object) -> str:
    text = json.dumps(document)
    path.write_text(text)
    return text


def count_validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = files.schema_errors

    def counting(document: object, schema_name: str) -> list[str]:
        calls.append(schema_name)
        return real(document, schema_name)

    monkeypatch.setattr(files, "schema_errors", counting)
    return calls


def test_a_text_that_passed_is_not_validated_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_validations(monkeypatch)
    path = tmp_path / "grants.json"
    text = write(path, VALID)
    files.parse_json_checked(text, path, SCHEMA, "grants file")
    files.parse_json_checked(text, path, SCHEMA, "grants file")
    assert calls == [SCHEMA]
    assert os.getxattr(path, files.VALID_XATTR)


def test_a_changed_text_is_validated_and_a_broken_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "grants.json"
    files.parse_json_checked(write(path, VALID), path, SCHEMA, "grants file")
    stamp = os.getxattr(path, files.VALID_XATTR)
    broken = write(path, BROKEN)  # an edit in place keeps the old attribute: it names the old text
    assert os.getxattr(path, files.VALID_XATTR) == stamp
    with pytest.raises(ValidationError, match="does not match its schema"):
        files.parse_json_checked(broken, path, SCHEMA, "grants file")


def test_a_forged_or_foreign_attribute_is_no_pass(tmp_path: Path) -> None:
    path = tmp_path / "grants.json"
    broken = write(path, BROKEN)
    os.setxattr(path, files.VALID_XATTR, b"0" * 64)
    with pytest.raises(ValidationError):
        files.parse_json_checked(broken, path, SCHEMA, "grants file")


def test_a_file_that_cannot_keep_the_attribute_is_validated_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_validations(monkeypatch)

    def refuse(*args: object) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "setxattr", refuse)
    path = tmp_path / "grants.json"
    text = write(path, VALID)
    files.parse_json_checked(text, path, SCHEMA, "grants file")
    files.parse_json_checked(text, path, SCHEMA, "grants file")
    assert calls == [SCHEMA, SCHEMA]


def config_file(tmp_path: Path, root: Path) -> Path:
    path = tmp_path / "rdc.yaml"
    path.write_text(f"machines:\n  lab:\n    root: {root}\n")
    return path


def test_the_config_is_parsed_once_per_version_of_the_file(tmp_path: Path) -> None:
    path = config_file(tmp_path, tmp_path)
    assert Config.load(path).machine("lab").root == tmp_path
    kept = json.loads(parsed_copy(path).read_text())
    assert kept["document"] == {"machines": {"lab": {"root": str(tmp_path)}}}
    other = tmp_path / "other"
    other.mkdir()
    config_file(tmp_path, other)  # an edit: new size and mtime, so the kept copy is stale
    assert Config.load(path).machine("lab").root == other


def test_a_kept_copy_that_does_not_match_the_file_is_ignored(tmp_path: Path) -> None:
    path = config_file(tmp_path, tmp_path)
    Config.load(path)
    copy = parsed_copy(path)
    kept = json.loads(copy.read_text())
    copy.write_text(json.dumps({"key": [0, 0, 0, 0], "document": {"machines": {"evil": {"root": "/"}}}}))
    assert Config.load(path).names() == ["localhost", "lab"]
    copy.write_text("not json")
    assert Config.load(path).names() == ["localhost", "lab"]
    assert json.loads(copy.read_text())["key"] == kept["key"]  # rewritten from the file


def test_a_save_replaces_the_file_and_so_the_kept_copy(tmp_path: Path) -> None:
    path = config_file(tmp_path, tmp_path)
    config = Config.load(path)
    (tmp_path / "two").mkdir()
    config.add("lab2", tmp_path / "two")
    config.save()
    assert Config.load(path).names() == ["localhost", "lab", "lab2"]


def test_broken_yaml_is_still_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rdc.yaml"
    path.write_text("machines: [unclosed\n")
    with pytest.raises(ValidationError, match="is not valid YAML"):
        Config.load(path)


def test_a_kept_copy_someone_else_could_write_is_not_trusted(tmp_path: Path) -> None:
    path = config_file(tmp_path, tmp_path)
    Config.load(path)
    copy = parsed_copy(path)
    kept = json.loads(copy.read_text())
    forged = {"key": kept["key"], "document": {"machines": {"evil": {"root": str(tmp_path)}}}}
    copy.write_text(json.dumps(forged))
    os.chmod(copy, 0o666)  # as if planted in a shared directory, with the file's key copied
    assert Config.load(path).names() == ["localhost", "lab"]
