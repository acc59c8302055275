"""Hot reload of ``SHADOWLIMIT_ENVOY_CONFIG``: a changed file or directory is read whole and
swapped in when valid; a bad one keeps the last good configuration and is reported once.

Like :class:`~control_plane.rules.RulesWatcher`, it polls: the files' names, sizes and
modification times say whether anything may have changed (and times too recent to trust
are read again); the content digest says whether it did. A directory is read as
envoyproxy/ratelimit reads its config directory, Kubernetes ConfigMap mounts included
(their files are symlinks swapped at once).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..rules.errors import RulesError
from ..rules.watcher import RACY_WINDOW_S
from .config import EnvoyConfig, config_files, files_digest, parse_envoy_files, read_config

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["EnvoyConfigWatcher"]

log = logging.getLogger("shadowlimit.envoy")


class EnvoyConfigWatcher:
    """Reloads the Envoy configuration when it changes (see the module docstring).

    ``on_change(config)`` is called with a new valid configuration, ``on_error(err)`` once
    per bad version, ``on_recover(config)`` when the files go back to the configuration in
    force after an error.
    """

    def __init__(
        self,
        path: str | Path,
        settings: Settings,
        *,
        initial: EnvoyConfig,
        on_change: Callable[[EnvoyConfig], None] | None = None,
        on_error: Callable[[RulesError], None] | None = None,
        on_recover: Callable[[EnvoyConfig], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.settings = settings
        self.config = initial
        self.on_change = on_change
        self.on_error = on_error
        self.on_recover = on_recover
        self.last_error: RulesError | None = None
        self._clock = clock
        self._lock = threading.RLock()
        self._sig: Any = self._signature()
        self._read_at = clock()
        self._bad_digest: str | None = None

    def _signature(self) -> Any:
        """Names, sizes and modification times of the files (an error's text if unreadable)."""
        try:
            files = config_files(self.path)
            return tuple((p.name, st.st_mtime_ns, st.st_size) for p in files for st in (os.stat(p),))
        except (OSError, RulesError) as exc:
            return ("error", str(exc))

    def _report(self, err: RulesError) -> None:
        if self.last_error is not None and str(self.last_error) == str(err):
            return
        self.last_error = err
        log.warning("Envoy configuration rejected, keeping the last good one: %s", err)
        if self.on_error is not None:
            self.on_error(err)

    def _racy(self, sig: Any) -> bool:
        newest = max((m for _, m, _ in sig), default=0) if sig and sig[0] != "error" else 0
        return newest / 1e9 >= self._read_at - RACY_WINDOW_S

    def check(self) -> bool:
        """Reload if the files changed; True when a new configuration was applied."""
        with self._lock:
            sig = self._signature()
            if sig == self._sig and not self._racy(sig):
                return False
            try:
                return self._load(force=False, sig=sig) is not None
            except RulesError:
                return False

    def reload(self) -> EnvoyConfig:
        """Read the configuration now (the admin call); a bad one raises and is reported."""
        with self._lock:
            self._load(force=True, sig=self._signature())
            return self.config

    def _load(self, *, force: bool, sig: Any) -> EnvoyConfig | None:
        read_at = self._clock()
        try:
            files = read_config(self.path)
        except RulesError as err:
            self._report(err)
            raise
        if self._signature() != sig:
            return None  # being written right now: next time
        self._sig, self._read_at = sig, read_at
        digest = files_digest(files)
        if digest == self.config.digest and not force:
            self._recovered()
            return None
        if digest == self._bad_digest and not force:
            return None
        try:
            config = parse_envoy_files(files, self.settings, digest=digest, clock=self._clock)
        except RulesError as err:
            self._bad_digest = digest
            self._report(err)
            raise
        self.config, self.last_error, self._bad_digest = config, None, None
        log.info("Envoy configuration reloaded: %d routes, digest %s", len(config.routes), digest[:12])
        if self.on_change is not None:
            self.on_change(config)
        return config

    def _recovered(self) -> None:
        if self.last_error is None:
            return
        self.last_error, self._bad_digest = None, None
        if self.on_recover is not None:
            self.on_recover(self.config)

    async def run(self, interval_s: float) -> None:
        """:meth:`check` every ``interval_s`` seconds until cancelled."""
        while True:
            try:
                self.check()
            except Exception:  # a failing callback must not stop the watcher
                log.exception("Envoy configuration check failed")
            await asyncio.sleep(interval_s)
