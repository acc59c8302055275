"""What the control plane observes and reports: Prometheus metrics (:mod:`.metrics`), the
per-route activity and the would-be-blocked keys (:mod:`.activity`, :mod:`.hitters`), the
fleet-wide views read in the background (:mod:`.views`), the event stream's hub and
snapshots (:mod:`.events`, :mod:`.snapshots`), logging and the audit log file (:mod:`.logs`,
:mod:`.auditlog`), and the incidents an unexpected error is reported under
(:mod:`.incidents`), the rollout plans' notifications (:mod:`.notify`) and their questions to
a Prometheus (:mod:`.prometheus`); the metric families of :mod:`.families`."""

from __future__ import annotations

from .activity import Activity
from .events import EventHub
from .metrics import Metrics
from .notify import Notifier
from .prometheus import PrometheusClient
from .views import FleetViews

__all__ = ["Activity", "EventHub", "FleetViews", "Metrics", "Notifier", "PrometheusClient"]
