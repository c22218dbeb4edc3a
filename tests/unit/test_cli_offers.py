"""``spillway offers`` and ``spillway catalog refresh`` through Typer's CliRunner: ordering,
filters, the on-prem price, errors that name the option, narrow terminals, a refresh that
writes a catalog the next command reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.cli import app
from providers.catalog import CatalogRow, write_rows
from tests.unit.test_catalog_refresh import compute  # noqa: F401  (the fake Compute fixture)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_CONFIG", "SPILLWAY_OFFER_CATALOG",
                "SPILLWAY_ONPREM_PRICE_PER_GPU_HOUR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/spillway/config.yaml
    monkeypatch.setenv("COLUMNS", "200")


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def offers_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    code, out, err = cli("offers", "--json", *args, env=env)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_help() -> None:
    for command in (["offers"], ["catalog", "refresh"]):
        code, out, _ = cli(*command, "--help")
        assert code == 0 and "Usage" in out
    assert "offers" in cli("--help")[1] and "catalog" in cli("--help")[1]


def test_eight_a100s_cheapest_work_first_with_the_onprem_price() -> None:
    doc = offers_json("--gpu", "A100", "--count", "8", "--limit", "100")
    offers = doc["offers"]
    assert offers and doc["total"] == len(offers)
    assert all(o["gpu_model"].startswith("A100") and o["gpu_count"] >= 8 for o in offers)
    keys = [o["price_per_work_hour"] for o in offers]
    assert keys == sorted(keys)
    first = offers[0]
    assert first["price_per_work_hour"] == pytest.approx(
        first["price_per_hour"] / (8 * 2.4), rel=1e-4)  # 8 GPUs at the A100's speed
    assert doc["onprem"] == {"price_per_gpu_hour": 0.81, "gpu_model": "A100", "speed": 2.4,
                             "price_per_work_hour": pytest.approx(0.81 / 2.4, abs=1e-6),
                             "source": "config onprem_price_per_gpu_hour"}


@pytest.mark.parametrize(("args", "check"), [
    (["--spot"], lambda o: o["market"] == "spot"),
    (["--ondemand"], lambda o: o["market"] == "ondemand"),
    (["--provider", "aws"], lambda o: o["provider"] == "aws"),
    (["--region", "us-west-2", "--region", "us-west1"],
     lambda o: o["region"] in ("us-west-2", "us-west1")),
    (["--gpu", "V100-32GB"], lambda o: o["gpu_model"] == "V100-32GB"),
])
def test_filters(args: list[str], check: Any) -> None:
    doc = offers_json(*args, "--limit", "1000")
    assert doc["offers"] and all(check(o) for o in doc["offers"]), args


def test_limit_and_determinism() -> None:
    a = offers_json("--limit", "7")["offers"]
    assert len(a) == 7 and a == offers_json("--limit", "7")["offers"]


@pytest.mark.parametrize(("args", "words"), [
    (["--gpu", "Z100"], ["gpu: 'Z100' is not a GPU model Spillway knows; did you mean V100?",
                         "A100-80GB"]),
    (["--gpu", "A100", "--count", "0"], ["count: 0 is not allowed", ">= 1"]),
    (["--limit", "0"], ["limit: 0 is not allowed"]),
    (["--spot", "--ondemand"], ["market: --spot and --ondemand exclude each other"]),
    (["--provider", "azure"], ["provider: 'azure' is not in the catalog", "aws, gcp"]),
    (["--provider", "gcp", "--region", "us-east-1"],
     ["region: 'us-east-1' is not in the catalog for gcp", "us-central1"]),
])
def test_bad_input_names_the_option(args: list[str], words: list[str]) -> None:
    code, out, err = cli("offers", *args)
    assert code == 2, out + err
    flat = " ".join(err.split())
    for w in words:
        assert w in flat, flat
    assert "Traceback" not in out + err


def test_no_offer_says_what_the_catalog_has() -> None:
    code, out, _ = cli("offers", "--gpu", "H100")
    assert code == 0
    assert "No offer in the catalog holds 1 x H100" in out and "A100, K80" in out
    assert "On-prem: $0.810 per GPU-hour" in out


def test_onprem_price_and_catalog_from_the_config(tmp_path: Path) -> None:
    small = write_rows(tmp_path / "small.csv", [CatalogRow(
        "aws", "us-east-1", "", "p3.2xlarge", "V100-16GB", 1, 16, 8, 61, 2.0, None, "X",
        "test", "2026-01-01")])
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"onprem_price_per_gpu_hour: 1.25\noffer_catalog: {small}\n")
    doc = offers_json(env={"SPILLWAY_CONFIG": str(cfg)})
    assert doc["onprem"]["price_per_gpu_hour"] == 1.25
    assert doc["catalog"] == str(small) and [o["id"] for o in doc["offers"]] == [
        "aws:us-east-1:ondemand/p3.2xlarge"]
    assert offers_json(env={"SPILLWAY_ONPREM_PRICE_PER_GPU_HOUR": "0.5"})["onprem"][
        "price_per_gpu_hour"] == 0.5
    bad = tmp_path / "bad.csv"
    bad.write_text(small.read_text().replace(",2,,", ",two,,"))
    code, _, err = cli("offers", "--catalog", str(bad))
    assert code == 2 and "catalog:" in err and "line 3: column ondemand_price" in err


@pytest.mark.parametrize(("columns", "heads"), [
    (80, ["$/WORK-H", "$/GPU-H", "$/H", "GPUS", "CLOUD", "ZONE/REGION", "MARKET", "TYPE"]),
    (60, ["$/WORK-H", "GPUS", "ZONE/REGION", "MARKET", "TYPE"]),
])
def test_the_table_fits_the_terminal_and_keeps_places_whole(columns: int,
                                                            heads: list[str]) -> None:
    code, out, _ = cli("offers", "--gpu", "A100", "--count", "8", "--limit", "6",
                       env={"COLUMNS": str(columns)})
    assert code == 0
    lines = out.splitlines()
    assert all(len(line.rstrip()) <= columns for line in lines), out
    assert lines[0].split()[:len(heads)] == heads
    assert "us-central1-a" in out and "a2-highgpu-8g" in out  # never cut
    wide = cli("offers", "--limit", "3", env={"COLUMNS": "200"})[1]
    assert "CARBON" in wide and "US-MIDW-MISO" in wide


@pytest.mark.slow  # google-cloud-compute's import
def test_catalog_refresh_writes_a_file_the_next_command_reads(
        compute: tuple[str, list[str]], tmp_path: Path) -> None:  # noqa: F811
    target = tmp_path / "fresh.csv"
    code, out, err = cli("catalog", "refresh", "gcp", "--project", "proj", "--endpoint",
                         compute[0], "--anonymous", "--out", str(target))
    assert code == 0, err
    flat = " ".join(out.split())
    assert f"to {target}" in flat and f"offer_catalog: {target}" in flat
    assert "Left out: nvidia-tesla-p4 (1)" in flat
    doc = offers_json("--catalog", str(target), "--provider", "gcp", "--region", "us-west1")
    assert {o["zone"] for o in doc["offers"]} == {"us-west1-b"}  # the fake's one zone there


@pytest.mark.parametrize(("args", "words"), [
    (["azure"], "provider: 'azure' has no refresher; use one of aws, gcp"),
    (["aws"], "regions: name at least one AWS region"),
    (["gcp"], "project: name the GCP project"),
    (["aws", "--region", "us-east-1", "--prices", "/nonexistent.csv"],
     "prices: cannot read price file /nonexistent.csv"),
])
def test_catalog_refresh_errors(args: list[str], words: str, tmp_path: Path) -> None:
    code, _, err = cli("catalog", "refresh", *args, "--out", str(tmp_path / "x.csv"))
    assert code == 2 and words in " ".join(err.split()), err
    assert not (tmp_path / "x.csv").exists()
