"""``python -m bench [--quick] [--only SECTION] [--out docs/benchmarks.md]`` (sections: see SECTIONS).

Starts a private embedded redis-server (loopback only) for the Redis sections and
stops it at the end; writes ``bench/results/latest.json`` and the Markdown report.

The ``service``, ``envoy`` and ``envoy_workers`` sections also keep their own results file
(``bench/results/<section>.json``). A run of only such sections (``--only envoy``) updates
them in the existing ``latest.json`` (the other sections' figures stay as they were measured)
and rewrites the report from it, instead of replacing the report with that section alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import CpuAccount, Settings, environment, log

SECTIONS = (
    "local", "distributed", "memory", "profile", "clients", "whatif", "explain", "service", "envoy", "envoy_workers",
)  # fmt: skip
#: sections that keep their own results file; a run of only these updates latest.json
STANDALONE = ("explain", "service", "envoy", "envoy_workers", "memory")
ROOT = Path(__file__).resolve().parent.parent


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _extra_sections() -> list[str]:
    from . import report

    cp = report.control_plane_section(ROOT / "bench" / "results" / "control_plane.json")
    sections = (
        _service_section(),
        _budgets_section(),
        _ab_section(),
        _whatif_section(),
        _explain_section(),
        cp,
        _stream_section(ROOT / "bench" / "results" / "stream.json"),
        _grpc_section(),
        _envoy_section(),
        _envoy_workers_section(),
        _tls_section(),
    )
    return [s for s in sections if s]


def _tls_section() -> str | None:
    """``python -m bench.tls``'s last results (bench/results/tls.json), measured separately."""
    path = ROOT / "bench" / "results" / "tls.json"
    if not path.exists():
        return None
    from .tls import render

    return render(json.loads(path.read_text(encoding="utf-8")))


def _envoy_section() -> str | None:
    """The ``envoy`` section's results (bench/results/envoy.json, written by its last run)."""
    path = ROOT / "bench" / "results" / "envoy.json"
    if not path.exists():
        return None
    from .envoy import render

    return render(json.loads(path.read_text(encoding="utf-8")))


def _envoy_workers_section() -> str | None:
    """The ``envoy_workers`` section's results (bench/results/envoy_workers.json, written by its last run)."""
    path = ROOT / "bench" / "results" / "envoy_workers.json"
    if not path.exists():
        return None
    from .envoy_workers import render

    return render(json.loads(path.read_text(encoding="utf-8")))


def _whatif_section() -> str | None:
    """The ``whatif`` section's results (bench/results/whatif.json, written by this run)."""
    path = ROOT / "bench" / "results" / "whatif.json"
    if not path.exists():
        return None
    from .whatif import render

    return render(json.loads(path.read_text(encoding="utf-8")))


def _explain_section() -> str | None:
    """The ``explain`` section's results (bench/results/explain.json, written by its last run)."""
    path = ROOT / "bench" / "results" / "explain.json"
    if not path.exists():
        return None
    from .explain import render

    return render(json.loads(path.read_text(encoding="utf-8")))


def _service_section() -> str | None:
    """The ``service`` section's results (bench/results/service.json, written by this run)."""
    path = ROOT / "bench" / "results" / "service.json"
    if not path.exists():
        return None
    from .service import render

    return render(json.loads(path.read_text(encoding="utf-8")))


def _budgets_section() -> str | None:
    """``python -m bench.budgets``'s last results (bench/results/budgets.json), measured separately."""
    path = ROOT / "bench" / "results" / "budgets.json"
    if not path.exists():
        return None
    from .budgets import render

    return render(json.loads(path.read_text(encoding="utf-8")))


def _ab_section() -> str | None:
    """``python -m bench.ab REV``'s last results (bench/results/ab.json), measured separately."""
    path = ROOT / "bench" / "results" / "ab.json"
    if not path.exists():
        return None
    from .ab import render

    text = render(json.loads(path.read_text(encoding="utf-8")), 0.05)
    return (
        "## A/B: this revision against an earlier one\n\n"
        "Both revisions served side by side (`shadowlimit serve --grpc-port` each, one Redis), every row run "
        "against both in interleaved rounds, the order swapped every round; within 5% is judged on requests/s, "
        "the server CPU per request is the figure least moved by other work on the machine.\n\n"
        + text.rstrip()
        + "\n\n_Measured separately by `python -m bench.ab REV`; read from `bench/results/ab.json`._\n"
    )


def _grpc_section() -> str | None:
    """``python -m bench.grpc_rls``'s results, measured separately like the control plane's."""
    path = ROOT / "bench" / "results" / "grpc_rls.json"
    if not path.exists():
        return None
    from .grpc_rls import render

    return (
        render(json.loads(path.read_text(encoding="utf-8"))).rstrip()
        + "\n\n_Measured separately by `python -m bench.grpc_rls`; read from `bench/results/grpc_rls.json`._\n"
    )


def _stream_section(path: Path) -> str | None:
    """``python -m bench.stream``'s results, measured separately like the control plane's."""
    if not path.exists():
        return None
    from .stream import render

    return (
        render(json.loads(path.read_text(encoding="utf-8"))).rstrip()
        + "\n\n_Measured separately by `python -m bench.stream`; read from `bench/results/stream.json`._\n"
    )


def _timed(name: str, cpu: CpuAccount, env: dict[str, Any], run: Callable[[], Any]) -> Any:
    """Run one section; record its wall time and what other processes used meanwhile."""
    log(f"bench: {name} ...")
    t0 = time.perf_counter()
    snap = cpu.snapshot()
    out = run()
    env["background_cpu"][name] = CpuAccount.background(snap, cpu.snapshot())
    env.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
    return out


def _redis_sections(
    sections: list[str], settings: Settings, cpu: CpuAccount, env: dict[str, Any], results: dict[str, Any]
) -> None:
    """The sections that need Redis, against one private embedded redis-server."""
    from . import report

    needs_redis = any(s in sections for s in ("distributed", "memory", "profile", "clients", "whatif", "explain"))
    server = None
    url = ""  # set when a section needs Redis
    try:
        if needs_redis:
            import redis

            from limiter.embedded import EmbeddedRedis

            server = EmbeddedRedis().start()
            cpu.attach_redis(server.pid)
            url = server.url
            r = redis.Redis.from_url(url)
            env["redis_server"] = r.info("server")["redis_version"]
            r.close()
            log(f"bench: embedded redis-server {env['redis_server']} at {url}")
        if "distributed" in sections:
            from .distributed import run_distributed

            results["distributed"] = _timed("distributed", cpu, env, lambda: run_distributed(settings, url))
            report.distributed_ratios(results["distributed"])
            from .distributed import run_same_script

            results["same_script"] = _timed("same_script", cpu, env, lambda: run_same_script(settings, url))
        if "memory" in sections:
            from .memory import run_memory, run_memory_upstream

            results["memory"] = _timed("memory", cpu, env, lambda: run_memory(settings, url))
            results["memory_upstream"] = _timed("memory_upstream", cpu, env, lambda: run_memory_upstream(settings))
            both = {"memory": results["memory"], "memory_upstream": results["memory_upstream"]}
            _write_atomic(ROOT / "bench" / "results" / "memory.json", json.dumps(both, indent=1) + "\n")
        if "profile" in sections:
            from .profiling import run_profile

            results["profile"] = _timed("profile", cpu, env, lambda: run_profile(settings, url))
        if "clients" in sections:
            from .clients import run_clients

            results["clients"] = _timed("clients", cpu, env, lambda: run_clients(settings, url))
        if "whatif" in sections:
            from .whatif import measure as measure_whatif

            n = 200_000 if settings.quick else 1_000_000
            results["whatif"] = _timed("whatif", cpu, env, lambda: measure_whatif(url, n))
            _write_atomic(ROOT / "bench" / "results" / "whatif.json", json.dumps(results["whatif"], indent=1) + "\n")
        if "explain" in sections:
            from .explain import measure as measure_explain

            pid = server.pid if server is not None else None
            quick = settings.quick
            results["explain"] = _timed(
                "explain",
                cpu,
                env,
                lambda: measure_explain(url, pid, seconds=0.5 if quick else 2.0, repeats=2 if quick else 7),
            )
            _write_atomic(ROOT / "bench" / "results" / "explain.json", json.dumps(results["explain"], indent=1) + "\n")
    finally:
        if server is not None:
            server.stop()


def _write_results(results: dict[str, Any], settings: Settings, json_arg: str | None, out_arg: str | None) -> None:
    """The raw JSON and the Markdown report; the run's summary on stderr."""
    from . import report

    env = results["environment"]
    json_path = Path(json_arg).resolve() if json_arg else ROOT / "bench" / "results" / "latest.json"
    _write_atomic(json_path, json.dumps(results, indent=1, default=str) + "\n")
    out_path = Path(out_arg).resolve() if out_arg else ROOT / "docs" / "benchmarks.md"
    _write_atomic(out_path, report.render(results, settings, _extra_sections()))
    log(f"bench: sections took {env.get('section_s')}")
    log(
        "bench: average cores used by other processes meanwhile: "
        f"{ {k: v['other_cores'] for k, v in env['background_cpu'].items()} }"
    )
    log(
        f"bench: wrote {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path} and "
        f"{out_path.relative_to(ROOT) if out_path.is_relative_to(ROOT) else out_path} in {env['duration_s']:.0f} s"
    )
    for t in results["targets"]:
        log(f"  target {'MET    ' if t['met'] else 'NOT MET'} {t['target']}: {t['measured']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog="python -m bench", description="shadowlimit benchmarks vs limits and PyrateLimiter"
    )
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test, < 60 s)")
    ap.add_argument("--only", choices=SECTIONS, action="append", help="run only this section (repeatable)")
    ap.add_argument("--out", default=None, help="Markdown report path (default: docs/benchmarks.md)")
    ap.add_argument("--json", default=None, help="raw results path (default: bench/results/latest.json)")
    ap.add_argument(
        "--render-only", action="store_true", help="only rewrite the Markdown report from the existing JSON results"
    )
    args = ap.parse_args(argv)

    if args.render_only:
        from . import report

        json_path = Path(args.json).resolve() if args.json else ROOT / "bench" / "results" / "latest.json"
        results = json.loads(json_path.read_text(encoding="utf-8"))
        out_path = Path(args.out).resolve() if args.out else ROOT / "docs" / "benchmarks.md"
        _write_atomic(out_path, report.render(results, Settings(**results["settings"]), _extra_sections()))
        log(f"bench: rendered {out_path} from {json_path}")
        return 0

    settings = Settings.make(args.quick)
    sections = list(args.only or SECTIONS)
    t_start = time.perf_counter()
    env = environment(argv)
    env["quick"] = settings.quick
    results: dict[str, Any] = {"environment": env, "settings": settings.__dict__, "sections": sections}
    log(
        f"bench: {env['cpu']} x{env['cores']}, {env['python']}, load {env['loadavg_start']}, "
        f"sections {sections}{' (quick)' if settings.quick else ''}"
    )
    if env["loadavg_start"][0] > 0.7 * (env["cores"] or 1):
        log(f"bench: warning: the machine is busy (load {env['loadavg_start'][0]}); numbers will be noisy")

    from . import report

    cpu = CpuAccount()
    env["background_cpu"] = {}

    if "local" in sections:
        from .local import run_local

        results["local"] = _timed("local", cpu, env, lambda: run_local(settings))
        results["local_baselines"] = report.local_ratios(results["local"])

    _redis_sections(sections, settings, cpu, env, results)
    if "service" in sections:
        from .service import measure as measure_service

        quick = settings.quick
        results["service"] = _timed(
            "service", cpu, env, lambda: measure_service(1.0 if quick else 3.0, 1 if quick else 5)
        )
        _write_atomic(ROOT / "bench" / "results" / "service.json", json.dumps(results["service"], indent=1) + "\n")
    if "envoy" in sections:
        from .envoy import measure as measure_envoy

        results["envoy"] = _timed("envoy", cpu, env, lambda: measure_envoy(quick=settings.quick))
        _write_atomic(ROOT / "bench" / "results" / "envoy.json", json.dumps(results["envoy"], indent=1) + "\n")
    if "envoy_workers" in sections:
        from .envoy_workers import measure as measure_workers

        results["envoy_workers"] = _timed("envoy_workers", cpu, env, lambda: measure_workers(quick=settings.quick))
        path = ROOT / "bench" / "results" / "envoy_workers.json"
        _write_atomic(path, json.dumps(results["envoy_workers"], indent=1) + "\n")

    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    env["duration_s"] = round(time.perf_counter() - t_start, 1)
    previous = ROOT / "bench" / "results" / "latest.json"
    if set(sections) <= set(STANDALONE) and args.json is None and previous.exists():
        results, settings = _merge_into(previous, results, sections)
    results["targets"] = report.compute_targets(results, settings.concurrency)

    _write_results(results, settings, args.json, args.out)
    return 0


def _merge_into(path: Path, results: dict[str, Any], sections: list[str]) -> tuple[dict[str, Any], Settings]:
    """The previous run's results with ``sections`` replaced by this run's (a run of only
    standalone sections): the report keeps every other section's figures."""
    merged = json.loads(path.read_text(encoding="utf-8"))
    env, new_env = merged["environment"], results["environment"]
    for name in sections:
        merged[name] = results[name]
        if name == "memory":  # with its second table, on Redis' own build
            merged["memory_upstream"] = results.get("memory_upstream")
        if name not in merged["sections"]:
            merged["sections"].append(name)
        env.setdefault("background_cpu", {})[name] = new_env["background_cpu"][name]
        env.setdefault("section_s", {})[name] = new_env["section_s"][name]
        env.setdefault("updated_alone", {})[name] = new_env["date_utc"]
    log(f"bench: updated {', '.join(sections)} in {path.relative_to(ROOT)} (the other sections are kept)")
    return merged, Settings(**merged["settings"])


if __name__ == "__main__":
    sys.exit(main())
