"""The fidelity run's submitter: a process of its own that submits each job of a plan at its
arrival time, as a user would (``python -m broker.fidelity.submitter PLAN OUT``).

PLAN (JSON): ``{"redis_url", "t0" (epoch seconds of arrival 0), "jobs": [[trace id,
arrival s, spec], ...]}`` sorted by arrival. Jobs arriving at the same instant go in one
``submit_many``. OUT (JSON, written when done): trace id -> ``[job id, submitted at]``, and
``lag_s``: how late each submission was against its arrival time.
"""

from __future__ import annotations

import json
import sys
import time
from itertools import groupby
from pathlib import Path
from typing import Any

from broker.client import Client
from broker.model import JobSpec


def submit_plan(plan: dict[str, Any]) -> dict[str, Any]:
    client = Client(plan["redis_url"])
    t0 = float(plan["t0"])
    ids: dict[str, list[Any]] = {}
    lags: list[float] = []
    try:
        for at, group in groupby(plan["jobs"], key=lambda row: float(row[1])):
            rows = list(group)
            rest = t0 + at - time.time()
            if rest > 0:
                time.sleep(rest)  # the arrival time itself, not a synchronisation
            jobs = client.submit_many([JobSpec(**row[2]) for row in rows])
            lags.append(max(0.0, time.time() - (t0 + at)))
            for row, job in zip(rows, jobs):
                ids[row[0]] = [job.id, job.submitted_at]
    finally:
        client.close()
    return {"ids": ids, "lag_s": lags}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m broker.fidelity.submitter PLAN.json OUT.json", file=sys.stderr)
        return 2
    plan = json.loads(Path(argv[0]).read_text())
    out = submit_plan(plan)
    tmp = Path(argv[1] + ".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
