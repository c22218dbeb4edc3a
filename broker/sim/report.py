"""An HTML report of one or more simulation runs: PNG charts (matplotlib, Agg) and the metrics.

``write_report(results, out_dir)`` writes ``utilization.png``, ``queue.png``, ``wait_cdf.png``,
``per_team.png`` and ``index.html`` (relative image paths, inline CSS) into ``out_dir``.
matplotlib is an optional dependency (``pip install 'spillway[sim]'``) imported only for the
charts (broker/sim/report_charts.py); the page is broker/sim/report_html.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from broker.errors import ConfigError
from broker.sim.report_charts import CHARTS, bucket_series, metrics_of, write_charts
from broker.sim.report_html import page
from broker.sim.types import SimResult

__all__ = ["CHARTS", "bucket_series", "write_report"]


def write_report(results: Sequence[SimResult], out_dir: str | Path) -> Path:
    """Write the charts and ``index.html`` comparing ``results`` into ``out_dir`` (created if
    needed); return the path of ``index.html``. Needs matplotlib (the ``sim`` extra)."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as e:
        raise ConfigError("--report needs matplotlib: pip install 'spillway[sim]'") from e

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_charts(results, out)
    index = out / "index.html"
    index.write_text(page(results, [metrics_of(r) for r in results]), encoding="utf-8")
    return index
