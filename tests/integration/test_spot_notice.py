"""A spot interruption notice on the real system: a scheduler and two worker agents as
processes on a real Redis, one of them on an AWS spot site whose metadata service
(tests/fake_metadata.py) starts announcing the interruption mid-job. The job checkpoints on
SIGTERM, goes back to the queue with its eviction recorded as spot, and finishes on the other
node from its checkpoint (SPILLWAY_RESUME=1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.model import NodeState
from broker.model.state import EvictionKind, JobState
from tests.fake_metadata import MetadataServer
from tests.integration.harness import Cluster, running, wait_until, with_db

pytestmark = pytest.mark.integration

DB = 4  # this module's own database on the session's Redis
SPOT_SITE = "aws:us-east-1:us-east-1a:spot"


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with running(with_db(redis_url, DB), tmp_path) as c:
        c.env["SPILLWAY_LEASE_TTL_S"] = "5"  # no node taken for dead on a loaded machine
        yield c


@pytest.fixture
def meta() -> Iterator[MetadataServer]:
    server = MetadataServer(instance_id="i-0spot00000000001").start()
    yield server
    server.stop()


def start_spot_agent(cluster: Cluster, node_id: str, metadata_url: str) -> None:
    """An agent on a spot site, its metadata service at ``metadata_url``."""
    saved = cluster.env
    cluster.env = {**saved, "SPILLWAY_METADATA_URL": metadata_url,
                   "SPILLWAY_SPOT_POLL_S": "0.2"}
    try:
        cluster._spawn(node_id, "worker", "--node-id", node_id, "--gpus", "1xA100-80GB",
                       "--cpus", "8", "--site", SPOT_SITE, "--work-dir",
                       str(cluster.workdir / node_id))
    finally:
        cluster.env = saved
    wait_until(lambda: any(n.id == node_id and n.state is NodeState.READY
                           for n in cluster.store.nodes()), 30, f"agent {node_id} to register")


CHECKPOINTING = """
if [ "$SPILLWAY_RESUME" = 1 ]; then
    state=$(cat "$SPILLWAY_CHECKPOINT_DIR/state")
    echo "resumed attempt=$SPILLWAY_ATTEMPT on $SPILLWAY_NODE_ID state=$state"
    echo "attempt=$SPILLWAY_ATTEMPT resume=$SPILLWAY_RESUME state=$state" > "{record}"
    exit 0
fi
trap 'echo "step=7 node=$SPILLWAY_NODE_ID" > "$SPILLWAY_CHECKPOINT_DIR/state"; \\
echo checkpointed; exit 0' TERM
echo "first attempt=$SPILLWAY_ATTEMPT on $SPILLWAY_NODE_ID"
touch "{running}"
while :; do sleep 0.1; done
"""


def test_spot_notice_checkpoints_requeues_and_resumes_on_another_node(
        cluster: Cluster, meta: MetadataServer, tmp_path: Path) -> None:
    cluster.start_scheduler()
    start_spot_agent(cluster, "spot1", meta.url)
    ckpt, running_flag, record = tmp_path / "ckpt", tmp_path / "running", tmp_path / "record"
    ckpt.mkdir()
    job = cluster.client.submit(command=CHECKPOINTING.format(record=record,
                                                             running=running_flag),
                                gpus=1, name="spot-ckpt", checkpoint_dir=str(ckpt),
                                time_limit="5m")
    wait_until(running_flag.exists, 30, "the job to run on the spot node")
    assert cluster.client.get(job.id).node_ids == ("spot1",)
    path = "/latest/meta-data/spot/instance-action"
    wait_until(lambda: meta.hits[path] >= 2, 10, "the agent to poll for notices")
    cluster.start_agent("n2", "1xA100-80GB", cpus=8)  # on-prem, where the job will resume

    meta.interrupt("terminate", in_s=120)
    done = cluster.client.wait(job.id, timeout=60)
    assert done.state is JobState.SUCCEEDED, done.history

    # attempt 1 on the spot node, stopped by the notice (kind spot), attempt 2 on n2
    stops = [h for h in done.history if h.state is JobState.STOPPING]
    assert [(h.attempt, h.kind) for h in stops] == [(1, EvictionKind.SPOT)], done.history
    assert "aws spot interruption notice (terminate" in stops[0].reason
    states = [(h.state, h.attempt) for h in done.history]
    i = states.index((JobState.STOPPING, 1))
    assert states[i:i + 3] == [(JobState.STOPPING, 1), (JobState.PREEMPTED, 1),
                               (JobState.PENDING, 2)]
    assert [a.allocations[0].node_id for a in done.attempts] == ["spot1", "n2"]
    assert record.read_text() == "attempt=2 resume=1 state=step=7 node=spot1\n"
    first = [ln.text for ln in cluster.client.logs(job.id, attempt=1)]
    assert first[0] == "first attempt=1 on spot1" and first[-1] == "checkpointed", first

    # the spot node stays drained: nothing new lands on it; one notice, one drain
    spot = next(n for n in cluster.store.nodes() if n.id == "spot1")
    assert spot.state is NodeState.DRAINING
    log = cluster.logs_of("spot1")
    assert log.count("aws spot interruption notice (") == 1, log[-3000:]
    assert "Traceback" not in log
