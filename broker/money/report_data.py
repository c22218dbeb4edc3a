"""What the spend report reads from the store (Redis in production): the ledger's charges, the
budgets and reservations (the budget book, broker/store/budgets.py), every job's runs (the hot
jobs and the archive of old finished ones), the nodes and the cloud instance records (also the
machines behind the charges: their booked hours replayed through the ledger's split,
broker/money/ledger_report.py); and the emissions and chargeback functions built from the
configuration (``energy:``, ``carbon:``, ``onprem_price_per_gpu_hour``). :func:`gather`
hands :func:`broker.money.report.build` its inputs.

A run's site and GPU model come from its node; a cloud node that is gone (its machine was given
back and the node forgotten) is found through the instance record that names it: the site is
the offer id's, the model the published offer's or the offer catalog's for that instance type.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from broker.config.core import Config
from broker.config.energy import build_source
from broker.energy.model import emissions_kg
from broker.model import Instance, Job, Node
from broker.money.ledger_report import machine_charges, spend_rows
from broker.money.report import Charge, Inputs, Run
from broker.money.report_window import ReportError, Window
from broker.store.base import BaseStore
from broker.store.budgets import BudgetBook, budget_book
from providers.carbon.averages import yearly_average
from providers.carbon.base import CarbonError, CarbonSource
from providers.catalog.zones import site_zone

log = logging.getLogger(__name__)
UNKNOWN = "unknown"


def archived_jobs(store: BaseStore) -> list[Job]:
    """The jobs moved to the store's archive (finished more than ``retain_finished_s`` ago):
    the Redis hash ``<prefix>archive`` or the memory store's dict (the store has no listing
    of them; ``get`` reads one at a time)."""
    client, key = getattr(store, "redis", None), getattr(store, "_k_archive", None)
    raws: Iterable[Any]
    if client is not None and key:
        raws = (v for _, v in client.hscan_iter(key, count=1000))
    else:
        raws = list(getattr(store, "_archived", {}).values())
    out = []
    for raw in raws:
        data = raw if isinstance(raw, bytes) else str(raw).encode("latin-1")
        out.append(Job.from_dict(json.loads(zlib.decompress(data))))
    return out


@dataclass
class Places:
    """Where each node is and what GPUs it has, from the nodes and the instance records."""

    nodes: Mapping[str, Node]
    instances: Mapping[str, Instance]  # by node id
    offer_models: Mapping[str, str]  # offer id -> GPU model
    offer_gpus: Mapping[str, int] = field(default_factory=dict)  # offer id -> GPU count
    _catalog: dict[tuple[str, str], tuple[str, int]] | None = None

    @classmethod
    def of(cls, store: BaseStore, now: float) -> Places:
        offers = store.offers(now, include_blocked=True)
        return cls({n.id: n for n in store.nodes()},
                   {i.node_id: i for i in store.instances() if i.node_id},
                   {o.id: o.gpu_model for o in offers}, {o.id: o.gpu_count for o in offers})

    def gpus_of(self, inst: Instance) -> int:
        """A machine's GPU count as the ledger counts it (broker.money.ledger.accrue_store): its
        published offer's, else its node's, else the offer catalog's, else 1."""
        node = self.nodes.get(inst.node_id)
        return self.offer_gpus.get(inst.offer_id) or (len(node.gpus) if node else 0) or \
            self._catalog_row(inst.offer_id)[1] or 1

    def _catalog_model(self, offer_id: str) -> str:
        return self._catalog_row(offer_id)[0]

    def _catalog_row(self, offer_id: str) -> tuple[str, int]:
        if self._catalog is None:
            from providers.catalog import load_catalog

            try:
                rows = load_catalog().rows
            except (OSError, ValueError) as e:
                log.warning("offer catalog unreadable (%s); GPU models of gone machines "
                            "unknown", e)
                rows = ()
            self._catalog = {(r.provider, r.instance_type): (r.gpu_model, r.gpu_count)
                             for r in rows}
        site, _, itype = offer_id.partition("/")
        return self._catalog.get((site.split(":", 1)[0], itype), ("", 0))

    def where(self, node_id: str, gpu_ids: Sequence[str], job: Job) -> tuple[str, str]:
        """(site, GPU model) of a run on ``node_id``; site ``unknown`` when no record names
        the node, model from the job's ``gpu_types`` (or ``unknown``) when nothing else."""
        node = self.nodes.get(node_id)
        if node is not None:
            held = set(gpu_ids)
            models = [g.model for g in node.gpus if g.id in held] or [g.model for g in node.gpus]
            if models:
                return node.site, models[0]
            site = node.site
        else:
            inst = self.instances.get(node_id)
            site = inst.offer_id.partition("/")[0] if inst else UNKNOWN
            if inst is not None:
                model = self.offer_models.get(inst.offer_id) or \
                    self._catalog_model(inst.offer_id)
                if model:
                    return site, model
        return site, job.spec.gpu_types[0] if job.spec.gpu_types else UNKNOWN


def runs_of(jobs: Iterable[Job], places: Places, start: float, end: float,
            now: float) -> list[Run]:
    """Every piece of GPU time of ``jobs`` that overlaps [start, end): one per attempt and
    node; an attempt still open runs until ``now`` (or the job's end)."""
    out = []
    for job in jobs:
        for att in job.attempts:
            stop = att.ended_at if att.ended_at is not None else (job.finished_at or now)
            if att.started_at >= end or stop <= start:
                continue
            for a in att.allocations:
                site, model = places.where(a.node_id, a.gpu_ids, job)
                out.append(Run(job.team, site, model, float(len(a.gpu_ids) or job.res.gpus),
                               att.started_at, stop))
    return out


def charges_of(book: BudgetBook, window: Window) -> list[Charge]:
    """The ledger's charges on the window's days (its read API, broker/money/ledger_report.py)."""
    until = (window.last + timedelta(days=1)).isoformat()
    return [Charge(r.team, r.site, r.day, r.usd)
            for r in spend_rows(book, since=window.first.isoformat(), until=until)]


class StaticAverages:
    """A carbon source of each zone's static yearly average (docs/carbon.md), used when no
    source is configured."""

    name = "static yearly averages"

    def __init__(self, overrides: Mapping[str, float] | None = None) -> None:
        self.overrides = dict(overrides or {})

    def intensity(self, zone: str, at: float) -> float:
        g = yearly_average(zone, self.overrides)
        if g is None:
            raise CarbonError(f"no yearly average for zone {zone}")
        return g

    def forecast(self, zone: str, start: float, end: float) -> list[tuple[float, float]]:
        return [(start, self.intensity(zone, start))]


@dataclass
class Emitter:
    """The report's emissions function (:data:`broker.money.report.Emit`) over the configured
    energy model and carbon source; a zone the source cannot answer for the run's time falls
    back to the zone's yearly average, and the report says so."""

    config: Config
    source: CarbonSource
    fallbacks: set[str] = field(default_factory=set)

    def __call__(self, site: str, gpus: float, model: str, a: float,
                 b: float) -> tuple[str, float | None, float]:
        energy = self.config.energy
        kwh = energy.model.energy_kwh(gpus, model, site, b - a)
        zone = site_zone(site, energy.zones()) if site != UNKNOWN else ""
        if not zone:
            return "", None, kwh
        try:
            return zone, emissions_kg(energy.model, self.source, zone, site, a, b, gpus,
                                      model), kwh
        except (CarbonError, ValueError, KeyError):
            g = yearly_average(zone, self.config.carbon.averages)
            self.fallbacks.add(zone)
            return zone, None if g is None else kwh * g / 1000.0, kwh

    def chargeback(self, site: str, gpus: float, model: str, a: float, b: float) -> float:
        return self.config.energy.onprem_cost_usd(site, gpus, model, a, b,
                                                  self.config.onprem_price_per_gpu_hour)


def emitter(config: Config) -> tuple[Emitter, list[str]]:
    """The emitter over the configured source when it holds measured history (CSV series);
    else over the zones' yearly averages (a web source knows a day of history at most, and a
    call per run would be slow), with a note saying so."""
    source = build_source(config.carbon)
    if source is not None and callable(getattr(source, "actual", None)):
        return Emitter(config, source), []
    notes = [] if source is None else [
        f"carbon source {config.carbon.source} keeps no history of past windows; the zones' "
        "yearly averages were used (configure a csv source for measured series)"]
    return Emitter(config, StaticAverages(config.carbon.averages)), notes


def gather(store: BaseStore, config: Config, window: Window, now: float,
           team: str | None = None) -> tuple[Inputs, Emitter]:
    """The report's inputs from ``store`` (see the module docstring), and its emitter."""
    book = budget_book(store)
    charges = charges_of(book, window)
    budgets = book.budgets()
    jobs = [*store.list_jobs(), *archived_jobs(store)]
    places = Places.of(store, now)
    runs = runs_of(jobs, places, window.start, min(window.end, now), now)
    until = (window.last + timedelta(days=1)).isoformat()
    machines = machine_charges(book, store.instances(), jobs, places.gpus_of,
                               window.first.isoformat(), until)
    if team is not None:
        known = set(budgets) | {k[0] for k in book.sums()} | {j.team for j in jobs}
        if team not in known:
            allowed = ", ".join(sorted(known)[:20]) or "none yet"
            raise ReportError("--team", f"{team!r} has no budget, charge or job in the store",
                              allowed)
    spent_total = {t: book.spent(t).get("total", 0.0) for t, b in budgets.items()
                   if b.window == "total"}
    notes = []
    unknown_sites = sum(r.site == UNKNOWN for r in runs)
    if unknown_sites:
        notes.append(f"{unknown_sites} run(s) on nodes no record names any more: site "
                     "'unknown' (no chargeback, no emissions)")
    em, more = emitter(config)
    notes += more
    return Inputs(window, now, charges, runs, budgets, book.reserved(), spent_total, team,
                  em.source.name, notes, machines), em


def fallback_note(em: Emitter) -> list[str]:
    if not em.fallbacks:
        return []
    return [f"carbon source {em.source.name} had no data for zone(s) "
            f"{', '.join(sorted(em.fallbacks))} over the window; their yearly averages were "
            "used"]
