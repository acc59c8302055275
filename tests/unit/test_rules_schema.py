"""The rules file's JSON Schema (docs/rules.schema.json): generated from the loader's own key
lists, enums and bounds, committed, and in agreement with the loader on good and bad files."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest

from control_plane.rules import RulesError, parse_rules
from control_plane.rules.document import RouteDefaults
from control_plane.rules.fields import FieldReader
from control_plane.rules.json_schema import DOCS_PATH, SCHEMA_PATH, TABLES, render, render_docs
from control_plane.rules.schema import ROUTE
from control_plane.rules.spec import Block, Got, Key, docs_table, read_block
from control_plane.rules.yaml_source import load_yaml
from control_plane.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((ROOT / SCHEMA_PATH).read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)  # a valid draft-07 schema
    return jsonschema.Draft7Validator(schema)


@pytest.fixture
def settings() -> Settings:
    return Settings(rules_path=None)


def schema_errors(validator: jsonschema.Draft7Validator, text: str) -> list[str]:
    """The schema's complaints about a document, read as the loader reads YAML."""
    data, _ = load_yaml(text, "t.yaml")
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(data)]


def test_committed_schema_is_the_generated_one():
    committed = (ROOT / SCHEMA_PATH).read_text(encoding="utf-8")
    assert committed == render(), (
        f"{SCHEMA_PATH} is out of date: regenerate it with python -m control_plane.rules.json_schema > {SCHEMA_PATH}"
    )


def test_the_regenerate_command_prints_the_schema():
    out = subprocess.run(
        [sys.executable, "-m", "control_plane.rules.json_schema"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out == render()
    assert json.loads(out)["title"] == "shadowlimit rules file"


def test_the_docs_tables_are_the_generated_ones():
    text = (ROOT / DOCS_PATH).read_text(encoding="utf-8")
    assert text.count("<!-- rules table: ") == len(TABLES)
    assert render_docs(text) == text, (
        f"the rules tables of {DOCS_PATH} are out of date: python -m control_plane.rules.json_schema --write"
    )


def test_the_check_command_says_both_files_are_up_to_date():
    done = subprocess.run(
        [sys.executable, "-m", "control_plane.rules.json_schema", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_a_new_key_is_one_row(settings):
    """A row added to a block is read (with the file's line in its errors), offered by the
    schema and documented, with no other change: here a nested block, as a per-route plan
    would be (``plan: {steps: [...], note: ...}``)."""
    plan = Block(
        name="plan",
        keys=(
            Key(
                name="steps",
                read=lambda r, v, p, got: [r.integer(s, (*p, i), 1, 100) for i, s in enumerate(v)],
                schema={"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 100}},
                doc="The canary percentages, in order.",
            ),
            Key(name="note", read=lambda r, v, p, got: r.string(v, p), schema={"type": "string"}, doc="Why."),
        ),
    )
    route = dataclasses.replace(ROUTE, keys=(*ROUTE.keys, Key(name="plan", block=plan, doc="The rollout plan.")))
    text = """
        routes:
          - name: a
            match: {path: /a}
            local: 5/s
            plan:
              steps: [10, 50]
              note: slowly
          - name: b
            match: {path: /b}
            local: 5/s
            plan: {steps: [10, 500]}
        """
    data, lines = load_yaml(textwrap.dedent(text), "t.yaml")
    reader = FieldReader(lines, "t.yaml", settings)
    document = Got()
    document["defaults"] = RouteDefaults()
    first = read_block(reader, route, data["routes"][0], ("routes", 0), document)
    assert first.name == "a"
    with pytest.raises(RulesError) as err:
        read_block(reader, route, data["routes"][1], ("routes", 1), document)
    assert str(err.value) == "t.yaml:12: routes[1].plan.steps[1]: must be from 1 to 100, got 500"
    with pytest.raises(
        RulesError, match=r"unknown key 'plam' \(did you mean 'plan'\?\); allowed keys: .*cost_unit, gate_weight, plan$"
    ):
        read_block(reader, route, {**data["routes"][0], "plam": {}}, ("routes", 0), document)
    schema = route.json_schema()["properties"]["plan"]
    assert schema["properties"]["steps"]["items"]["maximum"] == 100
    assert schema["additionalProperties"] is False
    table = docs_table(route)
    assert "| `plan.steps` | no | - | The canary percentages, in order. |" in table
    assert "| `plan.note` | no | - | Why. |" in table


def test_examples_exist_and_point_editors_at_the_schema():
    assert EXAMPLES, "no examples/*.yaml"
    rules_yaml = (ROOT / "examples" / "rules.yaml").read_text(encoding="utf-8")
    assert rules_yaml.splitlines()[0] == "# yaml-language-server: $schema=../docs/rules.schema.json"
    assert (ROOT / "examples" / "../docs/rules.schema.json").resolve() == (ROOT / SCHEMA_PATH).resolve()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_for_the_schema_and_the_loader(validator, settings, path):
    text = path.read_text(encoding="utf-8")
    assert schema_errors(validator, text) == []
    assert parse_rules(text, settings, source=str(path)).routes


GOOD = {
    "limit texts": """
        version: 1
        routes:
          - name: a
            match: {path: /a/**}
            local: 100/minute
            distributed: {limit: 1000 per hour, burst: 50, algorithm: gcra}
            overrides:
              tenants: {acme: "100/5 minutes", big: {average: 5, period: 1m30s}}
            key: {strategy: header, header: X-Tenant}
        """,
    "lenient spellings and short forms": """
        defaults:
          key: {strategy: " client_ip "}
          failure_policy: FAIL_CLOSED
          failure_code: 503
        routes:
          - name: a.b-c_1
            match: {methods: GET, path: "/x/{id}/*"}
            key: {strategy: API-KEY, api_key_header: X-Key}
            local: {average: 0.5, period: 2}
            failure_policy: pass-through
            overrides: {api_keys: null}
          - name: b
            match: {methods: "*", path: /b}
            local: {average: 5, period: 0.25, burst: 5.0}
            mode: canary
            canary_percent: 10
        """,
    "default route, external limits, lists": """
        routes:
          - name: t
            match: {methods: [GET, POST], path: /t/**}
            key: {strategy: composite, header: X-Tenant}
            local: 5/s
            allow: [10.0.0.0/8, internal-job]
            deny: [bad-tenant]
            external:
              url: http://127.0.0.1:9100/limits
              timeout: 0.5
              cache_ttl: 0
              max_concurrent_requests: 10
              header_filter: {deny_list: [X-Debug]}
          - name: default
            local: {algorithm: sliding_log, average: 100, period: 1m}
        """,
    "no routes": """
        routes:
        """,
    "a rollout plan": """
        routes:
          - name: a
            match: {path: /a}
            local: 5/s
            rollout:
              steps:
                - shadow: 10m
                - {canary: 10, for: 90s}
                - canary: 50
                - approve
                - enforce: 5m
              analysis:
                min_compared: 200
                max_new_rejection_rate: 0.5%
                max_backend_error_rate: 0.001
                prometheus:
                  - {name: upstream 5xx, query: 'sum(rate(x{route="{route}"}[1m]))', max: 1%}
                  - {name: traffic, query: 'sum(rate(y[1m]))', min: 1, url: http://prometheus:9090}
              on_failure: pause
          - name: b
            match: {path: /b}
            local: 5/s
            rollout: {steps: [shadow, enforce]}
        """,
}


@pytest.mark.parametrize("text", GOOD.values(), ids=GOOD.keys())
def test_files_the_loader_accepts_are_valid_for_the_schema(validator, settings, text):
    text = textwrap.dedent(text)
    parse_rules(text, settings, source="t.yaml")
    assert schema_errors(validator, text) == []


_ROUTE = "routes:\n  - name: a\n    match: {path: /a}\n"
BAD = {
    "unknown route key": _ROUTE + "    lokal: {average: 5}\n",
    "no policy": "routes:\n  - name: a\n    match: {path: /a}\n",
    "policy without average or limit": _ROUTE + "    local: {burst: 5}\n",
    "bad limit text": _ROUTE + "    local: 100/fortnight\n",
    "months": _ROUTE + "    local: {limit: 10/month}\n",
    "limit and period": _ROUTE + "    local: {limit: 10/s, period: 1s}\n",
    "burst 0": _ROUTE + "    local: {average: 10, burst: 0}\n",
    "bad period": _ROUTE + "    local: {average: 10, period: 5 minutes}\n",
    "unknown algorithm": _ROUTE + "    local: {average: 10, algorithm: leaky_bucket}\n",
    "failure code as text": _ROUTE + "    local: 5/s\n    failure_code: '503'\n",
    "failure code out of range": _ROUTE + "    local: 5/s\n    failure_code: 200\n",
    "unknown failure policy": _ROUTE + "    local: 5/s\n    failure_policy: sometimes\n",
    "unknown mode": _ROUTE + "    local: 5/s\n    mode: on\n",
    "canary percent without canary": _ROUTE + "    local: 5/s\n    mode: shadow\n    canary_percent: 5\n",
    "header strategy without header": _ROUTE + "    local: 5/s\n    key: {strategy: header}\n",
    "unknown strategy": _ROUTE + "    local: 5/s\n    key: {strategy: ip}\n",
    "both header lists": _ROUTE
    + "    local: 5/s\n    external:\n      url: http://x/l\n      header_filter: {allow_list: [A], deny_list: [B]}\n",
    "external without url": _ROUTE + "    local: 5/s\n    external: {timeout: 1s}\n",
    "timeout over 60s": _ROUTE + "    local: 5/s\n    external: {url: http://x/l, timeout: 120}\n",
    "no match": "routes:\n  - name: a\n    local: 5/s\n",
    "lower-case method": "routes:\n  - name: a\n    match: {methods: [get], path: /a}\n    local: 5/s\n",
    "path without /": "routes:\n  - name: a\n    match: {path: a}\n    local: 5/s\n",
    "reserved name": "routes:\n  - name: fleet\n    match: {path: /a}\n    local: 5/s\n",
    "bad name": "routes:\n  - name: a b\n    match: {path: /a}\n    local: 5/s\n",
    "no routes key": "defaults: {failure_code: 503}\n",
    "routes not a list": "routes: {a: 1}\n",
    "version 2": "version: 2\nroutes: []\n",
    "unknown top-level key": "routes: []\nroute: []\n",
    "plan: canary percent 100": _ROUTE + "    local: 5/s\n    rollout: {steps: [shadow, {canary: 100}]}\n",
    "plan: unknown step": _ROUTE + "    local: 5/s\n    rollout: {steps: [shadow, wait]}\n",
    "plan: bad duration": _ROUTE + "    local: 5/s\n    rollout: {steps: [{shadow: 10 minutes}]}\n",
    "plan: bad threshold": _ROUTE
    + "    local: 5/s\n    rollout: {steps: [shadow], analysis: {max_new_rejection_rate: lots}}\n",
    "plan: check without max or min": _ROUTE
    + "    local: 5/s\n    rollout: {steps: [shadow], analysis: {prometheus: [{name: x, query: up}]}}\n",
    "plan: unknown on_failure": _ROUTE + "    local: 5/s\n    rollout: {steps: [shadow], on_failure: abort}\n",
    "plan: no steps": _ROUTE + "    local: 5/s\n    rollout: {steps: []}\n",
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_bad_files_are_rejected_by_the_schema_and_the_loader(validator, settings, text):
    assert schema_errors(validator, text), "the schema accepted it"
    with pytest.raises(RulesError) as info:
        parse_rules(text, settings, source="t.yaml")
    assert str(info.value).startswith("t.yaml:")  # file:line
