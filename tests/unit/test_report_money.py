"""Money in the spend report (broker/money/amounts.py), table-driven: cents rounded half up
and never a negative zero, shares in cents that add up, and money axes whose labels say
their gridlines' values."""

from __future__ import annotations

import json
import math

import pytest

from broker.money.amounts import (
    cents,
    dollars,
    money,
    money_ticks,
    no_negative_zero,
    parse_label,
    rate,
    split_cents,
)


@pytest.mark.parametrize("value,text,sign", [
    (0.0, "0.00", "$0.00"),
    (-0.0, "0.00", "$0.00"),  # never -0.00
    (-0.004, "0.00", "$0.00"),  # rounds to a negative zero: none
    (-1e-15, "0.00", "$0.00"),  # what a float sum of reservations leaves
    (-0.005, "-0.01", "-$0.01"),  # half up, away from zero
    (0.005, "0.01", "$0.01"),
    (2.675, "2.68", "$2.68"),  # the decimal read, not the binary float below it
    (1.005, "1.01", "$1.01"),
    (0.125, "0.13", "$0.13"),
    (1234.5, "1,234.50", "$1,234.50"),
    (-1234.567, "-1,234.57", "-$1,234.57"),
    (1e9, "1,000,000,000.00", "$1,000,000,000.00"),
    (None, "-", "-"),
])
def test_money_and_dollars(value: float | None, text: str, sign: str) -> None:
    assert money(value) == text and dollars(value) == sign


@pytest.mark.parametrize("value,want", [
    (-0.0, 0.0), (-0.004, 0.0), (-1e-15, 0.0), (2.675, 2.68), (-2.675, -2.68), (3.0, 3.0),
    (0.1 + 0.2, 0.3), (1e300, 1e300),
])
def test_cents_are_rounded_half_up_and_never_negative_zero(value: float, want: float) -> None:
    got = cents(value)
    assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want or 1.0)
    assert "-0.0" not in json.dumps(got)


def test_a_reports_data_holds_no_negative_zero() -> None:
    data = {"a": -0.0, "b": [1.0, -0.0, {"c": -0.0}], "d": (-0.0, "x"), "e": None, "f": -2.0}
    out = no_negative_zero(data)
    assert "-0.0" not in json.dumps(out) and out["f"] == -2.0 and out["e"] is None
    assert out["d"] == (0.0, "x")


@pytest.mark.parametrize("total,parts,want", [
    (1.0, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, {"a": 0.34, "b": 0.33, "c": 0.33}),
    (22.644, {"vision": 13.158, "nlp": 9.486}, {"nlp": 9.48, "vision": 13.16}),
    (0.02, {"a": 0.004, "b": 0.016}, {"a": 0.0, "b": 0.02}),
    (5.0, {"a": 5.0}, {"a": 5.0}),
    (0.0, {"a": 0.0, "b": -0.0}, {"a": 0.0, "b": 0.0}),
])
def test_shares_in_cents_add_up_to_their_total(total: float, parts: dict[str, float],
                                               want: dict[str, float]) -> None:
    got = split_cents(total, parts)
    assert got == want and list(got) == sorted(got)
    assert round(sum(got.values()), 2) == cents(total)
    assert "-0.0" not in json.dumps(got)


@pytest.mark.parametrize("value,text", [
    (0.918, "0.918"), (3.06, "3.06"), (32.7726, "32.7726"), (2, "2.00"), (1.00001, "1.00"),
    (1234.5, "1,234.50"),
])
def test_a_rate_keeps_fractions_of_a_cent(value: float, text: str) -> None:
    assert rate(value) == text


@pytest.mark.parametrize("top,labels", [
    (1.5, ["$0", "$0.50", "$1.00", "$1.50"]),  # the axis: was $0, $0, $1, $2
    (1.4, ["$0", "$0.50", "$1.00", "$1.50"]),
    (0.0, ["$0", "$0.50", "$1.00"]),  # nothing spent: a $1 axis
    (-3.0, ["$0", "$0.50", "$1.00"]),
    (math.nan, ["$0", "$0.50", "$1.00"]),
    (0.03, ["$0", "$0.01", "$0.02", "$0.03"]),
    (0.004, ["$0", "$0.001", "$0.002", "$0.003", "$0.004"]),  # finer than a cent
    (0.3, ["$0", "$0.10", "$0.20", "$0.30"]),  # 3 x 0.1 is 0.3, not 0.30000000000000004
    (47, ["$0", "$20", "$40", "$60"]),
    (100, ["$0", "$50", "$100"]),
    (999, ["$0", "$500", "$1k"]),
    (1450, ["$0", "$500", "$1.0k", "$1.5k"]),  # k from a thousand, one decimal for all k
    (9000, ["$0", "$5k", "$10k"]),
    (12345, ["$0", "$5k", "$10k", "$15k"]),
    (2.5e6, ["$0", "$1M", "$2M", "$3M"]),
])
def test_money_ticks(top: float, labels: list[str]) -> None:
    ticks = money_ticks(top)
    assert [t.label for t in ticks] == labels
    step = ticks[1].value
    for i, t in enumerate(ticks):
        assert parse_label(t.label) == t.value == pytest.approx(i * step)
    assert ticks[-1].value >= (top if math.isfinite(top) and top > 0 else 1.0)


@pytest.mark.parametrize("top,ticks,step", [
    (1.5, 4, 0.5), (100, 4, 50), (100, 5, 20), (7, 5, 2), (1000, 4, 500), (40, 4, 10),
])
def test_the_step_is_1_2_or_5_times_a_power_of_ten(top: float, ticks: int, step: float
                                                   ) -> None:
    assert money_ticks(top, ticks)[1].value == pytest.approx(step)


@pytest.mark.parametrize("label,value", [
    ("$0", 0.0), ("$0.50", 0.5), ("$1,000", 1000.0), ("$1.5k", 1500.0), ("$2M", 2e6),
    ("$0.005", 0.005),
])
def test_labels_read_back(label: str, value: float) -> None:
    assert parse_label(label) == value
