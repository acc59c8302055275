"""Which exit code each answer of a control plane gets: a refusal, the gate, auth and a 503
(nothing written, retry) are told apart; and the exit codes every --help lists."""

from __future__ import annotations

import pytest

from control_plane.cli.output import (
    EXIT_AUTH,
    EXIT_CODES,
    EXIT_CODES_EPILOG,
    EXIT_GATE,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    error_for_response,
)


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (409, {"error": "gate_failed", "message": "promotion refused by the gate: x", "gate": {}}, EXIT_GATE),
        (409, {"error": "conflict", "message": "the route was changed concurrently"}, EXIT_REFUSED),
        (503, {"error": "backend_unavailable", "message": "Redis is unreachable"}, EXIT_UNAVAILABLE),
        (503, {"error": "busy", "message": "another what-if replay is running"}, EXIT_UNAVAILABLE),
        (401, {"error": "unauthorized", "message": "a token is required"}, EXIT_AUTH),
        (403, {"error": "forbidden", "message": "operator role needed"}, EXIT_AUTH),
        (404, {"error": "unknown_route", "message": "no route named 'x'"}, EXIT_REFUSED),
        (422, {"error": "invalid_request", "message": "reason: too long"}, EXIT_REFUSED),
        (500, "Internal Server Error", EXIT_REFUSED),
    ],
)
def test_each_answer_has_its_exit_code(status, body, code):
    err = error_for_response(status, body, has_token=True)
    assert (err.code, err.status, err.response) == (code, status, body)


def test_messages_say_what_to_do():
    unavailable = error_for_response(503, {"error": "backend_unavailable", "message": "down"}, has_token=True)
    assert str(unavailable).endswith("nothing was written, retry later")
    assert "--token" in str(error_for_response(401, {"message": "no"}, has_token=False))
    assert "--token" not in str(error_for_response(401, {"message": "no"}, has_token=True))
    gate = error_for_response(409, {"error": "gate_failed", "message": "refused", "gate": {"a": 1}}, has_token=True)
    assert (str(gate), gate.detail) == ("refused", '  gate figures: {"a": 1}')


def test_the_codes_are_distinct_and_listed():
    kinds = [kind for kind, _ in EXIT_CODES.values()]
    assert len(set(kinds)) == len(kinds)
    assert list(EXIT_CODES)[:8] == [0, 1, 2, 3, 4, 5, 6, 7]
    for code in EXIT_CODES:
        assert f"\n  {code:<4}" in EXIT_CODES_EPILOG
