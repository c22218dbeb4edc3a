"""2,000 Hypothesis-made requests at the API app (bad JSON, wrong types, unknown fields, huge
bodies, path tricks, bad tokens), in process through ASGI on a real Redis: never a 500, never
a traceback in a reply, every error one JSON shape, every 422 naming its fields."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.client import Client
from broker.config.core import Config
from broker.security.tokens import TokenStore
from tests.asgi import call_asgi
from tests.conftest import flushed_db

pytestmark = pytest.mark.slow

DB = 2  # this module's own database on the session's Redis (test_api_tokens shares it)

ROUTES = [
    ("POST", "/v1/jobs"), ("POST", "/v1/jobs/batch"), ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"), ("POST", "/v1/jobs/{id}/cancel"), ("GET", "/v1/jobs/{id}/logs"),
    ("GET", "/v1/jobs/{id}/wait"), ("GET", "/v1/jobs/{id}/explain"), ("GET", "/v1/nodes"),
    ("POST", "/v1/nodes/{id}/drain"), ("POST", "/v1/tokens"), ("GET", "/v1/tokens"),
    ("POST", "/v1/tokens/{id}/revoke"), ("GET", "/v1/whoami"), ("DELETE", "/v1/jobs"),
    ("GET", "/nope"),
]
FIELDS = ["command", "gpus", "gpu_types", "priority", "team", "time_limit", "env", "labels",
          "workdir", "nodes", "cpus", "memory_gb", "deadline", "sites", "mig_profile",
          "max_price_per_hour", "bogus", "spec", "specs", "user", "role", "teams"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4), max_leaves=12)
specs = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)
HUGE = b'{"spec": {"command": "' + b"x" * (2 << 20) + b'"}}'
bodies = st.one_of(
    st.builds(lambda s, h: json.dumps({"spec": s, "hold_if_infeasible": h}).encode(), specs,
              st.sampled_from([True, None, "yes"])),
    st.builds(lambda ss: json.dumps({"specs": ss}).encode(), st.lists(specs, max_size=3)),
    st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(st.text(max_size=8),
                                                               json_values, max_size=4)),
    st.binary(max_size=64), st.just(HUGE), st.just(b""),
)
path_ids = st.one_of(st.text(max_size=20), st.sampled_from(
    ["..", "../../etc/passwd", "%2e%2e", "j-000000000000", "a/b", " ", "\x00", "é" * 70]))
queries = st.dictionaries(st.sampled_from(["state", "team", "limit", "skip", "attempt",
                                           "follow", "since", "timeout", "x"]),
                          st.text(max_size=12), max_size=3)


SEEN: set[int] = set()


@pytest.fixture(scope="module", autouse=True)
def reached_every_kind_of_answer() -> Iterator[None]:
    """At the module's end: the fuzz test reached every kind of answer (a fixture's end, not
    a test of its own: under pytest-xdist a module's tests need not run in their order)."""
    yield
    if SEEN:  # (nothing to count where the fuzz test did not run)
        assert {200, 201, 401, 403, 404, 405, 413, 422} <= SEEN, sorted(SEEN)


@pytest.fixture(scope="module")
def app_and_tokens(redis_url: str) -> Iterator[tuple[Any, dict[str, str]]]:
    from broker.api.app import create_app

    for url in flushed_db(redis_url, DB):
        client = Client(url, Config(hold_if_infeasible=True))
        store = TokenStore(client.store_redis)
        now = time.time()
        toks = {role: store.create(role, role, ["a"] if role in ("user", "finance") else [],
                                   now)[0] for role in ("user", "finance", "operator", "admin")}
        toks["bad"] = "swt_0123456789ab_" + "A" * 43
        toks["none"] = ""
        yield create_app(client, submit_rate=1000.0, submit_burst=100), toks
        client.close()


async def _call(app: Any, method: str, path: str, query: str, body: bytes,
                token: str) -> tuple[int, bytes]:
    return await call_asgi(app, method, path, body, token, query)


@settings(max_examples=2000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), job_id=path_ids, query=queries, body=bodies,
       who=st.sampled_from(["user", "finance", "operator", "admin", "bad", "none"]))
def test_no_request_gets_a_500_or_a_traceback(app_and_tokens: tuple[Any, dict[str, str]],
                                              route: tuple[str, str], job_id: str,
                                              query: dict[str, str], body: bytes,
                                              who: str) -> None:
    app, toks = app_and_tokens
    method, template = route
    path = template.replace("{id}", job_id)
    qs = "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())
    if method == "GET" and "follow" in query:
        qs = qs.replace("follow=", "followed=")  # (a follow would stream until the job ends)
    status, raw = asyncio.run(_call(app, method, path, qs, body if method == "POST" else b"",
                                    toks[who]))
    check_answer(status, raw)
    SEEN.add(status)


def check_answer(status: int, raw: bytes) -> None:
    """No 500, no traceback; every error in the one JSON shape, every 422 naming its fields."""
    assert status != 500 and status != 0, raw[:500]
    assert b"Traceback" not in raw and b'File "' not in raw
    if status >= 400:
        doc = json.loads(raw)
        assert doc["error"] and isinstance(doc["errors"], list), raw[:300]
        if status == 422:
            assert doc["errors"] and all(e["field"] for e in doc["errors"]), raw[:500]
