"""Narrow terminals and piped output: tables fit COLUMNS (the free-text columns wrap or are
shortened, the id never), and output that is not a terminal is never cut."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.cycle.plan import Plan
from broker.model import Reason
from broker.sim.metrics import summary_table
from broker.store import RedisStore
from tests.conftest import flushed_db

DB = 1  # this module's own database on the session's Redis

REASON = Reason("Resources", "waiting for 4 GPU(s) of A100-80GB; 2 free on the best node")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_CONFIG", "COLUMNS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SPILLWAY_HOLD_IF_INFEASIBLE", "true")  # no nodes here


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


def cli(url: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(app, ["--redis-url", url, *args], env=env,
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _queued(url: str) -> list[str]:
    ids = [cli(url, "submit", "--gpus", "4", "--name", "resnet50-imagenet-sweep-lr3e-4",
               "--team", "vision-research", "--", "python", "train.py").strip()
           for _ in range(2)]
    store = RedisStore(url)
    try:
        store.apply(Plan(pending=dict.fromkeys(ids, REASON), order=tuple(ids)), time.time())
    finally:
        store.close()
    return ids


def test_queue_at_80_columns_keeps_ids_and_readable_reasons(url: str) -> None:
    ids = _queued(url)
    out = cli(url, "queue", env={"COLUMNS": "80"})
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), out
    for job_id in ids:
        assert job_id in out, out  # whole, never cut
    words = " ".join(out.split())
    assert "Resources:" in words and "waiting for 4 GPU(s)" in words, out  # wrapped, not cut


def test_piped_queue_is_never_cut(url: str) -> None:
    ids = _queued(url)
    out = cli(url, "queue")  # no COLUMNS and not a terminal: a pipe
    rows = [line for line in out.splitlines() if ids[0] in line]
    assert len(rows) == 1, out
    assert "resnet50-imagenet-sweep-lr3e-4" in rows[0] and "vision-research" in rows[0]
    assert f"{REASON.code}: {REASON.message}" in rows[0], out  # one line a job, whole


METRICS = [{"policy": p, "utilization": 0.81, "busy_utilization": 0.93, "wait_mean_s": 5400.0,
            "wait_p50_s": 60.0, "wait_p95_s": 36000.0, "wait_p99_s": 90000.0,
            "bounded_slowdown_mean": 123.45, "jain_fairness": 0.912, "sla_attainment": 0.7,
            "preemptions": 12345, "invariant_violations": 0, "wall_s": 83.2}
           for p in ("fcfs", "slurm-like", "spillway")]


def test_summary_table_fits_the_width_without_breaking_a_row() -> None:
    text = summary_table(METRICS, width=80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    for policy in ("fcfs", "slurm-like", "spillway"):  # each block has every policy's row
        rows = [line for line in lines if line.startswith(policy + " ")]
        assert len(rows) >= 2, text
    for head in ("util", "busy util", "wait mean", "p99", "Jain", "SLA", "preempt", "wall"):
        assert head in text, text
    wide = summary_table(METRICS)  # no width: one row a policy, however long
    assert len([line for line in wide.splitlines() if line.startswith("fcfs")]) == 1
    assert summary_table(METRICS, width=400) == wide


CLUSTER = "name: tiny\nnodes:\n  - {prefix: a, count: 2, gpus: 4xA100-80GB}\n"
TRACE = "submit_time,duration_s,num_gpus,team,priority,time_limit_s\n" + "".join(
    f"{i * 60},{600 + 300 * (i % 5)},{1 + (i % 3)},red,normal,7200\n" for i in range(12))


@pytest.mark.parametrize("columns", ["80", None])
def test_simulate_summary_rows_are_whole(tmp_path: Path, columns: str | None) -> None:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "t.csv").write_text(TRACE)
    result = CliRunner().invoke(
        app, ["simulate", "--trace", str(tmp_path / "t.csv"), "--cluster",
              str(tmp_path / "c.yaml"), "--policy", "fcfs,slurm-like,spillway"],
        env={"COLUMNS": columns} if columns else None)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    rows = [line for line in lines if line.startswith("slurm-like ")]
    if columns:  # blocks that fit 80 columns, each with every policy
        assert all(len(line) <= 80 for line in lines), result.stdout
        assert len(rows) >= 2 and all("%" in r or "s" in r for r in rows), result.stdout
    else:  # a pipe: one whole row a policy
        assert len(rows) == 1 and rows[0].rstrip().endswith("s"), result.stdout
        assert any(line.rstrip().endswith("wall") for line in lines), result.stdout


def test_demo_board_keeps_its_ids_at_80_columns() -> None:
    from rich.console import Console

    from broker.cli.demo_board import WORKLOAD, Board
    from broker.model import Instance, InstanceState, StateChange
    from tests.builders import job

    jobs = [job(f"j-{i:012x}", d.gpus, priority=d.priority, name=d.name, submitted=time.time())
            for i, d in enumerate(WORKLOAD)]
    board = Board(None, "demo-node", "8xA100-80GB", cloud=True)
    for j, d in zip(jobs, WORKLOAD):
        board.plan[j.id], board.jobs[j.id], board.cursor[j.id] = d, j, "0"
    assert board.machines is not None
    board.machines.update([Instance(
        "burst-0123456789abcdef", "local:home:home-a:ondemand/local-4xa100-80gb",
        InstanceState.DRAINING, "local-burst-0123456789abcdef", "local-burst-0123456789abcdef",
        time.time() - 9, price_per_hour=12.0, for_jobs=(jobs[1].id, jobs[4].id),
        history=(StateChange(InstanceState.DRAINING, time.time(), "idle for 3s "
                                                                  "(idle_timeout_s 3)"),))])
    for j in jobs[:3]:
        board.last_line[j.id] = "epoch 3/10 loss 0.4213 lr 3e-4 throughput 1234 samples/s"
    console = Console(width=80, record=True, highlight=False)
    console.print(board.render(80))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "ID" in text.splitlines()[2], text
    for j in jobs:
        assert j.id in text, text
    assert "cloud-1" in text and "DRAINING" in text, text


def test_piped_nodes_are_one_line_each(url: str) -> None:
    from broker.model import Gpu, Node

    gpus = (*(Gpu(f"GPU-n1-{i}", i, "A100-80GB", 80.0) for i in range(4)),
            *(Gpu(f"GPU-n1-{i}", i, "H100-80GB", 80.0) for i in range(4, 8)),
            *(Gpu(f"GPU-n1-{i}", i, "L40S-48GB", 48.0) for i in range(8, 12)))
    store = RedisStore(url)
    try:
        store.heartbeat(Node("gpu-node-with-a-long-name-01", gpus, hostname="h", cpus=64,
                             memory_gb=512, incarnation="i1"), 60, time.time())
    finally:
        store.close()
    out = cli(url, "nodes")
    rows = [line for line in out.splitlines() if "gpu-node-with-a-long-name-01" in line]
    assert len(rows) == 1 and "4/4 L40S-48GB" in rows[0] and "ago" in rows[0], out
