"""The rules in force on this replica: the rules file, hot reloaded by its watcher (a bad
file never replaces good rules), each reload -- good, bad, or the file put back to the
rules in force -- counted, announced and audited, and the parts that follow the rules
told about new ones."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from .events import EventHub
from .metrics import Metrics
from .rollout import AuditEntry
from .rules import Rules, RulesError, RulesWatcher, load_rules
from .settings import Settings
from .store import RolloutStore

__all__ = ["LiveRules"]


class LiveRules:
    """The current rules (``current``), their watcher and what a reload does."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: RolloutStore,
        metrics: Metrics,
        events: EventHub,
        instance_id: str,
        rules: Rules | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.events = events
        self.instance_id = instance_id
        self.current = rules or load_rules(settings.rules_path, settings)
        self.last_error: str | None = None
        self.listeners: list[Callable[[Rules], None]] = []
        self._audit_tasks: set[asyncio.Task[Any]] = set()
        self.watcher: RulesWatcher | None = None
        if settings.rules_path is not None:
            # the rules were just loaded: the watcher starts from them instead of reading the file again
            self.watcher = RulesWatcher(
                settings.rules_path,
                settings,
                on_change=self._changed,
                on_error=self._rejected,
                initial=self.current,
                on_recover=self._recovered,
            )

    def __call__(self) -> Rules:
        return self.current

    def reload(self) -> Rules:
        """The admin call: re-read the rules file now (keeps the last good on error)."""
        if self.watcher is None:
            raise RulesError("no rules file is configured (RATE_LIMIT_RULES_PATH)")
        return self.watcher.reload(force=True)

    async def run(self) -> None:
        if self.watcher is not None:
            await self.watcher.run(self.settings.rules_poll_interval_s)

    # -- what a reload does --------------------------------------------------------------

    def _changed(self, rules: Rules) -> None:
        self.current = rules
        self.last_error = None
        self.metrics.rules_reloads.labels("ok").inc()
        self.metrics.rules_valid.set(1)
        self.events.publish(
            {
                "type": "rules_reload",
                "ok": True,
                "routes": rules.names(),
                "digest": rules.digest,
                "instance": self.instance_id,
            }
        )
        for listener in self.listeners:
            listener(rules)
        self._audit(True, f"{len(rules.names())} routes, digest {rules.digest[:12]}")

    def _rejected(self, err: RulesError) -> None:
        self.last_error = str(err)
        self.metrics.rules_reloads.labels("error").inc()
        self.metrics.rules_valid.set(0)
        self.events.publish({"type": "rules_reload", "ok": False, "error": str(err), "instance": self.instance_id})
        self._audit(False, str(err))

    def _recovered(self, rules: Rules) -> None:
        """The rejected file was put back to the rules in force: nothing to reload, but
        the error is over (rules_error, rate_limit_rules_valid, an event and the audit)."""
        self.last_error = None
        self.metrics.rules_valid.set(1)
        self.events.publish(
            {
                "type": "rules_reload",
                "ok": True,
                "recovered": True,
                "routes": rules.names(),
                "digest": rules.digest,
                "instance": self.instance_id,
            }
        )
        names, digest = len(rules.names()), rules.digest[:12]
        self._audit(True, f"the file is back to the rules in force ({names} routes, digest {digest})")

    # -- the audit, written in the background ---------------------------------------------

    def _audit(self, ok: bool, detail: str) -> None:
        entry = AuditEntry(
            route="*",
            actor=f"instance/{self.instance_id}",
            from_mode="",
            to_mode="ok" if ok else "error",
            reason=detail,
            kind="rules_reload",
        )
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to write with
            self._spawn(self._append(entry))

    async def _append(self, entry: AuditEntry) -> None:
        with contextlib.suppress(Exception):  # the reload is logged and counted either way
            await self.store.append_audit(entry)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            raise
        self._audit_tasks.add(task)
        task.add_done_callback(self._audit_tasks.discard)

    async def settle(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until the audit entries written in the background are stored."""
        if self._audit_tasks:
            await asyncio.wait(list(self._audit_tasks), timeout=timeout)
