"""apache-libcloud failures, sorted by what to do next (:class:`Retry`, :class:`FailOver`,
:class:`Stop`).

libcloud raises ``InvalidCredsError`` (bad credentials), ``RateLimitReachedError`` (HTTP
429), ``ServiceUnavailableError`` (503), ``ProviderError`` with ``http_code``, ``BaseHTTPError``
with ``code``, ``MalformedResponseError``, and a plain ``LibcloudError`` for the rest; the
cloud's own words are in the message. Capacity and quota have no common type, so the message
is read for the clouds' words: Azure ``SkuNotAvailable``, ``ZonalAllocationFailed``,
``AllocationFailed``, ``OverconstrainedAllocationRequest`` and ``QuotaExceeded`` /
``OperationNotAllowed``; OpenStack ``No valid host was found`` and ``Quota exceeded``.
"""

from __future__ import annotations

import re

from providers.base import FailOver, ProviderError, Retry, Stop

_CAPACITY = re.compile(r"SkuNotAvailable|ZonalAllocationFailed|AllocationFailed|"
                       r"OverconstrainedAllocationRequest|No valid host was found|"
                       r"InsufficientInstanceCapacity|insufficient capacity|out of capacity|"
                       r"ZONE_RESOURCE_POOL_EXHAUSTED", re.IGNORECASE)
_QUOTA = re.compile(r"QuotaExceeded|Quota exceeded|quota|OperationNotAllowed.*(limit|quota)",
                    re.IGNORECASE)
_THROTTLE = re.compile(r"throttl|TooManyRequests|RequestLimitExceeded|rate limit",
                       re.IGNORECASE)


def classify(provider: str, exc: BaseException, what: str, offer_id: str = "") -> ProviderError:
    """The provider error for a libcloud (or connection) failure."""
    from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
    from libcloud.common.types import (
        InvalidCredsError,
        LibcloudError,
        MalformedResponseError,
        ServiceUnavailableError,
    )
    from libcloud.common.types import ProviderError as LcProviderError

    text = str(getattr(exc, "value", "") or getattr(exc, "message", "") or exc)
    status = getattr(exc, "http_code", None) or getattr(exc, "code", None)
    status = status if isinstance(status, int) else 0
    words = f"{what}: {type(exc).__name__}: {text}"
    if isinstance(exc, InvalidCredsError) or status == 401:
        return Stop(provider, f"{words}; check the driver's credentials (key, secret, "
                    "driver_options)", code="credentials", offer_id=offer_id)
    if _CAPACITY.search(text):
        return FailOver(provider, f"{words} (no capacity there now)", code="capacity",
                        offer_id=offer_id)
    if _QUOTA.search(text):
        return Stop(provider, f"{words}; raise the quota with the cloud or configure a "
                    "smaller size or another region", code="quota", offer_id=offer_id)
    if isinstance(exc, (RateLimitReachedError, ServiceUnavailableError,
                        MalformedResponseError)) or status == 429 or status >= 500 \
            or _THROTTLE.search(text):
        return Retry(provider, words, code=str(status or type(exc).__name__),
                     offer_id=offer_id)
    if status == 403:
        return Stop(provider, f"{words}; the account may not create or delete nodes",
                    code="403", offer_id=offer_id)
    if isinstance(exc, (LcProviderError, BaseHTTPError, LibcloudError)):
        return Stop(provider, words, code=str(status or type(exc).__name__),
                    offer_id=offer_id)
    if isinstance(exc, (OSError, TimeoutError)):  # connection refused, reset, timed out
        return Retry(provider, words, code=type(exc).__name__, offer_id=offer_id)
    return Stop(provider, words, code=type(exc).__name__, offer_id=offer_id)
