"""The cloud commands (instances, launch, provisioner) and the cloud parts of status and nodes,
through Typer's CliRunner against a real Redis database of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from broker.cli import app
from broker.model import Gpu, Instance, InstanceState, Node
from broker.store import open_store
from tests.conftest import cli_env, flushed_db

S = InstanceState
DB = 14
OFFER = "local:home:home-a:ondemand/local-2xa100-80gb"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cli_env(monkeypatch, tmp_path)


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


def cli(*args: str, url: str | None = None, config: Path | None = None
        ) -> tuple[int, str, str]:
    argv = (["--redis-url", url] if url else []) + \
        (["--config", str(config)] if config else []) + list(args)
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def seed(url: str) -> None:
    store = open_store(url, None)
    now = 1_000_000.0
    store.record_instances([Instance("r-ready", OFFER, requested_at=now, price_per_hour=3.0,
                                     for_jobs=("j-1",)),
                            Instance("r-failed", OFFER, requested_at=now + 1)])
    store.move_instance("r-ready", S.BOOTING, now + 2, "launched", provider_id="local-r-ready")
    store.move_instance("r-ready", S.READY, now + 3, "agent registered",
                        node_id="local-r-ready")
    store.move_instance("r-failed", S.FAILED, now + 2, "no capacity: stockout")
    store.heartbeat(Node("local-r-ready", (Gpu("g0", 0, "A100-80GB", 80.0),),
                         site="local:home:home-a:ondemand", instance_id="local-r-ready"),
                    1e12, now)


def test_instances_lists_live_ones_and_all_with_the_ledger(url: str) -> None:
    seed(url)
    code, out, _ = cli("instances", url=url)
    assert code == 0 and "r-ready" in out and "READY" in out and "r-failed" not in out
    assert "local-r-ready" in out and "3.00" in out
    code, out, _ = cli("instances", "--all", "--json", url=url)
    rows = {r["request_id"]: r for r in json.loads(out)}
    assert rows["r-failed"]["state"] == "FAILED"
    assert rows["r-failed"]["reason"] == "no capacity: stockout"
    assert rows["r-ready"]["for_jobs"] == ["j-1"] and rows["r-ready"]["node"] == "local-r-ready"
    assert [h[0] for h in rows["r-ready"]["history"]] == ["BOOTING", "READY"]


def test_status_and_nodes_show_the_cloud(url: str) -> None:
    seed(url)
    code, out, _ = cli("status", "--json", url=url)
    assert json.loads(out)["instances"] == [{"state": "READY", "count": 1}]
    code, out, _ = cli("status", url=url)
    assert "1 READY" in out
    code, out, _ = cli("nodes", url=url)
    assert code == 0
    for word in ("MARKET", "INSTANCE", "ondemand", "3.00", "local-r-ready"):
        assert word in out
    code, out, _ = cli("nodes", "--json", url=url)
    assert json.loads(out)[0]["instance_id"] == "local-r-ready"


def test_no_instances(url: str) -> None:
    code, _, err = cli("instances", url=url)
    assert code == 0 and "no cloud instances running" in err


def test_launch_and_provisioner_need_a_provider(url: str, tmp_path: Path) -> None:
    code, _, err = cli("launch", OFFER, url=url)
    assert code == 2 and "no cloud provider is configured" in err
    code, _, err = cli("provisioner", url=url)
    assert code == 2 and "no cloud provider is configured" in err
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"providers": {"local": {"state_dir": str(tmp_path)}}}))
    code, _, err = cli("launch", "aws:us-east-1:spot/p4d.24xlarge", url=url, config=cfg)
    assert code == 2 and "provider 'aws', which is not configured" in err


def test_launch_records_requested_instances(url: str, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"providers": {"local": {"state_dir": str(tmp_path)}}}))
    code, out, err = cli("launch", OFFER, "--count", "2", url=url, config=cfg)
    assert code == 0, err
    rids = [line.split()[0] for line in out.splitlines()]
    assert len(rids) == 2 and rids[0].endswith("-1") and rids[1].endswith("-2")
    store = open_store(url, None)
    assert [i.state for i in store.instances()] == [S.REQUESTED, S.REQUESTED]


def test_instances_and_nodes_fit_80_columns(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seed(url)
    monkeypatch.setenv("COLUMNS", "80")
    for command, words in ((("instances", "--all"), ("r-ready", "READY", "FAILED", "3.00")),
                           (("nodes",), ("READY", "ondemand", "3.00"))):
        code, out, _ = cli(*command, url=url)
        assert code == 0
        assert max(len(line) for line in out.splitlines()) <= 80, out
        for word in words:
            assert word in out, (command, out)
