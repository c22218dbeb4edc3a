"""The catalog's refreshers: AWS against moto's EC2 server (DescribeInstanceTypes,
DescribeSpotPriceHistory, a throttled call retried), GCP (google-cloud-compute, REST) against a
tiny fake of Compute's aggregated machineTypes and acceleratorTypes lists, and the merged
catalog they write."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from providers.base import Resources
from providers.catalog import load_catalog, spot_file
from providers.catalog.refresh import known_prices, refresh
from providers.catalog.refresh_aws import PriceFileError
from providers.catalog.refresh_gcp import read_gcp_prices
from tests.fake_ec2 import AWS_TEST_ENV, FaultProxy, moto_ec2

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def ec2() -> Iterator[FaultProxy]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in AWS_TEST_ENV.items():
            mp.setenv(k, v)
        with moto_ec2() as (_, proxy):
            yield proxy


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in AWS_TEST_ENV.items():
        monkeypatch.setenv(k, v)


@pytest.mark.slow  # moto's 1,400 instance types / google-cloud-compute's import
def test_aws_refresh_reads_types_and_spot_prices_and_keeps_the_rest(
        ec2: FaultProxy, tmp_path: Path) -> None:
    prices = tmp_path / "aws_prices.csv"
    prices.write_text("instance_type,region,price,fetched_at\n"
                      "p5.48xlarge,us-east-1,98.32,2026-11-30\ng5.xlarge,us-east-1,1.006,\n")
    base = load_catalog()
    ec2.inject("DescribeInstanceTypes", "RequestLimitExceeded")  # botocore retries it
    out = refresh("aws", base, tmp_path / "cat.csv", NOW, regions=["us-east-1"],
                  prices=prices, endpoint=ec2.url)
    assert ec2.served["RequestLimitExceeded"] == 1 and ec2.pending("DescribeInstanceTypes") == 0
    assert out.regions == ("us-east-1",) and out.fresh > 0
    assert out.skipped.get("B300 x8") == 1  # a GPU Spillway does not know, counted
    cat = load_catalog(out.path)
    fresh = cat.offers("aws", Resources(regions=("us-east-1",)))
    by_id = {o.id: o for o in fresh}
    p5 = by_id["aws:us-east-1:ondemand/p5.48xlarge"]  # moto's types, the file's price
    assert (p5.gpu_model, p5.gpu_count, p5.price_per_hour) == ("H100-80GB", 8, 98.32)
    assert p5.extra["vcpus"] == 192 and p5.extra["fetched_at"] == "2026-11-30"
    assert p5.extra["source"] == "aws price file aws_prices.csv"
    g5 = by_id["aws:us-east-1:ondemand/g5.xlarge"]  # no date in the file: the file's own
    assert g5.extra["fetched_at"] == datetime.fromtimestamp(
        prices.stat().st_mtime, tz=timezone.utc).strftime("%Y-%m-%d")
    assert p5.carbon_zone == "US-MIDA-PJM"
    spot = [o for o in fresh if o.market.value == "spot"]
    assert spot and all(o.zone.startswith("us-east-1") for o in spot)
    assert {o.extra["source"] for o in spot} == {"aws DescribeSpotPriceHistory"}
    # us-east-1's old rows are gone (p3 is not in moto's list); other regions and GCP kept
    assert "aws:us-east-1:ondemand/p3.2xlarge" not in by_id
    assert cat.offers("aws", Resources(regions=("us-west-2",))) == \
        base.offers("aws", Resources(regions=("us-west-2",)))
    assert cat.offers("gcp", Resources()) == base.offers("gcp", Resources())
    zone = spot[0]
    series = cat.spot_history("aws", zone.zone, zone.instance_type)
    assert series is not None and series.prices[-1] == zone.price_per_hour
    assert cat.spot_history("aws", "us-west-2a", "p3.2xlarge") == \
        base.spot_history("aws", "us-west-2a", "p3.2xlarge")
    assert out.spot_path == spot_file(out.path) and out.spot_path.exists()


def test_without_a_price_file_the_aws_refresher_keeps_known_on_demand_prices() -> None:
    table = known_prices(load_catalog(), "aws")
    p4d = table[("p4d.24xlarge", "us-west-2")]  # the shipped price, source and date
    assert (p4d.price, p4d.source, p4d.fetched_at) == (32.7726, "skypilot aws.csv@1b1eb32",
                                                       "2021-11-10")
    assert ("p3.2xlarge", "us-east-1b") not in table  # spot rows have no on-demand price
    assert ("p5.48xlarge", "us-west-2") not in table  # unknown: spot rows only, if any


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"regions": []}, "regions: name at least one AWS region"),
    ({"regions": ["us-east-1"], "prices": "/nonexistent.csv"}, "cannot read price file"),
])
def test_aws_refresh_errors_name_the_option(tmp_path: Path, kwargs: dict[str, Any],
                                            words: str) -> None:
    with pytest.raises((ValueError, PriceFileError), match=words):
        refresh("aws", load_catalog(), tmp_path / "c.csv", NOW, **kwargs)
    with pytest.raises(ValueError, match="provider: 'azure' has no refresher"):
        refresh("azure", load_catalog(), tmp_path / "c.csv", NOW)


# -- GCP --------------------------------------------------------------------------------------


def _mt(name: str, cpus: int, gb: float) -> dict[str, Any]:
    return {"kind": "compute#machineType", "name": name, "guestCpus": cpus,
            "memoryMb": int(gb * 1024)}


def _acc(name: str, cards: int) -> dict[str, Any]:
    return {"kind": "compute#acceleratorType", "name": name, "maximumCardsPerInstance": cards}


# Two pages of each list, shaped as Compute's aggregatedList answers (REST v1): items keyed by
# scope, a scope with nothing holds a warning instead.
PAGES: dict[str, list[dict[str, Any]]] = {
    "acceleratorTypes": [
        {"zones/us-central1-a": {"acceleratorTypes": [_acc("nvidia-tesla-t4", 4),
                                                      _acc("nvidia-tesla-a100", 16),
                                                      _acc("nvidia-tesla-p4", 4)]},
         "zones/asia-east1-a": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}},
        {"zones/us-east4-c": {"acceleratorTypes": [_acc("nvidia-tesla-t4", 4)]},
         "zones/us-west1-b": {"acceleratorTypes": [_acc("nvidia-tesla-v100", 8)]}},
    ],
    "machineTypes": [
        {"zones/us-central1-a": {"machineTypes": [
            _mt("n1-standard-8", 8, 30), _mt("n1-standard-16", 16, 60),
            _mt("a2-highgpu-1g", 12, 85), _mt("a2-highgpu-8g", 96, 680)]}},
        {"zones/us-east4-c": {"machineTypes": [_mt("n1-standard-8", 8, 30)]},
         "zones/us-west1-b": {"machineTypes": [_mt("n1-standard-8", 8, 30)]}},
    ],
}


@pytest.fixture
def compute() -> Iterator[tuple[str, list[str]]]:
    """The fake: serves PAGES, a page per pageToken; yields its URL and the paths it saw."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            seen.append(url.path)
            kind = url.path.rsplit("/", 1)[-1]
            parts = url.path.split("/")
            if parts[1:5] != ["compute", "v1", "projects", "proj"] or kind not in PAGES:
                self._answer(404, {"error": {"code": 404, "message": "not found"}})
                return
            page = int(parse_qs(url.query).get("pageToken", ["0"])[0])
            body: dict[str, Any] = {"kind": f"compute#{kind}AggregatedList",
                                    "items": PAGES[kind][page]}
            if page + 1 < len(PAGES[kind]):
                body["nextPageToken"] = str(page + 1)
            self._answer(200, body)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow  # moto's 1,400 instance types / google-cloud-compute's import
def test_gcp_refresh_lists_zones_and_prices_from_the_file(
        compute: tuple[str, list[str]], tmp_path: Path) -> None:
    from google.auth.credentials import AnonymousCredentials

    url, seen = compute
    base = load_catalog()
    out = refresh("gcp", base, tmp_path / "cat.csv", NOW, project="proj", endpoint=url,
                  credentials=AnonymousCredentials())
    assert seen.count("/compute/v1/projects/proj/aggregated/acceleratorTypes") == 2  # paged
    cat = load_catalog(out.path)
    got = {o.id: o for o in cat.offers("gcp", Resources())}
    zone_a = {i.split("/")[1] for i in got if ":us-central1-a:" in i}
    # T4 x1 and x2 on n1-standard-8/16 (no n1-standard-32 there, so no x4), A100 x1 and x8;
    # P4 is not a model Spillway knows
    assert zone_a == {"n1-standard-8+nvidia-tesla-t4x1", "n1-standard-16+nvidia-tesla-t4x2",
                      "a2-highgpu-1g", "a2-highgpu-8g"}
    assert out.skipped["nvidia-tesla-p4"] == 1
    assert out.skipped["nvidia-tesla-t4 in us-east4 (no price)"] == 1  # no host rates there
    a2 = got["gcp:us-central1:us-central1-a:ondemand/a2-highgpu-1g"]
    shipped = base.offers("gcp", Resources(gpu_model="A100", gpu_count=1, regions=(
        "us-central1",)))
    same = next(o for o in shipped if o.id == a2.id)
    assert a2.price_per_hour == same.price_per_hour  # the shipped price file, the same sums
    assert a2.extra["machine_type"] == "a2-highgpu-1g" and a2.extra["vcpus"] == 12
    v100 = got["gcp:us-west1:us-west1-b:spot/n1-standard-8+nvidia-tesla-v100x1"]
    assert v100.extra["accelerator_type"] == "nvidia-tesla-v100"
    assert v100.extra["accelerator_count"] == 1 and v100.carbon_zone == "US-NW-BPAT"
    # GCP rows of the regions read are replaced; AWS rows kept
    assert not [i for i in got if i.startswith("gcp:us-central1:us-central1-b:")]
    assert cat.offers("aws", Resources()) == base.offers("aws", Resources())


def test_gcp_refresh_needs_a_project_and_a_good_price_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="project: name the GCP project"):
        refresh("gcp", load_catalog(), tmp_path / "c.csv", NOW)
    bad = tmp_path / "prices.json"
    bad.write_text('{"hosts": {}}')
    with pytest.raises(PriceFileError, match="needs the keys 'accelerators' and 'hosts'"):
        read_gcp_prices(bad)
    bad.write_text("{")
    with pytest.raises(PriceFileError, match="not JSON"):
        read_gcp_prices(bad)
