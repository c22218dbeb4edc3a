"""Workload traces for the simulator: the packaged Philly trace, or a CSV file of your own.

``load_trace(source)`` returns a :class:`~broker.sim.types.Trace`: jobs sorted by
``(submit_s, id)``, ``submit_s`` in seconds since the first kept job, and ``notes`` saying what
was derived. The same (source, options, seed) always gives the same trace.

Sources and formats
-------------------

``"philly"``
    The Microsoft Philly trace, Sep-Oct 2017 (52,849 jobs; ``broker/sim/data/philly.csv.gz``,
    CC BY 4.0, see ``data/NOTICE.md``). Columns ``timestamp,duration,num_gpus,gpu_time,cluster``.
    Timestamps are the trace's naive local clock and are read as UTC. ``team`` is
    ``"vc-" + cluster`` (the Philly virtual cluster); ``id`` is ``philly-NNNNNN``, the row's index
    in the file (0 = first data row), stable across loads and windows. Rows with
    ``duration <= 0`` are dropped and counted in the notes. The trace has no time limits, classes
    or GPU types: limits and classes are derived (below) and every job runs on any GPU.

a path to a CSV file (``.csv`` or ``.csv.gz``), the generic format
    A header row is required; columns may come in any order; unknown columns are refused.

    ============== ======== ==================================================================
    column         required meaning
    ============== ======== ==================================================================
    submit_time    yes      ISO 8601 (UTC when it has no zone) or seconds (epoch or relative)
    duration_s     yes      runtime in seconds, > 0 (on ``gpu_type`` when given)
    num_gpus       yes      total GPUs, a whole number >= 1 (split into a gang when larger than
                            a node, below)
    id             no       unique; default ``job-NNNNNN`` (the data row's index, from 0)
    team           no       default ``default``
    gpu_type       no       the GPU family or model the duration was measured on (``A100``,
                            ``A100-80GB``); it also pins the job to that type
    priority       no       a class name of the simulated cluster; default: drawn (below)
    time_limit_s   no       seconds, > 0; may be below ``duration_s`` (the simulator then kills
                            the job at its limit); default: derived (below)
    preemptible    no       true/false/yes/no/1/0; empty: as the job's class says
    name           no       free text
    ============== ======== ==================================================================

    Empty optional cells mean "not given". Bad input raises :class:`TraceError` (a
    :class:`~broker.errors.ConfigError`) naming the file, the line, the column, what is wrong and
    what is allowed.

Windows and load scaling
------------------------

``start``/``end`` (epoch seconds, or the file's own seconds when it uses relative times) keep
the jobs with ``start <= submit < end``. ``load_scale`` X then keeps every job and divides every
gap between consecutive arrivals by X: ``submit_s = (submit - first_submit) / X``. X > 1 packs
the same work into less time (more offered load); X < 1 spreads it out.
:func:`busiest_window`, :func:`offered_load_gpus` and :func:`scale_for` help choose both.

Gangs
-----

A job asking for G GPUs with G > ``max_gpus_per_node`` becomes a gang of n nodes x G/n GPUs,
where n starts at ``ceil(G / max_gpus_per_node)`` and grows until it divides G (12 -> 2 x 6,
16 -> 2 x 8, 24 -> 3 x 8 with 8-GPU nodes). Smaller jobs run on one node.

Derived time limits
-------------------

Where the trace gives no limit, the user's limit is modelled after two published models of
user runtime estimates on parallel machines:

- the *f-model* of Mu'alem & Feitelson ("Utilization, Predictability, Workloads, and User
  Runtime Estimates in Scheduling the IBM SP2 with Backfilling", IEEE TPDS 12(6), 2001): an
  estimate is the actual runtime times a factor drawn uniformly at random, here from
  ``[1, F]`` with ``F = 5`` (:data:`OVERESTIMATE_F`); and
- the observation of Tsafrir, Etsion & Feitelson ("Modeling User Runtime Estimates", JSSPP
  2005, LNCS 3834) that estimates are *modal*: a handful of round values (1 h, 4 h, a day, ...)
  make up most of them.

So the limit is the smallest of the usual values in :data:`USUAL_LIMITS_S` (1 h, 2 h, 4 h, 8 h,
12 h, 24 h, 48 h, 72 h, 7 days) that is at least ``duration x f``; beyond 7 days it is rounded up
to whole weeks. A derived limit is therefore always >= the duration.

Derived priority classes
------------------------

Where the trace gives no priority, each job's class is drawn with the shares of
:data:`CLASS_SHARES`: critical 2%, high 10%, normal 58%, low 30%. Only names that exist in the
simulated cluster's ``classes`` are drawn from (their shares renormalised); when none of the four
exists, every job gets the class in the middle of the ranking (``classes`` sorted by rank,
highest first, index ``len // 2``).

Both draws are deterministic per ``(seed, job id)``: they come from a BLAKE2b hash of
``"{seed}:{id}"``, not from a shared random generator, so every policy, every window and every
load scale sees the same limit and class for the same job.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import hashlib
import io
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import IO

from broker.config.core import DEFAULT_CLASSES, PriorityClass
from broker.errors import ConfigError
from broker.model import parse_time
from broker.model.gpus import GPU_FAMILIES, KNOWN_MODELS, normalise_type
from broker.sim.types import Trace, TraceJob

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY

USUAL_LIMITS_S: tuple[float, ...] = (
    1 * HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 12 * HOUR, 1 * DAY, 2 * DAY, 3 * DAY, WEEK,
)
OVERESTIMATE_F = 5.0  # the f-model's largest overestimation factor
CLASS_SHARES: tuple[tuple[str, float], ...] = (
    ("critical", 0.02), ("high", 0.10), ("normal", 0.58), ("low", 0.30),
)

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
CSV_REQUIRED = ("submit_time", "duration_s", "num_gpus")
CSV_OPTIONAL = ("id", "team", "gpu_type", "priority", "time_limit_s", "preemptible", "name")
FORMATS = ("philly", "csv")
_EPOCH_NAIVE = datetime(1970, 1, 1)
_TRUE = frozenset({"true", "yes", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "0", "n", "f"})


class TraceError(ConfigError):
    """A workload trace could not be read: the message names the file, line and column."""


# ---------------------------------------------------------------------------------------------
# Pure helpers (also used by the tests and the CLI)


def gang_shape(total_gpus: int, max_gpus_per_node: int) -> tuple[int, int]:
    """``(nodes, gpus per node)`` for a job of ``total_gpus`` on nodes of ``max_gpus_per_node``."""
    if total_gpus <= max_gpus_per_node:
        return 1, total_gpus
    nodes = -(-total_gpus // max_gpus_per_node)
    while total_gpus % nodes:
        nodes += 1
    return nodes, total_gpus // nodes


def _uniforms(seed: int, job_id: str) -> tuple[float, float]:
    """Two independent uniforms in [0, 1) that depend only on ``(seed, job_id)``."""
    digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=16).digest()
    return (int.from_bytes(digest[:8], "big") / 2.0**64,
            int.from_bytes(digest[8:], "big") / 2.0**64)


def round_limit(seconds: float) -> float:
    """The smallest usual limit >= ``seconds``; beyond 7 days, whole weeks."""
    i = bisect.bisect_left(USUAL_LIMITS_S, seconds)
    if i < len(USUAL_LIMITS_S):
        return USUAL_LIMITS_S[i]
    return math.ceil(seconds / WEEK) * WEEK


def derived_time_limit(duration_s: float, job_id: str, seed: int = 0,
                       f_max: float = OVERESTIMATE_F) -> float:
    """The user's time limit for a job that ran ``duration_s``: f-model factor, then rounding."""
    u = _uniforms(seed, job_id)[0]
    return round_limit(duration_s * (1.0 + u * (f_max - 1.0)))


def class_picker(classes: Sequence[PriorityClass]) -> tuple[Callable[[float], str], str]:
    """A function from a uniform in [0, 1) to a class name, and a note describing it."""
    names = {c.name for c in classes}
    shares = [(n, s) for n, s in CLASS_SHARES if n in names]
    if not shares:
        ranked = sorted(classes, key=lambda c: -c.rank)
        only = ranked[len(ranked) // 2].name
        return (lambda _u: only), f"every job in class {only} (no default class names)"
    total = sum(s for _, s in shares)
    bounds: list[float] = []
    acc = 0.0
    for _, s in shares:
        acc += s / total
        bounds.append(acc)
    labels = [n for n, _ in shares]
    last = len(labels) - 1

    def pick(u: float) -> str:
        return labels[min(bisect.bisect_right(bounds, u), last)]

    text = ", ".join(f"{n} {s / total:.0%}" for n, s in shares)
    return pick, text


def derived_class(job_id: str, seed: int = 0,
                  classes: Sequence[PriorityClass] = DEFAULT_CLASSES) -> str:
    """The drawn class of one job (see the module docstring)."""
    return class_picker(classes)[0](_uniforms(seed, job_id)[1])


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass(slots=True)
class _Row:
    """One job as read, before windowing, scaling and derivation."""

    id: str
    submit: float  # epoch seconds (or the file's own seconds)
    duration_s: float
    total_gpus: int
    team: str
    priority: str | None = None
    time_limit_s: float | None = None
    gpu_type: str | None = None
    preemptible: bool | None = None
    name: str | None = None


def _open_text(source: str) -> tuple[IO[str], str]:
    """The text stream of ``source`` ("philly" or a path) and the name used in messages."""
    if source == "philly":
        raw = (resources.files("broker") / "sim" / "data" / "philly.csv.gz").read_bytes()
        text = io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(raw)), encoding="utf-8",
                                newline="")
        return text, "philly"
    path = Path(source).expanduser()
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig",
                                    newline=""), str(path)
        return open(path, newline="", encoding="utf-8-sig"), str(path)
    except OSError as e:
        raise TraceError(f"cannot read trace file {path}: {e.strerror or e}; pass 'philly' "
                         "or the path of a CSV file") from None


def _fail(where: str, line: int, column: str | None, problem: str) -> TraceError:
    col = f", column {column}" if column else ""
    return TraceError(f"{where}: line {line}{col}: {problem}")


def _read_philly(reader: Iterator[list[str]], where: str) -> tuple[list[_Row], int]:
    rows: list[_Row] = []
    dropped = 0
    cache: dict[str, float] = {}
    for index, rec in enumerate(reader):
        line = index + 2
        if len(rec) != len(PHILLY_COLUMNS):
            if not rec:
                continue
            raise _fail(where, line, None, f"has {len(rec)} fields; expected "
                        f"{len(PHILLY_COLUMNS)} ({','.join(PHILLY_COLUMNS)})")
        stamp, dur, gpus, _gpu_time, cluster = rec
        try:
            duration = float(dur)
        except ValueError:
            raise _fail(where, line, "duration", f"{dur!r} is not a number of seconds") from None
        if not duration > 0:
            dropped += 1
            continue
        try:
            total = int(gpus)
        except ValueError:
            raise _fail(where, line, "num_gpus", f"{gpus!r} is not a whole number") from None
        if total < 1:
            raise _fail(where, line, "num_gpus", f"{total} must be at least 1")
        submit = cache.get(stamp)
        if submit is None:
            try:
                dt = datetime.fromisoformat(stamp)
            except ValueError:
                raise _fail(where, line, "timestamp",
                            f"{stamp!r} is not YYYY-MM-DD HH:MM:SS") from None
            # naive timestamps are UTC
            naive = dt.tzinfo is None
            submit = (dt - _EPOCH_NAIVE).total_seconds() if naive else dt.timestamp()
            cache[stamp] = submit
        rows.append(_Row(f"philly-{index:06d}", submit, duration, total, f"vc-{cluster}"))
    return rows, dropped


def _number(text: str, where: str, line: int, column: str, allowed: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(where, line, column, f"{text!r} is not a number; allowed: {allowed}") from None
    if not math.isfinite(value):
        raise _fail(where, line, column, f"{text!r} is not finite; allowed: {allowed}")
    return value


def _read_csv(header: list[str], reader: Iterator[list[str]], where: str,
              class_names: Sequence[str]) -> list[_Row]:
    columns = [h.strip() for h in header]
    known = set(CSV_REQUIRED) | set(CSV_OPTIONAL)
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise _fail(where, 1, unknown[0], f"unknown column {unknown[0]!r}; allowed: "
                    + ", ".join((*CSV_REQUIRED, *CSV_OPTIONAL)))
    missing = [c for c in CSV_REQUIRED if c not in columns]
    if missing:
        raise _fail(where, 1, missing[0], f"required column {missing[0]!r} is missing; the "
                    "header must name " + ", ".join(CSV_REQUIRED) + " (and optionally "
                    + ", ".join(CSV_OPTIONAL) + ")")
    dupes = [c for c in columns if columns.count(c) > 1]
    if dupes:
        raise _fail(where, 1, dupes[0], f"column {dupes[0]!r} appears twice")
    pos = {c: i for i, c in enumerate(columns)}
    allowed_types = ", ".join((*GPU_FAMILIES, *KNOWN_MODELS))
    rows: list[_Row] = []
    seen: dict[str, int] = {}
    for index, rec in enumerate(reader):
        line = _reader_line(reader, index)
        if not rec or all(not f.strip() for f in rec):
            continue
        if len(rec) != len(columns):
            raise _fail(where, line, None, f"has {len(rec)} fields; the header has "
                        f"{len(columns)}")

        def cell(name: str, rec: list[str] = rec) -> str:
            i = pos.get(name)
            return rec[i].strip() if i is not None else ""

        text = cell("submit_time")
        if not text:
            raise _fail(where, line, "submit_time", "is empty; allowed: ISO 8601 or seconds")
        try:
            submit = float(text)
        except ValueError:
            try:
                submit = parse_time(text)
            except ValueError:
                raise _fail(where, line, "submit_time", f"{text!r} is not an ISO 8601 time "
                            "(2017-10-03T08:00:00Z) or seconds") from None
        duration = _number(cell("duration_s"), where, line, "duration_s", "seconds > 0")
        if duration <= 0:
            raise _fail(where, line, "duration_s", f"{cell('duration_s')} must be > 0 seconds")
        gtext = cell("num_gpus")
        gnum = _number(gtext, where, line, "num_gpus", "a whole number >= 1")
        if gnum != int(gnum) or gnum < 1:
            raise _fail(where, line, "num_gpus", f"{gtext!r} is not allowed; use a whole "
                        "number >= 1")
        job_id = cell("id") or f"job-{index:06d}"
        if job_id in seen:
            raise _fail(where, line, "id", f"{job_id!r} repeats the id of line {seen[job_id]}; "
                        "ids must be unique")
        seen[job_id] = line
        priority = cell("priority") or None
        if priority is not None and priority not in class_names:
            raise _fail(where, line, "priority", f"{priority!r} is not a class of the "
                        f"simulated cluster; allowed: {', '.join(class_names)}")
        limit: float | None = None
        if cell("time_limit_s"):
            limit = _number(cell("time_limit_s"), where, line, "time_limit_s", "seconds > 0")
            if limit <= 0:
                raise _fail(where, line, "time_limit_s",
                            f"{cell('time_limit_s')} must be > 0 seconds (or leave it empty)")
        gpu_type: str | None = None
        if cell("gpu_type"):
            gpu_type = normalise_type(cell("gpu_type"))
            if gpu_type is None:
                raise _fail(where, line, "gpu_type", f"{cell('gpu_type')!r} is not a known "
                            f"GPU family or model; allowed: {allowed_types}")
        preemptible: bool | None = None
        if cell("preemptible"):
            word = cell("preemptible").lower()
            if word not in _TRUE | _FALSE:
                raise _fail(where, line, "preemptible", f"{cell('preemptible')!r} is not "
                            "allowed; use true/false, yes/no or 1/0 (or leave it empty)")
            preemptible = word in _TRUE
        rows.append(_Row(job_id, submit, duration, int(gnum), cell("team") or "default",
                         priority, limit, gpu_type, preemptible, cell("name") or None))
    return rows


def _reader_line(reader: Iterator[list[str]], index: int) -> int:
    """The physical line of the record just read (quoted newlines count), else ``index + 2``."""
    line_num = getattr(reader, "line_num", None)
    return int(line_num) if isinstance(line_num, int) else index + 2


def _sniff(header: list[str], where: str) -> str:
    cols = [h.strip() for h in header]
    if tuple(cols) == PHILLY_COLUMNS:
        return "philly"
    if "submit_time" in cols:
        return "csv"
    raise TraceError(f"{where}: line 1: the header {','.join(cols)!r} is neither the Philly "
                     f"format ({','.join(PHILLY_COLUMNS)}) nor the generic CSV format (needs "
                     f"{', '.join(CSV_REQUIRED)}); pass fmt='philly' or fmt='csv'")


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_trace(
    source: str,
    fmt: str | None = None,
    *,
    start: float | None = None,
    end: float | None = None,
    load_scale: float = 1.0,
    seed: int = 0,
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES,
    max_gpus_per_node: int = 8,
) -> Trace:
    """Read a trace (``"philly"`` or a CSV path), window it, scale it and derive what it lacks.

    See the module docstring for the formats and the derivations. Raises :class:`TraceError`.
    """
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"trace format {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
    if not (isinstance(load_scale, (int, float)) and math.isfinite(load_scale)
            and load_scale > 0):
        raise TraceError(f"load scale {load_scale!r} must be a number > 0 (1 = as recorded)")
    if max_gpus_per_node < 1:
        raise TraceError(f"max GPUs per node {max_gpus_per_node} must be at least 1")
    if not classes:
        raise TraceError("the simulated cluster has no priority classes")
    if start is not None and end is not None and end <= start:
        raise TraceError(f"the window end {end} must be after its start {start}")
    stream, where = _open_text(source)
    with stream:
        reader = csv.reader(stream)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(f"{where}: the file is empty; a header row is required") from None
        except (csv.Error, UnicodeDecodeError, OSError, EOFError) as e:
            raise TraceError(f"{where}: line 1: cannot be read as CSV: {e}") from None
        kind = fmt or ("philly" if source == "philly" else _sniff(header, where))
        try:
            if kind == "philly":
                cols = tuple(h.strip() for h in header)
                if cols != PHILLY_COLUMNS:
                    raise TraceError(f"{where}: line 1: the Philly format needs the header "
                                     f"{','.join(PHILLY_COLUMNS)}; found {','.join(cols)}")
                rows, dropped = _read_philly(reader, where)
            else:
                rows, dropped = _read_csv(header, reader, where, [c.name for c in classes]), 0
        except (csv.Error, UnicodeDecodeError, OSError, EOFError) as e:
            raise TraceError(f"{where}: line {getattr(reader, 'line_num', '?')}: cannot be "
                             f"read as CSV: {e}") from None
    notes: list[str] = [f"{where} ({kind} format): {len(rows) + dropped} jobs read"]
    if dropped:
        notes.append(f"{dropped} jobs dropped (duration <= 0)")
    total_read = len(rows)
    if start is not None or end is not None:
        lo = -math.inf if start is None else start
        hi = math.inf if end is None else end
        rows = [r for r in rows if lo <= r.submit < hi]
        span = f"[{_iso(lo) if start is not None else '-'}, {_iso(hi) if end is not None else '-'})"
        notes.append(f"window {span}: {len(rows)} of {total_read} jobs kept")
        if not rows:
            raise TraceError(f"{where}: no job was submitted in the window {span}")
    if not rows:
        raise TraceError(f"{where}: the trace has no jobs")
    rows.sort(key=lambda r: (r.submit, r.id))
    return _build(rows, where, notes, load_scale, seed, classes, max_gpus_per_node)


def _build(rows: list[_Row], where: str, notes: list[str], load_scale: float, seed: int,
           classes: tuple[PriorityClass, ...], max_per_node: int) -> Trace:
    pick, class_text = class_picker(classes)
    origin = rows[0].submit
    jobs: list[TraceJob] = []
    limits = drawn = gangs = 0
    for r in rows:
        u_limit, u_class = _uniforms(seed, r.id)
        limit = r.time_limit_s
        if limit is None:
            limit = round_limit(r.duration_s * (1.0 + u_limit * (OVERESTIMATE_F - 1.0)))
            limits += 1
        priority = r.priority
        if priority is None:
            priority = pick(u_class)
            drawn += 1
        nodes, per_node = gang_shape(r.total_gpus, max_per_node)
        if nodes > 1:
            gangs += 1
        jobs.append(TraceJob(
            id=r.id, submit_s=(r.submit - origin) / load_scale, duration_s=r.duration_s,
            gpus=per_node, nodes=nodes, team=r.team, priority=priority, time_limit_s=limit,
            gpu_type=r.gpu_type, preemptible=r.preemptible, name=r.name,
        ))
    if limits:
        notes.append(f"time limits derived for {limits} jobs (f-model F={OVERESTIMATE_F:g}, "
                     f"usual values, seed {seed})")
    if drawn:
        notes.append(f"classes drawn for {drawn} jobs ({class_text}; seed {seed})")
    if gangs:
        notes.append(f"{gangs} jobs split into gangs (at most {max_per_node} GPUs per node)")
    if load_scale != 1:
        notes.append(f"load scale {load_scale:g} (arrival gaps divided by {load_scale:g})")
    return Trace(name=where, origin=origin, jobs=tuple(jobs), notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# Offered load


def _work(jobs: Iterable[TraceJob]) -> float:
    return sum(j.total_gpus * j.duration_s for j in jobs)


def offered_load_gpus(trace: Trace) -> float:
    """Average GPUs demanded over the whole trace: GPU-seconds / (last submit - first submit).

    0.0 for an empty trace; ``inf`` when every job arrives at the same instant.
    """
    if not trace.jobs:
        return 0.0
    work = _work(trace.jobs)
    span = trace.jobs[-1].submit_s - trace.jobs[0].submit_s
    if span <= 0:
        return math.inf if work > 0 else 0.0
    return work / span


def busiest_window(trace: Trace, days: float = 14, step_s: float = 86400
                   ) -> tuple[float, float, float]:
    """The ``[start, end)`` window of ``days`` with the largest offered load, and that load.

    Windows start at the first job's ``submit_s`` and step by ``step_s`` while they end by the
    last submission (a trace shorter than the window has one window, from its start). Times
    are the trace's ``submit_s`` seconds (add ``trace.origin`` for epoch seconds when the trace
    was loaded with ``load_scale`` 1). The load is the average GPUs demanded:
    ``sum(total_gpus x duration_s)`` of the jobs submitted in the window / its length. Ties go to
    the earliest window.
    """
    length = days * DAY
    if length <= 0 or step_s <= 0:
        raise ValueError("busiest_window: days and step_s must be > 0")
    if not trace.jobs:
        return 0.0, length, 0.0
    submits = [j.submit_s for j in trace.jobs]
    prefix = [0.0]
    for j in trace.jobs:
        prefix.append(prefix[-1] + j.total_gpus * j.duration_s)
    first, last = submits[0], submits[-1]
    best = (first, first + length, -1.0)
    k = 0
    while True:
        lo = first + k * step_s
        if k and lo + length > last:
            break
        i = bisect.bisect_left(submits, lo)
        e = bisect.bisect_left(submits, lo + length)
        load = (prefix[e] - prefix[i]) / length
        if load > best[2]:
            best = (lo, lo + length, load)
        k += 1
    return best


def scale_for(trace: Trace, capacity_gpus: float, target_util: float, *,
              offered_gpus: float | None = None) -> float:
    """The ``load_scale`` that brings the offered load to ``target_util x capacity_gpus``.

    ``X = target_util x capacity_gpus / offered``, where ``offered`` is
    :func:`offered_load_gpus` of ``trace`` unless given (e.g. the load :func:`busiest_window`
    returns). X is relative to ``trace`` as loaded: load it with ``load_scale=1`` and pass X.
    """
    offered = offered_load_gpus(trace) if offered_gpus is None else offered_gpus
    if not offered > 0 or math.isinf(offered):
        raise ValueError(f"scale_for: the offered load {offered} must be finite and > 0")
    if capacity_gpus <= 0 or target_util <= 0:
        raise ValueError("scale_for: capacity_gpus and target_util must be > 0")
    return target_util * capacity_gpus / offered


def team_names(trace: Trace) -> list[str]:
    """The trace's teams, sorted."""
    return sorted({j.team for j in trace.jobs})


def class_counts(trace: Trace) -> Mapping[str, int]:
    """Jobs per class."""
    out: dict[str, int] = {}
    for j in trace.jobs:
        out[j.priority] = out.get(j.priority, 0) + 1
    return out
