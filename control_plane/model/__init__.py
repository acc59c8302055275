"""The rollout's vocabulary, pure (no IO, nothing else of control_plane imported): route
modes and the canary's share (:mod:`.rollout`: ``Mode``, ``RouteState``, ``next_step``,
``canary_bucket``), divergence classes (``Divergence``, ``classify``), audit entries
(``AuditEntry``), the promotion gates (``GateConfig``, ``GateStats``, ``GateResult``,
``evaluate_gate``), why a divergent decision diverged (:mod:`.causes`: ``Cause``,
``cause_of``), and what a replica remembers of the store to restore it after Redis lost
its data (:mod:`.recovery`: ``StateMemory``), and rollout plans: the plan (:mod:`.plan`: ``Plan``),
its analysis (:mod:`.plan_analysis`: ``analyse``, ``Verdict``) and its progress
(:mod:`.plan_progress`: ``PlanRecord``, ``PlanStatus``, ``next_action``). Every other room
builds on these."""

from __future__ import annotations

from .causes import Cause, cause_of
from .plan import Plan
from .plan_analysis import Verdict, analyse
from .plan_progress import PlanRecord, PlanStatus, next_action
from .recovery import StateMemory
from .rollout import AuditEntry, Divergence, GateConfig, GateResult, GateStats, Mode, RouteState, evaluate_gate

__all__ = [
    "AuditEntry",
    "Cause",
    "Divergence",
    "GateConfig",
    "GateResult",
    "GateStats",
    "Mode",
    "Plan",
    "PlanRecord",
    "PlanStatus",
    "RouteState",
    "StateMemory",
    "Verdict",
    "analyse",
    "cause_of",
    "evaluate_gate",
    "next_action",
]
