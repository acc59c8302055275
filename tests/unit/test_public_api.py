"""The public names of each package are a contract: nothing leaks, nothing disappears."""

import control_plane
import dashboard
import limiter


def test_limiter_public_names():
    assert sorted(limiter.__all__) == [
        "Algorithm",
        "BackendAuthError",
        "BackendError",
        "BackendReplyError",
        "BackendTimeout",
        "BackendUnavailable",
        "BucketView",
        "CircuitOpenError",
        "Decision",
        "LimiterError",
        "LocalLimiter",
        "Policy",
        "RedisConnection",
        "RedisLimiter",
        "speedups_available",
    ]
    for name in limiter.__all__:
        assert getattr(limiter, name) is not None


def test_limiter_resp_public_names():
    import limiter.resp as resp

    assert resp.__all__ == sorted(resp.__all__)
    assert resp.__all__ == [
        "ClusterBackend",
        "Endpoint",
        "NodeClient",
        "NodeConnection",
        "RedisTarget",
        "ReplyError",
        "SentinelBackend",
        "StandaloneBackend",
        "bulk",
        "encode_command",
        "parse_redis_url",
    ]
    for name in resp.__all__:
        assert getattr(resp, name) is not None


def test_limiter_embedded_public_names():
    import limiter.embedded as embedded

    assert embedded.__all__ == sorted(embedded.__all__)
    assert embedded.__all__ == [
        "Access",
        "CLUSTER_SLOTS",
        "ENV_SERVER_BIN",
        "EmbeddedCluster",
        "EmbeddedRedis",
        "EmbeddedRedisError",
        "EmbeddedSentinel",
        "EmbeddedSentinelSet",
        "TestPki",
        "TlsServerConfig",
        "find_redis_server",
        "main",
        "make_test_pki",
        "move_slots",
        "slot_owners",
        "slot_ranges",
    ]
    for name in embedded.__all__:
        assert getattr(embedded, name) is not None


def test_the_runtime_path_never_imports_the_embedded_launcher():
    """limiter.embedded (private redis-server processes) is for the demo, tests, benchmarks
    and ``serve --embedded-redis``, which imports it lazily: serving never loads it."""
    import subprocess
    import sys

    code = (
        "import sys, limiter, limiter.resilience, control_plane, control_plane.server.app, control_plane.cli, "
        "control_plane.wiring; print(sorted(m for m in sys.modules if m.startswith('limiter.embedded')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_control_plane_public_names():
    assert sorted(control_plane.__all__) == [
        "Engine",
        "Settings",
        "SettingsError",
        "ShadowLimitMiddleware",
        "create_app",
        "load_settings",
    ]
    for name in control_plane.__all__:
        assert getattr(control_plane, name) is not None


def test_control_plane_rules_public_names():
    import control_plane.rules as rules

    assert rules.__all__ == sorted(rules.__all__)
    assert rules.__all__ == [
        "ListMatcher",
        "RouteRule",
        "Rules",
        "RulesError",
        "RulesWatcher",
        "compile_path_pattern",
        "default_route",
        "load_rules",
        "parse_duration",
        "parse_rules",
    ]
    for name in rules.__all__:
        assert getattr(rules, name) is not None


def test_control_plane_external_public_names():
    import control_plane.external as external

    assert external.__all__ == sorted(external.__all__)
    assert external.__all__ == [
        "BackendHosts",
        "BreakerSet",
        "DEFAULT_CACHE_TTL_S",
        "DEFAULT_MAX_CONCURRENT",
        "DEFAULT_TIMEOUT_S",
        "ExternalConfig",
        "ExternalLimits",
        "ExternalManager",
        "ExternalResolver",
        "HeaderFilter",
        "InvalidResponse",
        "KeyBreaker",
        "Resolution",
        "STALE_TTL_S",
        "check_service_url",
        "is_sensitive_header",
        "parse_limits",
        "resolve_ttl",
        "response_forbids_storing",
    ]
    for name in external.__all__:
        assert getattr(external, name) is not None


def test_control_plane_store_public_names():
    import control_plane.store

    assert sorted(control_plane.store.__all__) == [
        "AUDIT_MAXLEN",
        "AuditListener",
        "DIVERGENCE_FIELDS",
        "DIVERGENCE_TTL_S",
        "DivergenceStore",
        "LeaseLost",
        "PlanConflict",
        "PlanStore",
        "PlanWrite",
        "RestoreResult",
        "RolloutStore",
        "StoreError",
        "StoreUnavailable",
        "VersionConflict",
        "audit_entry_from_dict",
        "gate_stats_of",
        "totals_of",
        "translate_errors",
    ]
    for name in control_plane.store.__all__:
        assert getattr(control_plane.store, name) is not None


def test_dashboard_public_names_and_no_engine_imports():
    assert sorted(dashboard.__all__) == ["ShadowlimitDashboard", "run_dashboard"]
    for name in dashboard.__all__:
        assert getattr(dashboard, name) is not None


def _absolute_imports(package) -> list[tuple[str, str]]:
    """(file name, imported module) for every absolute import in a package's modules."""
    import ast
    import pathlib

    found = []
    for path in pathlib.Path(package.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path.name, node.module))
    return found


def test_limiter_never_imports_control_plane_or_dashboard():
    bad = [(f, m) for f, m in _absolute_imports(limiter) if m.startswith(("control_plane", "dashboard"))]
    assert bad == []


def test_dashboard_talks_http_only():
    bad = [(f, m) for f, m in _absolute_imports(dashboard) if m.startswith(("control_plane", "limiter"))]
    assert bad == []
    assert any(m == "httpx" for _, m in _absolute_imports(dashboard))  # the walk does see imports


ROOMS = {
    "api": [
        "admin", "authz", "candidates", "decide", "external", "health", "observe", "plans", "routes", "stream",
        "whatif",
    ],
    "cli": [
        "CliError", "EXIT_AUTH", "EXIT_GATE", "EXIT_OK", "EXIT_REFUSED", "EXIT_STALE", "EXIT_UNAVAILABLE",
        "EXIT_UNREACHABLE", "EXIT_USAGE", "build_parser", "main",
    ],
    "model": [
        "AuditEntry", "Cause", "Divergence", "GateConfig", "GateResult", "GateStats", "Mode", "Plan", "PlanRecord",
        "PlanStatus", "RouteState", "StateMemory", "Verdict", "analyse", "cause_of", "evaluate_gate", "next_action",
    ],
    "observe": ["Activity", "EventHub", "FleetViews", "Metrics", "Notifier", "PrometheusClient"],
    "rollout": [
        "Adjustments", "CandidateRefused", "Candidates", "GateRefused", "NoCandidate", "NoPlan", "PlanDriver", "Plans",
        "RolloutManager",
    ],
    "server": ["create_app"],
    "settings": ["Settings", "SettingsError", "env_name", "load_settings"],
}  # fmt: skip


def test_the_rooms_public_names():
    """control_plane's rooms: each says what it offers the others, nothing more."""
    import importlib

    for room, names in ROOMS.items():
        module = importlib.import_module(f"control_plane.{room}")
        assert sorted(module.__all__) == names, room
        for name in module.__all__:
            # a name is an attribute, or a submodule that `from control_plane.<room> import *` loads
            if not hasattr(module, name):
                importlib.import_module(f"control_plane.{room}.{name}")
            assert getattr(module, name) is not None, f"control_plane.{room}.{name}"
