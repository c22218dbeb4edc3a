"""Cloud machines on the real system with the ``local`` provider: a Redis server, a scheduler
process (which runs the provisioner), and agents that are real processes started as "machines".

Round trip: a launch through the provisioner -> the machine boots -> its agent registers with
the cloud site and its instance id -> a job allowed on the cloud runs there with the machine's
GPUs in CUDA_VISIBLE_DEVICES -> the node goes idle -> it is drained and the machine terminated;
nothing tagged with the test's cluster is left. Also: a repeated launch message starts no
second machine; a machine launched by a provisioner that died before recording it is found by
its request id (no orphan), and a machine nobody asked for is reaped as an orphan.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
import yaml
from celery import Celery

from broker.bus import commands
from broker.bus.app import configure
from broker.client import Explanation
from broker.control.embedded import LocalCluster
from broker.model import Instance, InstanceState
from broker.model.state import JobState
from broker.store import open_store
from policies.burst.outlook import clock
from providers.local import LocalProvider
from providers.userdata import render
from tests.integration.harness import FAST_TIMINGS, running, wait_until, with_db

pytestmark = [pytest.mark.integration, pytest.mark.slow]

I = InstanceState  # noqa: E741
SITE = "local:home:home-a:ondemand"
OFFER = f"{SITE}/local-2xa100-80gb"


def _config(tmp: Path, cluster: str) -> Path:
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "cluster_name": cluster,
        "providers": {"local": {"gpus": "2xA100-80GB", "cpus": 4, "memory_gb": 8,
                                "price_per_hour": 3.0, "boot_delay_s": 0.5,
                                "state_dir": str(tmp / "cloud"), "boot_timeout_s": 60,
                                "idle_timeout_s": 2, "stop_timeout_s": 5}},
    }))
    return cfg


def _instance(c: object, rid: str) -> Instance:
    inst = c.store.instance(rid)  # type: ignore[attr-defined]
    assert inst is not None
    return inst


def _until(c: object, rid: str, state: InstanceState, what: str) -> Instance:
    """The instance record once it is in ``state`` (polled, with a deadline)."""
    wait_until(lambda: _instance(c, rid).state is state, 60, what)
    return _instance(c, rid)


def test_local_cloud_round_trip(redis_url: str, tmp_path: Path) -> None:
    url = with_db(redis_url, 11)
    cluster = "t" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, cluster)
    provider = LocalProvider("local", cluster, state_dir=str(tmp_path / "cloud"))
    counts = {"launched": 0, "orphans_found": 0, "orphans_reaped": 0, "jobs_lost": 0}
    try:
        with running(url, tmp_path) as c:
            c.env["SPILLWAY_CONFIG"] = str(cfg)
            c.start_scheduler()
            wait_until(lambda: c.store.offers(time.time()), 30, "the offers to be published")
            assert [o.id for o in c.store.offers(time.time())] == [OFFER]

            # a launch through the provisioner (the operator command), then the same message
            # again: one machine
            done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url,
                                   "launch", OFFER], env=c.env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            rid = done.stdout.split()[0]
            celery = configure(Celery("test-cloud"), url)
            commands.launch(celery, OFFER, 1, rid)
            ready = _until(c, rid, I.READY, "the machine's agent to register")
            counts["launched"] += 1
            node = next(n for n in c.store.nodes() if n.instance_id == ready.provider_id)
            assert node.site == SITE and node.id == ready.node_id
            assert ready.price_per_hour == 3.0
            commands.launch(celery, OFFER, 1, rid)  # a late repeat, once it runs: ignored

            # a job allowed on the cloud runs there, with the machine's GPUs
            job = c.client.submit(command='echo "CVD=$CUDA_VISIBLE_DEVICES"', gpus=2,
                                  sites=["cloud"], name="on-the-cloud")
            finished = c.client.wait(job.id, timeout=60)
            assert finished.state is JobState.SUCCEEDED, finished.history
            alloc = finished.allocations[0]
            assert alloc.node_id == node.id
            lines = [ln.text for ln in c.client.logs(job.id)]
            assert f"CVD={','.join(alloc.gpu_ids)}" in lines

            # idle past idle_timeout_s: drained, then terminated
            gone = _until(c, rid, I.TERMINATED, "the idle machine to be released")
            assert [h.state for h in gone.history] == [I.REQUESTED, I.BOOTING, I.READY,
                                                       I.DRAINING, I.TERMINATED]
            assert gone.history[0].reason == "requested by an operator"
            assert ready.ready_at is not None and gone.ended_at is not None
            timings = {"launch_to_ready_s": round(ready.ready_at - ready.requested_at, 2),
                       "job_end_to_released_s": round(gone.ended_at
                                                      - (finished.finished_at or 0.0), 2)}
            assert len([m for m in provider.instances().values()
                        if m.request_id == rid]) == 0
            assert len(list((tmp_path / "cloud" / cluster).glob("*.json"))) == 0

            # a provisioner that died between the provider's launch and the record: the
            # request id in the machine's tags finds it; it is adopted, not an orphan
            lost = "lost-" + uuid.uuid4().hex[:6]
            c.store.record_instances([Instance(lost, OFFER, requested_at=time.time())])
            offer = c.store.offers(time.time())[0]
            provider.launch(offer, 1, lost, render(offer, "local", url, lost, "",
                                                   f"{sys.executable} -m broker.cli"))
            counts["launched"] += 1
            adopted = _until(c, lost, I.READY, "the unrecorded machine to be found and to "
                             "register")
            assert adopted.history[0].reason.startswith("found by its request id")

            # a machine nobody asked for, tagged with this cluster: reaped
            stray = "stray-" + uuid.uuid4().hex[:6]
            provider.launch(offer, 1, stray, render(offer, "local", url, stray, "",
                                                    f"{sys.executable} -m broker.cli"))
            counts["launched"] += 1
            counts["orphans_found"] += 1
            wait_until(lambda: not any(m.request_id == stray
                                       for m in provider.instances().values()),
                       60, "the orphan to be reaped")
            counts["orphans_reaped"] += 1
            wait_until(lambda: _instance(c, lost).state is I.TERMINATED, 60,
                       "the adopted machine to be released when idle")
            counts["jobs_lost"] = sum(j.state is not JobState.SUCCEEDED
                                      for j in c.client.list())
            assert counts["jobs_lost"] == 0
            assert "orphan" in c.logs_of("scheduler")
    finally:
        left = [m for m in provider.instances().values() if m.state is not I.TERMINATED]
        provider.terminate(list(provider.instances()))
        print("cloud counts:", counts, "timings:", locals().get("timings"))
    assert left == [], f"machines left tagged with cluster {cluster}: {left}"


def test_up_with_the_local_cloud_leaves_no_machine(redis_url: str, tmp_path: Path) -> None:
    """``spillway up --cloud local``: the scheduler runs a local provider; a machine launched
    through it joins; stopping the cluster terminates it."""
    url = with_db(redis_url, 12)
    cfg = tmp_path / "base.yaml"
    cfg.write_text(yaml.safe_dump({"cluster_name": "t" + uuid.uuid4().hex[:8]}))
    cluster = LocalCluster(tmp_path / "up", redis_url=url, gpus="1xA100-80GB", cpus=4,
                           node_id="onprem-1", config_path=str(cfg), env=FAST_TIMINGS,
                           stop_timeout=20, cloud="local")
    store = open_store(url, None)
    raw = redis.Redis.from_url(url)
    raw.flushdb()
    try:
        cluster.start()
        local = cluster.local_cloud()
        assert local is not None and local.offer.id == OFFER
        env = cluster._env()
        done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url, "launch",
                               OFFER], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        rid = done.stdout.split()[0]
        wait_until(lambda: (i := store.instance(rid)) is not None and i.state is I.READY, 60,
                   "the local machine's agent to register")
        shown = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url,
                                "nodes"], env=env, capture_output=True, text=True, timeout=60)
        assert f"local-{rid}" in shown.stdout and "ondemand" in shown.stdout, shown.stdout
        assert "2.00" in shown.stdout  # its price
    finally:
        cluster.stop()
        left = cluster.local_cloud().instances() if cluster.config_path else {}
        raw.flushdb()
        raw.close()
    assert left == {}


def test_a_provisioner_killed_between_launch_and_record_leaves_no_orphan(
        redis_url: str, tmp_path: Path) -> None:
    """``spillway provisioner`` on its own (the scheduler with --no-provisioner), SIGKILLed
    after the machine started and before its record says so (the local provider's launch call
    returns api_delay_s after starting the machine, as a cloud API's does). The next
    provisioner finds the machine by the request id in its tags: it joins, runs nothing twice,
    is released when idle, and no machine is left."""
    url = with_db(redis_url, 13)
    cluster = "t" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, cluster)
    data = yaml.safe_load(cfg.read_text())
    data["providers"]["local"]["api_delay_s"] = 30
    cfg.write_text(yaml.safe_dump(data))
    provider = LocalProvider("local", cluster, state_dir=str(tmp_path / "cloud"))
    files = tmp_path / "cloud" / cluster
    try:
        with running(url, tmp_path) as c:
            c.env["SPILLWAY_CONFIG"] = str(cfg)
            c._spawn("scheduler", "scheduler", "--no-provisioner")
            fast = c.env["SPILLWAY_RECONCILE_S"]
            c.env["SPILLWAY_RECONCILE_S"] = "600"  # (its own lifecycle would find it first)
            first = c._spawn("provisioner-1", "provisioner")
            c.env["SPILLWAY_RECONCILE_S"] = fast
            done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url,
                                   "launch", OFFER], env=c.env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            rid = done.stdout.split()[0]
            record = files / f"local-{rid}.json"
            wait_until(lambda: record.exists() and yaml.safe_load(record.read_text())["pid"],
                       60, "the provider to start the machine")
            first.kill()  # inside the launch call: the record was never written
            first.wait(30)
            assert _instance(c, rid).state is I.REQUESTED
            c._spawn("provisioner-2", "provisioner")
            found = _until(c, rid, I.READY, "the next provisioner to find and adopt it")
            assert found.history[1].reason.startswith("found by its request id")
            assert len(list(files.glob("*.json"))) == 1  # one machine, never a second
            _until(c, rid, I.TERMINATED, "the idle machine to be released")
            assert "orphan" not in c.logs_of("provisioner-2")
    finally:
        left = [m for m in provider.instances().values() if m.state is not I.TERMINATED]
        provider.terminate(list(provider.instances()))
    assert left == []


def test_explain_says_when_and_where_a_waiting_job_bursts(redis_url: str, tmp_path: Path
                                                          ) -> None:
    """A ``high`` job on a full cluster (one on-prem GPU, held) is told when it bursts and to
    which offer, with the local machine's boot: seconds (its kind's seed), not 240 s. A
    cloud-only job is told its own story. A machine that boots teaches its offer's estimate,
    which the next waiting job's decision time uses."""
    url = with_db(redis_url, 13)
    cluster = "t" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, cluster)
    provider = LocalProvider("local", cluster, state_dir=str(tmp_path / "cloud"))
    margin = 300.0  # the burst policy's margin_s (policies/burst/sla.py)
    try:
        with running(url, tmp_path) as c:
            c.env["SPILLWAY_CONFIG"] = str(cfg)
            c.start_scheduler()
            c.start_agent("n1", gpus="1xA100-80GB", cpus=4)
            hold = c.client.submit(command="sleep 600", gpus=1, priority="low",
                                   sites=["onprem"], name="holds-n1")
            wait_until(lambda: c.client.get(hold.id).state is JobState.RUNNING, 30,
                       "the on-prem GPU to be taken")

            def told(job_id: str) -> Explanation:
                def outlook() -> Explanation | None:
                    e = c.client.explain(job_id)
                    return e if e.burst is not None else None

                out = wait_until(outlook, 30, f"{job_id}'s burst outlook")
                assert out is not None
                return out

            high = c.client.submit(command="sleep 600", gpus=1, priority="high")
            e = told(high.id)
            assert e.burst is not None and e.burst.offer_id == OFFER
            assert e.burst.boot_s == 5.0 and not e.burst.cloud_only  # the local seed
            assert e.burst.burst_at == pytest.approx(high.submitted_at + 1800 - 5 - margin)
            at = clock(e.burst.burst_at, e.burst.burst_at)
            assert f"bursts at {at} to local home-a ondemand local-2xa100-80gb ($3/h, ~5s to " \
                   "boot)" in e.message
            shown = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url,
                                    "explain", high.id], env=c.env, capture_output=True,
                                   text=True, timeout=60)
            assert "unless it starts on-prem first" in " ".join(shown.stdout.split()), \
                shown.stdout

            cloud = c.client.submit(command="sleep 600", gpus=1, priority="high",
                                    sites=["cloud"])
            e = told(cloud.id)
            assert e.reason_code == "CloudOnly" and e.burst is not None and e.burst.cloud_only
            assert "higher-ranked" not in e.message

            # a machine boots: its offer learns what it took; both jobs run there
            done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url,
                                   "launch", OFFER], env=c.env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            ready = _until(c, done.stdout.split()[0], I.READY, "the machine to register")
            took = (ready.ready_at or 0.0) - ready.requested_at
            assert c.store.boot_estimates()[OFFER].seconds == pytest.approx(took)
            for job in (high, cloud):
                wait_until(lambda j=job: c.client.get(j.id).state is JobState.RUNNING, 30,
                           f"{job.id} to run on the machine")

            late = c.client.submit(command="true", gpus=1, priority="high")
            e = told(late.id)
            assert e.burst is not None and e.burst.boot_s == pytest.approx(took)
            assert e.burst.burst_at == pytest.approx(late.submitted_at + 1800 - took - margin)
            for job in (hold, high, cloud, late):
                c.client.cancel(job.id)
            _until(c, ready.request_id, I.TERMINATED, "the idle machine to be released")
    finally:
        left = [m for m in provider.instances().values() if m.state is not I.TERMINATED]
        provider.terminate(list(provider.instances()))
    assert left == []
