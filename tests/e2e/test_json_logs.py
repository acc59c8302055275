"""``SHADOWLIMIT_LOG_FORMAT=json``: every line ``shadowlimit serve`` writes on stderr is one JSON
object (uvicorn's included), and the operational events carry their fields: a mode change, its
audit entry, a rules reload and a rejected rules file, a breaker transition."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cp_server import ADMIN_TOKEN, admin_headers, clean_env, free_port, metric_value, wait_until, write_rules

from limiter.embedded import EmbeddedRedis

SHADOWLIMIT = Path(sys.executable).parent / "shadowlimit"
RULES = """\
version: 1
routes:
  - name: api
    match: {path: /api/**}
    local: {average: 100, period: 1s, burst: 100}
"""

pytestmark = pytest.mark.timeout(120)


def _serve(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(SHADOWLIMIT), "serve", "--log-level", "info"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def reloads(base: str, result: str) -> float:
    return metric_value(httpx.get(base + "/metrics", timeout=5).text, "rate_limit_rules_reload_total", result=result)


def test_json_logs_carry_the_events(tmp_path: Path) -> None:
    redis = EmbeddedRedis().start()
    rules = write_rules(tmp_path, RULES)
    port = free_port()
    env = clean_env()
    env.update(
        RATE_LIMIT_REDIS_URL=redis.url,
        RATE_LIMIT_RULES_PATH=str(rules),
        RATE_LIMIT_REDIS_COMMAND_TIMEOUT="0.2",
        SHADOWLIMIT_PORT=str(port),
        SHADOWLIMIT_ADMIN_TOKEN=ADMIN_TOKEN,
        SHADOWLIMIT_LOG_FORMAT="json",
        SHADOWLIMIT_RULES_POLL_INTERVAL_S="0.2",
        ENABLE_DISTRIBUTED_RATE_LIMITING="true",
    )
    base = f"http://127.0.0.1:{port}"
    proc = _serve(env)
    try:
        wait_until(
            lambda: proc.poll() is None and httpx.get(base + "/readyz", timeout=1).status_code == 200,
            40.0,
            0.2,
            "serve to be ready",
        )
        r = httpx.put(
            base + "/v1/routes/api/mode",
            json={"mode": "enforce", "reason": "json logs", "force": True},
            headers=admin_headers(),
            timeout=10,
        )
        assert r.status_code == 200, r.text
        rules.write_text(RULES.replace("average: 100", "average: 50"))  # a reload
        wait_until(lambda: reloads(base, "ok") >= 1, 20.0, 0.2, "a reload")
        rules.write_text(RULES.replace("average: 100", "average: lots"))  # refused, kept out
        wait_until(lambda: reloads(base, "error") >= 1, 20.0, 0.2, "a refusal")
        redis.kill()  # the breaker opens after the next failures
        for _ in range(8):
            httpx.post(base + "/v1/decide", json={"route": "api", "key": "k"}, timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        redis.stop()
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert lines
    objects = []
    for ln in lines:
        obj = json.loads(ln)  # every line is one JSON object: no text line, no traceback
        assert {"time", "level", "logger"} <= set(obj), obj
        objects.append(obj)
    events = [o for o in objects if "event" in o]
    kinds = {o["event"] for o in events}
    assert {"mode_change", "audit", "rules_reloaded", "rules_rejected", "breaker"} <= kinds, kinds
    change = next(o for o in events if o["event"] == "mode_change" and o.get("mode") == "enforce")
    assert change["route"] == "api" and change["reason"] == "json logs" and change["message"].startswith("route api")
    audit = next(o for o in events if o["event"] == "audit" and o["kind"] == "mode_change")
    assert audit["route"] == "api" and audit["to"] == "enforce" and audit["forced"] is True and "message" not in audit
    reload = next(o for o in events if o["event"] == "rules_reloaded")
    assert reload["routes"] >= 1 and len(reload["digest"]) == 64
    assert "rules.yaml:5: routes[0].local.average" in next(o for o in events if o["event"] == "rules_rejected")["error"]
    assert next(o for o in events if o["event"] == "breaker")["to"] == "open"
    assert any(o["logger"].startswith("uvicorn") for o in objects)  # the server's own lines too
