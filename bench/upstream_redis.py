"""redis-server as Redis' own build makes it, for section 3's second table.

Debian's and Ubuntu's ``redis-server`` link the system's jemalloc, whose size classes step by
16 bytes (a 24-byte dict entry takes 32). Redis' own build (its source from redis.io, the
official container image) links the jemalloc it bundles, configured with 8-byte steps. A key's
bytes differ by about 23 between the two, so section 3 measures on both.

:func:`ensure` builds the same version as the machine's package from its Debian source package
(``apt-get source``, the machine's own Debian sources read as deb-src in a private apt state: the
system's apt configuration is not touched), with ``make`` and the bundled jemalloc, once; later
calls reuse the binary. ``python -m bench.upstream_redis`` prints its path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["UpstreamRedisError", "ensure"]

CACHE = Path.home() / ".cache" / "shadowlimit" / "redis-upstream"
_APT_SOURCES = Path("/etc/apt/sources.list.d")


class UpstreamRedisError(RuntimeError):
    """The upstream build could not be made here (why, in the message)."""


def _run(cmd: list[str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise UpstreamRedisError(f"{' '.join(cmd[:3])} ... failed ({done.returncode}): {done.stderr[-800:]}")
    return done.stdout


def _package_version() -> str:
    """The source version of the machine's ``redis-server`` package (``5:7.0.15-1~deb12u10``)."""
    if shutil.which("dpkg-query") is None:
        raise UpstreamRedisError("no dpkg-query: the upstream build reads the Debian package's version")
    out = _run(["dpkg-query", "-W", "-f=${source:Version}", "redis-server"], Path("/"), 30).strip()
    if not out:
        raise UpstreamRedisError("the redis-server package is not installed")
    return out


def _download_source(version: str, work: Path) -> Path:
    """``redis_<upstream version>.orig.tar.gz`` of ``version``, through a private apt state whose
    sources are the machine's deb822 Debian sources as deb-src."""
    parts = work / "sources.list.d"
    parts.mkdir()
    found = False
    for src in sorted(_APT_SOURCES.glob("*.sources")):
        text = src.read_text()
        if re.search(r"^Types:\s*deb\s*$", text, re.MULTILINE):
            (parts / src.name).write_text(re.sub(r"^Types:\s*deb\s*$", "Types: deb-src", text, flags=re.MULTILINE))
            found = True
    if not found:
        raise UpstreamRedisError(f"no deb822 Debian sources in {_APT_SOURCES} to read as deb-src")
    for d in ("lists/partial", "cache/archives/partial", "download"):
        (work / d).mkdir(parents=True)
    opts = [
        "-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={parts}",
        "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'cache'}",
    ]  # fmt: skip
    _run(["apt-get", *opts, "-qq", "update"], work, 600)
    _run(["apt-get", *opts, "-qq", "source", "--download-only", f"redis={version}"], work / "download", 600)
    tarballs = sorted((work / "download").glob("redis_*.orig.tar.gz"))
    if not tarballs:
        raise UpstreamRedisError(f"apt-get source redis={version} gave no orig tarball")
    return tarballs[0]


def ensure() -> Path:
    """The upstream build's ``redis-server`` (built on the first call, then reused)."""
    version = _package_version()
    upstream = version.split(":")[-1].split("-")[0]
    binary = CACHE / f"redis-server-{upstream}"
    if binary.exists():
        return binary
    with tempfile.TemporaryDirectory(prefix="shadowlimit-redis-") as tmp:
        work = Path(tmp)
        tarball = _download_source(version, work)
        _run(["tar", "-xzf", str(tarball)], work, 300)
        tree = work / f"redis-{upstream}"
        if not (tree / "deps" / "jemalloc").is_dir():
            raise UpstreamRedisError(f"{tarball.name} has no bundled jemalloc (deps/jemalloc)")
        _run(["make", "-j4", "MALLOC=jemalloc", "BUILD_TLS=no"], tree, 1800)
        CACHE.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / "src" / "redis-server", binary)
    return binary


if __name__ == "__main__":
    try:
        print(ensure())
    except UpstreamRedisError as exc:
        print(f"bench.upstream_redis: {exc}", file=sys.stderr)
        sys.exit(1)
