"""The simulator against the real system: 304 Philly jobs on a copy of seed-160 (20 worker
agents with static inventories, a real redis-server, the scheduler, real job processes),
time-scaled, for spillway and slurm-like. Fails if the agreement drops below issue 22's
bounds: mean wait and busy utilisation within 5%, start-time rank correlation >= 0.9, and
the two policies ranked the same in both worlds. About 3 minutes on 2 cores
(docs/fidelity.md has the figures and the K chosen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.cli.fidelity import summary
from broker.fidelity.run import FidelityRequest, run_fidelity
from broker.sim.run import SimRequest
from tests.reliability import REALTIME

START, END, LOAD_SCALE = "2017-10-12T00:00", "2017-10-12T02:00", 3.0
K = 100.0  # the largest K that kept every run within the bounds on a loaded 2-core machine
# The comparison needs a real run that kept up with the replay (`real_kept_up`: every job
# ran, none submitted more than a scheduling period late). Where the machine is too busy for
# that at K (the suite's other workers share its cores), the same run is made again at the
# next, slower K; the agreement bounds are the same at every K.
SLOWER_K = (K, 50.0)
BOUND = 0.05


def _run(policy: str, workdir: Path) -> dict[str, Any]:
    for k in SLOWER_K:
        req = FidelityRequest(SimRequest(trace="philly", cluster="seed-160", policies=(policy,),
                                         start=START, end=END, load_scale=LOAD_SCALE),
                              time_scale=k, workdir=workdir / f"k{k:g}")
        data, _ = run_fidelity(req)
        print(summary(data))  # shown when the test fails
        if data["real_kept_up"]:
            break
    return data


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.xdist_group(REALTIME)
def test_the_simulator_agrees_with_the_real_system(tmp_path: Path) -> None:
    runs = {p: _run(p, tmp_path / p) for p in ("spillway", "slurm-like")}
    for policy, data in runs.items():
        assert data["jobs"] >= 300 and data["agents"] >= 20
        assert data["real_kept_up"], \
            f"{policy}: the real run did not keep up, even at K={data['time_scale']:g}"
        for key in ("wait_mean_s", "busy_utilization"):
            d = data["diff"][key]
            assert d is not None and abs(d) <= BOUND, \
                f"{policy}: {key} real {data['real'][key]} vs sim {data['sim'][key]}"
        assert data["start_rank_correlation"] >= 0.9, policy
        assert set(data) >= {"real", "sim", "diff", "start_rank_correlation", "jobs",
                             "agents", "time_scale", "load"}
        assert data["load"]["dispatch_latency_s"]["n"] >= data["jobs"]
    real = [runs[p]["real"]["wait_mean_s"] for p in runs]
    sim = [runs[p]["sim"]["wait_mean_s"] for p in runs]
    assert (real[0] < real[1]) == (sim[0] < sim[1]), f"ranking differs: {real} vs {sim}"


@pytest.mark.parametrize(("args", "says"), [
    (["--time-scale", "0.5"], "--time-scale 0.5: must be a number >= 1"),
    (["--policy", "spillway,fcfs"], "--policy: give one policy"),
    (["--cluster", "small-mig", "--from", "2017-10-12T00:00", "--to", "2017-10-12T00:10"],
     "has MIG GPUs"),
])
def test_bad_input_is_refused_before_anything_starts(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["fidelity", *args])
    assert result.exit_code != 0
    assert says in result.output and "Traceback" not in result.output
