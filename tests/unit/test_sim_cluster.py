"""Simulated cluster files: the examples, node groups, MIG, classes, teams and the errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.config.core import DEFAULT_CLASSES, PriorityClass, Team
from broker.errors import ConfigError
from broker.model import NodeState
from broker.sim.cluster import Cluster, cluster_from_data, load_cluster
from broker.sim.trace import load_trace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def test_seed_160() -> None:
    cluster = load_cluster(EXAMPLES / "seed-160.yaml")
    assert cluster.name == "seed-160"
    assert len(cluster.nodes) == 20
    assert cluster.capacity_gpus == 160
    assert cluster.max_gpus_per_node == 8
    assert cluster.classes == DEFAULT_CLASSES
    models = {n.id: {g.model for g in n.gpus} for n in cluster.nodes}
    assert models["v100-00"] == {"V100-32GB"} and models["v100-07"] == {"V100-32GB"}
    assert models["a100-07"] == {"A100-80GB"} and models["h100-03"] == {"H100-80GB"}
    assert "h100-04" not in models
    node = cluster.nodes[0]
    assert (node.site, node.state, node.hostname, node.cpus, node.memory_gb) == (
        "onprem", NodeState.READY, "v100-00", 64.0, 512.0)
    assert len({g.id for n in cluster.nodes for g in n.gpus}) == 160
    assert all(t.weight == 1 and t.quota_gpus == 0 for t in cluster.teams)
    assert cluster.settings == {}


def test_seed_160_teams_are_the_philly_virtual_clusters() -> None:
    cluster = load_cluster(EXAMPLES / "seed-160.yaml")
    trace = load_trace("philly")
    assert {t.name for t in cluster.teams} == {j.team for j in trace.jobs}


def test_small_mig() -> None:
    cluster = load_cluster(EXAMPLES / "small-mig.yaml")
    assert [n.id for n in cluster.nodes] == ["a100-00", "h100-00"]
    assert cluster.capacity_gpus == 8  # the MIG-split A100 counts once
    assert cluster.max_gpus_per_node == 4
    a100 = cluster.nodes[0]
    assert [g.mig_profile for g in a100.allocatable] == [None, None, None, "3g.40gb", "3g.40gb"]
    assert sum(g.mig_enabled for g in a100.gpus) == 1
    assert cluster.teams == (Team("vision", 1.0, 2), Team("language", 1.0, 2))
    assert cluster.team("vision") == Team("vision", 1.0, 2) and cluster.team("x") is None


def test_full_example_with_classes_settings_and_labels() -> None:
    cluster = cluster_from_data({
        "nodes": [{"prefix": "t4", "count": 3, "gpus": "2xT4,1xA10", "labels": {"rack": 7}}],
        "classes": [{"name": "gold", "rank": 2, "sla_s": "30m", "may_preempt": True},
                    {"name": "tin", "rank": 1}],
        "settings": {"fairshare_half_life_s": 86400},
    }, default_name="lab")
    assert isinstance(cluster, Cluster) and cluster.name == "lab"
    assert [n.id for n in cluster.nodes] == ["t4-00", "t4-01", "t4-02"]
    assert cluster.capacity_gpus == 9 and cluster.max_gpus_per_node == 3
    assert cluster.nodes[2].labels == {"rack": "7"}
    assert cluster.classes == (PriorityClass("gold", 2, 1800.0, may_preempt=True),
                               PriorityClass("tin", 1, 3600.0))
    assert cluster.settings["fairshare_half_life_s"] == 86400
    assert cluster.teams == ()


def base(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "x", "nodes": [{"prefix": "a", "count": 2,
                                                     "gpus": "4xA100-80GB"}]}
    data.update(changes)
    return data


def node(**changes: Any) -> dict[str, Any]:
    return base(nodes=[{"prefix": "a", "count": 1, "gpus": "4xA100-80GB", **changes}])


@pytest.mark.parametrize(("data", "pattern"), [
    ([1, 2], r"top level must be a mapping"),
    (base(racks=[]), r"unknown keys \['racks'\]; allowed: name, nodes, classes, teams"),
    (base(nodes=[]), r"nodes: is required, a non-empty list"),
    (base(name=""), r"name: '' must be a non-empty string"),
    (node(count=0), r"nodes\[0\]\.count: 0 is not allowed; use a whole number 1\.\.10000"),
    (node(count="8"), r"nodes\[0\]\.count: '8' is not allowed"),
    (node(count=True), r"nodes\[0\]\.count: True is not allowed"),
    (node(gpu="4xA100"), r"nodes\[0\]: unknown keys \['gpu'\]; allowed: prefix, count, gpus"),
    (node(prefix="a b"), r"nodes\[0\]\.prefix: 'a b' is not allowed"),
    (node(gpus="4xA100-81GB"), r"nodes\[0\]\.gpus: GPU model 'A100-81GB' is unknown"),
    (node(gpus="four A100s"), r"nodes\[0\]\.gpus: GPU inventory 'four A100s' is not COUNTxMODEL"),
    (node(gpus=[{"model": "T4", "mig": ["1g.5gb"]}]),
     r"nodes\[0\]\.gpus: gpus\[0\]\.mig: T4-16GB does not support MIG"),
    (node(gpus=[{"model": "A100-80GB", "mig": ["4g.40gb", "4g.40gb"]}]),
     r"use 8 compute slices; one GPU has 7"),
    (node(gpus=8), r"nodes\[0\]\.gpus: 8 is not allowed; write COUNTxMODEL"),
    (node(cpus=-1), r"nodes\[0\]\.cpus: -1 is not allowed; use a number of CPUs >= 0"),
    (node(memory_gb="lots"), r"nodes\[0\]\.memory_gb: 'lots' is not allowed"),
    (base(nodes=[{"prefix": "a", "gpus": "1xT4"}, {"prefix": "a", "count": 2, "gpus": "1xT4"}]),
     r"nodes\[1\]\.prefix: node id 'a-00' is already made by nodes\[0\]"),
    (base(classes=[{"name": "gold"}]), r"classes\[0\]\.rank: None must be a whole number"),
    (base(classes=[{"name": "gold", "rank": 1, "colour": "gold"}]),
     r"classes\[0\]: unknown keys \['colour'\]; allowed: name, rank, sla_s"),
    (base(classes=[{"name": "a", "rank": 1}, {"name": "a", "rank": 2}]),
     r"classes\[1\]\.name: 'a' repeats an earlier class"),
    (base(classes=[{"name": "a", "rank": 1, "sla_s": "soon"}]),
     r"classes\[0\]\.sla_s: 'soon' is not allowed; use seconds > 0"),
    (base(classes=[{"name": "a", "rank": 1, "preemptible": "no"}]),
     r"classes\[0\]\.preemptible: 'no' must be true or false"),
    (base(classes=[]), r"classes: must be a non-empty list"),
    (base(teams=[{"name": "t"}, {"name": "t"}]),
     r"teams\[1\]\.name: team 't' is listed twice"),
    (base(teams=[{"name": "t", "weight": 0}]), r"teams\[0\]\.weight: 0 is not allowed; use a "
                                                r"number > 0"),
    (base(teams=[{"name": "t", "quota_gpus": -1}]), r"teams\[0\]\.quota_gpus: -1 is not "
                                                    r"allowed"),
    (base(teams=[{"name": "t", "gpus": 3}]), r"teams\[0\]: unknown keys \['gpus'\]; allowed: "
                                             r"name, weight, quota_gpus"),
    (base(teams=[{"name": "t", "quota_gpus": 6}, {"name": "u", "quota_gpus": 3}]),
     r"teams: the quotas add up to 9 GPUs, more than the cluster's 8"),
    (base(settings=[1]), r"settings: must be a mapping"),
    (base(settings={"spillway": {"fairshare_teir": 0.9}}),
     r"settings\.spillway: 'fairshare_teir' is not a setting of 'spillway'; allowed: \["),
    (base(settings={"fair_share": {}}), r"settings: 'fair_share' is not a setting; allowed: "),
    (base(settings={"spillway": {"class_weight": {"gold": 2}}}),
     r"settings\.spillway\.class_weight: 'gold' is not a class; allowed: \['critical'"),
    (base(settings={"fairshare_half_life_s": 0}),
     r"settings\.fairshare_half_life_s: 0 is not allowed; allowed: a number > 0"),
])
def test_errors(tmp_path: Path, data: Any, pattern: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=pattern) as info:
        load_cluster(path)
    assert str(info.value).startswith(str(path))


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read cluster file"):
        load_cluster(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_cluster(bad)


def test_default_name_is_the_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "lab-7.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"prefix": "n", "gpus": "2xL4"}]}))
    cluster = load_cluster(path)
    assert cluster.name == "lab-7" and cluster.classes == DEFAULT_CLASSES
    assert cluster.nodes[0].id == "n-00" and cluster.capacity_gpus == 2
