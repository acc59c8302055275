"""The main job: `shadowlimit demo` starts Redis, the example limits service and three
replicas as separate OS processes, serves decisions on all of them, and leaves nothing
behind when it stops (or is killed)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_server import metric_value
from support import eventually


def _pids_with(pattern: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern in cmd:
            out.append(int(d.name))
    return out


LOGS: list[str] = []  # the logs folder the last demo printed
RULES: list[str] = []  # the rules file the last demo printed
EXAMPLE_RULES = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"


def _start_demo(extra: list[str]) -> tuple[subprocess.Popen[str], list[str], str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "control_plane.cli", "demo", "--no-dash", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RATE_LIMIT_REDIS_URL"},
    )
    urls: list[str] = []
    token = ""
    limits = ""
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if m := re.search(r"replica \d:\s+(http://127\.0\.0\.1:\d+)", line):
            urls.append(m.group(1))
        if m := re.search(r"admin token: (\S+)", line):
            token = m.group(1)
        if m := re.search(r"limits:\s+(http://127\.0\.0\.1:\d+)/limits", line):
            limits = m.group(1)
        if m := re.search(r"rules:\s+(\S+)", line):
            RULES.append(m.group(1))
        if m := re.search(r"logs:\s+(\S+)", line):
            LOGS.append(m.group(1))
        if line.startswith("try:"):
            break
    assert len(urls) == 3, f"demo did not print three replicas: {urls}"
    assert limits, "demo did not print the limits service"
    return proc, urls, token, limits


def _wait_gone(pattern: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _pids_with(pattern)
        if not left:
            return []
        time.sleep(0.1)
    return _pids_with(pattern)


def test_the_demo_runs_the_example_rules_file_with_only_the_limits_url_changed():
    """One set of example rules: the demo's file is examples/rules.yaml line for line (so
    docs/api.md's examples, produced with it, give the same answers against the demo),
    except the tenants route's external.url, which names the demo's own limits service."""
    proc, urls, _, limits = _start_demo(["--duration", "20"])
    try:
        assert RULES, "the demo did not print its rules file"
        demo_lines = Path(RULES[-1]).read_text().splitlines()
        example_lines = EXAMPLE_RULES.read_text().splitlines()
        assert len(demo_lines) == len(example_lines)
        changed = [(a, b) for a, b in zip(example_lines, demo_lines, strict=True) if a != b]
        assert len(changed) == 1, changed
        example_line, demo_line = changed[0]
        assert example_line.strip() == "url: http://127.0.0.1:9100/limits"
        assert demo_line.split("#")[0].strip() == f"url: {limits}/limits"
        routes = httpx.get(urls[0] + "/v1/routes", timeout=5).json()
        assert routes["rules_source"] == RULES[-1] and routes["rules_error"] is None
        names = [r["name"] for r in routes["routes"]]
        assert names == ["search", "checkout", "login", "internal", "tenants", "chat", "default"]
        # the demo's story on those routes: bob spreads search bursts over the replicas, each
        # admits him, the global limit would not (divergence); mallory brute-forces login
        deadline = time.monotonic() + 15
        blocked: dict[str, set[str]] = {}
        while time.monotonic() < deadline and not {"search", "login", "tenants"} <= blocked.keys():
            div = httpx.get(urls[0] + "/v1/divergence?minutes=2", timeout=5).json()["routes"]
            blocked = {r: {w["key"] for w in v["would_be_blocked"]} for r, v in div.items() if v["would_be_blocked"]}
            time.sleep(0.5)
        assert "198.51.100.20" in blocked.get("search", set()), blocked
        assert "198.51.100.66" in blocked.get("login", set()), blocked
        assert "globex" in blocked.get("tenants", set()), blocked
        assert "198.51.100.10" not in blocked.get("search", set()), "alice (5/s) is well-behaved"

        # chat: the tenants reserve, stream their answers and settle them, counted in tokens
        def chat() -> dict[str, Any]:
            return httpx.get(urls[0] + "/v1/divergence?minutes=2", timeout=5).json()["routes"]["chat"]["units"]

        units = eventually(lambda: (u := chat())["agree"]["units"] > 0 and u, 15, 0.5, "chat's tokens compared")
        assert units["unit"] == "tokens", units
        settled = sum(
            metric_value(httpx.get(u + "/metrics", timeout=5).text, "rate_limit_settles_total", route="chat",
                         result="settled")
            for u in urls
        )  # fmt: skip
        assert settled > 0
    finally:
        proc.send_signal(signal.SIGTERM)  # stops cleanly, removing its folder
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0


def test_the_demos_traffic_makes_each_cause_of_divergence():
    """The demo's story, by cause (docs/rollout-runbook.md#why-they-disagree walks it): bob
    spreads his searches over the replicas (``replicas``: search's global limit is more
    generous than one replica's, so nothing of it is ``tighter``), globex its tenant's
    requests; on login, whose global limit is stricter than today's, uptime keeps to 4 a
    minute on one replica (``tighter``) while mallory spreads her guesses (``replicas``); the
    last replica, restarted once about a minute in, makes ``fresh_local`` while its new
    buckets are young."""
    import json

    proc = subprocess.Popen(
        [sys.executable, "-m", "control_plane.cli", "demo", "--no-dash", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RATE_LIMIT_REDIS_URL"},
    )
    assert proc.stdout is not None
    try:
        running = json.loads(proc.stdout.readline())
        assert running["restart"] == "replica-3", running
        url = running["replicas"][0]

        def causes() -> tuple[dict[str, Any], dict[str, dict[str, str | None]]]:
            routes = httpx.get(url + "/v1/divergence?minutes=10", timeout=5).json()["routes"]
            why = {r: v["causes"]["new_rejections"]["by_cause"] for r, v in routes.items()}
            keys = {r: {w["key"]: w["cause"] for w in v["would_be_blocked"]} for r, v in routes.items()}
            return why, keys

        deadline = time.monotonic() + 150  # uptime's 4th login of a minute; the restart within 70 s
        why, keys = causes()
        while time.monotonic() < deadline and not (
            keys["login"].get("198.51.100.41") == "tighter" and why["login"]["fresh_local"] > 0
        ):
            time.sleep(2)
            why, keys = causes()
        assert keys["search"]["198.51.100.20"] == "replicas", keys
        assert why["search"]["tighter"] == 0 and why["search"]["replicas"] >= 0.9 * sum(why["search"].values()), why
        assert keys["tenants"]["globex"] == "replicas", keys
        # mallory: the leak, or, while the restarted replica's bucket of her is young (its refill
        # time: two minutes of a sliding window), that replica's new bucket
        assert keys["login"]["198.51.100.66"] in ("replicas", "fresh_local"), keys
        assert why["login"]["replicas"] > 0, why
        assert keys["login"].get("198.51.100.41") == "tighter", keys
        assert why["login"]["fresh_local"] > 0, why
        assert "198.51.100.10" not in keys["search"], "alice (5/s) is well-behaved"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    stopped = json.loads(out.splitlines()[-1])
    assert stopped["restarted"] == [3], stopped
    # the restart drains the replica first, so no request meets it stopping (a refused connection
    # or a dropped one); a machine as loaded as a CI run's may let an answer miss the 2 s timeout
    kinds = stopped["error_kinds"]
    assert set(kinds) <= {"ReadTimeout"} and sum(kinds.values()) == stopped["errors"], stopped
    assert stopped["errors"] <= 0.005 * stopped["sent"], stopped


def test_demo_rules_refuse_an_example_file_without_the_limits_url(tmp_path):
    from control_plane.cli.demo import demo_rules

    text = demo_rules("http://127.0.0.1:1234/limits")
    assert "url: http://127.0.0.1:1234/limits   # shadowlimit demo" in text
    assert "url: http://127.0.0.1:9100" not in text
    other = tmp_path / "rules.yaml"
    other.write_text(EXAMPLE_RULES.read_text().replace("127.0.0.1:9100", "limits.internal:80"))
    with pytest.raises(ValueError, match=r"expected one line 'url: http://127\.0\.0\.1:9100/limits'") as exc:
        demo_rules("http://127.0.0.1:1234/limits", other)
    assert str(other) in str(exc.value)


def test_demo_serves_on_every_replica_and_stops_cleanly():
    proc, urls, token, limits = _start_demo(["--duration", "6"])
    ports = [u.rsplit(":", 1)[1] for u in urls]
    limits_port = limits.rsplit(":", 1)[1]
    try:
        for url in urls:
            r = httpx.post(url + "/v1/decide", json={"route": "search", "key": "test-client"}, timeout=5)
            assert r.status_code in (200, 429), r.text
            assert r.json()["route"] == "search"
            # the tenants route takes each tenant's limits from the limits service
            r = httpx.post(
                url + "/v1/decide",
                json={"method": "GET", "path": "/api/v1/tenants/x", "headers": {"X-Tenant-Id": "initech"}},
                timeout=5,
            )
            assert r.status_code in (200, 429), r.text
            assert r.json()["route"] == "tenants" and r.json()["limits_source"] == "external"
            assert r.headers["X-RateLimit-Limit"] == "20"
        assert httpx.get(limits + "/stats", timeout=5).json()["total"] > 0
        # the three replicas share one fleet and one rollout state
        deadline = time.monotonic() + 5
        live = 0
        while time.monotonic() < deadline and live != 3:  # heartbeats every 2 s
            live = httpx.get(urls[0] + "/v1/backend", timeout=5).json()["live_instances"]
            time.sleep(0.2)
        assert live == 3
        assert token
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    for port in ports:
        assert _wait_gone(f"--port {port}") == [], f"replica on port {port} left running"
    assert _wait_gone(f"--port {limits_port}") == [], "limits service left running"
    assert LOGS and not Path(LOGS[-1]).exists(), "the demo's folder was left behind"


def test_killing_the_demo_leaves_no_orphans():
    proc, urls, _, limits = _start_demo([])
    ports = [u.rsplit(":", 1)[1] for u in urls]
    ports.append(limits.rsplit(":", 1)[1])
    redis_port = None
    for pid in _pids_with("redis-server 127.0.0.1:"):
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().split()[3]) == proc.pid:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                redis_port = cmd.split("127.0.0.1:")[1].split()[0]
        except OSError:
            continue
    assert redis_port is not None, "the demo's embedded redis-server was not found"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    for port in ports:
        assert _wait_gone(f"--port {port}") == [], f"process on port {port} orphaned"
    assert _wait_gone(f"redis-server 127.0.0.1:{redis_port}") == [], "embedded redis-server orphaned"
    # a SIGKILLed demo cannot remove its folder: the test removes what it made
    if LOGS and Path(LOGS[-1]).is_dir():
        shutil.rmtree(LOGS[-1])


def test_the_demo_removes_its_folder_unless_asked_to_keep_it(tmp_path):
    from control_plane.cli.demo import DemoStack

    for keep in (False, True):
        stack = DemoStack(replicas=1, keep_logs=keep)
        assert stack.workdir.is_dir()
        stack.stop()
        assert stack.workdir.exists() is keep
        if keep:
            import shutil

            shutil.rmtree(stack.workdir)


def test_demo_json_prints_the_stack_and_its_gate_settings_as_json_lines():
    """``demo --no-dash --json``: stdout is JSON lines (the running stack, then the totals);
    its replicas run with the demo's short gate settings, which the line gives."""
    import json

    proc = subprocess.Popen(
        [sys.executable, "-m", "control_plane.cli", "demo", "--no-dash", "--json", "--duration", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("RATE_LIMIT_REDIS_URL", "SHADOWLIMIT_GATE_"))},
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["event"] for e in events] == ["running", "stopped"], out
    running = events[0]
    assert len(running["replicas"]) == 3 and running["admin_token"] and running["embedded_redis"] is True
    assert running["gate_settings"] == {
        "SHADOWLIMIT_GATE_WINDOW_S": "60",
        "SHADOWLIMIT_GATE_MIN_SAMPLES": "200",
        "SHADOWLIMIT_GATE_MIN_DWELL_S": "30",
    }
    assert events[1]["sent"] > 0
    assert "starting embedded Redis" in err


def test_demo_tls_serves_every_replica_over_mutual_tls():
    """``demo --tls``: the replicas' ports over mutual TLS with certificates made for the demo;
    its own traffic speaks it (sent, no error), a client with the demo's client certificate is
    answered and one without it is refused."""
    import json
    import ssl

    proc = subprocess.Popen(
        [sys.executable, "-m", "control_plane.cli", "demo", "--no-dash", "--json", "--tls", "--replicas", "2",
         "--no-restart", "--duration", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RATE_LIMIT_REDIS_URL"},
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        running = json.loads(proc.stdout.readline())
        tls = running["tls"]
        assert all(url.startswith("https://") for url in running["replicas"]), running
        ctx = ssl.create_default_context(cafile=tls["ca"])
        ctx.load_cert_chain(tls["cert"], tls["key"])
        for url in running["replicas"]:
            assert httpx.get(url + "/v1/routes", verify=ctx, timeout=5).status_code == 200
        with pytest.raises(httpx.HTTPError):  # the CA, but no client certificate
            httpx.get(running["replicas"][0] + "/v1/routes", verify=ssl.create_default_context(cafile=tls["ca"]))
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    stopped = json.loads(out.splitlines()[-1])
    assert stopped["sent"] > 0 and stopped["errors"] == 0, stopped
