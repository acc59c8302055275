"""The rollout's vocabulary, pure (no IO, nothing else of control_plane imported): route
modes and the canary's share (:mod:`.rollout`: ``Mode``, ``RouteState``, ``next_step``,
``canary_bucket``), divergence classes (``Divergence``, ``classify``), audit entries
(``AuditEntry``), the promotion gates (``GateConfig``, ``GateStats``, ``GateResult``,
``evaluate_gate``), and what a replica remembers of the store to restore it after Redis lost
its data (:mod:`.recovery`: ``StateMemory``). Every other room builds on these."""

from __future__ import annotations

from .recovery import StateMemory
from .rollout import AuditEntry, Divergence, GateConfig, GateResult, GateStats, Mode, RouteState, evaluate_gate

__all__ = [
    "AuditEntry",
    "Divergence",
    "GateConfig",
    "GateResult",
    "GateStats",
    "Mode",
    "RouteState",
    "StateMemory",
    "evaluate_gate",
]
