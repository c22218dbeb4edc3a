"""What every web carbon source shares: HTTP GETs with a timeout, a TTL cache, and a fallback.

:class:`HttpCarbonSource` answers the :class:`~providers.carbon.base.CarbonSource` calls from
two hooks a source implements over its API:

- ``_latest(zone)``: samples ``[(t, g), ...]`` whose last one is the current intensity;
- ``_window(zone, start, end)``: samples covering as much of ``[start, end)`` as the API has.

Samples are step functions (a value holds until the next sample). Answers are cached for
``cache_ttl_s`` (the latest value per zone; a window per zone and hour of its start, or per
zone for windows from now on: one forecast serves every window inside it). A forecast that
stops before the window's end is carried on at its last value (persistence).

When a call fails (timeout, connection refused, an HTTP error, a body of the wrong shape) the
source falls back, in this order, to the **last value it got** for the zone, or to the zone's
**static yearly average** (:mod:`providers.carbon.averages`, or ``averages`` given here), and
logs a warning on the ``spillway.carbon`` logger naming the source, the zone, what failed and
what it fell back to. With neither, the error (:class:`CarbonFetchError`) is raised.
"""

from __future__ import annotations

import base64
import bisect
import datetime as dt
import json
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from providers.carbon.averages import yearly_average
from providers.carbon.base import CarbonDataError, CarbonError

log = logging.getLogger("spillway.carbon")
Samples = list[tuple[float, float]]


class CarbonFetchError(CarbonError):
    """A web carbon source did not answer, or answered something unusable."""


def iso(t: float, seconds: bool = True) -> str:
    """Unix time as ISO 8601 UTC with a Z (``2026-12-05T06:30:00Z``; minutes only if asked)."""
    stamp = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ" if seconds else "%Y-%m-%dT%H:%MZ")


def parse_time(text: Any, what: str) -> float:
    """An ISO 8601 time from an API body as unix seconds (UTC when it names no zone)."""
    if not isinstance(text, str):
        raise CarbonFetchError(f"{what}: {text!r} is not a time string")
    try:
        stamp = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CarbonFetchError(f"{what}: {text!r} is not an ISO 8601 time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CarbonFetchError(f"{what}: {value!r} is not a number")
    return float(value)


def get_json(url: str, params: Mapping[str, Any] | None = None,
             headers: Mapping[str, str] | None = None, timeout: float = 5.0,
             basic_auth: tuple[str, str] | None = None) -> Any:
    """GET ``url`` (with ``params`` as its query) and decode its JSON body; CarbonFetchError
    naming the URL (its query left out) and what went wrong."""
    query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
    full = f"{url}?{query}" if query else url
    request = urllib.request.Request(full, headers={"Accept": "application/json",
                                                    **(headers or {})})
    if basic_auth is not None:
        token = base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as e:
        raise CarbonFetchError(f"GET {url}: HTTP {e.code} {e.reason}") from None
    except TimeoutError:
        raise CarbonFetchError(f"GET {url}: no answer within {timeout:g} s") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            raise CarbonFetchError(f"GET {url}: no answer within {timeout:g} s") from None
        raise CarbonFetchError(f"GET {url}: {reason}") from None
    except OSError as e:
        raise CarbonFetchError(f"GET {url}: {e}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise CarbonFetchError(f"GET {url}: the body is not JSON ({body[:80]!r})") from None


class TTLCache:
    """Values kept for ``ttl`` seconds of the given clock."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self.ttl, self.clock = ttl, clock
        self._items: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, fetch: Callable[[], Any]) -> Any:
        now = self.clock()
        held = self._items.get(key)
        if held is not None and now - held[0] < self.ttl:
            return held[1]
        value = fetch()
        self._items[key] = (now, value)
        return value


def value_at(samples: Samples, at: float, what: str) -> float:
    """The sample holding at ``at`` (the last at or before it); CarbonFetchError when the
    samples start after ``at``."""
    times = [t for t, _ in samples]
    i = bisect.bisect_right(times, at) - 1
    if i < 0:
        raise CarbonFetchError(f"{what}: no data at or before {iso(at)}")
    return samples[i][1]


def to_steps(samples: Samples, start: float, end: float, what: str) -> list[tuple[float, float]]:
    """Samples as forecast steps covering ``[start, end)``: the first at ``start`` (the value
    holding then, or the first sample's when the samples start later), the last value carried
    on to ``end``."""
    if not samples:
        raise CarbonFetchError(f"{what}: no samples")
    samples = sorted(samples)
    times = [t for t, _ in samples]
    i = max(0, bisect.bisect_right(times, start) - 1)
    out = [(start, samples[i][1])]
    out.extend((t, g) for t, g in samples[i + 1:] if start < t < end)
    return out


class HttpCarbonSource:
    """The shared part of the web sources (see the module's doc)."""

    name = "http"

    def __init__(self, base_url: str, *, timeout_s: float = 5.0, cache_ttl_s: float = 300.0,
                 averages: Mapping[str, float] | None = None,
                 clock: Callable[[], float] = time.time, now_window_s: float = 900.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise CarbonDataError(f"{self.name} url {base_url!r} must start with http:// or "
                                  "https://")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise CarbonDataError(f"{self.name} timeout_s {timeout_s!r} must be seconds > 0")
        if not (cache_ttl_s >= 0 and math.isfinite(cache_ttl_s)):
            raise CarbonDataError(f"{self.name} cache_ttl_s {cache_ttl_s!r} must be seconds >= 0")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.averages = dict(averages or {})
        self.clock = clock
        self.now_window_s = now_window_s  # |at - now| within this: the latest value answers
        self.cache = TTLCache(cache_ttl_s, clock)
        self.last_known: dict[str, tuple[float, float]] = {}  # zone -> (time, value)
        self.fallbacks = 0  # how many answers came from a fallback

    # -- hooks -----------------------------------------------------------------------------

    def _latest(self, zone: str) -> Samples:
        raise NotImplementedError

    def _window(self, zone: str, start: float, end: float) -> Samples:
        raise NotImplementedError

    def _get(self, path: str, params: Mapping[str, Any] | None = None,
             headers: Mapping[str, str] | None = None,
             basic_auth: tuple[str, str] | None = None) -> Any:
        return get_json(self.base_url + path, params, headers, self.timeout_s, basic_auth)

    # -- the interface ---------------------------------------------------------------------

    def _window_cached(self, zone: str, start: float, end: float) -> Samples:
        now = self.clock()
        key = (zone, "ahead") if start >= now - self.now_window_s else (zone, int(start // 3600))
        samples: Samples = self.cache.get(key, lambda: sorted(self._window(zone, start, end)))
        return samples

    def intensity(self, zone: str, at: float) -> float:
        try:
            if abs(at - self.clock()) <= self.now_window_s:
                samples: Samples = self.cache.get((zone, "latest"), lambda: self._latest(zone))
                if not samples:
                    raise CarbonFetchError(f"{self.name}: no latest value for zone {zone!r}")
                value = samples[-1][1]
            else:
                value = value_at(self._window_cached(zone, at, at + 3600), at,
                                 f"{self.name} zone {zone!r}")
        except CarbonError as e:
            return self._fall_back(zone, e)
        self._remember(zone, at, value)
        return value

    def forecast(self, zone: str, start: float, end: float) -> list[tuple[float, float]]:
        if end < start:
            raise CarbonDataError(f"forecast window end {end} is before its start {start}")
        try:
            steps = to_steps(self._window_cached(zone, start, end), start, end,
                             f"{self.name} zone {zone!r}")
        except CarbonError as e:
            return [(start, self._fall_back(zone, e))]
        self._remember(zone, *steps[0])
        return steps

    def _remember(self, zone: str, at: float, value: float) -> None:
        """Keep the value of the latest time not in the future: the fallback's last value."""
        held = self.last_known.get(zone)
        if at <= self.clock() + self.now_window_s and (held is None or at >= held[0]):
            self.last_known[zone] = (at, value)

    def _fall_back(self, zone: str, error: CarbonError) -> float:
        self.fallbacks += 1
        known = self.last_known.get(zone)
        if known is not None:
            log.warning("carbon source %s failed for zone %s (%s); falling back to the last "
                        "known value, %.1f gCO2e/kWh from %s", self.name, zone, error,
                        known[1], iso(known[0]))
            return known[1]
        average = yearly_average(zone, self.averages)
        if average is not None:
            log.warning("carbon source %s failed for zone %s (%s); no value known yet: "
                        "falling back to the static yearly average, %.1f gCO2e/kWh", self.name,
                        zone, error, average)
            return average
        log.warning("carbon source %s failed for zone %s (%s); no last known value and no "
                    "static average for the zone: nothing to fall back to", self.name, zone,
                    error)
        raise error
