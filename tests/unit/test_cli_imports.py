"""The CLI imports what a command needs and nothing more: no timing here (``spillway bench cli``
times it), only which modules a fresh process has loaded when a command is done.

``spillway --help`` needs Typer and Rich alone; ``spillway queue``, ``show`` and ``explain``
add Redis, pydantic and the store, never Celery, the policies, a cloud SDK, the simulator,
the API server or the charts, nor what they leave for later: the energy and carbon settings
(made when a configuration's ``energy`` or ``carbon`` is first read), the store's write side
and its memory backend, the plan's types, Typer's pydantic TypeAdapters (a value that needs
converting still gets one, and the same answer). They run with Python's cyclic collector off
and freeze what they made when done. Each case runs in a subprocess, with no config file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer

import broker.cli as cli
from broker.cli.root import app

# What no command here may import (top-level packages, and broker.sim / policies / reports)
NEVER = ("boto3", "botocore", "google.cloud", "googleapiclient", "libcloud", "fastapi",
         "uvicorn", "starlette", "matplotlib", "numpy", "pandas", "scipy", "celery", "kombu",
         "broker.sim", "broker.api", "broker.money.report", "policies", "providers.catalog",
         "providers.aws", "providers.gcp", "providers.libcloud", "workers")
# ... and what --help may not import either: it reads no store and no configuration
NOT_FOR_HELP = ("redis", "pydantic", "yaml", "broker.model.spec", "broker.model.job",
                "broker.model.node", "broker.model.cloud", "broker.model.classes",
                "broker.config.core", "broker.client", "broker.store")

# ... nor what the reading commands leave for later (see the module's docstring)
LATER = ("broker.config.energy", "broker.energy.model", "broker.energy.prices",
         "broker.config.providers", "broker.store.memory", "broker.store.budgets",
         "broker.store.transitions", "broker.store.instances", "broker.store.boots",
         "broker.store.nodes", "broker.store.reports", "broker.store.events", "broker.cycle.plan",
         "pydantic.type_adapter", "typer._adapters")

# Run a command in this process as `spillway ARGS` would, then print the modules loaded (and
# whether it froze what it made, and left the collector as it found it).
PROBE = """
import gc, json, sys
sys.argv = ["spillway", *json.loads(sys.argv[1])]
try:
    from broker.cli import main
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
print("\\n@@" + json.dumps({"code": code, "modules": sorted(sys.modules),
                           "frozen": gc.get_freeze_count() > 0, "gc": gc.isenabled()}))
"""


def probe(args: list[str], tmp_path: Path, env_vars: dict[str, str] | None = None
          ) -> tuple[dict[str, Any], str]:
    """What :data:`PROBE` reports of ``spillway ARGS`` in a fresh process, and its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_")}
    env.update(HOME=str(tmp_path), COLUMNS="120")  # (no ~/.config/spillway/config.yaml)
    env.update(env_vars or {})
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    return json.loads(done.stdout.rpartition("\n@@")[2]), done.stderr


def loaded(args: list[str], tmp_path: Path) -> tuple[int, list[str], str]:
    """(exit code, modules loaded, stderr) of ``spillway ARGS`` in a fresh process."""
    report, err = probe(args, tmp_path)
    return report["code"], report["modules"], err


def under(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


def test_help_imports_typer_and_rich_alone(tmp_path: Path) -> None:
    code, modules, _ = loaded(["--help"], tmp_path)
    assert code == 0
    assert under(modules, NEVER + NOT_FOR_HELP) == []
    # every command's module is there (the help lists them all)
    assert {f"broker.cli.{m}" for m in cli.MODULES} <= set(modules)


# An unreachable Redis: the command imports all it needs to read the store, then fails in one
# line, through the error handling that imports Redis's exceptions only when it must.
UNREACHABLE = "redis://127.0.0.1:1/0"


@pytest.mark.parametrize("args", [["queue"], ["show", "j-1"], ["explain", "j-1"]])
def test_reading_commands_import_the_store_and_nothing_heavy(args: list[str],
                                                             tmp_path: Path) -> None:
    code, modules, err = loaded(["--redis-url", UNREACHABLE, *args], tmp_path)
    assert code == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in err
    assert "Traceback" not in err
    assert {"redis", "broker.client", "broker.store.redis"} <= set(modules)
    assert under(modules, NEVER) == []
    assert under(modules, LATER) == []
    # only the module of the command asked for: not the other commands' modules
    assert [m for m in modules if m.startswith("broker.cli.") and m not in (
        "broker.cli.jobs", "broker.cli.common", "broker.cli.render", "broker.cli.root")] == []


def test_a_command_s_help_loads_its_module_only(tmp_path: Path) -> None:
    code, modules, _ = loaded(["--redis-url", UNREACHABLE, "bench", "--help"], tmp_path)
    assert code == 0
    assert "broker.cli.bench" in modules
    assert "broker.cli.jobs" not in modules and "broker.bench.suite" not in modules


def test_an_unknown_command_loads_every_module_for_its_suggestion(tmp_path: Path) -> None:
    code, modules, err = loaded(["queu"], tmp_path)
    assert code == 2
    assert "queue" in err  # (Click's "did you mean")
    assert {f"broker.cli.{m}" for m in cli.MODULES} <= set(modules)


def _registered() -> dict[str, set[str]]:
    """Every command and group of the root app -> the modules its callbacks live in."""
    cli.load()
    out: dict[str, set[str]] = {}
    for c in app.registered_commands:
        assert c.callback is not None
        name = c.name or c.callback.__name__.replace("_", "-")
        out[name] = {c.callback.__module__}
    for g in app.registered_groups:
        assert g.name is not None and g.typer_instance is not None
        out[g.name] = {c.callback.__module__ for c in g.typer_instance.registered_commands
                       if c.callback is not None}
    return out


def test_the_commands_table_names_each_command_s_module() -> None:
    registered = _registered()
    assert set(cli.COMMANDS) == set(registered)
    for name, modules in registered.items():
        assert modules == {f"broker.cli.{cli.COMMANDS[name]}"}, name
    assert set(cli.COMMANDS.values()) == set(cli.MODULES)


@pytest.mark.parametrize(("args", "name"), [
    ([], None),
    (["--help"], None),
    (["-h"], None),
    (["queue"], "queue"),
    (["queue", "--all"], "queue"),
    (["--redis-url", "redis://h/0", "show", "j-1"], "show"),
    (["--redis-url=redis://h/0", "--config", "c.yaml", "bench", "cli"], "bench"),
    (["--config=c.yaml", "explain", "j"], "explain"),
    (["--nope", "queue"], None),
    (["--redis-url"], None),
])
def test_the_command_named_past_the_root_options(args: list[str], name: str | None) -> None:
    assert cli.command_name(args) == name


def test_the_default_configuration_passes_the_policy_check() -> None:
    """The CLI skips check_config (and the policies' imports) for a configuration with the
    default bundle and no bundles or policy settings of its own: that must always pass."""
    from broker.config.core import Config, load_config
    from policies.registry import BUNDLES
    from policies.settings import check_config

    assert Config.policy in BUNDLES
    assert check_config(load_config(env={})) == load_config(env={})


def test_a_bad_policy_in_the_config_file_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("policy: nonesuch\n")
    code, _, err = loaded(["--config", str(path), "--redis-url", UNREACHABLE, "queue"],
                                tmp_path)
    assert code == 1
    assert "nonesuch" in err and "policy" in err


@pytest.mark.parametrize("module", [*cli.MODULES, "root"])
def test_command_modules_keep_their_annotations_evaluated(module: str) -> None:
    """(broker/cli/__init__.py) Typer would compile string annotations anew in every process."""
    source = (Path(cli.__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    assert "from __future__ import annotations" not in source


def test_the_redis_url_from_the_environment_builds_no_configuration_check(tmp_path: Path
                                                                         ) -> None:
    """SPILLWAY_REDIS_URL, the usual setting, is taken as it is (no pydantic model built for
    it); a bad one is still refused, naming it."""
    report, err = probe(["queue"], tmp_path, {"SPILLWAY_REDIS_URL": UNREACHABLE})
    assert report["code"] == 1 and "cannot reach Redis at redis://127.0.0.1:1/0" in err
    assert under(report["modules"], NEVER + LATER) == []
    report, err = probe(["queue"], tmp_path, {"SPILLWAY_REDIS_URL": "http://127.0.0.1:1/0"})
    assert report["code"] == 1
    assert "SPILLWAY_REDIS_URL: 'http://127.0.0.1:1/0' is not allowed" in err


@pytest.mark.parametrize(("args", "brief"), [
    (["queue"], True), (["show", "j-1"], True), (["explain", "j-1"], True), (["--help"], True),
    (["bench", "--help"], False), (["nodes"], False), (["logs", "j-1"], False),
])
def test_only_the_reading_commands_leave_the_collector_off(args: list[str], brief: bool,
                                                            tmp_path: Path) -> None:
    report, _ = probe(["--redis-url", UNREACHABLE, *args], tmp_path)
    assert report["frozen"] is brief  # (what they made, frozen when done)
    assert report["gc"] is True  # (main() leaves the collector as it found it)


def test_the_deferred_configuration_fields_are_made_when_read() -> None:
    from dataclasses import replace

    from broker.config.core import Config, load_config
    from broker.config.energy import CarbonSettings, EnergySettings, SiteEnergy

    cfg = load_config(env={"SPILLWAY_GRACE_S": "5"})
    assert "energy" not in cfg.__dict__ or cfg.__dict__["energy"] is None  # (not made yet)
    assert cfg.energy == EnergySettings() and cfg.carbon == CarbonSettings()
    assert cfg.energy is cfg.energy  # (made once)
    given = EnergySettings(sites={"onprem": SiteEnergy("DE")})
    mine = replace(cfg, energy=given)
    assert mine.energy is given and replace(mine, grace_s=1.0).energy is given
    assert Config(energy=given).energy is given and Config() == load_config(env={})
    assert mine != cfg and replace(cfg) == cfg


def _option_command() -> Any:
    """A command with a parameter of each kind the CLI's commands take."""
    app = typer.Typer()

    @app.command()
    def cmd(s: Annotated[str | None, typer.Option("--s")] = None,
            a: Annotated[str, typer.Argument()] = "x",
            n: Annotated[int, typer.Option("--n", min=1, max=9)] = 1,
            m: Annotated[int | None, typer.Option("--m")] = None,
            f: Annotated[float | None, typer.Option("--f")] = None,
            ls: Annotated[list[str] | None, typer.Option("--ls")] = None,
            p: Annotated[Path | None, typer.Option("--p", dir_okay=False)] = None,
            b: Annotated[bool, typer.Option("--b")] = False) -> None:
        """(never run)"""

    return typer.main.get_command(app)


@pytest.mark.parametrize("value", [None, "text", "", "3", "0", "10", " 4", "x", 3, 0, 10, 2.5,
                                   True, (), ("a", "b"), ["a"], ("a", 1), b"raw"])
def test_the_plain_coercion_answers_as_typer_s_own(value: Any) -> None:
    """broker.cli.common._plain_coercion: each parameter's value comes out as Typer's own
    conversion returns it, or is refused with the same message."""
    from broker.cli.common import _plain_coercion

    typer_s, plain = _option_command(), _option_command()
    _plain_coercion(plain.params)
    assert all(getattr(p, "_runtime_param", None) is not None for p in plain.params)

    def answer(command: Any, name: str) -> Any:
        param = next(p for p in command.params if p.name == name)
        try:
            out = param.get_runtime_param().coerce(value, param=param,
                                                   ctx=typer.Context(command))
        except Exception as e:  # (BadParameter and the like, as Typer raises it)
            return type(e).__name__, str(getattr(e, "message", e))
        return type(out).__name__, out

    for name in ("s", "a", "n", "m", "f", "ls", "p", "b"):
        assert answer(plain, name) == answer(typer_s, name), name


def test_a_command_resolved_again_and_again_is_wrapped_once() -> None:
    """resolve_command spares Typer's adapters by wrapping a command's get_params: in a
    process that invokes the app many times (the tests, an embedding) it wraps it once, not
    once per call (which ended in a RecursionError after a few thousand)."""
    import typer
    from click.testing import CliRunner

    from broker.cli import app

    cli = typer.main.get_command(app)  # (one command object for every call, as an embedding)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)  # (each wrapper a frame: past this many calls, one too many)
    try:
        for _ in range(450):
            result = CliRunner().invoke(cli, ["submit", "--gpus", "two", "--", "true"])
            assert result.exit_code == 2, (result.exit_code, repr(result.exception))
    finally:
        sys.setrecursionlimit(limit)
