"""Configuration typos are caught: every key, type and range of the file and of the
``SPILLWAY_*`` variables, an unknown key naming the closest known one; the same for JobSpec
fields (issue item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.config.core import Config, load_config
from broker.errors import ConfigError, SpecError
from broker.model import JobSpec
from tests.conftest import cli_env

NOWHERE = "redis://127.0.0.1:1/0"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cli_env(monkeypatch, tmp_path)


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(path, env=env or {})


@pytest.mark.parametrize(("text", "message"), [
    ("redis_ulr: redis://h:6379/0\n", "config redis_ulr: not a setting; did you mean redis_url?"),
    ("grace_s: -3\n", "config grace_s: -3 is not allowed; use seconds >= 0"),
    ("heartbeat: 3\n", "config heartbeat: not a setting; did you mean heartbeat_s?"),
    ("heartbeat_s: 0\n", "config heartbeat_s: 0 is not allowed; use seconds > 0"),
    ("heartbeat_s: .nan\n", "config heartbeat_s: nan is not allowed; use seconds > 0"),
    ("heartbeat_s: true\n", "config heartbeat_s: True is not a number; use seconds > 0"),
    ("metrics_port: 70000\n", "config metrics_port: 70000 is not allowed; use a port 0..65535 "
                              "(0: none)"),
    ("max_attempts: 1.5\n", "config max_attempts: 1.5 is not a whole number; use a whole "
                            "number >= 1"),
    ("job_pids_max: 0\n", "config job_pids_max: 0 is not allowed; use a whole number >= 1"),
    ("redis_url: localhost:6379\n", "config redis_url: 'localhost:6379' is not allowed; use a "
                                    "redis://, rediss:// or unix:// URL"),
    ("default_team: [a]\n", "config default_team: ['a'] is not a string; use 1-64 "
                              "letters, digits, '.', '_' or '-'"),
    ("providers: [aws]\n", "config providers: ['aws'] is not a mapping; use {provider name: "
                          "its settings}"),
])
def test_a_bad_key_or_value_is_one_line_naming_it(tmp_path: Path, text: str,
                                                  message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert str(info.value) == message


def test_an_unknown_key_without_a_close_one_lists_the_allowed_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "bogus_key: 1\n")
    message = str(info.value)
    assert message.startswith("config bogus_key: not a setting; allowed: redis_url, ")
    assert "providers" in message and "\n" not in message


def test_every_config_field_is_checked(tmp_path: Path) -> None:
    from dataclasses import fields

    from broker.config.check import CONFIG_KEYS, _Model
    assert set(_Model.model_fields) == set(CONFIG_KEYS) == {f.name for f in fields(Config)} - {
        "extra"}
    with pytest.raises(ConfigError, match=r"^config 1: not a setting; allowed: redis_url"):
        load(tmp_path, "1: 2\n")
    assert load(tmp_path, "providers:\n").providers == {}


def test_every_problem_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "grace_s: -3\nbogus_key: 1\n")
    assert str(info.value).splitlines()[0].startswith("config grace_s: -3 is not allowed")
    assert str(info.value).splitlines()[1].startswith("config bogus_key: not a setting")


@pytest.mark.parametrize(("env", "message"), [
    ({"SPILLWAY_GRACE_S": "-3"}, "SPILLWAY_GRACE_S: '-3' is not allowed; use seconds >= 0"),
    ({"SPILLWAY_HEARTBEAT_S": "fast"}, "SPILLWAY_HEARTBEAT_S: 'fast' is not a number; use "
                                       "seconds > 0"),
    ({"SPILLWAY_REDIS_ULR": "redis://h/0"}, "SPILLWAY_REDIS_ULR: not a setting; did you mean "
                                            "SPILLWAY_REDIS_URL?"),
])
def test_the_environment_is_checked_alike(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert str(info.value) == message


def test_good_values_and_other_spillway_variables_pass(tmp_path: Path) -> None:
    cfg = load(tmp_path, "grace_s: 0\nmetrics_port: '0'\nredis_url: ''\nmax_attempts: 3.0\n"
                         "providers: {aws: {regions: [us-east-1]}}\n",
               env={"SPILLWAY_JOB_ID": "j1", "SPILLWAY_NODE_ID": "n1", "SPILLWAY_DEFAULTS": "x",
                    "SPILLWAY_ATTEMPT": "1", "SPILLWAY_SCRATCH_DIR": "/s", "SPILLWAY_STATE": "x",
                    "SPILLWAY_LEASE_TTL_S": "9"})
    assert (cfg.grace_s, cfg.metrics_port, cfg.redis_url, cfg.max_attempts) == (0.0, 0, None, 3)
    assert cfg.lease_ttl_s == 9.0 and isinstance(cfg.max_attempts, int)
    aws = cfg.providers["aws"]  # (checked: broker/config/providers.py)
    assert (aws.kind, dict(aws.options), aws.boot_timeout_s) == ("aws", {"regions": ["us-east-1"]},
                                                                 600.0) and cfg.extra == {}
    assert load_config(env={}).providers == {}


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--redis-url", NOWHERE, *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(("text", "words"), [
    ("grace_s: -3\n", "grace_s: -3 is not allowed; use seconds >= 0"),
    ("bogus_key: 1\n", "bogus_key: not a setting; allowed: redis_url"),
    ("redis_ulr: redis://h/0\n", "did you mean redis_url?"),
])
def test_the_cli_exits_1_with_one_line(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    code, out, err = cli("--config", str(path), "queue")
    assert code == 1, out + err
    assert words in err and "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1, err


def test_a_jobspec_typo_names_the_closest_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.parse({"command": "true", "gpu": 2})
    [error] = info.value.errors
    assert (error.field, error.problem) == ("gpu", "is not a JobSpec field; did you mean gpus?")
    with pytest.raises(SpecError) as info:
        JobSpec.parse({"command": "true", "zzz": 2})
    assert info.value.errors[0].problem == "is not a JobSpec field"
    assert info.value.errors[0].allowed.startswith("command, name, ")
    job = tmp_path / "job.yaml"
    job.write_text("command: 'true'\ngpu: 2\n")
    code, out, err = cli("submit", "-f", str(job))
    assert code == 2 and "gpu: is not a JobSpec field; did you mean gpus?" in err, out + err


def test_the_clients_spec_error_names_the_closest_field() -> None:
    from broker.client import Client

    client = Client(NOWHERE, Config())  # the spec is refused before Redis is asked anything
    with pytest.raises(SpecError, match=r"gpu: is not a JobSpec field; did you mean gpus\?"):
        client.submit(command="true", gpu=2)
    with pytest.raises(SpecError, match=r"priorty: is not a JobSpec field; did you mean "
                                        r"priority\?"):
        client.submit({"command": "true", "priorty": "high"})


@pytest.mark.parametrize(("text", "message"), [
    ("polcy: fcfs\n", "config polcy: not a setting; did you mean policy?"),
    ("grace_s: 3\ngrace: 3\n", "config grace: not a setting; did you mean grace_s?"),
])
def test_the_closest_key_is_found_for_short_keys_too(tmp_path: Path, text: str,
                                                     message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert str(info.value) == message
