"""Cloud commands: instances, launch, provisioner (docs/cloud.md)."""

import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from broker.cli.common import (
    err,
    fail,
    fmt_duration,
    out,
    print_fitted,
    print_json,
    redacted,
    settings,
    table_width,
)
from broker.cli.render import fitted_table
from broker.cli.root import app

if TYPE_CHECKING:
    from broker.model import Instance

Opt = typer.Option


def instance_row(inst: "Instance", now: float) -> dict[str, Any]:
    end = inst.ended_at if inst.ended_at is not None else now
    return {"request_id": inst.request_id, "offer": inst.offer_id, "state": inst.state.value,
            "provider_id": inst.provider_id, "node": inst.node_id,
            "requested_at": inst.requested_at, "age_s": round(end - inst.requested_at, 3),
            "price_per_hour": inst.price_per_hour, "reason": inst.reason,
            "for_jobs": list(inst.for_jobs), "history": inst.to_dict()["history"]}


@app.command()
def instances(
    ctx: typer.Context,
    show_all: Annotated[bool, Opt("--all", help="Ended instances too (the whole ledger).")
                        ] = False,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (a list of instances).")] = False,
) -> None:
    """List rented cloud machines: request id, offer, state, provider id, node, age, price."""
    store = settings(ctx).client().store
    now = time.time()
    rows = [instance_row(i, now) for i in store.instances(live_only=not show_all)]
    if as_json:
        print_json(rows)
        return
    if not rows:
        err.print("no cloud instances" + ("" if show_all else " running (--all: ended ones "
                                          "too)"))
        return
    width = table_width()
    heads = ("REQUEST", "OFFER", "STATE", "PROVIDER ID", "NODE", "AGE", "$/H", "REASON")
    cells = [(r["request_id"], r["offer"], r["state"], r["provider_id"] or "-",
              r["node"] or "-", fmt_duration(r["age_s"]), f"{r['price_per_hour']:.2f}",
              r["reason"] or "-") for r in rows]
    table, keep = fitted_table(heads, cells, width, shorten={1: 12, 3: 8, 4: 8, 7: 12},
                               wrap=7, droppable=(4, 3))
    for r, c in zip(rows, cells):
        shown: list[str | Text] = [escape(c[i]) for i in keep]
        style = {"READY": "green", "BOOTING": "yellow", "REQUESTED": "yellow",
                 "FAILED": "red"}.get(r["state"], "")
        shown[keep.index(2)] = Text(r["state"], style=style)
        table.add_row(*shown)
    print_fitted(table, width)


@app.command()
def launch(
    ctx: typer.Context,
    offer_id: Annotated[str, typer.Argument(help="An offer id, e.g. "
                                                 "local:home:home-a:ondemand/local-2xa100-80gb "
                                                 "(`spillway offers` lists them).")],
    count: Annotated[int, Opt("--count", min=1, max=100, help="Machines to launch.")] = 1,
) -> None:
    """Launch cloud machines by hand, through the provisioner (they join as nodes, and are
    released when idle like any other)."""
    from broker.bus.runtime import init_runtime
    from broker.cycle.actuator import request_launch
    from broker.cycle.plan import Launch
    from broker.store.instances import request_ids

    s = settings(ctx)
    provider = offer_id.split(":", 1)[0]
    if not s.config.providers:
        raise fail("launch: no cloud provider is configured; add `providers:` to the config "
                   "file (docs/cloud.md)", 2)
    if provider not in s.config.providers:
        raise fail(f"launch: offer {offer_id!r} names provider {provider!r}, which is not "
                   f"configured (providers: {', '.join(s.config.providers)})", 2)
    if "/" not in offer_id:
        raise fail(f"launch: {offer_id!r} is not an offer id (site/instance_type)", 2)
    rt = init_runtime(s.url(), s.config)
    request_id = "op-" + uuid.uuid4().hex[:10]
    request_launch(rt, Launch(offer_id, count, request_id, ()))
    for rid in request_ids(request_id, count):
        out.print(f"{rid} REQUESTED {escape(offer_id)}")


@app.command()
def provisioner(
    ctx: typer.Context,
    loglevel: Annotated[str, Opt("--loglevel", "-l", help="DEBUG, INFO, WARNING or ERROR.")
                        ] = "INFO",
) -> None:
    """Run the provisioner on its own (where the cloud credentials are): launches and
    terminations from the `provision` queue, and the machines' lifecycle. Run the schedulers
    with --no-provisioner then."""
    from broker.cloud.tasks import run_provisioner

    s = settings(ctx)
    if not s.config.providers:
        raise fail("provisioner: no cloud provider is configured; add `providers:` to the "
                   "config file (docs/cloud.md)", 2)
    url = s.url()
    err.print(f"spillway provisioner on {redacted(url)}: providers "
              f"{', '.join(s.config.providers)}, lifecycle every {s.config.reconcile_s:g}s")
    raise typer.Exit(run_provisioner(url, s.config, loglevel))
