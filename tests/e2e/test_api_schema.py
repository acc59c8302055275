"""Property-based run over the control plane's own OpenAPI schema (schemathesis 4): every
operation (except the endless ``/v1/stream``) against a live server on loopback with
real Redis, with the admin token so mutating endpoints are exercised too. No response
may be a 5xx, and every response must match the schema."""

from __future__ import annotations

import pytest
import schemathesis
from cp_server import ControlPlaneServer, admin_headers, write_rules
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

CHECKS = [not_a_server_error, response_schema_conformance]


@pytest.fixture(scope="module")
def live_cp(redis_server, tmp_path_factory):
    rules = write_rules(tmp_path_factory.mktemp("schema-rules"))
    # gate_min_samples=0: generated promotions pass the gate and really change modes
    server = ControlPlaneServer(redis_url=redis_server.url, rules_path=rules, gate_min_samples=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api_schema(live_cp):
    schema = schemathesis.openapi.from_url(live_cp.url + "/openapi.json")
    return schema


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path="/v1/stream")


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_schema(case, live_cp):
    case.call_and_validate(base_url=live_cp.url, headers=admin_headers(), checks=CHECKS, timeout=10)
