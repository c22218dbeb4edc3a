"""The AWS provider's settings that need checking: regions (with per-region AMI, security groups
and key pair) and subnets by zone. Errors name the field (``providers.<name>.regions...``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from providers.base import ProviderConfigError

DEFAULT_IMAGE_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"


@dataclass(frozen=True)
class RegionSettings:
    """What a launch in one region uses. ``image`` is an AMI id; "" means: look up the newest
    AMI named ``image_name`` owned by ``image_owner``."""

    image: str = ""
    image_name: str = DEFAULT_IMAGE_NAME
    image_owner: str = "amazon"
    security_groups: tuple[str, ...] = ()
    key_name: str = ""


_REGION_KEYS = ("image", "image_name", "image_owner", "security_groups", "key_name")


def region_settings(name: str, regions: Sequence[str] | Mapping[str, Any],
                    defaults: Mapping[str, Any]) -> dict[str, RegionSettings]:
    """``regions`` as a list of names (every setting from the top level) or a mapping of
    name -> settings that override the top level's."""
    where = f"providers.{name}.regions"
    if isinstance(regions, str) or not isinstance(regions, (Sequence, Mapping)) \
            or not regions:
        raise ProviderConfigError(f"{where}: {regions!r} must be a non-empty list of region "
                                  "names (e.g. [us-east-1]) or a mapping of region -> settings")
    entries = regions if isinstance(regions, Mapping) else dict.fromkeys(regions, None)
    out: dict[str, RegionSettings] = {}
    for region, own in entries.items():
        if not isinstance(region, str) or not region:
            raise ProviderConfigError(f"{where}: {region!r} is not a region name")
        own = own or {}
        if not isinstance(own, Mapping):
            raise ProviderConfigError(f"{where}.{region}: must be a mapping of "
                                      f"{', '.join(_REGION_KEYS)}")
        bad = sorted(set(own) - set(_REGION_KEYS))
        if bad:
            raise ProviderConfigError(f"{where}.{region}: unknown setting(s) "
                                      f"{', '.join(bad)}; allowed: {', '.join(_REGION_KEYS)}")
        merged = {**defaults, **own}
        groups = merged["security_groups"]
        if isinstance(groups, str) or not all(isinstance(g, str) for g in groups):
            raise ProviderConfigError(f"{where}.{region}.security_groups: {groups!r} must be "
                                      "a list of security group ids (sg-...)")
        for key in ("image", "image_name", "image_owner", "key_name"):
            if not isinstance(merged[key], str):
                raise ProviderConfigError(f"{where}.{region}.{key}: {merged[key]!r} must be "
                                          "a string")
        out[region] = RegionSettings(merged["image"], merged["image_name"],
                                     merged["image_owner"], tuple(groups), merged["key_name"])
    return out


def zone_subnets(name: str, value: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ProviderConfigError(f"providers.{name}.subnets: {value!r} must map zone names "
                                  "to subnet ids (us-east-1a: subnet-...)")
    return dict(value)
