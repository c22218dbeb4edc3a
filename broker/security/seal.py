"""A job's spec, sealed where no agent can write it.

An agent's Redis user must write job records (its reports are compare-and-set scripts on
``sw:job:<id>``; broker/security/acl.py), and a record holds its job's spec. So the spec is
also kept, once, at submit, in ``sw:spec:<id>``: written by whoever submits (the API server,
an operator's client; ``SET NX``, never changed), read-only to agents. Before a job part
starts, its agent compares the spec it is about to run with the sealed one; a job whose
record's spec was changed (by a compromised agent, say) or that has no seal (a record an agent
made up) is refused: it fails with a StartFailed report saying so, and nothing runs.

Deleted with the job's record when it is archived (broker/store/redis.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from broker.model import Job, JobSpec

SEAL_KEY = "spec:"  # after the store's prefix: sw:spec:<job id>


def seal_key(prefix: str, job_id: str) -> str:
    return f"{prefix}{SEAL_KEY}{job_id}"


def canonical(spec: JobSpec) -> bytes:
    """The spec as JSON with sorted keys: the same bytes for the same spec."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True,
                      separators=(",", ":")).encode()


def write(pipe: Any, prefix: str, jobs: Sequence[Job]) -> None:
    """Queue on ``pipe`` the seal of each new job (SET NX: a seal never changes)."""
    for job in jobs:
        pipe.set(seal_key(prefix, job.id), canonical(job.spec), nx=True)


def _same(raw: bytes, spec: JobSpec) -> bool:
    """Whether a seal holds this spec. The seal is read back through the JobSpec model, so a
    seal written by an older version (without a field added since, which takes its default)
    still matches; a seal that no longer validates does not."""
    try:
        return JobSpec.model_validate(json.loads(raw)) == spec
    except ValueError:  # (pydantic's ValidationError is a ValueError; so is bad JSON)
        return False


def seal_existing(client: Any, prefix: str, jobs: Sequence[Job], marker: str,
                  now: float) -> int:
    """Seal, once per store, the live jobs queued before sealing existed (an upgrade), so
    that they are not refused as unsealed. Runs only while ``marker`` is unset (SET NX):
    later, a job without a seal is one no client submitted, and stays refused. Returns how
    many jobs were sealed."""
    if not client.set(marker, now, nx=True):
        return 0
    pipe = client.pipeline(transaction=False)
    write(pipe, prefix, jobs)
    return sum(1 for ok in pipe.execute() if ok)


def problems(client: Any, prefix: str, jobs: Sequence[Job]) -> dict[str, str]:
    """Job id -> why it must not run, for the jobs whose spec is not the sealed one."""
    if not jobs:
        return {}
    return judge(jobs, client.mget([seal_key(prefix, j.id) for j in jobs]))


def judge(jobs: Sequence[Job], sealed: Sequence[bytes | None]) -> dict[str, str]:
    """Job id -> why it must not run, given each job's sealed spec as read (None: none)."""
    out: dict[str, str] = {}
    for job, raw in zip(jobs, sealed):
        if raw is None:
            out[job.id] = ("SpecNotSealed: the job has no sealed spec (it was not submitted "
                           "through the client or the API); not run")
        elif not _same(raw, job.spec):
            out[job.id] = ("SpecTampered: the job's spec differs from the one submitted "
                           "(its record was changed after submit); not run")
    return out
