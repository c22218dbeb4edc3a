"""AWS machines on the real system: moto's EC2 server, the AWS provider, and the test-side boot
shim (tests/boot_shim.py) that runs each moto instance's user data as a local process with its
own IMDSv2 metadata service."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.model.cloud import InstanceState, Market, Offer
from providers.aws import AwsProvider
from tests.boot_shim import booting
from tests.fake_ec2 import AWS_TEST_ENV, FaultProxy, moto_ec2
from tests.integration.harness import wait_until

pytestmark = pytest.mark.integration

AMI = "ami-12c6146b"

# What a real machine's boot script does first (providers/userdata.py): an IMDSv2 token, then
# the instance id; here it then only records what it learnt and waits to be shut down.
PROBE = """#!/bin/sh
set -eu
META="${SPILLWAY_METADATA_URL:-http://169.254.169.254}"
TOKEN=$(curl -sf -X PUT "$META/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 60")
ID=$(curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" "$META/latest/meta-data/instance-id")
ZONE=$(curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" \\
  "$META/latest/meta-data/placement/availability-zone")
echo "$ID $ZONE" > booted
trap 'echo "shutdown $ID" > stopped; exit 0' TERM
while :; do sleep 0.1; done
"""


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FaultProxy]]:
    for k, v in AWS_TEST_ENV.items():
        monkeypatch.setenv(k, v)
    with moto_ec2() as served:
        yield served


def test_boot_shim_runs_user_data_with_imdsv2_and_shuts_down_on_terminate(
        ec2: tuple[str, FaultProxy], tmp_path: Path) -> None:
    moto_url, proxy = ec2
    cluster = f"t{uuid.uuid4().hex[:8]}"
    p = AwsProvider("aws", cluster, ["us-east-1"], endpoint_url=proxy.url, image=AMI)
    offer = Offer("aws", "us-east-1", "us-east-1c", "g5.xlarge", "A10G", 1, 24.0, Market.SPOT,
                  0.4)
    with booting(moto_url, cluster, tmp_path, grace_s=5) as shim:
        machines = p.launch(offer, 2, "req-boot", PROBE)
        again = p.launch(offer, 2, "req-boot", PROBE)  # a repeated launch: the same two
        assert {m.provider_id for m in again} == {m.provider_id for m in machines}
        ids = sorted(m.provider_id for m in machines)
        booted = [tmp_path / i / "booted" for i in ids]
        wait_until(lambda: all(b.exists() and b.read_text() for b in booted), 30,
                   "both machines to boot and read their metadata")
        assert [b.read_text() for b in booted] == [f"{i} us-east-1c\n" for i in ids]
        assert shim.booted == 2
        for i in ids:  # IMDSv2 only: every read carried the session token
            assert shim.machines[i].meta.refused == {}

        p.terminate(ids)
        wait_until(lambda: shim.running() == [], 30, "the machines to shut down")
        assert [(tmp_path / i / "stopped").read_text() for i in ids] == \
            [f"shutdown {i}\n" for i in ids]
        assert shim.shut_down == 2
    assert {m.state for m in p.instances().values()} == {InstanceState.TERMINATED}
