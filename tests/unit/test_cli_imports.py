"""The CLI imports what a command needs and nothing more: no timing here (``spillway bench cli``
times it), only which modules a fresh process has loaded when a command is done.

``spillway --help`` needs Typer and Rich alone; ``spillway queue``, ``show`` and ``explain``
add Redis, pydantic and the store, never Celery, the policies, a cloud SDK, the simulator,
the API server or the charts. Each case runs in a subprocess, with no config file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import broker.cli as cli
from broker.cli.root import app

# What no command here may import (top-level packages, and broker.sim / policies / reports)
NEVER = ("boto3", "botocore", "google.cloud", "googleapiclient", "libcloud", "fastapi",
         "uvicorn", "starlette", "matplotlib", "numpy", "pandas", "scipy", "celery", "kombu",
         "broker.sim", "broker.api", "broker.report", "policies", "providers.catalog",
         "providers.aws", "providers.gcp", "providers.libcloud", "workers")
# ... and what --help may not import either: it reads no store and no configuration
NOT_FOR_HELP = ("redis", "pydantic", "yaml", "broker.model", "broker.config", "broker.client",
                "broker.store")

# Run a command in this process as `spillway ARGS` would, then print the modules loaded.
PROBE = """
import json, sys
sys.argv = ["spillway", *json.loads(sys.argv[1])]
try:
    from broker.cli import main
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
print("\\n@@" + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def loaded(args: list[str], tmp_path: Path) -> tuple[int, list[str], str]:
    """(exit code, modules loaded, stderr) of ``spillway ARGS`` in a fresh process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_")}
    env.update(HOME=str(tmp_path), COLUMNS="120")  # (no ~/.config/spillway/config.yaml)
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    report = json.loads(done.stdout.rpartition("\n@@")[2])
    return report["code"], report["modules"], done.stderr


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
    # only the module of the command asked for: not the other commands' modules
    assert [m for m in modules if m.startswith("broker.cli.") and m not in (
        "broker.cli.jobs", "broker.cli.common", "broker.cli.render", "broker.cli.root")] == []


def test_a_command_s_help_loads_its_module_only(tmp_path: Path) -> None:
    code, modules, _ = loaded(["--redis-url", UNREACHABLE, "bench", "--help"], tmp_path)
    assert code == 0
    assert "broker.cli.bench" in modules
    assert "broker.cli.jobs" not in modules and "broker.bench" not in modules


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
    from broker.config import Config, load_config
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
