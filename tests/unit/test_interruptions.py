"""workers/interruptions.py against a local metadata server (tests/fake_metadata.py) for both
clouds: no notice -> nothing; a notice -> exactly one drain, of kind spot, with the instance
record DRAINING and its zone cooled down."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.config.core import Config
from broker.control.embedded import free_port
from broker.model import Instance, InstanceState, Node
from broker.model.state import EvictionKind
from broker.store import MemoryStore
from broker.store.instances import block_key
from broker.store.node_reports import DEFAULT_COOLDOWN_S
from broker.waiting import poll_until
from tests.fake_metadata import MetadataServer
from workers.channel import StoreChannel
from workers.interruptions import (
    AwsNotices,
    GcpNotices,
    MetadataError,
    Notice,
    Watcher,
    act_on_notice,
    make_watcher,
    source_for,
)

SPOT_SITE = "aws:us-east-1:us-east-1a:spot"


@pytest.fixture
def meta() -> Iterator[MetadataServer]:
    server = MetadataServer().start()
    yield server
    server.stop()


def wait(pred: Any, what: str, timeout: float = 10.0) -> Any:
    return poll_until(pred, timeout, what, error=AssertionError)


# -- the two clouds' endpoints -----------------------------------------------------------------


def test_aws_no_notice_then_a_notice_with_its_time(meta: MetadataServer) -> None:
    aws = AwsNotices(meta.url)
    now = time.time()
    assert aws.check(now) is None and aws.check(now) is None
    assert meta.hits["/latest/api/token"] == 1  # one IMDSv2 token, reused
    assert meta.refused == {}
    meta.interrupt("terminate", in_s=120)
    notice = aws.check(now)
    assert notice is not None and (notice.cloud, notice.action) == ("aws", "terminate")
    assert notice.deadline is not None and abs(notice.deadline - meta.at) <= 1.0
    assert "aws spot interruption notice (terminate, 1" in notice.describe(now)


def test_aws_renews_a_refused_token(meta: MetadataServer) -> None:
    aws = AwsNotices(meta.url)
    assert aws.check(time.time()) is None
    meta.expire_tokens()  # the service forgot it (restart, or the TTL ran out)
    meta.interrupt("stop")
    notice = aws.check(time.time())
    assert notice is not None and notice.action == "stop"
    assert meta.hits["/latest/api/token"] == 2
    assert meta.refused["/latest/meta-data/spot/instance-action"] == 1


def test_aws_notice_without_a_readable_time_is_still_a_notice() -> None:
    from workers.interruptions import _aws_notice

    assert _aws_notice("not json") == Notice("aws", "terminate", None, "not json")


def test_gcp_preempted_flag(meta: MetadataServer) -> None:
    gcp = GcpNotices(meta.url)
    now = time.time()
    assert gcp.check(now) is None
    meta.interrupt()
    notice = gcp.check(now)
    assert notice == Notice("gcp", "preempted", now + 30.0, "TRUE")
    assert meta.refused == {}  # the Metadata-Flavor header was sent


def test_unreachable_metadata_service_is_a_metadata_error() -> None:
    for source in (AwsNotices(f"http://127.0.0.1:{free_port()}", timeout_s=0.5),
                   GcpNotices(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)):
        with pytest.raises(MetadataError, match=r"127\.0\.0\.1"):
            source.check(time.time())


@pytest.mark.parametrize(("site", "watch", "expected"), [
    ("onprem", "auto", None),
    ("aws:us-east-1:us-east-1a:ondemand", "auto", None),
    (SPOT_SITE, "auto", AwsNotices),
    ("aws-prod:us-east-1:us-east-1a:spot", "auto", AwsNotices),
    ("gcp:us-central1:us-central1-a:spot", "auto", GcpNotices),
    ("local:home:home-a:spot", "auto", None),
    ("aws:us-east-1:us-east-1a:ondemand", "aws", AwsNotices),
    ("onprem", "gcp", GcpNotices),
    (SPOT_SITE, "off", None),
])
def test_which_watcher_a_site_gets(site: str, watch: str, expected: type | None) -> None:
    from broker.model import Site

    found = source_for(Site.parse(site), watch, "http://127.0.0.1:1")
    assert (type(found) if found is not None else None) is expected


# -- the watcher thread ------------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_watcher_fires_exactly_once_and_only_on_a_notice(meta: MetadataServer,
                                                         cloud: str) -> None:
    source = AwsNotices(meta.url) if cloud == "aws" else GcpNotices(meta.url)
    path = ("/latest/meta-data/spot/instance-action" if cloud == "aws"
            else "/computeMetadata/v1/instance/preempted")
    calls: list[Notice] = []
    w = Watcher(source, calls.append, interval_s=0.02).start()
    try:
        wait(lambda: meta.hits[path] >= 5, "five polls")
        assert calls == [] and not w.fired.is_set()  # no notice: nothing happened
        meta.interrupt()
        wait(w.fired.is_set, "the watcher to act on the notice")
        wait(lambda: not w._thread.is_alive(), "the watcher to stop polling")
        assert len(calls) == 1 and calls[0].cloud == cloud and w.notice == calls[0]
    finally:
        w.stop()


def test_watcher_keeps_polling_while_the_service_is_down() -> None:
    port = free_port()
    checks = []

    class Flaky:
        cloud = "aws"

        def check(self, now: float) -> Notice | None:
            checks.append(now)
            if len(checks) < 4:
                raise MetadataError(f"http://127.0.0.1:{port}: connection refused")
            return Notice("aws", "terminate", None)

    fired = threading.Event()
    w = Watcher(Flaky(), lambda n: fired.set(), interval_s=0.01).start()
    try:
        wait(fired.is_set, "a notice after three failed polls")
        assert len(checks) == 4
    finally:
        w.stop()


def test_bad_settings_name_the_variable() -> None:
    agent = FakeAgent(MemoryStore(), Node("n1", (), site=SPOT_SITE))
    with pytest.raises(ValueError, match="SPILLWAY_SPOT_WATCH: 'sometimes' is not one of"):
        make_watcher(agent, {"SPILLWAY_SPOT_WATCH": "sometimes"})
    with pytest.raises(ValueError, match="SPILLWAY_SPOT_POLL_S: '0' must be seconds > 0"):
        make_watcher(agent, {"SPILLWAY_SPOT_POLL_S": "0"})
    assert make_watcher(FakeAgent(MemoryStore(), Node("n2", ())), {}) is None  # on-prem
    w = make_watcher(agent, {"SPILLWAY_METADATA_URL": "http://127.0.0.1:9"})
    assert w is not None and isinstance(w.source, AwsNotices)
    assert w.source.base == "http://127.0.0.1:9"


# -- what the agent does on a notice -----------------------------------------------------------


@dataclass
class FakeAgent:
    """The agent's drain, recorded (the real one runs in the integration tests); its reports
    go to the store at once (workers/channel.py StoreChannel, the scheduler's rules)."""

    store: MemoryStore
    node: Node
    config: Any = field(default_factory=Config)
    drains: list[tuple[EvictionKind, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.channel = StoreChannel(self.store, self.node.id)

    def drain(self, timeout: float | None = None, kind: EvictionKind = EvictionKind.PRIORITY,
              reason: str | None = None) -> bool:
        self.drains.append((kind, reason))
        return True


def ready_instance(store: MemoryStore, provider_id: str, now: float) -> Instance:
    offer_id = f"{SPOT_SITE}/g5.xlarge"
    inst = Instance("req-1", offer_id, requested_at=now)
    store.record_instances([inst])
    store.move_instance("req-1", InstanceState.BOOTING, now, "listed",
                        provider_id=provider_id)
    moved = store.move_instance("req-1", InstanceState.READY, now, "registered",
                                node_id=provider_id)
    assert moved is not None and moved.state is InstanceState.READY
    return moved


def test_notice_drains_as_spot_marks_the_instance_and_cools_the_zone() -> None:
    config = Config(providers={"aws": {"cooldown_s": 600.0}})
    store, now = MemoryStore(config), time.time()
    ready_instance(store, "i-0abc", now)
    node = Node("i-0abc", (), site=SPOT_SITE, instance_id="i-0abc")
    store.heartbeat(node, 30.0, now)  # (the scheduler reads the node's instance id)
    agent = FakeAgent(store, node, config)
    notice = Notice("aws", "terminate", now + 120)
    assert act_on_notice(agent, notice, now)
    assert agent.drains == [(EvictionKind.SPOT,
                             "Node i-0abc: aws spot interruption notice (terminate, 120s left)")]
    inst = store.instance("req-1")
    assert inst is not None and inst.state is InstanceState.DRAINING
    assert "spot interruption notice" in inst.history[-1].reason
    blocks = store.blocks(now)
    key = block_key("aws", "us-east-1", "us-east-1a", "g5.xlarge")
    assert set(blocks) == {key} and blocks[key].until == pytest.approx(now + 600.0)


def test_notice_without_an_instance_record_still_drains() -> None:
    store, now = MemoryStore(), time.time()
    agent = FakeAgent(store, Node("n1", (), site=SPOT_SITE, instance_id="i-unknown"))
    act_on_notice(agent, Notice("gcp", "preempted", None), now)
    assert [k for k, _ in agent.drains] == [EvictionKind.SPOT]
    assert store.blocks(now) == {}
    assert DEFAULT_COOLDOWN_S == 900.0
