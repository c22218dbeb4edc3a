"""How long the providers' machines take to boot: a running estimate per offer, learned from
the machines Spillway rented (the rules; :class:`~broker.store.machines.Machines` serves them).

A machine's boot is the time from its launch request (the record's ``requested_at``: the
cycle that planned it) to its agent registering (the lifecycle pass that moves its record
READY), which is what the burst policy waits for (policies/burst/offers.py: a machine launched now
is ready ``boot_s`` later). Each offer keeps an exponentially weighted moving average of its
machines' boots (:data:`ALPHA`): the first observation replaces the seed, each later one
moves the estimate by ``ALPHA`` of the difference.

Until an offer has booted a machine its estimate is its seed: the ``boot_s`` the offer itself
declares in ``extra`` (a local provider's ``offer_extra``, the simulator's sites), else its
provider's ``boot_s`` setting, else the default of its provider's kind
(:data:`DEFAULT_BOOT_S`: seconds for ``local``, whose machines are processes on this host;
:data:`CLOUD_BOOT_S` for the clouds). The published offers reach the scheduler's snapshot with
``extra["boot_s"]`` set to the estimate (:func:`dressed`), so every policy that reads an
offer's boot (the burst decision time, the booting machines' readiness, a budget's expected
cost) uses what the machines actually took.

The estimate is written by whoever moves a record READY (the lifecycle's provisioner, one pass
at a time); two passes at once could lose one observation, which an average forgets anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from broker.model import Offer

ALPHA = 0.3  # the weight of the newest boot (about the last 6 boots count)
CLOUD_BOOT_S = 240.0  # a cloud machine's boot before any was seen: a VM start (tens of
#   seconds to minutes: Mao and Humphrey, IEEE CLOUD 2012) plus installing and starting the
#   agent (about a minute); an assumption, replaced by the first machine that boots
DEFAULT_BOOT_S: Mapping[str, float] = {
    "local": 5.0,  # a local process: the agent's start and registration
    "aws": CLOUD_BOOT_S,
    "gcp": CLOUD_BOOT_S,
    "libcloud": CLOUD_BOOT_S,
}


@dataclass(frozen=True)
class BootEstimate:
    """One offer's boot estimate: ``seconds``, from ``samples`` machines, the last seen at
    ``at``."""

    seconds: float
    samples: int
    at: float

    def observed(self, seconds: float, now: float) -> BootEstimate:
        """The estimate after one more machine booted in ``seconds``."""
        return BootEstimate(self.seconds + ALPHA * (seconds - self.seconds), self.samples + 1,
                            now)

    def to_json(self) -> str:
        return json.dumps([self.seconds, self.samples, self.at])

    @classmethod
    def from_json(cls, raw: str) -> BootEstimate:
        seconds, samples, at = json.loads(raw)
        return cls(float(seconds), int(samples), float(at))


def first(seconds: float, now: float) -> BootEstimate:
    """The estimate of an offer's first machine: what it took (the seed is left behind)."""
    return BootEstimate(float(seconds), 1, now)


def default_for(kind: str) -> float:
    """The seed of a provider kind that says nothing else."""
    return DEFAULT_BOOT_S.get(kind, CLOUD_BOOT_S)


def seed(offer: Offer, provider_seed: Callable[[str], float]) -> float:
    """An offer's boot before any of its machines was seen: its own ``boot_s``, else its
    provider's (``provider_seed(provider name)``)."""
    declared = offer.extra.get("boot_s")
    return float(declared) if declared is not None else provider_seed(offer.provider)


def dressed(offers: Sequence[Offer], estimates: Mapping[str, BootEstimate],
            provider_seed: Callable[[str], float]) -> list[Offer]:
    """``offers`` with ``extra["boot_s"]`` set to each one's estimate (or seed), and
    ``extra["boot_samples"]`` to the machines it learned from (0: the seed)."""
    out = []
    for o in offers:
        est = estimates.get(o.id)
        boot = est.seconds if est is not None else seed(o, provider_seed)
        n = est.samples if est is not None else 0
        if o.extra.get("boot_s") != boot or o.extra.get("boot_samples") != n:
            o = replace(o, extra={**o.extra, "boot_s": boot, "boot_samples": n})
        out.append(o)
    return out
