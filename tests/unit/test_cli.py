"""The ``spillway`` CLI through Typer's CliRunner, against a real Redis database of its own."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from tests.conftest import flushed_db

DB = 13
COMMANDS = ["submit", "queue", "show", "cancel", "logs", "explain", "nodes", "drain", "resume",
            "status", "scheduler",
            "worker", "up", "demo", "bench", "bench cycle", "bench dispatch"]



@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/spillway/config.yaml
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("SPILLWAY_HOLD_IF_INFEASIBLE", "true")  # no nodes here (test_feasible)


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


def cli(*args: str, url: str | None = None) -> tuple[int, str, str]:
    argv = (["--redis-url", url] if url else []) + list(args)
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_help_for_every_command(command: str) -> None:
    code, out, _ = cli(*command.split(), "--help")
    assert code == 0, out
    assert "Usage" in out


def test_root_help_lists_every_command() -> None:
    code, out, _ = cli("--help")
    assert code == 0
    for command in COMMANDS:
        assert command.split()[0] in out


def test_bad_spec_exits_2_naming_each_field(url: str) -> None:
    code, out, err = cli("submit", "--gpus", "99", "--gpu-type", "Z100", "-p", "urgent",
                         "--env", "NOEQUALS", "--sites", "mars", "--", "true", url=url)
    assert code == 2
    for field in ("gpus", "gpu_types", "priority", "env", "sites"):
        assert f"{field}:" in err
    assert "nothing was submitted" in err
    assert "Traceback" not in out + err
    assert json.loads(cli("queue", "--all", "--json", url=url)[1]) == []


def test_missing_command_exits_2(url: str) -> None:
    code, _, err = cli("submit", "--gpus", "1", url=url)
    assert code == 2 and "command: is required" in err


def test_submit_then_read_everything_as_json(url: str, tmp_path: Path) -> None:
    code, out, _ = cli("submit", "--gpus", "2", "-p", "high", "-t", "vision", "--name", "t1",
                       "--env", "A=1", "--time-limit", "1h30m", "python", "train.py", "--lr",
                       "3", url=url)
    assert code == 0
    job_id = out.strip()
    assert job_id.startswith("j-")

    code, out, _ = cli("queue", "--json", url=url)
    jobs = json.loads(out)
    assert [j["id"] for j in jobs] == [job_id]
    spec = jobs[0]["spec"]
    assert spec["command"] == ["python", "train.py", "--lr", "3"]
    assert (spec["gpus"], spec["priority"], spec["team"], spec["env"], spec["time_limit"]) == (
        2, "high", "vision", {"A": "1"}, 5400.0)

    assert json.loads(cli("show", job_id, "--json", url=url)[1])["id"] == job_id
    explained = json.loads(cli("explain", job_id, "--json", url=url)[1])
    assert explained["state"] == "PENDING" and explained["reason_code"] == "NotScheduledYet"
    assert explained["position"] is None  # no cycle has ranked it: nothing is replayed here
    assert json.loads(cli("nodes", "--json", url=url)[1]) == []
    assert cli("logs", job_id, url=url)[0] == 0

    code, out, _ = cli("queue", url=url)
    assert code == 0 and job_id in out and "vision" in out and "PENDING" in out
    code, out, _ = cli("show", job_id, url=url)
    assert code == 0 and "python train.py --lr 3" in out
    code, out, _ = cli("explain", job_id, url=url)
    assert code == 0 and "high" in out

    code, out, _ = cli("cancel", job_id, url=url)
    assert code == 0 and "CANCELLED" in out
    assert json.loads(cli("queue", "--json", url=url)[1]) == []
    done = json.loads(cli("queue", "--all", "--state", "cancelled", "--json", url=url)[1])
    assert [j["id"] for j in done] == [job_id]


def test_explain_shows_the_reason_and_position_the_last_cycle_recorded(url: str) -> None:
    import time

    from broker.cycle.plan import Plan
    from broker.model import Reason
    from broker.store import RedisStore

    first, second = (cli("submit", "--gpus", "1", "true", url=url)[1].strip() for _ in range(2))
    store = RedisStore(url)
    try:
        store.apply(Plan(pending={first: Reason("Resources", "waiting for 1 GPU(s)"),
                                  second: Reason("Priority", "behind a higher class")},
                         order=(second, first)), time.time())
    finally:
        store.close()
    code, out, _ = cli("explain", first, url=url)
    assert code == 0 and "2 of 2 pending" in out and "waiting for 1 GPU(s)" in out
    explained = json.loads(cli("explain", second, "--json", url=url)[1])
    assert (explained["position"], explained["pending_total"]) == (1, 2)
    assert explained["reason_code"] == "Priority"


def test_submit_from_a_file_with_overrides(url: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("command: python eval.py\ngpus: 1\nteam: nlp\nenv: {A: '1'}\n")
    code, out, _ = cli("submit", "-f", str(spec), "--gpus", "4", "--env", "B=2", "--json",
                       url=url)
    assert code == 0
    job = json.loads(out)
    assert job["spec"]["command"] == "python eval.py"
    assert (job["spec"]["gpus"], job["spec"]["team"]) == (4, "nlp")
    assert job["spec"]["env"] == {"A": "1", "B": "2"}


def test_cmd_and_args_together_is_a_spec_error(url: str) -> None:
    code, _, err = cli("submit", "--cmd", "echo hi", "echo", "hi", url=url)
    assert code == 2 and "command:" in err


def test_unknown_job_is_one_line_exit_1(url: str) -> None:
    for args in (("show", "j-nope"), ("explain", "j-nope"), ("logs", "j-nope"),
                 ("cancel", "j-nope")):
        code, out, err = cli(*args, url=url)
        assert code == 1, args
        assert "no job with id 'j-nope'" in err and "Traceback" not in out + err


def test_bad_state_filter_is_exit_2(url: str) -> None:
    code, _, err = cli("queue", "--state", "sleeping", url=url)
    assert code == 2 and "state:" in err


SPEC_HEAD = "invalid job spec (1 problem(s)); nothing was submitted:\n"


@pytest.mark.parametrize(("args", "line"), [
    (["--gpus", "two"], "gpus: 'two' is not a whole number (allowed: 0..64 per node)"),
    (["--nodes", "1.5"], "nodes: '1.5' is not a whole number (allowed: 1..1024)"),
    (["--cpus", "lots"], "cpus: 'lots' is not a number (allowed: >= 0)"),
    (["--max-price", "cheap"],
     "max_price_per_hour: 'cheap' is not a number (allowed: dollars per hour > 0)"),
    (["--sites", "nowhere"], "sites: 'nowhere' is not a site (allowed: onprem, cloud, spot)"),
    (["--sites", "mars,onprem,venus"],
     "sites: 'mars', 'venus' are not sites (allowed: onprem, cloud, spot)"),
    (["--sites", " , "], "sites: is empty; name at least one site (allowed: onprem, cloud, "
                         "spot)"),
])
def test_a_bad_number_or_site_is_one_line_of_the_spec_error(url: str, args: list[str],
                                                            line: str) -> None:
    """`--gpus two` is a spec error like `--gpus -1` (no boxed usage panel), and a site error
    names the allowed sites once."""
    code, out, err = cli("submit", *args, "--", "true", url=url)
    assert (code, out, err) == (2, "", f"{SPEC_HEAD}  {line}\n")


def test_every_bad_option_of_a_submit_is_said_at_once(url: str) -> None:
    code, _, err = cli("submit", "--gpus", "two", "--sites", "nowhere", "--", "true", url=url)
    assert code == 2 and err == (
        "invalid job spec (2 problem(s)); nothing was submitted:\n"
        "  gpus: 'two' is not a whole number (allowed: 0..64 per node)\n"
        "  sites: 'nowhere' is not a site (allowed: onprem, cloud, spot)\n")


def test_numbers_given_as_options_are_numbers_in_the_spec(url: str) -> None:
    code, out, _ = cli("submit", "--gpus", "2", "--nodes", "1", "--cpus", "1.5", "--memory",
                       "8", "--max-price", "2.5", "--min-gpu-memory", "40", "--json", "--",
                       "true", url=url)
    assert code == 0, out
    spec = json.loads(out)["spec"]
    assert [spec[k] for k in ("gpus", "nodes", "cpus", "memory_gb", "max_price_per_hour",
                              "min_gpu_memory_gb")] == [2, 1, 1.5, 8.0, 2.5, 40.0]
    assert isinstance(spec["gpus"], int) and isinstance(spec["nodes"], int)


@pytest.mark.parametrize(("args", "pattern"), [
    (["--nope"], r"error: no such option: --nope; see 'spillway -h'"),
    (["submit", "--nope", "--", "true"],
     r"error: no such option: --nope \(.*\); see 'spillway submit -h'"),
    (["queue", "--limit", "x"], r"error: invalid value for '--limit': .+; see 'spillway queue -h'"),
    (["queue", "--page", "0"], r"error: invalid value for '--page': .+; see 'spillway queue -h'"),
    (["show"], r"error: missing argument 'JOB'; see 'spillway show -h'"),
    (["budget", "set"], r"error: missing argument 'team'; see 'spillway budget set -h'"),
])
def test_a_usage_error_is_one_line(url: str, args: list[str], pattern: str) -> None:
    """Click's usage errors, in any command, as one `error:` line (exit 2), not Typer's
    boxed panel under a usage line."""
    code, out, err = cli(*args, url=url)
    assert code == 2 and out == ""
    assert re.fullmatch(pattern + r"\n", err), err


def test_a_group_without_its_command_still_shows_its_help() -> None:
    _, out, err = cli("budget")
    assert "Usage" in out + err and "set" in out + err and "error:" not in out + err


def test_no_redis_url_says_what_to_do() -> None:
    code, out, err = cli("queue")
    assert code == 1
    assert "SPILLWAY_REDIS_URL" in err and "spillway up" in err and "Traceback" not in out + err


def test_unreachable_redis_is_one_clear_line() -> None:
    code, out, err = cli("queue", url="redis://127.0.0.1:1/0")
    assert code == 1
    assert "cannot reach Redis" in err and "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1


def test_bad_config_file_is_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("heartbeat_s: often\n")
    code, _, err = cli("--config", str(bad), "queue", url="redis://127.0.0.1:1/0")
    assert code == 1 and "heartbeat_s" in err


def test_bench_cycle_prints_json() -> None:
    code, out, _ = cli("bench", "cycle", "--pending", "50", "--nodes", "5", "--cycles", "2",
                       "--json")
    assert code == 0
    assert json.loads(out)["pending"] == 50


def test_drain_and_resume_a_node(url: str) -> None:
    import time

    from broker.model import Gpu, Node, NodeState
    from broker.store import open_store

    store = open_store(url)
    store.heartbeat(Node("gpu01", (Gpu("GPU-0", 0, "A100-80GB", 80.0),)), 60.0, time.time())
    code, out, _ = cli("drain", "gpu01", url=url)
    assert code == 0 and "gpu01 DRAINING" in out
    assert store.nodes()[0].state is NodeState.DRAINING
    code, out, _ = cli("resume", "gpu01", url=url)
    assert code == 0 and store.nodes()[0].state is NodeState.READY
    code, _, err = cli("drain", "ghost", url=url)
    assert code == 1 and "no node with id 'ghost'" in err


def test_status_shows_leader_nodes_queue_running_and_cloud(url: str) -> None:
    import time

    from broker.cycle.plan import Plan, Start
    from broker.model import Allocation, Gpu, JobSpec, Node, NodeState
    from broker.store import open_store

    store = open_store(url)
    now = time.time()
    code, out, _ = cli("status", url=url)
    assert code == 0 and "Leader     none" in out and "Nodes      none registered" in out
    gpus = tuple(Gpu(f"GPU-{i}", i, "A100-80GB", 80.0) for i in range(2))
    store.heartbeat(Node("gpu01", gpus), 60.0, now)
    store.heartbeat(Node("gpu02", gpus[:1]), 60.0, now)
    store.set_node_state("gpu02", NodeState.DRAINING, "alice")
    old = store.submit(JobSpec(command=["true"], gpus=1, priority="critical"), now - 600)
    store.submit(JobSpec(command=["true"], gpus=1, priority="critical"), now - 30)
    store.submit(JobSpec(command=["true"], gpus=1), now - 60)
    run = store.submit(JobSpec(command=["true"], gpus=1), now)
    store.apply(Plan(starts=(Start(run.id, 1, run.version,
                                   (Allocation("gpu01", ("GPU-0",)),)),)), now)
    token = store.acquire_leadership("sched-a", 10.0, now)
    assert token is not None

    code, out, _ = cli("status", "--json", url=url)
    assert code == 0
    data = json.loads(out)
    assert data["leader"]["token"] == token and 0 < data["leader"]["lease_left_s"] <= 10
    assert data["nodes"] == [
        {"id": "gpu01", "state": "READY", "site": "onprem", "gpus_free": 1, "gpus_total": 2,
         "drained_by": "", "isolation": ""},
        {"id": "gpu02", "state": "DRAINING", "site": "onprem", "gpus_free": 1,
         "gpus_total": 1, "drained_by": "alice", "isolation": ""}]
    queue = {q["class"]: q for q in data["queue"]}
    assert list(queue) == ["critical", "high", "normal", "low"]
    assert queue["critical"]["pending"] == 2 and queue["normal"]["pending"] == 1
    assert 600 <= queue["critical"]["oldest_wait_s"] < 660
    assert queue["high"] == {"class": "high", "pending": 0, "oldest_wait_s": 0.0,
                             "sla_s": 1800}
    assert data["active"] == {"STARTING": 1, "RUNNING": 0, "STOPPING": 0}
    assert data["running"] == 0 and data["instances"] == []
    assert store.get(old.id).state.value == "PENDING"

    code, out, _ = cli("status", url=url)
    assert code == 0
    assert f"Leader     {token}, lease" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["gpu01"][1:4] == ["READY", "onprem", "1/2"]
    assert lines["gpu02"][1:] == ["DRAINING", "onprem", "1/1", "alice", "-"]
    # the oldest waited 10 minutes when submitted, and more by the time status ran (a loaded
    # machine can take seconds to get here)
    waited = re.fullmatch(r"10m(\d\d)s", lines["critical"][2])
    assert lines["critical"][1] == "2" and waited, lines["critical"]
    assert int(waited[1]) <= time.time() - now + 1
    assert lines["high"][1:3] == ["0", "-"]
    assert "Running    0 job(s) (1 starting, 0 stopping)" in out
    assert "Cloud      none" in out
