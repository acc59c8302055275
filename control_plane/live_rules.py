"""The rules in force on this replica: the rules file and the Envoy configuration
(``SHADOWLIMIT_ENVOY_CONFIG``, whose descriptors add routes), each hot reloaded by its
watcher (a bad file never replaces good rules), each reload -- good, bad, or the file put
back to the rules in force -- counted, announced and audited, and the parts that follow
the rules told about new ones."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Coroutine
from typing import Any

from .envoy.config import EnvoyConfig, load_envoy_config
from .envoy.watcher import EnvoyConfigWatcher
from .events import EventHub
from .metrics import Metrics
from .rollout import AuditEntry
from .rules import Rules, RulesError, RulesWatcher, load_rules
from .settings import Settings
from .store import RolloutStore

__all__ = ["LiveRules"]


class LiveRules:
    """The current rules (``current``: the rules file's routes, then the Envoy
    configuration's), their watchers and what a reload does."""

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
        self.base = rules or load_rules(settings.rules_path, settings)
        self.envoy: EnvoyConfig | None = None
        self.envoy_watcher: EnvoyConfigWatcher | None = None
        if settings.envoy_config is not None:
            self.envoy = load_envoy_config(settings.envoy_config, settings)
            self.envoy_watcher = EnvoyConfigWatcher(
                settings.envoy_config,
                settings,
                initial=self.envoy,
                on_change=self._envoy_changed,
                on_error=lambda err: self._rejected(err, "envoy"),
                on_recover=lambda cfg: self._recovered(self.current, "envoy"),
            )
        self.current = self._compose()
        self.rules_error: str | None = None
        self.envoy_error: str | None = None
        self.listeners: list[Callable[[Rules], None]] = []
        self._audit_tasks: set[asyncio.Task[Any]] = set()
        self.watcher: RulesWatcher | None = None
        if settings.rules_path is not None:
            # the rules were just loaded: the watcher starts from them instead of reading the file again
            self.watcher = RulesWatcher(
                settings.rules_path,
                settings,
                on_change=self._changed,
                on_error=lambda err: self._rejected(err, "rules"),
                initial=self.base,
                on_recover=lambda rules: self._recovered(self.current, "rules"),
            )

    def __call__(self) -> Rules:
        return self.current

    @property
    def watching(self) -> bool:
        """Whether there is a file to watch (the rules file, the Envoy configuration)."""
        return self.watcher is not None or self.envoy_watcher is not None

    @property
    def last_error(self) -> str | None:
        """Why the last reload of either source was refused, while it still is."""
        errors = [e for e in (self.rules_error, self.envoy_error) if e]
        return "; ".join(errors) if errors else None

    def _compose(self) -> Rules:
        if self.envoy is None:
            return self.base
        digest = hashlib.sha256(f"{self.base.digest}+{self.envoy.digest}".encode()).hexdigest()
        return self.base.with_routes(self.envoy.routes, digest)

    def reload(self) -> Rules:
        """The admin call: re-read the rules file and the Envoy configuration now (each
        keeps its last good version on error, and the first error is raised)."""
        if self.watcher is None and self.envoy_watcher is None:
            raise RulesError(
                "no rules file (RATE_LIMIT_RULES_PATH) or Envoy configuration (SHADOWLIMIT_ENVOY_CONFIG) is configured"
            )
        first: RulesError | None = None
        for w in (self.watcher, self.envoy_watcher):
            if w is None:
                continue
            try:
                w.reload()
            except RulesError as err:
                first = first or err
        if first is not None:
            raise first
        return self.current

    async def run(self) -> None:
        interval = self.settings.rules_poll_interval_s
        runs = [w.run(interval) for w in (self.watcher, self.envoy_watcher) if w is not None]
        if runs:
            await asyncio.gather(*runs)

    # -- what a reload does --------------------------------------------------------------

    def _changed(self, rules: Rules) -> None:
        self.base = rules
        self.rules_error = None
        self._apply("rules", f"{len(rules.names())} routes, digest {rules.digest[:12]}")

    def _envoy_changed(self, config: EnvoyConfig) -> None:
        self.envoy = config
        self.envoy_error = None
        self._apply("envoy", f"Envoy configuration: {len(config.routes)} routes, digest {config.digest[:12]}")

    def _apply(self, source: str, detail: str) -> None:
        rules = self.current = self._compose()
        self.metrics.rules_reloads.labels("ok").inc()
        self.metrics.rules_valid.set(0 if self.last_error else 1)
        self.events.publish(
            {
                "type": "rules_reload",
                "ok": True,
                "source": source,
                "routes": rules.names(),
                "digest": rules.digest,
                "instance": self.instance_id,
            }
        )
        for listener in self.listeners:
            listener(rules)
        self._audit(True, detail)

    def _rejected(self, err: RulesError, source: str) -> None:
        if source == "envoy":
            self.envoy_error = str(err)
        else:
            self.rules_error = str(err)
        self.metrics.rules_reloads.labels("error").inc()
        self.metrics.rules_valid.set(0)
        self.events.publish(
            {"type": "rules_reload", "ok": False, "source": source, "error": str(err), "instance": self.instance_id}
        )
        self._audit(False, str(err))

    def _recovered(self, rules: Rules, source: str) -> None:
        """The rejected file was put back to the rules in force: nothing to reload, but
        the error is over (rules_error, rate_limit_rules_valid, an event and the audit)."""
        if source == "envoy":
            self.envoy_error = None
        else:
            self.rules_error = None
        self.metrics.rules_valid.set(0 if self.last_error else 1)
        self.events.publish(
            {
                "type": "rules_reload",
                "ok": True,
                "recovered": True,
                "source": source,
                "routes": rules.names(),
                "digest": rules.digest,
                "instance": self.instance_id,
            }
        )
        names, digest = len(rules.names()), rules.digest[:12]
        what = "the Envoy configuration is" if source == "envoy" else "the file is"
        self._audit(True, f"{what} back to the rules in force ({names} routes, digest {digest})")

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
