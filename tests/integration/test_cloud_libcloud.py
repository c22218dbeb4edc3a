"""libcloud machines on the real system: a Redis server, a scheduler process (which runs the
provisioner, and in it the libcloud provider), and libcloud's dummy driver made to share its
nodes between processes (tests/fakes/libcloud_driver.py: a file holds the "cloud"), so the boot
shim in this process (tests/fakes/boot.py) sees the node the provisioner made and runs its
user data as a local process.

Round trip: a launch through the provisioner -> a node with the cluster and request id in its
metadata and the boot script in its user data -> the agent registers as site
oscloud:lab:ondemand with the node's name as its instance id -> a job runs there with the
machine's GPUs in CUDA_VISIBLE_DEVICES -> the node goes idle -> drained and destroyed ->
nothing of the test's cluster is left in the driver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from broker.model import InstanceState
from broker.model.state import JobState
from providers.base import CLUSTER_TAG, REQUEST_TAG, Resources
from providers.libcloud.provider import LibcloudProvider
from tests.fakes.boot import LibcloudBooter, Machines
from tests.fakes.libcloud_driver import FileDummyNodeDriver
from tests.integration.harness import running, wait_until, with_db

pytestmark = [pytest.mark.integration, pytest.mark.slow]

I = InstanceState  # noqa: E741
DRIVER = "tests.fakes.libcloud_driver:FileDummyNodeDriver"
SITE = "oscloud:lab:ondemand"
OFFER = f"{SITE}/gpu-a100"


def test_libcloud_round_trip(redis_url: str, tmp_path: Path) -> None:
    url = with_db(redis_url, 13)
    cluster = "t" + uuid.uuid4().hex[:8]
    cloud = str(tmp_path / "cloud.json")
    settings = {"kind": "libcloud", "driver": DRIVER, "key": cloud, "region": "lab",
                "sizes": {"gpu-a100": {"gpus": "2xA100-80GB", "price_per_hour": 3.0,
                                       "cpus": 4, "memory_gb": 8}},
                "state_dir": str(tmp_path / "state")}
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"cluster_name": cluster, "providers": {"oscloud": {
        **settings, "install_command": ": already installed",
        "worker_command": f"{sys.executable} -m broker.cli",
        "boot_timeout_s": 60, "idle_timeout_s": 2}}}))
    provider = LibcloudProvider("oscloud", cluster, **{
        k: v for k, v in settings.items() if k != "kind"})  # type: ignore[arg-type]
    driver = FileDummyNodeDriver(cloud)
    counts = {"launched": 0, "jobs_lost": 0}
    with running(url, tmp_path) as c:
        machines = Machines(tmp_path / "machines", {**c.env}, grace_s=10)
        booter = LibcloudBooter(driver, machines).start()
        try:
            # the scheduler imports the test driver by name: the repository on its path
            root = str(Path(__file__).resolve().parents[2])
            c.env.update(SPILLWAY_CONFIG=str(cfg), PYTHONPATH=os.pathsep.join(
                p for p in (root, c.env.get("PYTHONPATH", "")) if p))
            c.start_scheduler()
            wait_until(lambda: [o.id for o in c.store.offers(time.time())] == [OFFER], 30,
                       "the libcloud offer to be published")
            done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url,
                                   "launch", OFFER], env=c.env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            rid = done.stdout.split()[0]
            ready = wait_until(lambda: (i := c.store.instance(rid)) and i.state is I.READY
                               and i, 60, "the node's agent to register")
            counts["launched"] += 1
            [node] = driver.list_nodes()
            assert node.extra["metadata"][CLUSTER_TAG] == cluster
            assert node.extra["metadata"][REQUEST_TAG] == rid
            assert ready.provider_id == node.name
            agent = next(n for n in c.store.nodes() if n.instance_id == node.name)
            assert str(agent.site) == SITE and agent.id == ready.node_id
            # a repeated launch of the same request finds the same node
            again = provider.launch(provider.offers(Resources())[0], 1, rid, "x")
            assert [m.provider_id for m in again] == [node.name]

            job = c.client.submit(command='echo "CVD=$CUDA_VISIBLE_DEVICES"', gpus=2,
                                  sites=["cloud"], name="on-libcloud")
            finished = c.client.wait(job.id, timeout=60)
            assert finished.state is JobState.SUCCEEDED, finished.history
            alloc = finished.allocations[0]
            assert alloc.node_id == agent.id
            assert f"CVD={','.join(alloc.gpu_ids)}" in [x.text for x in c.client.logs(job.id)]

            wait_until(lambda: (i := c.store.instance(rid)) and i.state is I.TERMINATED, 60,
                       "the idle node to be released")
            assert [h.state for h in c.store.instance(rid).history] == [  # type: ignore[union-attr]
                I.REQUESTED, I.BOOTING, I.READY, I.DRAINING, I.TERMINATED]
            wait_until(lambda: machines.running() == [], 30, "the machine to shut down")
            counts["jobs_lost"] = sum(j.state is not JobState.SUCCEEDED
                                      for j in c.client.list())
            assert counts["jobs_lost"] == 0
        finally:
            booter.stop()
            c.stop()
            machines.stop()
            print("libcloud counts:", counts, "booted:", machines.booted)
    assert provider.instances() == {} and driver.list_nodes() == []
