"""No ghosts, with real processes: a dead node stops counting at submit after
``node_forget_after_s``, and ``spillway nodes --forget NODE`` removes one, refusing an unknown
node, a live one, and one that still holds jobs unless --force (which requeues them)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.model.state import JobState
from tests.integration.harness import Cluster, running, wait_until, with_db

pytestmark = pytest.mark.integration

DB = 7  # this module's own database on the session's Redis


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with running(with_db(redis_url, DB), tmp_path) as c:
        yield c


def spillway(c: Cluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it in another shell: a process of its own."""
    home = c.workdir / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "broker.cli", *args],
                          env={**c.env, "HOME": str(home), "COLUMNS": "200", **env},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return " ".join(p.stderr.split())


def test_nodes_forget_refuses_what_it_must_and_removes_a_ghost(cluster: Cluster) -> None:
    c = cluster
    tag = uuid.uuid4().hex[:6]  # (killed with SIGKILL: a node id no other test uses)
    a, b = f"ghost-{tag}", f"alive-{tag}"
    c.start_scheduler()
    c.start_agent(a, "4xA100-80GB")
    c.start_agent(b, "4xA100-80GB")

    p = spillway(c, "nodes", "--forget", "nope")
    assert p.returncode == 2, p.stderr
    assert f"node: 'nope' is not a registered node (allowed: {b}, {a})" in one_line_error(p) \
        or f"node: 'nope' is not a registered node (allowed: {a}, {b})" in one_line_error(p)

    p = spillway(c, "nodes", "--forget", a)
    assert p.returncode == 1, p.stderr
    assert f"error: node {a} is alive: its agent's lease runs" in one_line_error(p)
    assert "stop the agent first" in one_line_error(p)

    # a 2-node job fits while both are alive; fill both nodes with jobs that run a while
    jobs = [json.loads(spillway(c, "submit", "--gpus", "4", "--json", "--", "sleep",
                                "600").stdout)["id"] for _ in range(2)]
    wait_until(lambda: all(c.client.get(j).state is JobState.RUNNING for j in jobs), 30,
               "both jobs to run")
    on_a = next(j for j in jobs if a in c.client.get(j).node_ids)

    # no scheduler (nothing requeues), and node a's agent dies
    c.kill("scheduler")
    c.kill(a)
    wait_until(lambda: all(n.lease_expires < time.time() for n in c.store.nodes()
                           if n.id == a), 30, f"{a}'s lease to run out")

    p = spillway(c, "nodes")
    assert p.returncode == 0, p.stderr
    assert f"1 node(s) dead ({a})" in " ".join(p.stderr.split())
    assert "`spillway nodes --forget NODE` removes one now" in " ".join(p.stderr.split())

    # dead a moment: it still counts at submit (it may come back)...
    gang = ("submit", "--gpus", "4", "--nodes", "2", "--hold-if-infeasible", "--json", "--",
            "true")
    probe = ("submit", "--gpus", "4", "--nodes", "2", "--", "true")
    # ... until node_forget_after_s has passed: then the gang is refused, the ghost named
    p = wait_until(lambda: (lambda r: r if r.returncode == 2 else None)(
        spillway(c, *probe, SPILLWAY_NODE_FORGET_AFTER_S="0.5")), 30,
        "submit to stop counting the dead node")
    text = one_line_error(p)
    assert "nodes: asks 2 nodes; 1 registered node(s) could hold a part" in text, text
    assert f"not counted: 1 node(s) dead for more than 0.5s (node_forget_after_s): {a}" in text
    held = json.loads(spillway(c, *gang).stdout)["id"]  # (the default: a day; accepted)
    assert c.client.get(held).state is JobState.PENDING
    c.client.cancel(held)

    p = spillway(c, "nodes", "--forget", a)
    assert p.returncode == 1, p.stderr
    assert f"error: node {a} still holds 1 job(s): {on_a}" in one_line_error(p)
    assert "--force requeues them now" in one_line_error(p)

    p = spillway(c, "nodes", "--forget", a, "--force")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"{a} FORGOTTEN (requeued: {on_a})"
    job = c.client.get(on_a)
    assert job.state is JobState.PENDING and job.attempt == 2

    listed = json.loads(spillway(c, "nodes", "--json").stdout)
    assert [n["id"] for n in listed] == [b]
    p = spillway(c, *probe)  # gone: the default expiry no longer matters
    assert p.returncode == 2
    assert "nodes: asks 2 nodes; 1 registered node(s) could hold a part" in one_line_error(p)
    assert "not counted" not in one_line_error(p)
    assert spillway(c, "nodes", "--forget", a).returncode == 2  # (now unknown)
