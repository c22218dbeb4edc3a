"""Where one class's emissions come from in a simulation: GPU model, clean or dirty hours,
job length (a measuring aid, run by hand).

``python -m tests.reliability.carbon_split --cluster FILE --policy P --seed N
[--busiest-days 14] [--target-load 1.1] [--cls low]`` runs one simulation as ``spillway
simulate`` does (no invariant checker) and prints JSON over the runs of the class's jobs:
``kg``, ``gpu_h``, ``kwh``, ``kwh_per_gpu_h``, ``g_per_kwh`` (the energy-weighted intensity),
``clean_share`` (the share of GPU-hours in clean hours: an hour is clean when its intensity is
among the cleanest 8 of the 24 hours around it), GPU-hours ``by_model`` and ``kg`` and
``gpu_h`` ``by_length`` (the job's runtime: under 4 hours, a day, 4 days, longer).
docs/carbon.md split the busiest 14 days this way.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from typing import Any

from broker.energy.model import emissions_kg
from tests.reliability.sim_misses import add_sim_args, simulation

_HOUR = 3600.0
_BUCKETS = ((4 * _HOUR, "<4h"), (86400.0, "<1d"), (4 * 86400.0, "<4d"), (math.inf, ">=4d"))


def split(sim: Any, job_of_piece: list[str], cls: str) -> dict[str, Any]:
    """The breakdown of ``cls``'s run pieces (``sim.pieces``, whose jobs are
    ``job_of_piece``) after ``sim.run()``."""
    energy = sim.energy
    model = energy.energy.model
    _, used = energy.zone_of("onprem")
    ref = "V100-32GB"  # any model: the intensity is the ratio of emissions to energy
    ref_kw = model.power_kw(1, ref) * model.site_pue("onprem")
    hourly: dict[int, float] = {}

    def g_per_kwh(h: int) -> float:
        if h not in hourly:
            start = energy.origin + h * _HOUR
            kg = emissions_kg(model, energy.source, used, "onprem", start, start + _HOUR, 1, ref)
            hourly[h] = kg * 1000.0 / ref_kw
        return hourly[h]

    def clean(h: int) -> bool:
        return g_per_kwh(h) <= sorted(g_per_kwh(x) for x in range(h - 12, h + 12))[7]

    out: dict[str, float] = defaultdict(float)
    by_model: dict[str, float] = defaultdict(float)
    by_length: dict[str, list[float]] = {name: [0.0, 0.0] for _, name in _BUCKETS}
    durations = {r.id: r.duration_s for r in sim.records.values()}
    for piece, pcls, job in zip(sim.pieces, sim.piece_classes, job_of_piece):
        a, b = piece.start_s, piece.end_s
        if pcls != cls or b <= a or piece.gpus <= 0:
            continue
        _, src_zone = energy.zone_of(piece.site)
        kg = emissions_kg(model, energy.source, src_zone, piece.site, energy.origin + a,
                          energy.origin + b, piece.gpus, piece.model)
        gpu_h = piece.gpus * (b - a) / _HOUR
        out["kg"] += kg
        out["gpu_h"] += gpu_h
        out["kwh"] += model.power_kw(piece.gpus, piece.model) * model.site_pue(piece.site) \
            * (b - a) / _HOUR
        by_model[piece.model] += gpu_h
        for h in range(int(a // _HOUR), math.ceil(b / _HOUR)):
            overlap = min(b, (h + 1) * _HOUR) - max(a, h * _HOUR)
            if overlap > 0:
                out["clean_gpu_h" if clean(h) else "dirty_gpu_h"] += piece.gpus * overlap / _HOUR
        name = next(n for limit, n in _BUCKETS if durations.get(job, 0.0) < limit)
        by_length[name][0] += kg
        by_length[name][1] += gpu_h
    total = out["clean_gpu_h"] + out["dirty_gpu_h"]
    return {
        "class": cls,
        "kg": round(out["kg"], 1),
        "gpu_h": round(out["gpu_h"], 1),
        "kwh": round(out["kwh"], 1),
        "kwh_per_gpu_h": round(out["kwh"] / out["gpu_h"], 4) if out["gpu_h"] else None,
        "g_per_kwh": round(1000.0 * out["kg"] / out["kwh"], 1) if out["kwh"] else None,
        "clean_share": round(out["clean_gpu_h"] / total, 4) if total else None,
        "by_model": {m: round(v, 1) for m, v in sorted(by_model.items())},
        "by_length": {n: {"kg": round(kg, 1), "gpu_h": round(h, 1)}
                      for n, (kg, h) in by_length.items()},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sim_args(ap)
    ap.add_argument("--cls", default="low", help="the class to split (default low)")
    args = ap.parse_args(argv)
    sim = simulation(args)
    job_of_piece: list[str] = []
    for name in ("_end", "_stopped"):  # the engine's two places that record a piece
        recorded = getattr(sim, name)

        def noting(job_id: str, attempt: int, now: float, _recorded: Any = recorded) -> None:
            before = len(sim.pieces)
            _recorded(job_id, attempt, now)
            job_of_piece.extend([job_id] * (len(sim.pieces) - before))

        setattr(sim, name, noting)
    sim.run()
    print(json.dumps(split(sim, job_of_piece, args.cls), indent=1))


if __name__ == "__main__":
    main()
