"""Hot reload: :class:`RulesWatcher` swaps in a changed rules file, and never a bad one.

:meth:`RulesWatcher.run` and :meth:`RulesWatcher.reload_async` (the admin call) never read
on the event loop: the file is read and hashed in a thread, parsed in a child process when
it is big (:mod:`.offload`), and its routes built in steps that yield to the loop; a newer
version arriving while one is parsed cancels it. :meth:`RulesWatcher.check` and
:meth:`RulesWatcher.reload` do it all at once, in the caller's thread.

>>> watcher = RulesWatcher("rules.yaml", settings, on_change=print)  # doctest: +SKIP
>>> await watcher.run(interval_s=1.0)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..observe.logs import event_fields
from .errors import RulesError
from .load import load_rules, rules_from_bytes
from .model import Rules
from .offload import SUPERSEDED, Changed, cancelled_if_changed, parse_rules_offloaded
from .yaml_source import read_file

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["RACY_WINDOW_S", "SUPERSEDED", "RulesWatcher"]

log = logging.getLogger("shadowlimit.rules")

RACY_WINDOW_S = 2.0
"""Modification times this close to (or after) the last read are not trusted: the file is re-read."""


def _cannot_read(exc: OSError, path: Path) -> RulesError:
    return RulesError(f"cannot read the rules file: {exc.strerror or exc}", path=str(path))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Read:
    """A file read whole: its stat before (``sig``) and after (``sig_after``: a change in
    between means it was being written), its bytes, when and their digest."""

    sig: tuple[int, int]
    data: bytes
    sig_after: tuple[int, int]
    read_at: float
    digest: str


class RulesWatcher:
    """Reloads the rules file when it changes; a bad file never replaces good rules.

    The constructor loads the file (raising :class:`RulesError` if it is invalid) unless
    ``initial`` rules are given. :meth:`check` (called every ``interval_s`` by
    :meth:`run`) re-reads the file when its ``(mtime_ns, size)`` changed, or while the
    modification time is too recent to tell same-size rewrites apart, and reloads when
    the content digest differs from the current rules. A valid new file calls
    ``on_change(rules)``; an invalid one calls ``on_error(err)`` once per bad version
    and the last good rules stay in place (``last_error`` says why until the file is
    fixed). A file put back to the rules in force after an error (same digest, so
    nothing to reload) calls ``on_recover(rules)``: the error is over. A file caught
    mid-write (its stat changes while being read) is retried on the next check.

    ``clock`` is the wall clock (seconds since the epoch, as file modification times
    are; :func:`time.time` by default): it says when the file was read, for the
    :data:`RACY_WINDOW_S` window, and stamps ``Rules.loaded_at``.

    The asynchronous paths (:meth:`run`, :meth:`check_async`, :meth:`reload_async`) call
    ``on_change_async(rules)`` instead of ``on_change`` when given (it is awaited).
    """

    def __init__(
        self,
        path: str | Path | None,
        settings: Settings,
        on_change: Callable[[Rules], None] | None = None,
        on_error: Callable[[RulesError], None] | None = None,
        *,
        initial: Rules | None = None,
        on_recover: Callable[[Rules], None] | None = None,
        on_change_async: Callable[[Rules], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.on_change_async = on_change_async
        self._alock = asyncio.Lock()
        self.path = Path(path) if path is not None and str(path).strip() else None
        self.settings = settings
        self.on_change = on_change
        self.on_error = on_error
        self.on_recover = on_recover
        self.last_error: RulesError | None = None
        self.reload_count = 0
        self.error_count = 0
        self._clock = clock
        self._lock = threading.RLock()
        self._sig: tuple[int, int] | None = None
        self._read_at = 0.0
        self._bad_digest: str | None = None
        self._bad_sig: object = None
        if initial is not None:
            self._rules = initial
        else:
            self._rules = load_rules(self.path, settings, clock=clock)
            if self.path is not None:
                self._remember_stat(self.path)

    @property
    def rules(self) -> Rules:
        """The last good rules."""
        return self._rules

    def _remember_stat(self, path: Path) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        self._sig = (st.st_mtime_ns, st.st_size)
        self._read_at = self._clock()

    def _report(self, err: RulesError) -> None:
        self.last_error = err
        self.error_count += 1
        log.warning(
            "rules file rejected, keeping the last good rules: %s",
            err,
            extra=event_fields("rules_rejected", source=str(self.path), error=str(err)),
        )
        if self.on_error is not None:
            self.on_error(err)

    def _report_once(self, sig: object, err: RulesError) -> None:
        """Report an unreadable file once per distinct problem."""
        if self._bad_sig != sig:
            self._bad_sig = sig
            self._report(err)

    def _recovered(self) -> None:
        """The file is back to the rules in force: clear the error and say so."""
        if self.last_error is None:
            return
        self.last_error = None
        self._bad_digest = None
        log.info(
            "rules file %s is back to the rules in force (digest %s)",
            self.path,
            self._rules.digest[:12],
            extra=event_fields("rules_recovered", source=str(self.path), digest=self._rules.digest),
        )
        if self.on_recover is not None:
            self.on_recover(self._rules)

    def _apply(self, rules: Rules) -> None:
        self._applied(rules)
        if self.on_change is not None:
            self.on_change(rules)

    def _applied(self, rules: Rules) -> None:
        self._rules = rules
        self.last_error = None
        self._bad_digest = None
        self._bad_sig = None
        self.reload_count += 1
        log.info(
            "rules reloaded from %s: %d routes, digest %s",
            rules.source,
            len(rules.routes),
            rules.digest[:12],
            extra=event_fields("rules_reloaded", source=rules.source, routes=len(rules.routes), digest=rules.digest),
        )

    def _parse(self, path: Path, data: bytes, digest: str) -> Rules:
        """The file's rules; an invalid file is remembered (by digest) and reported."""
        try:
            return rules_from_bytes(data, self.settings, str(path), digest=digest, clock=self._clock)
        except RulesError as err:
            self._bad_digest = digest
            self._report(err)
            raise

    def _read_if_changed(self, path: Path) -> tuple[bytes, str] | None:
        """The file's bytes and digest if it may have changed since the last read and was
        read whole, else None."""
        return self._examine(path, self._fetch(path, only_if_changed=True))

    def _fetch(self, path: Path, *, only_if_changed: bool) -> tuple[Any, ...]:
        """What :meth:`_examine` looks at: the file's stat, bytes, stat once read and
        digest, or the problem (I/O only: run in a thread on the asynchronous paths)."""
        try:
            st = os.stat(path)
        except OSError as exc:
            return ("stat", exc)
        sig = (st.st_mtime_ns, st.st_size)
        racy = st.st_mtime_ns / 1e9 >= self._read_at - RACY_WINDOW_S
        if only_if_changed and sig == self._sig and not racy:
            return ("same",)
        read_at = self._clock()
        try:
            data = read_file(path)
            st2 = os.stat(path)
        except (RulesError, OSError) as exc:
            return ("read", exc)
        read = _Read(
            sig=sig, data=data, sig_after=(st2.st_mtime_ns, st2.st_size), read_at=read_at,
            digest=hashlib.sha256(data).hexdigest(),
        )  # fmt: skip
        return ("ok", read)

    def _examine(self, path: Path, fetched: tuple[Any, ...]) -> tuple[bytes, str] | None:
        if fetched[0] == "stat":
            exc = fetched[1]
            self._report_once(("stat", exc.errno), _cannot_read(exc, path))
            return None
        if fetched[0] == "same":
            return None
        if fetched[0] == "read":
            exc = fetched[1]
            err = exc if isinstance(exc, RulesError) else _cannot_read(exc, path)
            self._report_once(("read", str(err)), err)
            return None
        read: _Read = fetched[1]
        if read.sig_after != read.sig or len(read.data) != read.sig_after[1]:
            return None  # being written right now: try again next time
        self._sig = read.sig
        self._read_at = read.read_at
        self._bad_sig = None  # readable (again)
        return read.data, read.digest

    def check(self) -> bool:
        """Reload if the file changed; True when new rules were applied."""
        if self.path is None:
            return False
        with self._lock:
            read = self._read_if_changed(self.path)
            if read is None:
                return False
            data, digest = read
            if digest == self._rules.digest:
                self._recovered()  # if it had been rejected: it went back to the good version
                return False
            if digest == self._bad_digest:
                return False  # already reported
            try:
                rules = self._parse(self.path, data, digest)
            except RulesError:
                return False
            self._apply(rules)
            return True

    def reload(self, force: bool = True) -> Rules:
        """Re-read the file now (the admin call). Returns the rules now in force.

        ``force`` reloads (and notifies ``on_change``) even if the content is unchanged.
        An invalid file raises :class:`RulesError` (after calling ``on_error``) and the
        previous rules stay in force.
        """
        if self.path is None:
            raise RulesError("no rules file is configured (RATE_LIMIT_RULES_PATH)")
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError as exc:
                err = _cannot_read(exc, self.path)
                self._report(err)
                raise err from None
            try:
                data = read_file(self.path)
            except RulesError as err:
                self._report(err)
                raise
            digest = hashlib.sha256(data).hexdigest()
            if not force and digest == self._rules.digest:
                self._recovered()
                return self._rules
            rules = self._parse(self.path, data, digest)
            self._sig = (st.st_mtime_ns, st.st_size)
            self._read_at = self._clock()
            self._bad_sig = None
            self._apply(rules)
            return rules

    # -- off the event loop --------------------------------------------------------------------

    async def check_async(self, poll_s: float = 0.5) -> bool:
        """:meth:`check` without holding the event loop; a newer version of the file
        arriving while one is parsed (seen every ``poll_s``) replaces it."""
        if self.path is None:
            return False
        path = self.path
        async with self._alock:
            while True:
                read = self._examine(path, await asyncio.to_thread(self._fetch, path, only_if_changed=True))
                if read is None:
                    return False
                data, digest = read
                if digest == self._rules.digest:
                    self._recovered()
                    return False
                if digest == self._bad_digest:
                    return False
                parse = asyncio.ensure_future(self._parse_async(path, data, digest))
                del data, read
                if await cancelled_if_changed(parse, functools.partial(_changed, path, self._sig), poll_s):
                    log.info("rules file %s changed again while being read: reading the newest", path)
                    continue
                try:
                    rules = await parse
                except Changed:
                    continue  # changed while the child read it: the newest version next
                except RulesError:
                    return False
                await self._apply_async(rules)
                return True

    async def reload_async(self, force: bool = True) -> Rules:
        """:meth:`reload` without holding the event loop."""
        if self.path is None:
            raise RulesError("no rules file is configured (RATE_LIMIT_RULES_PATH)")
        path = self.path
        async with self._alock:
            for attempt in range(5):  # the file changing while it is read: read it again
                fetched = await asyncio.to_thread(self._fetch, path, only_if_changed=False)
                if fetched[0] != "ok":
                    exc = fetched[1]
                    err = exc if isinstance(exc, RulesError) else _cannot_read(exc, path)
                    self._report(err)
                    raise err
                read: _Read = fetched[1]
                sig, data, read_at, digest = read.sig, read.data, read.read_at, read.digest
                if not force and digest == self._rules.digest:
                    self._recovered()
                    return self._rules
                try:
                    rules = await self._parse_async(path, data, digest)
                except Changed:
                    if attempt < 4:
                        continue
                    raise RulesError("the file keeps changing while it is read", path=str(path)) from None
                self._sig, self._read_at, self._bad_sig = sig, read_at, None
                await self._apply_async(rules)
                return rules
            raise AssertionError("unreachable")

    async def _parse_async(self, path: Path, data: bytes, digest: str) -> Rules:
        try:
            return await parse_rules_offloaded(data, self.settings, str(path), digest=digest, clock=self._clock)
        except RulesError as err:
            self._bad_digest = digest
            self._report(err)
            raise

    async def _apply_async(self, rules: Rules) -> None:
        self._applied(rules)
        if self.on_change_async is not None:
            await self.on_change_async(rules)
        elif self.on_change is not None:
            self.on_change(rules)

    async def run(self, interval_s: float) -> None:
        """Call :meth:`check_async` every ``interval_s`` seconds until cancelled."""
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s!r}")
        while True:
            try:
                await self.check_async(poll_s=interval_s)
            except Exception:  # a failing callback must not stop the watcher
                log.exception("rules watcher check failed")
            await asyncio.sleep(interval_s)


def _changed(path: Path, sig: tuple[int, int] | None) -> bool:
    """Whether the file's ``(mtime_ns, size)`` is no longer ``sig``."""
    try:
        st = os.stat(path)
    except OSError:
        return True
    return (st.st_mtime_ns, st.st_size) != sig
