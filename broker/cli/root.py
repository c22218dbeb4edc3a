"""The ``spillway`` Typer app and its global options."""

from pathlib import Path
from typing import Annotated

import typer

from broker.cli.common import Settings, SpillwayGroup

app = typer.Typer(
    cls=SpillwayGroup,
    name="spillway",
    help="Spillway: a hybrid-cloud GPU job broker. On-prem first, priority classes, "
         "preemption, cloud burst within cost caps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global(
    ctx: typer.Context,
    redis_url: Annotated[str | None, typer.Option(
        "--redis-url", envvar="SPILLWAY_REDIS_URL", show_envvar=True,
        help="Redis URL of the cluster, e.g. redis://host:6379/0.")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", envvar="SPILLWAY_CONFIG", show_envvar=True, dir_okay=False,
        help="YAML config file (default ~/.config/spillway/config.yaml).")] = None,
) -> None:
    settings = Settings(redis_url=redis_url, config_path=config)
    ctx.obj = settings
    ctx.call_on_close(settings.close)
