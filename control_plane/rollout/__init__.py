"""The rollout at work: :class:`RolloutManager` changes a route's mode through its gates,
persists it with its audit entry in the store, follows the fleet (resync, pub/sub), rolls
back automatically when Redis fails, and writes back what a store that lost its data
forgot; :class:`Adjustments` are the runtime limit changes. The pure decisions they apply
are in :mod:`control_plane.model`."""

from __future__ import annotations

from .adjustments import Adjustments
from .candidates import CandidateRefused, Candidates, NoCandidate
from .manager import GateRefused, RolloutManager

__all__ = ["Adjustments", "CandidateRefused", "Candidates", "GateRefused", "NoCandidate", "RolloutManager"]
