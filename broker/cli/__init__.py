"""The ``spillway`` command line: a thin layer over :mod:`broker.client` and the services."""

from __future__ import annotations

import importlib

from broker.cli.root import app

# Registration order is the order of ``spillway --help``: researchers first, then ops.
for _module in ("jobs", "ops", "cloud", "offers", "token", "budget", "report", "demo", "sim",
                "fidelity", "bench", "redis_cmd"):
    importlib.import_module(f"broker.cli.{_module}")

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app(prog_name="spillway")
