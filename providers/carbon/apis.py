"""The web carbon sources: Electricity Maps, WattTime, the UK Carbon Intensity API and the Green
Software Foundation's Carbon Aware SDK Web API. Each maps one API's shape onto the two hooks
of :class:`~providers.carbon.http.HttpCarbonSource`, which adds the timeout, the cache and the
fallback. Zones are Electricity Maps zone keys; a source whose API names places otherwise
takes a mapping (``regions``, ``locations``); an unmapped zone is sent as it is.

API shapes, as documented
-------------------------
[EM]  Electricity Maps API v3 (docs.electricitymaps.com, "Carbon intensity"): header
      ``auth-token``; ``GET /v3/carbon-intensity/latest?zone=Z`` -> ``{"zone", "carbonIntensity",
      "datetime", "updatedAt", "emissionFactorType", "isEstimated"}``; ``.../history?zone=Z``
      (the past 24 h) -> ``{"zone", "history": [{"carbonIntensity", "datetime", ...}]}``;
      ``.../forecast?zone=Z`` -> ``{"zone", "forecast": [{"carbonIntensity", "datetime"}],
      "updatedAt"}``; gCO2eq/kWh. ``emissionFactorType`` = ``lifecycle`` (its default) or
      ``direct``.
[WT]  WattTime API v3 (docs.watttime.org; its Python client github.com/WattTime/
      watttime-python-client, ``watttime/api.py``): ``GET /login`` with HTTP basic auth ->
      ``{"token"}``, a bearer token valid 30 minutes; ``GET /v3/forecast?region=R&
      signal_type=co2_moer`` and ``GET /v3/historical?region=R&start=&end=&signal_type=`` ->
      ``{"data": [{"point_time", "value"}], "meta": {"units": "lbs_co2_per_mwh", ...}}``;
      ``GET /v3/signal-index?region=R&signal_type=co2_moer`` -> the same shape, ``value`` a
      0-100 percentile of the current rate. WattTime's signal is *marginal* (MOER), not the
      grid average the other sources give; 1 lb/MWh = 0.45359237 g/kWh.
[UK]  Carbon Intensity API, National Grid ESO (carbon-intensity.github.io/api-definitions):
      ``GET /intensity`` (the current half hour), ``GET /intensity/{from}/fw48h`` (48 h from
      ``from``) and ``GET /intensity/{from}/{to}``, ``from``/``to`` as ``YYYY-MM-DDThh:mmZ`` ->
      ``{"data": [{"from", "to", "intensity": {"forecast", "actual", "index"}}]}``; gCO2/kWh,
      ``actual`` null for half hours not yet measured. Great Britain only: zone ``GB``.
[CA]  Carbon Aware SDK Web API (github.com/Green-Software-Foundation/carbon-aware-sdk,
      ``casdk-docs/docs/tutorial-basics/carbon-aware-webapi.md``): ``GET /emissions/forecasts/
      current?location=L&dataStartAt=&dataEndAt=&windowSize=`` -> ``[{"location",
      "generatedAt", "optimalDataPoint", "forecastData": [{"location", "timestamp", "duration",
      "value"}]}]``;
      ``GET /emissions/bylocation?location=L&time=&toTime=`` -> ``[{"location", "time",
      "rating", "duration"}]``; gCO2/kWh (the SDK converts its data source's units).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from providers.carbon.base import CarbonDataError
from providers.carbon.http import (
    CarbonFetchError,
    HttpCarbonSource,
    Samples,
    iso,
    number,
    parse_time,
)

LB_PER_MWH_IN_G_PER_KWH = 0.45359237  # 453.59237 g per lb, 1,000 kWh per MWh


def _list(body: Any, key: str | None, what: str) -> list[Any]:
    items = body.get(key) if key is not None and isinstance(body, dict) else body
    if not isinstance(items, list):
        raise CarbonFetchError(f"{what}: expected a list{f' under {key!r}' if key else ''}, "
                               f"got {type(items).__name__}")
    return items


class ElectricityMaps(HttpCarbonSource):
    """Electricity Maps API v3 [EM]: latest, the past 24 h, the forecast."""

    name = "electricitymaps"

    def __init__(self, token: str = "", base_url: str = "https://api.electricitymap.org",
                 emission_factor_type: str = "", **kw: Any) -> None:
        super().__init__(base_url, **kw)
        if emission_factor_type not in ("", "lifecycle", "direct"):
            raise CarbonDataError(f"electricitymaps emission_factor_type "
                                  f"{emission_factor_type!r} is not allowed: use lifecycle or "
                                  "direct (empty: the API's default, lifecycle)")
        self.headers = {"auth-token": token} if token else {}
        self.factor = emission_factor_type or None

    def _call(self, kind: str, zone: str) -> Any:
        return self._get(f"/v3/carbon-intensity/{kind}",
                         {"zone": zone, "emissionFactorType": self.factor}, self.headers)

    def _points(self, items: list[Any], what: str) -> Samples:
        out = []
        for item in items:
            if not isinstance(item, dict):
                raise CarbonFetchError(f"{what}: an entry is not an object")
            out.append((parse_time(item.get("datetime"), f"{what} datetime"),
                        number(item.get("carbonIntensity"), f"{what} carbonIntensity")))
        return out

    def _latest(self, zone: str) -> Samples:
        body = self._call("latest", zone)
        if not isinstance(body, dict):
            raise CarbonFetchError("electricitymaps latest: the body is not an object")
        return self._points([body], "electricitymaps latest")

    def _window(self, zone: str, start: float, end: float) -> Samples:
        now = self.clock()
        out: Samples = []
        if start < now:
            out += self._points(_list(self._call("history", zone), "history",
                                      "electricitymaps history"), "electricitymaps history")
        if end > now:
            out += self._points(_list(self._call("forecast", zone), "forecast",
                                      "electricitymaps forecast"), "electricitymaps forecast")
        return out


class WattTime(HttpCarbonSource):
    """WattTime API v3 [WT]: the marginal rate (co2_moer) as gCO2e/kWh."""

    name = "watttime"
    TOKEN_LIFE_S = 25 * 60.0  # WattTime's tokens last 30 minutes; renewed 5 minutes early

    def __init__(self, username: str = "", password: str = "",
                 base_url: str = "https://api.watttime.org",
                 regions: Mapping[str, str] | None = None, signal_type: str = "co2_moer",
                 **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self.username, self.password = username, password
        self.regions = dict(regions or {})
        self.signal_type = signal_type
        self._token: tuple[float, str] | None = None

    def _bearer(self, renew: bool = False) -> dict[str, str]:
        now = self.clock()
        if renew or self._token is None or now - self._token[0] >= self.TOKEN_LIFE_S:
            body = self._get("/login", basic_auth=(self.username, self.password))
            token = body.get("token") if isinstance(body, dict) else None
            if not isinstance(token, str) or not token:
                raise CarbonFetchError("watttime /login: no token in the answer (check "
                                       "the username and password)")
            self._token = (now, token)
        return {"Authorization": f"Bearer {self._token[1]}"}

    def _data(self, path: str, params: Mapping[str, Any]) -> Any:
        try:
            return self._get(path, params, self._bearer())
        except CarbonFetchError as e:
            if "HTTP 401" not in str(e):
                raise
            return self._get(path, params, self._bearer(renew=True))  # the token expired

    def _points(self, body: Any, what: str) -> Samples:
        units = body.get("meta", {}).get("units", "lbs_co2_per_mwh") \
            if isinstance(body, dict) else ""
        scale = {"lbs_co2_per_mwh": LB_PER_MWH_IN_G_PER_KWH, "g_co2_per_kwh": 1.0,
                 "kg_co2_per_mwh": 1.0}.get(units)
        if scale is None:
            raise CarbonFetchError(f"{what}: units {units!r} are not a CO2 rate")
        return [(parse_time(p.get("point_time"), f"{what} point_time"),
                 scale * number(p.get("value"), f"{what} value"))
                for p in _list(body, "data", what) if isinstance(p, dict)]

    def _region(self, zone: str) -> str:
        return self.regions.get(zone, zone)

    def _latest(self, zone: str) -> Samples:
        # the forecast starts with the current five minutes
        points = self._points(self._data("/v3/forecast", {"region": self._region(zone),
                                                          "signal_type": self.signal_type}),
                              "watttime forecast")
        now = self.clock()
        return [p for p in points if p[0] <= now][-1:] or points[:1]

    def _window(self, zone: str, start: float, end: float) -> Samples:
        now = self.clock()
        out: Samples = []
        region = {"region": self._region(zone), "signal_type": self.signal_type}
        if start < now:
            out += self._points(self._data("/v3/historical", {
                **region, "start": iso(start), "end": iso(min(end, now))}), "watttime historical")
        if end > now:
            out += self._points(self._data("/v3/forecast", region), "watttime forecast")
        return out

    def index(self, zone: str) -> float:
        """The current signal index: where the current rate sits, 0 (cleanest) to 100."""
        body = self._data("/v3/signal-index", {"region": self._region(zone),
                                               "signal_type": self.signal_type})
        items = _list(body, "data", "watttime signal-index")
        if not items or not isinstance(items[-1], dict):
            raise CarbonFetchError("watttime signal-index: no data")
        return number(items[-1].get("value"), "watttime signal-index value")


class UkCarbonIntensity(HttpCarbonSource):
    """The UK Carbon Intensity API [UK]: Great Britain's national intensity, half-hourly."""

    name = "uk-carbon-intensity"

    def __init__(self, base_url: str = "https://api.carbonintensity.org.uk", **kw: Any) -> None:
        super().__init__(base_url, **kw)

    @staticmethod
    def _check_zone(zone: str) -> None:
        if zone != "GB":
            raise CarbonFetchError(f"the UK Carbon Intensity API covers zone GB only, not "
                                   f"{zone!r}")

    def _points(self, body: Any, what: str) -> Samples:
        out = []
        for item in _list(body, "data", what):
            intensity = item.get("intensity") if isinstance(item, dict) else None
            if not isinstance(intensity, dict):
                raise CarbonFetchError(f"{what}: an entry has no intensity object")
            value = intensity.get("actual")
            if value is None:
                value = intensity.get("forecast")
            out.append((parse_time(item.get("from"), f"{what} from"),
                        number(value, f"{what} intensity")))
        return out

    def _latest(self, zone: str) -> Samples:
        self._check_zone(zone)
        return self._points(self._get("/intensity"), "uk /intensity")

    def _window(self, zone: str, start: float, end: float) -> Samples:
        self._check_zone(zone)
        begin = iso(start - start % 1800, seconds=False)  # the half hour holding ``start``
        if start >= self.clock() - self.now_window_s:
            return self._points(self._get(f"/intensity/{begin}/fw48h"), "uk fw48h")
        return self._points(self._get(f"/intensity/{begin}/{iso(end, seconds=False)}"),
                            "uk /intensity/{from}/{to}")


class CarbonAwareSdk(HttpCarbonSource):
    """The Green Software Foundation Carbon Aware SDK Web API [CA]."""

    name = "carbon-aware-sdk"

    def __init__(self, base_url: str = "http://localhost:8080",
                 locations: Mapping[str, str] | None = None, window_minutes: int = 5,
                 **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self.locations = dict(locations or {})
        self.window_minutes = window_minutes

    def _location(self, zone: str) -> str:
        return self.locations.get(zone, zone)

    def _by_location(self, zone: str, start: float, end: float) -> Samples:
        items = _list(self._get("/emissions/bylocation", {
            "location": self._location(zone), "time": iso(start), "toTime": iso(end)}),
            None, "carbon-aware-sdk bylocation")
        return [(parse_time(i.get("time"), "carbon-aware-sdk time"),
                 number(i.get("rating"), "carbon-aware-sdk rating"))
                for i in items if isinstance(i, dict)]

    def _latest(self, zone: str) -> Samples:
        now = self.clock()
        return self._by_location(zone, now - 3600.0, now)

    def _window(self, zone: str, start: float, end: float) -> Samples:
        now = self.clock()
        if end <= now:
            return self._by_location(zone, start, end)
        forecasts = _list(self._get("/emissions/forecasts/current", {
            "location": self._location(zone), "dataStartAt": iso(max(start, now)),
            "dataEndAt": iso(end), "windowSize": self.window_minutes}),
            None, "carbon-aware-sdk forecasts")
        if not forecasts or not isinstance(forecasts[0], dict):
            raise CarbonFetchError("carbon-aware-sdk forecasts: no forecast in the answer")
        points = [(parse_time(p.get("timestamp"), "carbon-aware-sdk timestamp"),
                   number(p.get("value"), "carbon-aware-sdk value"))
                  for p in _list(forecasts[0], "forecastData", "carbon-aware-sdk forecast")
                  if isinstance(p, dict)]
        return (self._by_location(zone, start, now) if start < now else []) + points


#: Web sources by the name the configuration uses.
WEB_SOURCES: Mapping[str, Callable[..., HttpCarbonSource]] = {
    "electricitymaps": ElectricityMaps,
    "watttime": WattTime,
    "uk-carbon-intensity": UkCarbonIntensity,
    "carbon-aware-sdk": CarbonAwareSdk,
}
