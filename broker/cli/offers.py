"""Offer commands: ``spillway offers`` (the cheapest cloud offers per unit of work, beside the
on-prem price) and ``spillway catalog refresh`` (rebuild the catalog from a cloud's API).
See docs/catalog.md."""

import difflib
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from broker.cli.common import err, out, print_fitted, print_json, settings, spec_error, table_width
from broker.cli.render import fitted_table
from broker.cli.root import app
from broker.model.gpus import GPU_FAMILIES, KNOWN_MODELS, family_of, normalise_type
from broker.model.speed import speed_of

if TYPE_CHECKING:
    from broker.model.cloud import Offer

Opt = typer.Option

catalog_app = typer.Typer(help="The offer catalog: rebuild it from a cloud's API.",
                          no_args_is_help=True)
app.add_typer(catalog_app, name="catalog")

HEADS = ("$/WORK-H", "$/GPU-H", "$/H", "GPUS", "CLOUD", "ZONE/REGION", "MARKET", "TYPE",
         "CPUS", "MEM GB", "CARBON")


def gpu_model(name: str) -> str:
    """A known family or model for --gpu, or a SpecError listing them and the nearest."""
    found = normalise_type(name)
    if found is not None:
        return found
    known = [*GPU_FAMILIES, *KNOWN_MODELS]
    near = difflib.get_close_matches(name.strip().upper(), known, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]}? " if near else ""
    raise spec_error("gpu", f"{name!r} is not a GPU model Spillway knows; {hint}".rstrip(),
                     ", ".join(known))


def _catalog(ctx: typer.Context, path: Path | None) -> Any:
    from providers.catalog import CatalogError, load_catalog

    chosen = path or settings(ctx).config.offer_catalog or None
    try:
        return load_catalog(chosen)
    except CatalogError as e:
        raise spec_error("catalog", str(e)) from None


def _checked(catalog: Any, provider: str | None, regions: list[str],
             configured: dict[str, list[Any]]) -> None:
    """A SpecError for a provider neither in the catalog nor configured, or a region none of
    them has."""
    names = sorted({*catalog.providers, *configured})
    if provider is not None and provider not in names:
        where = ("in the catalog or configured (providers:)" if configured else
                 "in the catalog, and no provider is configured (providers: in the config "
                 "file, docs/cloud.md)")
        raise spec_error("provider", f"{provider!r} is not {where}", ", ".join(names))
    known = sorted({r.region for r in catalog.rows
                    if provider is None or r.provider == provider}
                   | {o.region for name, found in configured.items() for o in found
                      if provider is None or name == provider})
    for region in regions:
        if region not in known:
            where = (f"a region of {provider}" if provider in configured else
                     f"in the catalog for {provider}" if provider else "in the catalog")
            raise spec_error("region", f"{region!r} is not {where}", ", ".join(known))


def offer_json(o: "Offer", gpus: int) -> dict[str, Any]:
    from providers.catalog import work_price

    return {"id": o.id, "provider": o.provider, "region": o.region, "zone": o.zone,
            "market": o.market.value, "instance_type": o.instance_type,
            "machine_type": o.extra.get("machine_type", o.instance_type),
            "gpu_model": o.gpu_model, "gpu_count": o.gpu_count,
            "gpu_memory_gb": o.gpu_memory_gb,
            "vcpus": o.extra.get("vcpus", o.extra.get("cpus")),  # (a local machine's: cpus)
            "memory_gb": o.extra.get("memory_gb"), "price_per_hour": o.price_per_hour,
            "price_per_gpu_hour": round(o.price_per_gpu_hour, 6), "speed": speed_of(o.gpu_model),
            "price_per_work_hour": round(work_price(o, gpus), 6),
            "carbon_zone": o.carbon_zone, "source": o.extra.get("source", ""),
            "fetched_at": o.extra.get("fetched_at", "")}


def configured_offers(providers: Any, cluster: str, request: Any
                      ) -> tuple[dict[str, list[Any]], list[str]]:
    """The offers of each configured provider (``providers:``, local ones included): what
    Spillway would rent, for ``request``; and a note for each provider whose offers cannot be
    read (a missing SDK extra, a bad entry), so the listing still shows the rest."""
    from providers.base import make_provider

    found: dict[str, list[Any]] = {}  # (offers)
    notes: list[str] = []
    for name in sorted(providers):
        try:
            made = make_provider(name, providers[name].provider_settings(), cluster)
            found[name] = list(made.offers(request))
        except Exception as e:  # (an SDK's own errors too: one line, the others listed)
            found[name] = []
            notes.append(f"provider {name}: its offers cannot be read ({e})")
    return found, notes


def onprem_json(price: float, model: str | None) -> dict[str, Any]:
    """The configured on-prem price, per unit of work on ``model`` when one is asked for."""
    speed = speed_of(model) if model else None
    return {"price_per_gpu_hour": price, "gpu_model": model, "speed": speed,
            "price_per_work_hour": round(price / speed, 6) if speed else None,
            "source": "config onprem_price_per_gpu_hour"}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _table(rows: list[dict[str, Any]], width: int | None) -> Any:
    cells = [(f"{r['price_per_work_hour']:.3f}", f"{r['price_per_gpu_hour']:.3f}",
              f"{r['price_per_hour']:.3f}", f"{r['gpu_count']}x{r['gpu_model']}",
              r["provider"] + ("*" if r.get("configured") else ""),
              r["zone"] or r["region"], r["market"], r["machine_type"], _num(r["vcpus"]),
              _num(r["memory_gb"]), r["carbon_zone"] or "-") for r in rows]
    # the price of work, GPUs and place are never cut; TYPE (the machine: GCP's GPUs are in
    # GPUS) is shortened, then CARBON, MEM GB, CPUS, $/H, $/GPU-H and CLOUD go, in that order
    table, keep = fitted_table(HEADS, cells, width, shorten={7: 13},
                               droppable=(10, 9, 8, 2, 1, 4))
    for c in cells:
        table.add_row(*(escape(c[i]) for i in keep))
    return table


@app.command()
def offers(
    ctx: typer.Context,
    gpu: Annotated[str | None, Opt("--gpu", help="GPU family or model (A100, A100-80GB); "
                                   "default: any.")] = None,
    count: Annotated[int, Opt("--count", "-n", help="GPUs on one machine (at least).")] = 1,
    spot: Annotated[bool, Opt("--spot", help="Spot offers only.")] = False,
    ondemand: Annotated[bool, Opt("--ondemand", help="On-demand offers only.")] = False,
    provider: Annotated[str | None, Opt("--provider", help="A cloud of the catalog (aws, gcp) "
                                        "or a configured provider's name (local, ...).")
                        ] = None,
    region: Annotated[list[str] | None, Opt("--region", help="Only this region "
                                            "(repeatable).")] = None,
    limit: Annotated[int, Opt("--limit", help="Show the N cheapest of the catalog (the "
                              "configured providers' offers are all shown, first).")] = 20,
    catalog: Annotated[Path | None, Opt("--catalog", dir_okay=False, help="A catalog file "
                                        "(default: config offer_catalog, else the shipped "
                                        "one).")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (one object).")] = False,
) -> None:
    """The cheapest cloud offers per unit of work (price / (GPUs used x GPU speed)), with the
    configured on-prem price per GPU-hour beside them. The configured providers' offers
    (`providers:`, local ones included: what Spillway rents) come first, marked *."""
    from broker.model.cloud import Market
    from providers.base import Resources
    from providers.catalog import work_price

    model = gpu_model(gpu) if gpu is not None else None
    if count < 1:
        raise spec_error("count", f"{count} is not allowed", "a whole number >= 1")
    if limit < 1:
        raise spec_error("limit", f"{limit} is not allowed", "a whole number >= 1")
    if spot and ondemand:
        raise spec_error("market", "--spot and --ondemand exclude each other",
                         "one of them, or neither for both")
    cfg = settings(ctx).config
    cat = _catalog(ctx, catalog)
    regions = list(region or ())
    market = Market.SPOT if spot else Market.ONDEMAND if ondemand else None
    request = Resources(gpu_count=count, gpu_model=model, market=market, regions=tuple(regions))
    everywhere = Resources(gpu_count=count, gpu_model=model, market=market)
    configured, notes = configured_offers(cfg.providers, cfg.cluster_name, everywhere)
    _checked(cat, provider, regions, configured)
    # the configured providers' offers first (what Spillway rents: every one, whatever
    # --limit), then the catalog's cheapest (the market), each cheapest work first
    mine = sorted((o for name, found in configured.items() if provider in (None, name)
                   for o in found if not regions or o.region in regions),
                  key=lambda o: (work_price(o, count), o.id))
    ids = {o.id for o in mine}
    clouds = None if provider is None else [provider] if provider in cat.providers else []
    market_rows = [o for o in cat.cheapest(request, providers=clouds) if o.id not in ids]
    rows = [{**offer_json(o, count), "configured": True} for o in mine] + \
        [{**offer_json(o, count), "configured": False} for o in market_rows[:limit]]
    total = len(mine) + len(market_rows)
    onprem = onprem_json(cfg.onprem_price_per_gpu_hour, model)
    if as_json:
        print_json({"request": {"gpu": model, "count": count, "market": market and market.value,
                                "provider": provider, "regions": regions},
                    "catalog": str(cat.path), "providers": sorted(configured),
                    "unreadable": notes, "onprem": onprem, "total": total, "offers": rows})
        return
    _print(rows, total, onprem, model, count, cat, bool(configured))
    for note in notes:
        err.print(f"[yellow]warning:[/] {escape(note)}")


def _print(rows: list[dict[str, Any]], total: int, onprem: dict[str, Any], model: str | None,
           count: int, cat: Any, providers: bool = False) -> None:
    what = f"{count} x {model or 'any GPU'}"
    if not rows:
        have = sorted({family_of(m) for m in cat.gpu_models})
        where = "the catalog" + (" or of a configured provider" if providers else "")
        out.print(f"No offer in {where} holds {escape(what)} on one machine with these "
                  f"filters. The catalog has: {', '.join(have)}.")
    else:
        print_fitted(_table(rows, table_width()), table_width())
        out.print(f"[dim]{len(rows)} of {total} offers for {escape(what)}, cheapest work first "
                  "($/WORK-H: dollars per V100-hour of work on the GPUs asked for); catalog "
                  f"{escape(str(cat.path))}[/]")
    mine = [r for r in rows if r["configured"]]
    if mine:
        out.print(f"[dim]* a configured provider's (providers:): Spillway rents these when a "
                  f"job bursts, and `spillway launch {escape(mine[0]['id'])}` rents one by "
                  "hand[/]")
    per_work = (f" = ${onprem['price_per_work_hour']:.3f} per unit of work on {model} "
                f"(speed {onprem['speed']:g})" if onprem["price_per_work_hour"] else "")
    out.print(f"On-prem: ${onprem['price_per_gpu_hour']:.3f} per GPU-hour{per_work} "
              "(onprem_price_per_gpu_hour)")


def _anonymous() -> Any:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


@catalog_app.command("refresh")
def refresh_cmd(
    ctx: typer.Context,
    provider: Annotated[str, typer.Argument(help="aws or gcp.")],
    region: Annotated[list[str] | None, Opt("--region", help="A region to read (repeatable; "
                                            "AWS needs one; GCP default: all).")] = None,
    project: Annotated[str, Opt("--project", help="GCP project whose zones to list.")] = "",
    prices: Annotated[Path | None, Opt("--prices", dir_okay=False, help="Price file: AWS CSV "
                                       "instance_type,region,price[,fetched_at]; GCP "
                                       "JSON (docs/catalog.md).")] = None,
    endpoint: Annotated[str | None, Opt("--endpoint", help="Another API endpoint (a test "
                                        "double).")] = None,
    types: Annotated[list[str] | None, Opt("--types", help="AWS: instance-type patterns "
                                           "(repeatable; default g* and p*).")] = None,
    spot_days: Annotated[float, Opt("--spot-days", help="AWS: days of spot price history "
                                    "to read.")] = 7.0,
    output: Annotated[Path | None, Opt("--out", dir_okay=False, help="Where to write (default "
                                       "STATE_DIR/catalog.csv).")] = None,
    catalog: Annotated[Path | None, Opt("--catalog", dir_okay=False, help="The catalog to "
                                        "start from (default: the configured one).")] = None,
    anonymous: Annotated[bool, Opt("--anonymous", help="GCP: no credentials (a test double "
                                   "at --endpoint).")] = False,
) -> None:
    """Read a cloud's instance types and spot prices and write a new catalog beside the rows of
    other clouds and regions; says where, and how to use it."""
    from providers.base import MissingExtra, ProviderError
    from providers.catalog.refresh import refresh
    from providers.catalog.refresh_aws import PriceFileError

    cfg = settings(ctx).config
    base = _catalog(ctx, catalog)
    target = output or Path(cfg.state_dir).expanduser() / "catalog.csv"
    try:
        written = refresh(provider, base, target, datetime.now(timezone.utc),
                          regions=list(region or ()), prices=prices, endpoint=endpoint,
                          project=project, spot_days=spot_days, types=list(types or ()),
                          credentials=_anonymous() if anonymous else None)
    except (MissingExtra, PriceFileError) as e:
        raise spec_error("prices" if isinstance(e, PriceFileError) else "provider",
                         str(e)) from None
    except ValueError as e:
        field, _, problem = str(e).partition(": ")
        raise spec_error(field, problem) from None
    except (ProviderError, OSError) as e:
        err.print(f"[red]error:[/] {escape(provider)} refresh failed: {escape(str(e))}")
        raise typer.Exit(1) from None
    except Exception as e:  # the SDKs' own errors (credentials, HTTP): one line, no traceback
        err.print(f"[red]error:[/] {escape(provider)} refresh failed: {type(e).__name__}: "
                  f"{escape(str(e))}")
        raise typer.Exit(1) from None
    out.print(f"Wrote {written.fresh} {escape(provider)} row(s) for "
              f"{escape(', '.join(written.regions) or '-')} and kept {written.kept} to "
              f"{escape(str(written.path))} (spot history: {escape(str(written.spot_path))}).")
    if written.skipped:
        out.print("[dim]Left out: " + escape(", ".join(
            f"{k} ({v})" for k, v in sorted(written.skipped.items()))) + "[/]")
    out.print(f"Use it: offer_catalog: {escape(str(written.path))} in the config, or "
              f"SPILLWAY_OFFER_CATALOG={escape(str(written.path))}")
