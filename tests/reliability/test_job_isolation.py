"""Job cgroups with real agents (workers/isolation.py, workers/keeper.py).

(a) An agent killed with SIGKILL while its job has a background process: every process of the
    job is gone within two heartbeats (the keeper kills the node's job cgroups when the pipe
    from the agent reaches EOF), and the job is requeued and finishes on another node.
(b) A job that allocates past its ``memory_gb`` is OOM-killed in its own cgroup; its history
    says ``OutOfMemory (memory_gb 0.1)`` and a neighbour job on the same node succeeds.

Skipped only where this host can make no cgroup (v2 with memory/pids/cpu, or v1).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.model import JobSpec
from broker.model.state import TERMINAL, JobState
from tests.integration.harness import FAST_TIMINGS, Cluster, running, wait_until, with_db
from workers import keeper
from workers.detection import detect

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_S = float(FAST_TIMINGS["SPILLWAY_HEARTBEAT_S"])


def cgroups_possible(tmp: Path) -> str:
    """The cgroup kind an agent would get here, or '' (the probe's directories are removed)."""
    iso = detect(f"probe-{uuid.uuid4().hex[:8]}", str(tmp / "probe"), warn=False)
    for d in iso.node_dirs:
        keeper.remove(d, wait_s=0)
    return "" if iso.kind == "none" else iso.kind


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    if not cgroups_possible(tmp_path):
        pytest.skip("no cgroup can be made on this host (neither v2 with memory/pids/cpu "
                    "delegated nor writable v1 memory/cpu/pids/freezer)")
    with running(with_db(redis_url, 10), tmp_path) as c:
        yield c


def job_pids(job_id: str) -> list[int]:
    """Live processes whose environment has ``SPILLWAY_JOB_ID=<job_id>``."""
    needle = f"SPILLWAY_JOB_ID={job_id}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if needle in env and stat[stat.rfind(b")") + 2:].split()[0] != b"Z":
            out.append(int(name))
    return out


def test_agent_killed_its_jobs_background_processes_die_within_two_heartbeats(
        cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("iso-a", "1xA100-80GB")
    job = cluster.client.submit(JobSpec(
        command='if [ "$SPILLWAY_NODE_ID" = iso-a ]; then sleep 300 & sleep 300; '
                'else echo done elsewhere; fi', gpus=1, name="bg"))
    wait_until(lambda: cluster.client.get(job.id).state is JobState.RUNNING, 30, "it to run")
    # the shell, its background sleep and its foreground sleep
    pids = wait_until(lambda: p if len(p := job_pids(job.id)) >= 3 else None, 10,
                      "the job's three processes")
    t0 = time.monotonic()
    cluster.kill("iso-a", signal.SIGKILL)
    wait_until(lambda: not job_pids(job.id), 2 * HEARTBEAT_S, "every process of the job to die")
    took = time.monotonic() - t0
    print(f"all {len(pids)} job processes gone {took * 1000:.0f} ms after the agent's SIGKILL")
    wait_until(lambda: "keeper: agent gone; killed 1 job" in cluster.logs_of("iso-a"), 10,
               "the keeper to log what it killed")
    cluster.start_agent("iso-b", "1xA100-80GB")
    done = wait_until(lambda: (j := cluster.client.get(job.id)).state is JobState.SUCCEEDED
                      and j, 60, "the job to finish on iso-b")
    assert [(a.number, a.outcome) for a in done.attempts] == [(1, "LOST"), (2, "SUCCEEDED")]
    assert done.attempts[1].allocations[0].node_id == "iso-b"


def test_out_of_memory_is_reported_and_the_neighbour_is_untouched(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("iso-m", "2xA100-80GB")
    hog = cluster.client.submit(JobSpec(
        command='python3 -c "b = bytearray(400*2**20); import time; time.sleep(5)"',
        gpus=1, memory_gb=0.1, name="hog"))
    neighbour = cluster.client.submit(JobSpec(
        command='python3 -c "b = bytearray(50*2**20); import time; time.sleep(3)"',
        gpus=1, memory_gb=1, name="neighbour"))
    failed = wait_until(lambda: (j := cluster.client.get(hog.id)).state is JobState.FAILED
                        and j, 60, "the hog to fail")
    why = [h.reason for h in failed.history]
    assert any("OutOfMemory (memory_gb 0.1)" in r for r in why), why
    ok = wait_until(lambda: (j := cluster.client.get(neighbour.id)).state in TERMINAL and j, 60,
                    "the neighbour to end")
    assert ok.state is JobState.SUCCEEDED, [h.reason for h in ok.history]
    assert {a.allocations[0].node_id for j in (ok, failed) for a in j.attempts} == {"iso-m"}
