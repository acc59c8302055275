"""The control plane's process tuning: the GC (control_plane/gctune.py: applied once the
app has started, undone when it stops, switched off by SHADOWLIMIT_GC_TUNING) and
FastAPI's OpenTelemetry hook (off unless SHADOWLIMIT_OTEL)."""

from __future__ import annotations

import gc

import pytest

from control_plane import gctune
from control_plane.gctune import YOUNG_THRESHOLD, tune_gc
from control_plane.server.app import create_app
from control_plane.settings import SettingsError, load_settings


@pytest.fixture
def gc_state():
    """Start from the interpreter's defaults and put the test process back as it was."""
    before = gc.get_threshold()
    assert gctune.tunings_in_effect() == 0, "another test left the GC tuned"
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    yield
    gctune.forget_tunings()  # a failed test may not have undone its tuning
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_freezes_the_heap_and_raises_the_young_threshold(gc_state):
    tuning = tune_gc()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert tuning.frozen > 1000 and gc.get_freeze_count() > 1000  # the test process's modules at least
    tuning.undo()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_tune_never_lowers_a_higher_threshold(gc_state):
    gc.set_threshold(100_000, 20, 30)
    tuning = tune_gc()
    assert gc.get_threshold() == (100_000, 20, 30)
    tuning.undo()
    assert gc.get_threshold() == (100_000, 20, 30)


def test_two_users_the_last_undo_restores(gc_state):
    a = tune_gc()
    b = tune_gc()
    a.undo()
    a.undo()  # idempotent: does not release b's share
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
    b.undo()
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_a_host_freeze_is_never_undone(gc_state):
    gc.freeze()  # the host's own (say, before forking workers)
    host = gc.get_freeze_count()
    tuning = tune_gc()
    tuning.undo()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() >= host


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_app_tunes_while_it_runs(gc_state, redis_url, enabled):
    app = create_app(load_settings(redis_url=redis_url, namespace="gct", rules_path=None, gc_tuning=enabled))
    async with app.router.lifespan_context(app):
        if enabled:
            assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
        else:
            assert gc.get_threshold()[0] == 700 and gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_setting_is_validated(monkeypatch):
    monkeypatch.setenv("SHADOWLIMIT_GC_TUNING", "false")
    assert load_settings().gc_tuning is False
    monkeypatch.setenv("SHADOWLIMIT_GC_TUNING", "sometimes")
    with pytest.raises(SettingsError, match="SHADOWLIMIT_GC_TUNING"):
        load_settings()


@pytest.mark.parametrize("enabled", [True, False])
def test_fastapi_telemetry_follows_the_otel_setting(enabled):
    """FastAPI's OpenTelemetry hook is off unless SHADOWLIMIT_OTEL asks for it (it checks
    for a provider on every request)."""
    app = create_app(load_settings(rules_path=None, otel=enabled))
    config = app._telemetry  # FastAPI's resolved telemetry settings
    assert (config["tracing"], config["metrics"], config["logs"]) == (
        (True, True, True) if enabled else (False, False, False)
    )
