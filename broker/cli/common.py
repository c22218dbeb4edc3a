"""What every command shares: global options, the client, errors as one clear line."""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from broker.errors import (
    ConfigError,
    FieldError,
    JobNotFound,
    SpecError,
    SpillwayError,
    StoreRefused,
)

if TYPE_CHECKING:
    from broker.config.core import Config

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)



def table_width(console: Console | None = None) -> int | None:
    """The width a table must fit: the terminal's (or ``COLUMNS``); None when the output goes
    to a pipe or a file, where a table keeps its natural width and no line is cut."""
    console = out if console is None else console
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console.width
    return None


def print_fitted(renderable: Any, width: int | None, console: Console | None = None) -> None:
    """Print a table made for ``width`` (from :func:`table_width`); with None, at its natural
    width however long its lines (Rich would otherwise cut them at 80 columns)."""
    console = out if console is None else console
    if width is not None:
        console.print(renderable)
        return
    Console(file=console.file, width=100_000, highlight=False, soft_wrap=False,
            no_color=console.no_color, color_system=None).print(renderable)


EXIT_SPEC = 2  # bad input (a SpecError), like a usage error
EXIT_FAIL = 1


@dataclass
class Settings:
    """The global options, resolved lazily so ``--help`` never needs Redis or a config."""

    redis_url: str | None = None
    config_path: Path | None = None
    _config: Config | None = None
    _clients: list[Any] = field(default_factory=list)

    @property
    def config(self) -> Config:
        if self._config is None:
            from broker.config.core import Config, load_config

            config = load_config(self.config_path)
            # the default bundle, with no bundles or policy settings of the file's own, passes
            # check_config by construction: the policies' modules are not imported for it
            if config.policies or config.policy_settings or config.policy != Config.policy:
                from policies.settings import check_config  # (the policy names and settings)

                config = check_config(config)
            self._config = config
        return self._config

    def url(self) -> str:
        from broker.client import resolve_url

        return resolve_url(self.redis_url, self.config)

    def client(self) -> Any:
        from broker.client import Client

        client = Client(self.redis_url, self.config)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()


def settings(ctx: typer.Context) -> Settings:
    root = ctx.find_root()
    if not isinstance(root.obj, Settings):
        root.obj = Settings()
        root.call_on_close(root.obj.close)
    return root.obj


def print_json(value: Any) -> None:
    """JSON for scripts: plain stdout, no colour, no wrapping; secrets masked (a spec's
    secret-named env values, URL passwords: broker/security/redact.py)."""
    from broker.security.redact import masked

    sys.stdout.write(json.dumps(masked(value), indent=2, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = EXIT_FAIL) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


def show_spec_error(e: SpecError, command: str | None = None) -> None:
    if command == "submit":
        err.print(f"[red]invalid job spec[/] ({len(e.errors)} problem(s)); nothing was "
                  "submitted:")
    else:
        err.print(f"[red]invalid input[/] ({len(e.errors)} problem(s)):")
    for fe in e.errors:
        allowed = f" [dim](allowed: {escape(fe.allowed)})[/]" if fe.allowed else ""
        err.print(f"  [red bold]{escape(fe.field)}[/]: [red]{escape(fe.problem)}[/]{allowed}")


def spec_error(field_name: str, problem: str, allowed: str = "") -> SpecError:
    return SpecError([FieldError(field_name, problem, allowed)])


def _redis_hint(ctx: typer.Context) -> str:
    obj = ctx.find_root().obj
    url = getattr(obj, "redis_url", None)
    url = redacted(url) if url else "the configured Redis"
    return (f"cannot reach Redis at {url}; start it (or run `spillway up` for a local cluster), "
            "or point --redis-url / SPILLWAY_REDIS_URL at a running server")


# Click's usage errors, whichever Click Typer runs on (recent Typer carries its own copy,
# older ones use Click itself): an unknown option, a value it cannot take, a missing argument
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__
                                   if c.__name__ == "UsageError")
# (Click >= 8.2, Typer's copy: a group run without a command; its help is the answer)
_HELP_ASKED: tuple[type[Exception], ...] = tuple(
    t for t in (getattr(sys.modules[UsageError.__module__], "NoArgsIsHelpError", None),)
    if t is not None)


def usage_error(e: Exception) -> typer.Exit:
    """A usage error as one line, like every other bad input, instead of Typer's boxed panel
    under a usage line: ``error: invalid value for '--limit': ...; see 'spillway queue -h'``."""
    message = " ".join(str(getattr(e, "format_message", e.__str__)()).split())
    if message[:2].istitle():  # ("Invalid value ...", "No such option ...", not "ID ...")
        message = message[0].lower() + message[1:]
    ctx = getattr(e, "ctx", None)
    where = f"; see '{ctx.command_path} -h'" if ctx is not None else ""
    err.print(f"[red]error:[/] {escape(message.rstrip('.'))}{escape(where)}")
    return typer.Exit(int(getattr(e, "exit_code", EXIT_SPEC)))


def _refused() -> tuple[type[BaseException], ...]:
    """Redis refusing this client (broker/store/reach.py), once a command has imported Redis: only
    then can it be raised, and ``spillway --help`` never imports it."""
    if "redis" not in sys.modules:
        return ()
    from broker.store.reach import REFUSED

    return REFUSED


def _unreachable() -> tuple[type[BaseException], ...]:
    """Redis not answering, or Celery's transport (kombu) not reaching it: those of the two
    the command has imported."""
    errors: tuple[type[BaseException], ...] = ()
    if "redis" in sys.modules:
        from broker.store.reach import UNREACHABLE

        errors += UNREACHABLE
    kombu = sys.modules.get("kombu.exceptions")
    if kombu is not None:
        errors += (kombu.OperationalError,)
    return errors


def _unchanged(annotation: Any, info: Any, value: Any) -> bool:
    """Whether Typer's conversion of ``value`` for a parameter of type ``annotation`` (a
    pydantic TypeAdapter) would return it as it is: a str for a str, an int within the
    bounds for an int (no parser of the option's own)."""
    if info.parser is not None:
        return False
    if annotation is str:
        return type(value) is str
    if annotation is int:
        return type(value) is int and (info.min is None or value >= info.min) and (
            info.max is None or value <= info.max)
    return False


def _plain_coercion(params: list[Any]) -> None:
    """Spare the parameters whose values need no conversion Typer's pydantic TypeAdapters.

    Typer (0.29) builds a TypeAdapter for each parameter it converts a value of (an option
    left out too: ``None`` is never converted, but the adapter is built first), about 30 ms
    for a command's options, which a command reading the store does not otherwise spend.
    Here each parameter gets a conversion that returns None (or ``()``) as Typer's does,
    passes a value that Typer's would return as it is (a str for a str, an int within the
    option's bounds for an int; a list of str as a list), and hands any other value to the
    conversion Typer builds then, so a bad value is refused with Typer's own message. Where
    Typer's private ``_coercion`` module is not there, Typer converts as it does by itself.
    tests/unit/test_cli_imports.py checks that ``spillway queue``, ``show`` and ``explain``
    build no TypeAdapter, and tests/unit/test_cli.py that bad values are still refused with
    Typer's messages."""
    plain = _plain_param()
    if plain is None:  # (another Typer: it converts as it does)
        return
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if getattr(param, "_runtime_param", False) is not None or descriptor is None:
            continue
        param._runtime_param = plain(parameter_info=descriptor.parameter_info,
                                     annotation=descriptor.annotation)


@functools.cache
def _plain_param() -> Any:
    """The conversion of :func:`_plain_coercion` (a subclass of Typer's RuntimeParam), or
    None where Typer has no such class."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:
        return None

    class Plain(RuntimeParam):  # (RuntimeParam's fields: parameter_info and annotation)
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            info = self.parameter_info
            if self.annotation == list[str]:
                if isinstance(value, (list, tuple)) and all(type(v) is str for v in value) \
                        and info.parser is None:
                    return list(value)
            elif _unchanged(self.annotation, info, value):
                return value
            full = build_runtime_param(param.type_descriptor)
            param._runtime_param = full
            return full._coerce_value(value, param=param, ctx=ctx)

    return Plain


class SpillwayGroup(TyperGroup):
    """Turns Spillway's errors into one clear line and an exit code, never a traceback."""

    def make_context(self, info_name: str | None, args: list[str],  # type: ignore[override]
                     parent: Any = None, **extra: Any) -> Any:
        try:  # (the root's own options: `spillway --nope`)
            return super().make_context(info_name, args, parent=parent, **extra)
        except _HELP_ASKED:
            raise
        except UsageError as e:
            raise usage_error(e) from None

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)  # (with the help option, made when first asked for)
        _plain_coercion(params)
        return params

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not isinstance(cmd, SpillwayGroup) \
                and not getattr(cmd, "_spillway_plain", False):
            # (once per command object: an app invoked again and again in one process, as
            # in the tests, would otherwise wrap the wrapper each time, without end)
            cmd._spillway_plain = True  # type: ignore[attr-defined]
            get_params = cmd.get_params

            def plain_params(ctx: Any) -> Any:
                params = get_params(ctx)
                _plain_coercion(params)
                return params

            cmd.get_params = plain_params  # type: ignore[method-assign]
        return name, cmd, rest

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except _HELP_ASKED:
            raise
        except UsageError as e:  # (a command's options, parsed as it is invoked)
            raise usage_error(e) from None
        except SpecError as e:
            show_spec_error(e, ctx.invoked_subcommand)
            raise typer.Exit(EXIT_SPEC) from None
        except (ConfigError, JobNotFound) as e:
            raise fail(str(e)) from None
        except _refused() as e:  # (before ConnectionError: a wrong password is one)
            obj = ctx.find_root().obj
            url = getattr(obj, "redis_url", None)
            raise fail(str(StoreRefused(redacted(url) if url else "the configured Redis",
                                        e))) from None
        except _unreachable() as e:
            err.print(f"[red]error:[/] {escape(_redis_hint(ctx))} ({escape(str(e))})")
            raise typer.Exit(EXIT_FAIL) from None
        except SpillwayError as e:
            raise fail(str(e)) from None


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """``["K=V", ...]`` as a dict; a SpecError naming ``what`` for a malformed item."""
    pairs: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise spec_error(what, f"{item!r} is not KEY=VALUE")
        pairs[key.strip()] = value
    return pairs


def redacted(url: str) -> str:
    """A URL without its password, for logs and messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"
