"""Secrets from files and the process metrics every replica exports."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from control_plane.observe.metrics import Metrics
from control_plane.settings import SettingsError, load_settings

URL = "redis://127.0.0.1:6379/0"


def test_the_admin_token_can_come_from_a_file(tmp_path) -> None:
    f = tmp_path / "admin-token"
    f.write_text("s3cret-token-0123456789\n")
    s = load_settings(redis_url=URL, admin_token_file=str(f))
    assert s.admin_token is not None and s.admin_token.get_secret_value() == "s3cret-token-0123456789"
    with pytest.raises(SettingsError, match="SHADOWLIMIT_ADMIN_TOKEN_FILE: set it or SHADOWLIMIT_ADMIN_TOKEN"):
        load_settings(redis_url=URL, admin_token_file=str(f), admin_token="other")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SettingsError, match="is empty"):
        load_settings(redis_url=URL, admin_token_file=str(empty))
    with pytest.raises(SettingsError, match="cannot read") as err:
        load_settings(redis_url=URL, admin_token_file=str(tmp_path / "missing"))
    assert "s3cret" not in str(err.value)


def test_process_python_and_build_info_metrics_are_exported() -> None:
    text = generate_latest(Metrics().registry).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
    assert 'shadowlimit_build_info{version="' in text


@pytest.mark.parametrize(
    ("env", "value", "said"),
    [
        ("SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS", "-1", "greater than or equal to 0"),
        ("SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS", "a second", "a valid number"),
        ("SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS", "3600001", "less than or equal to 3600000"),
        ("SHADOWLIMIT_GATE_COUNTS", "tight", "'all' or 'tighter'"),
    ],
)
def test_the_causes_settings_are_checked_naming_the_variable(monkeypatch, env, value, said) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as err:
        load_settings(redis_url=URL)
    assert f"{env}: " in str(err.value) and said in str(err.value) and repr(value) in str(err.value)


def test_the_causes_settings_defaults_and_values(monkeypatch) -> None:
    s = load_settings(redis_url=URL)
    assert (s.clock_skew_tolerance_ms, s.gate_counts) == (250.0, "all")
    monkeypatch.setenv("SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS", "50")
    monkeypatch.setenv("SHADOWLIMIT_GATE_COUNTS", "tighter")
    s = load_settings(redis_url=URL)
    assert (s.clock_skew_tolerance_ms, s.gate_counts) == (50.0, "tighter")
