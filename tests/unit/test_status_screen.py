"""`spillway status` at 80 columns (piped): a node's id, state, site and GPUs are never cut;
who drained it and how its jobs are kept apart move under the table where it would not fit."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from broker.cli.status_view import status_screen


def data(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"leader": {"token": 7, "lease_left_s": 4.2}, "nodes": nodes, "queue": [],
            "running": 0, "active": {"STARTING": 0, "STOPPING": 0}, "instances": [],
            "cycles": {"failed": 0, "window_s": 600, "last_failure": None}, "set_aside": []}


def node(i: str, state: str, iso: str, drained: str | None = None) -> dict[str, Any]:
    return {"id": i, "state": state, "site": "onprem", "gpus_free": 8, "gpus_total": 8,
            "drained_by": drained, "isolation": iso}


@pytest.mark.parametrize("nodes", [
    [node("gpu-node-a100-rack4-slot17", "READY",
          "none: the agent is not root, so jobs run as its own user (job_isolation)")],
    [node("gpu-0", "DRAINING", "uid per team", drained="operator alice: replacing a PSU"),
     node("gpu-1-long-name-for-a-node", "DOWN", "none: cgroup v2 without delegation, "
          "devices not fenced")],
])
def test_status_at_80_columns_keeps_nodes_and_states_whole(nodes: list[dict[str, Any]]) -> None:
    console = Console(width=80, record=True, color_system=None, force_terminal=False)
    console.print(status_screen(data(nodes), 80))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "…" not in text, text
    rows = text.splitlines()
    for n in nodes:
        row = next(r for r in rows if r.startswith(n["id"]))
        assert row.split()[:4] == [n["id"], n["state"], "onprem", "8/8"], text
    words = " ".join(text.split())
    for n in nodes:  # moved, not cut
        said = f"{n['id']}: " + (f"drained by {n['drained_by']}; " if n["drained_by"] else "")
        assert f"{said}jobs isolated: {n['isolation']}" in words, text


def test_status_keeps_every_column_in_the_table_where_it_fits() -> None:
    one = node("gpu-0", "DRAINING", "uid per team", drained="alice")
    console = Console(width=100, record=True, color_system=None, force_terminal=False)
    console.print(status_screen(data([one]), 100))
    rows = console.export_text().splitlines()
    assert any(r.split() == ["NODE", "STATE", "SITE", "GPUS", "FREE/TOTAL", "DRAINED", "BY",
                             "JOBS", "ISOLATED"] for r in rows), rows
    assert any(r.split() == ["gpu-0", "DRAINING", "onprem", "8/8", "alice", "uid", "per",
                             "team"] for r in rows), rows
    assert not any("jobs isolated:" in r for r in rows), rows
