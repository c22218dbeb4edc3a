"""The ``spillway`` command line: a thin layer over :mod:`broker.client` and the services.

A command's module is imported when it is asked for: ``spillway queue`` imports
broker.cli.jobs and what its commands import, not the other eleven modules; ``spillway
--help`` (or a name no module registers) imports them all. ``from broker.cli import app`` is
the app with every command. What each command needs beyond Typer and Rich it imports when it
runs (tests/unit/test_cli_imports.py keeps it so; ``spillway bench cli`` times it).

The modules that define commands (those of :data:`MODULES`, and root.py) do not use ``from
__future__ import annotations``: Typer reads every command's annotations, and as strings it
would compile each of them again in every process (about 0.1 s of ``spillway --help``);
evaluated at import they come from the bytecode cache. A name imported under
``TYPE_CHECKING`` is written in quotes there.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

__all__ = ["BRIEF", "COMMANDS", "MODULES", "app", "load", "main"]

# Registration order is the order of ``spillway --help``: researchers first, then ops.
MODULES = ("jobs", "ops", "cloud", "offers", "token", "budget", "report", "demo", "sim",
           "fidelity", "bench", "redis_cmd")

# Which module registers each command (or group) of ``spillway NAME``; a name missing here
# still works, through every module (tests/unit/test_cli_imports.py checks the table).
COMMANDS = {
    **dict.fromkeys(("submit", "queue", "show", "cancel", "logs", "explain"), "jobs"),
    **dict.fromkeys(("status", "nodes", "drain", "resume", "scheduler", "worker", "up"), "ops"),
    **dict.fromkeys(("instances", "launch", "provisioner"), "cloud"),
    **dict.fromkeys(("offers", "catalog"), "offers"),
    **dict.fromkeys(("api", "token"), "token"),
    "budget": "budget", "report": "report", "demo": "demo", "simulate": "sim",
    "fidelity": "fidelity", "bench": "bench",
    **dict.fromkeys(("registrar", "redis"), "redis_cmd"),
}

# The root's options that take a value (broker/cli/root.py)
_VALUED = ("--redis-url", "--config")


def load(modules: Iterable[str] = MODULES) -> typer.Typer:
    """The root app with the commands of ``modules`` (names in :data:`MODULES`) registered."""
    for module in modules:
        importlib.import_module(f"broker.cli.{module}")
    from broker.cli.root import app

    return app


def command_name(args: Sequence[str]) -> str | None:
    """The command ``args`` (the command line after ``spillway``) names, past the root's own
    options; None when there is none, or an option comes first that is not the root's (``-h``,
    a typo)."""
    rest = iter(args)
    for arg in rest:
        if arg in _VALUED:
            next(rest, None)
        elif arg.startswith("-"):
            if arg.partition("=")[0] not in _VALUED:
                return None
        else:
            return arg
    return None


def registered(app: typer.Typer, name: str) -> bool:
    """Whether ``app`` has a command or group called ``name``."""
    from typer.main import get_command_name

    return any((c.name or get_command_name(c.callback.__name__ if c.callback else "")) == name
               for c in app.registered_commands) or any(
        g.name == name for g in app.registered_groups)


# The commands that read the store, print and exit (and the help, ``name`` None): Python's
# cyclic garbage collector is off while they run, and what they made is frozen (gc.freeze)
# when they are done, so that the full collection at the interpreter's exit passes over none
# of it. Their imports make a few hundred thousand objects, hardly any of them garbage; the
# collector's passes over them (about 120 while a command ran, one over everything at exit)
# took 0.1-0.2 s of each. Every other command (the services, the waits, --follow) runs with
# it on, as before.
BRIEF = frozenset({"queue", "show", "explain"})


def main() -> None:
    """Console-script entry point."""
    name = command_name(sys.argv[1:])
    brief, collecting = name is None or name in BRIEF, gc.isenabled()
    if brief:
        gc.disable()
    try:
        app = load((COMMANDS[name],) if name in COMMANDS else MODULES)
        if name is not None and not registered(app, name):
            app = load()  # (the table is behind the code: every command, as before)
        app(prog_name="spillway")
    finally:
        if brief:
            gc.freeze()
            if collecting:
                gc.enable()


def __getattr__(name: str) -> Any:
    if name == "app":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
