"""The local provider (machines as process groups), the boot script (providers/userdata.py)
run for real against fake metadata services, and the provisioner's handling of provider
errors (a real local provider with faults injected in front of it)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.bus.runtime import Runtime
from broker.cloud.provisioner import Provisioner
from broker.config.core import Config
from broker.config.providers import parse_providers
from broker.model import Instance, InstanceState, Market, Offer
from broker.store.instances import block_key_of
from broker.waiting import poll_until
from providers.base import CloudMachine, FailOver, Retry, Stop
from providers.local import LocalProvider
from providers.userdata import render

S = InstanceState


# -- the boot script ------------------------------------------------------------------------


class _Metadata(http.server.BaseHTTPRequestHandler):
    """AWS IMDSv2 (a token first) and GCE metadata (a Metadata-Flavor header), as far as the
    boot script uses them."""

    def do_PUT(self) -> None:
        ok = self.path == "/latest/api/token" and \
            self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._reply(200 if ok else 400, "tok-1")

    def do_GET(self) -> None:
        if self.path == "/latest/meta-data/instance-id":
            ok = self.headers.get("X-aws-ec2-metadata-token") == "tok-1"
            self._reply(200 if ok else 401, "i-0abc123")
        elif self.path == "/computeMetadata/v1/instance/name":
            ok = self.headers.get("Metadata-Flavor") == "Google"
            self._reply(200 if ok else 403, "sw-req-1")
        else:
            self._reply(404, "")

    def _reply(self, code: int, body: str) -> None:
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def offer(provider: str = "aws", extra: dict[str, Any] | None = None) -> Offer:
    return Offer(provider, "us-east-1", "us-east-1a", "p4d.24xlarge", "A100-40GB", 8, 40.0,
                 Market.SPOT, 9.8, extra=extra or {})


def boot(tmp: Path, script: str, env: dict[str, str]) -> list[str]:
    """Run a boot script whose worker command records its arguments; return them."""
    (tmp / "boot.sh").write_text(script)
    done = subprocess.run(["/bin/sh", str(tmp / "boot.sh")], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp / "argv.json").read_text())  # type: ignore[no-any-return]


def recorder(tmp: Path) -> str:
    (tmp / "rec.py").write_text("import json, sys\n"
                                f"json.dump(sys.argv[1:], open({str(tmp / 'argv.json')!r}, 'w'))\n")
    return f"{sys.executable} {tmp / 'rec.py'}"


@pytest.mark.parametrize("kind, instance_id", [("aws", "i-0abc123"), ("gcp", "sw-req-1")])
def test_the_boot_script_asks_the_metadata_service_for_the_instance_id(
        tmp_path: Path, metadata: str, kind: str, instance_id: str) -> None:
    script = render(offer(kind), kind, "redis://broker:6379/0", "req-1",
                    install_command=f"touch {tmp_path / 'installed'}",
                    worker_command=recorder(tmp_path))
    argv = boot(tmp_path, script, {"SPILLWAY_METADATA_URL": metadata})
    assert (tmp_path / "installed").exists()
    site = f"{kind}:us-east-1:us-east-1a:spot"
    assert argv == ["--redis-url", "redis://broker:6379/0", "worker", "--site", site,
                    "--instance-id", instance_id, "--node-id", instance_id]


def test_the_boot_script_fails_without_an_instance_id(tmp_path: Path) -> None:
    script = render(offer("aws"), "aws", "redis://b/0", "req-1",
                    worker_command=recorder(tmp_path))
    (tmp_path / "boot.sh").write_text(script)
    done = subprocess.run(["/bin/sh", str(tmp_path / "boot.sh")], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "SPILLWAY_METADATA_URL": "http://127.0.0.1:9"})
    assert done.returncode != 0 and not (tmp_path / "argv.json").exists()


def test_other_kinds_take_the_instance_id_and_inventory_given(tmp_path: Path) -> None:
    o = offer("local", extra={"gpus": "2xA100-80GB", "cpus": 4, "memory_gb": 8})
    script = render(o, "local", "redis://b/0", "req-1", worker_command=recorder(tmp_path))
    argv = boot(tmp_path, script, {"SPILLWAY_INSTANCE_ID": "local-req-1"})
    assert argv[4:] == ["local:us-east-1:us-east-1a:spot", "--gpus", "2xA100-80GB", "--cpus",
                        "4", "--memory", "8", "--instance-id", "local-req-1", "--node-id",
                        "local-req-1"]


# -- the local provider ---------------------------------------------------------------------


def local(tmp: Path, **kw: Any) -> LocalProvider:
    return LocalProvider("local", "unit", state_dir=str(tmp / "cloud"), stop_timeout_s=2,
                         boot_delay_s=kw.pop("boot_delay_s", 0.0), **kw)


SLEEPER = "#!/bin/sh\nsleep 120 &\nexec sleep 120\n"  # a machine with a child process


def test_launch_is_idempotent_and_a_restarted_provider_lists_the_machines(
        tmp_path: Path) -> None:
    p = local(tmp_path)
    [m] = p.launch(p.offer, 1, "req-1", SLEEPER)
    [again] = p.launch(p.offer, 1, "req-1", SLEEPER)
    try:
        assert again.provider_id == m.provider_id == "local-req-1"
        assert m.request_id == "req-1" and m.instance_type == p.offer.instance_type
        later = local(tmp_path)  # a new provisioner process
        poll_until(lambda: later.instances()["local-req-1"].state is S.READY, 10,
                   "the machine boots")
        assert list(later.instances()) == ["local-req-1"]
        assert len(list((tmp_path / "cloud" / "unit").glob("*.json"))) == 1
    finally:
        p.terminate([m.provider_id])
    assert p.instances() == {}
    p.terminate([m.provider_id, "local-never-was"])  # unknown ids are no error


def test_terminate_kills_the_whole_process_group(tmp_path: Path) -> None:
    import psutil

    p = local(tmp_path)
    [m] = p.launch(p.offer, 1, "req-2", SLEEPER)
    pid = m.extra["pid"]
    def group() -> list[int]:
        return [x.pid for x in psutil.process_iter() if _in_group(x, pid)]

    poll_until(lambda: len(group()) >= 2, 10, "the machine and its child process")
    members = group()
    p.terminate([m.provider_id])
    poll_until(lambda: not any(psutil.pid_exists(x) and psutil.Process(x).status()
                               != psutil.STATUS_ZOMBIE for x in members), 10, "all gone")


def _in_group(proc: Any, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid
    except OSError:
        return False


def test_a_machine_that_died_is_listed_terminated(tmp_path: Path) -> None:
    p = local(tmp_path)
    [m] = p.launch(p.offer, 1, "req-3", "#!/bin/sh\nexit 0\n")
    poll_until(lambda: p.instances()["local-req-3"].state is S.TERMINATED, 10, "it dies")
    p.terminate([m.provider_id])
    assert p.instances() == {}


def test_booting_until_the_boot_delay_passed(tmp_path: Path) -> None:
    p = local(tmp_path, boot_delay_s=30.0)
    [m] = p.launch(p.offer, 1, "req-4", SLEEPER)
    try:
        assert m.state is S.BOOTING and p.instances()["local-req-4"].state is S.BOOTING
    finally:
        p.terminate([m.provider_id])


def test_bad_settings_name_the_field(tmp_path: Path) -> None:
    from providers.base import ProviderConfigError

    with pytest.raises(ProviderConfigError, match=r"providers.local.price_per_hour"):
        local(tmp_path, price_per_hour=-1)
    with pytest.raises(ProviderConfigError, match=r"providers.local.gpus"):
        local(tmp_path, gpus="2xA100-80GB,1xT4")
    with pytest.raises(ProviderConfigError, match=r"market"):
        local(tmp_path, market="reserved")


# -- the provisioner: provider errors -------------------------------------------------------


class Faulty:
    """A real LocalProvider, with the next launch failing as told."""

    def __init__(self, inner: LocalProvider) -> None:
        self.inner, self.name, self.cluster = inner, inner.name, inner.cluster
        self.fail: Exception | None = None
        self.launches = 0

    def offers(self, request: Any) -> list[Offer]:
        return self.inner.offers(request)

    def launch(self, offer: Offer, count: int, request_id: str,
               user_data: str) -> list[CloudMachine]:
        self.launches += 1
        if self.fail is not None:
            raise self.fail
        return self.inner.launch(offer, count, request_id, user_data)

    def terminate(self, ids: Any) -> None:
        self.inner.terminate(ids)

    def instances(self) -> dict[str, CloudMachine]:
        return self.inner.instances()


@pytest.fixture
def prov(tmp_path: Path) -> Iterator[tuple[Provisioner, Faulty]]:
    cfg = Config(providers=parse_providers({"local": {"cooldown_s": 120}}),
                 cluster_name="unit")
    faulty = Faulty(local(tmp_path))
    p = Provisioner(Runtime(cfg, "memory://"), {"local": faulty}, clock=lambda: 1000.0)
    try:
        yield p, faulty
    finally:
        faulty.inner.terminate(list(faulty.inner.instances()))


def requested(p: Provisioner, rid: str, offer_id: str) -> None:
    p.rt.store.record_instances([Instance(rid, offer_id, requested_at=990.0)])


def test_a_launch_records_booting_and_a_repeat_starts_nothing(
        prov: tuple[Provisioner, Faulty]) -> None:
    p, faulty = prov
    requested(p, "r1", faulty.inner.offer.id)
    got = p.launch_one("r1")
    assert got is not None and got.state is S.BOOTING and got.provider_id == "local-r1"
    assert p.launch_one("r1") == got and faulty.launches == 1
    assert "redis-url" in (faulty.inner.dir / "local-r1.sh").read_text()


def test_failover_fails_the_record_and_blocks_the_zone(prov: tuple[Provisioner, Faulty]
                                                      ) -> None:
    p, faulty = prov
    offer_id = faulty.inner.offer.id
    requested(p, "r1", offer_id)
    requested(p, "r2", offer_id)
    faulty.fail = FailOver("local", "no capacity", code="InsufficientInstanceCapacity")
    got = p.launch_one("r1")
    assert got is not None and got.state is S.FAILED and "no capacity" in got.reason
    assert p.rt.store.blocks(1000.0)[block_key_of(offer_id)].until == 1120.0
    assert p.rt.store.offers(1000.0) == []  # (published offers leave the cooling zone out)
    faulty.fail = None
    second = p.launch_one("r2")  # the zone cools down: not even tried
    assert second is not None and second.state is S.FAILED and faulty.launches == 1
    assert "cools down" in second.reason


def test_stop_fails_the_record_and_retry_propagates(prov: tuple[Provisioner, Faulty],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    p, faulty = prov
    requested(p, "r1", faulty.inner.offer.id)
    requested(p, "r2", faulty.inner.offer.id)
    faulty.fail = Stop("local", "bad credentials", code="AuthFailure")
    got = p.launch_one("r1")
    assert got is not None and got.state is S.FAILED and "bad credentials" in got.reason
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"launch r1 of {faulty.inner.offer.id} stopped: local: bad credentials (AuthFailure)"]
    faulty.fail = Retry("local", "throttled", code="RequestLimitExceeded")
    with pytest.raises(Retry):
        p.launch_one("r2")
    assert p.rt.store.instance("r2").state is S.REQUESTED  # type: ignore[union-attr]
    p.give_up("r2", 1, faulty.fail)
    assert p.rt.store.instance("r2").state is S.FAILED  # type: ignore[union-attr]


def test_an_unknown_offer_or_provider_stops(prov: tuple[Provisioner, Faulty]) -> None:
    p, _ = prov
    requested(p, "r1", "local:home:home-b:ondemand/none")
    requested(p, "r2", "aws:us-east-1:spot/p4d.24xlarge")
    assert "not offered" in p.launch_one("r1").reason  # type: ignore[union-attr]
    assert "no provider named 'aws'" in p.launch_one("r2").reason  # type: ignore[union-attr]


def test_max_instances(tmp_path: Path) -> None:
    cfg = Config(providers=parse_providers({"local": {"max_instances": 1}}),
                 cluster_name="unit")
    inner = local(tmp_path)
    p = Provisioner(Runtime(cfg, "memory://"), {"local": inner}, clock=time.time)
    try:
        for rid in ("r1", "r2"):
            requested(p, rid, inner.offer.id)
        assert p.launch_one("r1").state is S.BOOTING  # type: ignore[union-attr]
        assert "max_instances 1" in p.launch_one("r2").reason  # type: ignore[union-attr]
    finally:
        inner.terminate(list(inner.instances()))


def test_the_launch_task_retries_a_throttled_launch_then_gives_up(
        prov: tuple[Provisioner, Faulty]) -> None:
    from broker.cloud import tasks as provision_tasks

    p, faulty = prov
    requested(p, "r1", faulty.inner.offer.id)
    requested(p, "r2", faulty.inner.offer.id)
    provision_tasks.set_provisioner(p)
    try:
        faulty.fail = Retry("local", "throttled", code="RequestLimitExceeded")
        calls = {"n": 0}
        inner_launch = faulty.launch

        def twice_throttled(*a: Any) -> list[CloudMachine]:
            calls["n"] += 1
            faulty.fail = faulty.fail if calls["n"] < 3 else None
            return inner_launch(*a)

        faulty.launch = twice_throttled  # type: ignore[method-assign, assignment]
        provision_tasks.launch.apply(args=[faulty.inner.offer.id, 1, "r1", []])
        r1 = p.rt.store.instance("r1")
        assert calls["n"] == 3 and r1 is not None and r1.state is S.BOOTING
        faulty.launch = inner_launch  # type: ignore[method-assign, assignment]
        faulty.fail = Retry("local", "throttled", code="RequestLimitExceeded")
        before = faulty.launches
        provision_tasks.launch.apply(args=[faulty.inner.offer.id, 1, "r2", []])
        assert faulty.launches - before == provision_tasks.RETRIES + 1  # bounded
        r2 = p.rt.store.instance("r2")
        assert r2 is not None and r2.state is S.FAILED and "gave up retrying" in r2.reason
    finally:
        provision_tasks.set_provisioner(None)


def test_the_lifecycle_sends_a_lost_launch_again_once_a_minute(tmp_path: Path) -> None:
    from tests.unit.test_commands import Recorder

    cfg = Config(providers=parse_providers({"local": {}}), cluster_name="unit")
    inner = local(tmp_path)
    clock = {"now": 1000.0}
    p = Provisioner(Runtime(cfg, "memory://"), {"local": inner}, clock=lambda: clock["now"])
    sent = Recorder()
    p.rt.__dict__["celery"] = sent  # (the cached Celery app: record what is sent)
    requested(p, "r1", inner.offer.id)  # at 990: its message never arrived
    clock["now"] = 1045.0
    assert p.reconcile()["resent"] == 0  # not yet
    clock["now"] = 1051.0
    assert p.reconcile()["resent"] == 1
    assert p.reconcile()["resent"] == 0  # once a minute
    assert [(name, args) for name, args, _ in sent.sent] == [
        ("spillway.launch", [inner.offer.id, 1, "r1", []])]
    clock["now"] = 1125.0
    assert p.reconcile()["resent"] == 1


def test_a_machine_launched_while_the_lifecycle_lists_is_kept(tmp_path: Path) -> None:
    """The provision queue's consumer launches in its own thread: a launch that ends after a
    lifecycle pass has listed the provider, but before it reads the records, must not be
    judged vanished (and its machine then reaped as an orphan, and the job launched for
    again): seen in `spillway demo` as a machine TERMINATED at age 0."""
    cfg = Config(providers=parse_providers({"local": {}}), cluster_name="unit")
    clock = {"now": 1000.0}

    class LaunchDuringListing(Faulty):
        def instances(self) -> dict[str, CloudMachine]:
            listed = self.inner.instances()  # the listing, then the other thread's launch
            if not self.launches:
                clock["now"] += 0.2
                assert p.launch_one("r1") is not None
            return listed

    faulty = LaunchDuringListing(local(tmp_path))
    p = Provisioner(Runtime(cfg, "memory://"), {"local": faulty}, clock=lambda: clock["now"])
    try:
        requested(p, "r1", faulty.inner.offer.id)
        done = p.reconcile()
        rec = p.rt.store.instance("r1")
        assert rec is not None and rec.state is S.BOOTING, (done, rec)
        clock["now"] += 0.5
        done = p.reconcile()  # now listed: no orphan, still booting
        assert not done["orphans"] and not done["vanished"], done
        assert p.rt.store.instance("r1").state is S.BOOTING  # type: ignore[union-attr]
        assert faulty.launches == 1 and list(faulty.inner.instances()) == ["local-r1"]
    finally:
        faulty.inner.terminate(list(faulty.inner.instances()))


def test_the_node_of_a_machine_given_back_is_forgotten_after_a_while(
        prov: tuple[Provisioner, Faulty]) -> None:
    from broker.cloud.provisioner import FORGET_AFTER_S
    from broker.model import Gpu, Node

    p, faulty = prov
    store = p.rt.store
    requested(p, "r1", faulty.inner.offer.id)
    store.move_instance("r1", S.BOOTING, 992.0, "launched", provider_id="m1")
    store.move_instance("r1", S.TERMINATED, 995.0, "released")
    node = Node("m1", (Gpu("g0", 0, "A100-80GB", 80.0),), site="local:home:home-a:ondemand",
                incarnation="i1", instance_id="m1")
    store.heartbeat(node, 1.0, 990.0)
    store.expire(1000.0)
    assert p.reconcile()["forgotten"] == 0 and [n.id for n in store.nodes()] == ["m1"]
    p.clock = lambda: 991.0 + FORGET_AFTER_S + 1
    assert p.reconcile()["forgotten"] == 1 and store.nodes() == []


def test_terminate_by_provider_or_request_id_and_before_the_record_knew_the_machine(
        prov: tuple[Provisioner, Faulty]) -> None:
    p, faulty = prov
    inner = faulty.inner
    for rid in ("r1", "r2"):
        requested(p, rid, inner.offer.id)
    assert p.launch_one("r1").provider_id == "local-r1"  # type: ignore[union-attr]
    inner.launch(inner.offer, 1, "r2", SLEEPER)  # started, not recorded (a provisioner died)
    assert p.terminate(["local-r1", "r2", "nobody"], "no longer needed") == 2
    assert inner.instances() == {}
    r1, r2 = p.rt.store.instance("r1"), p.rt.store.instance("r2")
    assert r1 is not None and r1.state is S.TERMINATED and r1.reason == "no longer needed"
    assert r2 is not None and r2.state is S.TERMINATED and r2.provider_id == "local-r2"
