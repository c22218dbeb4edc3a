"""Simulator report: charts and index.html from small synthetic results."""

from __future__ import annotations

import builtins
import re
from pathlib import Path
from typing import Any

import pytest

from broker.errors import ConfigError
from broker.sim.metrics import compute_metrics
from broker.sim.report import CHARTS, bucket_series, write_report
from broker.sim.types import JobRecord, Sample, SimResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic(policy: str, wait_scale: float, n_samples: int = 50) -> SimResult:
    records = []
    for i in range(40):
        submit = 60.0 * i
        start = None if i % 13 == 12 else submit + wait_scale * (i % 7)
        records.append(JobRecord(
            id=f"{policy}-{i}", team=f"team-{i % 5}", priority=("high", "normal")[i % 2],
            gpus=1 + i % 4, submit_s=submit, duration_s=300.0 + 10 * i, sla_s=600.0,
            first_start_s=start, end_s=None if start is None else start + 300.0 + 10 * i,
            preemptions=int(i % 3 == 0), lost_gpu_s=0.0, infeasible=i == 39,
        ))
    samples = [Sample(t=30.0 * k, busy_gpus=(k * 3) % 9, queued_jobs=k % 4, queued_gpus=k % 6)
               for k in range(n_samples)]
    result = SimResult(policy, 8, records, samples, meta={"trace": "synthetic <&>", "seed": 3})
    result.metrics = compute_metrics(result, wall_s=0.5, invariant_violations=0)
    return result


def test_write_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = [synthetic("fifo", 30.0), synthetic("fair<share>", 300.0, n_samples=5000)]
    index = write_report(results, tmp_path / "report")

    assert index == tmp_path / "report" / "index.html"
    text = index.read_text(encoding="utf-8")
    for name, _ in CHARTS:
        png = index.parent / name
        assert png.is_file()
        assert png.read_bytes()[:8] == PNG_MAGIC
        assert f'src="{name}"' in text
    assert "fifo" in text
    assert "fair&lt;share&gt;" in text and "fair<share>" not in text
    assert "synthetic &lt;&amp;&gt;" in text
    assert text.lstrip().startswith("<!DOCTYPE html>")
    assert not re.search(r'src="(/|[a-z]+:)', text)  # relative image paths only


def test_write_report_with_empty_result(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    empty = SimResult("idle", 4, [], [])
    index = write_report([empty], tmp_path)
    assert "idle" in index.read_text(encoding="utf-8")
    for name, _ in CHARTS:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_missing_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ConfigError, match=r"spillway\[sim\]"):
        write_report([synthetic("fifo", 1.0)], tmp_path)


def test_bucket_series_time_weighted() -> None:
    # 0..10: 4, 10..40: 0  -> buckets of 20 s: (4*10 + 0*10) / 20 = 2, then 0.
    samples = [Sample(0.0, 4, 0, 0), Sample(10.0, 0, 0, 0), Sample(20.0, 0, 0, 0),
               Sample(40.0, 8, 0, 0)]
    xs, ys = bucket_series(samples, lambda s: float(s.busy_gpus), max_points=2)
    assert xs == [0.0, 20.0]
    assert ys == [2.0, 0.0]
    # Few samples: returned as they are.
    xs, ys = bucket_series(samples, lambda s: float(s.busy_gpus), max_points=10)
    assert ys == [4.0, 0.0, 0.0, 8.0]
    # Many samples: at most max_points, the mean preserved.
    many = [Sample(float(t), t % 10, 0, 0) for t in range(100_001)]
    xs, ys = bucket_series(many, lambda s: float(s.busy_gpus), max_points=2000)
    assert len(xs) == len(ys) == 2000
    assert sum(ys) / len(ys) == pytest.approx(4.5)


# ------------------------------------------------------------- charts that compare, readable html

ORIGIN = 1508841041.0  # 2017-10-24 10:30:41 UTC


def dated(policy: str, wait_scale: float) -> SimResult:
    res = synthetic(policy, wait_scale)
    res.meta = {"trace": "philly", "trace_origin": ORIGIN, "window_start": ORIGIN,
                "window_end": ORIGIN + 2 * 86400, "load_scale": 0.5, "last_submit_s": 1200.0,
                "notes": ["window kept", "load scale 0.5"]}
    res.metrics["meta"] = res.meta
    return res


def figures(results: list[SimResult], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import broker.sim.report_charts as charts

    saved: dict[str, Any] = {}
    real_save = charts._save

    def keep(fig: Any, path: Path) -> None:
        saved[path.name] = fig
        real_save(fig, path)

    monkeypatch.setattr(charts, "_save", keep)
    write_report(results, tmp_path)
    return saved


def test_time_axes_use_the_traces_dates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.dates as mdates

    saved = figures([dated("fcfs", 3000.0), dated("spillway", 30.0)], tmp_path, monkeypatch)
    for name in ("utilization.png", "queue.png"):
        ax = saved[name].axes[0]
        assert ax.get_xlabel().startswith("trace date (UTC")
        assert "load scale 0.5" in ax.get_xlabel()
        first = mdates.num2date(ax.lines[-1].get_xdata()[0])  # lines[0]: the last arrival
        assert first.strftime("%Y-%m-%d %H:%M") == "2017-10-24 10:30"
        saved[name].canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert any(lab.startswith("Oct") for lab in labels), labels


def test_waits_queues_and_slowdowns_on_log_scales(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    saved = figures([dated("fcfs", 3000.0), dated("spillway", 30.0)], tmp_path, monkeypatch)
    assert saved["queue.png"].axes[0].get_yscale() == "symlog"
    wait_ax, bsld_ax = saved["per_team.png"].axes
    assert wait_ax.get_yscale() == "symlog" and bsld_ax.get_yscale() == "log"
    cdf = saved["wait_cdf.png"].axes[0]
    assert cdf.get_xscale() == "log"
    assert {"1 min", "1 h"} <= {t.get_text() for t in cdf.get_xticklabels()}


def test_index_shows_hours_and_dates(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    text = write_report([dated("fcfs", 3000.0), dated("spillway", 30.0)],
                        tmp_path).read_text(encoding="utf-8")
    assert "2017-10-24 10:30 UTC" in text and "2017-10-26 10:30 UTC" in text
    assert "1508841041" not in text  # no epoch seconds
    assert "[&#x27;" not in text and "['" not in text  # no Python lists
    assert "<li>window kept</li>" in text
    cells = re.findall(r"<td>([^<]*)</td>", text)
    row = cells.index("wait mean")
    assert all(re.fullmatch(r"[\d.]+ (s|min|h)( \([\d.]+ days\))?", c)
               for c in cells[row + 1:row + 3]), cells[row:row + 3]
    assert "wait_mean_s" not in text and "(s)" not in text
