"""``python -m workers``: run a worker agent (the same as ``spillway worker``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from broker.config.core import load_config
from broker.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    p.add_argument("--redis-url", help="Redis URL (default: $SPILLWAY_REDIS_URL or config)")
    p.add_argument("--config", help="config file (YAML)")
    p.add_argument("--node-id", help="node id (default: the hostname)")
    p.add_argument("--gpus", help="static inventory instead of NVML, e.g. 4xA100-80GB,2xT4")
    p.add_argument("--inventory", help="static inventory file (YAML) instead of NVML")
    p.add_argument("--cpus", type=float, help="CPUs to offer (default: all)")
    p.add_argument("--memory-gb", type=float, help="memory to offer in GB (default: all)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="node label; repeatable")
    p.add_argument("--site", default="onprem", help="onprem, or the cloud site of this host")
    p.add_argument("--work-dir", help="where job logs and checkpoints go")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--label {item!r} is not KEY=VALUE")
        labels[key] = value
    try:
        config = load_config(args.config)
        url = args.redis_url or os.environ.get("SPILLWAY_REDIS_URL") or config.redis_url
        if not url:
            raise ConfigError("no Redis URL: pass --redis-url or set SPILLWAY_REDIS_URL")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from workers.service import run_agent

    return run_agent(url, config, node_id=args.node_id, gpus=args.gpus,
                     inventory=args.inventory, cpus=args.cpus, memory_gb=args.memory_gb,
                     labels=labels or None, site=args.site, work_dir=args.work_dir)


if __name__ == "__main__":
    sys.exit(main())
