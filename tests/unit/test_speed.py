"""GPU speed table and runtime conversion."""

from __future__ import annotations

import pytest

from broker.model.gpus import GPU_FAMILIES, KNOWN_MODELS
from broker.model.speed import RELATIVE_SPEED, convert_runtime, fastest_first, speed_of


def test_every_known_family_has_a_speed() -> None:
    assert set(GPU_FAMILIES) <= set(RELATIVE_SPEED)
    assert RELATIVE_SPEED["V100"] == 1.0
    assert all(v > 0 for v in RELATIVE_SPEED.values())


@pytest.mark.parametrize(("model", "speed"), [
    ("V100-32GB", 1.0), ("V100", 1.0), ("a100", RELATIVE_SPEED["A100"]),
    ("A100-40GB", RELATIVE_SPEED["A100"]), ("H100-94GB", RELATIVE_SPEED["H100"]),
    ("RTX4090-24GB", RELATIVE_SPEED["RTX4090"]), ("MI300X", 1.0), ("", 1.0),
])
def test_speed_of(model: str, speed: float) -> None:
    assert speed_of(model) == speed


@pytest.mark.parametrize(("slower", "faster"), [
    ("K80", "P100"), ("P100", "V100"), ("T4", "V100"), ("V100", "A100"), ("A100", "H100"),
    ("H100", "H200"), ("H200", "B200"), ("A6000", "L40S"), ("L4", "A10"),
])
def test_generations_order(slower: str, faster: str) -> None:
    assert speed_of(slower) < speed_of(faster)


@pytest.mark.parametrize(("seconds", "src", "dst", "expected"), [
    (3600.0, None, "H100-80GB", 3600.0),
    (3600.0, "V100-32GB", "V100-16GB", 3600.0),
    (4200.0, "V100-32GB", "H100-80GB", 1000.0),
    (1000.0, "H100-80GB", "V100-32GB", 4200.0),
    (100.0, "unknown", "V100", 100.0),
])
def test_convert_runtime(seconds: float, src: str | None, dst: str, expected: float) -> None:
    assert convert_runtime(seconds, src, dst) == pytest.approx(expected)


def test_convert_runtime_round_trip() -> None:
    for a in KNOWN_MODELS:
        for b in ("V100-32GB", "A100-80GB", "H100-80GB"):
            assert convert_runtime(convert_runtime(1234.0, a, b), b, a) == pytest.approx(1234.0)


def test_fastest_first() -> None:
    assert fastest_first(["V100-32GB", "H100-80GB", "A100-80GB", "T4-16GB"]) == [
        "H100-80GB", "A100-80GB", "V100-32GB", "T4-16GB"]
    # equally fast models keep their order
    assert fastest_first(["A100-80GB", "A100-40GB", "K80-12GB"]) == [
        "A100-80GB", "A100-40GB", "K80-12GB"]
    assert fastest_first(["A10G-24GB", "A10-24GB"]) == ["A10G-24GB", "A10-24GB"]
    assert fastest_first([]) == []
