"""The settings of rollout plans (a part of the one settings object,
:class:`~control_plane.settings.Settings`, which inherits them): how often the plans are
judged, the plan driver's lease, the Prometheus the plans' checks ask, and where
notifications go (docs/rollout-runbook.md#letting-a-plan-drive)."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, Field, field_validator

__all__ = ["PlanSettings"]


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


def _http_url(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    v = value.strip()
    if not v.lower().startswith(("http://", "https://")) or len(v) <= len("https://"):
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return v


class PlanSettings(BaseModel):
    """The rollout plans' fields (see the module docstring)."""

    plan_interval_s: float = Field(
        5.0,
        ge=0.1,
        le=300,
        validation_alias=_env("SHADOWLIMIT_PLAN_INTERVAL_S"),
        description="How often the replica driving the rollout plans judges each one (seconds).",
    )
    plan_lease_s: float = Field(
        6.0,
        ge=0.5,
        le=300,
        validation_alias=_env("SHADOWLIMIT_PLAN_LEASE_S"),
        description=(
            "The plan driver's lease in Redis: renewed every third of it; a driver that stops renewing it (dead,"
            " cut off) is replaced by another replica within this time."
        ),
    )
    prometheus_url: str | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_PROMETHEUS_URL"),
        description=(
            "The Prometheus (base URL, http://prometheus:9090) the plans' prometheus checks ask, unless the plan"
            " (analysis.url) or the check names its own url; unset: such checks are inconclusive and their plan"
            " waits."
        ),
    )
    prometheus_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        validation_alias=_env("SHADOWLIMIT_PROMETHEUS_TIMEOUT_S"),
        description="The longest a plan's check waits for Prometheus' answer; past it the check is inconclusive.",
    )
    notify_url: str | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_NOTIFY_URL"),
        description=(
            'Where a JSON POST ({"text": ...}, a Slack or Mattermost incoming webhook as is) goes at each step of a'
            " rollout plan, each failure, pause and approval needed; unset: none."
        ),
    )

    @field_validator("prometheus_url")
    @classmethod
    def _check_prometheus(cls, v: str | None) -> str | None:
        return _http_url(v)

    @field_validator("notify_url")
    @classmethod
    def _check_notify(cls, v: str | None) -> str | None:
        return _http_url(v)
