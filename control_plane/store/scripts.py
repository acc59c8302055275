"""The rollout store's Lua scripts, shipped as package data next to this module.

``change.lua`` (version check, state write, audit XADD, event PUBLISH; a rollout plan's
record with it), ``append.lua`` (audit XADD and PUBLISH), ``restore.lua`` (write back what
the store lost), ``plan.lua`` (a rollout plan's record on its own) and ``lease.lua`` (the plan
driver's lease); each file starts with a comment giving its KEYS, ARGV and reply.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["APPEND_LUA", "CHANGE_LUA", "LEASE_LUA", "PLAN_LUA", "RESTORE_LUA"]

_PACKAGE = __name__.rpartition(".")[0]


def _read_script(name: str) -> str:
    """The source of ``control_plane/store/<name>.lua``."""
    return resources.files(_PACKAGE).joinpath(f"{name}.lua").read_text(encoding="utf-8")


CHANGE_LUA = _read_script("change")
APPEND_LUA = _read_script("append")
RESTORE_LUA = _read_script("restore")
PLAN_LUA = _read_script("plan")
LEASE_LUA = _read_script("lease")
