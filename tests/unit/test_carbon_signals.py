"""Carbon signals in snapshots (broker/energy/carbon_signals.py): what a scheduler's and the
simulator's snapshots carry, the refresh period, failures, and the background fetch."""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from broker.config.core import Config
from broker.config.energy import parse_carbon, parse_energy
from broker.cycle.plan import Snapshot
from broker.cycle.snapshots import SnapshotBuilder
from broker.energy.carbon_signals import CarbonSignals, from_config
from broker.model import Gpu, Node, NodeState
from broker.store.memory import MemoryStore
from providers.carbon.base import CarbonError
from providers.carbon.csv import SHIPPED_2022, CsvCarbonSource, Series

T0 = dt.datetime(2022, 6, 1, tzinfo=dt.timezone.utc).timestamp()
H = 3600.0


def gpu_node(node_id: str, site: str = "onprem") -> Node:
    return Node(node_id, (Gpu(f"G-{node_id}", 0, "A100-80GB", 80.0),), site=site,
                state=NodeState.READY, lease_expires=1e15)


def bare(now: float, nodes: tuple[Node, ...] = (gpu_node("a"),)) -> Snapshot:
    return Snapshot(now, (), (), nodes, {}, ())


def hourly(zone: str, values: list[float], start: float = T0) -> Series:
    return Series(zone, tuple(start + i * H for i in range(len(values))), tuple(values))


class Counting:
    """A source that counts its calls and can be made to fail or to block."""

    name = "counting"

    def __init__(self, inner: CsvCarbonSource) -> None:
        self.inner, self.calls, self.fail = inner, 0, False
        self.gate: threading.Event | None = None

    def intensity(self, zone: str, at: float) -> float:
        if self.gate is not None:
            self.gate.wait(10)
        self.calls += 1
        if self.fail:
            raise CarbonError("the API is down")
        return self.inner.intensity(zone, at)

    def forecast(self, zone: str, start: float, end: float) -> list[tuple[float, float]]:
        return self.inner.forecast(zone, start, end)


SOURCE = CsvCarbonSource([hourly("US-CAL-CISO", [200, 100, 50, 300] * 30)])


def test_dress_fills_the_zones_of_the_nodes_sites_and_offsets_time() -> None:
    sig = CarbonSignals(SOURCE, onprem_zones={"onprem": "US-CAL-CISO"}, horizon_s=3 * H,
                        offset=T0, background=False)
    snap = sig.dress(bare(1.5 * H))  # snapshot time 1.5 h = T0 + 1.5 h
    assert snap.carbon == {"US-CAL-CISO": 100.0}
    assert snap.carbon_forecast["US-CAL-CISO"] == ((1.5 * H, 100.0), (2 * H, 50.0),
                                                   (3 * H, 300.0), (4 * H, 200.0))
    # the defer policy finds the zone through the snapshot's sites
    assert [(str(s), s.carbon_zone) for s in snap.sites] == [("onprem", "US-CAL-CISO")]
    # a site no table knows gets no signal, and the snapshot is otherwise unchanged
    plain = CarbonSignals(SOURCE, background=False).dress(bare(T0))
    assert plain.carbon == {} and plain.carbon_forecast == {} and plain.sites == ()


def test_refreshed_at_most_every_refresh_s_and_read_in_between() -> None:
    src = Counting(SOURCE)
    sig = CarbonSignals(src, zones={"US-CAL-CISO"}, refresh_s=2 * H, horizon_s=6 * H,
                        background=False)
    assert sig.dress(bare(T0)).carbon == {"US-CAL-CISO": 200.0}
    assert src.calls == 1
    later = sig.dress(bare(T0 + H + 10))  # cached: the forecast moves on, no new call
    assert src.calls == 1 and later.carbon == {"US-CAL-CISO": 100.0}
    assert later.carbon_forecast["US-CAL-CISO"][0] == (T0 + H, 100.0)
    sig.dress(bare(T0 + 2 * H))  # the refresh period is over
    assert src.calls == 2
    sig.zones.add("ES")  # a new zone: fetched at once (the source does not know it: left out)
    # a zone the source lacks: its yearly average (EM 2022), no forecast
    dressed = sig.dress(bare(T0 + 2 * H + 1))
    assert dressed.carbon["ES"] == 167.0 and "ES" not in dressed.carbon_forecast
    assert src.calls == 4  # 2 zones
    sig.dress(bare(T0 + 2 * H + 2))  # (a zone it cannot answer is not asked at every cycle)
    assert src.calls == 4


def test_a_failing_source_keeps_the_last_signals_and_never_raises(
        caplog: pytest.LogCaptureFixture) -> None:
    src = Counting(SOURCE)
    sig = CarbonSignals(src, zones={"US-CAL-CISO"}, refresh_s=60, background=False)
    ok = sig.dress(bare(T0))
    src.fail = True
    snap = sig.dress(bare(T0 + H))  # signals() leaves the zone out, with a warning
    assert "no carbon signal for zone US-CAL-CISO" in caplog.text
    assert snap.carbon_forecast["US-CAL-CISO"] == ok.carbon_forecast["US-CAL-CISO"][1:]

    class Broken(Counting):
        def intensity(self, zone: str, at: float) -> float:
            raise OSError("connection reset")  # not a CarbonError: a bug, or a raw socket

    sig.source = Broken(SOURCE)
    kept = sig.dress(bare(T0 + 2 * H))
    assert sig.failures == 1 and "failed (connection reset)" in caplog.text
    assert kept.carbon_forecast == {
        **snap.carbon_forecast, "US-CAL-CISO": snap.carbon_forecast["US-CAL-CISO"][1:]}


def test_in_the_background_a_slow_source_never_stalls_a_cycle() -> None:
    src = Counting(SOURCE)
    src.gate = threading.Event()  # the source blocks until released
    sig = CarbonSignals(src, zones={"US-CAL-CISO"}, refresh_s=60, background=True)
    snap = sig.dress(bare(T0))  # returns at once, without signals yet
    assert snap.carbon_forecast == {}
    src.gate.set()
    assert sig.wait_idle(10)
    assert sig.dress(bare(T0 + 1)).carbon == {"US-CAL-CISO": 200.0}


def test_a_scheduler_built_with_a_csv_source_fills_the_forecast(tmp_path: Path) -> None:
    cfg = replace(Config(),
                  carbon=parse_carbon({"source": "csv", "files": [str(SHIPPED_2022)]}),
                  energy=parse_energy({"sites": {"onprem": {"carbon_zone": "ES"}}}))
    store = MemoryStore(cfg)
    store.heartbeat(gpu_node("a"), 1e9, T0)
    builder = SnapshotBuilder(store, cfg)
    assert builder.carbon is not None and builder.carbon.background
    deadline = time.monotonic() + 30
    snap = builder.build(T0)
    while not snap.carbon_forecast and time.monotonic() < deadline:
        builder.carbon.wait_idle(1)
        snap = builder.build(T0 + 1)
    steps = snap.carbon_forecast["ES"]
    assert steps[0][0] <= T0 + 1 and steps[-1][0] >= T0 + 47 * H  # two days ahead
    assert snap.carbon["ES"] == SHIPPED_SOURCE().intensity("ES", T0 + 1)
    assert [(str(s), s.carbon_zone) for s in snap.sites] == [("onprem", "ES")]
    assert from_config(Config()) is None  # no source configured: nothing changes
    assert SnapshotBuilder(MemoryStore(Config())).carbon is None


def SHIPPED_SOURCE() -> CsvCarbonSource:
    return CsvCarbonSource.from_files([SHIPPED_2022])


def test_the_simulator_feeds_the_same_signals() -> None:
    from broker.sim.carbon_metrics import sim_signals
    from broker.sim.energy import SimEnergy

    energy = SimEnergy.for_trace(T0)
    sig = sim_signals(energy, None)
    assert sig is not None and not sig.background and sig.offset == T0
    snap = sig.dress(bare(3 * H))
    assert snap.carbon["US-CAL-CISO"] == energy.source.intensity("US-CAL-CISO", T0 + 3 * H)
    # a cloud zone the series lack is answered by its stand-in, as the accounting does
    cloud = sig.dress(bare(3 * H, (gpu_node("c", "aws:us-east-1:spot"),)))
    assert cloud.carbon["US-MIDA-PJM"] == cloud.carbon["US-CAL-CISO"]
