"""AWS machines on the real system: moto's EC2 server (behind the fault proxy), the AWS provider,
and the test-side boot shim (tests/boot_shim.py) that runs each moto instance's user data as a
local process with its own IMDSv2 metadata service.

Round trip: a launch without capacity fails and cools its zone down; a launch through the
provisioner (its first RunInstances throttled, then retried) -> the moto instance boots -> its
agent registers with site aws:us-east-1:us-east-1a:spot and its instance id -> a job runs there
with the machine's GPU -> the node goes idle -> the machine is terminated in EC2 and shut
down; a machine tagged with the cluster that nobody asked for is reaped. A spot notice on such
a machine: the job checkpoints and resumes on an on-prem node, the record goes DRAINING, the
zone cools down, the machine is given back. After each test no machine tagged with its
cluster is left running in moto."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml
from celery import Celery

from broker.bus import commands
from broker.bus.app import configure
from broker.client import JobTimeout
from broker.model import Instance, Job, NodeState
from broker.model.cloud import InstanceState, Market, Offer
from broker.model.state import EvictionKind, JobState
from broker.store.instances import block_key
from providers.aws.provider import AwsProvider
from tests.boot_shim import BootShim, booting
from tests.fake_ec2 import AWS_TEST_ENV, FaultProxy, moto_ec2
from tests.integration.harness import Cluster, running, wait_until, with_db

pytestmark = pytest.mark.integration

I = InstanceState  # noqa: E741
AMI = "ami-12c6146b"
DB = 4  # this module's own database on the session's Redis
SITE = "aws:us-east-1:us-east-1a:spot"
OFFER = f"{SITE}/p2.xlarge"  # 1 x K80-12GB (a row of the shipped catalog)

# What a real machine's boot script does first (providers/userdata.py): an IMDSv2 token, then
# the instance id; here it then only records what it learnt and waits to be shut down.
PROBE = """#!/bin/sh
set -eu
META="${SPILLWAY_METADATA_URL:-http://169.254.169.254}"
TOKEN=$(curl -sf -X PUT "$META/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 60")
ID=$(curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" "$META/latest/meta-data/instance-id")
ZONE=$(curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" \\
  "$META/latest/meta-data/placement/availability-zone")
echo "$ID $ZONE" > booted
trap 'echo "shutdown $ID" > stopped; exit 0' TERM
while :; do sleep 0.1; done
"""


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FaultProxy]]:
    for k, v in AWS_TEST_ENV.items():
        monkeypatch.setenv(k, v)
    with moto_ec2() as served:
        yield served


def test_boot_shim_runs_user_data_with_imdsv2_and_shuts_down_on_terminate(
        ec2: tuple[str, FaultProxy], tmp_path: Path) -> None:
    moto_url, proxy = ec2
    cluster = f"t{uuid.uuid4().hex[:8]}"
    p = AwsProvider("aws", cluster, ["us-east-1"], endpoint_url=proxy.url, image=AMI)
    offer = Offer("aws", "us-east-1", "us-east-1c", "g5.xlarge", "A10G", 1, 24.0, Market.SPOT,
                  0.4)
    with booting(moto_url, cluster, tmp_path, grace_s=5) as shim:
        machines = p.launch(offer, 2, "req-boot", PROBE)
        again = p.launch(offer, 2, "req-boot", PROBE)  # a repeated launch: the same two
        assert {m.provider_id for m in again} == {m.provider_id for m in machines}
        ids = sorted(m.provider_id for m in machines)
        booted = [tmp_path / i / "booted" for i in ids]
        wait_until(lambda: all(b.exists() and b.read_text() for b in booted), 30,
                   "both machines to boot and read their metadata")
        assert [b.read_text() for b in booted] == [f"{i} us-east-1c\n" for i in ids]
        assert shim.booted == 2
        for i in ids:  # IMDSv2 only: every read carried the session token
            assert shim.machines[i].meta.refused == {}

        p.terminate(ids)
        wait_until(lambda: shim.running() == [], 30, "the machines to shut down")
        assert [(tmp_path / i / "stopped").read_text() for i in ids] == \
            [f"shutdown {i}\n" for i in ids]
        assert shim.shut_down == 2
    assert {m.state for m in p.instances().values()} == {InstanceState.TERMINATED}


# ---------------------------------------------------------------------------------------------
# Round trips through the provisioner


def _configure(c: Cluster, tmp: Path, cluster: str, endpoint: str, idle_timeout_s: float
               ) -> None:
    """The scheduler's configuration: provider aws on moto (through the fault proxy), with one
    offer written in the configuration (the catalog's p2.xlarge spot in us-east-1a) that
    carries the machine's inventory for its agent (moto's machines have no GPUs for NVML),
    and a boot script that runs this checkout's Spillway."""
    subnet = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint).create_subnet(
        VpcId=_vpc(endpoint), CidrBlock=f"10.9.{uuid.uuid4().int % 250}.0/24",
        AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({"cluster_name": cluster, "providers": {"aws": {
        "regions": ["us-east-1"], "endpoint_url": endpoint, "image": AMI,
        "subnets": {"us-east-1a": subnet}, "api_attempts": 1,
        "offers": [{"zone": "us-east-1a", "instance_type": "p2.xlarge",
                    "gpu_model": "K80-12GB", "gpu_count": 1, "market": "spot",
                    "price_per_hour": 0.3809, "gpus": "1xK80-12GB", "cpus": 4,
                    "memory_gb": 8},
                   {"zone": "us-east-1a", "instance_type": "p2.8xlarge",
                    "gpu_model": "K80-12GB", "gpu_count": 8, "market": "spot",
                    "price_per_hour": 2.16, "gpus": "8xK80-12GB", "cpus": 32}],
        "boot_timeout_s": 60, "idle_timeout_s": idle_timeout_s, "cooldown_s": 600,
        "install_command": "", "worker_command": f"{sys.executable} -m broker.cli"}}}))
    c.env.update({**AWS_TEST_ENV, "SPILLWAY_CONFIG": str(cfg),
                  "SPILLWAY_PROVISION_RETRY_S": "0.2", "SPILLWAY_SPOT_POLL_S": "0.2",
                  # a lease that outlives a few missed beats on a loaded machine: an expired
                  # one would (rightly) get the machine terminated mid-test
                  "SPILLWAY_LEASE_TTL_S": "5"})


def _vpc(endpoint: str) -> str:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    return str(ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"])


def _launch_by_hand(c: Cluster, offer: str = OFFER) -> str:
    """``spillway launch OFFER``: the request id."""
    done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", c.url, "launch",
                           offer], env=c.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def _record(c: Cluster, rid: str) -> Instance:
    inst = c.store.instance(rid)
    assert inst is not None
    return inst


def _wait_job(c: Cluster, job_id: str) -> Job:
    """The job once it ended; on a timeout, what explain and the nodes say."""
    try:
        return c.client.wait(job_id, timeout=60)
    except JobTimeout:
        print("explain:", c.client.explain(job_id))
        print("nodes:", [(n.id, n.site, n.state.value, n.instance_id)
                         for n in c.store.nodes()])
        print("instances:", [(i.request_id, i.state.value, i.provider_id)
                             for i in c.store.instances()])
        raise


def _left_in_moto(moto_url: str, cluster: str) -> list[str]:
    p = AwsProvider("aws", cluster, ["us-east-1"], endpoint_url=moto_url, image=AMI)
    return [f"{m.provider_id} {m.native_state}" for m in p.instances().values()
            if m.state is not I.TERMINATED]


@pytest.fixture
def aws_cluster(ec2: tuple[str, FaultProxy], redis_url: str, tmp_path: Path
                ) -> Iterator[tuple[Cluster, BootShim, FaultProxy, str]]:
    moto_url, proxy = ec2
    cluster = f"t{uuid.uuid4().hex[:8]}"
    with running(with_db(redis_url, DB), tmp_path) as c:
        shim = BootShim(moto_url, cluster, tmp_path / "machines", env=c.env, grace_s=10)
        try:
            yield c, shim, proxy, cluster
        finally:
            shim.stop()
            for m in shim.machines.values():
                print(f"----- machine {m.instance_id} -----\n{m.logs()[-3000:]}")
    left = _left_in_moto(moto_url, cluster)
    assert left == [], f"machines left tagged with cluster {cluster}: {left}"


@pytest.mark.slow
def test_aws_round_trip_through_the_provisioner(
        aws_cluster: tuple[Cluster, BootShim, FaultProxy, str], tmp_path: Path) -> None:
    c, shim, proxy, cluster = aws_cluster
    moto_url = proxy.upstream_url
    # idle_timeout_s: long enough that the job submitted once the machine is READY lands on
    # it before it is found idle, even on a loaded machine
    _configure(c, tmp_path, cluster, proxy.url, idle_timeout_s=10)
    c.start_scheduler()
    wait_until(lambda: OFFER in {o.id for o in c.store.offers(time.time())}, 30,
               "the AWS offers to be published")
    shim.env = c.env
    shim.start()

    # no capacity for the 8-GPU type: the record fails and its zone cools down (its offer
    # leaves the published ones), nothing is started
    big = f"{SITE}/p2.8xlarge"
    proxy.inject("RunInstances", "InsufficientInstanceCapacity")
    failed = _launch_by_hand(c, big)
    rec = wait_until(lambda: (i := _record(c, failed)).state is I.FAILED and i, 60,
                     "the launch without capacity to fail")
    assert "no capacity" in rec.history[-1].reason and big in rec.history[-1].reason
    assert block_key("aws", "us-east-1", "us-east-1a", "p2.8xlarge") in \
        c.store.blocks(time.time())
    assert {o.id for o in c.store.offers(time.time())} == {OFFER}

    # the first RunInstances is throttled: the provisioner retries it after a backoff
    proxy.inject("RunInstances", "RequestLimitExceeded")
    runs_before = proxy.seen["RunInstances"]
    rid = _launch_by_hand(c)
    ready = wait_until(lambda: (i := _record(c, rid)).state is I.READY and i, 60,
                       "the machine to boot and its agent to register")
    assert proxy.served == {"InsufficientInstanceCapacity": 1, "RequestLimitExceeded": 1}
    assert proxy.seen["RunInstances"] - runs_before == 2  # the throttled try, the retry
    assert "RequestLimitExceeded" in c.logs_of("scheduler")
    node = next(n for n in c.store.nodes() if n.instance_id == ready.provider_id)
    assert node.site == SITE and node.id == ready.provider_id
    assert ready.provider_id.startswith("i-") and shim.booted == 1

    # a repeated launch message starts no second machine
    commands.launch(configure(Celery("test-aws"), c.url), OFFER, 1, rid)

    # a job allowed on the cloud runs there, on the machine's GPU (a spot machine takes jobs
    # whose sites include spot: broker.model.fit.site_allows)
    job = c.client.submit(command='echo "CVD=$CUDA_VISIBLE_DEVICES on $SPILLWAY_NODE_ID"',
                          gpus=1, sites=["cloud", "spot"], name="on-aws")
    finished = _wait_job(c, job.id)
    assert finished.state is JobState.SUCCEEDED, finished.history
    alloc = finished.allocations[0]
    assert alloc.node_id == node.id
    assert f"CVD={','.join(alloc.gpu_ids)} on {node.id}" in \
        [ln.text for ln in c.client.logs(job.id)]

    # idle past idle_timeout_s: drained, terminated in EC2, the machine shut down
    gone = wait_until(lambda: (i := _record(c, rid)).state is I.TERMINATED and i, 60,
                      "the idle machine to be released")
    assert [h.state for h in gone.history] == [I.REQUESTED, I.BOOTING, I.READY, I.DRAINING,
                                              I.TERMINATED]
    assert proxy.seen["RunInstances"] - runs_before == 2  # (the repeat launched nothing)

    # a machine tagged with this cluster that the store never asked for: reaped as an orphan
    direct = AwsProvider("aws", cluster, ["us-east-1"], endpoint_url=moto_url, image=AMI)
    offer = next(o for o in c.store.offers(time.time()) if o.id == OFFER)
    [stray] = direct.launch(offer, 1, "stray-1", "#!/bin/sh\nexec sleep 600\n")
    wait_until(lambda: direct.instances()[stray.provider_id].state is I.TERMINATED, 60,
               "the orphan to be terminated")
    wait_until(lambda: f"terminated aws {stray.provider_id}: orphan: its request id is "
               "unknown" in c.logs_of("scheduler"), 10, "the reaping to be logged")
    wait_until(lambda: shim.running() == [], 30, "the machines' processes to shut down")
    # (the orphan may be reaped before the shim saw it boot: then it never ran)
    assert shim.booted == shim.shut_down and shim.booted in (1, 2)
    print("aws round trip:", {"launched": 2, "orphans_reaped": 1,
                              "faults": dict(proxy.served)})


CHECKPOINTING = """
if [ "$SPILLWAY_RESUME" = 1 ]; then
    echo "resumed on $SPILLWAY_NODE_ID from $(cat "$SPILLWAY_CHECKPOINT_DIR/state")"
    exit 0
fi
trap 'echo "step=3 on $SPILLWAY_NODE_ID" > "$SPILLWAY_CHECKPOINT_DIR/state"; exit 0' TERM
echo "started on $SPILLWAY_NODE_ID"
touch "{flag}"
while :; do sleep 0.1; done
"""


@pytest.mark.slow
def test_aws_spot_notice_moves_the_job_and_releases_the_machine(
        aws_cluster: tuple[Cluster, BootShim, FaultProxy, str], tmp_path: Path) -> None:
    c, shim, proxy, cluster = aws_cluster
    _configure(c, tmp_path, cluster, proxy.url, idle_timeout_s=300)
    c.start_scheduler()
    wait_until(lambda: OFFER in {o.id for o in c.store.offers(time.time())}, 30,
               "the AWS offers to be published")
    shim.env = c.env
    shim.start()
    rid = _launch_by_hand(c)
    ready = wait_until(lambda: (i := _record(c, rid)).state is I.READY and i, 60,
                       "the machine's agent to register")
    ckpt, flag = tmp_path / "ckpt", tmp_path / "running"
    ckpt.mkdir()
    job = c.client.submit(command=CHECKPOINTING.format(flag=flag), gpus=1, name="spot-aws",
                          checkpoint_dir=str(ckpt), time_limit="5m")
    wait_until(flag.exists, 30, "the job to run on the AWS machine")
    c.start_agent("n2", "1xK80-12GB", cpus=8)  # on-prem, where the job goes next

    shim.machines[ready.provider_id].meta.interrupt("terminate", in_s=120)
    done = _wait_job(c, job.id)
    assert done.state is JobState.SUCCEEDED, done.history
    assert [a.allocations[0].node_id for a in done.attempts] == [ready.provider_id, "n2"]
    stops = [(h.attempt, h.kind) for h in done.history if h.state is JobState.STOPPING]
    assert stops == [(1, EvictionKind.SPOT)], done.history
    assert [ln.text for ln in c.client.logs(job.id, attempt=2)] == \
        [f"resumed on n2 from step=3 on {ready.provider_id}"]

    # the record went DRAINING on the notice, the zone cools down, and once the job left the
    # reconciler gave the machine back
    gone = wait_until(lambda: (i := _record(c, rid)).state is I.TERMINATED and i, 60,
                      "the drained machine to be released")
    assert [h.state for h in gone.history] == [I.REQUESTED, I.BOOTING, I.READY, I.DRAINING,
                                              I.TERMINATED]
    assert "aws spot interruption notice" in gone.history[3].reason
    blocks = c.store.blocks(time.time())
    assert block_key("aws", "us-east-1", "us-east-1a", "p2.xlarge") in blocks
    spot = next(n for n in c.store.nodes() if n.id == ready.provider_id)
    assert spot.state in (NodeState.DRAINING, NodeState.DOWN)
    wait_until(lambda: shim.running() == [], 30, "the machine's processes to shut down")
    print("aws spot notice:", {"launched": shim.booted, "shut_down": shim.shut_down})


