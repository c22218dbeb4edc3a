"""``spillway report``: cloud spend against caps, forecast, GPU-hours, on-prem chargeback and
emissions over a month, a week or a range of days, by team, site or day, as a table, CSV,
JSON or a self-contained HTML page with charts (docs/reports.md). With an ``https://`` URL the
API server makes it (a finance token's teams only) and it is rendered here."""

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from broker.cli.common import err, fail, print_fitted, settings, spec_error, table_width
from broker.cli.root import app

Opt = typer.Option


def _choice(value: str, field: str, allowed: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise spec_error(field, f"{value!r} is not allowed", ", ".join(allowed))
    return v


@app.command("report")
def report(
    ctx: typer.Context,
    month: Annotated[str | None, Opt("--month", help="A UTC calendar month, YYYY-MM "
                                                    "(default: this month).")] = None,
    week: Annotated[str | None, Opt("--week", help="An ISO week, YYYY-Www (2026-W47).")
                    ] = None,
    from_: Annotated[str | None, Opt("--from", help="First day, YYYY-MM-DD (with --to).")
                     ] = None,
    to: Annotated[str | None, Opt("--to", help="Last day, YYYY-MM-DD, included.")] = None,
    by: Annotated[str, Opt("--by", help="Rows by team, site or day.")] = "team",
    fmt: Annotated[str, Opt("--format", help="table, csv, json or html (one file with "
                                             "charts).")] = "table",
    team: Annotated[str | None, Opt("--team", help="Only this team.")] = None,
    out_file: Annotated[Path | None, Opt("--out", dir_okay=False,
                                         help="Write to FILE instead of stdout.")] = None,
    forecast: Annotated[str, Opt("--forecast", help="mean: mean daily spend so far; linear: "
                                                    "a line through the daily spend.")
                        ] = "mean",
    now: Annotated[float | None, Opt("--now", hidden=True,
                                     help="Unix time to report at (tests).")] = None,
) -> None:
    """Cloud spend against each team's cap, the forecast to the window's end, on-prem
    chargeback, GPU-hours and emissions, from the ledger, jobs and instances in the store."""
    from broker.money.report import BY, FORECASTS, build
    from broker.money.report_data import fallback_note, gather
    from broker.money.report_html import to_html
    from broker.money.report_render import FORMATS, renderable, to_csv
    from broker.money.report_window import ReportError, parse_window

    by = _choice(by, "--by", BY)
    fmt = _choice(fmt, "--format", FORMATS)
    forecast = _choice(forecast, "--forecast", FORECASTS)
    at = time.time() if now is None else now
    client = settings(ctx).client()
    if client._remote is not None:  # an https:// URL: the API server's report, as JSON
        if now is not None:
            raise spec_error("--now", "is for a redis:// URL only", "leave it out")
        data = client._remote.report({"month": month, "week": week, "from": from_, "to": to,
                                      "by": by, "forecast": forecast, "team": team})
        label = data["window"]["label"]
    else:
        try:
            window = parse_window(month, week, from_, to, at)
            inputs, em = gather(client.store, client.config, window, at, team)
            data = build(inputs, em, em.chargeback, by, forecast)
        except ReportError as e:
            raise spec_error(e.field, e.problem, e.allowed) from None
        data["notes"] += fallback_note(em)
        label = window.label
    if fmt == "table" and out_file is None:
        print_fitted(renderable(data), table_width())
        return
    if fmt == "table":
        from io import StringIO

        from rich.console import Console

        buf = StringIO()
        print_fitted(renderable(data), None, Console(file=buf, no_color=True, highlight=False))
        text = buf.getvalue()
    else:
        text = {"csv": to_csv, "html": to_html,
                "json": lambda d: json.dumps(d, indent=2) + "\n"}[fmt](data)
    if out_file is None:
        typer.echo(text, nl=False)
        return
    try:
        out_file.write_text(text, encoding="utf-8")
    except OSError as e:
        raise fail(f"--out: cannot write {out_file}: {e.strerror or e}") from None
    err.print(f"wrote the {fmt} report of {label} to {out_file}", markup=False)
