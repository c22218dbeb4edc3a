"""The cloud metrics of a real scheduler, and the cloud alerts on the series it exported.

A scheduler process (which runs the provisioner) rents a machine from the ``local`` provider
(its agent is a real process). Its ``/metrics``, scraped while that happens, must say: every
live state at 0 before, then the machine BOOTING and billed, one launch, then READY with one
boot time (the record's request to ready), a launch of an unknown offer failed (``no-offer``),
a stray machine tagged with the cluster reaped as an orphan, and all back to 0 once the
machine is terminated. Then ``promtool test rules`` runs the two cloud alerts
(SpillwayInstancesStuckBooting, SpillwayOrphanInstances) on input series named and labelled
exactly as scraped (plus Prometheus' ``instance`` and ``job``), so a metric or label renamed in
broker/metrics/cloud.py without the rules fails here. Skipped, saying why, without promtool.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from broker.bus import commands
from broker.bus.app import configure
from broker.control.embedded import free_port
from broker.model import Instance, InstanceState
from providers.local import LocalProvider
from providers.userdata import render
from tests.integration.harness import running, wait_until, with_db

pytestmark = [pytest.mark.integration, pytest.mark.slow]

I = InstanceState  # noqa: E741
DB = 14  # this module's own database on the session's Redis
SITE = "local:home:home-a:ondemand"
OFFER = f"{SITE}/local-2xa100-80gb"
PRICE = 3.0
RULES = Path(__file__).resolve().parents[2] / "infra" / "prometheus" / "rules.yml"
LIVE = ("REQUESTED", "BOOTING", "READY", "DRAINING")

Key = tuple[str, frozenset[tuple[str, str]]]  # sample name, labels


def scrape(port: int) -> dict[Key, float]:
    """Every sample of the scheduler's /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Mapping[Key, float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def scraped(port: int, check: Any, what: str) -> dict[Key, float]:
    """The first scrape for which ``check(samples)`` holds (polled, with a deadline)."""
    last: list[dict[Key, float]] = []

    def attempt() -> bool:
        try:
            last[:] = [scrape(port)]
        except OSError:
            return False  # (not serving yet)
        return bool(check(last[0]))

    wait_until(attempt, 60, what)
    return last[0]


def states(samples: Mapping[Key, float], name: str) -> dict[str, float | None]:
    return {s: value(samples, name, state=s) for s in LIVE}


def series_of(samples: Mapping[Key, float], name: str) -> list[dict[str, str]]:
    """The label sets the scheduler exported for ``name``."""
    return [dict(labels) for n, labels in samples if n == name]


def selector(name: str, labels: Mapping[str, str]) -> str:
    """A promtool series: the scraped labels plus the ones Prometheus adds."""
    every = {**labels, "instance": "sched-a:9464", "job": "spillway-scheduler"}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(every.items())) + "}"


def _config(tmp: Path, cluster: str) -> Path:
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "cluster_name": cluster,
        "providers": {"local": {"gpus": "2xA100-80GB", "cpus": 4, "memory_gb": 8,
                                "price_per_hour": PRICE, "boot_delay_s": 3.0,
                                "state_dir": str(tmp / "cloud"), "boot_timeout_s": 60,
                                "idle_timeout_s": 600, "stop_timeout_s": 5}},
    }))
    return cfg


def test_a_real_scheduler_exports_the_cloud_series_the_alerts_fire_on(
        redis_url: str, tmp_path: Path) -> None:
    url = with_db(redis_url, DB)
    cluster = "t" + uuid.uuid4().hex[:8]
    provider = LocalProvider("local", cluster, state_dir=str(tmp_path / "cloud"))
    port = free_port()
    try:
        with running(url, tmp_path) as c:
            c.env.update(SPILLWAY_CONFIG=str(_config(tmp_path, cluster)),
                         SPILLWAY_METRICS_PORT=str(port), SPILLWAY_AGENT_METRICS_PORT="0")
            c.start_scheduler()
            before = scraped(port, lambda s: value(s, "spillway_leader") == 1
                             and value(s, "spillway_instances", state="READY") is not None,
                             "the leader to export the cloud series")
            assert states(before, "spillway_instances") == dict.fromkeys(LIVE, 0.0)
            assert states(before, "spillway_instances_oldest_seconds") == dict.fromkeys(LIVE, 0)
            assert value(before, "spillway_cloud_spend_dollars_per_hour") == 0
            assert value(before, "spillway_orphan_instances") == 0
            assert value(before, "spillway_instance_launches_total", provider="local") == 0
            assert value(before, "spillway_orphans_reaped_total", provider="local") == 0

            # a launch: BOOTING (boot_delay_s 3), billed, counted
            done = subprocess.run([sys.executable, "-m", "broker.cli", "--redis-url", url,
                                   "launch", OFFER], env=c.env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            rid = done.stdout.split()[0]
            booting = scraped(port, lambda s: value(s, "spillway_instances", state="BOOTING")
                              == 1, "the machine to be exported BOOTING")
            assert (value(booting, "spillway_instances_oldest_seconds", state="BOOTING")
                    or 0) > 0
            assert value(booting, "spillway_cloud_spend_dollars_per_hour") == PRICE
            assert value(booting, "spillway_instance_launches_total", provider="local") == 1

            # its agent registers: READY, one boot time, the record's request to ready
            ready = scraped(port, lambda s: value(s, "spillway_instances", state="READY") == 1
                            and value(s, "spillway_instance_boot_seconds_count",
                                      provider="local") == 1,
                            "the machine to be exported READY with its boot time")
            record = c.store.instance(rid)
            assert record is not None and record.ready_at is not None
            assert value(ready, "spillway_instances", state="BOOTING") == 0
            assert value(ready, "spillway_instance_boot_seconds_sum", provider="local") == \
                pytest.approx(record.ready_at - record.requested_at, abs=1e-3)
            assert value(ready, "spillway_cloud_spend_dollars_per_hour") == PRICE

            # a launch of an offer the provider does not have: failed, by its reason
            celery = configure(Celery("test-cloud-metrics"), url)
            bad = "bad-" + uuid.uuid4().hex[:6]
            c.store.record_instances([Instance(bad, f"{SITE}/no-such-type",
                                               requested_at=time.time())])
            commands.launch(celery, f"{SITE}/no-such-type", 1, bad)
            scraped(port, lambda s: value(s, "spillway_instance_launch_failures_total",
                                          provider="local", reason="no-offer") == 1,
                    "the failed launch to be counted")

            # a machine nobody asked for, tagged with this cluster: reaped as an orphan
            offer = c.store.offers(time.time())[0]
            stray = "stray-" + uuid.uuid4().hex[:6]
            provider.launch(offer, 1, stray, render(offer, "local", url, stray, "",
                                                    f"{sys.executable} -m broker.cli"))
            reaped = scraped(port, lambda s: value(s, "spillway_orphans_reaped_total",
                                                   provider="local") == 1,
                             "the orphan to be reaped and counted")
            assert not any(m.request_id == stray for m in provider.instances().values())
            scraped(port, lambda s: value(s, "spillway_orphan_instances") == 0,
                    "the next lifecycle pass to find no orphan")

            # terminated: every state back to 0, nothing billed
            commands.terminate(celery, [rid], "test: done")
            after = scraped(port, lambda s: value(s, "spillway_instances", state="READY") == 0,
                            "the terminated machine to leave the gauges")
            assert states(after, "spillway_instances") == dict.fromkeys(LIVE, 0.0)
            assert value(after, "spillway_cloud_spend_dollars_per_hour") == 0
            assert value(after, "spillway_instance_launches_total", provider="local") == 1
    finally:
        provider.terminate(list(provider.instances()))

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run "
                    "installs it): the scraped series were checked, the alerts not run on them")
    test = alert_tests(booting, reaped)
    (tmp_path / "cloud_scraped.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", str(tmp_path / "cloud_scraped.yml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def alert_tests(booting: Mapping[Key, float], reaped: Mapping[Key, float]) -> dict[str, Any]:
    """A promtool test file of the two cloud alerts whose input series are the ones scraped:
    the oldest-in-state series (the BOOTING one, found by its value, goes on booting: first
    the value scraped, then 60 s more a minute), and the orphan gauge (an orphan that stays
    from t=2m: its termination fails)."""
    oldest = "spillway_instances_oldest_seconds"
    sets = series_of(booting, oldest)
    assert len(sets) == len(LIVE), sets
    stuck = next(labels for labels in sets
                 if (booting[(oldest, frozenset(labels.items()))] or 0) > 0)
    first = booting[(oldest, frozenset(stuck.items()))]
    series = [{"series": selector(oldest, labels),
               "values": f"{first:g} 60+60x18" if labels == stuck else "0x19"}
              for labels in sets]
    (orphan_labels,) = series_of(reaped, "spillway_orphan_instances")
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {"interval": "1m", "input_series": series, "alert_rule_test": [
                {"eval_time": "15m", "alertname": "SpillwayInstancesStuckBooting",
                 "exp_alerts": []},
                {"eval_time": "16m", "alertname": "SpillwayInstancesStuckBooting",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "state": "BOOTING"},
                                 "exp_annotations": {"summary": "A cloud instance has been "
                                                                "BOOTING for 16m 0s"}}]}]},
            {"interval": "1m", "input_series": [
                {"series": selector("spillway_orphan_instances", orphan_labels),
                 "values": "0 0 1x15"}], "alert_rule_test": [
                {"eval_time": "11m", "alertname": "SpillwayOrphanInstances", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "SpillwayOrphanInstances",
                 "exp_alerts": [{"exp_labels": {"severity": "warning"}, "exp_annotations": {
                     "summary": "1 orphan cloud instance(s) for 10 min",
                     "description": orphan_description()}}]}]},
        ],
    }


def orphan_description() -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rule = next(r for g in groups for r in g["rules"]
                if r.get("alert") == "SpillwayOrphanInstances")
    return str(rule["annotations"]["description"])
