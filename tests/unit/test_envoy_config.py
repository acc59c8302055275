"""envoyproxy/ratelimit's configuration files: what becomes a route, how a request
descriptor is looked up (envoyproxy/ratelimit's GetLimit), and every refusal naming the
file, the line and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from control_plane.envoy import load_envoy_config, parse_envoy_files
from control_plane.envoy.config import bucket_key, encode_part
from control_plane.model.rollout import Mode
from control_plane.rules import RulesError
from control_plane.settings import load_settings
from limiter import Algorithm, Policy

SETTINGS = load_settings(redis_url="redis://127.0.0.1:6379/0")

BASIC = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: login}
    descriptors:
      - key: user
        rate_limit: {unit: HOUR, requests_per_unit: 100}
  - key: nolimit
    descriptors:
      - key: deeper
        value: x
        rate_limit: {unit: day, requests_per_unit: 7}
  - key: files
    value: "img*"
    rate_limit: {unit: week, requests_per_unit: 3}
  - key: shared
    value: "s*"
    share_threshold: true
    rate_limit: {unit: month, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: a
    value: b
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 2}
"""


def parse(text: str, name: str = "config.yaml"):
    return parse_envoy_files([(name, textwrap.dedent(text).encode())], SETTINGS)


def test_every_limited_descriptor_is_a_route_with_a_fixed_window() -> None:
    cfg = parse(BASIC)
    by_name = {r.name: r for r in cfg.routes}
    assert list(by_name) == [
        "edge/remote_address",
        "edge/path=%2Flogin",
        "edge/path=%2Flogin/user",
        "edge/nolimit/deeper=x",
        "edge/files=img*",
        "edge/shared=s*",
        "edge/a=b",
        "edge/a",
    ]
    login = by_name["edge/path=%2Flogin"]
    assert login.initial_mode is Mode.SHADOW and not login.http and login.line == 5
    assert by_name["edge/remote_address"].initial_mode is Mode.ENFORCE
    assert login.local == login.distributed
    assert (login.local.algorithm, login.local.average, login.local.period) == (Algorithm.FIXED_WINDOW, 5, 60)
    assert by_name["edge/shared=s*"].local.period == 30 * 86_400
    assert by_name["edge/a=b"].local.period == 365 * 86_400
    assert login.origin is not None and login.origin["name"] == "login" and login.origin["file"] == "config.yaml"


@pytest.mark.parametrize(
    ("entries", "route", "key"),
    [
        ([("remote_address", "10.0.0.1")], "edge/remote_address", "10.0.0.1"),  # value-less: keyed by value
        ([("path", "/login")], "edge/path=%2Flogin", "all"),  # fixed value: one bucket
        ([("path", "/login"), ("user", "bob")], "edge/path=%2Flogin/user", "bob"),
        ([("path", "/other")], None, None),  # no such value and no value-less path
        ([("path", "/login"), ("user", "bob"), ("x", "y")], None, None),  # deeper than the config
        ([("nolimit", "v")], None, None),  # no rate_limit at that level
        ([("nolimit", "v"), ("deeper", "x")], "edge/nolimit/deeper=x", "v"),
        ([("files", "img-1.png")], "edge/files=img*", "img-1.png"),  # wildcard: keyed by value
        ([("files", "doc")], None, None),
        ([("shared", "s1")], "edge/shared=s*", "all"),  # share_threshold: one bucket
        ([("a", "b")], "edge/a=b", "all"),  # key_value before key
        ([("a", "c")], "edge/a", "c"),
        ([("free", "x")], None, "x"),  # unlimited: a match with no route
    ],
)
def test_lookup_follows_envoyproxy_ratelimit(entries, route, key) -> None:
    m = parse(BASIC).lookup("edge", entries)
    if key is None:
        assert m is None
        return
    assert m is not None and (m.limit.route, m.key) == (route, key)
    assert m.limit.unlimited == (route is None)


def test_lookup_unknown_domain_and_middle_wildcards() -> None:
    cfg = parse(
        """\
        domain: d
        descriptors:
          - key: path
            value: "/api/*/users/*"
            rate_limit: {unit: second, requests_per_unit: 1}
        """
    )
    assert cfg.lookup("other", [("path", "/api/v1/users/7")]) is None
    m = cfg.lookup("d", [("path", "/api/v1/users/7")])
    assert m is not None and m.key == "/api/v1/users/7"
    assert cfg.lookup("d", [("path", "/api/v1/groups/7")]) is None


def test_bucket_keys_and_route_names_are_safe() -> None:
    assert encode_part("a b:c/é") == "a%20b%3Ac%2F%C3%A9"
    cfg = parse(BASIC)
    m = cfg.lookup("edge", [("remote_address", "a b|c%\x00é")])
    assert m is not None and m.key == "a%20b%7Cc%25%00%C3%A9"
    assert bucket_key(["x" * 300]).startswith("sha256:") and len(bucket_key(["x" * 300])) == 71
    assert bucket_key(["a", "b"]) == "a|b"


def test_a_directory_reads_its_yaml_files_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    (tmp_path / "a.yml").write_text("domain: a\n")
    (tmp_path / ".hidden.yaml").write_text("not: [valid")
    (tmp_path / "readme.md").write_text("# notes")
    cfg = load_envoy_config(tmp_path, SETTINGS)
    assert [Path(s).name for s in cfg.sources] == ["a.yml", "b.yaml"]
    assert [r.name for r in cfg.routes] == ["b/k"]
    (tmp_path / "c.yaml").write_text("domain: b\n")
    with pytest.raises(RulesError) as err:
        load_envoy_config(tmp_path, SETTINGS)
    assert str(err.value).startswith(f"{tmp_path / 'c.yaml'}:1: domain: duplicate domain 'b' (also in ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "config.yaml:1: the file is empty"),
        ("descriptors: []\n", "config.yaml:1: domain: is required and must not be empty"),
        ("domain: ''\n", "config.yaml:1: domain: must not be empty"),
        ("domain: d\nlimits: []\n", "config.yaml:2: limits: unknown key 'limits' here"),
        ("domain: d\ndescriptors: {key: a}\n", "config.yaml:2: descriptors: must be a list of descriptors"),
        ("domain: d\ndescriptors:\n  - value: x\n", "config.yaml:3: descriptors[0].key: is required"),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "config.yaml:4: descriptors[0].rate_limit.unit: must be one of second, minute, hour, day, week, month, "
            "year, got 'FORTNIGHT'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
            "config.yaml:4: descriptors[0].rate_limit.unit: should not specify a unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1000000000001}\n",
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be between 0 and 1000000000000, "
            "got 1000000000001",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: five}\n",
            "config.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got 'five'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 9}\n",
            "config.yaml:4: descriptors[0].rate_limit.burst: unknown key 'burst' here",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
            "config.yaml:4: descriptors[1]: duplicate descriptor 'a' in domain 'd'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes\n",
            "config.yaml:4: descriptors[0].shadow_mode: must be true or false, got 'yes'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n",
            "config.yaml:4: descriptors[0].share_threshold: share_threshold needs a wildcard value",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"
            "      name: n\n      replaces: [{name: n}]\n",
            "config.yaml:8: descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself",
        ),
        ("domain: d\ndescriptors:\n  - key: [a]\n", "config.yaml:3: descriptors[0].key: must be a string, got a list"),
        ("domain: d\n  bad: [indent\n", "config.yaml:2: YAML syntax error"),
    ],
)
def test_bad_files_are_refused_naming_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(RulesError) as err:
        parse(text)
    assert str(err.value).startswith(expected), str(err.value)


def test_descriptors_nest_at_most_16_deep() -> None:
    text = "domain: d\ndescriptors:\n"
    for depth in range(17):
        text += "  " * (2 * depth + 1) + f"- key: k{depth}\n" + "  " * (2 * depth + 2) + "descriptors:\n"
    text += "  " * 35 + "- key: last\n"
    with pytest.raises(RulesError) as err:
        parse(text)
    assert "descriptors nest deeper than 16 levels" in str(err.value)


def test_values_are_the_text_written_and_empty_values_have_their_own_bucket() -> None:
    cfg = parse(
        """\
        domain: d
        descriptors:
          - key: a
            value: 0123
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: b
            value: 0x1F
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: user
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: w
            value: "x*"
            rate_limit: {unit: second, requests_per_unit: 1}
        """
    )
    assert [r.name for r in cfg.routes] == ["d/a=0123", "d/b=0x1F", "d/user", "d/w=x*"]
    assert cfg.lookup("d", [("a", "0123")]) is not None and cfg.lookup("d", [("a", "83")]) is None
    empty = cfg.lookup("d", [("user", "")])
    assert empty is not None and empty.key == "%"
    assert cfg.lookup("d", [("user", "%")]).key == "%25"  # type: ignore[union-attr]
    # the wildcard's own text matched exactly still has its own bucket (not the fixed one)
    assert cfg.lookup("d", [("w", "x*")]).key == "x*"  # type: ignore[union-attr]
    assert cfg.lookup("d", [("w", "xall")]).key == "xall"  # type: ignore[union-attr]


def test_directories_are_read_recursively_skipping_hidden_entries(tmp_path: Path) -> None:
    one = "domain: {}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text(one.format("b"))
    (tmp_path / "a.yaml").write_text(one.format("a"))
    # a Kubernetes ConfigMap mount: the files again in a hidden timestamped directory
    (tmp_path / "..2026_11_26_10_00_00.1").mkdir()
    (tmp_path / "..2026_11_26_10_00_00.1" / "a.yaml").write_text(one.format("a"))
    cfg = load_envoy_config(tmp_path, SETTINGS)
    assert [r.name for r in cfg.routes] == ["a/k", "b/k"]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(RulesError, match="no .yaml or .yml files in this directory"):
        load_envoy_config(empty, SETTINGS)


def test_a_document_nested_too_deeply_is_a_clear_error() -> None:
    with pytest.raises(RulesError, match="config.yaml: the document nests too deeply"):
        parse("domain: d\ndescriptors: " + "[" * 5000 + "]" * 5000 + "\n")


def test_the_peers_own_example_file_loads_unchanged_with_its_banned_value() -> None:
    """envoyproxy/ratelimit's examples/ratelimit/config/example.yaml, byte for byte:
    ``requests_per_unit: 0`` (``bar: banned``) is a limit every request is over."""
    path = Path(__file__).parent.parent / "fixtures" / "envoyproxy-ratelimit" / "example.yaml"
    config = load_envoy_config(path, load_settings())
    routes = {r.name: r for r in config.routes}
    banned = routes["rl/foo/bar=banned"]
    assert banned.local.blocked and banned.distributed.blocked and banned.local.limit == 0
    assert banned.origin is not None and banned.origin["requests_per_unit"] == 0
    m = config.lookup("rl", [("foo", "x"), ("bar", "banned")])
    assert m is not None and m.limit.requests_per_unit == 0 and m.limit.name == "banned_limit"
    # every other limited descriptor of the file is an ordinary fixed window
    assert routes["rl/foo"].local == Policy(average=2, period=60, burst=2, algorithm="fixed_window")
    assert sum(r.local.blocked for r in config.routes) == 1
    assert {"rl/service=service_1", "rl/service=service_2", "rl/unspec"} <= set(routes)


def test_a_banned_limit_reads_as_such_in_the_dashboard() -> None:
    from dashboard.models import PolicyView

    view = PolicyView.parse(Policy.blocking(60).to_dict())
    assert view is not None and view.describe() == "0/60s (blocks all)"
    assert PolicyView.parse(Policy(average=0).to_dict()).describe() == "unlimited"  # type: ignore[union-attr]
