"""The response models of the what-if endpoints (``/v1/whatif``, ``/v1/suggest``), for OpenAPI:
shapes only, as :mod:`.responses` declares the others'."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .responses import PolicyView, _Open

__all__ = ["KeyFigures", "MinuteFigures", "Replay", "Suggestion", "WhatIfResult"]


class KeyFigures(BaseModel):
    key: str
    requests: float
    rejections: float
    units: float = Field(0.0, description="Budget routes: what the refused reserves' estimates would have held.")


class MinuteFigures(BaseModel):
    minute: int
    requests: float
    rejections: float


class Replay(_Open):
    policy: PolicyView
    policy_describe: str
    events: int
    keys: int
    requests: float
    rejections: float
    reject_share: float
    top_keys: list[KeyFigures]
    per_minute: list[MinuteFigures]
    recorded_share: float


class WhatIfResult(BaseModel):
    route: str
    minutes: int
    minutes_recorded: int
    recorded_share: float
    candidate: Replay
    current: Replay


class Suggestion(BaseModel):
    route: str
    minutes: int
    minutes_recorded: int
    recorded_share: float
    max_reject_share: float
    policy: PolicyView
    policy_describe: str
    replay: Replay
