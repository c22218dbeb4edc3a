"""Reading a trace file, per format: the packaged Philly trace and the generic CSV (their
columns and checks: broker/sim/trace.py's docstring). :func:`read_rows` returns the jobs as
read, before broker/sim/trace.py windows, scales and completes them.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import IO

from broker.errors import ConfigError
from broker.model import parse_time
from broker.model.gpus import GPU_FAMILIES, KNOWN_MODELS, normalise_type

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
CSV_REQUIRED = ("submit_time", "duration_s", "num_gpus")
CSV_OPTIONAL = ("id", "team", "gpu_type", "priority", "time_limit_s", "preemptible", "name")
FORMATS = ("philly", "csv")
_EPOCH_NAIVE = datetime(1970, 1, 1)
_TRUE = frozenset({"true", "yes", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "0", "n", "f"})


class TraceError(ConfigError):
    """A workload trace could not be read: the message names the file, line and column."""


@dataclass(slots=True)
class Row:
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


def _read_philly(reader: Iterator[list[str]], where: str) -> tuple[list[Row], int]:
    rows: list[Row] = []
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
        rows.append(Row(f"philly-{index:06d}", submit, duration, total, f"vc-{cluster}"))
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
              class_names: Sequence[str]) -> list[Row]:
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
    rows: list[Row] = []
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
        rows.append(Row(job_id, submit, duration, int(gnum), cell("team") or "default",
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


def read_rows(source: str, fmt: str | None, class_names: Sequence[str]
              ) -> tuple[list[Row], int, str, str]:
    """The jobs of ``source`` (``"philly"`` or a CSV path) as read, in file order; how many
    rows were dropped (Philly: duration <= 0); the name used in messages; the format read
    (``fmt``, else sniffed from the header). Raises :class:`TraceError`."""
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
                rows, dropped = _read_csv(header, reader, where, class_names), 0
        except (csv.Error, UnicodeDecodeError, OSError, EOFError) as e:
            raise TraceError(f"{where}: line {getattr(reader, 'line_num', '?')}: cannot be "
                             f"read as CSV: {e}") from None
    return rows, dropped, where, kind
