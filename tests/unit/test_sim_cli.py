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


# ------------------------------------------------------------- progress, errors, shipped files

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("days", ["0", "-1"])
def test_busiest_days_not_positive_is_one_line(files: tuple[Path, Path], days: str) -> None:
    cluster, trace = files
    code, text = run("--trace", str(trace), "--cluster", str(cluster), "--busiest-days", days)
    assert code == 1
    assert f"--busiest-days {days}: must be a number of days > 0" in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_shipped_clusters_resolve_from_any_directory(
        files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, trace = files
    monkeypatch.chdir(tmp_path)  # no examples/ here
    for argv, name in (([], "seed-160"), (["--cluster", "small-mig"], "small-mig"),
                       (["--cluster", "examples/clusters/small-mig.yaml"], "small-mig")):
        code, text = run("--trace", str(trace), "--print-json", "--no-check", *argv)
        assert code == 0, text
        assert json.loads(text)["meta"]["cluster"] == name


def test_shipped_clusters_are_the_examples() -> None:
    from broker.sim.cluster import SHIPPED_DIR, shipped_clusters

    examples = sorted(p.name for p in (REPO / "examples" / "clusters").glob("*.yaml"))
    assert sorted(f"{n}.yaml" for n in shipped_clusters()) == examples
    for name in examples:
        assert (SHIPPED_DIR / name).read_bytes() == (REPO / "examples/clusters" / name).read_bytes()
    assert '"data/clusters/*.yaml"' in (REPO / "pyproject.toml").read_text()


def test_report_without_matplotlib_fails_before_simulating(
        files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import broker.sim.run

    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("simulated although the report cannot be written")

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr(broker.sim.run, "simulate", never)
    cluster, trace = files
    code, text = run("--trace", str(trace), "--cluster", str(cluster), "--report",
                     str(tmp_path / "rep"))
    assert code == 1
    assert "--report needs matplotlib" in text and "pip install -e '.[sim]'" in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_progress_is_reported_and_changes_nothing(files: tuple[Path, Path]) -> None:
    from broker.sim.engine import Progress, Simulation
    from broker.sim.run import SimRequest, prepare

    cluster_file, trace = files
    cluster, tr, _ = prepare(SimRequest(trace=str(trace), cluster=str(cluster_file)))
    seen: list[Progress] = []
    quiet = Simulation(cluster, tr, "spillway").run()
    told = Simulation(cluster, tr, "spillway", progress=seen.append, progress_every_s=0).run()
    assert seen and seen[-1].done and not any(p.done for p in seen[:-1])
    assert seen[-1].arrived == seen[-1].total == 41  # the 64-GPU job is never submitted
    assert [p.sim_s for p in seen] == sorted(p.sim_s for p in seen)
    assert seen[-1].origin == tr.origin
    rows = [(r.id, r.first_start_s, r.end_s, r.preemptions) for r in quiet.records]
    assert rows == [(r.id, r.first_start_s, r.end_s, r.preemptions) for r in told.records]
    assert quiet.samples == told.samples


def test_progress_comes_back_from_worker_processes(files: tuple[Path, Path]) -> None:
    from broker.sim.engine import Progress
    from broker.sim.run import SimRequest, simulate

    cluster, trace = files
    seen: list[Progress] = []
    results = simulate(SimRequest(trace=str(trace), cluster=str(cluster),
                                  policies=("fcfs", "spillway")), workers=2,
                       progress=seen.append)
    assert [r.policy for r in results] == ["fcfs", "spillway"]
    assert {p.policy for p in seen if p.done} == {"fcfs", "spillway"}


def test_progress_drawn_only_on_a_terminal(files: tuple[Path, Path],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    import broker.cli.sim as sim_cli

    cluster, trace = files
    code, text = run("--trace", str(trace), "--cluster", str(cluster), "--policy", "fcfs")
    assert code == 0 and "jobs 41/41" not in text  # not a terminal: nothing drawn

    screen = io.StringIO()
    monkeypatch.setattr(sim_cli, "err", Console(file=screen, force_terminal=True, width=80))
    code, text = run("--trace", str(trace), "--cluster", str(cluster), "--policy", "fcfs")
    assert code == 0, text
    drawn = screen.getvalue()
    assert "fcfs" in drawn and "jobs 41/41" in drawn and "done in" in drawn
    assert "sim 1970-01-01" in drawn  # the CSV's submit times start at epoch 0
    last = [ln for ln in drawn.splitlines() if "done in" in ln][-1]
    assert len(last.strip()) <= 80


def test_a_missing_spot_trace_is_a_warning_once_per_zone(files: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    """A cloud site whose spot availability trace is not found replays no interruptions;
    the run says so on stderr, once per zone (a run made from a checkout with no ../shared
    beside it otherwise looks like one with spot always there)."""
    cluster, trace = files
    cluster.write_text(CLUSTER + f"""
cloud:
  spot_traces: {tmp_path / "no-such-folder"}
  sites:
    - {{provider: aws, region: us-east-1, zones: [us-east-1c], instance_types: [p3.2xlarge],
       markets: [spot, ondemand], availability: {{us-east-1c: x/us-east-1c_v100_1.json}}}}
""")
    code, text = run("--trace", str(trace), "--cluster", str(cluster), "--policy", "spillway")
    assert code == 0, text
    warned = [line for line in text.splitlines() if line.startswith("warning: spot trace")]
    assert len(warned) == 1 and "aws:us-east-1c" in warned[0] and "no interruptions" in \
        warned[0], text
