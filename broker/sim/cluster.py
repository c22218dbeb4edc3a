"""Simulated clusters: a YAML file of node groups, priority classes, teams and policy settings.

::

    name: seed-160                 # optional; default: the file's name without .yaml
    nodes:                         # required: one or more node groups
      - {prefix: v100, count: 8, gpus: 8xV100-32GB, cpus: 64, memory_gb: 512}
      - prefix: a100mig
        count: 1
        gpus:                      # or the worker's YAML inventory list, MIG layouts included
          - {model: A100-80GB, count: 3}
          - {model: A100-80GB, mig: [3g.40gb, 3g.40gb]}
        labels: {rack: r1}         # optional
    classes:                       # optional; default: DEFAULT_CLASSES
      - {name: high, rank: 300, sla_s: 1800, may_preempt: true, preemptible: false}
    teams:                         # optional; default: none (teams appear from the trace)
      - {name: vision, weight: 2, quota_gpus: 8}
    policies:                      # optional: bundles built of registered policies, by name
      backfill-only: {order: multifactor, reserve: easy, evict: []}
    cloud: {sites: [...]}          # optional: cloud sites to burst to (broker/sim/cloud.py)
    budgets: {vision: {amount: 200}}  # optional: team caps (kept by broker/sim/ledger.py)
    settings:                      # optional; checked by policies/settings.py
      spillway: {fairshare_tier: 0.85}   # policy knobs, passed to the policies
      fairshare_half_life_s: 86400   # these three override the Config's: also min_runtime_s,
                                     # grace_s

Each group makes ``count`` nodes with ids ``{prefix}-00``, ``{prefix}-01``, ...; site
``onprem``, state READY, hostname = id. ``gpus`` is the worker's static-inventory text
(``8xA100-80GB``, ``4xA100-80GB,2xT4``) or the list its YAML inventory file takes (see
:func:`workers.discovery.inventory_from_data`). Errors raise
:class:`~broker.errors.ConfigError` naming the file, the entry and key, what is wrong and what is
allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from broker.config.core import (
    DEFAULT_CLASSES,
    PriorityClass,
    Team,
    is_number,
    is_whole,
    parse_classes,
    parse_teams,
)
from broker.errors import ConfigError
from broker.model import Gpu, Node, NodeState
from broker.sim.cloud import CloudSpec, parse_cloud
from broker.store.budgets import Budget, BudgetError
from policies.registry import PolicySet
from policies.settings import check_bundles, check_settings
from workers.discovery import inventory_from_data, static_inventory

TOP_KEYS = ("name", "nodes", "classes", "teams", "policies", "settings", "cloud", "budgets")
NODE_KEYS = ("prefix", "count", "gpus", "cpus", "memory_gb", "labels")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_COUNT = 10_000


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    teams: tuple[Team, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    policies: Mapping[str, PolicySet] = field(default_factory=dict)  # bundles it builds
    cloud: CloudSpec | None = None  # cloud sites it may rent from (broker/sim/cloud.py)
    budgets: tuple[Budget, ...] = ()  # the teams' caps (broker/sim/ledger.py)

    @property
    def capacity_gpus(self) -> int:
        """Physical GPUs: a GPU split into MIG instances counts once."""
        return sum(1 for n in self.nodes for g in n.gpus if g.mig_profile is None)

    @property
    def max_gpus_per_node(self) -> int:
        """The most whole (not MIG-split) GPUs on one node: the largest job one node can run."""
        return max((_whole(n) for n in self.nodes), default=0)

    def team(self, name: str) -> Team | None:
        return next((t for t in self.teams if t.name == name), None)


def _whole(node: Node) -> int:
    return sum(1 for g in node.gpus if g.mig_profile is None and not g.mig_enabled)


SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "clusters"
DEFAULT_CLUSTER = "seed-160"


def shipped_clusters() -> list[str]:
    """The names of the cluster files shipped in the package (``examples/clusters`` too)."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def resolve_cluster(path: str | Path) -> Path:
    """The file ``path`` names: an existing file as it is; else a shipped cluster, named
    bare (``seed-160``) or by its path in a checkout (``examples/clusters/seed-160.yaml``), so
    both work from any directory; else ``path`` itself (reading it then says what is wrong)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    stem = p.name[:-5] if p.name.endswith(".yaml") else p.name
    bare = str(path) in (stem, p.name)
    if (bare or p.parent.as_posix().endswith("examples/clusters")) and stem in shipped_clusters():
        return SHIPPED_DIR / f"{stem}.yaml"
    return p


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster file (see the module docstring), or a shipped one by name (see
    :func:`resolve_cluster`). Raises ConfigError."""
    p = resolve_cluster(path)
    if not p.exists():
        raise ConfigError(f"cannot read cluster file {p}: no such file (shipped clusters, "
                          f"usable by name: {', '.join(shipped_clusters())})")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read cluster file {p}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"cluster file {p} is not valid YAML: {e}") from None
    return cluster_from_data(data, source=str(p), default_name=p.name.split(".")[0],
                             base=p.parent)


def cluster_from_data(data: Any, source: str = "cluster", default_name: str = "cluster",
                      base: Path | None = None) -> Cluster:
    """Build a Cluster from parsed YAML (``source`` names it in error messages)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping with a 'nodes' list")
    unknown = sorted(str(k) for k in data if k not in TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; allowed: {', '.join(TOP_KEYS)}")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{source}: name: {name!r} must be a non-empty string")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(f"{source}: nodes: is required, a non-empty list of node groups such "
                          "as {prefix: a100, count: 4, gpus: 8xA100-80GB}")
    nodes: list[Node] = []
    owner: dict[str, int] = {}
    for i, item in enumerate(raw_nodes):
        for node in _node_group(item, f"{source}: nodes[{i}]"):
            if node.id in owner:
                raise ConfigError(f"{source}: nodes[{i}].prefix: node id {node.id!r} is "
                                  f"already made by nodes[{owner[node.id]}]; use distinct "
                                  "prefixes")
            owner[node.id] = i
            nodes.append(node)
    classes = DEFAULT_CLASSES
    if data.get("classes") is not None:
        classes = parse_classes(data["classes"], f"{source}: classes")
    teams = parse_teams(data.get("teams"), f"{source}: teams")
    capacity = sum(1 for n in nodes for g in n.gpus if g.mig_profile is None)
    quota = sum(t.quota_gpus for t in teams)
    if quota > capacity:
        raise ConfigError(f"{source}: teams: the quotas add up to {quota} GPUs, more than the "
                          f"cluster's {capacity}; allowed: a total of at most {capacity}")
    settings = check_settings(data.get("settings") or {}, f"{source}: settings",
                              classes=[c.name for c in classes], cluster=True)
    bundles = check_bundles(data.get("policies"), f"{source}: policies")
    cloud = parse_cloud(data.get("cloud"), f"{source}: cloud", base)
    return Cluster(name=name.strip(), nodes=tuple(nodes), classes=classes, teams=teams,
                   settings=MappingProxyType(settings), policies=MappingProxyType(bundles),
                   cloud=cloud,
                   budgets=parse_budgets(data.get("budgets"), f"{source}: budgets"))


BUDGET_KEYS = ("amount", "window", "hard", "alerts")


def parse_budgets(raw: Any, where: str) -> tuple[Budget, ...]:
    """A cluster file's ``budgets`` section (empty when absent); ConfigError naming the key."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must map a team to its cap, e.g. "
                          "{vision: {amount: 200, window: total, hard: true}}")
    out = []
    for team, spec in raw.items():
        at = f"{where}.{team}"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{at}: must be a mapping with {', '.join(BUDGET_KEYS)}")
        unknown = sorted(str(k) for k in spec if k not in BUDGET_KEYS)
        if unknown:
            raise ConfigError(f"{at}: unknown keys {unknown}; allowed: {', '.join(BUDGET_KEYS)}")
        if "amount" not in spec:
            raise ConfigError(f"{at}.amount: is required, dollars per window")
        try:
            out.append(Budget(str(team), spec["amount"], str(spec.get("window", "total")),
                              bool(spec.get("hard", True)),
                              tuple(spec.get("alerts", (50, 80, 100)))))
        except (BudgetError, TypeError) as e:
            raise ConfigError(f"{at}.{e}") from None
    return tuple(out)


def _node_group(item: Any, where: str) -> list[Node]:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: must be a mapping with {', '.join(NODE_KEYS)}")
    unknown = sorted(str(k) for k in item if k not in NODE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; allowed: {', '.join(NODE_KEYS)}")
    prefix = item.get("prefix")
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ConfigError(f"{where}.prefix: {prefix!r} is not allowed; use letters, digits, "
                          "'-', '_' or '.', starting with a letter or digit (e.g. a100)")
    count = item.get("count", 1)
    if not is_whole(count) or not 1 <= count <= MAX_COUNT:
        raise ConfigError(f"{where}.count: {count!r} is not allowed; use a whole number "
                          f"1..{MAX_COUNT}")
    if "gpus" not in item:
        raise ConfigError(f"{where}.gpus: is required: COUNTxMODEL text such as 8xA100-80GB, "
                          "or an inventory list such as [{model: A100-80GB, count: 8}]")
    cpus = _non_negative(item.get("cpus", 0), f"{where}.cpus", "a number of CPUs >= 0")
    memory = _non_negative(item.get("memory_gb", 0), f"{where}.memory_gb", "GB >= 0")
    labels = item.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in labels.items()):
        raise ConfigError(f"{where}.labels: must be a mapping of names to text, e.g. "
                          "{rack: r1}")
    labels = {k: str(v) for k, v in labels.items()}
    out = []
    for k in range(count):
        node_id = f"{prefix}-{k:02d}"
        gpus = _gpus(item["gpus"], node_id, f"{where}.gpus")
        out.append(Node(id=node_id, gpus=tuple(gpus), site="onprem", hostname=node_id,
                        cpus=cpus, memory_gb=memory, labels=labels, state=NodeState.READY))
    return out


def _gpus(raw: Any, node_id: str, where: str) -> list[Gpu]:
    try:
        if isinstance(raw, str):
            return static_inventory(raw, node_id)
        if isinstance(raw, list):
            return inventory_from_data({"gpus": raw}, node_id, source=where)
    except ValueError as e:
        text = str(e)
        prefix = f"{where}: "
        raise ConfigError(text if text.startswith(where) else prefix + text) from None
    raise ConfigError(f"{where}: {raw!r} is not allowed; write COUNTxMODEL text such as "
                      "8xA100-80GB, or a list such as [{model: A100-80GB, mig: [3g.40gb]}]")


def _non_negative(value: Any, where: str, allowed: str) -> float:
    if not is_number(value) or value < 0:
        raise ConfigError(f"{where}: {value!r} is not allowed; use {allowed}")
    return float(value)
