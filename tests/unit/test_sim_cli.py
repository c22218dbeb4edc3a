"""``spillway simulate`` end to end on small inputs: the JSON it writes, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app

CLUSTER = """
name: tiny
nodes:
  - {prefix: a, count: 2, gpus: 4xA100-80GB}
teams:
  - {name: red, weight: 1}
  - {name: blue, weight: 1}
"""

TRACE = "submit_time,duration_s,num_gpus,team,priority,time_limit_s\n" + "".join(
    f"{i * 60},{600 + 300 * (i % 5)},{1 + (i % 3)},{'red' if i % 2 else 'blue'},"
    f"{'low' if i % 4 else 'normal'},7200\n" for i in range(40)
) + "100,300,8,red,critical,3600\n" + "200,300,64,blue,normal,3600\n"

REQUIRED = ("policy", "jobs", "utilization", "busy_utilization", "wait_mean_s", "wait_p50_s",
            "wait_p95_s", "wait_p99_s", "jct_mean_s", "bounded_slowdown_mean", "sla_attainment",
            "jain_fairness", "preemptions", "gpu_hours_lost_to_preemption", "per_team", "wall_s",
            "invariant_violations")


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    cluster, trace = tmp_path / "c.yaml", tmp_path / "t.csv"
    cluster.write_text(CLUSTER)
    trace.write_text(TRACE)
    return cluster, trace


def run(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["simulate", *argv])
    return result.exit_code, result.output


@pytest.mark.parametrize("policy", ["fcfs", "slurm-like", "spillway"])
def test_one_policy_writes_every_metric(files: tuple[Path, Path], tmp_path: Path,
                                        policy: str) -> None:
    cluster, trace = files
    out = tmp_path / "m.json"
    code, text = run("--trace", str(trace), "--cluster", str(cluster), "--policy", policy,
                     "--json", str(out))
    assert code == 0, text
    m = json.loads(out.read_text())
    assert all(k in m for k in REQUIRED)
    assert m["policy"] == policy and m["jobs"] == 42
    assert m["infeasible"] == 1  # the 64-GPU job can never fit 2 x 4 GPUs
    assert m["invariant_violations"] == 0 and m["unfinished"] == 0
    assert 0 < m["utilization"] <= 1


def test_several_policies_side_by_side(files: tuple[Path, Path], tmp_path: Path) -> None:
    cluster, trace = files
    out = tmp_path / "m.json"
    code, text = run("--trace", str(trace), "--cluster", str(cluster), "--policy",
                     "fcfs,spillway", "--json", str(out), "--load-scale", "2")
    assert code == 0, text
    runs = json.loads(out.read_text())["runs"]
    assert [r["policy"] for r in runs] == ["fcfs", "spillway"]
    assert runs[0]["meta"]["load_scale"] == 2
    assert "spillway" in text and "fcfs" in text  # the summary table


@pytest.mark.parametrize(("argv", "says"), [
    (["--policy", "nope"], "--policy nope: unknown"),
    (["--load-scale", "0"], "load scale"),
    (["--load-scale", "1", "--target-load", "1"], "give one, not both"),
    (["--from", "yesterday"], "--from"),
    (["--trace", "/no/such.csv"], "cannot read trace file"),
    (["--cluster", "/no/such.yaml"], "/no/such.yaml"),
], ids=["policy", "scale", "scale-and-target", "from", "trace", "cluster"])
def test_bad_input_is_one_clear_line(files: tuple[Path, Path], argv: list[str],
                                     says: str) -> None:
    cluster, trace = files
    base = {"--trace": str(trace), "--cluster": str(cluster)}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    code, text = run(*[x for kv in base.items() for x in kv])
    assert code == 1
    assert says in text and "Traceback" not in text
