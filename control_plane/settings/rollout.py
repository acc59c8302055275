"""The rollout's settings (a part of the one settings object,
:class:`~control_plane.settings.Settings`, which inherits them): the promotion gates, the
automatic rollback, the mode of a route never moved, and how far a replica's clock may be
from Redis' before its divergence is put down to the clock."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, Field

__all__ = ["RolloutSettings"]


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class RolloutSettings(BaseModel):
    """The rollout's fields (see the module docstring)."""

    gate_window_s: int = Field(300, ge=10, validation_alias=_env("SHADOWLIMIT_GATE_WINDOW_S"))
    gate_min_samples: int = Field(500, ge=0, validation_alias=_env("SHADOWLIMIT_GATE_MIN_SAMPLES"))
    gate_max_new_rejection_rate: float = Field(
        0.01, ge=0, le=1, validation_alias=_env("SHADOWLIMIT_GATE_MAX_NEW_REJECTION_RATE")
    )
    gate_max_backend_error_rate: float = Field(
        0.001, ge=0, le=1, validation_alias=_env("SHADOWLIMIT_GATE_MAX_BACKEND_ERROR_RATE")
    )
    gate_min_sampled_share: float = Field(
        0.9,
        ge=0,
        le=1,
        validation_alias=_env("SHADOWLIMIT_GATE_MIN_SAMPLED_SHARE"),
        description=(
            "A promotion needs at least this share of the window's decisions evaluated by the distributed limiter"
            " (not dropped by a full shadow queue); 0 turns the check off."
        ),
    )
    gate_min_dwell_s: float = Field(
        600.0,
        ge=0,
        validation_alias=_env("SHADOWLIMIT_GATE_MIN_DWELL_S"),
        description=(
            "A promotion needs the route to have been this many seconds in its current step (shadow, each canary"
            " percentage) since the step was set; a route's min_dwell in the rules file overrides it; 0 turns it off."
        ),
    )
    auto_rollback_after_s: float = Field(
        30.0,
        gt=0,
        validation_alias=_env("SHADOWLIMIT_AUTO_ROLLBACK_AFTER_S"),
        description="Enforced routes fall back to shadow when the breaker stays open this long.",
    )
    default_mode: str = Field(
        "shadow",
        pattern="^(off|shadow|canary|enforce)$",
        validation_alias=_env("SHADOWLIMIT_DEFAULT_MODE"),
        description="Mode of a route with no stored state.",
    )
    gate_counts: Literal["all", "tighter"] = Field(
        "all",
        validation_alias=_env("SHADOWLIMIT_GATE_COUNTS"),
        description=(
            "Which new rejections SHADOWLIMIT_GATE_MAX_NEW_REJECTION_RATE counts: all, or tighter (only those the old"
            " limit would have admitted even on one replica, and those not explained; the leak across replicas, fresh"
            " buckets and clock skew are left out)."
        ),
    )
    clock_skew_tolerance_ms: float = Field(
        250.0,
        ge=0,
        le=3_600_000,
        validation_alias=_env("SHADOWLIMIT_CLOCK_SKEW_TOLERANCE_MS"),
        description=(
            "How far (milliseconds, either way) a replica's clock may be from Redis' TIME before a new rejection it"
            " sees on a caller-clock policy (RATE_LIMIT_TIME_SOURCE=local) is put down to the clock."
        ),
    )
