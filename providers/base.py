"""The one small interface every cloud provider implements, its errors, and its registry.

A provider rents machines from one cloud account for one Spillway cluster. It does four things
(DESIGN.md, convention 3):

- :meth:`Provider.offers`: what it could rent for a request, as :class:`~broker.model.Offer`;
- :meth:`Provider.launch`: rent ``count`` machines of an offer. Idempotent: the request id is
  written into each machine's tags (or labels), and a repeated launch with the same request id
  returns the machines the first one started instead of starting more;
- :meth:`Provider.terminate`: give machines back; an id the cloud no longer knows is not an
  error;
- :meth:`Provider.instances`: every machine tagged with this cluster, its native state mapped
  onto :class:`~broker.model.InstanceState`.

Errors say what the caller should do next: :class:`Retry` (throttling, a 5xx: try the same call
again after a backoff), :class:`FailOver` (no capacity, a stockout, a price too low: try the next
offer and cool this zone down) and :class:`Stop` (bad credentials, a quota, a bad configuration:
retrying cannot help; an operator must act). Cloud SDKs are optional extras, imported lazily by
:func:`make_provider`; a missing one raises :class:`MissingExtra` naming the extra to install.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from broker.model.cloud import InstanceState, Market, Offer

CLUSTER_TAG = "spillway-cluster"  # every machine Spillway rents carries these tags/labels
REQUEST_TAG = "spillway-request"
OFFER_TAG = "spillway-offer"  # the offer id; clouds whose labels cannot hold it omit it

# GCP labels are the strictest: lower-case letters, digits, '-' and '_', at most 63 characters.
# Cluster names and request ids are kept inside that so every provider can tag with them.
_LABEL = re.compile(r"[a-z][a-z0-9_-]{0,62}")


def check_label(value: str, what: str) -> str:
    """``value`` if a cluster name or request id fits every cloud's tags; ValueError if not."""
    if not _LABEL.fullmatch(value):
        raise ValueError(f"{what} {value!r} must start with a lower-case letter and hold only "
                         "lower-case letters, digits, '-' or '_' (at most 63 characters), so "
                         "that every cloud can tag instances with it")
    return value


# ---------------------------------------------------------------------------------------------
# What is asked for, and what the cloud lists


@dataclass(frozen=True)
class Resources:
    """What a launch must provide: GPUs (model and count per machine), CPUs and memory.

    ``gpu_model`` None means any model; ``market`` None means spot or on-demand."""

    gpu_count: int = 1
    gpu_model: str | None = None
    min_gpu_memory_gb: float = 0.0
    cpus: float = 0.0
    memory_gb: float = 0.0
    market: Market | None = None
    regions: tuple[str, ...] = ()  # empty: every region the provider is configured for


@dataclass(frozen=True)
class CloudMachine:
    """One machine as the provider lists it (before the broker's Instance record knows it)."""

    provider_id: str  # the cloud's own id (i-0abc..., a GCE instance name, a libcloud node id)
    request_id: str  # from the machine's tags; "" if the tag is missing
    state: InstanceState  # the native state, mapped
    instance_type: str = ""
    zone: str = ""
    market: Market | None = None
    launched_at: float | None = None  # epoch seconds, when the cloud says it started
    native_state: str = ""  # the cloud's own word, for messages and `spillway instances`
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))


# ---------------------------------------------------------------------------------------------
# Errors: what to do next


class ProviderError(Exception):
    """A provider call failed. ``action`` says what to do: retry, failover or stop."""

    action = "stop"

    def __init__(self, provider: str, message: str, *, code: str = "",
                 offer_id: str = "") -> None:
        self.provider, self.code, self.offer_id = provider, code, offer_id
        where = f" ({code})" if code else ""
        super().__init__(f"{provider}: {message}{where}")


class Retry(ProviderError):
    """Throttled or a server error: the same call may succeed after a backoff."""

    action = "retry"


class FailOver(ProviderError):
    """No capacity, a stockout or a price below the market: try the next offer, and cool
    this offer's zone down."""

    action = "failover"


class Stop(ProviderError):
    """Credentials, a quota or the configuration is wrong: no retry can help; an operator must
    act."""

    action = "stop"


class MissingExtra(ImportError):
    """A provider's SDK is not installed."""

    def __init__(self, provider: str, extra: str, module: str) -> None:
        self.provider, self.extra = provider, extra
        super().__init__(f"provider {provider!r} needs the {module} package: "
                         f"pip install 'spillway[{extra}]'")


def require(module: str, provider: str, extra: str) -> Any:
    """Import ``module`` or raise MissingExtra naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(provider, extra, module) from e


# ---------------------------------------------------------------------------------------------
# The interface


@runtime_checkable
class Provider(Protocol):
    name: str  # "aws", "gcp", "libcloud", "local": the first part of its sites' ids
    cluster: str  # the cluster name in every machine's tags

    def offers(self, request: Resources) -> list[Offer]: ...

    def launch(self, offer: Offer, count: int, request_id: str,
               user_data: str) -> list[CloudMachine]: ...

    def terminate(self, provider_ids: Sequence[str]) -> None: ...

    def instances(self) -> dict[str, CloudMachine]: ...


# ---------------------------------------------------------------------------------------------
# Registry: provider kind -> "module:Class", imported only when configured

KINDS: dict[str, tuple[str, str]] = {
    # kind: (module:class, the extra that installs its SDK; "" for none)
    "aws": ("providers.aws.provider:AwsProvider", "aws"),
    "gcp": ("providers.gcp.provider:GcpProvider", "gcp"),
    "libcloud": ("providers.libcloud.provider:LibcloudProvider", "libcloud"),
    "local": ("providers.local:LocalProvider", ""),
}


class ProviderConfigError(ValueError):
    """A ``providers:`` entry is wrong; the message names the provider and the field."""


def make_provider(name: str, settings: Mapping[str, Any], cluster: str) -> Provider:
    """Build the provider configured as ``providers.<name>`` (its ``kind`` defaults to its
    name). Raises ProviderConfigError for a bad entry and MissingExtra for a missing SDK."""
    kind = str(settings.get("kind", name))
    if kind not in KINDS:
        raise ProviderConfigError(f"providers.{name}.kind: {kind!r} is not one of "
                                  f"{', '.join(sorted(KINDS))}")
    target, _extra = KINDS[kind]
    module_name, cls_name = target.split(":")
    module = importlib.import_module(module_name)
    cls = getattr(module, cls_name)
    options = {k: v for k, v in settings.items() if k != "kind"}
    try:
        provider: Provider = cls(name=name, cluster=check_label(cluster, "cluster"), **options)
    except TypeError as e:  # an unknown or missing keyword: say which provider
        raise ProviderConfigError(f"providers.{name}: {e}") from None
    return provider
