"""``bench.capacity`` measures the real thing: the command lines it gives redis-benchmark decide
as ``RedisLimiter`` decides (the same script, the same arguments, the same state written), and a
small run of every part yields the model, its sizing table and the check against a 6-node
cluster. Real redis-server and redis-benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import capacity  # noqa: E402
from limiter import RedisLimiter  # noqa: E402


@pytest.mark.parametrize("algorithm", capacity.ALGORITHMS)
@pytest.mark.parametrize("many", [False, True], ids=["single", "many"])
async def test_the_benchmarks_call_decides_as_the_limiter_does(redis_url, algorithm, many):
    client = redis.Redis.from_url(redis_url)
    try:
        capacity._load_scripts(client)
        ours = "rl:cap-a:client"
        reply = client.execute_command(*capacity._script_call(algorithm, ours, many))
        if many:  # the verdicts alone, one per decision
            assert reply == [1] * capacity.MANY, reply
        else:
            assert reply[0] == 1, reply
        rl = RedisLimiter.from_url(redis_url, namespace="cap-b", state_format=2)  # the benchmark's scripts
        try:
            policy = capacity._policy(algorithm)
            for _ in range(capacity.MANY if many else 1):
                assert (await rl.check("client", policy, now_us=capacity.NOW_US)).allowed
        finally:
            await rl.aclose()
        # the same state, field by field (the TTL aside): the compact form where it has one, else a hash
        kind = client.type(ours)
        compact = algorithm in ("fixed_window", "sliding_window", "gcra")
        assert kind == client.type("rl:cap-b:client") == (b"string" if compact else b"hash")
        read = client.get if kind == b"string" else client.hgetall
        assert read(ours) == read("rl:cap-b:client")
    finally:
        client.close()


@pytest.mark.timeout(300)
def test_a_small_run_gives_the_model_and_its_check(tmp_path):
    results = capacity.run_capacity(requests=4_000, keys=2_000, network_decisions=1_000)
    m = results["model"]
    for algorithm in capacity.ALGORITHMS:
        a = m["algorithms"][algorithm]
        assert a["enforce_us"] > 0 and a["batched_us"] > 0 and a["enforce_per_shard"] > 0
        assert a["bytes_cluster"] > 50 and a["bytes_standalone"] > 50, a
    assert len(m["table"]) == len(capacity.DECISION_RATES) * len(capacity.KEY_COUNTS)
    assert all(row["shards"] >= 1 for row in m["table"])
    assert set(m["replicas_per_10k"]) == {
        f"{r} {mode}" for r in ("http", "batch", "grpc") for mode in ("shadow", "enforce")
    }
    check = results["check"]
    assert check["nodes"] == 6 and check["masters"] == 3
    assert sum(check["master_decisions"]) == check["decisions"] == 4_000
    assert all(d > 0 for d in check["master_decisions"]), "redis-benchmark --cluster reached every master"
    # the replicas hold what their masters hold
    assert sorted(check["keys"][:3]) == sorted(check["keys"][3:]), check["keys"]
    rows = results["check_model"]["rows"]
    assert [r["node"] for r in rows] == [f"master {i}" for i in (1, 2, 3)] + [f"replica {i}" for i in (1, 2, 3)]
    doc = tmp_path / "capacity.md"
    doc.write_text(f"# title\n\n{capacity.BEGIN}\nthe-previous-figures\n{capacity.END}\n\nafter\n")
    capacity._replace_generated(doc, capacity.render(results))
    text = doc.read_text()
    assert "the-previous-figures" not in text and text.endswith(f"{capacity.END}\n\nafter\n")
    assert "| 10,000,000 | 1,000,000,000 |" in text and "| master 1 |" in text and "| replica 3 |" in text
