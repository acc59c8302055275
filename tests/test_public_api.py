"""The public names of each package are a contract: nothing leaks, nothing disappears."""

import limiter
import control_plane
import dashboard


def test_limiter_public_names():
    assert sorted(limiter.__all__) == [
        "Algorithm",
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
        "RedisLimiter",
    ]
    for name in limiter.__all__:
        assert getattr(limiter, name) is not None


def test_control_plane_public_names():
    assert sorted(control_plane.__all__) == ["Engine", "Settings", "SettingsError", "ShadowLimitMiddleware", "create_app", "load_settings"]
    for name in control_plane.__all__:
        assert getattr(control_plane, name) is not None


def test_dashboard_public_names_and_no_engine_imports():
    assert sorted(dashboard.__all__) == ["ShadowlimitDashboard", "run_dashboard"]
    for name in dashboard.__all__:
        assert getattr(dashboard, name) is not None


def test_limiter_never_imports_control_plane_or_dashboard():
    import ast
    import pathlib

    root = pathlib.Path(limiter.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert not n.startswith(("control_plane", "dashboard")), f"{path.name} imports {n}"


def test_dashboard_talks_http_only():
    import ast
    import pathlib

    root = pathlib.Path(dashboard.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert not n.startswith(("control_plane", "limiter")), f"dashboard/{path.name} imports {n}"
