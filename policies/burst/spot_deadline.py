"""Spot with a deadline: when a job with a deadline runs on spot, waits, or runs on-demand.

The setting of "Can't Be Late" (Wu et al., NSDI'24): one job needs ``work`` hours by its
deadline; each start of a machine (spot or on-demand) spends a ``changeover`` of no progress;
spot may be available or not at any moment, and a spot machine is lost when it goes; the
job checkpoints, so progress is kept. The *slack* is the time left minus the work left: it
shrinks only while the job waits and during changeovers.

The rule (``DeadlineRule.decide``) sees only the past: ``SpotMarket`` keeps what was seen of
the market (the share of recent time spot was up, and the lengths of the spot runs and gaps
of the last ``history_h`` hours), and the rule knows the job, the deadline, the changeover and
the two prices. At every step:

1. Never lose the deadline. A spot machine (or a wait) is only ever started with a changeover
   to on-demand still inside the slack; the job waits one more step only while the slack after
   it still holds ``reserve_changeovers`` changeovers, else it runs on-demand (``must_run``).
2. On spot while spot lasts. From waiting, take spot whenever the slack covers its changeover
   and a later one to on-demand.
3. From on-demand, go back to spot only for a spot run worth two changeovers: the run's
   expected remaining length given its age (from the runs seen, which are heavy-tailed: a run
   that has lasted is likely to last) must save more than its two changeovers cost (their
   progress bought back on on-demand), and the slack must budget it: with ``n`` spot runs
   expected in the time left, the rule takes the runs at least as old as the youngest age at
   which ``n x (share of runs reaching that age) x 2 changeovers`` fits in the slack
   (``return_age``). Scarce slack so goes to the runs likely to be long.
4. Without spot, wait or run on-demand: run on-demand when the spot the job can expect in
   the time left would not finish it: ``work left > (time left - reserve) x a x (1 + optimism
   x slack / work left)``, ``a`` the share of the last ``window_h`` hours spot was up; once on
   on-demand, wait again only with a ``hysteresis`` share to spare.
5. But wait out a gap likely to end soon (``gap_may_end``): if, for some wait, the chance that
   the gap ends within it (from the gaps seen, given the gap's age) times the on-demand
   changeover saved exceeds the slack the wait is expected to take, at its price, wait this
   step (and weigh it again at the next). The price of an hour of slack is the larger of the
   spot it buys at the end (``a x`` the price difference) and the gain per slack hour of the
   spot runs step 3 had to refuse.

Uniform Progress (UP) runs on-demand whenever progress is behind the straight line from start
to deadline and returns to spot the moment it is back. This rule draws the line from the spot
seen lately and bends it by the slack (step 4), returns to spot only for runs worth their
changeovers within a slack budget (step 3) and waits out gaps likely to be short (step 5).
The four numbers of step 4 were chosen on the Can't Be Late traces themselves (docs/burst.md);
steps 3 and 5 add none but the week of history, the 3-hour age grid and the prior of
``SpotMarket``: their thresholds come from the prices, the changeover and the runs seen.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum


class Mode(str, Enum):
    IDLE = "idle"
    SPOT = "spot"
    ONDEMAND = "ondemand"


@dataclass(frozen=True)
class RunStats:
    """What the runs seen say: mean spot run and gap (hours), and on an age grid (multiples
    of the step) the share of spot runs and of gaps that outlive each age and the expected
    remaining length of a spot run of that age."""

    mean_up_h: float
    mean_down_h: float
    ages_h: tuple[float, ...]
    up_surv: tuple[float, ...]
    up_rest_h: tuple[float, ...]
    down_surv: tuple[float, ...]


def _grid(runs: list[float], ages: list[float], weight: float,
          prior_h: float) -> tuple[list[float], list[float]]:
    """Survival and mean remaining length at each age, the runs seen plus ``weight``
    pseudo-runs with exponential lengths of mean ``prior_h`` (memoryless: their remaining
    mean stays ``prior_h``)."""
    surv, rest = [], []
    for a in ages:
        longer = [r - a for r in runs if r > a + 1e-9]
        pseudo = weight * math.exp(-a / prior_h)
        surv.append((len(longer) + pseudo) / (len(runs) + weight))
        rest.append((sum(longer) + pseudo * prior_h) / (len(longer) + pseudo))
    return surv, rest


class SpotMarket:
    """What one scheduler has seen of one spot market, fed one step at a time."""

    def __init__(self, step_h: float, window_h: float = 6.0, history_h: float = 168.0,
                 prior_run_h: float = 1.0, prior_weight: float = 2.0,
                 max_age_h: float = 3.0) -> None:
        if step_h <= 0:
            raise ValueError(f"step_h must be > 0 hours, got {step_h}")
        self.step_h = step_h
        self.window = max(1, round(window_h / step_h))
        self.history = max(1, round(history_h / step_h))
        self.prior_run_h, self.prior_weight = prior_run_h, prior_weight
        self.ages = [j * step_h for j in range(int(max_age_h / step_h) + 1)]
        self.recent: deque[bool] = deque()
        self.recent_up = 0
        self.runs: deque[tuple[int, float, bool]] = deque()  # (ended at step, hours, up)
        self.up: bool | None = None
        self.age = 0  # steps the current run has lasted, this one included
        self.i = 0
        self.next_s = math.inf  # when the next step is observed (set by whoever feeds it)
        self._stats: RunStats | None = None

    def copy(self) -> SpotMarket:
        """An independent copy (to replay several futures from one past)."""
        new = object.__new__(SpotMarket)
        new.__dict__.update(self.__dict__)
        new.recent, new.runs = deque(self.recent), deque(self.runs)
        return new

    def observe(self, up: bool) -> None:
        self.recent.append(up)
        self.recent_up += up
        if len(self.recent) > self.window:
            self.recent_up -= self.recent.popleft()
        if up is not self.up:
            if self.up is not None:
                self.runs.append((self.i, self.age * self.step_h, self.up))
                self._stats = None
            self.up, self.age = up, 0
        self.age += 1
        self.i += 1
        while self.runs and self.runs[0][0] < self.i - self.history:
            self.runs.popleft()
            self._stats = None

    def share(self) -> float:
        """The share of the last ``window_h`` hours spot was up (0.5 before any)."""
        return self.recent_up / len(self.recent) if self.recent else 0.5

    def age_h(self) -> float:
        """How long the current run (up or down) has lasted, this step included."""
        return self.age * self.step_h

    def stats(self) -> RunStats:
        if self._stats is None:
            ups = [h for _, h, u in self.runs if u]
            downs = [h for _, h, u in self.runs if not u]
            k, prior = self.prior_weight, self.prior_run_h
            up_surv, up_rest = _grid(ups, self.ages, k, prior)
            down_surv, _ = _grid(downs, self.ages, k, prior)
            self._stats = RunStats((sum(ups) + k * prior) / (len(ups) + k),
                                   (sum(downs) + k * prior) / (len(downs) + k),
                                   tuple(self.ages), tuple(up_surv), tuple(up_rest),
                                   tuple(down_surv))
        return self._stats


@dataclass(frozen=True)
class DeadlineRule:
    changeover_h: float = 0.2
    spot_price: float = 0.918
    ondemand_price: float = 3.06
    reserve_changeovers: float = 2.0  # slack kept for changeovers before waiting
    window_h: float = 6.0  # spot availability is estimated over this much recent history
    optimism: float = 3.0  # how much the slack left raises the spot expected
    hysteresis: float = 0.3  # share of expected spot to spare before on-demand stops
    history_h: float = 168.0  # spot runs and gaps are counted over this much history

    def market(self, step_h: float) -> SpotMarket:
        return SpotMarket(step_h, self.window_h, self.history_h)

    def must_run(self, slack_h: float, step_h: float) -> bool:
        """No more waiting: after one more step the slack would not hold the reserve (and
        never less than the one changeover an on-demand start needs)."""
        return slack_h - step_h < max(self.reserve_changeovers, 1.0) * self.changeover_h

    def _gain(self, rest_h: float) -> float:
        """What going from on-demand to a spot run of ``rest_h`` more hours saves: the spot
        hours at the price difference, less the two changeovers' progress bought back on
        on-demand (the spot one, and the one back to on-demand)."""
        return (self.ondemand_price - self.spot_price) * rest_h \
            - 2 * self.changeover_h * self.ondemand_price

    def _budget(self, slack_h: float, time_left_h: float,
                st: RunStats) -> tuple[float, float]:
        """(youngest age of a spot run worth leaving on-demand for within the slack, inf if
        none; the price of an hour of slack that budget sets: the gain per slack hour of the
        runs it refuses, 0 if it refuses none worth having)."""
        d = self.changeover_h
        runs = time_left_h / (st.mean_up_h + st.mean_down_h)
        budget = slack_h - d  # one changeover to on-demand is never spent on returns
        first = None
        for j, age in enumerate(st.ages_h):
            if self._gain(st.up_rest_h[j]) <= 0:
                continue
            if first is None:
                first = j
            if runs * st.up_surv[j] * 2 * d <= budget:
                price = 0.0 if j == first else self._gain(st.up_rest_h[j - 1]) / (2 * d)
                return age, max(0.0, price)
        return math.inf, max(0.0, self._gain(st.up_rest_h[-1]) / (2 * d))

    def return_age(self, slack_h: float, time_left_h: float, market: SpotMarket) -> float:
        """How old a spot run must be before the job leaves on-demand for it (step 3)."""
        return self._budget(slack_h, time_left_h, market.stats())[0]

    def gap_may_end(self, slack_h: float, step_h: float, time_left_h: float,
                    market: SpotMarket) -> bool:
        """Step 5: keep waiting because the gap is likely to end soon: for some wait of k
        steps (within the age grid and the slack above the reserve), the chance the gap ends
        within them times the changeover saved exceeds the slack they are expected to take,
        at its price (``down_surv`` gives both)."""
        st = market.stats()
        x = market.age - 1  # whole steps the gap had lasted before this one
        if x + 1 >= len(st.ages_h) or st.down_surv[x] <= 0:
            return False
        price = max(market.share() * (self.ondemand_price - self.spot_price),
                    self._budget(slack_h, time_left_h, st)[1], 1e-3)
        d = self.changeover_h
        saved = self.ondemand_price * d + price * d
        room = (slack_h - max(self.reserve_changeovers, 1.0) * d) / step_h
        last = min(len(st.ages_h) - 1, x + max(1, int(room)))
        waited = 0.0
        for k in range(x + 1, last + 1):
            waited += st.down_surv[k - 1] / st.down_surv[x]
            if (1 - st.down_surv[k] / st.down_surv[x]) * saved > price * step_h * waited:
                return True
        return False

    def decide(self, mode: Mode, slack_h: float, step_h: float, spot_up: bool,
               left_h: float, time_left_h: float, market: SpotMarket) -> Mode:
        """The mode for the next step, from the current one, the slack (time left - work
        left, hours), the step length, whether spot is available now, the work and time
        left, and what was seen of the market (``market`` has observed this step)."""
        d = self.changeover_h
        if mode is Mode.SPOT and spot_up:
            return Mode.SPOT
        if spot_up and slack_h >= 2 * d:
            if mode is not Mode.ONDEMAND:
                return Mode.SPOT
            if market.age_h() >= self.return_age(slack_h, time_left_h, market) - 1e-9:
                return Mode.SPOT
            return Mode.ONDEMAND
        if spot_up or self.must_run(slack_h, step_h):
            return Mode.ONDEMAND
        a = market.share()
        expect = (time_left_h - self.reserve_changeovers * d) * a * (
            1 + self.optimism * max(0.0, slack_h) / max(left_h, 1e-9))
        if mode is Mode.ONDEMAND:
            expect *= 1 - self.hysteresis
        if left_h <= expect:
            return Mode.IDLE
        if mode is Mode.IDLE and self.gap_may_end(slack_h, step_h, time_left_h, market):
            return Mode.IDLE
        return Mode.ONDEMAND
