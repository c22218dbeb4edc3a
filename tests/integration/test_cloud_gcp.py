"""GCP machines on the real system: a Redis server, a scheduler process (which runs the
provisioner, and in it the GCP provider with google-cloud-compute), the fake Compute endpoint
(tests/fakes/gce.py) in this process, and the boot shim (tests/fakes/boot.py) that runs each
RUNNING instance's startup-script as a local process with its own GCE metadata service.

Round trip: a launch through the provisioner -> a SPOT instance on the fake -> its startup
script (rendered by providers/userdata.py) asks the metadata service for its name and starts
the agent -> the agent registers as site gcp:us-central1:us-central1-a:spot with the instance
name as its instance id -> a job runs there with the machine's GPU in CUDA_VISIBLE_DEVICES ->
the node goes idle -> it is drained and the instance deleted -> nothing labelled with the
test's cluster is left. Then, on the same system: a stockout fails the launch and blocks the
zone, and a launch throttled once (HTTP 429) is retried by the provisioner and comes up.

Also, without the rest of the system: the boot shim runs startup scripts with their metadata
server, and a preemption by the fake reaches the machine (``instance/preempted``) before
Compute deletes it and the shim shuts it down.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.model import InstanceState
from broker.model.cloud import Market, Offer
from broker.model.state import JobState
from broker.store.instances import block_key_of
from providers.base import CLUSTER_TAG, REQUEST_TAG
from tests.fakes.boot import Machines, boot_gce
from tests.fakes.gce import serving
from tests.integration.harness import Cluster, running, wait_until, with_db

pytestmark = [pytest.mark.integration, pytest.mark.slow]

I = InstanceState  # noqa: E741
SITE_A = "gcp:us-central1:us-central1-a:spot"
OFFER_A = f"{SITE_A}/a2-highgpu-1g"
OFFER_B = "gcp:us-central1:us-central1-b:spot/a2-highgpu-1g"


# What the rendered startup script does first (providers/userdata.py): its name from the
# metadata server; here it then records what it learnt, watches instance/preempted as the
# agent's spot watcher does, and waits to be shut down.
PROBE = """#!/bin/sh
set -eu
META="${SPILLWAY_METADATA_URL:-http://metadata.google.internal}"
get() { curl -sf -H "Metadata-Flavor: Google" "$META/computeMetadata/v1/instance/$1"; }
NAME=$(get name)
echo "$NAME $(get zone)" > booted
trap 'echo "shutdown $NAME" > stopped; exit 0' TERM
while :; do
  if [ "$(get preempted)" = TRUE ] && [ ! -e preempted ]; then echo TRUE > preempted; fi
  sleep 0.1
done
"""


def test_boot_shim_runs_the_startup_script_and_preemption_reaches_it(tmp_path: Path) -> None:
    from providers.gcp.provider import GcpProvider
    from tests.fakes.gce import serving as fake_compute

    offer = Offer("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "A100-40GB", 1,
                  40.0, Market.SPOT, 1.1)
    with fake_compute(op_seconds=0.5) as fake:
        machines = Machines(tmp_path, grace_s=5)
        boot_gce(fake, machines)
        try:
            p = GcpProvider("gcp", "c1", "proj", ["us-central1-a"], endpoint=fake.url,
                            anonymous=True)
            a, b = p.launch(offer, 2, "req-boot", PROBE)
            for m in (a, b):
                booted = tmp_path / m.provider_id / "booted"
                wait_until(lambda f=booted: f.exists() and f.read_text(), 30, "a boot")
                assert booted.read_text() == \
                    f"{m.provider_id} projects/0/zones/us-central1-a\n"
            assert machines.booted == 2
            fake.preempt(a.provider_id)  # the metadata says so, then Compute deletes it
            wait_until(lambda: (tmp_path / a.provider_id / "preempted").exists(), 30,
                       "the preemption notice to reach the machine")
            wait_until(lambda: (tmp_path / a.provider_id / "stopped").exists(), 30,
                       "the preempted machine to shut down")
            assert machines.running() == [b.provider_id]
            p.terminate([b.provider_id])
            wait_until(lambda: machines.running() == [], 30, "the other to shut down")
            assert not (tmp_path / b.provider_id / "preempted").exists()
            assert p.instances() == {} and fake.bugs == []
        finally:
            machines.stop()


def _offer(zone: str) -> dict[str, Any]:
    return {"zone": zone, "instance_type": "a2-highgpu-1g", "gpu_model": "A100-40GB",
            "gpu_count": 1, "market": "spot", "price_per_hour": 1.1,
            "gpus": "1xA100-40GB", "cpus": 4, "memory_gb": 8}


def _config(tmp: Path, cluster: str, endpoint: str) -> Path:
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({"cluster_name": cluster, "providers": {"gcp": {
        "project": "spillway-test", "zones": ["us-central1-a", "us-central1-b"],
        "endpoint": endpoint, "anonymous": True, "operation_timeout_s": 30,
        "offers": [_offer("us-central1-a"), _offer("us-central1-b")],
        "install_command": ": already installed",
        "worker_command": f"{sys.executable} -m broker.cli",
        "boot_timeout_s": 60, "idle_timeout_s": 2, "cooldown_s": 600}}}))
    return cfg


def _launch(c: Cluster, offer_id: str) -> str:
    done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", c.url, "launch",
                           offer_id], env=c.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def _state(c: Cluster, rid: str) -> InstanceState | None:
    inst = c.store.instance(rid)
    return None if inst is None else inst.state


def test_gcp_round_trip_stockout_and_throttling(redis_url: str, tmp_path: Path) -> None:
    url = with_db(redis_url, 12)
    cluster = "t" + uuid.uuid4().hex[:8]
    counts = {"launched": 0, "stockouts": 0, "throttled": 0, "jobs_lost": 0}
    with serving(op_seconds=1.0) as fake, running(url, tmp_path) as c:
        machines = Machines(tmp_path / "machines", {**c.env}, grace_s=10)
        boot_gce(fake, machines)
        try:
            c.env.update(SPILLWAY_CONFIG=str(_config(tmp_path, cluster, fake.url)),
                         SPILLWAY_PROVISION_RETRY_S="0.2")
            c.start_scheduler()
            wait_until(lambda: len(c.store.offers(time.time())) == 2, 30,
                       "the GCP offers to be published")

            # a launch through the provisioner: the instance boots and its agent registers
            rid = _launch(c, OFFER_A)
            ready = wait_until(lambda: (i := c.store.instance(rid)) and i.state is I.READY
                               and i, 60, "the instance's agent to register")
            counts["launched"] += 1
            [body] = [b for b in fake.inserts if b["labels"][REQUEST_TAG] == rid]
            assert body["labels"][CLUSTER_TAG] == cluster
            assert body["scheduling"]["provisioningModel"] == "SPOT"
            assert ready.provider_id == body["name"]
            node = next(n for n in c.store.nodes() if n.instance_id == ready.provider_id)
            assert str(node.site) == SITE_A and node.id == ready.node_id == body["name"]

            # a job allowed on spot machines runs there, with the machine's GPU
            job = c.client.submit(command='echo "CVD=$CUDA_VISIBLE_DEVICES"', gpus=1,
                                  sites=["spot"], name="on-gcp")
            finished = c.client.wait(job.id, timeout=60)
            assert finished.state is JobState.SUCCEEDED, finished.history
            alloc = finished.allocations[0]
            assert alloc.node_id == node.id
            assert f"CVD={','.join(alloc.gpu_ids)}" in [x.text for x in c.client.logs(job.id)]

            # idle past idle_timeout_s: drained, then the instance is deleted
            wait_until(lambda: _state(c, rid) is I.TERMINATED, 60, "the idle node released")
            assert [h.state for h in c.store.instance(rid).history] == [  # type: ignore[union-attr]
                I.REQUESTED, I.BOOTING, I.READY, I.DRAINING, I.TERMINATED]
            wait_until(lambda: machines.running() == [], 30, "the machine to shut down")
            assert fake.labelled(CLUSTER_TAG, cluster) == []

            # a stockout in zone b: the launch fails over (FAILED) and the zone cools down
            fake.stockout("us-central1-b")
            out = _launch(c, OFFER_B)
            wait_until(lambda: _state(c, out) is I.FAILED, 60, "the stocked-out launch to fail")
            counts["stockouts"] += 1
            assert "no capacity" in c.store.instance(out).history[-1].reason  # type: ignore[union-attr]
            assert block_key_of(OFFER_B) in c.store.blocks(time.time())
            assert fake.labelled(REQUEST_TAG, out) == []

            # throttled once (429 on the insert): the provisioner retries and it comes up
            fake.fail_next(429, "rateLimitExceeded", method="POST")
            again = _launch(c, OFFER_A)
            wait_until(lambda: _state(c, again) is I.READY, 60, "the retried launch to run")
            counts["launched"] += 1
            counts["throttled"] += 1
            assert "429" in c.logs_of("scheduler")
            wait_until(lambda: _state(c, again) is I.TERMINATED, 60, "the idle node released")
            counts["jobs_lost"] = sum(j.state is not JobState.SUCCEEDED
                                      for j in c.client.list())
            assert counts["jobs_lost"] == 0
            wait_until(lambda: fake.labelled(CLUSTER_TAG, cluster) == [], 30,
                       "no instance of the cluster left")
            assert fake.bugs == []
        finally:
            c.stop()
            machines.stop()
            print("gcp counts:", counts, "booted:", machines.booted)
    assert fake.labelled(CLUSTER_TAG, cluster) == []
