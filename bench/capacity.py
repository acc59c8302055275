"""``python -m bench.capacity [--quick] [--keys N] [--out docs/capacity.md]``: the capacity model's
inputs measured on this machine, its sizing table computed from them, and the model checked
against a 6-node Redis Cluster (3 masters, 3 replicas) run here.

Inputs (all measured in the run, on private embedded redis-servers):

* **Redis CPU per decision**, per algorithm: ``redis-benchmark`` (C, pipelined, so the shard and
  not the client is what runs out) sends the decision script itself (``EVALSHA`` of
  ``lua/<algorithm>.lua`` with the arguments :class:`limiter.RedisLimiter` sends) over random
  keys, every decision allowed (a write, the dearer case); ``INFO cpu`` of the server over
  ``INFO commandstats``' calls. Once one decision per call (the hot path, enforce), once 128 per
  call (``lua/many.lua``: the batch endpoint and shadow's evaluation on a standalone Redis).
  And once with a replica attached: what a master spends feeding it.
* **Bytes per key**, per algorithm: section 3's method (``bench/memory.py``: ``used_memory``
  delta over N keys written through ``RedisLimiter``), on a standalone Redis and on a one-master
  cluster, whose difference is Redis Cluster's own per-key cost.
* **Network bytes per decision**: ``INFO stats`` ``total_net_input_bytes`` /
  ``total_net_output_bytes`` over the decisions of ``RedisLimiter.check`` (concurrent) and of
  ``check_many`` (batches of 100).
* **shadowlimit CPU per decision** (HTTP ``/v1/decide``, ``/v1/decide/batch``, Envoy's gRPC), read
  from the service and Envoy sections' last runs (``bench/results/service.json``, ``envoy.json``).

The check: a cluster of 3 masters with a replica each, ``redis-benchmark --cluster`` sending
the token bucket's script over K keys spread by slot; predicted against measured: each master's
CPU per decision, the decisions per master-core-second, and the ``used_memory`` each node gained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from .distributed import _commandstats, _redis_cpu, shadow_factory
from .harness import environment, log

__all__ = ["model", "render", "run_capacity"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "capacity.json"
ALGORITHMS = ("token_bucket", "gcra", "fixed_window", "sliding_window")
#: every decision allowed at any pace: the write is what a shard spends most on
BIG = 1_000_000_000
NOW_US = 1_800_000_000_000_000  # one fixed request time: the benchmark's decisions are all "now"
MANY = 128
#: the model's operating points: a shard or a replica of shadowlimit planned at this share of a core
HEADROOM = 0.5
#: a shard's memory planned up to this (maxmemory of a 32 GB machine with room for forks and buffers)
SHARD_GB = 24.0
DECISION_RATES = (10_000, 100_000, 1_000_000, 10_000_000)
KEY_COUNTS = (1_000_000, 100_000_000, 1_000_000_000)


def _redis_benchmark() -> str:
    path = shutil.which("redis-benchmark")
    if path is None:
        raise SystemExit("bench.capacity: redis-benchmark is not installed (Debian: apt-get install redis-tools)")
    return path


def _policy(algorithm: str) -> Any:
    from limiter import Policy

    return Policy(average=1_000_000, period=1.0, burst=BIG, algorithm=algorithm)


def _script_call(algorithm: str, key: str, many: bool, policy: Any = None) -> list[str]:
    """The EVALSHA command line redis-benchmark sends: one decision, or ``MANY`` in one call
    (under ``policy``, by default one that allows every decision at any pace)."""
    from limiter.scripts import many as many_script
    from limiter.scripts import policy_args, script_for

    policy = policy or _policy(algorithm)
    a1, a2, a3 = (a.decode() for a in policy_args(policy))
    if not many:
        return ["EVALSHA", script_for(policy).sha, "1", key, a1, a2, a3, str(NOW_US), "1"]
    sha = many_script(script_for(policy)).sha
    return ["EVALSHA", sha, str(MANY), *([key] * MANY), "0", a1, a2, a3, *([str(NOW_US), "1"] * MANY)]


def _load_scripts(client: redis.Redis) -> None:
    from limiter.scripts import many as many_script
    from limiter.scripts import script_for

    for algorithm in ALGORITHMS:
        script = script_for(_policy(algorithm))
        client.script_load(script.source)
        client.script_load(many_script(script).source)


def _evalsha_calls(client: redis.Redis) -> int:
    return int(_commandstats(client).get("evalsha", {}).get("calls", 0))


def _bench(
    address: tuple[str, int],
    command: list[str],
    requests: int,
    keyspace: int,
    cluster: bool = False,
    connections: tuple[int, int] = (50, 16),
) -> float:
    """redis-benchmark's requests/s for ``command`` (``connections``: clients, and requests in
    flight on each: 50 and pipelines of 16 unless said)."""
    clients, pipeline = connections
    args = [_redis_benchmark(), "-h", address[0], "-p", str(address[1]), "-c", str(clients), "-P", str(pipeline)]
    args += ["-n", str(requests), "-r", str(keyspace), "--csv", *(["--cluster"] if cluster else []), *command]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith('"') and not line.startswith('"test"')]
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no result: {out[-500:]}")
    return float(rows[-1].split('","')[1].strip('"'))


def shard_cost(
    clients: list[redis.Redis], address: tuple[str, int], command: list[str], decisions_per_call: int, requests: int
) -> dict[str, Any]:
    """One redis-benchmark run: the decisions/s and each node's CPU per decision."""
    for c in clients:
        c.config_resetstat()
    cpu0 = [_redis_cpu(c) for c in clients]
    t0 = time.perf_counter()
    calls_per_s = _bench(address, command, requests, keyspace=1_000_000)
    wall = time.perf_counter() - t0
    calls = _evalsha_calls(clients[0])
    decisions = calls * decisions_per_call
    cpu = [_redis_cpu(c) - c0 for c, c0 in zip(clients, cpu0)]
    return {
        "decisions_per_s": round(calls_per_s * decisions_per_call),
        "cpu_us_per_decision": [round(x / decisions * 1e6, 3) for x in cpu],
        "cpu_util": [round(x / wall, 3) for x in cpu],
    }


def measure_shards(requests: int) -> dict[str, Any]:
    """Per algorithm, one decision per call and 128 per call, on a standalone shard; then the
    token bucket with a replica attached."""
    from limiter.embedded import EmbeddedRedis

    out: dict[str, Any] = {}
    with EmbeddedRedis() as server:
        address = (server.host, server.port or 0)
        client = redis.Redis(host=address[0], port=address[1])
        _load_scripts(client)
        for algorithm in ALGORITHMS:
            for shape, many in (("single", False), ("many", True)):
                client.flushall(asynchronous=False)  # the keys, not the scripts
                n = requests // (MANY // 8) if many else requests
                res = shard_cost(
                    [client], address, _script_call(algorithm, "rl:cap:__rand_int__", many), MANY if many else 1, n
                )
                out[f"{algorithm}/{shape}"] = {
                    "decisions_per_s": res["decisions_per_s"],
                    "cpu_us": res["cpu_us_per_decision"][0],
                }
                log(
                    f"  capacity shard {algorithm:15s} {shape:6s} {res['decisions_per_s']:>9,} decisions/s, "
                    f"{res['cpu_us_per_decision'][0]:.2f} us/decision ({res['cpu_util'][0]:.0%} of a core)"
                )
        with EmbeddedRedis(replica_of=address) as replica:
            _wait_replica(client)
            client.flushall(asynchronous=False)
            rc = redis.Redis(host=replica.host, port=replica.port or 0)
            res = shard_cost(
                [client, rc], address, _script_call("token_bucket", "rl:cap:__rand_int__", False), 1, requests
            )
            rc.close()
        out["token_bucket/single+replica"] = {
            "decisions_per_s": res["decisions_per_s"],
            "cpu_us": res["cpu_us_per_decision"][0],
            "replica_cpu_us": res["cpu_us_per_decision"][1],
        }
        log(
            f"  capacity shard with a replica: master {res['cpu_us_per_decision'][0]:.2f} us/decision, "
            f"replica {res['cpu_us_per_decision'][1]:.2f}"
        )
        client.close()
    return out


def _wait_replica(master: redis.Redis, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = master.info("replication")
        if int(info.get("connected_slaves", 0)) and "online" in str(info.get("slave0", "")):
            return
        time.sleep(0.1)
    raise RuntimeError("the replica did not come online")


def _memory_rows(url: str, stats: redis.Redis, keys: int) -> dict[str, float]:
    from .memory import POLICY, _measure

    out = {}
    for algorithm in ALGORITHMS:
        res = _measure(url, stats, shadow_factory(algorithm, batch=500, policy_kw=POLICY), 500, keys, 1, 0.4)
        out[algorithm] = res["bytes_per_key"]
        stats.flushall()
    return out


def measure_memory(keys: int) -> dict[str, Any]:
    """Bytes per key per algorithm on a standalone Redis and on a one-master cluster."""
    from limiter.embedded import EmbeddedCluster, EmbeddedRedis

    with EmbeddedRedis() as server:
        stats = redis.Redis.from_url(server.url)
        standalone = _memory_rows(server.url, stats, keys)
        stats.close()
    with EmbeddedCluster(masters=1) as cluster:
        host, port = cluster.nodes[0]
        stats = redis.Redis(host=host, port=port)
        clustered = _memory_rows(cluster.url, stats, keys)
        stats.close()
    for algorithm in ALGORITHMS:
        log(
            f"  capacity memory {algorithm:15s} standalone {standalone[algorithm]:.1f} B/key, "
            f"cluster {clustered[algorithm]:.1f} B/key"
        )
    return {"standalone": standalone, "cluster": clustered, "keys": keys}


def measure_network(decisions: int) -> dict[str, Any]:
    """Bytes on the wire per decision, both ways, for one decision per call and 100 per call."""
    from limiter import RedisLimiter
    from limiter.embedded import EmbeddedRedis

    policy = _policy("token_bucket")

    async def drive(url: str, batch: int) -> None:
        rl = RedisLimiter.from_url(url, namespace="cap")
        try:
            names = [f"client-{i}" for i in range(decisions)]
            if batch == 1:
                for i in range(0, decisions, 100):
                    await asyncio.gather(*(rl.check(n, policy) for n in names[i : i + 100]))
            else:
                for i in range(0, decisions, batch):
                    await rl.check_many([(n, policy, 1, None) for n in names[i : i + batch]])
        finally:
            await rl.aclose()

    out = {}
    with EmbeddedRedis() as server:
        stats = redis.Redis.from_url(server.url)
        for shape, batch in (("single", 1), ("batch of 100", 100)):
            asyncio.run(drive(server.url, batch))  # warm: scripts loaded, connections made
            stats.flushall()
            before = stats.info("stats")
            asyncio.run(drive(server.url, batch))
            after = stats.info("stats")
            rx = (after["total_net_input_bytes"] - before["total_net_input_bytes"]) / decisions
            tx = (after["total_net_output_bytes"] - before["total_net_output_bytes"]) / decisions
            out[shape] = {"to_redis": round(rx, 1), "from_redis": round(tx, 1)}
            log(f"  capacity network {shape:13s} {rx:.0f} B to Redis, {tx:.0f} B back per decision")
        stats.close()
    return out


def service_costs() -> dict[str, Any]:
    """shadowlimit's own CPU per decision, from the service and Envoy sections' last runs."""
    service = json.loads((ROOT / "bench" / "results" / "service.json").read_text(encoding="utf-8"))
    envoy = json.loads((ROOT / "bench" / "results" / "envoy.json").read_text(encoding="utf-8"))
    cpu = service["cpu_us_per_request"]
    batch = service["hotpath"]["batch"]
    rows = envoy["rows"]
    return {
        "http": {"shadow": cpu["decide shadow"], "enforce": cpu["decide enforce"]},
        "batch": {
            "shadow": batch["shadow"]["parse_us"]
            + batch["shadow"]["decide_and_dump_us"]
            + batch["shadow"].get("shadow_evaluation_us", 0.0),
            "enforce": batch["enforce"]["parse_us"] + batch["enforce"]["decide_and_dump_us"],
        },
        "grpc": {
            "shadow": rows["shadow"]["service_cpu_us_per_call"],
            "enforce": rows["enforce"]["service_cpu_us_per_call"],
        },
        "measured": {"service": service["meta"]["date"], "envoy": envoy["meta"]["date"]},
    }


def check_cluster(requests: int, keyspace: int) -> dict[str, Any]:
    """The token bucket's script from ``redis-benchmark --cluster`` on 3 masters with a replica
    each: what every node spent per decision and gained in memory."""
    from limiter.embedded import EmbeddedCluster

    with EmbeddedCluster(replicas=1) as cluster:
        clients = {address: redis.Redis(host=address[0], port=address[1]) for address in cluster.nodes}
        try:
            masters = [a for a, c in clients.items() if c.info("replication")["role"] == "master"]
            for a in masters:
                _load_scripts(clients[a])
            ordered = [clients[a] for a in masters] + [c for a, c in clients.items() if a not in masters]
            before = [c.info("memory") for c in ordered]
            used0 = [int(m["used_memory"]) for m in before]
            # each node's replication backlog fills with the run's first writes, up to its size
            backlog_size = int(clients[masters[0]].config_get("repl-backlog-size")["repl-backlog-size"])
            backlog0 = [int(m.get("mem_replication_backlog", 0)) for m in before]
            command = _script_call("token_bucket", "rl:{tag}:__rand_int__", False)
            for c in ordered:
                c.config_resetstat()
            cpu0 = [_redis_cpu(c) for c in ordered]
            t0 = time.perf_counter()
            _bench(masters[0], command, requests, keyspace, cluster=True)
            wall = time.perf_counter() - t0
            calls = [_evalsha_calls(clients[a]) for a in masters]
            cpu = [_redis_cpu(c) - c0 for c, c0 in zip(ordered, cpu0)]
            time.sleep(1.0)  # the replicas' last writes, the incremental rehash
            keys = [int(c.dbsize()) for c in ordered]
            used = [int(c.info("memory")["used_memory"]) - u0 for c, u0 in zip(ordered, used0)]
        finally:
            for c in clients.values():
                c.close()
    n = len(masters)
    return {
        "nodes": len(ordered),
        "masters": n,
        "requests": requests,
        "keyspace": keyspace,
        "wall_s": round(wall, 2),
        "decisions": sum(calls),
        "decisions_per_s": round(sum(calls) / wall),
        "master_cpu_s": [round(x, 3) for x in cpu[:n]],
        "replica_cpu_s": [round(x, 3) for x in cpu[n:]],
        "master_decisions": calls,
        "keys": keys,
        "used_memory_delta": used,
        "backlog_size": backlog_size,
        "backlog_at_start": backlog0,
    }


def model(results: dict[str, Any]) -> dict[str, Any]:
    """The model from the measured inputs: each shard's and each replica's decisions per second
    at ``HEADROOM`` of a core, bytes and keys per GB, and the sizing table."""
    shards, memory, net, svc = results["shards"], results["memory"], results["network"], results["service"]
    replica = shards["token_bucket/single+replica"]
    feed_us = max(0.0, replica["cpu_us"] - shards["token_bucket/single"]["cpu_us"])
    per_alg = {}
    for alg in ALGORITHMS:
        single, many = shards[f"{alg}/single"]["cpu_us"], shards[f"{alg}/many"]["cpu_us"]
        per_alg[alg] = {
            "enforce_us": round(single + feed_us, 3),
            "batched_us": round(many + feed_us, 3),
            "enforce_per_shard": round(HEADROOM * 1e6 / (single + feed_us)),
            "batched_per_shard": round(HEADROOM * 1e6 / (many + feed_us)),
            "bytes_standalone": memory["standalone"][alg],
            "bytes_cluster": memory["cluster"][alg],
            "keys_per_gb_cluster": round(1e9 / memory["cluster"][alg]),
        }
    wire = net["single"]["to_redis"] + net["single"]["from_redis"]
    replicas = {
        f"{road} {mode}": math.ceil(10_000 * svc[road][mode] / 1e6 / HEADROOM)
        for road in ("http", "batch", "grpc")
        for mode in ("shadow", "enforce")
    }
    tb = per_alg["token_bucket"]
    table = []
    for rate in DECISION_RATES:
        for keys in KEY_COUNTS:
            cpu_shards = math.ceil(rate / tb["enforce_per_shard"])
            gb = keys * tb["bytes_cluster"] / 1e9
            mem_shards = math.ceil(gb / SHARD_GB)
            table.append(
                {
                    "decisions_per_s": rate,
                    "keys": keys,
                    "shards": max(cpu_shards, mem_shards, 1),
                    "bound_by": "CPU" if cpu_shards >= mem_shards else "memory",
                    "memory_gb": round(gb, 1),
                    "network_mbit_s": round(rate * wire * 8 / 1e6),
                    "replicas_http_enforce": math.ceil(rate * svc["http"]["enforce"] / 1e6 / HEADROOM),
                }
            )
    return {
        "feed_us": round(feed_us, 3),
        "algorithms": per_alg,
        "replicas_per_10k": replicas,
        "table": table,
        "wire_bytes": wire,
    }


def check_against_model(results: dict[str, Any], m: dict[str, Any]) -> dict[str, Any]:
    """Predicted beside measured for the 6-node run."""
    c = results["check"]
    tb = m["algorithms"]["token_bucket"]
    rows = []
    for i, (cpu_s, decisions) in enumerate(zip(c["master_cpu_s"], c["master_decisions"])):
        measured_us = cpu_s / decisions * 1e6 if decisions else float("nan")
        rows.append(
            {
                "node": f"master {i + 1}",
                "predicted_us": tb["enforce_us"],
                "measured_us": round(measured_us, 3),
                "predicted_per_core_s": round(1e6 / tb["enforce_us"]),
                "measured_per_core_s": round(1e6 / measured_us) if decisions else 0,
                "predicted_bytes": _node_bytes(c, i, tb["bytes_cluster"]),
                "measured_bytes": c["used_memory_delta"][i],
            }
        )
    n = c["masters"]
    for j, used in enumerate(c["used_memory_delta"][n:]):
        rows.append(
            {
                "node": f"replica {j + 1}",
                "predicted_bytes": _node_bytes(c, n + j, tb["bytes_cluster"]),
                "measured_bytes": used,
            }
        )
    return {"rows": rows}


def _node_bytes(check: dict[str, Any], i: int, per_key: float) -> int:
    """What node ``i`` of the check should gain: its keys at ``per_key`` bytes, and its
    replication backlog filled up to ``repl-backlog-size`` (a fixed cost per node, not per key)."""
    return round(check["keys"][i] * per_key + max(0, check["backlog_size"] - check["backlog_at_start"][i]))


def _ratio(measured: float, predicted: float) -> str:
    return f"{measured / predicted:.2f}x" if predicted else "-"


def render(results: dict[str, Any]) -> str:
    """The generated part of docs/capacity.md."""
    m, env = results["model"], results["environment"]
    lines = [
        f"_Measured {env['date_utc']} on {env['cpu']} ({env['cores']} cores), Redis "
        f"{results['redis_version']}, by `python -m bench.capacity`; shadowlimit's own CPU from the service "
        f"section ({results['service']['measured']['service']}) and the Envoy section "
        f"({results['service']['measured']['envoy']})._",
        "",
        "### A shard",
        "",
        f"Redis CPU per decision (every decision allowed: a write), a replica's feed included "
        f"({m['feed_us']:.2f} µs measured on the token bucket), and what one shard takes at "
        f"{HEADROOM:.0%} of its core:",
        "",
        "| algorithm | one decision per call (enforce) | per shard | 128 per call (batches, shadow's evaluation) "
        "| per shard | bytes/key standalone | bytes/key cluster | keys per GB (cluster) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for alg, a in m["algorithms"].items():
        lines.append(
            f"| {alg} | {a['enforce_us']:.2f} µs | {a['enforce_per_shard']:,}/s | {a['batched_us']:.2f} µs "
            f"| {a['batched_per_shard']:,}/s | {a['bytes_standalone']:.1f} | {a['bytes_cluster']:.1f} "
            f"| {a['keys_per_gb_cluster'] / 1e6:.2f} M |"
        )
    net = results["network"]
    lines += [
        "",
        "Network per decision (token bucket, `RedisLimiter`): "
        + "; ".join(
            f"{shape}: {v['to_redis']:.0f} B to Redis, {v['from_redis']:.0f} B back" for shape, v in net.items()
        )
        + ". A replica gets each write again (the script's effects).",
        "",
        "### shadowlimit replicas per 10,000 decisions/s",
        "",
        f"One replica = one process on one core, planned at {HEADROOM:.0%} of it:",
        "",
        "| road | shadow | enforce |",
        "|---|--:|--:|",
    ]
    svc = results["service"]
    names = {"http": "HTTP `/v1/decide`", "batch": "`/v1/decide/batch` (1,000 per request)", "grpc": "Envoy's gRPC"}
    for road, name in names.items():
        r = m["replicas_per_10k"]
        lines.append(
            f"| {name} | {r[f'{road} shadow']} ({svc[road]['shadow']:.1f} µs/decision) "
            f"| {r[f'{road} enforce']} ({svc[road]['enforce']:.1f} µs/decision) |"
        )
    lines += [
        "",
        "### Sizing (token bucket, enforce, one replica per master)",
        "",
        f"Shards: the larger of CPU (decisions/s over one shard's at {HEADROOM:.0%}) and memory (keys x "
        f"bytes/key in a cluster over {SHARD_GB:.0f} GB a shard); memory is per copy (a replica holds "
        "as much again); network is shadowlimit to Redis, both ways, before replication.",
        "",
        "| decisions/s | keys | masters | bound by | memory per copy | network | replicas (HTTP, enforce) |",
        "|--:|--:|--:|---|--:|--:|--:|",
    ]
    for row in m["table"]:
        lines.append(
            f"| {row['decisions_per_s']:,} | {row['keys']:,} | {row['shards']} | {row['bound_by']} "
            f"| {row['memory_gb']:,.1f} GB | {row['network_mbit_s']:,} Mbit/s | {row['replicas_http_enforce']:,} |"
        )
    c, chk = results["check"], results["check_model"]
    lines += [
        "",
        "### The check: 3 masters, 3 replicas, on this machine",
        "",
        f"`redis-benchmark --cluster` sent the token bucket's script {c['decisions']:,} times over "
        f"{c['keyspace']:,} keys in {c['wall_s']} s ({c['decisions_per_s']:,} decisions/s, the {c['nodes']} "
        f"nodes and the load sharing {env['cores']} cores, so no master had a core of its own: the model's "
        "figure to check is the CPU a master spends per decision, and so the decisions one master-core "
        "takes). Memory predicted: the node's keys at the cluster's bytes per key, and its replication backlog "
        f"filled from where it stood up to `repl-backlog-size` ({c['backlog_size'] / 2**20:.0f} MiB).",
        "",
        "| node | CPU per decision predicted | measured | decisions per core-second predicted | measured | "
        "memory predicted | measured | measured / predicted |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in chk["rows"]:
        if "predicted_us" in r:
            lines.append(
                f"| {r['node']} | {r['predicted_us']:.2f} µs | {r['measured_us']:.2f} µs "
                f"| {r['predicted_per_core_s']:,} | {r['measured_per_core_s']:,} | {r['predicted_bytes'] / 1e6:.1f} MB "
                f"| {r['measured_bytes'] / 1e6:.1f} MB | CPU {_ratio(r['measured_us'], r['predicted_us'])}, "
                f"memory {_ratio(r['measured_bytes'], r['predicted_bytes'])} |"
            )
        else:
            lines.append(
                f"| {r['node']} | - | - | - | - | {r['predicted_bytes'] / 1e6:.1f} MB "
                f"| {r['measured_bytes'] / 1e6:.1f} MB | memory {_ratio(r['measured_bytes'], r['predicted_bytes'])} |"
            )
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- capacity:begin -->", "<!-- capacity:end -->"


def _replace_generated(path: Path, text: str) -> None:
    doc = path.read_text(encoding="utf-8")
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    path.write_text(doc[:start] + "\n" + text + doc[end:], encoding="utf-8")


def run_capacity(requests: int, keys: int, network_decisions: int) -> dict[str, Any]:
    """Every measurement, the model and its check: ``requests`` calls per redis-benchmark run,
    ``keys`` for the memory rows and the check's keyspace."""
    log("bench: capacity ...")
    results: dict[str, Any] = {"environment": environment(["python", "-m", "bench.capacity"])}
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=True).stdout
    results["redis_version"] = version.split()[2].removeprefix("v=")
    results["shards"] = measure_shards(requests)
    results["memory"] = measure_memory(keys)
    results["network"] = measure_network(network_decisions)
    results["service"] = service_costs()
    results["check"] = check_cluster(requests, keyspace=keys)
    results["model"] = model(results)
    results["check_model"] = check_against_model(results, results["model"])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions and keys (a smoke test)")
    parser.add_argument("--keys", type=int, default=None, help="keys for the memory rows and the check (100,000)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "capacity.md", help="the document to update")
    args = parser.parse_args(argv)
    keys = args.keys or (20_000 if args.quick else 100_000)
    results = run_capacity(200_000 if args.quick else 1_000_000, keys, 20_000 if args.quick else 100_000)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    _replace_generated(args.out, render(results))
    log(f"bench: capacity written to {RESULTS.relative_to(ROOT)} and {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
