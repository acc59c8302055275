"""Envoy's rate limit service: envoyproxy/ratelimit's configuration files read as routes of
the rollout (:mod:`.config`, hot reloaded by :mod:`.watcher`), and
``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` over gRPC
(:mod:`.service`, served by :mod:`.server`). docs/gateways.md shows the Envoy, Istio and
Envoy Gateway side; docs/envoy-migration.md what carries over from envoyproxy/ratelimit.
"""

from .config import UNITS, EnvoyConfig, EnvoyLimit, Match, load_envoy_config, parse_envoy_files
from .watcher import EnvoyConfigWatcher

__all__ = [
    "UNITS",
    "EnvoyConfig",
    "EnvoyConfigWatcher",
    "EnvoyLimit",
    "Match",
    "load_envoy_config",
    "parse_envoy_files",
]
