"""The rules in force on this replica: the rules file and the Envoy configuration
(``SHADOWLIMIT_ENVOY_CONFIG``, whose descriptors add routes), each hot reloaded by its
watcher (a bad file never replaces good rules), each reload -- good, bad, or the file put
back to the rules in force -- counted, announced and audited, and the parts that follow
the rules told about new ones.

A reload never holds the event loop: the watchers read and parse off it
(:mod:`control_plane.rules.offload`), the new rules are composed in steps that yield to
it, then swapped in at once (``envoy`` and ``current`` assigned together, with no await
between), and the replaced ones are freed in steps too."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import inspect
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .envoy.config import EnvoyConfig, load_envoy_config
from .envoy.watcher import EnvoyConfigWatcher
from .gctune import tunings_in_effect
from .model.rollout import AuditEntry
from .observe.events import EventHub
from .observe.metrics import Metrics
from .rules import Rules, RulesError, RulesWatcher, load_rules
from .rules.offload import breathe, retire, run_steps
from .rules.yaml_source import gc_paused
from .settings import Settings
from .store import RolloutStore

__all__ = ["LiveRules"]

LISTENERS_TIMEOUT_S = 300.0
"""The longest the collector stays paused for what listeners do after a reload."""


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock  # wall-clock seconds: the reloads' audit entries
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
                on_change_async=self._envoy_changed_async,
            )
        self.current = self._compose()
        self.rules_error: str | None = None
        self.envoy_error: str | None = None
        #: told about new rules; one may return an awaitable (work it finishes in the
        #: background), which :meth:`settle` waits for
        self.listeners: list[Callable[[Rules], object]] = []
        self._audit_tasks: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Future[Any]] = set()  # the listeners' work
        self._retiring: set[asyncio.Task[Any]] = set()  # replaced rules, freed in steps
        self._swap_lock = asyncio.Lock()
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
                on_change_async=self._changed_async,
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

    async def reload_async(self) -> Rules:
        """The admin call: read the rules file and the Envoy configuration again now, without
        holding the event loop (each keeps its last good version on error, and the first
        error is raised)."""
        if self.watcher is None and self.envoy_watcher is None:
            raise RulesError(
                "no rules file (RATE_LIMIT_RULES_PATH) or Envoy configuration (SHADOWLIMIT_ENVOY_CONFIG) is configured"
            )
        first: RulesError | None = None
        for w in (self.watcher, self.envoy_watcher):
            if w is None:
                continue
            try:
                await w.reload_async()
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

    async def _changed_async(self, rules: Rules) -> None:
        await self._swap("rules", base=rules)

    async def _envoy_changed_async(self, config: EnvoyConfig) -> None:
        await self._swap("envoy", envoy=config)

    async def _swap(self, source: str, *, base: Rules | None = None, envoy: EnvoyConfig | None = None) -> None:
        """Compose the new rules in steps, swap them in at once, announce them (the
        listeners one at a time), and free the replaced ones in steps. One swap at a time
        (each composes with the other source's version in force)."""
        async with self._swap_lock:
            base = base or self.base
            envoy = envoy or self.envoy
            current = base
            if envoy is not None:
                digest = hashlib.sha256(f"{base.digest}+{envoy.digest}".encode()).hexdigest()
                current = await run_steps(base.with_routes_steps(envoy.routes, digest))
            kept = (current, base, envoy)
            old = [o for o in (self.current, self.base, self.envoy) if o is not None and all(o is not k for k in kept)]
            # the swap: the service reads envoy then current, with no await between
            self.base, self.envoy, self.current = base, envoy, current
            if envoy is not None and source == "envoy":
                self.envoy_error = None
                detail = f"Envoy configuration: {len(envoy.routes)} routes, digest {envoy.digest[:12]}"
            else:
                self.rules_error = None
                detail = f"{len(base.names())} routes, digest {base.digest[:12]}"
            self._spawn_retiring(retire(*old))
            del old
            self._count_and_publish(current, source, detail)
            work: list[asyncio.Future[Any]] = []
            for listener in self.listeners:
                await breathe()
                result = listener(current)
                if inspect.isawaitable(result):
                    work.append(fut := asyncio.ensure_future(result))
                    self._background.add(fut)
                    fut.add_done_callback(self._background.discard)
            if work and tunings_in_effect():
                self._spawn_retiring(self._frozen_when_done(work))

    async def _frozen_when_done(self, work: list[asyncio.Future[Any]]) -> None:
        """With the collector tuned (control_plane/gctune.py): no collection until what
        the listeners do in the background is done, then freeze it with the rest. The
        routes' metric series are millions of objects for 50,000 routes: collections
        walking them as they are created would stop the loop for up to a second."""
        with gc_paused():
            await asyncio.wait(work, timeout=LISTENERS_TIMEOUT_S)
            gc.freeze()

    def _spawn_retiring(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _apply(self, source: str, detail: str) -> None:
        rules = self.current = self._compose()
        self._count_and_publish(rules, source, detail)
        for listener in self.listeners:
            listener(rules)

    def _count_and_publish(self, rules: Rules, source: str, detail: str) -> None:
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
            at=self.clock(),
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
        """Wait (bounded) until the audit entries written in the background are stored
        and what the listeners finish in the background is done."""
        pending = [*self._audit_tasks, *self._background]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
