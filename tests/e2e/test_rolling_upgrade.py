"""A rolling upgrade from the previous release, as a fleet does it: that release's own code,
installed in its own virtualenv beside this one, and this release, each ``shadowlimit serve`` in
its own process on one Redis and one namespace, deciding the same keys in enforce.

The previous release reads only the hash form of a key's state (docs/state-format.md). While it
runs, this release must write the hash too (``RATE_LIMIT_STATE_FORMAT=auto`` reads the fleet's
heartbeats), so that neither answers by its failure policy and the pair never admits more than
the limit; keys the previous release wrote keep their state; once it has left the fleet, this
release writes the compact form, each key taking it at its next allowed request."""

from __future__ import annotations

import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest
import redis
from cp_server import ADMIN_TOKEN, clean_env, free_port, unique_namespace, wait_until

#: the release of 2026-11-28, the last whose scripts read only the hash
PREVIOUS = "8e79aa28cc649e2b38aaddbc8a47f3f6a176aa5a"
LIMIT = 20
RULES = """\
version: 1
routes:
""" + "".join(
    f"""  - name: {alg.replace("_", "-")}
    match: {{methods: [GET], path: /{alg}/**}}
    key: {{strategy: header, header: X-Client-Id}}
    local: {{algorithm: {alg}, average: {LIMIT}, period: 366d, burst: {LIMIT}}}
    distributed: {{algorithm: {alg}, average: {LIMIT}, period: 366d, burst: {LIMIT}}}
"""
    for alg in ("fixed_window", "sliding_window", "gcra", "token_bucket")
)
ROUTES = ["fixed-window", "sliding-window", "gcra", "token-bucket"]
COMPACT = {"fixed-window", "sliding-window", "gcra"}  # the routes whose keys have a compact form


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    """The previous release's Python: its source from this repository's history, its C hot path
    built, in a virtualenv of its own that borrows this one's dependencies (.pth files)."""
    root = Path(__file__).resolve().parents[2]
    where = tmp_path_factory.mktemp("previous-release")
    # fails loudly on a clone without the history (a shallow clone cannot run this test)
    subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], check=True, timeout=30)
    source = where / "source"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", PREVIOUS], check=True, capture_output=True, timeout=60)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True, timeout=60)
    # its C hot path built in place as its setup.py builds it (setuptools' own build steps, not
    # pip: this virtualenv's setuptools may be older than its pyproject.toml asks for)
    build = (
        "from setuptools import Distribution, Extension\n"
        "from setuptools.command.build_ext import build_ext\n"
        "args = ['-O2', '-ffp-contract=off']\n"
        "ext = Extension('limiter._speedups', ['limiter/_speedups.c'], extra_compile_args=args)\n"
        "cmd = build_ext(Distribution({'ext_modules': [ext]}))\n"
        "cmd.inplace = True\n"
        "cmd.ensure_finalized()\n"
        "cmd.run()\n"
    )
    subprocess.run([sys.executable, "-c", build], check=True, cwd=source, capture_output=True, timeout=300)
    # a virtualenv of its own: the release's source first on its path, then this one's dependencies
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "previous-release.pth").write_text(f"{source}\n")
    (Path(purelib) / "this-release-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # its own code, not this checkout's
    where_from = subprocess.run(
        [str(python), "-c", "import limiter, lua; print(limiter.__file__, lua.__file__, limiter.speedups_available())"],
        check=True, capture_output=True, text=True, timeout=30, cwd=where,
    ).stdout  # fmt: skip
    assert str(source) in where_from and str(root) not in where_from and "True" in where_from, where_from
    return python


class Replica:
    """``shadowlimit serve`` of one release in its own process, stopped by SIGTERM."""

    def __init__(self, python: Path, *, redis_url: str, namespace: str, rules: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            "RATE_LIMIT_REDIS_URL": redis_url,
            "RATE_LIMIT_RULES_PATH": str(rules),
            "SHADOWLIMIT_PORT": str(self.port),
            "SHADOWLIMIT_NAMESPACE": namespace,
            "SHADOWLIMIT_ADMIN_TOKEN": ADMIN_TOKEN,
            "SHADOWLIMIT_DEFAULT_MODE": "enforce",
            "ENABLE_DISTRIBUTED_RATE_LIMITING": "true",
        }
        self.proc = subprocess.Popen(
            [str(python), "-m", "control_plane.cli", "serve", "--log-level", "warning"],
            env=clean_env(**env),
            cwd=rules.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10)
        wait_until(self._up, timeout=60, what=f"{python} -m control_plane.cli serve answering")

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.proc.communicate(timeout=10)[1][-3000:]
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def decide(self, route: str, key: str) -> dict:
        r = self.http.post("/v1/decide", json={"route": route, "key": key})
        assert r.status_code in (200, 429), r.text
        body = r.json()
        # decided by Redis: never by the failure policy, which a script error would bring
        assert body["mode"] == "enforce" and body["enforced_by"] == "distributed", body
        assert body.get("backend_error") is None, body
        return body

    def stop(self) -> str:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
        return err


def _rkey(client: redis.Redis, namespace: str, key: str) -> bytes | None:
    """The Redis key of a client's bucket on a route (``rl:<namespace>:<route's prefix><key>``)."""
    found = [k for k in client.scan_iter(match=f"rl:{namespace}:*{key}", count=1000) if k.endswith(key.encode())]
    assert len(found) <= 1, found
    return found[0] if found else None


def _kind(client: redis.Redis, namespace: str, key: str) -> bytes:
    rkey = _rkey(client, namespace, key)
    return b"none" if rkey is None else client.type(rkey)


@pytest.mark.timeout(600)
def test_a_rolling_upgrade_from_the_previous_release_keeps_every_key_and_the_limit(
    previous_release, redis_url, tmp_path
):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    namespace = unique_namespace("upgrade")
    client = redis.Redis.from_url(redis_url)
    this = Path(sys.executable)
    old = Replica(previous_release, redis_url=redis_url, namespace=namespace, rules=rules)
    new = None
    try:
        # the fleet before the upgrade: the previous release alone, keys in its hash
        for route in ROUTES:
            for key, spent in ((f"{route}-a", 8), (f"{route}-d", 5)):
                for _ in range(spent):
                    assert old.decide(route, key)["allowed"]
                assert _kind(client, namespace, key) == b"hash"
        # a replica of this release joins; both decide the same keys in turn
        new = Replica(this, redis_url=redis_url, namespace=namespace, rules=rules)
        for route in ROUTES:
            # the previous release's key keeps its state: 8 spent, 12 left, whichever replica asks
            answers = [(new if i % 2 else old).decide(route, f"{route}-a") for i in range(20)]
            assert [a["allowed"] for a in answers] == [True] * 12 + [False] * 8, (route, answers)
            assert answers[0]["distributed"]["remaining"] == LIMIT - 9
            # a new key shared by both: never more than the limit, and the hash while old runs
            both = [(old if i % 2 else new).decide(route, f"{route}-b") for i in range(30)]
            assert sum(a["allowed"] for a in both) == LIMIT, route
            for key in (f"{route}-a", f"{route}-b"):
                assert _kind(client, namespace, key) == b"hash", (route, key)
        # the previous release leaves the fleet: this one writes the compact form
        err = old.stop()
        assert "Traceback" not in err, err[-3000:]
        deadline = time.monotonic() + 15
        while True:
            new.decide("fixed-window", "probe")
            if _kind(client, namespace, "probe") == b"string" or time.monotonic() > deadline:
                break
            client.delete(_rkey(client, namespace, "probe") or b"-")
            time.sleep(0.2)
        assert _kind(client, namespace, "probe") == b"string", "the compact form never came"
        for route in ROUTES:
            # a key the previous release wrote and nobody touched since: read as it stands (5
            # spent), then written in the compact form
            first = new.decide(route, f"{route}-d")
            assert first["allowed"] and first["distributed"]["remaining"] == LIMIT - 6, first
            want = b"string" if route in COMPACT else b"hash"
            assert _kind(client, namespace, f"{route}-d") == want, route
            answers = [new.decide(route, f"{route}-d") for _ in range(16)]
            assert [a["allowed"] for a in answers] == [True] * 14 + [False] * 2, route
            # the key both spent to its limit stays refused (a denial writes nothing: it keeps its form)
            assert new.decide(route, f"{route}-a")["allowed"] is False
    finally:
        if new is not None:
            err = new.stop()
            assert "Traceback" not in err, err[-3000:]
        if old.proc.poll() is None:
            old.stop()
        client.close()
