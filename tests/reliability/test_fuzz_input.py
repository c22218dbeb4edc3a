"""Bad input, generated: at least 10,000 JobSpecs and 10,000 CLI argument lists.

Every JobSpec mapping either parses or raises SpecError with one FieldError per problem, each
naming a field of JobSpec (or the mapping itself); nothing else escapes. Every ``spillway
submit`` argument list exits 0 (stored), 2 (a bad spec: each line names a field) or 1 (an
operational error with a message), never with a traceback, and a refused submit stores
nothing. The counts are printed (``pytest -s``) for the notes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import typer
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.cli import app
from broker.config.core import Config
from broker.errors import SpecError
from broker.model import JobSpec
from tests.conftest import flushed_db

# the click command built once: typer rebuilds it from ~50 commands' signatures on every
# invoke (about 0.1 s), which made 10,000 invocations take 12 minutes
CLI = typer.main.get_command(app)

pytestmark = pytest.mark.slow

FIELDS = list(JobSpec.model_fields)
CONFIG = Config()

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["6h", "1h30m", "-5", "0", "A100", "H100", "3g.40gb", "onprem", "cloud",
                     "critical", "normal", "2026-12-05T00:00:00", "true", "", " "]))
values = st.one_of(scalars, st.lists(scalars, max_size=4),
                   st.dictionaries(st.text(max_size=8), scalars, max_size=3))
specs = st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=10)), values,
                        max_size=8)

SEEN = {"specs": 0, "specs_refused": 0, "cli": 0, "cli_refused": 0}


@settings(max_examples=10_000, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(specs)
def test_a_jobspec_parses_or_names_every_bad_field(data: dict[str, Any]) -> None:
    SEEN["specs"] += 1
    try:
        JobSpec.parse(data, CONFIG)
    except SpecError as e:
        SEEN["specs_refused"] += 1
        assert e.errors, data
        for err in e.errors:
            top = err.field.split(".")[0]
            assert top in FIELDS or err.field in data or err.field == "spec", err
            assert err.problem, err


OPTIONS = ["--gpus", "-g", "--gpu-type", "--min-gpu-memory", "--mig", "--cpus", "--memory",
           "--nodes", "--priority", "-p", "--team", "-t", "--time-limit", "--deadline",
           "--checkpoint-dir", "--sites", "--max-price", "--env", "-e", "--label",
           "--workdir", "--name", "--cmd", "--json", "--bogus"]
tokens = st.one_of(st.sampled_from(OPTIONS), st.text(max_size=12),
                   st.sampled_from(["0", "-1", "4", "65", "1e9", "nan", "A100", "x=y", "=", "6h",
                                    "--", "true", "onprem,cloud", "mars"]))
argv = st.lists(tokens, max_size=8)


@pytest.fixture(scope="module")
def url(redis_url: str) -> Iterator[str]:
    try:
        yield from flushed_db(redis_url, 7)
    finally:
        print(f"fuzzed: {json.dumps(SEEN)}")


@settings(max_examples=10_000, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(argv)
def test_submit_never_shows_a_traceback(url: str, args: list[str]) -> None:
    SEEN["cli"] += 1
    raw = redis.Redis.from_url(url)
    before = raw.zcard("sw:jobs:all")
    result = CliRunner().invoke(CLI, ["--redis-url", url, "submit", *args],
                                catch_exceptions=True)
    out = result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args, repr(result.exception))
    assert "Traceback" not in out, (args, out)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, out)
    if result.exit_code != 0:
        SEEN["cli_refused"] += 1
        assert out.strip(), args  # a refusal says why
        assert raw.zcard("sw:jobs:all") == before, args  # and stores nothing
    raw.close()
