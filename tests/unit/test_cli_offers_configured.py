"""``spillway offers`` lists the configured providers' offers (local ones included), first and
marked, beside the catalog's; ``--provider local`` works; a provider whose offers cannot be
read is one warning line, the others still listed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.cli import app

LOCAL_ID = "local:home:home-a:ondemand/local-2xa100-80gb"


@pytest.fixture
def config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_CONFIG", "SPILLWAY_OFFER_CATALOG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "config.yaml"
    path.write_text(f"providers:\n  local:\n    kind: local\n    gpus: 2xA100-80GB\n"
                    f"    state_dir: {tmp_path / 'cloud'}\n")
    return path


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def offers_json(config: Path, *args: str) -> dict[str, Any]:
    code, out, err = cli("--config", str(config), "offers", "--json", *args)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_provider_local_lists_the_local_offer(config: Path) -> None:
    doc = offers_json(config, "--provider", "local")
    assert doc["providers"] == ["local"] and doc["unreadable"] == []
    assert [(o["id"], o["configured"]) for o in doc["offers"]] == [(LOCAL_ID, True)]
    assert doc["offers"][0]["vcpus"] == 8 and doc["offers"][0]["price_per_hour"] == 2.0
    code, out, err = cli("--config", str(config), "offers", "--provider", "local")
    assert code == 0, err
    row = next(line for line in out.splitlines() if "local*" in line)
    assert row.split()[:5] == ["0.833", "1.000", "2.000", "2xA100-80GB", "local*"]
    assert f"`spillway launch {LOCAL_ID}` rents one by hand" in " ".join(out.split())


def test_configured_offers_come_first_whatever_the_limit(config: Path) -> None:
    doc = offers_json(config, "--gpu", "A100", "--limit", "2")
    ids = [(o["provider"], o["configured"]) for o in doc["offers"]]
    assert ids[0] == ("local", True) and len(ids) == 3
    assert all(not configured for _, configured in ids[1:])
    assert doc["total"] > 3


@pytest.mark.parametrize(("args", "words"), [
    (["--provider", "nope"],
     "provider: 'nope' is not in the catalog or configured (providers:) (allowed: aws, gcp, "
     "local)"),
    (["--provider", "local", "--region", "us-east-1"],
     "region: 'us-east-1' is not a region of local (allowed: home)"),
])
def test_bad_input_names_the_configured_providers(config: Path, args: list[str],
                                                  words: str) -> None:
    code, out, err = cli("--config", str(config), "offers", *args)
    assert code == 2, out + err
    assert words in " ".join(err.split())
    assert "Traceback" not in out + err


def test_local_without_a_configured_provider_says_where_to_add_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPILLWAY_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = cli("offers", "--provider", "local")
    assert code == 2
    assert "no provider is configured (providers: in the config file, docs/cloud.md)" in \
        " ".join(err.split())


def test_an_unreadable_provider_is_one_warning_and_the_rest_are_listed(
        config: Path, tmp_path: Path) -> None:
    config.write_text(config.read_text()
                      + "  broken:\n    kind: local\n    gpus: 2xA100-80GB,1xT4\n")
    code, out, err = cli("--config", str(config), "offers", "--provider", "local")
    assert code == 0, err
    assert "local*" in out
    warning = " ".join(err.split())
    assert warning.startswith("warning: provider broken: its offers cannot be read "
                              "(providers.broken.gpus:"), warning
    assert "Traceback" not in out + err
