"""The Lua scripts as package data, and the arguments each takes for a policy.

Scripts live in the top-level ``lua/`` package as plain ``.lua`` files; each is
loaded with ``prelude.lua`` in front of it. :func:`script_args` turns a
:class:`~limiter.policy.Policy` into the exact ARGV strings its script expects;
floats are written with ``repr`` (the shortest text that reads back as the same
double), which is how the scripts and the pure functions stay bit-identical.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

from .policy import Algorithm, Policy

__all__ = [
    "ALL_SCRIPTS",
    "BOOKED",
    "CHARGES",
    "MANY_MAX",
    "PEEK",
    "PEEKS",
    "SCRIPTS",
    "SCRIPT_SETS",
    "STATE_FIELDS",
    "STATE_FORMATS",
    "Script",
    "ScriptSet",
    "decode_compact",
    "decode_state",
    "load_script",
    "many",
    "policy_args",
    "script_for",
]


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name, full source (prelude included) and SHA1; ``file`` is its
    ``lua/`` file's name and ``state_format`` the state format it writes."""

    name: str
    source: str
    sha: str
    file: str = ""
    state_format: int = 2

    @property
    def source_bytes(self) -> bytes:
        return self.source.encode()


def _read(name: str) -> str:
    return resources.files("lua").joinpath(name).read_text(encoding="utf-8")


#: the state formats a script writes (docs/state-format.md): 1, a hash per key (every release
#: reads it); 2, one decimal number at a GCRA or window key (read from this release on; the
#: token bucket and the sliding log write as in 1)
STATE_FORMATS = (1, 2)


#: the state helpers (``lua/state_<kind>.lua``) by the prefix of the functions they define
_STATE_FILES = {
    "sl_bucket_": "state_bucket",
    "sl_gcra_": "state_gcra",
    "sl_fixed_": "state_fixed",
    "sl_sliding_": "state_sliding",
}


def _prelude(state_format: int, body: str) -> str:
    """The shared prelude, after the line that tells it which state format to write, then each
    state helper ``body`` calls (a script runs its helpers' definitions on every call, so each
    takes only its own)."""
    if state_format not in STATE_FORMATS:
        raise ValueError(f"state_format: must be one of {STATE_FORMATS}, got {state_format!r}")
    parts = [f"local SL_FORMAT = {state_format}\n" + _read("prelude.lua")]
    parts += [_read(f"{name}.lua") for prefix, name in _STATE_FILES.items() if prefix in body]
    return "\n".join(parts)


def load_script(name: str, state_format: int = 2) -> Script:
    """Load ``lua/<name>.lua`` with the shared prelude in front, writing ``state_format``."""
    body = _read(f"{name}.lua")
    source = _prelude(state_format, body) + "\n" + body
    suffix = "" if state_format == 2 else f" (format {state_format})"
    return Script(
        name=name + suffix,
        source=source,
        sha=hashlib.sha1(source.encode()).hexdigest(),
        file=name,
        state_format=state_format,
    )


@dataclass(frozen=True, slots=True)
class ScriptSet:
    """The scripts that write one state format: the decisions, their read-only twins (peeks)
    and the charges, by algorithm."""

    state_format: int
    decisions: dict[Algorithm, Script]
    peeks: dict[Algorithm, Script]
    charges: dict[Algorithm, Script]

    @classmethod
    def build(cls, state_format: int) -> ScriptSet:
        def one(name: str) -> Script:
            return load_script(name, state_format)

        return cls(
            state_format=state_format,
            decisions={a: one(a.value) for a in Algorithm},
            peeks={a: one(f"peek_{a.value}") for a in Algorithm},
            charges={a: one(f"charge_{a.value}") for a in Algorithm if a is not Algorithm.SLIDING_LOG},
        )

    def all(self) -> tuple[Script, ...]:
        return (*self.decisions.values(), *self.peeks.values(), *self.charges.values())


#: each state format's scripts
SCRIPT_SETS: dict[int, ScriptSet] = {f: ScriptSet.build(f) for f in STATE_FORMATS}
SCRIPTS: dict[Algorithm, Script] = SCRIPT_SETS[2].decisions
#: the read-only twin of each decision script (``lua/peek_<algorithm>.lua``): the same
#: KEYS and ARGV, the answer a request of cost 1 would get, nothing written
PEEKS: dict[Algorithm, Script] = SCRIPT_SETS[2].peeks
#: the charge of each algorithm that takes one (``lua/charge_<algorithm>.lua``): the same KEYS
#: and ARGV, the cost counted whatever is left (:mod:`limiter.charges`)
CHARGES: dict[Algorithm, Script] = SCRIPT_SETS[2].charges


def _booked(kind: str, algorithm: Algorithm) -> Script:
    """``lua/<kind>.lua`` (reserve or settle) for ``algorithm``: its decision, peek and charge
    scripts wrapped as functions, then ``lua/reservations.lua`` (one key's book, mirroring
    :mod:`limiter.reservations`), then the script itself."""
    name = algorithm.value
    bodies = {fn: _read(f"{script}.lua") for fn, script in (
        ("sl_decide", name), ("sl_peek", f"peek_{name}"), ("sl_charge", f"charge_{name}")
    )}  # fmt: skip
    parts = [_prelude(1, "".join(bodies.values())), _read("state_booked.lua")]  # a key with a book is a hash
    for fn, body in bodies.items():
        parts.append(f"local function {fn}(KEYS, ARGV)\n{body}\nend\n")
    parts.append(f"local sl_windowed = {'true' if algorithm.windowed else 'false'}\n")
    unpack = {
        Algorithm.FIXED_WINDOW: "sl_hashed(key, sl_fixed_load, {'w', 'n'})",
        Algorithm.SLIDING_WINDOW: "sl_hashed(key, sl_sliding_load, {'w', 'c', 'p'})",
        Algorithm.GCRA: "sl_hashed(key, sl_gcra_load, {'a'})",
        # another algorithm's compact key (a rule whose algorithm changed) holds no state here
        Algorithm.TOKEN_BUCKET: "if redis.call('type', key)['ok'] == 'string' then redis.call('del', key) end",
    }.get(algorithm, "")
    parts.append(f"local function sl_unpack(key)\n  {unpack}\nend\n")
    parts += [_read("reservations.lua"), _read(f"{kind}.lua")]
    source = "\n".join(parts)
    return Script(name=f"{kind} ({name})", source=source, sha=hashlib.sha1(source.encode()).hexdigest())


#: reserve and settle (``lua/reserve.lua``, ``lua/settle.lua``) for each algorithm that takes charges
BOOKED: dict[tuple[str, Algorithm], Script] = {
    (kind, a): _booked(kind, a) for kind in ("reserve", "settle") for a in Algorithm if a is not Algorithm.SLIDING_LOG
}
#: the dashboards' token-bucket view (``lua/peek.lua``, :meth:`RedisLimiter.peek`)
PEEK: Script = load_script("peek")


#: the most requests one call of a ``many`` script decides: a call runs atomically, so it
#: holds Redis about as long as the pipelined commands Redis reads in one go would
MANY_MAX = 128


@cache
def many(script: Script) -> Script:
    """``script`` for many requests under one policy in one call (``lua/many.lua``): the
    script itself wrapped as a function, run once per key, in order, each error in its
    place. Same answers and state as one call of ``script`` per request."""
    body = _read(f"{script.file}.lua")
    source = (
        _prelude(script.state_format, body)
        + "\nlocal function sl_one(KEYS, ARGV)\n"
        + body
        + "\nend\n\n"
        + _read("many.lua")
    )
    return Script(name=f"{script.name} (many)", source=source, sha=hashlib.sha1(source.encode()).hexdigest())


def script_for(policy: Policy) -> Script:
    return SCRIPTS[policy.algorithm]


@lru_cache(maxsize=4096)
def policy_args(policy: Policy) -> tuple[bytes, bytes, bytes]:
    """ARGV[1..3] for the policy's script: (rate or window, burst or limit, ttl seconds).

    A :meth:`Policy.blocking` policy has none: its limit of 0 would read as unlimited in
    the scripts, and it is decided without Redis anyway (``ValueError``)."""
    if policy.blocked:
        raise ValueError("a blocking policy is decided without Redis: it has no script arguments")
    alg = policy.algorithm
    if alg is Algorithm.TOKEN_BUCKET:
        first = repr(policy.rate_per_us)
    elif alg is Algorithm.GCRA:
        first = repr(policy.emission_us)
    else:
        first = str(policy.period_us)
    second = str(policy.limit if alg.windowed and not policy.unlimited else policy.burst)
    if alg.windowed and policy.unlimited:
        second = "0"
    return first.encode(), second.encode(), str(policy.ttl_s).encode()


def decode_compact(algorithm: Algorithm, text: bytes | str) -> tuple[int, ...] | float | None:
    """A key's state from its compact form (state format 2, ``lua/state_<kind>.lua``): GCRA's
    theoretical arrival time in quarter microseconds, negated; the fixed window's
    ``<count><start in ms, 13 digits>0``; the sliding window's
    ``<previous><current, C digits><start><C>``. Another algorithm's number (a rule whose
    algorithm changed) is no state, as the scripts read it."""
    t = text.decode() if isinstance(text, bytes) else text
    if algorithm is Algorithm.GCRA:
        return -int(t) / 4 if t.startswith("-") else None
    if t.startswith("-"):
        return None
    if algorithm is Algorithm.FIXED_WINDOW:
        if not t.endswith("0") or len(t) < 14:
            return None
        return (int(t[-14:-1]) * 1000, int(t[:-14] or 0))
    if algorithm is Algorithm.SLIDING_WINDOW:
        n = int(t[-1])
        if n == 0 or len(t) < 14 + n:
            return None
        return (int(t[-14:-1]) * 1000, int(t[-14 - n : -14]), int(t[: -14 - n] or 0))
    return None  # the token bucket's and the sliding log's states are never compact


def decode_state(algorithm: Algorithm, raw: object) -> object:
    """Turn what Redis stores for a key into the pure function's state.

    ``raw`` is the HMGET reply of :data:`STATE_FIELDS` for a hash, the GET reply (bytes) of a
    window's compact form, or the ``ZRANGE key 0 -1 WITHSCORES`` reply for the sliding log.
    """
    if algorithm is Algorithm.SLIDING_LOG:
        items = list(raw or [])  # type: ignore[call-overload]
        scores = sorted(int(float(items[i + 1])) for i in range(0, len(items), 2))
        return tuple(scores) or None
    if isinstance(raw, bytes | str):
        return decode_compact(algorithm, raw)
    vals = list(raw or [])  # type: ignore[call-overload]
    if not vals or any(v is None for v in vals):  # no key, or another algorithm's hash
        return None
    if algorithm is Algorithm.TOKEN_BUCKET:
        return (int(float(vals[0])), float(vals[1]))
    if algorithm is Algorithm.GCRA:
        return float(vals[0])
    if algorithm is Algorithm.FIXED_WINDOW:
        return (int(float(vals[0])), int(float(vals[1])))
    return (int(float(vals[0])), int(float(vals[1])), int(float(vals[2])))


STATE_FIELDS: dict[Algorithm, tuple[str, ...]] = {
    Algorithm.TOKEN_BUCKET: ("t", "k"),
    Algorithm.GCRA: ("a",),
    Algorithm.FIXED_WINDOW: ("w", "n"),
    Algorithm.SLIDING_WINDOW: ("w", "c", "p"),
    Algorithm.SLIDING_LOG: (),
}

#: every script a limiter runs: each state format's decisions, peeks and charges, alone and for
#: many requests in one call, the dashboards' view, and the reservations' reserve and settle
ALL_SCRIPTS: tuple[Script, ...] = (
    *(s for f in STATE_FORMATS for s in SCRIPT_SETS[f].all()),
    PEEK,
    *(many(s) for f in STATE_FORMATS for s in SCRIPT_SETS[f].all()),
    *BOOKED.values(),
)
