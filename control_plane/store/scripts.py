"""The rollout store's Lua scripts, shipped as package data next to this module.

``change.lua`` (version check, state write, audit XADD, event PUBLISH), ``append.lua``
(audit XADD and PUBLISH) and ``restore.lua`` (write back what the store lost); each file
starts with a comment giving its KEYS, ARGV and reply.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["APPEND_LUA", "CHANGE_LUA", "RESTORE_LUA"]

_PACKAGE = __name__.rpartition(".")[0]


def _read_script(name: str) -> str:
    """The source of ``control_plane/store/<name>.lua``."""
    return resources.files(_PACKAGE).joinpath(f"{name}.lua").read_text(encoding="utf-8")


CHANGE_LUA = _read_script("change")
APPEND_LUA = _read_script("append")
RESTORE_LUA = _read_script("restore")
