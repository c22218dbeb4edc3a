"""DESIGN's "never" edges, checked in the modules a fresh process loads (not only in the source's
import statements, which ``test_imports.py`` reads): the policies load no ``providers`` module
(the energy model's step functions sit in ``broker.energy.steps``), and the worker agent loads
no policy and nothing of the scheduler (its metrics are ``broker.metrics.agent``, not the
scheduler's; :mod:`workers.service` wires the agent's process, :mod:`workers.tasks` its Celery
tasks). Each case imports its module in a subprocess run from the repository's root.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The scheduler's side, which the agent process must never load.
SCHEDULER = ("policies", "broker.cycle", "broker.control", "broker.cloud", "broker.money",
             "broker.sim", "broker.bench", "broker.metrics.scheduler", "broker.metrics.cloud")


def loaded(module: str) -> list[str]:
    """The modules a fresh interpreter has in ``sys.modules`` after ``import module``."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    names = json.loads(out.splitlines()[-1])
    assert module in names
    return list(names)


def under(names: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in names if any(m == p or m.startswith(p + ".") for p in prefixes)]


@pytest.mark.parametrize("module", ["policies", "broker.energy.model"])
def test_the_policies_and_the_energy_model_load_no_provider(module: str) -> None:
    assert under(loaded(module), ("providers",)) == []


@pytest.mark.parametrize("module", ["workers.agent", "workers.service", "workers.tasks"])
def test_the_agent_loads_no_policy_and_nothing_of_the_scheduler(module: str) -> None:
    assert under(loaded(module), SCHEDULER) == []


def test_the_agent_process_loads_its_own_metrics() -> None:
    # (the check above would pass vacuously if the agent stopped exporting metrics)
    names = loaded("workers.service")
    assert "broker.metrics.agent" in names
    assert "broker.metrics.http" in names


def test_the_providers_still_offer_the_step_functions() -> None:
    from broker.energy import steps
    from providers.carbon import base

    assert base.CarbonSource is steps.CarbonSource
    assert base.integrate is steps.integrate
    assert base.mean_intensity is steps.mean_intensity
