"""Compute Engine failures, sorted by what to do next (:class:`Retry`, :class:`FailOver`,
:class:`Stop`).

A Compute call fails in one of two places. The HTTP call itself (insert, delete, get, list)
answers with an error status, which google-api-core raises as a ``GoogleAPICallError`` with
``code`` (the HTTP status), ``errors`` (the ``error.errors[]`` list: ``reason``, ``message``) and
``reason`` (a ``google.rpc.ErrorInfo`` reason, when the body has one). Or the call is accepted
and its zone *operation* ends ``DONE`` with ``error.errors[]`` (``code``, ``message``,
``errorDetails``) and ``httpErrorStatusCode``: this is how a stockout and most quota errors
arrive.

Codes and reasons, from Google's "Troubleshooting VM creation" and "Handle API errors" pages:
``ZONE_RESOURCE_POOL_EXHAUSTED`` and ``ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS`` (HTTP 503) are
stockouts; ``QUOTA_EXCEEDED`` (operation) and ``quotaExceeded`` (HTTP 403) name a quota;
``rateLimitExceeded`` / ``userRateLimitExceeded`` (HTTP 403) and HTTP 429 are throttling.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from providers.base import FailOver, ProviderError, Retry, Stop

STOCKOUT_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED",
                            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"})
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
THROTTLE_CODES = frozenset({"RATE_LIMIT_EXCEEDED", "rateLimitExceeded",
                            "userRateLimitExceeded"})
AUTH_HINT = ("check the credentials (credentials_file, or Application Default Credentials) and "
             "that the account holds roles/compute.instanceAdmin.v1 on the project (and "
             "roles/iam.serviceAccountUser when instances run as a service account)")
QUOTA_HINT = ("ask for a higher quota (console: IAM & Admin > Quotas) or configure other "
              "regions; retrying cannot help")


def _quota_words(message: str, details: Iterable[Any]) -> str:
    """Which quota, from an operation error's ``errorDetails[].quotaInfo`` when present."""
    for detail in details:
        info: Any = getattr(detail, "quota_info", None)
        if info is not None and info.metric_name:
            where = ", ".join(f"{k}={v}" for k, v in sorted(dict(info.dimensions).items()))
            extra = "; ".join(w for w in (f"limit {info.limit:g}", where) if w)
            return f"quota {info.metric_name} ({info.limit_name}: {extra})"
    return message or "a quota"


def from_operation(provider: str, op: Any, what: str, offer_id: str = "") -> ProviderError:
    """The error of an operation that ended DONE with ``error`` set."""
    errors = list(op.error.errors)
    codes = [e.code for e in errors]
    text = "; ".join(f"{e.code}: {e.message}" for e in errors) or op.http_error_message
    status = int(op.http_error_status_code or 0)
    first = codes[0] if codes else str(status)
    if STOCKOUT_CODES.intersection(codes):
        code = next(c for c in codes if c in STOCKOUT_CODES)
        return FailOver(provider, f"{what}: the zone has no capacity now (stockout): {text}",
                        code=code, offer_id=offer_id)
    if QUOTA_CODES.intersection(codes):
        quota = next(e for e in errors if e.code in QUOTA_CODES)
        words = _quota_words(quota.message, quota.error_details)
        return Stop(provider, f"{what}: {words} exceeded: {quota.message}; {QUOTA_HINT}",
                    code="QUOTA_EXCEEDED", offer_id=offer_id)
    if THROTTLE_CODES.intersection(codes) or status == 429 or status >= 500:
        return Retry(provider, f"{what}: {text}", code=first, offer_id=offer_id)
    return Stop(provider, f"{what}: {text}", code=first, offer_id=offer_id)


def from_call(provider: str, exc: BaseException, what: str, offer_id: str = "") -> ProviderError:
    """The error of an HTTP call that failed (a google-api-core exception, a timeout or a
    connection error)."""
    status = getattr(exc, "code", None)
    errors = list(getattr(exc, "errors", ()) or ())
    reasons = {str(e.get("reason", "")) for e in errors if isinstance(e, dict)}
    reasons.add(str(getattr(exc, "reason", "") or ""))
    message = str(getattr(exc, "message", "") or exc)
    if not isinstance(status, int):  # a timeout, a refused or reset connection
        return Retry(provider, f"{what}: {type(exc).__name__}: {message}",
                     code=type(exc).__name__, offer_id=offer_id)
    if any(code in message for code in STOCKOUT_CODES):
        return FailOver(provider, f"{what}: the zone has no capacity now (stockout): {message}",
                        code="ZONE_RESOURCE_POOL_EXHAUSTED", offer_id=offer_id)
    if status == 429 or THROTTLE_CODES & reasons:
        return Retry(provider, f"{what}: throttled: {message}", code=str(status),
                     offer_id=offer_id)
    if status >= 500:
        return Retry(provider, f"{what}: server error: {message}", code=str(status),
                     offer_id=offer_id)
    if QUOTA_CODES & reasons:
        return Stop(provider, f"{what}: {message}; {QUOTA_HINT}", code="QUOTA_EXCEEDED",
                    offer_id=offer_id)
    if status in (401, 403):
        return Stop(provider, f"{what}: not allowed: {message}; {AUTH_HINT}", code=str(status),
                    offer_id=offer_id)
    return Stop(provider, f"{what}: {message}", code=str(status), offer_id=offer_id)
