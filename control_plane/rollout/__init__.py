"""The rollout at work: :class:`RolloutManager` changes a route's mode through its gates,
persists it with its audit entry in the store, follows the fleet (resync, pub/sub), rolls
back automatically when Redis fails, and writes back what a store that lost its data
forgot; :class:`Adjustments` are the runtime limit changes; :class:`Plans` are the routes'
rollout plans and :class:`PlanDriver` the replica of the fleet that drives them. The pure
decisions they apply are in :mod:`control_plane.model`."""

from __future__ import annotations

from .adjustments import Adjustments
from .candidates import CandidateRefused, Candidates, NoCandidate
from .manager import GateRefused, RolloutManager
from .plan_driver import PlanDriver
from .plans import NoPlan, Plans

__all__ = [
    "Adjustments", "CandidateRefused", "Candidates", "GateRefused", "NoCandidate", "NoPlan", "PlanDriver", "Plans",
    "RolloutManager",
]  # fmt: skip
