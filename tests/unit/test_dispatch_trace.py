"""The dispatch trace's arithmetic (tests/reliability/dispatch_trace.py): each start's steps are
counted from the snapshot of the cycle that planned it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.reliability.dispatch_trace import SITECUSTOMIZE, STEPS, analyse


def write(path: Path, rows: list[list[object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_each_step_is_counted_from_its_own_cycles_snapshot(tmp_path: Path) -> None:
    ms = 0.001
    write(tmp_path / "1.jsonl", [  # the scheduler: two cycles, at 100 s and 100.050 s
        ["snapshot", 100.0, 100 + 3 * ms, []], ["apply", 100 + 7 * ms, 100 + 9 * ms, ["a"]],
        ["send", 100 + 10 * ms, 100 + 12 * ms, ["a"]],
        ["snapshot", 100.05, 100.05 + 3 * ms, []], ["apply", 100.05 + 5 * ms, 100.06, ["b"]],
        ["send", 100.06, 100.061, ["b"]],
    ])
    write(tmp_path / "2.jsonl", [  # an agent
        ["agent_start", 100 + 13 * ms, 100 + 30 * ms, ["a"]],
        ["agent_read", 100 + 13 * ms, 100 + 14 * ms, ["a"]],
        ["spawn", 100 + 14 * ms, 100 + 28 * ms, ["a"]],
        ["report", 100 + 28 * ms, 100 + 30 * ms, ["a"]],
        ["agent_start", 100.062, 100.07, ["b"]], ["agent_read", 100.062, 100.063, ["b"]],
        ["spawn", 100.063, 100.068, ["b"]],  # b's report never came: b is left out
    ])
    out = analyse(str(tmp_path))
    assert out["jobs_traced"] == 1
    t = out["timeline_ms"]
    assert [t[name]["p50"] for name, _, _ in STEPS] == [7.0, 9.0, 10.0, 12.0, 13.0, 14.0, 14.0,
                                                         28.0, 28.0]
    assert out["calls_ms"]["spawn"] == {"n": 2, "p50": 9.5, "mean": 9.5}
    assert out["calls_ms"]["snapshot"]["n"] == 2


def test_the_tracer_loads_and_wraps_the_traced_calls(tmp_path: Path) -> None:
    """The module the bench's processes load: it imports, wraps, and writes one line a call."""
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    code = ("from broker.bus import commands\n"
            "class C:\n"
            "    def send_task(self, *a, **k): pass\n"
            "class J:\n"
            "    id, attempt, allocations = 'j1', 1, ()\n"
            "commands.start_jobs(C(), [J()])\n")
    env = {**os.environ, "DISPATCH_TRACE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(site), os.getcwd()])}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    rows = [json.loads(x) for f in tmp_path.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert [(r[0], r[3]) for r in rows] == [("send", ["j1"])]
