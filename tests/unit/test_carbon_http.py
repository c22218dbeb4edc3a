"""The web carbon sources against a real local HTTP server serving each API's documented shape,
failing (HTTP 500) or hanging (past the client's timeout) on demand."""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from providers.carbon import CarbonSource
from providers.carbon.apis import (
    CarbonAwareSdk,
    ElectricityMaps,
    UkCarbonIntensity,
    WattTime,
)
from providers.carbon.http import CarbonFetchError, iso

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z: the fake clock's now
Route = Callable[[dict[str, list[str]], dict[str, str]], tuple[int, Any]]


@dataclass
class Fake:
    """A local API: ``routes`` answer paths; ``mode`` is ok, fail (HTTP 500) or hang."""

    routes: dict[str, Route] = field(default_factory=dict)
    mode: str = "ok"
    hits: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""


@pytest.fixture
def fake() -> Iterator[Fake]:
    state = Fake()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            state.hits.append(parts.path)
            if state.mode == "hang":
                state.release.wait(10)  # longer than any client timeout here
                return
            route = state.routes.get(parts.path)
            if state.mode == "fail" or route is None:
                code, body = (500, {"error": "boom"}) if route else (404, {"error": "no"})
            else:
                code, body = route(parse_qs(parts.query),
                                    {k.lower(): v for k, v in self.headers.items()})
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_electricitymaps_latest_forecast_cache_and_fallbacks(
        fake: Fake, caplog: pytest.LogCaptureFixture) -> None:
    def latest(q: dict[str, list[str]], h: dict[str, str]) -> tuple[int, Any]:
        assert h.get("auth-token") == "k" and q["zone"] == ["DE"]
        return 200, {"zone": "DE", "carbonIntensity": 302, "datetime": iso(T0 - 600),
                     "updatedAt": iso(T0), "emissionFactorType": "lifecycle",
                     "isEstimated": False}

    fake.routes["/v3/carbon-intensity/latest"] = latest
    fake.routes["/v3/carbon-intensity/forecast"] = lambda q, h: (200, {
        "zone": q["zone"][0], "updatedAt": iso(T0),
        "forecast": [{"carbonIntensity": 300 + i, "datetime": iso(T0 + 3600 * i)}
                     for i in range(24)]})
    fake.routes["/v3/carbon-intensity/history"] = lambda q, h: (200, {
        "zone": q["zone"][0],
        "history": [{"carbonIntensity": 200 + i, "datetime": iso(T0 - 3600 * (24 - i))}
                    for i in range(24)]})
    clock = Clock()
    src = ElectricityMaps(token="k", base_url=fake.url, clock=clock, cache_ttl_s=300)
    assert isinstance(src, CarbonSource)
    assert src.intensity("DE", T0) == 302.0
    assert src.intensity("DE", T0 + 60) == 302.0  # cached
    assert fake.hits.count("/v3/carbon-intensity/latest") == 1
    steps = src.forecast("DE", T0 + 1800, T0 + 3 * 3600)
    assert steps == [(T0 + 1800, 300.0), (T0 + 3600, 301.0), (T0 + 7200, 302.0)]
    assert src.intensity("DE", T0 - 3 * 3600 - 10) == 220.0  # from the history
    clock.now += 301  # the cache expires
    fake.mode = "fail"
    with caplog.at_level(logging.WARNING, logger="spillway.carbon"):
        assert src.intensity("DE", clock.now) == 302.0  # the last value it got
        assert src.intensity("ES", clock.now) == 167.0  # no value yet: the yearly average
        with pytest.raises(CarbonFetchError, match="HTTP 500"):
            src.intensity("PL", clock.now)  # no average either
    text = caplog.text
    assert "carbon source electricitymaps failed for zone DE" in text
    assert "last known value, 302.0 gCO2e/kWh" in text
    assert "static yearly average, 167.0 gCO2e/kWh" in text
    assert "nothing to fall back to" in text
    assert src.forecast("DE", clock.now, clock.now + 7200) == [(clock.now, 302.0)]
    assert src.fallbacks == 4


def test_a_hanging_api_times_out_and_falls_back(fake: Fake,
                                                caplog: pytest.LogCaptureFixture) -> None:
    fake.mode = "hang"
    src = UkCarbonIntensity(base_url=fake.url, timeout_s=0.2, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="spillway.carbon"):
        assert src.intensity("GB", T0) == 218.0
    assert "no answer within 0.2 s" in caplog.text
    assert "uk-carbon-intensity failed for zone GB" in caplog.text


def test_uk_carbon_intensity_actual_then_forecast(fake: Fake) -> None:
    def half_hours(start: float, n: int, measured: int) -> dict[str, Any]:
        return {"data": [{"from": iso(start + 1800 * i, seconds=False),
                          "to": iso(start + 1800 * (i + 1), seconds=False),
                          "intensity": {"forecast": 100 + i,
                                        "actual": 90 + i if i < measured else None,
                                        "index": "low"}} for i in range(n)]}

    begin = T0 - T0 % 1800
    fake.routes["/intensity"] = lambda q, h: (200, half_hours(begin, 1, 1))
    fake.routes[f"/intensity/{iso(begin, seconds=False)}/fw48h"] = \
        lambda q, h: (200, half_hours(begin, 96, 1))
    src = UkCarbonIntensity(base_url=fake.url, clock=Clock())
    assert src.intensity("GB", T0) == 90.0  # the actual value
    steps = src.forecast("GB", T0, T0 + 3600)
    assert [g for _, g in steps] == [90.0, 101.0, 102.0]  # then the forecast
    assert src.intensity("FR", T0) == 57.0  # GB only: a clear failure, then the average


def test_watttime_login_renewal_and_units(fake: Fake) -> None:
    tokens = iter(["t1", "t2"])
    seen: list[str] = []

    def login(q: dict[str, list[str]], h: dict[str, str]) -> tuple[int, Any]:
        assert h["authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
        return 200, {"token": next(tokens)}

    def forecast(q: dict[str, list[str]], h: dict[str, str]) -> tuple[int, Any]:
        seen.append(h["authorization"])
        if h["authorization"] == "Bearer t1" and len(seen) > 1:
            return 401, {"error": "expired"}
        assert q == {"region": ["CAISO_NORTH"], "signal_type": ["co2_moer"]}
        return 200, {"data": [{"point_time": iso(T0 + 300 * i), "value": 1000.0}
                              for i in range(12)],
                     "meta": {"region": "CAISO_NORTH", "signal_type": "co2_moer",
                              "units": "lbs_co2_per_mwh", "generated_at": iso(T0)}}

    fake.routes["/login"] = login
    fake.routes["/v3/forecast"] = forecast
    fake.routes["/v3/signal-index"] = lambda q, h: (200, {
        "data": [{"point_time": iso(T0), "value": 87.0}],
        "meta": {"units": "percentile"}})
    clock = Clock()
    src = WattTime("u", "p", base_url=fake.url, regions={"US-CAL-CISO": "CAISO_NORTH"},
                   clock=clock, cache_ttl_s=0)
    assert src.intensity("US-CAL-CISO", T0) == pytest.approx(453.59237)
    assert src.intensity("US-CAL-CISO", T0) == pytest.approx(453.59237)  # t1 refused: t2
    assert seen == ["Bearer t1", "Bearer t1", "Bearer t2"]
    assert len(src.forecast("US-CAL-CISO", T0, T0 + 3600)) == 12
    assert src.index("US-CAL-CISO") == 87.0


def test_carbon_aware_sdk_forecast_and_bylocation(fake: Fake) -> None:
    def current(q: dict[str, list[str]], h: dict[str, str]) -> tuple[int, Any]:
        assert q["location"] == ["eastus"] and q["windowSize"] == ["5"]
        points = [{"location": "eastus", "timestamp": iso(T0 + 300 * i), "duration": 5,
                   "value": 400.0 - i} for i in range(24)]
        return 200, [{"location": "eastus", "generatedAt": iso(T0), "windowSize": 5,
                      "optimalDataPoint": points[-1], "forecastData": points}]

    fake.routes["/emissions/forecasts/current"] = current
    fake.routes["/emissions/bylocation"] = lambda q, h: (200, [
        {"location": "eastus", "time": iso(T0 - 600), "rating": 380.0}])
    src = CarbonAwareSdk(base_url=fake.url, locations={"US-MIDA-PJM": "eastus"}, clock=Clock())
    assert src.intensity("US-MIDA-PJM", T0) == 380.0
    steps = src.forecast("US-MIDA-PJM", T0, T0 + 900)
    assert steps == [(T0, 400.0), (T0 + 300, 399.0), (T0 + 600, 398.0)]


def test_bad_settings_and_bodies_are_named(fake: Fake) -> None:
    from providers.carbon import CarbonDataError

    with pytest.raises(CarbonDataError, match="url 'ftp://x' must start with http"):
        ElectricityMaps(base_url="ftp://x")
    with pytest.raises(CarbonDataError, match="timeout_s 0 must be seconds > 0"):
        ElectricityMaps(timeout_s=0)
    with pytest.raises(CarbonDataError, match="emission_factor_type 'x'"):
        ElectricityMaps(emission_factor_type="x")
    fake.routes["/v3/carbon-intensity/latest"] = lambda q, h: (200, {"carbonIntensity": "hi"})
    src = ElectricityMaps(base_url=fake.url, clock=Clock())
    with pytest.raises(CarbonFetchError, match="datetime: None is not a time string"):
        src.intensity("PL", T0)


@pytest.mark.parametrize("mode", ["fail", "hang"])
@pytest.mark.parametrize("make", [
    lambda url, clock: ElectricityMaps(token="k", base_url=url, clock=clock, timeout_s=0.2),
    lambda url, clock: WattTime("u", "p", base_url=url, clock=clock, timeout_s=0.2),
    lambda url, clock: UkCarbonIntensity(base_url=url, clock=clock, timeout_s=0.2),
    lambda url, clock: CarbonAwareSdk(base_url=url, clock=clock, timeout_s=0.2),
], ids=["electricitymaps", "watttime", "uk", "carbon-aware-sdk"])
def test_every_source_falls_back_with_a_warning(
        fake: Fake, caplog: pytest.LogCaptureFixture, mode: str,
        make: Callable[[str, Clock], Any]) -> None:
    fake.mode = mode
    fake.routes.update({p: (lambda q, h: (200, {})) for p in (
        "/login", "/v3/carbon-intensity/latest", "/intensity", "/emissions/bylocation")})
    src = make(fake.url, Clock())
    with caplog.at_level(logging.WARNING, logger="spillway.carbon"):
        assert src.intensity("GB", T0) == 218.0  # GB's static yearly average
        assert src.forecast("GB", T0, T0 + 3600) == [(T0, 218.0)]
    assert f"carbon source {src.name} failed for zone GB" in caplog.text
    assert ("HTTP 500" if mode == "fail" else "no answer within 0.2 s") in caplog.text
    assert fake.hits  # it did ask the server
