"""Podman for the container tests: the machine's settings, a local Debian base image, builds,
runs and bounded waits.

No image can be pulled here, so the tests build on a base made locally: ``debootstrap
--variant=minbase`` from the Debian mirror apt already uses, trimmed as Debian's official slim
image is trimmed (no documentation, manual pages or translations; apt keeps no caches), then
``podman import``. Only this *test* base also trusts the host's local CA certificates (HTTPS
from a build may pass through a proxy that re-signs it) and points pip at the system store;
the Containerfile users build knows nothing of that.

The base is cached on the machine (``/var/cache/shadowlimit-tests`` as root, else
``~/.cache/shadowlimit-tests``) as a tarball named by a digest of what built it (the recipe
below, the mirror, the suite, the CA certificates), and imported as
``localhost/shadowlimit-test-base:<digest>``: a second run on the same machine builds nothing.

Podman runs with :data:`CONTAINERS_CONF` (``CONTAINERS_CONF`` points at it): runc, as crun
refuses these hybrid cgroups, and explicit ulimits within the hard limits (nofile at most
20000 here; Podman itself lowers nproc to 32768).

A missing ``podman``, ``runc`` or ``debootstrap`` fails the test naming the Debian package
(``.ci/run`` installs them); nothing is skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from support import installed_binary

__all__ = [
    "REPO",
    "Container",
    "base_image",
    "configmap_dir",
    "cache_dir",
    "containers_conf",
    "debian_mirror",
    "image_size",
    "podman",
    "podman_env",
    "project_image",
]

REPO = Path(__file__).resolve().parents[1]

#: dpkg never unpacks these into the base or any image built on it (Debian's slim images' list)
SLIM_DPKG = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
"""

#: apt in an image: no package caches left in a layer, no translations, indexes kept compressed
_APT_CLEAN = '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
SLIM_APT = f"""\
DPkg::Post-Invoke {{ {_APT_CLEAN} }};
APT::Update::Post-Invoke {{ {_APT_CLEAN} }};
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
"""

#: no service starts while a package is installed in a build
POLICY_RC_D = "#!/bin/sh\nexit 101\n"

#: the host's CA bundle, which trusts its local CAs: copied into the test base only, for pip
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

#: runc, and ulimits within this machine's hard limits
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]

[engine]
runtime = "runc"
"""

LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")


def cache_dir() -> Path:
    """Where the base tarball and the containers.conf live between runs on this machine."""
    root = Path("/var/cache/shadowlimit-tests") if os.geteuid() == 0 else Path.home() / ".cache/shadowlimit-tests"
    root.mkdir(parents=True, exist_ok=True)
    return root


def containers_conf() -> Path:
    """The containers.conf the tests point ``CONTAINERS_CONF`` at (ulimits from this machine's hard limits)."""
    nofile = _hard(resource.RLIMIT_NOFILE, 20000)
    nproc = _hard(resource.RLIMIT_NPROC, 32768)
    text = CONTAINERS_CONF.format(nofile=nofile, nproc=nproc)
    path = cache_dir() / f"containers-{hashlib.sha256(text.encode()).hexdigest()[:12]}.conf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def _hard(which: int, cap: int) -> int:
    hard = resource.getrlimit(which)[1]
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def podman_env() -> dict[str, str]:
    """The environment Podman (and podman-compose) run in."""
    installed_binary("runc")
    return {**os.environ, "CONTAINERS_CONF": str(containers_conf())}


def podman(*args: str, timeout: float = 120.0, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``podman ARGS`` (bounded); a failure raises with what it printed."""
    cmd = [installed_binary("podman"), *args]
    proc = subprocess.run(cmd, env=podman_env(), capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One process at a time on this machine (xdist workers, parallel runs)."""
    with open(cache_dir() / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- the base image ----------------------------------------------------------------------------


def debian_mirror() -> tuple[str, str, str | None]:
    """(suite, mirror, security mirror or None): the host's own release and the Debian mirror
    its apt sources name for it."""
    suite = _os_release().get("VERSION_CODENAME") or "bookworm"
    mirror = security = None
    for uris, suites in _apt_sources():
        for uri in uris:
            if suite in suites and mirror is None and "security" not in uri:
                mirror = uri.rstrip("/")
            if f"{suite}-security" in suites and security is None:
                security = uri.rstrip("/")
    assert mirror, f"no Debian mirror for {suite} in apt's sources (/etc/apt/sources.list*)"
    return suite, mirror, security


def _os_release() -> dict[str, str]:
    out = {}
    for line in Path("/etc/os-release").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value.strip().strip('"')
    return out


def _apt_sources() -> list[tuple[list[str], list[str]]]:
    """Every (URIs, suites) of apt's sources, one-line and deb822 formats."""
    out: list[tuple[list[str], list[str]]] = []
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in paths:
        if not path.is_file():
            continue
        text = path.read_text()
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(_deb822_fields(stanza))
                if "deb" in fields.get("types", "").split():
                    out.append((fields.get("uris", "").split(), fields.get("suites", "").split()))
            continue
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                out.append(([words[1]], [words[2]]))
    return out


def _deb822_fields(stanza: str) -> Iterator[tuple[str, str]]:
    for line in stanza.splitlines():
        if line.startswith("#") or line.startswith((" ", "\t")) or ":" not in line:
            continue
        key, _, value = line.partition(":")
        yield key.strip().lower(), value.strip()


def _local_cas() -> list[Path]:
    return sorted(LOCAL_CA_DIR.glob("**/*.crt")) if LOCAL_CA_DIR.is_dir() else []


def _base_key() -> str:
    """A digest of everything the base is made from: rebuilt when any of it changes."""
    suite, mirror, security = debian_mirror()
    h = hashlib.sha256()
    for part in (SLIM_DPKG, SLIM_APT, POLICY_RC_D, suite, mirror, security or ""):
        h.update(part.encode() + b"\0")
    h.update(HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.exists() else b"")
    for ca in _local_cas():
        h.update(ca.name.encode() + b"\0" + ca.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def base_image() -> str:
    """``localhost/shadowlimit-test-base:<digest>``, made (about 40 s) or reused."""
    key = _base_key()
    ref = f"localhost/shadowlimit-test-base:{key}"
    with _locked("base"):
        if podman("image", "exists", ref, check=False).returncode == 0:
            return ref
        tarball = cache_dir() / f"base-{key}.tar"
        if not tarball.exists():
            _make_base_tarball(tarball)
        podman(
            "import",
            "--change",
            "ENV=PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
            "--change",
            'CMD=["/bin/bash"]',
            str(tarball),
            ref,
            timeout=300,
        )
        for old in cache_dir().glob("base-*.tar"):  # one base kept: the others were made from something else
            if old != tarball:
                old.unlink()
        listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/shadowlimit-test-base")
        for other in set(listed.stdout.split()) - {ref}:
            podman("rmi", other, check=False)  # refused while an image still builds on it: fine
    return ref


def _make_base_tarball(tarball: Path) -> None:
    suite, mirror, security = debian_mirror()
    debootstrap = installed_binary("debootstrap")
    with tempfile.TemporaryDirectory(prefix="shadowlimit-base-", dir=cache_dir()) as tmp:
        root = Path(tmp) / "rootfs"
        cmd = [debootstrap, "--variant=minbase", suite, str(root), mirror]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr}"
        _slim(root, suite, mirror, security)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True, timeout=300)
        partial.replace(tarball)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _slim(root: Path, suite: str, mirror: str, security: str | None) -> None:
    """Debian's slim image's trimming, the mirror's sources, and (test base only) the host's CAs."""
    (root / "etc/dpkg/dpkg.cfg.d/slim").write_text(SLIM_DPKG)
    (root / "etc/apt/apt.conf.d/slim").write_text(SLIM_APT)
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text(POLICY_RC_D)
    policy.chmod(0o755)
    sources = [f"deb {mirror} {suite} main", f"deb {mirror} {suite}-updates main"]
    if security:
        sources.append(f"deb {security} {suite}-security main")
    (root / "etc/apt/sources.list").write_text("\n".join(sources) + "\n")
    for folder in ("usr/share/man", "usr/share/info", "usr/share/groff", "usr/share/linda"):
        for path in (root / folder).glob("*"):
            _remove(path)
    for path in (root / "usr/share/locale").glob("*"):
        if path.name != "locale.alias":
            _remove(path)
    for path in (root / "usr/share/doc").glob("*/*"):
        if path.name != "copyright":
            _remove(path)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (root / cache).glob("*"):
            if path.is_file():
                path.unlink()
    # the test base only: the host's CA bundle (pip reads it: PIP_CERT) and its local CAs, which a
    # ca-certificates package installed later adds to the bundle it writes
    if HOST_CA_BUNDLE.exists():
        (root / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HOST_CA_BUNDLE, root / "etc/ssl/certs/ca-certificates.crt")
    local = root / "usr/local/share/ca-certificates"
    local.mkdir(parents=True, exist_ok=True)
    for ca in _local_cas():
        shutil.copyfile(ca, local / ca.name)


# -- the project's image -----------------------------------------------------------------------


def project_image(extras: str = "envoy") -> tuple[str, float]:
    """Build the repository's Containerfile on the test base: (image reference, seconds the build took)."""
    base = base_image()
    # a tag per checkout: another checkout's tests on the same machine build their own sources
    checkout = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
    tag = f"localhost/shadowlimit-test:{extras.replace(',', '-') or 'bare'}-{checkout}"
    revision = _git("rev-parse", "HEAD")
    source = _git("config", "remote.origin.url") or REPO.as_uri()
    with _locked("build"):
        t0 = time.monotonic()
        build(
            REPO,
            tag,
            file=REPO / "Containerfile",
            build_args={"BASE_IMAGE": base, "EXTRAS": extras, "REVISION": revision, "SOURCE": source},
            # Podman 4.3 reuses a cached LABEL layer built with other build arguments: the labels that
            # differ per checkout are also set on the final image, which no cache replaces
            labels={"org.opencontainers.image.revision": revision, "org.opencontainers.image.source": source},
        )
        return tag, time.monotonic() - t0


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()


def build(
    context: Path,
    tag: str,
    *,
    file: Path,
    build_args: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> None:
    args = ["build", "--format", "docker", "--pull=never", "--jobs", "2", "-t", tag, "-f", str(file)]
    for key, value in (build_args or {}).items():
        args += ["--build-arg", f"{key}={value}"]
    for key, value in (labels or {}).items():
        args += ["--label", f"{key}={value}"]
    podman(*args, str(context), timeout=900)


def image_size(ref: str) -> int:
    """The image's size in bytes as Podman reports it (every layer, uncompressed)."""
    return int(json.loads(podman("image", "inspect", ref).stdout)[0]["Size"])


def inspect(ref: str, kind: str = "image") -> dict[str, Any]:
    return dict(json.loads(podman(kind, "inspect", ref).stdout)[0])


def remove(kind: str, names: Sequence[str]) -> None:
    """Remove containers / networks / volumes, ignoring those already gone."""
    if names:
        podman(kind, "rm", "-f", *names, check=False, timeout=120)


class Container:
    """``podman run -d`` of an image, removed by :meth:`remove` (or the context manager) whatever
    happened; every wait bounded.

    >>> with Container(ref, ["serve"], env={...}, options=["--network", "host", "--read-only"]) as c:
    ...     c.wait_http("http://127.0.0.1:8080/healthz")
    """

    def __init__(
        self,
        image: str,
        args: Sequence[str] = (),
        *,
        env: dict[str, str] | None = None,
        options: Sequence[str] = (),
        name: str | None = None,
    ) -> None:
        self.image = image
        self.args = list(args)
        self.env = dict(env or {})
        self.options = list(options)
        self.name = name or f"shadowlimit-test-{os.getpid()}-{time.monotonic_ns() % 10**9}"

    def start(self) -> Container:
        cmd = ["run", "-d", "--name", self.name, *self.options]
        for key, value in self.env.items():
            cmd += ["-e", f"{key}={value}"]
        podman(*cmd, self.image, *self.args, timeout=60)
        return self

    def __enter__(self) -> Container:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        podman("rm", "-f", "-t", "2", self.name, check=False, timeout=60)

    def logs(self) -> str:
        proc = podman("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def state(self) -> dict[str, Any]:
        return dict(inspect(self.name, "container")["State"])

    def exec(self, *cmd: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *cmd, check=check, timeout=60)

    def wait_exit(self, timeout: float = 30.0) -> int:
        """The exit code of a container that stops by itself (AssertionError if it does not)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if state["Status"] in ("exited", "stopped"):
                return int(state["ExitCode"])
            time.sleep(0.2)
        raise AssertionError(f"{self.name} still running after {timeout}s:\n{self.logs()[-3000:]}")

    def wait_http(self, url: str, timeout: float = 60.0, status: int = 200) -> None:
        """Until ``url`` answers ``status`` (AssertionError with the container's log otherwise)."""
        import httpx

        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.state()["Status"] not in ("running", "created", "configured", "initialized"):
                raise AssertionError(f"{self.name} stopped: {self.state()['Status']}\n{self.logs()[-3000:]}")
            try:
                r = httpx.get(url, timeout=2.0)
                if r.status_code == status:
                    return
                last = r.status_code
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.2)
        raise AssertionError(f"{url} did not answer {status} in {timeout}s (last: {last!r}):\n{self.logs()[-3000:]}")


def configmap_dir(directory: Path, files: dict[str, str]) -> Path:
    """Write ``files`` as the kubelet writes a mounted ConfigMap: each name a symlink into
    ``..data``, itself a symlink to a timestamped folder, switched by one rename. Called again
    on the same folder, it swaps the whole set at once as the kubelet does on an update."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)  # readable by the image's user, as the kubelet's
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir(mode=0o755)
    for name, text in files.items():
        (stamp / name).write_text(text)
        (stamp / name).chmod(0o644)
    old = (directory / "..data").resolve() if (directory / "..data").is_symlink() else None
    tmp = directory / "..data_tmp"
    tmp.symlink_to(stamp.name)
    tmp.replace(directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    if old is not None and old != stamp:
        shutil.rmtree(old)
    return directory
