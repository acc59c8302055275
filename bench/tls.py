"""What TLS costs behind Envoy, and the TLS handshakes one core of the service sustains.

**Behind Envoy.** The setup of the ``envoy`` section (bench/envoy.py): Envoy 1.40 in front of an
upstream Envoy answering 200, wrk (1 thread, 32 connections, long-lived) over 1,000 keys of a
descriptor limited to 1,000,000/s, every call decided in Redis in enforce, Envoy's default 20 ms
timeout with ``failure_mode_deny: false``. Two ``serve --grpc-port`` processes: one in cleartext,
one with TLS on its gRPC port and mutual TLS required (the test PKI's certificates: EC P-256, TLS
1.3); two front Envoys, the second's ``ratelimit`` cluster over mutual TLS to it (its client
certificate, the server's checked against the CA and its name). TLS end to end, Envoy's side
included: Envoy's encryption and the service's. Rows interleaved, each round running every row:
``plain`` and ``tls`` on every core, then both with the service, wrk and the front Envoy on one
core (``taskset -c 0``), where a CPU cost shows first. Per row: requests/s, against the
cleartext row of the same round (median of the paired ratios), the calls that failed (each a
request let through unlimited), p99, the service's and Envoy's CPU per call.

**Handshakes.** The TLS service alone on core 0 (its process tree pinned), ``openssl s_time``
clients on the other cores making a full handshake per connection (``-new``, mutual TLS, TLS 1.3,
ECDHE and an EC P-256 certificate each side) for the round: the handshakes completed a second,
the service's CPU over the round, and handshakes per CPU-second of the service (what one core
sustains, whether or not the clients kept it busy).

Run: ``python -m bench.tls [--seconds 5] [--repeats 3]``; the results land in
``bench/results/tls.json`` and a section of docs/benchmarks.md.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .control_plane import process_cpu_s, run_wrk
from .envoy import ENVOY_CONFIG, ROOT, ROUTES, Started, envoy_version, pinned, tree_cpu, wrk_script
from .harness import section_main

__all__ = ["measure", "render"]

CONNECTIONS = 32
PINNED = "0"
ROWS = ("plain", "tls", "plain_pinned", "tls_pinned")
#: the most TLS may cost: requests/s of the TLS row over the cleartext one of the same round
TLS_TARGET = 0.85


class Bench(Started):
    """Redis, the two services, the upstream Envoy and a front Envoy each (the module docstring)."""

    def start(self) -> None:
        from limiter.embedded import EmbeddedRedis
        from limiter.embedded.tls import make_test_pki

        self.pki = make_test_pki(self.work / "pki")
        self.script = self.work / "rl.lua"
        self.script.write_text(wrk_script("rl"))
        (self.work / "envoy-config.yaml").write_text(ENVOY_CONFIG)
        redis = EmbeddedRedis().start()
        self.stack.callback(redis.stop)
        tls_env = {
            "SHADOWLIMIT_GRPC_TLS_CERT_FILE": self.pki.server_cert,
            "SHADOWLIMIT_GRPC_TLS_KEY_FILE": self.pki.server_key,
            "SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE": self.pki.ca_cert,
        }
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        for name, env in (("plain", {}), ("tls", tls_env)):
            server, self.ports[name] = self.serve(f"tls-{name}", redis.url, **env)
            for route in ROUTES:
                server.set_mode("enforce", 0, route)
            self.pids[name] = server.proc.pid
        upstream = self.upstream()
        client = (self.pki.ca_cert, self.pki.client_cert, self.pki.client_key)
        self.front("plain", self.ports["plain"], upstream)
        self.front("tls", self.ports["tls"], upstream, tls=client)

    def run_row(self, row: str, seconds: float | None = None) -> dict[str, Any]:
        seconds = seconds or self.seconds
        service = row.removesuffix("_pinned")
        cpus = PINNED if row.endswith("_pinned") else None
        envoy = self.envoys[service]
        pid = self.pids[service]
        before, cpu0, envoy0 = envoy.ratelimit_stats(), tree_cpu(pid), process_cpu_s(envoy.pid)
        with pinned(cpus, [*cpu0, envoy.pid]):
            w = run_wrk(self.wrk, envoy.url, self.script, seconds, CONNECTIONS, cpus=cpus)
        after, cpu1, envoy1 = envoy.ratelimit_stats(), tree_cpu(pid), process_cpu_s(envoy.pid)
        rl = {k: after[k] - before[k] for k in after}
        calls = rl["ok"] + rl["over_limit"] + rl["error"]
        service_cpu = sum(cpu1[p] - cpu0.get(p, 0.0) for p in cpu1)
        return {
            "rps": w["rps"],
            "p99_us": w["p99_us"],
            "calls": calls,
            "failed": rl["error"],
            "error_share": rl["error"] / calls if calls else None,
            "service_cpu_us_per_call": service_cpu / calls * 1e6 if calls else None,
            "envoy_cpu_us_per_request": (envoy1 - envoy0) / w["requests"] * 1e6 if w["requests"] else None,
        }

    def handshakes(self, seconds: float) -> dict[str, Any]:
        """The TLS service pinned to core 0, ``openssl s_time`` clients on the others."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("openssl is needed for the handshake rate (apt-get install openssl)")
        cores = os.cpu_count() or 1
        others = f"1-{cores - 1}" if cores > 1 else "0"
        clients = max(1, cores - 1) * 2
        pid = self.pids["tls"]
        argv = [
            "taskset", "-c", others, openssl, "s_time", "-connect", f"127.0.0.1:{self.ports['tls']}", "-new",
            "-time", str(max(1, round(seconds))), "-CAfile", self.pki.ca_cert, "-cert", self.pki.client_cert,
            "-key", self.pki.client_key,
        ]  # fmt: skip
        cpu0 = tree_cpu(pid)
        t0 = time.perf_counter()
        with pinned(PINNED, list(cpu0)):
            procs = [
                subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(clients)
            ]
            outs = [p.communicate(timeout=seconds + 60) for p in procs]
        wall = time.perf_counter() - t0
        cpu1 = tree_cpu(pid)
        done = 0
        for out, err in outs:
            m = re.search(r"(\d+) connections in [\d.]+s", out)
            if not m:
                raise RuntimeError(f"openssl s_time said:\n{out[-2000:]}\n{err[-2000:]}")
            done += int(m.group(1))
        service_cpu = sum(cpu1[p] - cpu0.get(p, 0.0) for p in cpu1)
        return {
            "clients": clients,
            "handshakes": done,
            "per_s": done / wall,
            "service_cpu_share": service_cpu / wall,
            "per_cpu_s": done / service_cpu if service_cpu else None,
            "openssl": subprocess.run([openssl, "version"], capture_output=True, text=True).stdout.strip(),
        }


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, rs in runs.items():
        rows[name] = {
            "runs": rs,
            **{
                k: _median([r[k] for r in rs])
                for k in ("rps", "p99_us", "error_share", "service_cpu_us_per_call", "envoy_cpu_us_per_request")
            },  # fmt: skip
            "error_share_max": max((r["error_share"] or 0.0 for r in rs), default=None),
        }
    for name in ("tls", "tls_pinned"):
        base = runs[name.replace("tls", "plain")]
        rows[name]["vs_plain"] = statistics.median(a["rps"] / b["rps"] for a, b in zip(runs[name], base))
    return rows


def measure(seconds: float = 5.0, repeats: int = 3, quick: bool = False) -> dict[str, Any]:
    """Every row, ``repeats`` interleaved rounds of ``seconds`` each, then the handshake rounds."""
    if quick:
        seconds, repeats = min(seconds, 2.0), 1
    work = Path(tempfile.mkdtemp(prefix="shadowlimit-bench-tls-"))
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    shakes: list[dict[str, Any]] = []
    t0, load0 = time.perf_counter(), os.getloadavg()
    try:
        with Bench(work, seconds) as bench:
            for row in ROWS:  # warm-up: connections (and their handshakes), keys created
                bench.run_row(row, 1.0)
            for rnd in range(repeats):
                for row in ROWS:
                    r = bench.run_row(row)
                    runs[row].append(r)
                    print(
                        f"bench: tls round {rnd + 1}/{repeats} {row}: {r['rps']:,.0f} requests/s, "
                        f"{r['failed']} failed calls of {r['calls']}",
                        file=sys.stderr,
                        flush=True,
                    )
                shakes.append(bench.handshakes(seconds))
                print(f"bench: tls round {rnd + 1}/{repeats} handshakes: {shakes[-1]['per_s']:,.0f}/s", file=sys.stderr)
    except BaseException:
        print(f"bench: tls: work directory kept for its logs: {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    return {
        "rows": summarize(runs),
        "handshakes": {
            "runs": shakes,
            **{k: _median([s[k] for s in shakes]) for k in ("per_s", "service_cpu_share", "per_cpu_s")},
            "clients": shakes[0]["clients"],
            "openssl": shakes[0]["openssl"],
        },
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "envoy": envoy_version(),
            "cores": os.cpu_count(),
            "connections": CONNECTIONS,
            "seconds_per_run": seconds,
            "repeats": repeats,
            "quick": quick,
            "duration_s": round(time.perf_counter() - t0, 1),
            "load_avg_start": [round(x, 2) for x in load0],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


LABELS = {
    "plain": "cleartext",
    "tls": "mutual TLS, Envoy to the service",
    "plain_pinned": f"cleartext, on one core (`taskset -c {PINNED}`)",
    "tls_pinned": f"mutual TLS, on one core (`taskset -c {PINNED}`)",
}


def render(results: dict[str, Any]) -> str:
    meta, rows, hs = results["meta"], results["rows"], results["handshakes"]
    lines = [
        "## TLS behind Envoy, and handshakes",
        "",
        f"What mutual TLS between Envoy and the gRPC port costs (Envoy {meta['envoy']}, {meta['cores']} cores, wrk 1 "
        f"thread and {meta['connections']} long-lived connections, enforce, every call decided in Redis; "
        "`bench/tls.py`). TLS end to end: Envoy's encryption and the service's, EC P-256 certificates, TLS 1.3. Rows "
        f"interleaved, {meta['seconds_per_run']:g} s each, median of {meta['repeats']} round(s)"
        f"{' (a `--quick` trial)' if meta.get('quick') else ''}; measured {meta['date']} (load "
        f"{meta['load_avg_start'][0]:.2f} before, {meta['load_avg_end'][0]:.2f} after, {meta['duration_s']:.0f} s). "
        f"vs cleartext: the paired ratio of the same round (target: at least {TLS_TARGET:.2f}x, at equal failure "
        "rates). Calls failed: Envoy's `ratelimit.error` over its calls, each a request let through unlimited.",
        "",
        "| row | requests/s | vs cleartext | calls failed (worst round) | p99 | service CPU per call "
        "| Envoy CPU per request |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for name, r in rows.items():
        ratio = f"{r['vs_plain']:.2f}x" if "vs_plain" in r else "-"
        failed = "-" if r["error_share"] is None else f"{r['error_share']:.3%} ({r['error_share_max']:.3%})"
        lines.append(
            f"| {LABELS[name]} | {r['rps']:,.0f} | {ratio} | {failed} | {r['p99_us'] / 1000:.2f} ms | "
            f"{r['service_cpu_us_per_call'] or 0:,.0f} µs | {r['envoy_cpu_us_per_request'] or 0:,.0f} µs |"
        )
    lines += [
        "",
        f"Handshakes: the TLS service alone on core {PINNED}, {hs['clients']} `openssl s_time -new` clients "
        f"({hs['openssl']}) on the other cores, a full mutual-TLS handshake per connection: "
        f"**{hs['per_s']:,.0f} handshakes/s** with the service at {hs['service_cpu_share']:.0%} of its core, "
        f"**{hs['per_cpu_s'] or 0:,.0f} handshakes per CPU-second** of the service (what one core sustains).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return section_main(
        argv, doc=__doc__ or "", out=ROOT / "bench" / "results" / "tls.json", measure=measure, render=render
    )


if __name__ == "__main__":
    sys.exit(main())
