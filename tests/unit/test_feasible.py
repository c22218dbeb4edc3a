"""Submit refuses a job no registered node (up or down) could ever hold, naming the field and
what the cluster has; ``hold_if_infeasible`` (option or setting) queues it anyway."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.client import Client
from broker.config.core import Config
from broker.cycle.feasible import problems
from broker.errors import SpecError
from broker.model import Gpu, JobSpec, Node, NodeState, Resources
from policies.reasons import infeasible
from tests.conftest import flushed_db

DB = 3  # this module's own database on the session's Redis


def node(node_id: str, count: int = 8, model: str = "H100-80GB", cpus: float = 64,
         site: str = "onprem", state: NodeState = NodeState.READY) -> Node:
    gpus = tuple(Gpu(f"GPU-{node_id}-{i}", i, model, 80.0) for i in range(count))
    return Node(node_id, gpus, site=site, hostname=node_id, cpus=cpus, memory_gb=512,
                state=state, incarnation="i1")


def spec(**fields: object) -> JobSpec:
    return JobSpec.parse({"command": "true", **fields}, Config())


ONE = [node("n1")]


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"gpus": 64}, "gpus", "the most a registered node has of H100-80GB is 8"),
    ({"gpu_types": ["A100"]}, "gpu_types", "no registered node has A100 GPUs"),
    ({"nodes": 2, "gpus": 8}, "nodes", "asks 2 nodes; 1 registered node(s) could hold a part"),
    ({"min_gpu_memory_gb": 141}, "min_gpu_memory_gb", "the largest a registered node has is 80"),
    ({"mig_profile": "1g.10gb"}, "mig_profile", "no registered node has MIG 1g.10gb"),
    ({"cpus": 128}, "cpus", "the most a registered node has is 64"),
    ({"sites": "cloud"}, "sites", "the cluster's nodes are at onprem"),
])
def test_each_impossible_field_is_named_with_what_the_cluster_has(
        fields: dict[str, object], field: str, words: str) -> None:
    found = problems(spec(**fields), ONE)
    assert [p.field for p in found] == [field]
    assert words in found[0].problem
    assert "1 node: 1 x 8 H100-80GB (64 CPUs, 512 GB)" in found[0].problem


def test_a_job_some_node_could_hold_passes_even_when_that_node_is_down() -> None:
    down = [node("n1", count=4), node("n2", state=NodeState.DOWN)]
    assert problems(spec(gpus=8, gpu_types=["H100"]), down) == []
    assert problems(spec(gpus=4, nodes=2), down) == []  # 4 of one model on each of two nodes
    assert [p.field for p in problems(spec(gpus=8, nodes=2), down)] == ["nodes"]
    assert problems(spec(gpus=0), [node("n1", state=NodeState.DOWN)]) == []


def test_an_empty_cluster_refuses_and_names_the_option() -> None:
    found = problems(spec(gpus=0), [])
    assert [p.field for p in found] == ["nodes"]
    assert "no node is registered" in found[0].problem
    assert "--hold-if-infeasible" in found[0].problem


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


def test_client_raises_spec_error_and_stores_nothing(url: str) -> None:
    c = Client(url, Config())
    try:
        c.store.heartbeat(ONE[0], ttl=60, now=time.time())
        with pytest.raises(SpecError) as e:
            c.submit(command="true", gpus=64)
        assert "gpus: asks 64 GPUs per node" in str(e.value)
        with pytest.raises(SpecError) as e:
            c.submit_many([{"command": "true"}, {"command": "true", "gpu_types": ["A100"]}])
        assert [p.field for p in e.value.errors] == ["[1].gpu_types"]
        assert c.list() == []
        held = c.submit(command="true", gpus=64, hold_if_infeasible=True)
        assert c.submit(command="true", gpus=8).state.value == "PENDING"
    finally:
        c.close()
    c = Client(url, Config(hold_if_infeasible=True))  # the setting keeps today's behaviour
    try:
        assert c.submit(command="true", gpus=64).id != held.id
    finally:
        c.close()


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_cli_exits_2_and_the_option_holds(url: str, monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_CONFIG", "SPILLWAY_HOLD_IF_INFEASIBLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, out, err = cli("--redis-url", url, "submit", "--gpus", "2", "--", "true")
    assert code == 2, out + err
    assert "no node is registered" in err and "--hold-if-infeasible" in err
    Client(url, Config()).store.heartbeat(ONE[0], ttl=60, now=time.time())
    code, out, err = cli("--redis-url", url, "submit", "--gpus", "64", "--", "true")
    assert code == 2, out + err
    assert "gpus: asks 64 GPUs per node" in " ".join(err.split())
    assert "Traceback" not in out + err
    code, out, err = cli("--redis-url", url, "submit", "--gpus", "64", "--hold-if-infeasible",
                         "--json", "--", "true")
    assert code == 0, out + err
    assert json.loads(out)["spec"]["gpus"] == 64
    monkeypatch.setenv("SPILLWAY_HOLD_IF_INFEASIBLE", "true")
    assert cli("--redis-url", url, "submit", "--gpus", "64", "--", "true")[0] == 0


def test_the_no_feasible_node_reason_is_in_plain_words() -> None:
    reason = infeasible(Resources(gpus=64, gpu_types=("H100",)))
    assert reason.code == "NoFeasibleNode"
    assert "free-able" not in reason.message
    assert reason.message.startswith("no node that is up has 64 GPU(s) of H100, even counting "
                                     "GPUs in use")
