"""Submit throughput and latency: through `spillway api` (HTTPS, one kept connection, a
token) beside the same submits straight to Redis. Prints JSON.

Run by hand: ``python -m tests.reliability.api_bench [--jobs 500] [--redis-url URL]``
(default: an embedded Redis of its own). One client thread submits ``--jobs`` jobs one at a
time each way (``Client.submit``: validate, store, trigger a cycle), then ``--batches``
batches of ``--batch`` through ``submit_many``. Numbers from a loaded machine mean little:
say what else was running beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.client import Client
from broker.config.core import Config
from broker.security.tokens import TokenStore
from tests.integration.api_harness import ApiServer


def _timed(calls: int, fn: Any) -> dict[str, Any]:
    lat = []
    start = time.perf_counter()
    for i in range(calls):
        t = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    lat.sort()
    return {"calls": calls, "per_s": round(calls / wall, 1),
            "p50_ms": round(1000 * statistics.median(lat), 2),
            "p95_ms": round(1000 * lat[max(0, int(0.95 * len(lat)) - 1)], 2)}


def bench(url: str, workdir: Path, jobs: int, batch: int, batches: int) -> dict[str, Any]:
    config = Config(hold_if_infeasible=True)
    direct = Client(url, config)
    direct.store_redis.flushdb()
    server = ApiServer(url, workdir, "--submit-rate", "1000000", "--submit-burst", "1000000")
    server.start()
    try:
        tok, _ = TokenStore(direct.store_redis).create("bench", "user", ["bench"], time.time(),
                                                       by="bench")
        os.environ.update(SPILLWAY_TOKEN=tok, SPILLWAY_CA_FILE=str(server.ca))
        remote = Client(server.url, config)
        spec = {"command": "true", "gpus": 0, "team": "bench"}
        remote.submit(**spec)  # (the TLS handshake and the server's first call, untimed)
        direct.submit(**spec)
        out = {
            "jobs": jobs, "batch": batch,
            "api_submit": _timed(jobs, lambda i: remote.submit(**spec, name=f"a{i}")),
            "redis_submit": _timed(jobs, lambda i: direct.submit(**spec, name=f"r{i}")),
            "api_submit_many": _timed(batches, lambda i: remote.submit_many([spec] * batch)),
            "redis_submit_many": _timed(batches, lambda i: direct.submit_many([spec] * batch)),
        }
        for way in ("api", "redis"):
            many = out[f"{way}_submit_many"]
            many["jobs_per_s"] = round(many["per_s"] * batch, 1)
        out["cpus"] = os.cpu_count()
        out["load_1m"] = round(os.getloadavg()[0], 2)
        remote.close()
        return out
    finally:
        server.stop()
        direct.store_redis.flushdb()
        direct.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--redis-url", default=None, help="a database the bench may empty "
                                                      "(default: an embedded Redis)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="spillway-api-bench-") as tmp:
        if a.redis_url:
            result = bench(a.redis_url, Path(tmp), a.jobs, a.batch, a.batches)
        else:
            from broker.control.embedded import EmbeddedRedis

            with EmbeddedRedis(Path(tmp) / "redis") as emb:
                result = bench(emb.url, Path(tmp), a.jobs, a.batch, a.batches)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
