"""Hot reload of ``SHADOWLIMIT_ENVOY_CONFIG``: a changed file or directory is read whole and
swapped in when valid; a bad one keeps the last good configuration and is reported once.

Like :class:`~control_plane.rules.RulesWatcher`, it polls: the files' names, sizes and
modification times say whether anything may have changed (and times too recent to trust
are read again); the content digest says whether it did. A directory is read as
envoyproxy/ratelimit reads its config directory, Kubernetes ConfigMap mounts included
(their files are symlinks swapped at once).

:meth:`EnvoyConfigWatcher.run` (and :meth:`~EnvoyConfigWatcher.reload_async`, the admin
call) never read on the event loop: the files are read and hashed in a thread, parsed
in a child process (:mod:`.offload`), and the new configuration is
built in steps that yield to the loop. One parse at a time: a change arriving meanwhile
cancels it and the newest version is read instead. :meth:`~EnvoyConfigWatcher.check`
and :meth:`~EnvoyConfigWatcher.reload` do it all at once, in the caller's thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..rules.errors import RulesError
from ..rules.offload import SUPERSEDED, Changed, cancelled_if_changed
from ..rules.watcher import RACY_WINDOW_S
from .config import EnvoyConfig, config_files, files_digest, parse_envoy_files, read_config
from .offload import parse_envoy_offloaded

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["EnvoyConfigWatcher"]

log = logging.getLogger("shadowlimit.envoy")


class EnvoyConfigWatcher:
    """Reloads the Envoy configuration when it changes (see the module docstring).

    ``on_change(config)`` is called with a new valid configuration, ``on_error(err)`` once
    per bad version, ``on_recover(config)`` when the files go back to the configuration in
    force after an error. The asynchronous paths call ``on_change_async(config)`` instead,
    when given (it may take its time: it is awaited).
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
        on_change_async: Callable[[EnvoyConfig], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.settings = settings
        self.config = initial
        self.on_change = on_change
        self.on_error = on_error
        self.on_recover = on_recover
        self.on_change_async = on_change_async
        self.last_error: RulesError | None = None
        self._clock = clock
        self._lock = threading.RLock()
        self._alock = asyncio.Lock()
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
        read = self._read(force=force, sig=sig)
        if read is None:
            return None
        files, digest = read
        try:
            config = parse_envoy_files(files, self.settings, digest=digest, clock=self._clock)
        except RulesError as err:
            self._refused(digest, err)
            raise
        self._applied(config)
        if self.on_change is not None:
            self.on_change(config)
        return config

    def _fetch(self) -> tuple[list[tuple[str, bytes]], str, Any, float]:
        """The files, their digest, their signature once read, when (I/O only: run in a thread)."""
        read_at = self._clock()
        files = read_config(self.path)
        return files, files_digest(files), self._signature(), read_at

    def _read(self, *, force: bool, sig: Any) -> tuple[list[tuple[str, bytes]], str] | None:
        """The files and their digest when they are to be parsed (None: being written, or
        nothing new); a RulesError (reported) if unreadable."""
        try:
            fetched = self._fetch()
        except RulesError as err:
            self._report(err)
            raise
        return self._examine(fetched, force=force, sig=sig)

    def _examine(
        self, fetched: tuple[list[tuple[str, bytes]], str, Any, float], *, force: bool, sig: Any
    ) -> tuple[list[tuple[str, bytes]], str] | None:
        files, digest, sig_after, read_at = fetched
        if sig_after != sig:
            return None  # being written right now: next time
        self._sig, self._read_at = sig, read_at
        if digest == self.config.digest and not force:
            self._recovered()
            return None
        if digest == self._bad_digest and not force:
            return None
        return files, digest

    def _refused(self, digest: str, err: RulesError) -> None:
        self._bad_digest = digest
        self._report(err)

    def _applied(self, config: EnvoyConfig) -> None:
        self.config, self.last_error, self._bad_digest = config, None, None
        log.info("Envoy configuration reloaded: %d routes, digest %s", len(config.routes), config.digest[:12])

    # -- off the event loop --------------------------------------------------------------------

    async def check_async(self, poll_s: float = 0.5) -> bool:
        """:meth:`check` without holding the event loop; a newer version of the files
        arriving while one is parsed (seen every ``poll_s``) replaces it."""
        async with self._alock:
            while True:
                sig = await asyncio.to_thread(self._signature)
                if sig == self._sig and not self._racy(sig):
                    return False
                try:
                    result = await self._load_async(force=False, sig=sig, poll_s=poll_s)
                except RulesError:
                    return False
                if result is not SUPERSEDED:
                    return result is not None

    async def reload_async(self) -> EnvoyConfig:
        """:meth:`reload` without holding the event loop."""
        async with self._alock:
            for _ in range(5):  # the files changing while they are read: read them again
                sig = await asyncio.to_thread(self._signature)
                if await self._load_async(force=True, sig=sig, poll_s=None) is not SUPERSEDED:
                    break
            return self.config

    async def _load_async(self, *, force: bool, sig: Any, poll_s: float | None) -> Any:
        """The new configuration applied, None (nothing to apply) or :data:`SUPERSEDED`."""
        try:
            fetched = await asyncio.to_thread(self._fetch)
        except RulesError as err:
            self._report(err)
            raise
        read = self._examine(fetched, force=force, sig=sig)
        if read is None:
            return None
        files, digest = read
        parse = asyncio.ensure_future(parse_envoy_offloaded(files, self.settings, digest=digest, clock=self._clock))
        del files, read, fetched
        if poll_s is not None and await cancelled_if_changed(parse, lambda: self._signature() != sig, poll_s):
            log.info("Envoy configuration changed again while being read: reading the newest")
            return SUPERSEDED
        try:
            config = await parse
        except Changed:
            return SUPERSEDED
        except RulesError as err:
            self._refused(digest, err)
            raise
        self._applied(config)
        if self.on_change_async is not None:
            await self.on_change_async(config)
        elif self.on_change is not None:
            self.on_change(config)
        return config

    def _recovered(self) -> None:
        if self.last_error is None:
            return
        self.last_error, self._bad_digest = None, None
        if self.on_recover is not None:
            self.on_recover(self.config)

    async def run(self, interval_s: float) -> None:
        """:meth:`check_async` every ``interval_s`` seconds until cancelled."""
        while True:
            try:
                await self.check_async(poll_s=interval_s)
            except Exception:  # a failing callback must not stop the watcher
                log.exception("Envoy configuration check failed")
            await asyncio.sleep(interval_s)
