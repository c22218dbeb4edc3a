"""JobSpec validation, durations, GPU names and the config loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config.core import load_config
from broker.errors import ConfigError, SpecError
from broker.model import Job, JobSpec, parse_duration, parse_time
from broker.model.gpus import canonical_model, normalise_type, parse_inventory, type_matches
from broker.model.state import JobState

CFG = load_config(env={})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("6h", 21600), ("1h30m", 5400), ("2d", 172800),
     ("01:30:00", 5400), ("1:30", 5400), (45, 45)],
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "6x", "h", "1h 3q", "-5m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_parse_time_iso_and_epoch() -> None:
    assert parse_time("2026-01-01T00:00:00Z") == parse_time("2026-01-01T00:00:00") == 1767225600
    assert parse_time(12.5) == 12.5


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"command": "true", "gpus": -1}, "gpus", "between 0 and 64"),
        ({"command": "true", "gpus": 65}, "gpus", "between 0 and 64"),
        ({"command": "true", "nodes": 0}, "nodes", "between 1 and 1024"),
        ({"command": "true", "priority": "urgent"}, "priority", "critical, high, normal, low"),
        ({"command": "true", "gpu_types": ["Z9000"]}, "gpu_types", "unknown GPU type"),
        ({"command": ""}, "command", "must not be empty"),
        ({"command": []}, "command", "non-empty"),
        ({"command": "echo 'unclosed"}, "command", "valid shell command"),
        ({"command": "true", "time_limit": "soon"}, "time_limit", "duration"),
        ({"command": "true", "time_limit": 0}, "time_limit", "positive"),
        ({"command": "true", "sites": ["moon"]}, "sites", "onprem, cloud, spot"),
        ({"command": "true", "mig_profile": "9g.1tb"}, "mig_profile", "1g.10gb"),
        ({"command": "true", "mig_profile": "1g.10gb", "gpu_types": ["V100"]}, "spec",
         "exists only on"),
        ({"command": "true", "max_price_per_hour": -1}, "max_price_per_hour", "positive"),
        ({"command": "true", "memory_gb": -1}, "memory_gb", "zero or more"),
        ({"command": "true", "team": "bad team!"}, "team", "letters, digits"),
        ({"command": "true", "gpuz": 1}, "gpuz", "not a JobSpec field"),
        ({}, "command", "required"),
    ],
)
def test_bad_specs_name_the_field(fields: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.parse(fields, CFG)
    assert [e.field for e in err.value.errors] == [field]
    assert words in str(err.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"command": "", "gpus": -2, "gpu_types": "Q1"}, CFG)
    assert {e.field for e in err.value.errors} == {"command", "gpus", "gpu_types"}
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"command": "", "priority": "urgent"}, CFG)
    assert {e.field for e in err.value.errors} == {"command", "priority"}


def test_good_spec_defaults_and_normalisation() -> None:
    spec = JobSpec.parse({"command": ["python", "train.py"], "gpu_types": "a100,h100-80gb",
                          "time_limit": "6h", "sites": "onprem,spot"}, CFG)
    assert spec.priority == "normal" and spec.team == "default"
    assert spec.gpu_types == ("A100", "H100-80GB")
    assert spec.time_limit == 21600 and spec.sites == ("onprem", "spot")
    assert spec.argv == ["python", "train.py"]
    assert JobSpec(command="echo hi").argv == ["/bin/sh", "-c", "echo hi"]


def test_job_round_trips_through_dict() -> None:
    spec = JobSpec.parse({"command": "true", "gpus": 2, "env": {"A": "1"}}, CFG)
    job = Job("j1", spec, JobState.PENDING, 5.0).with_state(JobState.STARTING, 6.0, "placed")
    assert Job.from_dict(job.to_dict()) == job


@pytest.mark.parametrize(
    ("name", "mem", "model"),
    [("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"), ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
     ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"), ("NVIDIA H200", 143771, "H200-141GB"),
     ("Tesla T4", 15360, "T4-16GB"), ("NVIDIA A10G", 23028, "A10G-24GB")],
)
def test_canonical_model(name: str, mem: int, model: str) -> None:
    assert canonical_model(name, mem) == model


def test_type_names_and_matching() -> None:
    assert normalise_type("a100") == "A100"
    assert normalise_type("A100-80gb") == "A100-80GB"
    assert normalise_type("A100_40G") == "A100-40GB"
    assert normalise_type("A100-20GB") is None
    assert type_matches("A100-80GB", "A100") and not type_matches("A100-80GB", "A100-40GB")


def test_inventory_parsing() -> None:
    assert [(e.count, e.model) for e in parse_inventory("4xA100-80GB, 2xT4")] == [
        (4, "A100-80GB"), (2, "T4-16GB")]
    for bad, words in [("4A100", "COUNTxMODEL"), ("2xA100", "ambiguous"), ("0xT4", "between")]:
        with pytest.raises(ValueError, match=words):
            parse_inventory(bad)


def test_config_file_and_env(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("heartbeat_s: 5\nlease_ttl_s: 12\nclasses:\n"
                    "  - {name: gold, rank: 10, sla_s: 60}\n  - {name: bronze, rank: 1}\n"
                    "default_class: bronze\n")
    cfg = load_config(path, env={"SPILLWAY_HEARTBEAT_S": "4"})
    assert cfg.heartbeat_s == 4 and cfg.lease_ttl_s == 12
    assert cfg.class_names == ("gold", "bronze")
    with pytest.raises(SpecError, match="gold, bronze"):
        JobSpec.parse({"command": "true", "priority": "normal"}, cfg)


@pytest.mark.parametrize(
    ("text", "words"),
    [("heartbeat_s: fast\n", "not a number"), ("classes: []\n", "non-empty"),
     ("classes:\n  - {name: x, rank: 1, colour: red}\n", "unknown keys"),
     ("default_class: gold\n", "default_class"), ("- a\n", "mapping"),
     ("heartbeat_s: 5\nlease_ttl_s: 4\n", "longer than")],
)
def test_config_errors(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        load_config(path, env={})


@pytest.mark.parametrize(("data", "field", "problem"), [
    ({"command": None}, "command", "Input should be a valid list or a valid string"),
    ({"command": ["a", 3]}, "command", "Input should be a valid string"),
    ({"command": "x", "gpu_types": False}, "gpu_types", "must be a list of GPU types"),
    ({"command": "x", "gpu_types": [1]}, "gpu_types", "must be a list of GPU types"),
    ({"command": "x", "sites": 7}, "sites", "must be a list of sites"),
])
def test_found_by_fuzzing_every_bad_field_is_named(data: dict[str, object], field: str,
                                                    problem: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.parse(data, CFG)
    assert [(e.field, e.problem.startswith(problem)) for e in info.value.errors] == [
        (field, True)], info.value.errors
