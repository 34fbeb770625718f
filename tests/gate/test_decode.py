"""The gate reads a request as the daemon will: routing, content type and Go's JSON decoding."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rediacc_core.gate.wire.decode import (
    BadRequest,
    canonicalise,
    check_content_type,
    copied,
    encode,
    fold,
    parse_json,
    parse_target,
)
from rediacc_core.gate.wire.decode_fields import StructRef

CREATE = StructRef("CreateRequest")


def canon(text: str | bytes, shape: StructRef = CREATE) -> Any:
    return canonicalise(text.encode() if isinstance(text, str) else text, shape)


# --- request targets -------------------------------------------------------------------------


class TestParseTarget:
    def test_plain_path_and_query(self) -> None:
        target = parse_target("/containers/create?name=web&platform=")
        assert target.path == "/containers/create"
        assert target.version is None
        assert target.query == {"name": ("web",), "platform": ("",)}

    def test_version_prefix_is_stripped_and_compared_numerically(self) -> None:
        target = parse_target("/v1.045/containers/create")
        assert target.path == "/containers/create"
        assert target.version == "1.045"
        assert target.api_version == (1, 45)

    @pytest.mark.parametrize("version", ["1", "1..45", "1.4.5", ".45", "1."])
    def test_version_must_be_major_dot_minor(self, version: str) -> None:
        with pytest.raises(BadRequest, match="API version"):
            parse_target(f"/v{version}/containers/create")

    def test_url_encoded_path_is_matched_decoded(self) -> None:
        assert parse_target("/containers%2Fcreate").path == "/containers/create"
        assert parse_target("/v1.45/%63ontainers/create").path == "/containers/create"

    def test_absolute_form_is_routed_by_its_path(self) -> None:
        target = parse_target("http://docker/v1.45/containers/create?name=x")
        assert target.path == "/containers/create"
        assert target.query == {"name": ("x",)}

    @pytest.mark.parametrize(
        "raw",
        [
            "//containers/create",
            "/containers//create",
            "/containers/./create",
            "/containers/x/../create",
            "/containers%2F%2Fcreate",
            "/containers/%2e%2e/create",
            "/containers/create/.",
            "http://docker",
            "containers/create",
            "*",
            "/containers/create#frag",
            "/containers/%zzcreate",
            "/containers/create?a=1;b=2",
            "/containers/create\x00",
        ],
    )
    def test_unclean_or_invalid_targets_are_bad_requests(self, raw: str) -> None:
        with pytest.raises(BadRequest):
            parse_target(raw)

    def test_query_values_are_decoded_and_repeated(self) -> None:
        assert parse_target("/x?a=1&a=%2F&b=c+d").query == {"a": ("1", "/"), "b": ("c d",)}


class TestContentType:
    @pytest.mark.parametrize(
        "value",
        [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            'application/json;a="b;c"',
        ],
    )
    def test_json_with_parameters_is_accepted(self, value: str) -> None:
        check_content_type(value, b"{}")

    def test_no_type_is_fine_only_without_a_body(self) -> None:
        check_content_type(None, b"")
        with pytest.raises(BadRequest):
            check_content_type(None, b"{}")

    @pytest.mark.parametrize(
        "value", ["text/plain", "application/json-seq", "application/json; charset", "json"]
    )
    def test_other_types_are_refused(self, value: str) -> None:
        with pytest.raises(BadRequest):
            check_content_type(value, b"{}")


# --- Go's JSON, canonicalised ----------------------------------------------------------------


class TestKeyFolding:
    def test_keys_match_fields_case_insensitively(self) -> None:
        body = canon('{"hostconfig": {"PRIVILEGED": true, "binds": ["/a:/b"]}, "image": "bb"}')
        assert body == {"HostConfig": {"Privileged": True, "Binds": ["/a:/b"]}, "Image": "bb"}

    def test_long_s_and_kelvin_fold_like_go(self) -> None:
        # U+017F folds to s and U+212A to k under Go's simple folding; str.lower() would miss both.
        body = canon('{"HostConfig": {"\u017fhm\u017fize": 5, "\u212aernelMemory": 5}}')
        assert body["HostConfig"] == {"ShmSize": 5, "KernelMemory": 5}
        body = canon('{"Ho\u017ftConfig": {"Runtime": "x"}}')
        assert body == {"HostConfig": {"Runtime": "x"}}
        assert fold("Ho\u017ftConfig") == fold("HOSTCONFIG")

    def test_dotless_i_is_not_an_i(self) -> None:
        # Go does not fold U+0131 onto i: the key is unknown, and unknown non-empty
        # HostConfig fields are refused.
        with pytest.raises(BadRequest, match="unknown field"):
            canon('{"HostConfig": {"Pr\u0131vileged": true}}')

    @pytest.mark.parametrize(
        "body",
        [
            '{"HostConfig": {"Privileged": false, "Privileged": true}}',
            '{"HostConfig": {"Privileged": false, "privileged": true}}',
            '{"HostConfig": {"Privileged": false}, "hostConfig": {"Privileged": true}}',
            '{"HostConfig": {"Binds": []}, "HOſTCONFIG": {"Privileged": true}}',
            '{"Labels": {"a": "1", "a": "2"}}',
            '{"Healthcheck": {"Test": [], "test": ["x"]}}',
        ],
    )
    def test_duplicate_and_fold_variant_keys_are_ambiguous(self, body: str) -> None:
        with pytest.raises(BadRequest, match=r"ambiguous|duplicate"):
            canon(body)

    def test_map_keys_differing_in_case_are_distinct_keys(self) -> None:
        assert canon('{"Labels": {"a": "1", "A": "2"}}') == {"Labels": {"a": "1", "A": "2"}}


class TestGrammar:
    @pytest.mark.parametrize(
        "raw",
        [
            b'{"Image": "a"} {"HostConfig": {"Privileged": true}}',
            b'{"Image": "a"}x',
            b"\xef\xbb\xbf{}",
            b'{"Image": "\xff"}',
            b'{"Image": "\xed\xa0\x80"}',
            b'{"Image": "\\ud800"}',
            b'{"Image": NaN}',
            b'{"StopTimeout": Infinity}',
            b'{"Image": "a",}',
            b"{'Image': 'a'}",
            b'{"Image": "a\tb"}',
            b"",
            b"   ",
            b'{"StopTimeout": 01}',
        ],
    )
    def test_what_go_refuses_or_would_guess_at_is_refused(self, raw: bytes) -> None:
        with pytest.raises(BadRequest):
            canon(raw)

    def test_trailing_whitespace_is_fine(self) -> None:
        assert canon(b' {"Image": "a"} \r\n\t') == {"Image": "a"}

    def test_deep_nesting_is_refused_not_crashed(self) -> None:
        with pytest.raises(BadRequest):
            canon('{"Healthcheck": ' + "[" * 5000 + "]" * 5000 + "}")

    def test_null_stays_null(self) -> None:
        assert canon('{"HostConfig": null, "Env": null}') == {"HostConfig": None, "Env": None}


class TestTypes:
    @pytest.mark.parametrize(
        "body",
        [
            '{"HostConfig": {"Privileged": "true"}}',
            '{"HostConfig": {"Privileged": 1}}',
            '{"HostConfig": {"Devices": {"PathOnHost": "/dev/x"}}}',
            '{"HostConfig": {"DeviceRequests": [{"Count": 1.5}]}}',
            '{"HostConfig": {"DeviceRequests": [{"Count": 1e2}]}}',
            '{"HostConfig": {"DeviceRequests": [{"Count": 9223372036854775808}]}}',
            '{"HostConfig": {"BlkioWeight": 65536}}',
            '{"HostConfig": {"BlkioWeight": -1}}',
            '{"HostConfig": {"Mounts": [{"TmpfsOptions": {"Mode": 4294967296}}]}}',
            '{"HostConfig": []}',
            '{"Env": "A=1"}',
        ],
    )
    def test_wrong_types_and_out_of_range_numbers_are_refused(self, body: str) -> None:
        with pytest.raises(BadRequest):
            canon(body)

    def test_integers_in_range_pass(self) -> None:
        body = canon('{"HostConfig": {"DeviceRequests": [{"Count": -1}], "Memory": 9223372036854775807}}')
        assert body["HostConfig"]["DeviceRequests"] == [{"Count": -1}]

    @pytest.mark.parametrize(
        "struct",
        ["HostConfig", "DeviceRequests", "Devices", "Mounts", "VolumeOptions", "DriverConfig", "BindOptions"],
    )
    def test_unknown_non_empty_fields_in_hardware_structs_are_refused(self, struct: str) -> None:
        shapes: dict[str, dict[str, Any]] = {
            "HostConfig": {"NewThing": "x", "Image": "bb"},
            "DeviceRequests": {"DeviceRequests": [{"Driver": "cdi", "NewThing": ["x"]}]},
            "Devices": {"Devices": [{"PathOnHost": "a=b/c", "NewThing": 1}]},
            "Mounts": {"Mounts": [{"Type": "bind", "NewThing": True}]},
            "VolumeOptions": {"Mounts": [{"VolumeOptions": {"NewThing": {"a": 1}}}]},
            "DriverConfig": {
                "Mounts": [{"VolumeOptions": {"DriverConfig": {"Name": "local", "Opts": {"a": "b"}}}}]
            },
            "BindOptions": {"Mounts": [{"BindOptions": {"NewThing": "rshared"}}]},
        }
        body = {"HostConfig": shapes[struct]}
        with pytest.raises(BadRequest, match="unknown field"):
            canon(json.dumps(body))

    def test_unknown_empty_fields_in_hardware_structs_pass_unchanged(self) -> None:
        assert canon('{"HostConfig": {"NewThing": null, "Other": []}}') == {
            "HostConfig": {"NewThing": None, "Other": []}
        }

    def test_unknown_fields_elsewhere_pass_unchanged(self) -> None:
        body = canon('{"Image": "bb", "SomethingNew": {"x": [1, 2.5, "y"]}}')
        assert body == {"Image": "bb", "SomethingNew": {"x": [1, 2.5, "y"]}}

    def test_hostconfig_fields_at_the_top_level_are_refused(self) -> None:
        # Daemons read them there (a deprecated embedded HostConfig; dockerd 26.1 still does when
        # the body has no HostConfig of its own).
        with pytest.raises(BadRequest, match="inside HostConfig"):
            canon('{"Image": "bb", "privileged": true}')
        with pytest.raises(BadRequest, match="inside HostConfig"):
            canon('{"Image": "bb", "Devices": [{"PathOnHost": "/dev/x"}]}')
        assert canon('{"Image": "bb", "Privileged": false}') == {"Image": "bb", "Privileged": False}
        assert canon('{"Image": "bb", "MaskedPaths": null}') == {"Image": "bb", "MaskedPaths": None}

    @pytest.mark.parametrize(
        "body",
        [
            '{"Image": "bb", "MaskedPaths": [], "ReadonlyPaths": []}',
            '{"Image": "bb", "maskedpaths": []}',
            '{"Image": "bb", "HostConfig": null, "ReadonlyPaths": []}',
            '{"Image": "bb", "Sysctls": {}}',
        ],
    )
    def test_an_empty_list_or_object_at_the_top_level_is_refused_too(self, body: str) -> None:
        # To the daemon `"MaskedPaths": []` is not "nothing": it unmasks /proc (systempaths=unconfined).
        with pytest.raises(BadRequest, match="inside HostConfig"):
            canon(body)


class TestEncoding:
    def test_canonical_body_is_compact_json_with_go_names(self) -> None:
        body = canon('{ "hostconfig" : { "privileged" : false }, "image" : "bb\u00e9" }')
        assert encode(body) == '{"HostConfig":{"Privileged":false},"Image":"bbé"}'.encode()

    def test_numbers_keep_their_value(self) -> None:
        body = canon('{"X": 12345678901234567890123, "Y": 0.1, "Z": -0, "W": 1E+2}')
        assert json.loads(encode(body)) == {"X": 12345678901234567890123, "Y": 0.1, "Z": 0, "W": 100.0}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=24,
)


@given(JSON_VALUES)
@settings(max_examples=300, deadline=None)
def test_the_fast_encoding_reads_back_as_the_standard_librarys(value: Any) -> None:
    """orjson writes the canonical body; Go must read from it what the standard library would have written
    (integers of any size included: those orjson refuses go to the standard library)."""
    assert json.loads(encode(value)) == json.loads(json.dumps(value, ensure_ascii=False))


def _containers(value: Any) -> list[int]:
    """The ids of every dict and list in a tree."""
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in _containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in _containers(v))]
    return []


@given(JSON_VALUES)
@settings(max_examples=300, deadline=None)
def test_a_copy_for_the_plugins_is_equal_and_shares_nothing_that_can_change(value: Any) -> None:
    """Plugins are shown `copied(body)`: whatever they do to it never reaches the body forwarded
    (integers beyond 64 bits, which orjson refuses, included)."""
    copy = copied(value)
    assert copy == value and json.dumps(copy) == json.dumps(value)
    assert not set(_containers(copy)) & set(_containers(value))


# --- properties ------------------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8))
LEAVES = {
    "Privileged": st.one_of(st.none(), st.booleans()),
    "Runtime": st.one_of(st.none(), st.sampled_from(["", "runc", "other"])),
    "Binds": st.lists(st.sampled_from(["/mnt/data:/d", "vol:/v", "/dev:/dev"]), max_size=2),
    "DeviceCgroupRules": st.lists(st.just("c 1:3 rwm"), max_size=1),
    "CapAdd": st.lists(st.sampled_from(["NET_ADMIN", "SYS_ADMIN"]), max_size=2),
    "Memory": st.integers(0, 2**40),
}
HOST_CONFIGS = st.fixed_dictionaries({}, optional=LEAVES)
CREATE_BODIES = st.fixed_dictionaries(
    {"Image": st.just("bb")},
    optional={
        "Env": st.lists(st.text(max_size=6).map(lambda s: "A=" + s), max_size=3),
        "Labels": st.dictionaries(st.text(min_size=1, max_size=4), st.text(max_size=4), max_size=3),
        "HostConfig": st.one_of(st.none(), HOST_CONFIGS),
        "Unknown": st.dictionaries(st.sampled_from(["a", "b", "c"]), SCALARS, max_size=3),
    },
)


@given(CREATE_BODIES)
@settings(max_examples=200, deadline=None)
def test_canonical_form_is_a_fixed_point(body: dict[str, Any]) -> None:
    once = canon(json.dumps(body))
    assert canon(encode(once)) == once
    assert encode(canon(encode(once))) == encode(once)


def _variant(draw: st.DrawFn, name: str) -> str:
    out = []
    for char in name:
        choices = [char.lower(), char.upper()]
        if char in "sS":
            choices.append("\u017f")
        if char in "kK":
            choices.append("\u212a")
        out.append(draw(st.sampled_from(choices)))
    return "".join(out)


@st.composite
def spelled_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A body whose field names are random Go-equivalent spellings, and the body as Go reads it."""
    body: dict[str, Any] = draw(CREATE_BODIES)
    host = body.get("HostConfig")
    pieces = [f"{json.dumps(_variant(draw, 'Image'))}: {json.dumps(body['Image'])}"]
    if host is not None or "HostConfig" in body:
        inner = ", ".join(
            f"{json.dumps(_variant(draw, k))}: {json.dumps(v)}" for k, v in (host or {}).items()
        )
        pieces.append(
            f"{json.dumps(_variant(draw, 'HostConfig'))}: " + ("null" if host is None else "{" + inner + "}")
        )
    return "{" + ", ".join(pieces) + "}", {
        "Image": body["Image"],
        **({"HostConfig": host} if "HostConfig" in body else {}),
    }


@given(spelled_bodies())
@settings(max_examples=300, deadline=None)
def test_any_spelling_go_accepts_canonicalises_to_go_names(case: tuple[str, dict[str, Any]]) -> None:
    text, expected = case
    assert canon(text) == expected


@st.composite
def bodies_with_a_field_spelled_twice(draw: st.DrawFn) -> str:
    """A HostConfig in which one field appears twice, under two Go-equivalent spellings."""
    host = draw(HOST_CONFIGS.filter(bool))
    twice = draw(st.sampled_from(sorted(host)))
    members = [(_variant(draw, key), value) for key, value in host.items()]
    position = draw(st.integers(0, len(members)))
    members.insert(position, (_variant(draw, twice), draw(LEAVES[twice])))
    inner = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in members)
    return '{"Image": "bb", "HostConfig": {' + inner + "}}"


@given(bodies_with_a_field_spelled_twice())
@settings(max_examples=300, deadline=None)
def test_a_field_spelled_twice_is_always_refused(text: str) -> None:
    with pytest.raises(BadRequest, match="ambiguous"):
        canon(text)


def test_parse_json_keeps_duplicates_for_the_checks() -> None:
    assert list(parse_json(b'{"a": 1, "a": 2}')) == [("a", 1), ("a", 2)]
