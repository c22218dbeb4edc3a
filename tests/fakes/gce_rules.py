"""The checks the fake Compute endpoint (tests/fakes/gce.py) makes, as Compute makes them, and
the operation errors it answers with.

Patterns from the Compute REST reference: a resource name is
``[a-z]([-a-z0-9]{0,61}[a-z0-9])?``; a label key starts with a lower-case letter and holds
lower-case letters, digits, ``_`` and ``-`` (at most 63 characters), a value the same but may be
empty or start with a digit. Filters (``aggregatedList``): only ``FIELD = VALUE`` terms on
``name``, ``status`` or ``labels.KEY``, joined by ``AND`` or a space, are understood here; any
other expression is refused instead of being ignored.
"""

from __future__ import annotations

import re
from typing import Any

NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
IMPLICIT_GPUS = ("a2-", "a3-", "a4-", "a4x-", "g2-")
_TERM = re.compile(r"\(?\s*(name|status|labels\.[a-z0-9_-]+)\s*(=|eq)\s*\"?([^\s\")]*)\"?\s*\)?")


def check_instance(body: dict[str, Any]) -> None:
    """ValueError naming the field, as Compute's 400 ``invalid`` answer does."""
    name = body.get("name", "")
    if not NAME.fullmatch(name):
        raise ValueError(f"Invalid value for field 'resource.name': '{name}'. Must be a match "
                         f"of regex '{NAME.pattern}'")
    if not body.get("machineType"):
        raise ValueError("Invalid value for field 'resource.machineType': ''.")
    for key, value in body.get("labels", {}).items():
        if not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(value):
            raise ValueError(f"Invalid value for field 'resource.labels': '{key}={value}'. "
                             "Label keys and values may hold lower-case letters, digits, '_' "
                             "and '-'")
    machine = body["machineType"].rsplit("/", 1)[-1]
    gpus = body.get("guestAccelerators", [])
    sched = body.get("scheduling", {})
    if gpus and machine.startswith(IMPLICIT_GPUS):
        raise ValueError(f"Invalid value for field 'resource.guestAccelerators': machine type "
                         f"{machine} comes with its accelerators; do not add more")
    if (gpus or machine.startswith(IMPLICIT_GPUS)) \
            and sched.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        raise ValueError("Invalid value for field 'resource.scheduling.onHostMaintenance': "
                         "'MIGRATE'. Instances with guest accelerators do not support live "
                         "migration.")
    if sched.get("provisioningModel") == "SPOT" and sched.get("automaticRestart", True):
        raise ValueError("Invalid value for field 'resource.scheduling.automaticRestart': "
                         "'true'. Spot instances cannot be restarted automatically.")


def _field(inst: dict[str, Any], name: str) -> str:
    if name.startswith("labels."):
        return str(inst.get("labels", {}).get(name[len("labels."):], "\0missing"))
    return str(inst.get(name, ""))


def match_filter(expr: str, inst: dict[str, Any]) -> bool:
    """Whether ``inst`` passes ``expr``; ValueError for an expression this fake cannot read."""
    rest = expr.strip()
    while rest:
        m = _TERM.match(rest)
        if not m:
            raise ValueError(f"cannot read {rest!r} (the fake knows FIELD = VALUE terms)")
        if _field(inst, m.group(1)) != m.group(3):
            return False
        rest = re.sub(r"^\s*(AND\s+)?", "", rest[m.end():])
    return True


def stockout_error(project: str, zone: str) -> dict[str, Any]:
    """The error part of an insert operation that found no capacity in ``zone``."""
    return {"httpErrorStatusCode": 503, "httpErrorMessage": "SERVICE UNAVAILABLE",
            "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message":
                      f"The zone 'projects/{project}/zones/{zone}' does not have enough "
                      "resources available to fulfill the request.  Try a different zone, "
                      "or try again later."}]}}


def quota_error(metric: str, region: str, limit: float) -> dict[str, Any]:
    """The error part of an insert operation refused for a quota, with its ``quotaInfo``."""
    return {"httpErrorStatusCode": 403, "httpErrorMessage": "FORBIDDEN", "error": {"errors": [{
        "code": "QUOTA_EXCEEDED",
        "message": f"Quota '{metric}' exceeded.  Limit: {limit:.1f} in region {region}.",
        "errorDetails": [{"quotaInfo": {
            "metricName": f"compute.googleapis.com/{metric.lower()}",
            "limitName": f"{metric.replace('_', '-')}-per-project-region",
            "dimensions": {"region": region}, "limit": limit}}]}]}}
