"""Per-job agreement between the real run and the simulator, and why the jobs that diverge
most did (where it can be told from the two histories)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.fidelity.compare import JobView, spearman


def _reason(real: JobView, sim: JobView, delta: float, near_s: float) -> str:
    if real.lost:
        return "heartbeat timing: its node's lease expired under it in the real run (LOST)"
    if real.evictions != sim.evictions:
        return (f"evicted differently (real: {', '.join(real.evictions) or 'none'}; "
                f"sim: {', '.join(sim.evictions) or 'none'})")
    if abs(delta) <= near_s:
        return (f"dispatch latency and cycle interval: within the measured delays "
                f"({near_s:.0f} s)")
    if real.decided is not None and sim.decided is not None \
            and abs(real.decided - sim.decided) <= near_s:
        return (f"dispatch latency: decided at the same time, its process ran "
                f"{max(real.dispatch_s, default=0.0):.0f} s after the decision")
    if real.nodes != sim.nodes and abs(delta) <= 10 * near_s:
        return ("a tie broken differently: placed on another node "
                f"(real {','.join(real.nodes)}, sim {','.join(sim.nodes)}), and what was free "
                "later differed")
    if abs(real.submit - sim.submit) > near_s:
        return f"submitted {real.submit - sim.submit:.0f} s late in the real run"
    return ("the queue ahead of it moved differently (an earlier divergence: other jobs "
            "started or ended at other times)")


def per_job(real: Mapping[str, JobView], sim: Mapping[str, JobView], near_s: float,
            top: int = 10) -> dict[str, Any]:
    """Agreement counts, Spearman's correlation of start times and the ``top`` jobs whose
    start differs most, each with its likely reason. ``near_s``: the delays measured in the
    real run (trace seconds): a difference within them is put down to them."""
    both = [i for i in real if i in sim and real[i].start is not None
            and sim[i].start is not None]
    rs = [real[i].start or 0.0 for i in both]
    ss = [sim[i].start or 0.0 for i in both]
    rows: list[dict[str, Any]] = []
    for i in both:
        r, s = real[i], sim[i]
        delta = (r.start or 0.0) - (s.start or 0.0)
        rows.append({"id": i, "start_real_s": round(r.start or 0.0, 1),
                     "start_sim_s": round(s.start or 0.0, 1), "delta_s": round(delta, 1),
                     "nodes_real": list(r.nodes), "nodes_sim": list(s.nodes),
                     "gpus_real": len(r.gpu_ids), "gpus_sim": len(s.gpu_ids),
                     "attempts_real": r.attempts, "attempts_sim": s.attempts,
                     "evictions_real": list(r.evictions), "evictions_sim": list(s.evictions),
                     "reason": _reason(r, s, delta, near_s)})
    rows.sort(key=lambda row: (-abs(row["delta_s"]), row["id"]))
    n = len(rows) or 1
    return {
        "compared": len(rows),
        "started_real_only": sum(1 for i in real if real[i].start is not None
                                 and (i not in sim or sim[i].start is None)),
        "started_sim_only": sum(1 for i in sim if sim[i].start is not None
                                and (i not in real or real[i].start is None)),
        "start_rank_correlation": None if (rho := spearman(rs, ss)) is None
        else round(rho, 4),
        "same_first_node": round(sum(r["nodes_real"] == r["nodes_sim"] for r in rows) / n, 4),
        "same_gpu_count": round(sum(r["gpus_real"] == r["gpus_sim"] for r in rows) / n, 4),
        "same_attempts": round(sum(r["attempts_real"] == r["attempts_sim"] for r in rows) / n,
                               4),
        "same_evictions": round(sum(r["evictions_real"] == r["evictions_sim"] for r in rows)
                                / n, 4),
        "start_delta_abs_mean_s": round(sum(abs(r["delta_s"]) for r in rows) / n, 1),
        "divergent": rows[:top],
        "rows": rows,
    }
