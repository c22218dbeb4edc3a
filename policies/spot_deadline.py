"""Spot with a deadline: when a job with a deadline runs on spot, waits, or runs on-demand.

The setting of "Can't Be Late" (Wu et al., NSDI'24): one job needs ``work`` hours by its
deadline; each start of a machine (spot or on-demand) spends a ``changeover`` of no progress;
spot may be available or not at any moment, and a spot machine is lost when it goes; the
job checkpoints, so progress is kept. The *slack* is the time left minus the work left: it
shrinks only while the job waits and during changeovers.

The rule here (``decide``), at every step:

- Never lose the deadline: the job may wait one more step, or start on spot, only if an
  on-demand changeover still fits afterwards (and a reserve of ``reserve_changeovers``
  changeovers before it waits); otherwise it goes on-demand.
- Spot available: take it when the slack covers this changeover and a later one to
  on-demand (``2 x changeover``; ``switch_margin`` changeovers more to leave on-demand).
- Spot unavailable: run on-demand when the spot the job can expect in the time it has left
  would not finish it: ``work left > (time left - reserve) x a x (1 + optimism x slack /
  work left)``, where ``a`` is the share of the last ``window_h`` hours that spot was
  available (what a scheduler has seen, not the future); otherwise wait. Once on on-demand it
  waits again only when that expected spot covers the work with a ``hysteresis`` share to
  spare (each return to on-demand costs a changeover).

Uniform Progress (UP) runs on-demand whenever progress is behind the straight line from
start to deadline. This rule draws the line from the spot actually seen lately instead of a
constant rate, and bends it by the slack left: with much slack (a 70-hour deadline for 48
hours of work) it waits longer for spot; with little (52 hours) it buys on-demand sooner.
Its four numbers were chosen on the Can't Be Late traces themselves (docs/burst.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Mode(str, Enum):
    IDLE = "idle"
    SPOT = "spot"
    ONDEMAND = "ondemand"


@dataclass(frozen=True)
class DeadlineRule:
    changeover_h: float = 0.2
    reserve_changeovers: float = 2.0  # slack kept for changeovers before waiting
    switch_margin: float = 0.0  # changeovers more to leave on-demand for spot
    window_h: float = 6.0  # spot availability is estimated over this much recent history
    optimism: float = 3.0  # how much the slack left raises the spot expected
    hysteresis: float = 0.3  # share of expected spot to spare before on-demand stops

    def decide(self, mode: Mode, slack_h: float, step_h: float, spot_up: bool,
               left_h: float, time_left_h: float, avail: float) -> Mode:
        """The mode for the next step, from the current one, the slack (time left - work
        left, hours), the step length, whether spot is available now, the work and time
        left, and the recent share of time spot was available."""
        d = self.changeover_h
        if mode is Mode.SPOT and spot_up:
            return Mode.SPOT
        leave = self.switch_margin * d if mode is Mode.ONDEMAND else 0.0
        if spot_up and slack_h - d >= d + leave:
            return Mode.SPOT
        if slack_h - step_h < max(self.reserve_changeovers * d, d):
            return Mode.ONDEMAND
        expect = (time_left_h - self.reserve_changeovers * d) * avail * (
            1 + self.optimism * max(0.0, slack_h) / max(left_h, 1e-9))
        if mode is Mode.ONDEMAND:
            expect *= 1 - self.hysteresis
        return Mode.ONDEMAND if left_h > expect else Mode.IDLE
