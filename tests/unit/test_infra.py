"""infra/: the compose file's wiring, the Prometheus rules (promtool), the Grafana dashboard and
the systemd units. Docker does not run here: the compose file is checked as data."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from broker.cli import app
from broker.config.core import Config
from broker.metrics.agent import AgentMetrics
from broker.metrics.scheduler import SchedulerMetrics

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
COMPOSE = INFRA / "compose" / "compose.yaml"
RULES = INFRA / "prometheus" / "rules.yml"
PROMETHEUS = INFRA / "prometheus" / "prometheus.yml"
DASHBOARD = INFRA / "grafana" / "spillway.json"
UNITS = INFRA / "systemd"

NAME = re.compile(r"\bspillway_[a-z0-9_]+")


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def exported_names() -> set[str]:
    """Every sample name the scheduler's and the agent's registries can expose."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count", "_created")}
    names: set[str] = set()
    for registry in (SchedulerMetrics(Config().classes).registry, AgentMetrics().registry):
        for family in registry.collect():
            names.update(family.name + s for s in suffixes[family.type])
    return names


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> list[str]:
        out = []
        for p in panels:
            out += [t["expr"] for t in p.get("targets", ())]
            out += walk(p.get("panels", []))
        return out
    return walk(json.loads(DASHBOARD.read_text())["panels"])


# -- compose -----------------------------------------------------------------------------------


def test_compose_runs_redis_two_schedulers_an_agent_flower_prometheus_grafana() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "scheduler-1", "scheduler-2", "agent", "flower",
                             "prometheus", "grafana"}
    for name, svc in services.items():
        for dep in svc.get("depends_on", ()):
            assert dep in services, f"{name} depends on unknown {dep}"
        assert svc.get("restart") == "unless-stopped", name


def test_compose_redis_is_durable_protected_and_never_evicts() -> None:
    svc = compose()["services"]["redis"]
    cmd = svc["command"]
    pairs = dict(zip(cmd[1::2], cmd[2::2]))
    assert cmd[0] == "redis-server"
    assert pairs["--appendonly"] == "yes"
    assert pairs["--appendfsync"] == "everysec"
    assert pairs["--maxmemory-policy"] == "noeviction"
    assert "REDIS_PASSWORD" in pairs["--requirepass"]
    assert "ports" not in svc  # reachable from the compose network only
    text = COMPOSE.read_text()
    for setting in ("--appendonly", "--appendfsync", "--requirepass", "--maxmemory-policy"):
        before = text.split(f"- {setting}\n", 1)[0].rstrip().splitlines()[-1].strip()
        assert before.startswith("#"), f"{setting} has no comment above it"


def test_compose_spillway_services_share_the_image_and_the_password_url() -> None:
    services = compose()["services"]
    for name in ("scheduler-1", "scheduler-2", "agent", "flower"):
        svc = services[name]
        url = svc["environment"]["SPILLWAY_REDIS_URL"]
        assert url.startswith("redis://:${REDIS_PASSWORD") and url.endswith("@redis:6379/0")
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        build = svc["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file()
    assert services["flower"]["entrypoint"][:4] == ["celery", "-A", "broker.bus.app", "flower"]


@pytest.mark.parametrize("service", ["scheduler-1", "scheduler-2", "agent"])
def test_compose_commands_are_real_cli_commands_with_real_options(service: str) -> None:
    cmd = compose()["services"][service]["command"]
    result = CliRunner().invoke(app, [cmd[0], "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for option in (a for a in cmd[1:] if a.startswith("--")):
        assert option in result.output, f"{service}: {cmd[0]} has no {option}"


def test_compose_agent_has_a_static_inventory_and_metrics_ports_match_the_config() -> None:
    services = compose()["services"]
    cmd = services["agent"]["command"]
    assert cmd[cmd.index("--gpus") + 1] == "2xA100-80GB"
    assert services["agent"]["expose"] == [str(Config().agent_metrics_port)]
    for name in ("scheduler-1", "scheduler-2"):
        assert services[name]["command"][0] == "scheduler"
        assert services[name]["expose"] == [str(Config().metrics_port)]


def test_prometheus_scrapes_both_schedulers_and_the_agent_and_loads_the_rules() -> None:
    services = compose()["services"]
    prom = yaml.safe_load(PROMETHEUS.read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"]
               for job in prom["scrape_configs"]}
    assert targets["spillway-scheduler"] == [f"scheduler-1:{Config().metrics_port}",
                                             f"scheduler-2:{Config().metrics_port}"]
    assert targets["spillway-agent"] == [f"agent:{Config().agent_metrics_port}"]
    for job in targets.values():
        for target in job:
            host, port = target.split(":")
            assert port in services[host]["expose"]
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"] if "/" in
                  v.split(":")[0])
    for source in mounts:
        assert (COMPOSE.parent / source).is_file(), source
    assert mounts["../prometheus/rules.yml"] in prom["rule_files"]
    flags = services["prometheus"]["command"]
    assert f"--config.file={mounts['../prometheus/prometheus.yml']}" in flags


def test_grafana_is_provisioned_with_the_datasource_and_the_dashboard() -> None:
    services = compose()["services"]
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"]
                  if v.startswith("../"))
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    assert (COMPOSE.parent / "../grafana/provisioning").is_dir()
    provisioning = INFRA / "grafana" / "provisioning"
    ds = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]
    providers = yaml.safe_load((provisioning / "dashboards" / "spillway.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert mounts["../grafana/spillway.json"] == f"{path}/spillway.json"
    dash = json.loads(DASHBOARD.read_text())
    uids = {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", ())}
    assert uids == {source["uid"]}


# -- Prometheus rules and the dashboard --------------------------------------------------------


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; "
                    ".ci/run installs it)")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_accepts_the_prometheus_config(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; "
                    ".ci/run installs it)")
    config = yaml.safe_load(PROMETHEUS.read_text())
    shutil.copy(RULES, tmp_path / "rules.yml")
    config["rule_files"] = [str(tmp_path / "rules.yml")]  # where compose mounts it, here
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_tests_pass() -> None:
    """The alerts' own unit tests (infra/prometheus/tests/*.yml): series in, alerts out."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; "
                    ".ci/run installs it)")
    tests = sorted(str(p) for p in (INFRA / "prometheus" / "tests").glob("*.yml"))
    assert tests
    done = subprocess.run([promtool, "test", "rules", *tests], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_cover_the_operations_alerts() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    assert set(rules) >= {"SpillwaySLABreaches", "SpillwayAgentDown", "SpillwayNoLeader",
                          "SpillwayCycleTooSlow", "SpillwayInstancesStuckBooting",
                          "SpillwayOrphanInstances", "SpillwayCyclesFailing",
                          "SpillwayJobsSetAside"}
    no_leader = rules["SpillwayNoLeader"]
    assert "sum(spillway_leader) == 0" in no_leader["expr"] and no_leader["for"] == "30s"


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_name_used_is_exported(source: str) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    used = {name for e in exprs for name in NAME.findall(e)}
    assert len(used) >= 6
    assert used - exported_names() == set()


def test_the_dashboard_shows_every_scheduler_and_agent_metric() -> None:
    used = {name for e in dashboard_exprs() for name in NAME.findall(e)}
    families = {f.name for r in (SchedulerMetrics(Config().classes).registry,
                                 AgentMetrics().registry) for f in r.collect()}
    shown = {f for f in families if any(u.startswith(f) for u in used)}
    assert families - shown == set()


# -- systemd -----------------------------------------------------------------------------------


def unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, comment_prefixes=("#",),
                                          inline_comment_prefixes=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read_string((UNITS / name).read_text())
    return parser


@pytest.mark.parametrize(("name", "command"), [("spillway-scheduler.service", "scheduler"),
                                               ("spillway-worker.service", "worker"),
                                               ("spillway-registrar.service", "registrar")])
def test_units_restart_and_are_sandboxed(name: str, command: str) -> None:
    u = unit(name)
    svc = u["Service"]
    assert svc["ExecStart"].split()[1] == command
    assert svc["Restart"] == "always" and float(svc["RestartSec"]) > 0
    assert u["Unit"]["StartLimitIntervalSec"] == "0"
    assert svc["NoNewPrivileges"] == "yes"
    assert svc["ProtectSystem"] in ("strict", "full")
    if command == "registrar":  # (a uid of its own: no other component reads its URL)
        assert svc["DynamicUser"] == "yes" and "User" not in svc
        assert svc["EnvironmentFile"] == "/etc/spillway/registrar.env"
    elif command == "worker":  # (root: its jobs run as their teams' uids, workers/users.py)
        assert svc["User"] == "root" and "--redis-url-file" in svc["ExecStart"]
        assert svc["LoadCredential"].startswith("redis.url:")
    else:
        assert svc["User"] == "spillway"
    lines = (UNITS / name).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# -- sandboxing"))
    sandbox = lines[start:lines.index("[Install]")]
    for i, line in enumerate(sandbox):  # each setting is explained by the comment above it
        if "=" in line and not line.startswith("#"):
            above = next(x for x in reversed(sandbox[:i]) if "=" not in x or x.startswith("#"))
            assert above.startswith("#"), f"{name}: {line} has no comment"


def test_the_worker_unit_leaves_jobs_their_gpus_and_files() -> None:
    svc = unit("spillway-worker.service")["Service"]
    assert "PrivateDevices" not in svc  # jobs need /dev/nvidia*
    assert "ProtectHome" not in svc  # jobs read users' code and data
    assert svc["ProtectSystem"] == "full"  # not strict: checkpoints go anywhere
    assert svc["KillMode"] == "mixed"
    # its cgroup subtree is its own: job cgroups go in <unit>/jobs (workers/cgroupfs.py)
    assert svc["Delegate"] == "yes" and "ProtectControlGroups" not in svc
    assert svc["ExecStart"].split()[-1] == "/var/lib/spillway"
    assert svc["StateDirectory"] == "spillway"


def test_systemd_analyze_accepts_the_units() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    for path in sorted(UNITS.glob("*.service")):
        done = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True,
                              timeout=60)
        problems = [line for line in (done.stdout + done.stderr).splitlines()
                    if line.strip() and "is not executable" not in line
                    and "/opt/spillway/bin/spillway" not in line]
        assert problems == [], path.name
