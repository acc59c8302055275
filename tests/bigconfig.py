"""Large configuration files for the reload tests and measurements: an envoyproxy/ratelimit
config just under the 4 MiB file limit (flat or nested), and a rules file as big.

``.venv/bin/python tests/bigconfig.py`` measures loading them (time, peak RSS) in this process.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["FLAT_DESCRIPTOR", "envoy_config_text", "nested_envoy_config_text", "rules_text"]

#: the file limit (control_plane.rules.yaml_source.MAX_FILE_BYTES)
LIMIT = 4 * 1024 * 1024

FLAT_DESCRIPTOR = "- key: k\n  value: v{i}\n  rate_limit: {{unit: second, requests_per_unit: 10}}\n"


def envoy_config_text(size: int = LIMIT - 4096, *, domain: str = "edge", head: str = "", bad_last: bool = False) -> str:
    """One domain of flat descriptors (``key: k, value: v<i>``, 10/second: 60,000 in 4 MiB), ``head``
    (descriptors text) first, filling ``size`` bytes; ``bad_last``: the last descriptor's
    unit is ``fortnight`` (an error on the file's last lines)."""
    parts = [f"domain: {domain}\ndescriptors:\n", head]
    total = sum(len(p) for p in parts)
    i = 0
    while True:
        d = FLAT_DESCRIPTOR.format(i=i)
        if total + len(d) > size - 200:
            break
        parts.append(d)
        total += len(d)
        i += 1
    if bad_last:
        parts.append(f"- key: k\n  value: v{i}\n  rate_limit: {{unit: fortnight, requests_per_unit: 10}}\n")
    return "".join(parts)


def nested_envoy_config_text(size: int = LIMIT - 4096, *, domain: str = "edge") -> str:
    """One domain of three-level descriptors (``tenant`` / ``path`` / ``user``), each level limited."""
    parts = [f"domain: {domain}\ndescriptors:\n"]
    total = len(parts[0])
    t = 0
    while total < size - 2000:
        block = [
            f"  - key: tenant\n    value: t{t}\n    rate_limit: {{unit: minute, requests_per_unit: 600}}\n"
            "    descriptors:\n"
        ]
        for p in range(8):
            block.append(
                f"      - key: path\n        value: /api/v{p}\n        rate_limit:\n          unit: second\n"
                f"          requests_per_unit: {p + 5}\n        descriptors:\n"
                "          - key: user\n            rate_limit: {unit: hour, requests_per_unit: 1000}\n"
            )
        text = "".join(block)
        if total + len(text) > size - 200:
            break
        parts.append(text)
        total += len(text)
        t += 1
    return "".join(parts)


def rules_text(size: int = LIMIT - 4096, *, bad_last: bool = False) -> str:
    """A rules file of many small routes (``r<i>``: ``/p<i>/**``, 10/s), filling ``size``
    bytes; ``bad_last``: the last route's average is ``fast`` (an error on its last line)."""
    parts = ["version: 1\nroutes:\n"]
    total = len(parts[0])
    i = 0
    while True:
        r = f"  - name: r{i}\n    match: {{path: /p{i}/**}}\n    local: {{average: 10}}\n"
        if total + len(r) > size - 200:
            break
        parts.append(r)
        total += len(r)
        i += 1
    if bad_last:
        parts.append(f"  - name: r{i}\n    match: {{path: /p{i}/**}}\n    local: {{average: fast}}\n")
    return "".join(parts)


def _measure(kind: str, path: Path) -> None:  # pragma: no cover - a tool
    import resource
    import time

    from control_plane.settings import load_settings

    settings = load_settings()
    t0 = time.perf_counter()
    if kind == "rules":
        from control_plane.rules import load_rules

        n = len(load_rules(path, settings).routes)
    else:
        from control_plane.envoy.config import load_envoy_config

        try:
            n = len(load_envoy_config(path, settings).routes)
        except Exception as exc:
            n = -1
            print("error:", str(exc)[:200])
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{kind} {path.stat().st_size} bytes: {n} routes in {dt:.2f} s, peak RSS {rss:.0f} MB")


if __name__ == "__main__":  # pragma: no cover
    kind, out = sys.argv[1], Path(sys.argv[2])
    text = {
        "flat": envoy_config_text,
        "nested": nested_envoy_config_text,
        "bad": lambda: envoy_config_text(bad_last=True),
        "rules": rules_text,
    }[kind]()
    out.write_text(text)
    _measure(kind, out)
