"""Small typed wrappers for the admin commands the launchers poll (``INFO``, ``ROLE``, ``SENTINEL ...``)."""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["command", "pairs", "parse_info", "role", "table"]


def command(client: redis.Redis, *args: str | int) -> Any:
    """``client.execute_command(*args)`` (redis-py leaves it untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return _text(value)


def parse_info(raw: Any) -> dict[str, str]:
    """An ``INFO`` / ``CLUSTER INFO`` reply (text or redis-py's dict) as ``{field: value}``."""
    if isinstance(raw, dict):  # redis-py parsed it; nested fields (slave0: ip=...,port=...) come as dicts
        return {str(k): _flat(v) for k, v in raw.items()}
    out: dict[str, str] = {}
    for line in _text(raw).splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            out[key] = value
    return out


def pairs(raw: Any) -> dict[str, str]:
    """A flat ``[key, value, key, value, ...]`` reply (or a dict) as ``{key: value}``."""
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    items = [_text(item) for item in raw]
    return dict(zip(items[::2], items[1::2]))


def table(raw: Any) -> list[dict[str, str]]:
    """A list of flat key/value replies (``SENTINEL REPLICAS`` / ``SENTINELS``) as dicts."""
    return [pairs(entry) for entry in raw]


def role(client: redis.Redis) -> str:
    """The first field of ``ROLE``: ``master``, ``slave`` or ``sentinel``."""
    reply = command(client, "ROLE")
    return _text(reply[0])
