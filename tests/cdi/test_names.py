"""Qualified CDI names: vendor/class=device, with errors that name the offending part."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rediacc_core.cdi import (
    CdiNameError,
    QualifiedName,
    is_qualified_name,
    parse_qualified_name,
    validate_class,
    validate_device_name,
    validate_vendor,
)
from rediacc_core.errors import EXIT_VALIDATION, ValidationError


@pytest.mark.parametrize(
    ("text", "vendor", "cls", "name"),
    [
        ("nvidia.com/gpu=0", "nvidia.com", "gpu", "0"),
        ("nvidia.com/gpu=all", "nvidia.com", "gpu", "all"),
        ("nvidia.com/gpu=0:1", "nvidia.com", "gpu", "0:1"),
        (
            "nvidia.com/gpu=GPU-4b0e3c7a-9d21-5f6e-8a13-2c7d90e1f5ab",
            "nvidia.com",
            "gpu",
            "GPU-4b0e3c7a-9d21-5f6e-8a13-2c7d90e1f5ab",
        ),
        ("nvidia.com/gpu=MIG-7c1d2e3f-4a5b", "nvidia.com", "gpu", "MIG-7c1d2e3f-4a5b"),
        ("rediacc.io/dri=renderD128", "rediacc.io", "dri", "renderD128"),
        ("rediacc.io/amd=gpu0", "rediacc.io", "amd", "gpu0"),
        ("a/b=c", "a", "b", "c"),
        ("Vendor_1.example-x/Class.v2=dev_1.a-b:c", "Vendor_1.example-x", "Class.v2", "dev_1.a-b:c"),
    ],
)
def test_a_well_formed_name_splits_into_vendor_class_and_device(
    text: str, vendor: str, cls: str, name: str
) -> None:
    parsed = parse_qualified_name(text)
    assert parsed == QualifiedName(vendor, cls, name)
    assert str(parsed) == text
    assert parsed.kind == f"{vendor}/{cls}"
    assert is_qualified_name(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nvidia.com/gpu=", 'invalid CDI name "nvidia.com/gpu=": empty device name'),
        ("/gpu=0", '"/gpu=0" is a path, not a CDI name (expected vendor/class=device)'),
        ("nvidia.com/=0", 'invalid CDI name "nvidia.com/=0": empty class'),
        ("=0", 'invalid CDI name "=0": missing "/" between vendor and class'),
        ("x/=0", 'invalid CDI name "x/=0": empty class'),
        ("nvidia.com/gpu", 'invalid CDI name "nvidia.com/gpu": missing "=" before the device name'),
        ("gpu=0", 'invalid CDI name "gpu=0": missing "/" between vendor and class'),
        ("1abc/gpu=0", 'invalid vendor "1abc" in "1abc/gpu=0": must start with a letter'),
        ("vendor./gpu=0", 'invalid vendor "vendor." in "vendor./gpu=0": must end with a letter or digit'),
        ("ven dor/gpu=0", 'invalid vendor "ven dor" in "ven dor/gpu=0": contains \' \''),
        ("nvídia.com/gpu=0", 'invalid vendor "nvídia.com" in "nvídia.com/gpu=0": contains \'í\''),
        ("v.example/_gpu=0", 'invalid class "_gpu" in "v.example/_gpu=0": must start with a letter'),
        ("v.example/gpu:x=0", 'invalid class "gpu:x" in "v.example/gpu:x=0": contains \':\''),
        ("a/b/c=d", 'invalid class "b/c" in "a/b/c=d": contains \'/\''),
        (
            "v.example/gpu=-0",
            'invalid device name "-0" in "v.example/gpu=-0": must start with a letter or digit',
        ),
        (
            "v.example/gpu=0:",
            'invalid device name "0:" in "v.example/gpu=0:": must end with a letter or digit',
        ),
        ("v.example/gpu=a=b", 'invalid device name "a=b" in "v.example/gpu=a=b": contains \'=\''),
        ("v.example/gpu=a/b", 'invalid device name "a/b" in "v.example/gpu=a/b": contains \'/\''),
    ],
)
def test_a_malformed_name_is_refused_naming_the_offending_part(text: str, message: str) -> None:
    with pytest.raises(CdiNameError) as caught:
        parse_qualified_name(text)
    assert caught.value.what.startswith(message)
    assert not is_qualified_name(text)


def test_the_first_vendor_example_from_the_contract_reads_exactly() -> None:
    with pytest.raises(
        CdiNameError, match=r'^invalid vendor "1abc" in "1abc/gpu=0": must start with a letter$'
    ):
        parse_qualified_name("1abc/gpu=0")


def test_a_device_path_is_called_a_path_not_a_cdi_name() -> None:
    with pytest.raises(CdiNameError) as caught:
        parse_qualified_name("/dev/dri/renderD128")
    assert (
        caught.value.what == '"/dev/dri/renderD128" is a path, not a CDI name (expected vendor/class=device)'
    )
    assert "not its path" in caught.value.todo


def test_an_empty_string_is_not_a_cdi_name() -> None:
    with pytest.raises(CdiNameError, match="empty string is not a CDI name"):
        parse_qualified_name("")
    assert not is_qualified_name("")


def test_a_name_error_is_a_validation_error_saying_which_form_is_expected() -> None:
    with pytest.raises(ValidationError) as caught:
        parse_qualified_name("nvidia.com/gpu=")
    assert caught.value.exit_code == EXIT_VALIDATION == 2
    assert "vendor/class=device" in caught.value.todo


def test_odd_characters_are_shown_escaped_on_one_line() -> None:
    with pytest.raises(CdiNameError) as caught:
        parse_qualified_name('v.example/gpu=0\n"x')
    assert "\n" not in caught.value.what
    assert '"0\\n\\"x"' in caught.value.what


@pytest.mark.parametrize("text", ["", "/dev/nvidia0", "/", "nvidia.com/gpu", "nvidia.com/gpu=", "gpu0"])
def test_is_qualified_name_is_false_for_paths_empty_and_malformed_text(text: str) -> None:
    assert is_qualified_name(text) is False


def test_each_part_can_be_validated_on_its_own() -> None:
    validate_vendor("vendor.example")
    validate_class("gpu")
    validate_device_name("0:1")
    with pytest.raises(CdiNameError, match=r'^invalid vendor "9v": must start with a letter$'):
        validate_vendor("9v")
    with pytest.raises(CdiNameError, match=r'^invalid class "g\.": must end with a letter or digit$'):
        validate_class("g.")
    with pytest.raises(CdiNameError, match=r'^invalid device name "": must not be empty$'):
        validate_device_name("")


def test_device_names_may_start_with_a_digit_but_vendor_and_class_may_not() -> None:
    validate_device_name("0")
    with pytest.raises(CdiNameError):
        validate_vendor("0")
    with pytest.raises(CdiNameError):
        validate_class("0")


_labels = st.from_regex(r"\A[A-Za-z]([A-Za-z0-9_.-]{0,8}[A-Za-z0-9])?\Z")
_devices = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9_.:-]{0,8}[A-Za-z0-9])?\Z")


@given(vendor=_labels, cls=_labels, name=_devices)
def test_every_name_built_from_valid_parts_parses_back_to_those_parts(
    vendor: str, cls: str, name: str
) -> None:
    assert parse_qualified_name(f"{vendor}/{cls}={name}") == QualifiedName(vendor, cls, name)


@given(text=st.text(max_size=24))
def test_parsing_arbitrary_text_either_succeeds_or_raises_a_name_error(text: str) -> None:
    try:
        parsed = parse_qualified_name(text)
    except CdiNameError as exc:
        assert exc.what
        assert not is_qualified_name(text)
    else:
        assert str(parsed) == text
