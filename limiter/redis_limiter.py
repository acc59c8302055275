"""The distributed limiter: the same decisions as :mod:`limiter.algorithms`, made
atomically in Redis by the Lua scripts in ``lua/``.

>>> rl = RedisLimiter.from_url("redis://127.0.0.1:6379/0", namespace="shadowlimit")  # doctest: +SKIP
>>> await rl.check("client-1", Policy(average=100, burst=20))                       # doctest: +SKIP
Decision(allowed=True, remaining=19, limit=20, retry_after_us=0, reset_after_us=10000)

Keys are ``rl:<namespace>:<key>`` (no hash tag: every key is sharded on its own in
Redis Cluster). Scripts run by EVALSHA; after a Redis restart or ``SCRIPT FLUSH``
the ``NOSCRIPT`` reply is answered by re-sending the script with EVAL, which also
caches it again. A cost of 0 is a peek: the algorithm's read-only twin script
(``lua/peek_<algorithm>.lua``, same KEYS and ARGV) answers what a request of cost 1 would
get, writing nothing. A :meth:`Policy.blocking` policy is answered here, without Redis.
Concurrent checks share pipelined connections (two to a standalone server, one per cluster master; see
:mod:`limiter.resp`).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, Literal, cast

from .algorithms import blocked_decision, decide
from .booked import BookedCalls
from .connection import Backend, RedisConnection, make_backend, make_redis_py_client
from .errors import BackendError, BackendReplyError, BackendUnavailable
from .policy import (
    MAX_COST,
    Algorithm,
    BucketView,
    Charge,
    Decision,
    Policy,
    make_decision,
    takes_charges,
    validate_cost,
)
from .redis_url import RedisTarget
from .resp import ReplyError, encode_command
from .script_calls import Prepared, Run, within
from .scripts import (
    ALL_SCRIPTS,
    MANY_MAX,
    PEEK,
    SCRIPT_SETS,
    STATE_FIELDS,
    STATE_FORMATS,
    Script,
    decode_state,
    policy_args,
)

__all__ = ["RedisLimiter", "TimeSource", "make_backend", "make_redis_py_client"]

TimeSource = Literal["local", "redis"]
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _now_us() -> int:
    return time.time_ns() // 1000


class RedisLimiter(BookedCalls):
    """Async distributed limiter over standalone Redis or Redis Cluster."""

    def __init__(
        self,
        backend: Backend,
        *,
        namespace: str = "shadowlimit",
        time_source: TimeSource = "local",
        clock: Callable[[], int] = _now_us,
        connection: RedisConnection | None = None,
        state_format: int = 1,
    ) -> None:
        if time_source not in ("local", "redis"):
            raise ValueError(f"time_source: must be 'local' or 'redis', got {time_source!r}")
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"namespace: must be 1-64 characters of letters, digits, '_', '.', '-', got {namespace!r}")
        self.backend = backend
        self.namespace = namespace
        self.time_source: TimeSource = time_source
        self._clock = clock
        self._prefix = f"rl:{namespace}:".encode()
        self._prepared: dict[Policy, Prepared] = {}
        # id(policy) -> (that policy, its pieces): the policy kept with them, so an id is never
        # another object's, and two equal policies (a route's local and distributed) both hit
        self._by_id: dict[int, tuple[Policy, Prepared]] = {}
        self._peek_prepared: dict[Policy, Prepared] = {}
        self._charge_prepared: dict[Policy, Prepared] = {}
        # every key on one server (not a cluster): a burst goes as a few calls for many keys
        self._one_server = getattr(backend, "cluster", True) is False
        self.connection = connection  # what the backend was built from (None: a backend given directly)
        self._client: Any = None
        self._scripts = SCRIPT_SETS[1]
        self.set_state_format(state_format)

    @property
    def state_format(self) -> int:
        """The state format this limiter writes (docs/state-format.md); it reads both."""
        return self._scripts.state_format

    def set_state_format(self, state_format: int) -> None:
        """Write ``state_format`` from the next decision on (docs/state-format.md): 1, a hash per
        key (what releases before the compact form read); 2, one decimal number at a GCRA or
        window key. Either reads both."""
        if state_format not in STATE_FORMATS:
            raise ValueError(f"state_format: must be one of {STATE_FORMATS}, got {state_format!r}")
        if state_format != self._scripts.state_format:
            self._scripts = SCRIPT_SETS[state_format]
            self._prepared.clear()
            self._by_id.clear()
            self._peek_prepared.clear()
            self._charge_prepared.clear()

    @classmethod
    def from_url(
        cls,
        url: str | RedisTarget,
        *,
        namespace: str = "shadowlimit",
        time_source: TimeSource = "local",
        connect_timeout: float = 1.0,
        command_timeout: float | None = 0.5,
        cluster: bool | None = None,
        clock: Callable[[], int] = _now_us,
        state_format: int = 1,
    ) -> RedisLimiter:
        """Build from a URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
        ``redis+sentinel://``, see :mod:`limiter.redis_url`) or an already parsed
        :class:`~limiter.redis_url.RedisTarget` (settings that add a password file or TLS
        options to the URL). TLS files are read here: a bad one raises ``ValueError``."""
        connection = RedisConnection.parse(url, connect_timeout=connect_timeout, command_timeout=command_timeout)
        return cls.from_connection(
            connection.with_kind(cluster),
            namespace=namespace,
            time_source=time_source,
            clock=clock,
            state_format=state_format,
        )

    @classmethod
    def from_connection(
        cls,
        connection: RedisConnection,
        *,
        namespace: str = "shadowlimit",
        time_source: TimeSource = "local",
        clock: Callable[[], int] = _now_us,
        state_format: int = 1,
    ) -> RedisLimiter:
        """Build from a :class:`~limiter.connection.RedisConnection`, the description the
        off-hot-path client (:attr:`client`) is built from too."""
        return cls(
            connection.backend(),
            namespace=namespace,
            time_source=time_source,
            clock=clock,
            connection=connection,
            state_format=state_format,
        )

    # -- the hot path -------------------------------------------------------------

    def _prepare(self, policy: Policy) -> Prepared:
        # looked up by identity first: hashing a dataclass on every check is not free
        hit = self._by_id.get(id(policy))
        if hit is not None and hit[0] is policy:
            return hit[1]
        p = self._prepared.get(policy)
        if p is None:
            if len(self._prepared) > 4096:
                self._prepared.clear()
            p = self._prepared[policy] = Prepared(self._scripts.decisions[policy.algorithm], policy)
        if len(self._by_id) > 4096:
            self._by_id.clear()
        self._by_id[id(policy)] = (policy, p)
        return p

    def _prepare_peek(self, policy: Policy) -> Prepared:
        """The peek script's head for the policy (the same ARGV as its decision script)."""
        p = self._peek_prepared.get(policy)
        if p is None:
            if len(self._peek_prepared) > 4096:
                self._peek_prepared.clear()
            p = self._peek_prepared[policy] = Prepared(self._scripts.peeks[policy.algorithm], policy)
        return p

    def _prepare_charge(self, policy: Policy) -> Prepared:
        """The charge script's head for the policy (the same ARGV as its decision script)."""
        p = self._charge_prepared.get(policy)
        if p is None:
            if len(self._charge_prepared) > 4096:
                self._charge_prepared.clear()
            p = self._charge_prepared[policy] = Prepared(self._scripts.charges[policy.algorithm], policy)
        return p

    def _script_of(self, policy: Policy, cost: int) -> Prepared:
        """The pieces of the script a cost asks for: a charge's, a peek's (0) or the decision's."""
        if cost.__class__ is Charge:
            return self._prepare_charge(policy)
        return self._prepare(policy) if cost else self._prepare_peek(policy)

    def _off_path(self, policy: Policy, cost: object, now_us: int | None) -> Decision | int:
        """A cost the hot path does not take as it is: 0 (an int) for a peek, else the
        validated cost (``ValueError`` as :func:`validate_cost` says); or the Decision
        itself for a blocking policy, which needs no Redis (the local clock, never TIME)."""
        c = 0 if type(cost) is int and cost == 0 else validate_cost(policy, cost)
        if policy.blocked:
            return blocked_decision(self._clock() if now_us is None else now_us, policy)
        return c

    def redis_key(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _rest(self, rkey: bytes, prep: Prepared, now_us: int | None, cost: int) -> bytes:
        """Everything after the script reference: KEYS[1], ARGV[1..5], in one format."""
        return b"$%d\r\n%b\r\n%b%b" % (len(rkey), rkey, prep.mid, self._time_cost(now_us, cost))

    def _time_cost(self, now_us: int | None, cost: int) -> bytes:
        """A request's own arguments, its time (``r``: Redis's clock) and cost, as RESP bulk strings."""
        nb = b"r" if self.time_source == "redis" else b"%d" % (self._clock() if now_us is None else now_us)
        cb = b"%d" % cost
        return b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(nb), nb, len(cb), cb)

    async def check(
        self, key: str, policy: Policy, cost: int = 1, now_us: int | None = None, *, timeout_s: float | None = None
    ) -> Decision:
        """Decide one request atomically in Redis. Raises :class:`BackendError` on failure,
        :class:`DeadlineExceeded` when Redis has not answered within ``timeout_s``.

        A :class:`~limiter.policy.Charge` cost is a charge, counted whatever is left
        (``lua/charge_<algorithm>.lua``, :mod:`limiter.charges`). ``cost=0`` is a peek: the
        answer a request of cost 1 would get now, nothing written
        (:func:`limiter.algorithms.peek`). A blocking policy is denied without Redis."""
        if type(cost) is not int or cost < 1 or cost > policy.limit:
            c = self._off_path(policy, cost, now_us)
            if isinstance(c, Decision):
                return c
            cost = c
        if policy.unlimited:
            return make_decision(True, policy.limit, policy.limit, 0, 0)
        prep = self._script_of(policy, cost)
        rkey = self._prefix + key.encode()
        rest = self._rest(rkey, prep, now_us, cost)
        payload = prep.head + rest
        fut = self.backend.send_now(rkey, payload)
        if timeout_s is None:
            reply = await (fut if fut is not None else self.backend.call(rkey, payload))
        else:
            reply = await within(fut if fut is not None else self.backend.call(rkey, payload), timeout_s)
        if type(reply) is not list:
            reply = await self._recover(rkey, prep, rest, reply)
        return make_decision(reply[0] == 1, reply[1], reply[2], reply[3], reply[4])

    async def check_many(
        self, requests: Sequence[tuple[str, Policy, int, int | None]], *, timeout_s: float | None = None
    ) -> list[Decision | BackendError]:
        """Decide many requests in one pipelined burst, in order.

        Each item is ``(key, policy, cost, now_us)``; a cost of 0 is a peek, as in
        :meth:`check`. Failures are returned in place
        (one bad key does not fail the batch); invalid costs raise ``ValueError``.
        The batch goes out as one write per connection with one future for all its
        replies (see :meth:`NodeConnection.send_many`), not one future per command.
        Items Redis has not answered within ``timeout_s`` are :class:`DeadlineExceeded`.
        """
        return await self._many(requests, False, timeout_s)

    async def allowed_many(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        *,
        timeout_s: float | None = None,
        decisions: Collection[int] = (),
    ) -> list[bool | Decision | BackendError]:
        """:meth:`check_many` when only the verdicts matter (shadow comparisons): the
        same scripts, the same state changes, ``True``/``False`` instead of a
        :class:`Decision` per item -- except the items whose index is in ``decisions``,
        which get their :class:`Decision` (a comparison that needs one answer in full)."""
        return await self._many(requests, True, timeout_s, decisions)

    def _asked(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        verdicts: bool,
        out: list[Any],
        full: Collection[int],
    ) -> Iterator[tuple[int, bytes, Prepared, int, int | None]]:
        """The items Redis must decide, as (index, Redis key, script pieces, cost, time); the
        others (unlimited and blocking policies) are answered in ``out`` (verdicts, or
        decisions for the indexes in ``full``)."""
        prefix = self._prefix
        # a burst's items nearly all share a policy: its pieces are looked up once per run of it
        # (and of a kind: a decision's or a charge's; Envoy's hits are all charges)
        last: Policy | None = None
        last_kind: type = int
        prep = cast("Prepared", None)  # set with last (the first item that needs it sets both)
        for i, (key, policy, cost, now_us) in enumerate(requests):
            kind = cost.__class__
            if kind is not int or cost < 1 or cost > policy.limit:
                if not (kind is Charge and -MAX_COST <= cost <= MAX_COST and takes_charges(policy)) or policy.blocked:
                    c = self._off_path(policy, cost, now_us)
                    if isinstance(c, Decision):
                        out[i] = c.allowed if verdicts and i not in full else c
                        continue
                    cost, kind = c, c.__class__
            if policy.unlimited:
                whole = not verdicts or i in full
                out[i] = make_decision(True, policy.limit, policy.limit, 0, 0) if whole else True
                continue
            if kind is Charge:
                if policy is not last or last_kind is not Charge:
                    prep, last, last_kind = self._prepare_charge(policy), policy, Charge
            elif not cost:
                prep, last = self._prepare_peek(policy), None
            elif policy is not last or last_kind is not int:
                prep, last, last_kind = self._prepare(policy), policy, int
            yield i, prefix + key.encode(), prep, cost, now_us

    def _payloads(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        verdicts: bool,
        out: list[Any],
        full: Collection[int] = (),
    ) -> tuple[list[bytes], list[bytes], list[tuple[int, bytes, Prepared, bytes]]]:
        """The keys, commands and (index, key, script, arguments) of the items Redis must
        decide, one command each (:meth:`_asked`)."""
        keys: list[bytes] = []
        payloads: list[bytes] = []
        meta: list[tuple[int, bytes, Prepared, bytes]] = []
        for i, rkey, prep, cost, now_us in self._asked(requests, verdicts, out, full):
            rest = self._rest(rkey, prep, now_us, cost)
            keys.append(rkey)
            payloads.append(prep.head + rest)
            meta.append((i, rkey, prep, rest))
        return keys, payloads, meta

    async def _many(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        verdicts: bool,
        timeout_s: float | None = None,
        full: Collection[int] = (),
    ) -> list[Any]:
        out: list[Any] = [None] * len(requests)
        if self._one_server and len(requests) > 1:
            await self._runs(requests, verdicts, out, timeout_s, full)
            return out
        keys, payloads, meta = self._payloads(requests, verdicts, out, full)
        if not payloads:
            return out
        for (pos, rkey, prep, rest), reply in zip(meta, await self._send(keys, payloads, timeout_s)):
            if type(reply) is not list:
                if isinstance(reply, BackendError):
                    out[pos] = reply
                    continue
                try:
                    reply = await self._recover(rkey, prep, rest, reply)
                except BackendError as exc:
                    out[pos] = exc
                    continue
            if verdicts and (not full or pos not in full):
                out[pos] = reply[0] == 1
            else:
                out[pos] = make_decision(reply[0] == 1, reply[1], reply[2], reply[3], reply[4])
        return out

    async def _send(self, keys: list[bytes], payloads: list[bytes], timeout_s: float | None) -> list[Any]:
        """Each command's reply, in order, the commands pipelined (one write per connection):
        the reply itself (an error reply included), or the :class:`BackendError` its call
        failed with (the connection lost, the deadline passed)."""
        replies: list[Any] = [None] * len(payloads)
        groups: list[tuple[Any, list[int]]] = []
        for fut, idx in self.backend.send_many(keys, payloads):
            if fut is None:  # the connection must be (re)opened: one call per command, in order
                fut = asyncio.ensure_future(self._one_by_one(keys, payloads, idx))
            groups.append((fut, idx))
        end = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        for fut, idx in groups:
            try:
                if end is None:
                    got = await fut
                else:
                    got = await within(fut, max(0.0, end - asyncio.get_running_loop().time()))
            except BackendError as exc:
                for j in idx:
                    replies[j] = exc
                continue
            for j, reply in zip(idx, got):
                if isinstance(reply, BaseException) and not isinstance(reply, (ReplyError, BackendError)):
                    raise reply  # from the one-by-one calls: not a backend failure
                replies[j] = reply
        return replies

    def _encode_runs(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        verdicts: bool,
        out: list[Any],
        full: Collection[int] = (),
    ) -> list[Run]:
        """The runs of consecutive requests under one script and policy (at most
        :data:`~limiter.scripts.MANY_MAX` each) that Redis must decide (:meth:`_asked`)."""
        runs: list[Run] = []
        time_cost = self._time_cost
        run = cast("Run", None)
        for i, rkey, prep, cost, now_us in self._asked(requests, verdicts, out, full):
            if run is None or run.prep is not prep or len(run.at) == MANY_MAX:
                run = Run(prep, rkey, not verdicts)
                runs.append(run)
            if full and i in full:
                run.full = True
            run.at.append(i)
            run.keys.append(b"$%d\r\n%b\r\n" % (len(rkey), rkey))
            run.args.append(time_cost(now_us, cost))
        return runs

    async def _one_by_one(self, keys: list[bytes], payloads: list[bytes], idx: list[int]) -> list[Any]:
        """The commands at ``idx`` one after another (each answered before the next is sent:
        two commands on one key keep their order), each failure in its place."""
        replies: list[Any] = []
        for j in idx:
            try:
                replies.append(await self.backend.call(keys[j], payloads[j]))
            except Exception as exc:  # noqa: BLE001 - in its place, as gather(return_exceptions=True) would
                replies.append(exc)
        return replies

    async def _runs(
        self,
        requests: Sequence[tuple[str, Policy, int, int | None]],
        verdicts: bool,
        out: list[Any],
        timeout_s: float | None,
        full: Collection[int],
    ) -> None:
        """A burst on one server: each run of requests under one script and policy in one
        call of its ``many`` script, every call in one pipelined write (so in order)."""
        runs = self._encode_runs(requests, verdicts, out, full)
        if not runs:
            return
        payloads = [r.command(r.prep.many_head) for r in runs]
        for run, reply in zip(runs, await self._send([r.first for r in runs], payloads, timeout_s)):
            if isinstance(reply, ReplyError) and str(reply).startswith("NOSCRIPT"):
                try:
                    reply = await self.backend.call(run.first, run.command(run.prep.many_eval_head))
                except BackendError as exc:
                    reply = exc
            run.answer(reply, out, self._rejected, verdicts, full)

    def _rejected(self, prep: Prepared, reply: Any) -> BackendError:
        """What a request gets for a reply that is no decision (its script's error, or a
        call Redis refused): a master turned replica (a failover) is unavailable, and the
        backend finds the new one (the failure policy decides); the rest a reply error."""
        if isinstance(reply, ReplyError):
            msg = str(reply)
            if msg.startswith(("READONLY", "MASTERDOWN")):
                self.backend.lost_master()
                return BackendUnavailable(f"Redis is not a writable master now: {msg}")
            return BackendReplyError(f"Redis rejected the {prep.script.name} script: {reply}")
        return BackendReplyError(f"unexpected reply from the {prep.script.name} script: {reply!r}")

    async def _recover(self, rkey: bytes, prep: Prepared, rest: bytes, reply: Any) -> list[Any]:
        """Handle a non-decision reply: NOSCRIPT reloads the script; cluster redirects
        (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) go through the backend's redirect handling,
        which also corrects its slot table; anything else raises."""
        for _ in range(4):
            if not isinstance(reply, ReplyError):
                break
            msg = str(reply)
            if msg.startswith("NOSCRIPT"):
                reply = await self.backend.call(rkey, prep.eval_head + rest)
            elif msg.startswith(("MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN")):
                reply = await self.backend.call(rkey, prep.head + rest)
            else:
                break
        if type(reply) is list:
            return reply
        raise self._rejected(prep, reply)

    # -- reads and admin ------------------------------------------------------------

    async def peek(self, key: str, policy: Policy, now_us: int | None = None) -> BucketView:
        """The key's allowance now, without consuming (token bucket via ``peek.lua``)."""
        if policy.unlimited:
            return BucketView(policy.burst_f, policy.limit, False, 0)
        rkey = self.redis_key(key)
        now_arg: str | int = "r" if self.time_source == "redis" else (self._clock() if now_us is None else now_us)
        if policy.algorithm is Algorithm.TOKEN_BUCKET:
            a1, a2, _ = policy_args(policy)
            reply = await self._eval(PEEK, rkey, a1, a2, str(now_arg).encode())
            tokens = float(reply[0])
            exists = reply[1] == 1
            reset = 0 if tokens >= policy.burst_f else math.ceil((policy.burst_f - tokens) / policy.rate_per_us)
            return BucketView(tokens, policy.limit, exists, reset)
        state = await self.raw_state(key, policy)
        now = now_arg if isinstance(now_arg, int) else await self.redis_time_us()
        d, _ = decide(state, now, policy, 0)
        return BucketView(
            float(d.remaining), policy.limit, state is not None, d.reset_after_us if state is not None else 0
        )

    async def raw_state(self, key: str, of: Algorithm | Policy) -> Any:
        """The pure-function state stored for ``key`` (``None`` when absent) under an algorithm
        (or a policy's), in either state format."""
        algorithm = of.algorithm if isinstance(of, Policy) else of
        rkey = self.redis_key(key)
        if algorithm is Algorithm.SLIDING_LOG:
            reply = await self.backend.call(rkey, encode_command("ZRANGE", rkey, 0, -1, "WITHSCORES"))
        else:
            for _ in range(2):  # a key may change form between the two reads: once more
                reply = await self.backend.call(rkey, encode_command("GET", rkey))
                if not (isinstance(reply, ReplyError) and str(reply).startswith("WRONGTYPE")):
                    break
                reply = await self.backend.call(rkey, encode_command("HMGET", rkey, *STATE_FIELDS[algorithm]))
                if not (isinstance(reply, ReplyError) and str(reply).startswith("WRONGTYPE")):
                    break
        if isinstance(reply, ReplyError):
            raise BackendReplyError(str(reply))
        return decode_state(algorithm, reply)

    async def redis_time_us(self) -> int:
        reply = await self.backend.call(None, encode_command("TIME"))
        return int(reply[0]) * 1_000_000 + int(reply[1])

    async def reset(self, key: str) -> bool:
        """Delete the key's state; True when something was deleted."""
        rkey = self.redis_key(key)
        reply = await self.backend.call(rkey, encode_command("DEL", rkey))
        if isinstance(reply, ReplyError):
            raise BackendReplyError(str(reply))
        return bool(reply)

    async def ping(self) -> None:
        """Raise :class:`BackendError` unless every node answers PING."""
        for reply in await self.backend.call_all(encode_command("PING")):
            if isinstance(reply, ReplyError):
                raise BackendUnavailable(f"Redis answered PING with {reply}")

    async def load_scripts(self) -> list[str]:
        """SCRIPT LOAD every script on every node (readiness); returns the SHAs."""
        shas = []
        for script in ALL_SCRIPTS:
            for reply in await self.backend.call_all(encode_command("SCRIPT", "LOAD", script.source)):
                if isinstance(reply, ReplyError):
                    raise BackendReplyError(f"SCRIPT LOAD {script.name}: {reply}")
            shas.append(script.sha)
        return shas

    async def scripts_loaded(self) -> bool:
        shas = [s.sha for s in ALL_SCRIPTS]
        for reply in await self.backend.call_all(encode_command("SCRIPT", "EXISTS", *shas)):
            if isinstance(reply, ReplyError) or not all(reply):
                return False
        return True

    async def _eval(self, script: Script, rkey: bytes, *args: bytes) -> Any:
        reply = await self.backend.call(rkey, encode_command("EVALSHA", script.sha, 1, rkey, *args))
        if isinstance(reply, ReplyError) and str(reply).startswith("NOSCRIPT"):
            reply = await self.backend.call(rkey, encode_command("EVAL", script.source, 1, rkey, *args))
        if isinstance(reply, ReplyError):
            raise BackendReplyError(f"{script.name}: {reply}")
        return reply

    @property
    def client(self) -> Any:
        """A redis-py asyncio client on the same server(s), for everything off the hot path
        (from the same :class:`~limiter.connection.RedisConnection`)."""
        if self._client is None:
            if self.connection is None:
                raise ValueError("this RedisLimiter was built without a URL: it has no redis-py client")
            self._client = self.connection.redis_py()
        return self._client

    def describe(self) -> str:
        return self.backend.describe()

    def topology(self) -> dict[str, Any]:
        """Which kind of deployment, where the master is, TLS and login, without secrets."""
        out: dict[str, Any] = self.connection.describe() if self.connection is not None else {}
        out.update(self.backend.topology())
        return out

    async def aclose(self) -> None:
        await self.backend.aclose()
        if self._client is not None:
            try:
                await self._client.aclose()
            except Exception:  # noqa: BLE001 - closing a broken client must not raise
                pass
            self._client = None
