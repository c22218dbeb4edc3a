"""Money as the spend report prints it: cents rounded half up (as a person rounds, not as a
binary float happens to), never a negative zero, and the ticks of a money axis whose labels
say exactly the value their gridline is drawn at.

- :func:`cents`: a dollar amount rounded to the cent, ``-0.0`` made ``0.0`` (what JSON holds);
- :func:`money` (``1,234.50``, in a column headed ``$``) and :func:`dollars` (``$1,234.50``,
  ``-$3.00``, in sentences and tooltips): ``None`` is ``-``;
- :func:`money_ticks`: gridlines from $0 over ``[0, top]`` at a round step (1, 2 or 5 x a
  power of ten) and their labels: whole dollars where the step is (``$0, $20, $40``), cents
  where it is not (``$0, $0.50, $1.00, $1.50``), finer than a cent where the step is
  (``$0.005``), ``k`` from a thousand and ``M`` from a million (``$500, $1.0k, $1.5k``);
- :func:`no_negative_zero`: a report's data with every ``-0.0`` made ``0.0``;
- :func:`rate` (a price per hour, to the hundredth of a cent where it has them) and
  :func:`split_cents` (shares in cents that add up to their total).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

UNITS = ((Decimal(1_000_000), "M"), (Decimal(1000), "k"))  # the largest first
SCALE = {u: size for size, u in UNITS}


def cents(v: float) -> float:
    """``v`` rounded half up to the cent (``2.675`` is ``2.68``: the decimal a person reads,
    not the binary float below it), never ``-0.0``; not finite: unchanged."""
    if not math.isfinite(v):
        return v
    try:
        q = Decimal(repr(float(v))).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    except InvalidOperation:  # (beyond Decimal's precision: no cents to round)
        return float(v) + 0.0
    return float(q) + 0.0  # (-0.0 + 0.0 is 0.0)


def money(v: float | None) -> str:
    """``1,234.50``; ``-`` for None (no value), never ``-0.00``."""
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{cents(v):,.2f}"


def dollars(v: float | None) -> str:
    """``$1,234.50``, ``-$3.00``; ``-`` for None, never ``-$0.00``."""
    if v is None:
        return "-"
    text = money(v)
    return f"-${text[1:]}" if text.startswith("-") else f"${text}"


def no_negative_zero(data: Any) -> Any:
    """``data`` (dicts, lists, tuples of plain values) with every ``-0.0`` made ``0.0``."""
    if isinstance(data, float):
        return data + 0.0
    if isinstance(data, dict):
        return {k: no_negative_zero(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(no_negative_zero(v) for v in data)
    return data


# -- axes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """A gridline at ``value`` dollars, labelled ``label``."""

    value: float
    label: str


def _step(top: float, ticks: int) -> tuple[int, int]:
    """A round step (1, 2 or 5 x 10**exp) cutting [0, top] into about ``ticks``: (m, exp)."""
    raw = top / ticks
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 5):
        if m * 10.0 ** exp >= raw * (1 - 1e-12):
            return m, exp
    return 1, exp + 1


def _decimals(v: Decimal) -> int:
    """The decimals ``v`` needs (``1.50`` needs 1, ``2`` none)."""
    v = v.normalize()
    exp = v.as_tuple().exponent
    return max(0, -exp) if isinstance(exp, int) else 0


def money_ticks(top: float, ticks: int = 4) -> list[Tick]:
    """Gridlines 0, step, 2 x step, ... up to the first at or above ``top`` (at least one
    step; ``top`` of 0 or less is $1), each labelled with exactly its value (see the module
    docstring). Values are the decimal multiples of the step, not sums of floats."""
    top = top if math.isfinite(top) and top > 0 else 1.0
    m, exp = _step(top, ticks)
    step = Decimal(m).scaleb(exp)
    n = max(1, math.ceil(top / float(step) - 1e-9))
    values = [step * i for i in range(n + 1)]
    units = {v: next((u for size, u in UNITS if v >= size), "") for v in values[1:]}
    places: dict[str, int] = {}  # unit -> decimals: the same for every label of a unit
    for v, unit in units.items():
        need = _decimals(v / SCALE.get(unit, 1))
        places[unit] = max(places.get(unit, 0), need)
    if places.get("", 0) > 0:
        places[""] = max(2, places[""])  # cents, not $0.5
    out = [Tick(0.0, "$0")]
    for v, unit in units.items():
        out.append(Tick(float(v), f"${v / SCALE.get(unit, 1):,.{places[unit]}f}{unit}"))
    return out


def parse_label(label: str) -> float:
    """The dollars a tick label says (``$1.5k`` is 1500.0): the inverse of the labels."""
    text = label.strip().removeprefix("$").replace(",", "")
    scale = SCALE.get(text[-1:])
    if scale is not None:
        text = text[:-1]
    return float(Decimal(text) * (scale or 1))


def rate(v: float) -> str:
    """A price per hour: cents, or to the tenth of a cent where it has them (``0.918``,
    ``3.06``, ``32.7726``: at most 4 decimals)."""
    text = f"{v + 0.0:,.4f}"
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    return f"{whole}.{frac.ljust(2, '0')}"


def split_cents(total: float, parts: dict[str, float]) -> dict[str, float]:
    """``parts`` rounded to cents so that they add up to ``cents(total)`` (largest
    remainders get the cents left over), sorted by key; never ``-0.0``."""
    want = round(cents(total) * 100)
    raw = {k: v * 100 for k, v in sorted(parts.items())}
    floor = {k: math.floor(v) for k, v in raw.items()}
    left = want - sum(floor.values())
    order = sorted(raw, key=lambda k: (floor[k] - raw[k], k))  # largest remainder first
    for k in order[:max(0, left)]:
        floor[k] += 1
    return {k: cents(v / 100) for k, v in floor.items()}
