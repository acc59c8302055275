"""The one settings object: every environment variable with its default and its check
(:mod:`.base`: ``Settings``, ``load_settings``), Envoy's rate limit service's
(:mod:`.envoy`), the rollout's gates, modes and clock tolerance (:mod:`.rollout`), the Redis
URL's TLS and ACL fields (:mod:`.redis`), the HTTP request bounds (:mod:`.limits`); a bad
value is a :class:`SettingsError` naming the variable."""

from __future__ import annotations

from .base import Settings, env_name, load_settings
from .errors import SettingsError

__all__ = ["Settings", "SettingsError", "env_name", "load_settings"]
