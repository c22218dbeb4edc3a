"""The offer catalog: the shipped file, filtering and ordering (table-driven), the file format's
errors, spot price series and interruption rates, and the build that makes the shipped file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from broker.model.cloud import Market, Offer
from providers.base import Resources
from providers.catalog import (
    DEFAULT_INTERRUPTION_RATE,
    SHIPPED,
    CatalogError,
    CatalogRow,
    load_catalog,
    load_traces,
    spot_file,
    work_price,
    write_rows,
)
from providers.catalog import build as build_mod
from providers.catalog.spot import SpotSeries, interruption_rate, write_series

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
OD, SP = Market.ONDEMAND, Market.SPOT


def row(provider: str, region: str, zone: str, itype: str, model: str, count: int,
        ondemand: float | None, spot: float | None, vcpus: float = 8,
        memory: float = 64) -> CatalogRow:
    mem = float(model.rsplit("-", 1)[1].removesuffix("GB"))
    return CatalogRow(provider, region, zone, itype, model, count, mem, vcpus, memory, ondemand,
                      spot, "ZZ", "test", "2024-01-01")


ROWS = [
    row("aws", "us-east-1", "", "p3.2xlarge", "V100-16GB", 1, 3.06, None),
    row("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "V100-16GB", 1, None, 0.92),
    row("aws", "us-west-2", "", "p3.16xlarge", "V100-16GB", 8, 24.48, None, 64, 488),
    row("aws", "us-east-1", "", "p4d.24xlarge", "A100-40GB", 8, 32.77, None, 96, 1152),
    row("aws", "us-east-1", "", "p4de.24xlarge", "A100-80GB", 8, 40.97, None, 96, 1152),
    row("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "A100-40GB", 1, 3.67, 1.10,
        12, 85),
    row("gcp", "us-central1", "us-central1-a", "n1-standard-32+nvidia-tesla-t4x4", "T4-16GB",
        4, 2.92, 0.72, 32, 120),
]


@pytest.fixture
def catalog_path(tmp_path: Path) -> Path:
    return write_rows(tmp_path / "small.csv", ROWS)


def ids(offers: list[Offer]) -> set[str]:
    return {o.id for o in offers}


@pytest.mark.parametrize(("provider", "request_", "expected"), [
    ("aws", Resources(), {"aws:us-east-1:ondemand/p3.2xlarge", "aws:us-east-1:us-east-1b:spot/"
                          "p3.2xlarge", "aws:us-west-2:ondemand/p3.16xlarge",
                          "aws:us-east-1:ondemand/p4d.24xlarge",
                          "aws:us-east-1:ondemand/p4de.24xlarge"}),
    ("aws", Resources(gpu_count=8, gpu_model="A100"),  # a family: both memory sizes
     {"aws:us-east-1:ondemand/p4d.24xlarge", "aws:us-east-1:ondemand/p4de.24xlarge"}),
    ("aws", Resources(gpu_count=8, gpu_model="A100-80GB"),  # an exact model
     {"aws:us-east-1:ondemand/p4de.24xlarge"}),
    ("aws", Resources(gpu_count=2, gpu_model="V100"),  # at least 2 GPUs on one machine
     {"aws:us-west-2:ondemand/p3.16xlarge"}),
    ("aws", Resources(min_gpu_memory_gb=60), {"aws:us-east-1:ondemand/p4de.24xlarge"}),
    ("aws", Resources(cpus=65), {"aws:us-east-1:ondemand/p4d.24xlarge",
                                 "aws:us-east-1:ondemand/p4de.24xlarge"}),
    ("aws", Resources(memory_gb=500, gpu_model="V100"), set()),
    ("aws", Resources(market=SP), {"aws:us-east-1:us-east-1b:spot/p3.2xlarge"}),
    ("aws", Resources(regions=("us-west-2",)), {"aws:us-west-2:ondemand/p3.16xlarge"}),
    ("aws", Resources(gpu_count=9), set()),
    ("gcp", Resources(gpu_model="T4", market=OD),
     {"gcp:us-central1:us-central1-a:ondemand/n1-standard-32+nvidia-tesla-t4x4"}),
    ("gcp", Resources(gpu_model="A100"), {"gcp:us-central1:us-central1-a:ondemand/a2-highgpu-1g",
                                          "gcp:us-central1:us-central1-a:spot/a2-highgpu-1g"}),
    ("azure", Resources(), set()),
])
def test_offers_filter(catalog_path: Path, provider: str, request_: Resources,
                       expected: set[str]) -> None:
    assert ids(load_catalog(catalog_path).offers(provider, request_)) == expected


def test_an_offer_carries_its_row(catalog_path: Path) -> None:
    (offer,) = load_catalog(catalog_path).offers("gcp", Resources(gpu_model="T4", market=SP))
    assert (offer.price_per_hour, offer.gpu_count, offer.carbon_zone) == (0.72, 4, "ZZ")
    assert offer.extra["vcpus"] == 32 and offer.extra["memory_gb"] == 120
    assert (offer.extra["source"], offer.extra["fetched_at"]) == ("test", "2024-01-01")


@pytest.mark.parametrize(("request_", "first"), [
    # 1 GPU: a whole p3.16xlarge for one GPU's work is 8x dearer than a p3.2xlarge
    (Resources(gpu_model="V100"), ["aws:us-east-1:us-east-1b:spot/p3.2xlarge",
                                   "aws:us-east-1:ondemand/p3.2xlarge"]),
    # any model: A100 spot at 1.10/h for speed 2.4 beats V100 spot 0.92/h for speed 1.0, T4
    # spot 0.72/h for 1 of 4 GPUs at speed 0.3 is dearest per unit of work
    (Resources(market=SP), ["gcp:us-central1:us-central1-a:spot/a2-highgpu-1g",
                            "aws:us-east-1:us-east-1b:spot/p3.2xlarge",
                            "gcp:us-central1:us-central1-a:spot/n1-standard-32+nvidia-tesla-t4x4"]),
    # 8 GPUs: 24.48/(8 x 1.0) = 3.06 > 32.77/(8 x 2.4) = 1.71 < 40.97/(8 x 2.4) = 2.13
    (Resources(gpu_count=8), ["aws:us-east-1:ondemand/p4d.24xlarge",
                              "aws:us-east-1:ondemand/p4de.24xlarge",
                              "aws:us-west-2:ondemand/p3.16xlarge"]),
])
def test_cheapest_orders_by_price_per_unit_of_work(catalog_path: Path, request_: Resources,
                                                   first: list[str]) -> None:
    got = [o.id for o in load_catalog(catalog_path).cheapest(request_)]
    assert got[:len(first)] == first


def test_cheapest_is_deterministic_and_breaks_ties_by_id(tmp_path: Path) -> None:
    tied = [row("aws", "us-east-1", z, "p3.2xlarge", "V100-16GB", 1, None, 1.0)
            for z in ("us-east-1c", "us-east-1a", "us-east-1b")]
    shuffled = tied[:]
    random.Random(4).shuffle(shuffled)
    a = load_catalog(write_rows(tmp_path / "a.csv", tied)).cheapest(Resources())
    b = load_catalog(write_rows(tmp_path / "b.csv", shuffled)).cheapest(Resources())
    assert [o.id for o in a] == [o.id for o in b] == sorted(o.id for o in a)


def test_cheapest_takes_a_speed_table_and_providers(catalog_path: Path) -> None:
    cat = load_catalog(catalog_path)
    flat = cat.cheapest(Resources(market=SP), speed=lambda model: 1.0)
    assert flat[0].id == "gcp:us-central1:us-central1-a:spot/n1-standard-32+nvidia-tesla-t4x4"
    assert {o.provider for o in cat.cheapest(Resources(), providers=["gcp"])} == {"gcp"}
    o = flat[0]
    assert work_price(o) == pytest.approx(0.72 / (4 * 0.3))
    assert work_price(o, 1) == pytest.approx(0.72 / 0.3)


def test_load_catalog_caches_per_path(catalog_path: Path, tmp_path: Path) -> None:
    assert load_catalog(catalog_path) is load_catalog(str(catalog_path))
    other = write_rows(tmp_path / "other.csv", ROWS[:1])
    assert load_catalog(other) is not load_catalog(catalog_path)
    assert load_catalog() is load_catalog(None) and load_catalog().path == SHIPPED.resolve()


@pytest.mark.parametrize(("edit", "words"), [
    (lambda t: t.split("\n", 1)[1], "not a Spillway offer catalog"),
    (lambda t: t.replace(",p3.2xlarge,V100-16GB,1,", ",p3.2xlarge,Z100-16GB,1,", 1),
     "line 3: aws:us-east-1/p3.2xlarge: gpu_model 'Z100-16GB' is not one of"),
    (lambda t: t.replace(",3.06,", ",cheap,", 1), "line 3: column ondemand_price: 'cheap' is "
                                                  "not a number"),
    (lambda t: t.replace(",1,16,8,64,3.06,", ",1.5,16,8,64,3.06,", 1),
     "column gpu_count: '1.5' is not a whole number"),
    (lambda t: t.replace(",3.06,,", ",,,", 1), "needs an ondemand_price or a spot_price"),
    (lambda t: t.replace(",extra\n", ",extras\n", 1), "header lacks column(s) extra"),
])
def test_a_malformed_catalog_names_the_line_and_column(catalog_path: Path, edit: object,
                                                       words: str) -> None:
    bad = catalog_path.with_name("bad.csv")
    bad.write_text(edit(catalog_path.read_text()))  # type: ignore[operator]
    with pytest.raises(CatalogError) as e:
        load_catalog(bad)
    assert words in str(e.value) and str(bad) in str(e.value)


def test_a_missing_catalog_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"cannot read offer catalog .*nope\.csv"):
        load_catalog(tmp_path / "nope.csv")


# -- the shipped catalog --------------------------------------------------------------------


def test_the_shipped_catalog_loads_and_every_row_is_a_valid_offer() -> None:
    cat = load_catalog()
    assert len(cat.rows) > 200 and cat.providers == ("aws", "gcp")
    offers = [o for p in cat.providers for o in cat.offers(p, Resources())]
    assert len(offers) >= len(cat.rows)
    for o in offers:
        assert o.carbon_zone, o.id  # every region is in the zone table
        assert o.extra["source"] and o.extra["fetched_at"], o.id
        assert o.extra["vcpus"] > 0 and o.extra["memory_gb"] > 0, o.id
        assert o.price_per_hour > 0
    assert len({o.id for o in offers}) == len(offers)  # one offer per place, type and market
    for path in (SHIPPED, spot_file(SHIPPED), SHIPPED.with_name("NOTICE.md")):
        assert path.exists() and path.stat().st_size < 1_000_000, path
    # facts from the sources (PROVENANCE.md): p3.2xlarge 3.06 and p4d 32.7726 in us-east-1
    by_id = {o.id: o for o in offers}
    assert by_id["aws:us-east-1:ondemand/p3.2xlarge"].price_per_hour == 3.06
    assert by_id["aws:us-east-1:ondemand/p4d.24xlarge"].gpu_model == "A100-40GB"
    assert by_id["aws:us-east-1:ondemand/p3dn.24xlarge"].gpu_model == "V100-32GB"
    a2 = by_id["gcp:us-central1:us-central1-a:ondemand/a2-highgpu-1g"]
    assert a2.price_per_hour == pytest.approx(3.673, abs=0.01)  # GCP's a2-highgpu-1g list price


def test_the_shipped_spot_history() -> None:
    cat = load_catalog()
    series = cat.spot_history("aws", "us-east-1b", "p3.2xlarge")
    assert series is not None and len(series.times) > 10
    assert series.times == tuple(sorted(series.times))
    assert 0.3 < series.mean() / 3.06 < 0.5  # PROVENANCE.md: median spot / on-demand 0.33
    offer = cat.offers("aws", Resources(market=SP, gpu_model="V100-16GB"))[0]
    assert offer.zone  # spot prices are zonal
    assert cat.spot_history("aws", offer.zone, offer.instance_type) is not None
    assert cat.spot_history("gcp", "us-central1-a", "a2-highgpu-1g") is None
    assert {s.provider for s in cat.spot_series()} == {"aws"}


@pytest.mark.skipif(not (SHARED / build_mod.SKYPILOT).is_dir(), reason="no shared data")
def test_the_build_reproduces_the_shipped_files(tmp_path: Path) -> None:
    built = build_mod.build(SHARED)
    catalog, spot, prices = build_mod.write(built, tmp_path)
    assert catalog.read_bytes() == SHIPPED.read_bytes()
    assert spot.read_bytes() == spot_file(SHIPPED).read_bytes()
    assert prices.read_bytes() == SHIPPED.with_name("gcp_prices.json").read_bytes()
    assert built.skipped["aws M60"] == 15  # models Spillway does not know are counted


# -- spot series and interruption rates -----------------------------------------------------


def test_a_spot_series_is_a_step_function() -> None:
    s = SpotSeries("aws", "r", "z", "t", (100.0, 200.0, 300.0), (1.0, 2.0, 4.0))
    assert [s.price_at(t) for t in (0, 100, 150, 200, 299, 1000)] == [1, 1, 1, 2, 2, 4]
    assert s.mean() == pytest.approx(1.5)  # 100 s at 1, 100 s at 2
    assert s.mean(150, 350) == pytest.approx((50 * 1 + 100 * 2 + 50 * 4) / 200)


def test_spot_series_round_trip(tmp_path: Path) -> None:
    path = write_series(tmp_path / "x.spot.csv.gz", [
        ("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "2020-01-01T00:00:00Z", 1.0),
        ("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "2020-01-01T01:00:00Z", 2.0)])
    write_rows(tmp_path / "x.csv", ROWS[:1])
    s = load_catalog(tmp_path / "x.csv").spot_history("aws", "us-east-1a", "p3.2xlarge")
    assert path.exists() and s is not None and s.prices == (1.0, 2.0)
    assert s.times[1] - s.times[0] == 3600


def _trace(root: Path, name: str, values: list[int], gap: int = 360) -> None:
    path = root / "availability" / "1-node" / "aws-01-01-2023" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": values}))


def test_interruption_rates_from_traces(tmp_path: Path) -> None:
    # 1 = no spot: two interruptions in 8 available samples of 6 minutes = 2 per 0.8 h
    _trace(tmp_path, "us-east-1a_v100_1.json", [0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0])
    _trace(tmp_path, "us-east-1b_v100_1.json", [0] * 10)
    _trace(tmp_path, "us-east-1a_intel_64.json", [0, 1] * 5)  # a CPU trace: left out
    traces = load_traces(tmp_path)
    assert [t.zone for t in traces] == ["us-east-1a", "us-east-1b"]
    t = traces[0]
    assert (t.instance_type, t.interruptions(), t.availability()) == ("p3.2xlarge", 2, 8 / 11)
    assert t.interruption_rate() == pytest.approx(2 / 0.8)
    zone = interruption_rate(traces, "aws", "us-east-1a", "p3.2xlarge")
    assert (zone.basis, zone.traces, zone.rate_per_hour) == ("zone", 1, pytest.approx(2.5))
    other = interruption_rate(traces, "aws", "us-west-2a", "p3.2xlarge")
    assert (other.basis, other.traces, other.rate_per_hour) == ("type", 2, pytest.approx(1.25))
    none = interruption_rate(traces, "aws", "us-east-1a", "p4d.24xlarge")
    assert (none.basis, none.rate_per_hour) == ("default", DEFAULT_INTERRUPTION_RATE)
    assert load_traces(tmp_path / "absent") == []


def test_interruption_rate_of_an_offer(catalog_path: Path, tmp_path: Path) -> None:
    _trace(tmp_path, "us-east-1b_v100_1.json", [0, 1, 0, 1, 0])
    cat = load_catalog(catalog_path)
    spot, ondemand = (cat.offers("aws", Resources(gpu_model="V100", market=m,
                                                  regions=("us-east-1",)))[0] for m in (SP, OD))
    assert cat.interruption_rate(spot, load_traces(tmp_path)).basis == "zone"
    assert cat.interruption_rate(ondemand, load_traces(tmp_path)).rate_per_hour == 0.0
    marked = cat.with_interruption_rates([spot, ondemand], load_traces(tmp_path))
    assert marked == [spot, ondemand]  # the same offers (extra is not compared)
    assert marked[0].extra["interruption_rate_per_hour"] == pytest.approx(2 / (3 * 360 / 3600))
    assert marked[0].extra["interruption_basis"] == "zone"
    assert "interruption_rate_per_hour" not in marked[1].extra


@pytest.mark.skipif(not (SHARED / "spot_availability_cantbelate").is_dir(),
                    reason="no shared data")
def test_the_shared_traces_and_the_default_rate() -> None:
    traces = load_traces()
    assert len(traces) == 21  # the single-node GPU traces
    rates = sorted(t.interruption_rate() for t in traces)
    assert rates[10] == pytest.approx(DEFAULT_INTERRUPTION_RATE, abs=0.01)  # their median
