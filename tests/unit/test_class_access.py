"""Classes are permissions (issue 35, item 6): who may submit each priority class, and per-team
caps on the GPUs held in each class. Also env names and values the node could not pass on
(item 10), refused at submit.

The rule and the cap are pure: tables. The 403 goes through the API app in process, on a Redis
server of this module's own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.api import auth
from broker.client import Client
from broker.config.core import DEFAULT_CLASSES, Config, PriorityClass, Team, load_config
from broker.cycle.plan import Snapshot
from broker.cycle.scheduler import run_cycle
from broker.errors import ConfigError, SpecError
from broker.model import Allocation, Job, JobSpec
from broker.model.classes import may_submit
from broker.model.state import JobState
from broker.security.tokens import Refused, TokenRecord, TokenStore
from policies.registry import PolicySet
from tests.asgi import call
from tests.builders import node
from tests.conftest import private_redis

CRITICAL = next(c for c in DEFAULT_CLASSES if c.name == "critical")
INFRA = replace(CRITICAL, allowed_teams=("infra",))
ONLY_INFRA = replace(CRITICAL, allowed_roles=(), allowed_teams=("infra",))
HIGH = next(c for c in DEFAULT_CLASSES if c.name == "high")


# -- who may submit a class ----------------------------------------------------------------------

@pytest.mark.parametrize(("cls", "role", "team", "allowed"), [
    (CRITICAL, "user", "vision", False),
    (CRITICAL, "finance", "vision", False),
    (CRITICAL, "operator", None, True),
    (CRITICAL, "admin", None, True),
    (CRITICAL, "operator", "vision", True),
    (INFRA, "user", "infra", True),  # a team given it
    (INFRA, "user", "vision", False),
    (INFRA, "admin", "vision", True),
    (ONLY_INFRA, "admin", "vision", False),  # no role given it: only the team
    (ONLY_INFRA, "operator", "infra", True),
    (HIGH, "user", "vision", True),  # the other shipped classes are open to all
    (HIGH, "finance", None, True),
])
def test_who_may_submit_a_class(cls: PriorityClass, role: str, team: str | None,
                                allowed: bool) -> None:
    assert may_submit(cls, role, team) is allowed


def test_only_critical_is_closed_by_default() -> None:
    assert [c.name for c in DEFAULT_CLASSES if not c.is_open] == ["critical"]
    assert CRITICAL.allowed_roles == ("operator", "admin") and CRITICAL.allowed_teams == ()


def token(role: str, teams: tuple[str, ...] = ()) -> TokenRecord:
    return TokenRecord("0123456789ab", "ann", role, teams, 0.0, "test", None)


def test_a_refusal_names_the_class_the_team_who_may_and_who_grants_it() -> None:
    cfg = Config(classes=(INFRA, *DEFAULT_CLASSES[1:]))
    spec = JobSpec.parse({"command": "true", "priority": "critical", "team": "vision"}, cfg)
    with pytest.raises(Refused) as e:
        auth.class_allowed(token("user", ("vision",)), spec, cfg)
    assert str(e.value) == (
        "priority 'critical' is not open to team 'vision' (role user); allowed: roles "
        "operator, admin; teams: infra. An admin grants it in the configuration: "
        "classes.critical.allowed_teams (or allowed_roles)")
    infra = spec.model_copy(update={"team": "infra"})
    assert auth.class_allowed(token("user", ("infra",)), infra, cfg) is infra
    # the default class counts when a spec names none
    closed = Config(default_class="critical")
    with pytest.raises(Refused, match="'critical'"):
        auth.class_allowed(token("user", ("vision",)),
                           JobSpec(command="true", team="vision"), closed)


def test_classes_in_the_configuration(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("""
classes:
  - {name: critical, rank: 400, sla_s: 300}            # the shipped one's permissions
  - {name: urgent, rank: 350, sla_s: 600, allowed_teams: [infra]}
  - {name: normal, rank: 200, sla_s: 14400}
teams:
  - {name: vision, class_caps: {urgent: 8, normal: 16}}
""")
    cfg = load_config(f, env={})
    assert cfg.priority("critical").allowed_roles == ("operator", "admin")  # type: ignore[union-attr]
    urgent = cfg.priority("urgent")
    assert urgent is not None and (urgent.allowed_roles, urgent.allowed_teams) == ((), ("infra",))
    assert cfg.priority("normal").is_open  # type: ignore[union-attr]
    assert cfg.team("vision").class_caps == (("urgent", 8), ("normal", 16))
    assert cfg.team("vision").class_cap("normal") == 16 and cfg.team("nlp").class_cap("x") is None
    # opened to all, explicitly
    f.write_text("classes: [{name: critical, rank: 1, sla_s: 60, allowed_roles: []}]\n"
                 "default_class: critical\n")
    assert load_config(f, env={}).priority("critical").is_open  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "words"), [
    ("classes: [{name: c, rank: 1, allowed_roles: [root]}]\ndefault_class: c",
     "classes[0].allowed_roles: 'root' is not a role; allowed: user, finance, operator, admin"),
    ("classes: [{name: c, rank: 1, allowed_teams: 3}]\ndefault_class: c",
     "classes[0].allowed_teams: 3 must be a list of team names"),
    ("teams: [{name: v, class_caps: [high]}]", "teams[0].class_caps: ['high'] must be a mapping"),
    ("teams: [{name: v, class_caps: {high: -1}}]", "teams[0].class_caps.high: -1 is not allowed"),
    ("teams: [{name: v, class_caps: {high: 1.5}}]", "teams[0].class_caps.high: 1.5 is not"),
    ("teams: [{name: v, class_caps: {gold: 4}}]",
     "teams[v].class_caps: 'gold' is not a class; allowed: critical, high, normal, low"),
])
def test_bad_access_settings_are_named(tmp_path: Path, text: str, words: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, env={})
    assert words in str(e.value)


def test_a_job_over_its_class_cap_by_itself_is_refused_at_submit() -> None:
    cfg = Config(teams=(Team("vision", class_caps=(("high", 16),)),))
    assert JobSpec.parse({"command": "true", "gpus": 8, "nodes": 2, "priority": "high",
                          "team": "vision"}, cfg).gpus == 8
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"command": "true", "gpus": 8, "nodes": 3, "priority": "high",
                       "team": "vision"}, cfg)
    (err,) = e.value.errors
    assert err.field == "gpus" and "asks 24 GPU(s) in class 'high'" in err.problem
    assert "teams[vision].class_caps.high" in err.allowed
    # another team, another class: no cap
    JobSpec.parse({"command": "true", "gpus": 8, "nodes": 3, "priority": "high",
                   "team": "nlp"}, cfg)
    JobSpec.parse({"command": "true", "gpus": 8, "nodes": 3, "priority": "normal",
                   "team": "vision"}, cfg)


# -- the cap in the cycle's admit phase ----------------------------------------------------------

NOW = 10_000.0


def a_job(job_id: str, gpus: int, team: str, priority: str = "high",
          state: JobState = JobState.PENDING, on: str = "a", first: int = 0) -> Job:
    spec = JobSpec(command="true", gpus=gpus, priority=priority, team=team)
    allocs = () if state is JobState.PENDING else (
        Allocation(on, tuple(f"GPU-{on}-{i}" for i in range(first, first + gpus))),)
    return Job(job_id, spec, state, 0.0, allocations=allocs,
               started_at=None if state is JobState.PENDING else 1000.0)


def cycle(pending: list[Job], active: list[Job], caps: dict[str, int] | None,
          policy: str | None = None) -> tuple[set[str], dict[str, Any]]:
    teams = (Team("vision", class_caps=tuple((caps or {}).items())), Team("nlp"))
    allocated: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    for j in active:
        for al in j.allocations:
            for g in al.gpu_ids:
                allocated[al.node_id][g] = f"{j.id}:{j.attempt}"
    snap = Snapshot(NOW, tuple(pending), tuple(active), (node("a"), node("b")), allocated,
                    DEFAULT_CLASSES, teams=teams)
    plan = run_cycle(snap, PolicySet.named(policy) if policy else None)
    return {s.job_id for s in plan.starts}, dict(plan.pending)


@pytest.mark.parametrize(("caps", "active", "pending", "started", "held"), [
    # no cap: both start
    (None, [], [("p1", 4, "vision", "high"), ("p2", 4, "vision", "high")], {"p1", "p2"}, None),
    # the cap counts the jobs this cycle starts: the second would be 8 > 6
    ({"high": 6}, [], [("p1", 4, "vision", "high"), ("p2", 4, "vision", "high")], {"p1"},
     ("p2", 4, 4)),
    # ... and the running and starting ones (a STOPPING one is giving its GPUs back)
    ({"high": 6}, [("r1", 2, "vision", "high", JobState.RUNNING),
                   ("r2", 2, "vision", "high", JobState.STARTING),
                   ("r3", 4, "vision", "high", JobState.STOPPING)],
     [("p1", 4, "vision", "high")], set(), ("p1", 4, 4)),
    ({"high": 8}, [("r1", 2, "vision", "high", JobState.RUNNING),
                   ("r2", 2, "vision", "high", JobState.STARTING)],
     [("p1", 4, "vision", "high")], {"p1"}, None),
    # other classes and other teams are not counted, nor capped
    ({"high": 4}, [("r1", 4, "vision", "normal", JobState.RUNNING),
                   ("r2", 4, "nlp", "high", JobState.RUNNING)],
     [("p1", 4, "vision", "high"), ("p2", 2, "nlp", "high"), ("p3", 2, "vision", "low")],
     {"p1", "p2", "p3"}, None),
    # a job that fits under the cap passes one that does not (before it or after it, as
    # the order has it: the GPUs it holds then are 0 or 2)
    ({"high": 4}, [], [("big", 6, "vision", "high"), ("small", 2, "vision", "high")],
     {"small"}, ("big", None, 6)),
    # a cap of 0 closes the class to the team
    ({"high": 0}, [], [("p1", 1, "vision", "high")], set(), ("p1", 0, 1)),
])
@pytest.mark.parametrize("policy", [None, "spillway", "slurm-like"])
def test_a_teams_class_cap(caps: dict[str, int] | None, active: list[tuple[Any, ...]],
                           pending: list[tuple[Any, ...]], started: set[str],
                           held: tuple[str, int | None, int] | None, policy: str | None
                           ) -> None:
    used: dict[str, int] = {}
    act = []
    for job_id, gpus, team, prio, state in active:
        on = "a" if used.get("a", 0) + gpus <= 8 else "b"
        act.append(a_job(job_id, gpus, team, prio, state, on, used.get(on, 0)))
        used[on] = used.get(on, 0) + gpus
    starts, reasons = cycle([a_job(*p) for p in pending], act, caps, policy)
    assert starts == started
    if held is None:
        assert not any(r.code == "ClassCap" for r in reasons.values())
        return
    job_id, holds, asks = held
    reason = reasons[job_id]
    assert reason.code == "ClassCap", reason
    cap = (caps or {})["high"]
    if holds is None:
        holds = int(reason.message.split("it holds ")[1].split()[0])
        assert holds in (0, 2)
    assert reason.message == (
        f"team 'vision' may hold at most {cap} GPU(s) of class 'high' at once "
        f"(teams[vision].class_caps.high); it holds {holds} (starting and running) and this "
        f"job asks {asks}: it waits for the team's high jobs to end")


def test_no_cap_configured_changes_no_plan() -> None:
    """The same cycle with teams without caps and with no teams at all plans the same."""
    pending = [a_job(f"p{i}", 1 + i % 4, "vision" if i % 2 else "nlp",
                     ("critical", "high", "normal", "low")[i % 4]) for i in range(12)]
    active = [a_job("r1", 4, "vision", "high", JobState.RUNNING)]
    allocated: dict[str, dict[str, str]] = {"a": {f"GPU-a-{i}": "r1:1" for i in range(4)},
                                            "b": {}}
    plans = []
    for teams in ((), (Team("vision"), Team("nlp"))):
        snap = Snapshot(NOW, tuple(pending), tuple(active), (node("a"), node("b")), allocated,
                        DEFAULT_CLASSES, teams=teams)
        plans.append(run_cycle(snap, PolicySet.named("spillway")))
    assert plans[0] == plans[1]


# -- at the API ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api() -> Iterator[tuple[Any, dict[str, str], Client]]:
    from broker.api.app import create_app

    with private_redis() as url:
        cfg = Config(hold_if_infeasible=True,
                     classes=(INFRA, *DEFAULT_CLASSES[1:]),
                     teams=(Team("vision", class_caps=(("high", 16),)),))
        client = Client(url, cfg)
        store, now = TokenStore(client.store_redis), time.time()
        toks = {"vision": store.create("ann", "user", ["vision"], now)[0],
                "infra": store.create("bob", "user", ["infra"], now)[0],
                "operator": store.create("oli", "operator", [], now)[0]}
        try:
            yield create_app(client, submit_rate=1000.0, submit_burst=1000), toks, client
        finally:
            client.close()


def test_the_api_refuses_a_class_the_token_may_not_submit(
        api: tuple[Any, dict[str, str], Client]) -> None:
    app, toks, client = api
    before = len(client.list())
    status, doc = call(app, "POST", "/v1/jobs", {"spec": {"command": "true",
                                                          "priority": "critical"}},
                       toks["vision"])
    assert status == 403, doc
    assert doc["error"] == (
        "priority 'critical' is not open to team 'vision' (role user); allowed: roles "
        "operator, admin; teams: infra. An admin grants it in the configuration: "
        "classes.critical.allowed_teams (or allowed_roles)"), doc
    # a batch: all or none, and the message says which spec
    status, doc = call(app, "POST", "/v1/jobs/batch",
                       {"specs": [{"command": "true"},
                                  {"command": "true", "priority": "critical"}]},
                       toks["vision"])
    assert status == 403 and doc["error"].startswith("spec [1]: priority 'critical'"), doc
    assert len(client.list()) == before  # nothing stored
    for who in ("infra", "operator"):  # a team given it; a role given it
        status, doc = call(app, "POST", "/v1/jobs", {"spec": {"command": "true",
                                                              "priority": "critical"}},
                           toks[who])
        assert status == 201 and doc["spec"]["priority"] == "critical", doc
    status, doc = call(app, "POST", "/v1/jobs", {"spec": {"command": "true",
                                                          "priority": "high"}},
                       toks["vision"])
    assert status == 201, doc
    # over the team's cap by itself: 422 naming gpus
    status, doc = call(app, "POST", "/v1/jobs", {"spec": {
        "command": "true", "priority": "high", "gpus": 32}}, toks["vision"])
    assert status == 422 and [e["field"] for e in doc["errors"]] == ["gpus"], doc


# -- env names and values --------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "field", "words"), [
    ({"A=B": "x"}, "env", "name 'A=B' contains '='"),
    ({"": "x"}, "env", "name '' is empty"),
    ({"A\0B": "x"}, "env", "name 'A\\x00B' contains a NUL byte"),
    ({"GOOD": "a\0b"}, "env.GOOD", "contains a NUL byte"),
])
def test_env_the_node_could_not_pass_is_refused_at_submit(env: dict[str, str], field: str,
                                                          words: str) -> None:
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"command": "true", "env": env}, Config())
    (err,) = e.value.errors
    assert err.field == field and words in err.problem, err
    assert "without '='" in err.allowed


def test_env_names_are_refused_in_python_and_at_the_api(
        api: tuple[Any, dict[str, str], Client]) -> None:
    with pytest.raises(ValueError, match="contains '='"):  # (pydantic's ValidationError)
        JobSpec(command="true", env={"A=B": "1"})
    assert JobSpec(command="true", env={"A_1": "x=y", "lower.dot": ""}).env["A_1"] == "x=y"
    app, toks, _ = api
    status, doc = call(app, "POST", "/v1/jobs", {"spec": {"command": "true",
                                                          "env": {"OK": "1", "X=Y": "2"}}},
                       toks["vision"])
    assert status == 422 and [e["field"] for e in doc["errors"]] == ["env"], doc
    status, doc = call(app, "POST", "/v1/jobs", {"spec": {"command": "true",
                                                          "env": {"OK": "a\u0000"}}},
                       toks["vision"])
    assert status == 422 and [e["field"] for e in doc["errors"]] == ["env.OK"], doc


@pytest.mark.parametrize("spec", [
    {"command": ["echo", "a\0b"]}, {"command": "echo a\0b"}, {"workdir": "/tmp/a\0"},
    {"checkpoint_dir": "/ck\0"},
])
def test_nul_bytes_in_the_command_and_paths_are_refused_at_submit(spec: dict[str, Any]
                                                                   ) -> None:
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"command": "true", **spec})
    assert [x.field for x in e.value.errors] == [next(iter(spec))]
