"""The Python client against a real Redis, with the agent's side played through the store.

No scheduler or agent process runs here: a cycle is run in-process with ``one_cycle`` and the
agent's reports go straight to the store, so every state is reached deterministically. The
client's Celery messages (cycle triggers, stop commands) land in the same Redis database and
are inspected, then flushed with it.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from broker.bus.commands import DIRTY, WAKE
from broker.client import Client, JobTimeout
from broker.config.core import Config
from broker.control.loop import one_cycle
from broker.cycle.plan import Plan, Reservation
from broker.errors import ConfigError, JobNotFound, SpecError
from broker.model import Gpu, JobSpec, Node, Reason
from broker.model.state import JobState
from broker.store.events import Exited, Started
from tests.conftest import with_db

DB = 12  # this module's own database on the session's Redis



@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    url = with_db(redis_url, DB)
    raw = redis.Redis.from_url(url)
    raw.flushdb()
    c = Client(url, Config(hold_if_infeasible=True))  # (test_feasible: refused at submit)
    try:
        yield c
    finally:
        c.close()
        raw.flushdb()  # the jobs, and the control-queue messages the client published
        raw.close()


def add_node(c: Client, node_id: str = "n1", count: int = 4, model: str = "A100-80GB") -> Node:
    gpus = tuple(Gpu(f"GPU-{node_id}-{i}", i, model, 80.0) for i in range(count))
    node = Node(node_id, gpus, hostname=node_id, cpus=64, memory_gb=512, incarnation="i1")
    c.store.heartbeat(node, ttl=60, now=time.time())
    return node


def run(c: Client, job_id: str) -> None:
    """The agent's side: the job's process started."""
    job = c.get(job_id)
    c.store.report(job_id, job.attempt, Started(0, pid=123), time.time())


def exit_(c: Client, job_id: str, code: int = 0) -> None:
    job = c.get(job_id)
    c.store.report(job_id, job.attempt, Exited(0, code), time.time())


# -- submit ---------------------------------------------------------------------------------------


def test_submit_fills_defaults_and_triggers_a_cycle(client: Client) -> None:
    job = client.submit(command="python train.py", gpus=2, gpu_types=["a100"], name="t")
    assert job.state is JobState.PENDING
    assert (job.priority, job.team) == ("normal", "default")
    assert job.spec.gpu_types == ("A100",)
    assert client.get(job.id) == job
    assert client.store_redis.get(DIRTY) == b"1"  # a cycle is due: the leader is woken
    assert client.store_redis.llen(WAKE) == 1


def test_submit_accepts_a_jobspec_a_mapping_and_overrides(client: Client) -> None:
    spec = JobSpec(command=["echo", "hi"], gpus=1, team="vision")
    a = client.submit(spec)
    b = client.submit(spec, gpus=4, priority="high")
    c = client.submit({"command": "true", "team": "nlp"}, priority="low")
    assert (a.spec.gpus, a.team, a.priority) == (1, "vision", "normal")
    assert (b.spec.gpus, b.team, b.priority) == (4, "vision", "high")
    assert (c.team, c.priority) == ("nlp", "low")


def test_bad_spec_names_every_field_and_stores_nothing(client: Client) -> None:
    with pytest.raises(SpecError) as e:
        client.submit(command="", gpus=-1, sites=["mars"], bogus=1)
    fields = {fe.field for fe in e.value.errors}
    assert {"command", "gpus", "sites", "bogus"} <= fields
    with pytest.raises(SpecError) as e:
        client.submit(command="true", priority="urgent")
    assert [fe.field for fe in e.value.errors] == ["priority"]
    assert "critical" in e.value.errors[0].allowed
    assert client.list() == []


def test_submit_many_is_all_or_none(client: Client) -> None:
    with pytest.raises(SpecError) as e:
        client.submit_many([{"command": "true"}, {"command": "true", "gpus": 999}])
    assert [fe.field for fe in e.value.errors] == ["[1].gpus"]
    assert client.list() == []
    jobs = client.submit_many([{"command": "true"}, JobSpec(command="true", gpus=2)])
    assert {j.id for j in client.list()} == {j.id for j in jobs}
    assert client.submit_many([]) == []


# -- read -----------------------------------------------------------------------------------------


def test_get_unknown_job(client: Client) -> None:
    with pytest.raises(JobNotFound, match="spillway queue --all"):
        client.get("j-nope")


def test_list_filters(client: Client) -> None:
    add_node(client)
    a = client.submit(command="true", team="vision", priority="high")
    b = client.submit(command="true", team="nlp")
    c = client.submit(command="true", team="nlp", priority="low")
    client.cancel(c.id)
    one_cycle(client._rt)
    ids = lambda jobs: [j.id for j in jobs]  # noqa: E731
    assert ids(client.list()) == [a.id, b.id, c.id]
    assert ids(client.list(state="starting")) == [a.id, b.id]
    assert ids(client.list(state=JobState.CANCELLED)) == [c.id]
    assert ids(client.list(state="STARTING,cancelled")) == [a.id, b.id, c.id]
    assert ids(client.list(state=["PENDING", JobState.CANCELLED])) == [c.id]
    assert ids(client.list(team="nlp")) == [b.id, c.id]
    assert ids(client.list(priority="high")) == [a.id]
    assert ids(client.list(limit=2)) == [b.id, c.id]
    with pytest.raises(SpecError) as e:
        client.list(state="sleeping")
    assert e.value.errors[0].field == "state"


# -- cancel, wait, logs ---------------------------------------------------------------------------


def test_cancel_pending_running_and_finished(client: Client) -> None:
    add_node(client, count=2)
    running = client.submit(command="sleep 100", gpus=2)
    queued = client.submit(command="sleep 100", gpus=2)
    one_cycle(client._rt)
    run(client, running.id)

    assert client.cancel(queued.id).state is JobState.CANCELLED
    again = client.cancel(queued.id)
    assert again.state is JobState.CANCELLED and again.version == client.get(queued.id).version

    stopping = client.cancel(running.id)
    assert stopping.state is JobState.STOPPING
    assert stopping.stop_target is JobState.CANCELLED
    stops = [json.loads(m) for m in client.store_redis.lrange("node.n1", 0, -1)]
    assert any(m["headers"]["task"] == "spillway.stop_job"
               and m["headers"]["argsrepr"].startswith(f"['{running.id}', 1") for m in stops)
    exit_(client, running.id, -15)
    assert client.get(running.id).state is JobState.CANCELLED


def test_wait_returns_the_finished_job_or_times_out(client: Client) -> None:
    add_node(client)
    job = client.submit(command="true")
    with pytest.raises(JobTimeout) as e:
        client.wait(job.id, timeout=0.3, poll_s=0.05)
    assert isinstance(e.value, TimeoutError)
    assert e.value.job.state is JobState.PENDING and "PENDING" in str(e.value)

    one_cycle(client._rt)
    run(client, job.id)
    timer = threading.Timer(0.3, exit_, args=(client, job.id, 0))
    timer.start()
    try:
        done = client.wait(job.id, timeout=10, poll_s=0.05)
    finally:
        timer.join()
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0


def test_logs_read_and_follow_until_the_job_ends(client: Client) -> None:
    add_node(client)
    job = client.submit(command="echo hi")
    assert list(client.logs(job.id)) == []  # nothing yet, and no error
    one_cycle(client._rt)
    run(client, job.id)
    client.store.append_logs(job.id, 1, [("out", "line 1"), ("err", "oops")], time.time())
    assert [(x.stream, x.text) for x in client.logs(job.id)] == [("out", "line 1"),
                                                                   ("err", "oops")]
    first = next(iter(client.logs(job.id)))
    assert [x.text for x in client.logs(job.id, since=first.cursor)] == ["oops"]

    got: queue.Queue[str | None] = queue.Queue()

    def follower() -> None:
        for x in client.logs(job.id, follow=True):
            got.put(x.text)
        got.put(None)  # the follow ended

    t = threading.Thread(target=follower, daemon=True)
    t.start()
    assert [got.get(timeout=5), got.get(timeout=5)] == ["line 1", "oops"]  # what was there
    time.sleep(1.5)  # longer than one blocking read (1 s): a follow that gave up is over now
    assert got.empty() and t.is_alive()  # still following: the job has not ended
    # the follow has begun: a line written now arrives while the job still runs
    client.store.append_logs(job.id, 1, [("out", "line 2")], time.time())
    assert got.get(timeout=5) == "line 2"
    assert t.is_alive()
    exit_(client, job.id, 0)
    assert got.get(timeout=5) is None  # the job ended: the follow stops
    t.join(5)
    assert [x.text for x in client.logs(job.id, attempt=1)] == ["line 1", "oops", "line 2"]


# -- explain, nodes -------------------------------------------------------------------------------


def test_explain_pending_running_and_finished(client: Client) -> None:
    low = client.submit(command="true", priority="low", gpus=1)
    e = client.explain(low.id)
    assert e.state is JobState.PENDING and e.reason_code == "NotScheduledYet"
    assert "spillway scheduler" in e.message
    assert (e.position, e.pending_total, e.ranked_at) == (None, None, None)

    one_cycle(client._rt)  # no nodes at all
    e = client.explain(low.id)
    assert e.reason_code == "NoFeasibleNode"
    assert (e.priority, e.rank, e.sla_s) == ("low", 100, 24 * 3600) and not e.sla_breached
    assert e.ranked_at is not None and time.time() - e.ranked_at < 60
    assert e.team_usage_gpu_s == 0.0

    high = client.submit(command="true", priority="high", gpus=2)
    add_node(client, count=2)
    one_cycle(client._rt)  # the high job takes both GPUs; the low one waits for them
    e = client.explain(low.id)
    assert e.reason_code in ("Resources", "Priority")
    run(client, high.id)
    e = client.explain(high.id)
    assert e.state is JobState.RUNNING and e.reason_code == "Running"
    assert [a.node_id for a in e.placement] == ["n1"] and e.waited_s >= 0
    assert e.position is None  # positions are for pending jobs
    exit_(client, high.id, 3)
    e = client.explain(high.id)
    assert e.state is JobState.FAILED and e.exit_code == 3 and "exit code 3" in e.message
    assert e.to_dict()["state"] == "FAILED"
    json.dumps(e.to_dict())


def test_explain_reads_the_position_the_last_cycle_recorded(client: Client) -> None:
    """Plans built by hand, applied through the store as the actuator does: explain reads
    the reason, the position and the reservation back, and recomputes nothing."""
    a, b, c = (client.submit(command="true", gpus=1) for _ in range(3))
    why = Reason("Resources", "waiting for 1 GPU(s)")
    res = Reservation(b.id, time.time() + 600, ("n1",), "A100-80GB")
    before = time.time()
    client.store.apply(Plan(pending={a.id: why, b.id: why,
                                     c.id: Reason("Reservation", "behind b")},
                            order=(b.id, c.id, a.id), reservation=res), time.time())
    e = client.explain(b.id)
    assert (e.position, e.pending_total, e.reason_code) == (1, 3, "Resources")
    assert e.ranked_at is not None and e.ranked_at >= before
    assert e.reservation == res.to_dict() and e.blocked_by is None
    e = client.explain(c.id)
    assert (e.position, e.reason_code) == (2, "Reservation")
    assert e.blocked_by == res.to_dict() and e.reservation is None
    e = client.explain(a.id)
    assert (e.position, e.blocked_by) == (3, None)  # waiting for GPUs, not for b
    d = client.submit(command="true", gpus=1)  # after the cycle: not ranked yet
    e = client.explain(d.id)
    assert (e.position, e.pending_total, e.reason_code) == (None, 3, "NotScheduledYet")
    assert "moments ago" in e.message
    out = e.to_dict()
    assert {"position", "pending_total", "ranked_at", "team_usage_gpu_s"} <= set(out)
    assert "estimate_s" not in out and "fairshare" not in out


def test_explain_reads_the_burst_outlook_the_last_cycle_recorded(client: Client) -> None:
    """A reason's burst outlook (policies/burst/outlook.py) goes through Redis and back as
    data: the client, its JSON and the CLI show it; a reason without one has none."""
    from broker.model import BurstOutlook

    a, b = (client.submit(command="true", gpus=1, priority="high") for _ in range(2))
    now = time.time()
    out = BurstOutlook(burst_at=now + 1200, sla_at=now + 1500, onprem_start=None,
                       offer_id="local:home:home-a:ondemand/t1", provider="local",
                       region="home", zone="home-a", market="ondemand", instance_type="t1",
                       price_per_hour=3.0, boot_s=4.2)
    client.store.apply(Plan(pending={a.id: Reason("Resources", "first in line; bursts", out),
                                     b.id: Reason("Priority", "behind a")},
                            order=(a.id, b.id)), now)
    e = client.explain(a.id)
    assert e.burst == out and e.reason_code == "Resources"
    assert e.to_dict()["burst"]["boot_s"] == 4.2
    assert client.get(a.id).pending_reason == Reason("Resources", "first in line; bursts", out)
    assert client.explain(b.id).burst is None


def test_explain_says_when_the_scheduler_went_quiet(client: Client) -> None:
    job = client.submit(command="true", gpus=1)
    client.store.apply(Plan(order=()), time.time() - 3600)  # the last cycle, an hour ago
    e = client.explain(job.id)
    assert e.reason_code == "SchedulerIdle" and "3600s ago" in e.message


def test_a_real_cycle_records_queue_positions(client: Client) -> None:
    low = client.submit(command="true", priority="low", gpus=1)
    one_cycle(client._rt)  # no nodes at all
    e = client.explain(low.id)
    assert (e.position, e.pending_total) == (1, 1)
    high = client.submit(command="true", priority="high", gpus=2)
    one_cycle(client._rt)
    assert (client.explain(high.id).position, client.explain(low.id).position) == (1, 2)
    add_node(client, count=2)
    one_cycle(client._rt)  # the high job starts: it leaves the recorded queue
    assert (client.explain(low.id).position, client.explain(low.id).pending_total) == (1, 1)


def test_nodes_show_free_gpus_and_jobs(client: Client) -> None:
    assert client.nodes() == []
    add_node(client, "n1", count=4)
    add_node(client, "n2", count=2, model="H100-80GB")
    job = client.submit(command="true", gpus=3, gpu_types=["A100"])
    one_cycle(client._rt)
    views = {v.id: v for v in client.nodes()}
    assert views["n1"].gpus_total == {"A100-80GB": 4}
    assert views["n1"].gpus_free == {"A100-80GB": 1}
    assert views["n1"].jobs == (job.id,) and views["n1"].state == "READY"
    assert (views["n2"].total, views["n2"].free, views["n2"].jobs) == (2, 2, ())
    assert 0 <= views["n1"].lease_age_s < 5 and views["n1"].lease_left_s > 50
    json.dumps([v.to_dict() for v in views.values()])


# -- configuration --------------------------------------------------------------------------------


def test_no_url_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPILLWAY_REDIS_URL", raising=False)
    with pytest.raises(ConfigError, match="spillway up"):
        Client(config=Config())


def test_url_from_environment_then_config(monkeypatch: pytest.MonkeyPatch,
                                          redis_url: str) -> None:
    monkeypatch.setenv("SPILLWAY_REDIS_URL", with_db(redis_url, DB))
    with Client(config=Config(redis_url="redis://elsewhere:1/0")) as c:
        assert c.redis_url == with_db(redis_url, DB)
    monkeypatch.delenv("SPILLWAY_REDIS_URL")
    with Client(config=Config(redis_url="redis://elsewhere:1/0")) as c:
        assert c.redis_url == "redis://elsewhere:1/0"


def test_two_clients_publish_to_their_own_cluster(redis_url: str) -> None:
    urls = [with_db(redis_url, DB), with_db(redis_url, DB + 1)]
    raws = [redis.Redis.from_url(u) for u in urls]
    for r in raws:
        r.flushdb()
    clients = [Client(u, Config(hold_if_infeasible=True)) for u in urls]
    try:
        for i, c in enumerate(clients + clients[::-1]):
            for r in raws:
                r.delete(WAKE)
            c.submit(command="true")
            mine = raws[urls.index(c.redis_url)]
            assert [r.llen(WAKE) for r in raws] == [int(r is mine) for r in raws], i
    finally:
        for c, r in zip(clients, raws):
            c.close()
            r.flushdb()
            r.close()
