"""Why a job is still pending: the reasons the cycle returns (``spillway explain`` shows them).

Reasons are data, not exceptions: a code (``Resources``, ``Priority``, ``Reservation``,
``FairShare``, ``NoFeasibleNode``, ``Preempting``, ``Quota``, ``DeferredForCarbon``,
``BudgetExhausted``, ``PolicyError``, or an admission refusal) and a sentence for people.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePath

from broker.cycle.plan import POLICY_ERROR
from broker.model import Job, Reason, Resources
from policies.cycle import Cycle

FULL = Reason("Resources", "no GPU is free; waiting behind higher-ranked jobs")
FIFO = Reason("Priority", "strict first-come-first-served: waiting for an earlier job to start")
#: a deferrable job waits for a cleaner window within its deadline (policies/carbon/defer.py builds
#: the sentence: until when, and the forecast intensities)
DEFERRED_FOR_CARBON = "DeferredForCarbon"




def policy_error(role: str, name: str, error: str) -> Reason:
    """The reason of a job set aside because the ``role`` policy ``name`` raised an exception
    (``error``: :func:`exception_text`) while deciding about it."""
    return Reason(POLICY_ERROR, f"the {role} policy {name!r} failed on this job ({error}); it "
                                "is set aside for this cycle while the others are scheduled, "
                                "and tried again in the next; operators see it in `spillway "
                                "status` and the scheduler's metrics")


def exception_text(exc: BaseException) -> str:
    """An exception for a sentence: its type, its message (cut at 200 characters) and the
    file and line it was raised at (``ZeroDivisionError: float division by zero at
    policies/order/orderings.py:177``)."""
    text = str(exc)
    out = type(exc).__name__ + (f": {text[:200]}" if text else "")
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        path = PurePath(tb.tb_frame.f_code.co_filename)
        out += f" at {'/'.join(path.parts[-2:])}:{tb.tb_lineno}"
    return out


def dur(seconds: float) -> str:
    """A duration for a sentence: 45s, 12m, 3.5h, or unknown."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def types(res: Resources) -> str:
    what = "/".join(res.gpu_types) if res.gpu_types else "any type"
    if res.mig_profile:
        what = f"MIG {res.mig_profile} ({what})"
    if res.min_gpu_memory_gb:
        what += f", >= {res.min_gpu_memory_gb:g} GB"
    return what


def _on_nodes(res: Resources) -> str:
    return f" on {res.nodes} nodes" if res.nodes > 1 else ""


def infeasible(res: Resources) -> Reason:
    return Reason(
        "NoFeasibleNode",
        f"no node that is up has {res.gpus} GPU(s) of {types(res)}{_on_nodes(res)}, even "
        "counting GPUs in use, and no cloud offer fits; check `spillway nodes` and the job's "
        "gpus / gpu_types / min_gpu_memory_gb",
    )


def head(cycle: Cycle, res: Resources) -> Reason:
    """The first blocked job: where and when its reservation is, if it has one."""
    what = f"{res.gpus} GPU(s) of {types(res)}{_on_nodes(res)}"
    sh = cycle.shadow
    if sh is None:
        return Reason("Resources", f"first in line; waiting for {what} to free up")
    when = "now" if sh.reservation.start_at <= cycle.now else (
        f"in ~{dur(sh.reservation.start_at - cycle.now)}")
    return Reason("Resources", f"first in line, holds the reservation: {what} on "
                               f"{', '.join(sh.reservation.node_ids)} expected free {when}")


@dataclass
class Weighed:
    """A cycle's memo of what its order weighed (``cycle.memo(Weighed)``): the fair-share
    factors, set by an order that weighs fair share (empty: it weighed none)."""

    fairshare: dict[str, float] = field(default_factory=dict)


def blocked(cycle: Cycle, job: Job, long: bool) -> Reason:
    """A later blocked job: it would delay the reservation, its team is over its share, or it
    waits behind higher-ranked jobs."""
    res = job.res
    if long and cycle.index.find(res, job.spec.sites) is not None:
        assert cycle.shadow is not None
        return Reason("Reservation",
                      f"would fit now but would delay the reservation of "
                      f"{cycle.shadow.reservation.job_id} (its estimate ends after "
                      f"{dur(cycle.shadow.reservation.start_at - cycle.now)})")
    fs = cycle.memo(Weighed).fairshare  # set by an order that weighs fair share
    if fs.get(job.team, 1.0) < 0.5:
        return Reason("FairShare", f"team {job.team} used more than its share lately; "
                                   f"waiting behind other teams' jobs for {res.gpus} GPU(s) "
                                   f"of {types(res)}")
    return Reason("Priority", f"waiting behind higher-ranked jobs for {res.gpus} GPU(s) of "
                              f"{types(res)}{_on_nodes(res)}")


def budget_exhausted(team: str, cap: float, committed: float, need: float) -> Reason:
    """A burst refused by a team's hard cap (policies/burst/budget.py), and by how much."""
    return Reason("BudgetExhausted",
                  f"team {team}'s hard budget is ${cap:,.2f}: ${committed:,.2f} is spent or "
                  f"reserved, and bursting this job is expected to cost ${need:,.2f}; over "
                  f"the cap by ${committed + need - cap:,.2f}")
