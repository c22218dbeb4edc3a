"""The finance user's path through the CLI, on a real Redis database of its own: set a team's
hard cap, a burst that would pass it is refused and ``spillway explain`` says BudgetExhausted
and by how much; raise the cap and the next cycle bursts, its expected cost reserved, which
``spillway budget show`` reports; every change is in the history."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from broker.bus.runtime import Runtime
from broker.config.core import Config
from broker.config.providers import parse_providers
from broker.cycle.actuator import apply_plan
from broker.cycle.scheduler import run_cycle
from broker.cycle.snapshots import SnapshotBuilder
from broker.model import InstanceState, JobSpec, Market, Offer
from broker.money.ledger import accrue_store
from broker.store import open_store
from broker.store.budgets import budget_book
from policies.registry import PolicySet
from tests.conftest import cli_env, flushed_db, run_cli
from tests.unit.test_commands import FakeRuntime, Recorder

DB = 11  # this module's own database on the session's Redis
OFFER = Offer("local", "home", "home-a", "t1", "A100-80GB", 1, 80.0, Market.ONDEMAND, 4.0,
              extra={"boot_s": 60.0})


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cli_env(monkeypatch, tmp_path)


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


cli = run_cli


def test_a_burst_past_a_hard_cap_is_refused_and_explained(url: str) -> None:
    assert cli(url, "budget", "set", "vision", "--total", "5", "--hard")[0] == 0
    code, _, err = cli(url, "budget", "set", "vision", "--monthly", "-5")
    assert code == 2 and "amount" in err and ">= 0" in err
    cfg = Config(providers=parse_providers({"local": {}}))
    store = open_store(url, cfg)
    rt = cast(Runtime, FakeRuntime(cfg, store, Recorder()))  # type: ignore[arg-type]
    now = time.time()
    store.publish_offers([OFFER], now)
    job = store.submit(JobSpec(command="true", gpus=1, team="vision", priority="high",
                               time_limit="2h"), now - 1600)  # its SLA breaks in 200 s

    def cycle() -> None:
        snap = SnapshotBuilder(store).build(time.time())
        apply_plan(rt, run_cycle(snap, PolicySet.named("spillway"), snap.now))

    cycle()
    code, out, _ = cli(url, "explain", job.id)
    # $4/h x (60 s boot + 2 h limit + 300 s idle tail) = $8.40 against $5
    assert code == 0 and "BudgetExhausted" in out and "over the cap by $3.40" in out
    assert store.instances() == []
    assert cli(url, "budget", "set", "vision", "--total", "10", "--hard")[0] == 0
    cycle()
    assert [i.for_jobs for i in store.instances()] == [(job.id,)]
    code, out, _ = cli(url, "budget", "show", "vision", "--json")
    row = json.loads(out)[0]
    assert (row["amount"], row["reserved"], row["left"]) == (10.0, 8.4, 1.6)
    code, out, _ = cli(url, "budget", "show")
    assert "vision" in out and "8.40" in out and "hard" in out
    code, out, _ = cli(url, "budget", "history", "vision", "--json")
    assert [(h["after"]["amount"], h["action"]) for h in json.loads(out)] == [
        (5.0, "set"), (10.0, "set")]
    # the machine is given back before it ever ran: the lifecycle pass's ledger releases the
    # reservation (nothing was billed)
    inst = store.instances()[0]
    store.move_instance(inst.request_id, InstanceState.TERMINATED, time.time(), "not needed")
    acc = accrue_store(store, budget_book(store), time.time())
    assert acc.settled == 1 and budget_book(store).reserved()["vision"] == 0
    assert json.loads(cli(url, "budget", "show", "vision", "--json")[1])[0]["left"] == 10.0
    assert cli(url, "budget", "rm", "vision")[0] == 0
    assert cli(url, "budget", "rm", "vision")[0] == 1
