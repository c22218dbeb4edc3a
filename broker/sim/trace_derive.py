"""What a trace lacks, derived: time limits (the f-model, rounded to usual values), priority
classes (drawn with :data:`CLASS_SHARES`) and gang shapes; broker/sim/trace.py's docstring says
how. Every draw depends only on ``(seed, job id)``.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Sequence

from broker.config.core import DEFAULT_CLASSES, PriorityClass

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY

USUAL_LIMITS_S: tuple[float, ...] = (
    1 * HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 12 * HOUR, 1 * DAY, 2 * DAY, 3 * DAY, WEEK,
)
OVERESTIMATE_F = 5.0  # the f-model's largest overestimation factor
CLASS_SHARES: tuple[tuple[str, float], ...] = (
    ("critical", 0.02), ("high", 0.10), ("normal", 0.58), ("low", 0.30),
)


def gang_shape(total_gpus: int, max_gpus_per_node: int) -> tuple[int, int]:
    """``(nodes, gpus per node)`` for a job of ``total_gpus`` on nodes of ``max_gpus_per_node``."""
    if total_gpus <= max_gpus_per_node:
        return 1, total_gpus
    nodes = -(-total_gpus // max_gpus_per_node)
    while total_gpus % nodes:
        nodes += 1
    return nodes, total_gpus // nodes


def uniforms(seed: int, job_id: str) -> tuple[float, float]:
    """Two independent uniforms in [0, 1) that depend only on ``(seed, job_id)``."""
    digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=16).digest()
    return (int.from_bytes(digest[:8], "big") / 2.0**64,
            int.from_bytes(digest[8:], "big") / 2.0**64)


def round_limit(seconds: float) -> float:
    """The smallest usual limit >= ``seconds``; beyond 7 days, whole weeks."""
    i = bisect.bisect_left(USUAL_LIMITS_S, seconds)
    if i < len(USUAL_LIMITS_S):
        return USUAL_LIMITS_S[i]
    return math.ceil(seconds / WEEK) * WEEK


def derived_time_limit(duration_s: float, job_id: str, seed: int = 0,
                       f_max: float = OVERESTIMATE_F) -> float:
    """The user's time limit for a job that ran ``duration_s``: f-model factor, then rounding."""
    u = uniforms(seed, job_id)[0]
    return round_limit(duration_s * (1.0 + u * (f_max - 1.0)))


def class_picker(classes: Sequence[PriorityClass]) -> tuple[Callable[[float], str], str]:
    """A function from a uniform in [0, 1) to a class name, and a note describing it."""
    names = {c.name for c in classes}
    shares = [(n, s) for n, s in CLASS_SHARES if n in names]
    if not shares:
        ranked = sorted(classes, key=lambda c: -c.rank)
        only = ranked[len(ranked) // 2].name
        return (lambda _u: only), f"every job in class {only} (no default class names)"
    total = sum(s for _, s in shares)
    bounds: list[float] = []
    acc = 0.0
    for _, s in shares:
        acc += s / total
        bounds.append(acc)
    labels = [n for n, _ in shares]
    last = len(labels) - 1

    def pick(u: float) -> str:
        return labels[min(bisect.bisect_right(bounds, u), last)]

    text = ", ".join(f"{n} {s / total:.0%}" for n, s in shares)
    return pick, text


def derived_class(job_id: str, seed: int = 0,
                  classes: Sequence[PriorityClass] = DEFAULT_CLASSES) -> str:
    """The drawn class of one job (see the module docstring)."""
    return class_picker(classes)[0](uniforms(seed, job_id)[1])
